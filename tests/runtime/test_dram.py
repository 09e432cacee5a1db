from dualpath.runtime.dram import DramBuffer


def test_regions_are_layer_major_aligned_and_freed_space_is_merged():
    dram = DramBuffer(4096)
    a = dram.allocate(num_layers=2, tokens=3, bytes_per_token_per_layer=100)
    b = dram.allocate(num_layers=2, tokens=1, bytes_per_token_per_layer=64)
    assert a is not None and b is not None
    assert a.layer_bytes == 320 and a.layer_offset_bytes(1) == a.offset_bytes + 320
    assert b.offset_bytes == a.offset_bytes + a.nbytes
    dram.check_invariants()
    dram.free(a)
    dram.free(b)
    dram.check_invariants()
    assert dram.used_bytes == 0
    assert (
        dram.allocate(num_layers=1, tokens=64, bytes_per_token_per_layer=64) is not None
    )  # whole buffer again


def test_a_full_buffer_answers_none_so_the_caller_waits():
    dram = DramBuffer(1024)
    assert dram.allocate(num_layers=1, tokens=16, bytes_per_token_per_layer=64) is not None
    assert dram.allocate(num_layers=1, tokens=1, bytes_per_token_per_layer=64) is None
