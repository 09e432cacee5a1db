import time

import numpy as np

from dualpath.kvcache import BlockLayout, FileStore, MemoryStore, block_keys
from dualpath.kvcache.file_store import data_offset_bytes
from dualpath.transfer import BlockRead, BlockWrite, ReadJob, Snic, StorageReader, StorageWriter, WriteJob

LAYOUT = BlockLayout(num_layers=4, block_tokens=16, bytes_per_token_per_layer=1024)  # 64 KiB Full Blocks
RATE = 2_000_000


def make_blocks(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    keys = block_keys(list(range(n * LAYOUT.block_tokens)), LAYOUT.block_tokens)
    shape = (LAYOUT.num_layers, LAYOUT.block_tokens, LAYOUT.bytes_per_token_per_layer)
    return [(k, rng.integers(0, 256, shape, dtype=np.uint8)) for k in keys]


def test_reader_moves_full_and_layer_blocks_into_buffer_slices_at_the_snic_rate(tmp_path):
    store = FileStore(tmp_path, 1 << 30)
    blocks = make_blocks(4)
    for key, data in blocks:
        store.put_full_block(key, data, num_layers=LAYOUT.num_layers)
    snic = Snic("pe0.snic", RATE)
    reader = StorageReader(store, snic)
    dram = memoryview(bytearray(4 * LAYOUT.full_block_bytes))
    fb = LAYOUT.full_block_bytes
    reads = [BlockRead(key=k, out=dram[i * fb : (i + 1) * fb]) for i, (k, _) in enumerate(blocks[:3])]
    reads.append(BlockRead(key=blocks[3][0], out=dram[3 * fb : 3 * fb + LAYOUT.layer_block_bytes], layer=2))
    start = time.monotonic()
    future = reader.submit(ReadJob(job_id="r1", blocks=tuple(reads), tokens=64))
    time.sleep(0.01)
    assert snic.read_queue.queued_requests == 1 and snic.read_queue.queued_tokens == 64
    result = future.result(timeout=10)
    elapsed = time.monotonic() - start
    moved = 3 * fb + LAYOUT.layer_block_bytes
    assert result.bytes_read == moved and len(result.ok_keys) == 4
    assert elapsed >= (moved - snic.rx.chunk_bytes) / RATE and elapsed <= 1.3 * moved / RATE + 0.05
    for i, (_, data) in enumerate(blocks[:3]):
        assert bytes(dram[i * fb : (i + 1) * fb]) == data.tobytes()
    assert bytes(dram[3 * fb : 3 * fb + LAYOUT.layer_block_bytes]) == blocks[3][1][2].tobytes()
    assert snic.read_queue.queued_requests == 0 and snic.read_queue.queued_bytes == 0
    assert snic.stats().rx.total_bytes == moved
    reader.close()


def test_the_read_queue_serves_whole_jobs_in_order(tmp_path):
    """Two jobs of 3 blocks queued together: the first is done after its own link time (≈ 98 ms at 2 MB/s),
    not when both are (≈ 197 ms, as when their blocks shared the link), and the second right behind it."""
    store = FileStore(tmp_path, 1 << 30)
    blocks = make_blocks(6)
    for key, data in blocks:
        store.put_full_block(key, data, num_layers=LAYOUT.num_layers)
    reader = StorageReader(store, Snic("pe0.snic", RATE))
    fb = LAYOUT.full_block_bytes
    dram = memoryview(bytearray(6 * fb))
    jobs = [
        ReadJob(
            job_id=f"r{j}",
            blocks=tuple(
                BlockRead(key=blocks[i][0], out=dram[i * fb : (i + 1) * fb]) for i in range(3 * j, 3 * j + 3)
            ),
        )
        for j in (0, 1)
    ]
    done_s: dict[str, float] = {}
    start = time.monotonic()
    futures = [reader.submit(job) for job in jobs]
    for job, future in zip(jobs, futures, strict=True):
        future.add_done_callback(lambda _, name=job.job_id: done_s.setdefault(name, time.monotonic() - start))
    for future in futures:
        assert len(future.result(timeout=10).ok_keys) == 3
    one_job_s = 3 * fb / RATE
    assert done_s["r0"] < 1.5 * one_job_s
    assert done_s["r1"] >= 2 * one_job_s - reader.snic.rx.chunk_bytes / RATE
    reader.close()


def test_missing_and_corrupt_blocks_are_reported_not_raised(tmp_path):
    store = FileStore(tmp_path, 1 << 30)
    blocks = make_blocks(3)
    for key, data in blocks[:2]:
        store.put_full_block(key, data, num_layers=LAYOUT.num_layers)
    path = store.path_of(blocks[1][0])
    raw = bytearray(path.read_bytes())
    raw[data_offset_bytes(LAYOUT.num_layers) + 5] ^= 1
    path.write_bytes(bytes(raw))
    reader = StorageReader(store, Snic("de0.snic", 50_000_000))
    out = memoryview(bytearray(LAYOUT.full_block_bytes))
    job = ReadJob(job_id="r", blocks=tuple(BlockRead(key=k, out=out) for k, _ in blocks))
    result = reader.submit(job).result(timeout=10)
    assert result.ok_keys == (blocks[0][0],)
    assert result.corrupt_keys == (blocks[1][0],) and result.missing_keys == (blocks[2][0],)
    assert store.stats().corrupt_blocks == 1
    reader.close()


def test_reads_are_served_fifo():
    store = MemoryStore(1 << 30)
    blocks = make_blocks(4)
    for key, data in blocks:
        store.put_full_block(key, data, num_layers=LAYOUT.num_layers)
    reader = StorageReader(store, Snic("pe0.snic", 4 * RATE), max_in_flight=1)
    out = memoryview(bytearray(LAYOUT.full_block_bytes))
    done: list[str] = []
    futures = []
    for i, (key, _) in enumerate(blocks):
        f = reader.submit(ReadJob(job_id=f"j{i}", blocks=(BlockRead(key=key, out=out),)))
        f.add_done_callback(lambda fut: done.append(fut.result().job_id))
        futures.append(f)
    for f in futures:
        f.result(timeout=10)
    reader.close()
    assert done == ["j0", "j1", "j2", "j3"]


def test_writer_persists_blocks_through_snic_tx(tmp_path):
    store = FileStore(tmp_path, 1 << 30)
    snic = Snic("de0.snic", RATE)
    writer = StorageWriter(store, snic)
    blocks = make_blocks(3, seed=5)
    parents = [b"\0" * 16, blocks[0][0], blocks[1][0]]
    job = WriteJob(
        job_id="w",
        blocks=tuple(
            BlockWrite(key=k, data=d, num_layers=LAYOUT.num_layers, parent=p)
            for (k, d), p in zip(blocks, parents, strict=True)
        ),
    )
    start = time.monotonic()
    written = writer.submit(job).result(timeout=10)
    elapsed = time.monotonic() - start
    assert written == 3 * LAYOUT.full_block_bytes and elapsed >= (written - snic.tx.chunk_bytes) / RATE
    assert writer.submit(job).result(timeout=10) == 0  # already persisted: nothing moves
    writer.close()
    reopened = FileStore(tmp_path, 1 << 30)
    assert reopened.hit_blocks([k for k, _ in blocks]) == 3
    assert reopened.read_layer_block(blocks[2][0], 3) == blocks[2][1][3].tobytes()
