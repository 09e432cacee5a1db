"""Worker-side loading of a step's hits into vLLM's paged cache, layer by layer, on either read path.

    PE read path: this instance's StorageReader reads Layer Block l of each hit block through its own SNIC
                  (one pread each), then copies it into the paged cache; layer l is then done.
    DE read path: a DeReadService on the decode side reads through *its* SNIC and writes each Layer Block into
                  this instance's registered buffer; a notice thread copies it into the paged cache.

Both walk the layers in order, so layer 0 lands first and `LayerLoads.wait(l)` lets vLLM compute layer l while
layers > l are still in flight (paper §4.1). A failed block's vLLM blocks are collected as invalid.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from dualpath.integrations.vllm.de_service import RECEIVE_BUFFER
from dualpath.integrations.vllm.layer_wait import LayerLoads
from dualpath.integrations.vllm.paged import write_layer_block
from dualpath.integrations.vllm.plan import LoadSpec
from dualpath.kvcache import KVStore, key_hex
from dualpath.transfer import BlockRead, ReadJob, ReadResult, SharedMemoryBackend, Snic
from dualpath.transfer.shm_backend import default_ipc_address
from dualpath.transfer.storage_io import StorageReader


@dataclass
class _DeJob:
    spec: LoadSpec
    loads: LayerLoads
    offset_bytes: int


class KvLoader:
    def __init__(
        self,
        *,
        store: KVStore,
        snic: Snic,
        kv_layers: Sequence[torch.Tensor],
        layer_block_bytes: int,
        endpoint: str = "",
        namespace: str = "dualpath",
        de_buffer_bytes: int = 0,
    ) -> None:
        self.kv_layers = list(kv_layers)
        self.layer_block_bytes = layer_block_bytes
        self.snic = snic
        self._reader = StorageReader(store, snic)
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._de_jobs: dict[str, _DeJob] = {}
        self._de_cursor = 0
        self._de_peers: set[str] = set()
        self.endpoint = endpoint
        self.namespace = namespace
        self._backend: SharedMemoryBackend | None = None
        self._stop = threading.Event()
        if endpoint and de_buffer_bytes:
            self._backend = SharedMemoryBackend(endpoint, namespace=namespace)
            self._receive = self._backend.register_buffer(RECEIVE_BUFFER, de_buffer_bytes)
            self._thread = threading.Thread(target=self._notices, name=f"{endpoint}-notices", daemon=True)
            self._thread.start()

    # ---- one step --------------------------------------------------------------------------------
    def start(self, specs: Sequence[LoadSpec]) -> LayerLoads:
        loads = LayerLoads(len(self.kv_layers))
        self._de_cursor = 0  # the previous step waited for all its loads: the receive buffer is free
        for spec in specs:
            if spec.read_path == "de" and self._de_fits(spec):
                self._start_de(spec, loads)
            else:
                self._start_pe(spec, loads)
        return loads

    def _de_fits(self, spec: LoadSpec) -> bool:
        need = len(spec.blocks) * len(self.kv_layers) * self.layer_block_bytes
        return (
            self._backend is not None
            and bool(spec.de_endpoint)
            and self._de_cursor + need <= self._receive.nbytes
        )

    # ---- PE read path ----------------------------------------------------------------------------
    def _start_pe(self, spec: LoadSpec, loads: LayerLoads) -> None:
        lb = self.layer_block_bytes
        seq = next(self._seq)
        for layer in range(len(self.kv_layers)):
            loads.expect(layer, 1)
            staging = memoryview(bytearray(lb * len(spec.blocks)))
            blocks = tuple(
                BlockRead(key=b.key, out=staging[i * lb : (i + 1) * lb], layer=layer)
                for i, b in enumerate(spec.blocks)
            )
            job = ReadJob(job_id=f"{spec.request_id}:{seq}:{layer}", blocks=blocks, tokens=spec.tokens)
            future = self._reader.submit(job)
            future.add_done_callback(
                lambda f, layer=layer, staging=staging: self._pe_landed(f, spec, layer, staging, loads)
            )

    def _pe_landed(
        self, future: Future[ReadResult], spec: LoadSpec, layer: int, staging: memoryview, loads: LayerLoads
    ) -> None:
        invalid: list[int] = []
        try:
            ok = set(future.result().ok_keys)
            lb = self.layer_block_bytes
            for i, block in enumerate(spec.blocks):
                if block.key in ok:
                    write_layer_block(
                        self.kv_layers[layer], block.vllm_block_ids, staging[i * lb : (i + 1) * lb]
                    )
                else:
                    invalid.extend(block.vllm_block_ids)
        except Exception:  # never leave a layer pending: the whole request's hit is recomputed instead
            invalid = [i for b in spec.blocks for i in b.vllm_block_ids]
        loads.done(layer, invalid_ids=invalid)

    # ---- DE read path ----------------------------------------------------------------------------
    def _start_de(self, spec: LoadSpec, loads: LayerLoads) -> None:
        assert self._backend is not None
        job_id = f"{self.endpoint}:{next(self._seq)}"
        offset = self._de_cursor
        self._de_cursor += len(spec.blocks) * len(self.kv_layers) * self.layer_block_bytes
        for layer in range(len(self.kv_layers)):
            loads.expect(layer, len(spec.blocks))
        with self._lock:
            self._de_jobs[job_id] = _DeJob(spec=spec, loads=loads, offset_bytes=offset)
            if spec.de_endpoint not in self._de_peers:
                self._backend.add_peer(
                    spec.de_endpoint, default_ipc_address(self.namespace, spec.de_endpoint)
                )
                self._de_peers.add(spec.de_endpoint)
        self._backend.notify(
            spec.de_endpoint,
            {
                "op": "read",
                "job": job_id,
                "reply_to": self.endpoint,
                "keys": [key_hex(b.key) for b in spec.blocks],
                "num_layers": len(self.kv_layers),
                "layer_block_bytes": self.layer_block_bytes,
                "offset_bytes": offset,
            },
        )

    def _notices(self) -> None:
        assert self._backend is not None
        while not self._stop.is_set():
            notice = self._backend.recv_notice(0.05)
            if notice is None or "job" not in notice.payload:
                continue
            p = notice.payload
            with self._lock:
                job = self._de_jobs.get(p["job"])
            if job is None:
                continue
            layer, index = int(p["layer"]), int(p["block"])
            block = job.spec.blocks[index]
            invalid: tuple[int, ...] = ()
            try:
                if p.get("error") or notice.error:
                    invalid = block.vllm_block_ids
                else:
                    n = self.layer_block_bytes
                    at = notice.offset_bytes
                    write_layer_block(self.kv_layers[layer], block.vllm_block_ids, self._receive[at : at + n])
            except Exception:
                invalid = block.vllm_block_ids
            job.loads.done(layer, invalid_ids=invalid)
            if layer == len(self.kv_layers) - 1 and index == len(job.spec.blocks) - 1:
                with self._lock:
                    self._de_jobs.pop(p["job"], None)

    def close(self) -> None:
        self._stop.set()
        if self._backend is not None:
            self._thread.join()
            self._backend.close()
        self._reader.close()
