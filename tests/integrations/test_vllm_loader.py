"""KvLoader and DeReadService without vLLM: Full Blocks gathered from one paged cache are staged layer by
layer on both read paths and copied into another paged cache; a corrupt or missing block is marked bad and
never copied."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch

from dualpath.integrations.vllm.de_service import DeReadService, make_snic
from dualpath.integrations.vllm.loader import KvLoader, Staging
from dualpath.integrations.vllm.paged import full_block, layer_block_bytes
from dualpath.integrations.vllm.plan import LoadSpec, spans
from dualpath.kvcache import FileStore, block_keys
from dualpath.kvcache.file_store import data_offset_bytes

LAYERS, BLOCKS, HEADS, BLOCK_TOKENS, HEAD_DIM = 3, 12, 2, 32, 32
PER_FULL = 2  # a Full Block of two vLLM blocks


def paged_cache(seed: int | None) -> list[torch.Tensor]:
    shape = (BLOCKS, HEADS, 2 * BLOCK_TOKENS, HEAD_DIM)
    if seed is None:
        return [torch.zeros(shape) for _ in range(LAYERS)]
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for _ in range(LAYERS)]


def stored_hit(store: FileStore, source: list[torch.Tensor], source_ids: list[int]) -> list[bytes]:
    """Persist the Full Blocks that hold source_ids (PER_FULL vLLM blocks each); returns their keys."""
    n_full = len(source_ids) // PER_FULL
    keys = block_keys(list(range(n_full * PER_FULL * BLOCK_TOKENS)), PER_FULL * BLOCK_TOKENS)
    for j, span in enumerate(spans(keys, 0, n_full, source_ids, PER_FULL)):
        data = full_block(source, span.vllm_block_ids)
        store.put_full_block(keys[j], data, num_layers=LAYERS, parent=span.parent)
    return keys


def make_loader(store: FileStore, dest: list[torch.Tensor], **kw: object) -> KvLoader:
    return KvLoader(
        store=store,
        snic=make_snic("pe.snic", 0),
        kv_layers=dest,
        layer_block_bytes=layer_block_bytes(dest[0], PER_FULL),
        **kw,  # type: ignore[arg-type]
    )


def stage_and_wait(loader: KvLoader, spec: LoadSpec) -> tuple[Staging, list[int]]:
    """Stage a hit; returns it once every layer has landed, with the order the layers landed in."""
    ready, landed = threading.Event(), []
    st = loader.stage(spec, on_layer=lambda st, layer: landed.append(layer), on_ready=lambda st: ready.set())
    assert ready.wait(10), "the hit never finished staging"
    return st, landed


def test_pe_read_path_lands_every_layer_in_the_paged_cache(tmp_path: Path) -> None:
    store = FileStore(tmp_path, 2**30)
    source, dest = paged_cache(1), paged_cache(None)
    keys = stored_hit(store, source, [5, 1, 8, 2])
    loader = make_loader(store, dest)
    try:
        spec = LoadSpec(
            request_id="r",
            read_path="pe",
            de_endpoint="",
            blocks=spans(keys, 0, 2, [3, 4, 9, 10], PER_FULL),
            tokens=128,
        )
        st, landed = stage_and_wait(loader, spec)
        assert sorted(landed) == list(range(LAYERS)) and st.read_path == "pe"
        for layer in range(LAYERS):
            loader.copy_layer(st, layer)
            assert torch.equal(dest[layer][[3, 4, 9, 10]], source[layer][[5, 1, 8, 2]])
        assert st.bad_vllm_block_ids() == set()
        assert loader.snic.rx.stats().total_bytes == 2 * LAYERS * layer_block_bytes(dest[0], PER_FULL)
        assert torch.count_nonzero(dest[0][[0, 1, 2, 5]]) == 0  # nothing else was touched
    finally:
        loader.close()


def de_pair(
    tmp_path: Path, store: FileStore, dest: list[torch.Tensor], transport: str, tag: str
) -> tuple[DeReadService, KvLoader]:
    """A decode node's DE read service and a prefill loader that asks it, over `transport`."""
    namespace = f"t{os.getpid()}{tag}"
    de = DeReadService(
        endpoint=f"de{tag}",
        namespace=namespace,
        store=FileStore(tmp_path, 2**30),
        snic=make_snic("de", 0),
        transport=transport,
    )
    addresses = {f"de{tag}": de.backend.address} if transport == "tcp" else {}
    loader = make_loader(
        store,
        dest,
        endpoint=f"pe{tag}",
        namespace=namespace,
        de_buffer_bytes=2**22,
        transport=transport,
        peer_addresses=addresses,
    )
    return de, loader


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_de_read_path_reads_through_the_decode_snic_and_writes_into_the_prefill_buffer(
    tmp_path: Path, transport: str
) -> None:
    store = FileStore(tmp_path, 2**30)
    source, dest = paged_cache(2), paged_cache(None)
    keys = stored_hit(store, source, [0, 1, 2, 3, 4, 5])
    de, loader = de_pair(tmp_path, store, dest, transport, f"x{transport}")
    try:
        spec = LoadSpec(
            request_id="r",
            read_path="de",
            de_endpoint=f"dex{transport}",
            blocks=spans(keys, 0, 3, [6, 7, 8, 9, 10, 11], 2),
            tokens=192,
        )
        st, landed = stage_and_wait(loader, spec)
        assert landed == list(range(LAYERS)) and st.read_path == "de"  # layer 0 first, in order
        for layer in range(LAYERS):
            loader.copy_layer(st, layer)
            assert torch.equal(dest[layer][6:12], source[layer][0:6])
        lb = layer_block_bytes(dest[0], PER_FULL)
        assert de.snic.rx.stats().total_bytes == 3 * LAYERS * lb  # the decode side's SNIC read the hit
        assert loader.snic.rx.stats().total_bytes == 0  # the prefill side's SNIC stayed idle
    finally:
        loader.close()
        de.close()


@pytest.mark.parametrize("read_path", ["pe", "de"])
def test_a_corrupt_or_missing_block_is_reported_and_not_copied(tmp_path: Path, read_path: str) -> None:
    store = FileStore(tmp_path, 2**30)
    source, dest = paged_cache(3), paged_cache(None)
    keys = stored_hit(store, source, [0, 1, 2, 3, 4, 5])
    lb = layer_block_bytes(dest[0], PER_FULL)
    path = store.path_of(keys[1])
    raw = bytearray(path.read_bytes())
    raw[data_offset_bytes(LAYERS) + lb + 100] ^= 0xFF  # one byte of Layer Block 1 of Full Block 1
    path.write_bytes(bytes(raw))
    store.delete(keys[2])  # and Full Block 2 is gone
    de, loader = de_pair(tmp_path, store, dest, "shm", "1")
    try:
        spec = LoadSpec(
            request_id="r",
            read_path=read_path,
            de_endpoint="de1",
            blocks=spans(keys, 0, 3, [6, 7, 8, 9, 10, 11], 2),
            tokens=192,
        )
        st, _ = stage_and_wait(loader, spec)
        assert st.bad_blocks == {1, 2} and st.first_bad() == 1
        assert st.bad_vllm_block_ids() == {8, 9, 10, 11}
        for layer in range(LAYERS):
            loader.copy_layer(st, layer)
        assert torch.equal(dest[LAYERS - 1][6:8], source[LAYERS - 1][0:2])
        assert torch.count_nonzero(dest[1][8:10]) == 0  # the corrupt Layer Block never reached the cache
    finally:
        loader.close()
        de.close()
