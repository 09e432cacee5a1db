"""Worker-side reads of a hit into this node's DRAM, then into vLLM's paged cache, on either read path.

    staging  Layer Block l of Full Block i lands at (l·n + i)·LB of the request's DRAM region (layer-major),
             layer 0 first, so a layer can move on to the paged cache while later layers are still read:
      PE read path: this node's StorageReader reads each Layer Block through its own SNIC (one pread each).
      DE read path: a DeReadService on a decode node reads through *its* SNIC and writes each Layer Block
                    into this node's registered receive buffer (paper §4.1, Fig. 4b); a notice per block.
    copy_layer  one layer of the valid Full Blocks from the DRAM region into the paged cache

Callers decide when layers move to the paged cache: as each lands, inside a forward pass (layerwise loads), or
after the whole hit is staged, in the later forward pass that computes the request (staged loads). A Full Block
that is missing or fails its checksum is marked bad at the layer that found it and is never copied after that.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from dualpath.integrations.vllm.buffer_pool import BufferPool
from dualpath.integrations.vllm.de_service import RECEIVE_BUFFER
from dualpath.integrations.vllm.endpoints import Backend, Peers, make_backend
from dualpath.integrations.vllm.paged import write_layer_block
from dualpath.integrations.vllm.plan import LoadSpec
from dualpath.kvcache import KVStore, key_hex
from dualpath.transfer import BlockRead, Notice, ReadJob, ReadResult, Snic
from dualpath.transfer.storage_io import StorageReader


@dataclass(eq=False)
class Staging:
    """One request's hit on its way from storage into this node's DRAM."""

    spec: LoadSpec
    region: memoryview
    offset_bytes: int  # in the receive buffer; -1 for a private DRAM region
    read_path: str  # the path actually taken ("de" falls back to "pe" when the receive buffer is full)
    layers_left: int
    on_layer: LayerLanded | None = None
    on_ready: Callable[[Staging], None] | None = None
    bad_blocks: set[int] = field(default_factory=set)  # indices into spec.blocks
    lock: threading.Lock = field(default_factory=threading.Lock)
    started_s: float = field(default_factory=time.monotonic)
    ready: bool = False  # every layer landed (or the staging was abandoned)
    abandoned: bool = False

    def first_bad(self) -> int:
        """Full Blocks before the first bad one are valid: vLLM recomputes from the first bad one on."""
        return min(self.bad_blocks, default=len(self.spec.blocks))

    def bad_vllm_block_ids(self) -> set[int]:
        return {i for j in self.bad_blocks for i in self.spec.blocks[j].vllm_block_ids}


LayerLanded = Callable[[Staging, int], None]


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
        peer_name: Callable[[str], str] = lambda de_endpoint: de_endpoint,
        transport: str = "shm",
        host: str = "127.0.0.1",
        port: int = 0,
        peer_addresses: Mapping[str, str] | None = None,
    ) -> None:
        self.kv_layers = list(kv_layers)
        self._peer_name = peer_name  # a DE endpoint's name for this rank (tensor parallelism)
        self.layer_block_bytes = layer_block_bytes
        self.snic = snic
        self._reader = StorageReader(store, snic)
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._de_jobs: dict[str, tuple[Staging, list[int]]] = {}  # job -> staging, notices left per layer
        self.endpoint = endpoint
        self.namespace = namespace
        self._backend: Backend | None = None
        self._pool = BufferPool(0)
        self._stop = threading.Event()
        # Other notices this endpoint gets: the PD hand-off's asks (P side) and layers (D side), pd.py
        self.on_ask: Callable[[Notice], None] | None = None
        self.on_pd_layer: Callable[[Notice], None] | None = None
        if endpoint and de_buffer_bytes:
            self._backend = make_backend(
                endpoint, transport=transport, namespace=namespace, host=host, port=port
            )
            self._receive = self._backend.register_buffer(RECEIVE_BUFFER, de_buffer_bytes)
            self._pool = BufferPool(de_buffer_bytes)
            self.peers = Peers(self._backend, namespace, peer_addresses)
            self._thread = threading.Thread(target=self._notices, name=f"{endpoint}-notices", daemon=True)
            self._thread.start()

    @property
    def backend(self) -> Backend | None:
        """This endpoint's transfer backend (None without an endpoint): the PD hand-off uses it too."""
        return self._backend

    @property
    def receive_buffer(self) -> memoryview:
        return self._receive

    @property
    def pool(self) -> BufferPool:
        return self._pool

    @property
    def num_layers(self) -> int:
        return len(self.kv_layers)

    # ---- staging ---------------------------------------------------------------------------------
    def stage(
        self,
        spec: LoadSpec,
        *,
        on_layer: LayerLanded | None = None,
        on_ready: Callable[[Staging], None] | None = None,
    ) -> Staging:
        """Start reading the hit; `on_layer(staging, l)` runs as layer l lands, `on_ready` once all have."""
        nbytes = len(spec.blocks) * self.num_layers * self.layer_block_bytes
        offset = -1
        if spec.read_path == "de" and spec.de_endpoint and self._backend is not None:
            offset = self._pool.allocate(nbytes) if nbytes else None
            offset = -1 if offset is None else offset
        # DE reads land in the registered receive buffer; PE reads in a private DRAM region.
        region = self._receive[offset : offset + nbytes] if offset >= 0 else memoryview(bytearray(nbytes))
        st = Staging(
            spec=spec,
            region=region,
            offset_bytes=offset,
            read_path="de" if offset >= 0 else "pe",
            layers_left=self.num_layers,
            on_layer=on_layer,
            on_ready=on_ready,
        )
        if st.read_path == "de":
            self._start_de(st)
        else:
            self._start_pe(st)
        return st

    def _landed(self, st: Staging, layer: int, bad: Sequence[int]) -> None:
        with st.lock:
            if st.abandoned:
                return
            st.bad_blocks.update(bad)
            st.layers_left -= 1
            ready = st.ready = st.layers_left == 0
        if st.on_layer is not None:
            st.on_layer(st, layer)
        if ready and st.on_ready is not None:
            st.on_ready(st)

    def copy_layer(self, st: Staging, layer: int) -> None:
        """Layer `layer` of the valid Full Blocks (those before the first bad one) into the paged cache."""
        lb, n = self.layer_block_bytes, len(st.spec.blocks)
        for i in range(st.first_bad()):
            at = (layer * n + i) * lb
            write_layer_block(
                self.kv_layers[layer], st.spec.blocks[i].vllm_block_ids, st.region[at : at + lb]
            )

    def abandon(self, st: Staging) -> None:
        """Give up on a staging that never finished (a lost DE read): every block is bad, and its receive
        range is never reused, as a late write may still land there."""
        with st.lock:
            st.abandoned = st.ready = True
            st.bad_blocks.update(range(len(st.spec.blocks)))
            st.offset_bytes = -1

    def release(self, st: Staging) -> None:
        if st.offset_bytes >= 0:
            self._pool.release(st.offset_bytes, st.region.nbytes)
            st.offset_bytes = -1

    # ---- PE read path ----------------------------------------------------------------------------
    def _start_pe(self, st: Staging) -> None:
        lb, n = self.layer_block_bytes, len(st.spec.blocks)
        seq = next(self._seq)
        for layer in range(self.num_layers):
            base = layer * n * lb
            blocks = tuple(
                BlockRead(key=b.key, out=st.region[base + i * lb : base + (i + 1) * lb], layer=layer)
                for i, b in enumerate(st.spec.blocks)
            )
            job = ReadJob(job_id=f"{st.spec.request_id}:{seq}:{layer}", blocks=blocks, tokens=st.spec.tokens)
            self._reader.submit(job).add_done_callback(
                lambda f, layer=layer: self._pe_landed(f, st, layer)  # type: ignore[misc]
            )

    def _pe_landed(self, future: Future[ReadResult], st: Staging, layer: int) -> None:
        try:
            ok = set(future.result().ok_keys)
            bad = [i for i, b in enumerate(st.spec.blocks) if b.key not in ok]
        except Exception:  # never leave a layer pending: the whole hit is recomputed instead
            bad = list(range(len(st.spec.blocks)))
        self._landed(st, layer, bad)

    # ---- DE read path ----------------------------------------------------------------------------
    def _start_de(self, st: Staging) -> None:
        assert self._backend is not None
        job_id = f"{self.endpoint}:{next(self._seq)}"
        peer = self.peers(self._peer_name(st.spec.de_endpoint))
        with self._lock:
            self._de_jobs[job_id] = (st, [len(st.spec.blocks)] * self.num_layers)
        self._backend.notify(
            peer,
            {
                "op": "read",
                "job": job_id,
                "reply_to": self.endpoint,
                "keys": [key_hex(b.key) for b in st.spec.blocks],
                "num_layers": self.num_layers,
                "layer_block_bytes": self.layer_block_bytes,
                "offset_bytes": st.offset_bytes,
                "reply_address": self._backend.address,
            },
        )

    def _notices(self) -> None:
        assert self._backend is not None
        while not self._stop.is_set():
            notice = self._backend.recv_notice(0.05)
            if notice is None:
                continue
            if notice.payload.get("op") == "send" and self.on_ask is not None:
                self.on_ask(notice)
            elif "pd_job" in notice.payload and self.on_pd_layer is not None:
                self.on_pd_layer(notice)
            elif "job" in notice.payload:
                self._de_landed(notice)

    def _de_landed(self, notice: Notice) -> None:
        p = notice.payload
        layer = int(p["layer"])
        with self._lock:
            entry = self._de_jobs.get(p["job"])
            if entry is None:
                return
            st, left = entry
            if p.get("error") or notice.error:
                st.bad_blocks.add(int(p["block"]))
            left[layer] -= 1
            landed = left[layer] == 0
            if landed and layer == self.num_layers - 1:
                del self._de_jobs[p["job"]]
        if landed:
            self._landed(st, layer, ())

    def close(self) -> None:
        self._stop.set()
        if self._backend is not None:
            self._thread.join()
            self._backend.close()
        self._reader.close()
