"""`DualPathConnector`: a vLLM KV connector (v1 API) backed by the DualPath store, with both read paths.

Load it with
    --kv-transfer-config '{"kv_connector": "DualPathConnector",
                           "kv_connector_module_path": "dualpath.integrations.vllm",
                           "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                           "kv_connector_extra_config": {"store_dir": "/mnt/kv", ...}}'

One class serves both of vLLM's roles:

    scheduler side  get_num_new_matched_tokens  hit length: leading Full Blocks of the prompt in the store
                    update_state_after_alloc    the hit's vLLM blocks and its read path (PE or DE)
                    build_connector_meta        this step's reads and copies, and the Full Blocks complete after it
                    update_connector_output     a failed load: persist those blocks again once recomputed
    worker side     bind_connector_metadata     start this step's reads (both modes) and copies (staged)
                    wait_for_layer_load(l)      block until layer l of this step's hits is in the paged cache
                    save_kv_layer(l)            layer l computed (timeline only)
                    wait_for_save               all of this step's loads landed; persist the new Full Blocks
                    get_finished                staged hits now in DRAM (vLLM may schedule those requests)
                    get_block_ids_with_load_errors   blocks that were missing or failed their checksum

Two load modes (`load_mode`):

    staged     (paper §4.1) the hit is read asynchronously into this node's DRAM (vLLM's async load: the
               request waits, the batch goes on), then copied layer by layer into the paged cache inside the
               forward pass that computes the request: wait_for_layer_load(l) waits for layer l's copy only
    layerwise  the hit is read from storage inside the forward pass, layer 0 first, and each layer goes to the
               paged cache as it lands: layer i computes while layer i+1 is still read; the whole step waits
               for its reads, so this suits storage that is fast next to compute

The read path of a request is `kv_transfer_params["dualpath"]["read_path"]` ("pe" or "de", with
"de_endpoint"), else the configured default.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.model_executor.models.utils import extract_layer_index

from dualpath.integrations.vllm.config import ConnectorConfig, shard_dir, shard_name
from dualpath.integrations.vllm.de_service import DeReadService, make_snic
from dualpath.integrations.vllm.endpoints import parse_peers
from dualpath.integrations.vllm.layer_wait import LayerLoads, LoadTimeout
from dualpath.integrations.vllm.loader import KvLoader, Staging
from dualpath.integrations.vllm.paged import full_block, layer_block_bytes
from dualpath.integrations.vllm.pd import HoldSpec, PdLoad, PdReceiver, PdSender
from dualpath.integrations.vllm.plan import (
    LoadSpec,
    RequestTrack,
    SaveSpec,
    blocks_to_persist,
    hit_blocks,
    spans,
)
from dualpath.kvcache import FileStore
from dualpath.transfer import BlockWrite, WriteJob
from dualpath.transfer.storage_io import StorageWriter

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

LOAD_TIMEOUT_S = 120.0
IDLE_WAIT_S = 0.005  # an idle step waits this long at most for a staged hit


@dataclass
class DualPathMetadata(KVConnectorMetadata):
    stage: tuple[LoadSpec, ...] = ()  # staged mode: start reading into DRAM (the request waits)
    copy: tuple[str, ...] = ()  # staged mode: requests whose staged hit goes to the paged cache this step
    loads: tuple[LoadSpec, ...] = ()  # layerwise mode: read into the paged cache during this step
    saves: tuple[SaveSpec, ...] = ()
    holds: tuple[HoldSpec, ...] = ()  # PD hand-off, prefill side: finished prefills to keep for their decode
    pd_loads: tuple[PdLoad, ...] = ()  # PD hand-off, decode side: ask the prefill instance for the KV
    idle: bool = False  # the step computes nothing (every request waits, e.g. for its staged hit)


@dataclass
class StepTimeline:
    """Hook times of one step that loaded KV (monotonic seconds), per layer."""

    landed_s: list[float]
    compute_start_s: list[float] = field(default_factory=list)
    compute_end_s: list[float] = field(default_factory=list)


@dataclass
class _Loaded:
    spec: LoadSpec
    first_block: int  # index of the spec's first Full Block in the request's chain


class DualPathConnector(KVConnectorBase_V1):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.config = ConnectorConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config or {})
        self.staged = self.config.load_mode == "staged"
        self.vllm_block_tokens = vllm_config.cache_config.block_size
        self.per_full_block = self.config.full_block_vllm_blocks
        self.full_block_tokens = self.vllm_block_tokens * self.per_full_block
        parallel = vllm_config.parallel_config
        if parallel.pipeline_parallel_size > 1:
            raise ValueError("DualPathConnector does not support pipeline parallelism")
        self.tp_size = parallel.tensor_parallel_size
        # The scheduler side looks up hits in rank 0's blocks; each worker keeps its own rank's.
        self.tp_rank = _tp_rank() if role == KVConnectorRole.WORKER and self.tp_size > 1 else 0
        directory = shard_dir(self.config.store_dir, self.tp_rank, self.tp_size)
        self.store = FileStore(directory, self.config.store_capacity_bytes)
        # scheduler side
        self._live: dict[str, Request] = {}
        self._tracks: dict[str, RequestTrack] = {}
        self._hits: dict[str, list[bytes]] = {}
        self._pending: dict[str, _Loaded] = {}  # allocated, not yet sent to the worker
        self._loaded: dict[str, _Loaded] = {}  # sent to the worker (kept to undo persistence on failure)
        self._awaiting_copy: set[str] = set()  # staged: copy into the paged cache when next scheduled
        self._pending_holds: list[HoldSpec] = []
        self._pending_pd: dict[str, PdLoad] = {}
        self._pd_loaded: dict[str, tuple[PdLoad, int]] = {}  # decode side: the hand-off and its tokens
        # worker side
        self._layer_index: dict[str, int] = {}
        self._kv_layers: list[torch.Tensor] = []
        self._loader: KvLoader | None = None
        self._writer: StorageWriter | None = None
        self._de_service: DeReadService | None = None
        self._step: LayerLoads | None = None
        self._step_stagings: list[Staging] = []
        self._staged: dict[str, Staging] = {}
        self._ready: list[Staging] = []
        self._ready_lock = threading.Lock()
        self._ready_event = threading.Event()
        self._invalid: set[int] = set()
        self._pd_sender: PdSender | None = None
        self._pd_receiver: PdReceiver | None = None
        self._pd_unsent: set[str] = set()  # holds this worker cannot serve (no endpoint): freed at once
        self.timelines: list[StepTimeline] = []
        self.snic = make_snic(f"{self.config.endpoint or 'vllm'}.snic", self.config.snic_bytes_per_s)
        if role == KVConnectorRole.WORKER and self.config.stats_file:
            threading.Thread(target=self._write_stats, name="dualpath-stats", daemon=True).start()
        if role == KVConnectorRole.WORKER and self.config.de_serve_endpoint:
            # This instance is also a DE for others: it reads their hits through its own SNIC (paper §4.1).
            self._de_service = DeReadService(
                endpoint=shard_name(self.config.de_serve_endpoint, self.tp_rank, self.tp_size),
                namespace=self.config.namespace,
                store=self.store,
                snic=self.snic,
                transport=self.config.transport,
                host=self.config.listen_host,
                port=_rank_port(self.config.de_serve_port, self.tp_rank),
            )

    def _write_stats(self) -> None:
        name = self.config.stats_file
        path = Path(name if self.tp_size == 1 else f"{name}.tp{self.tp_rank}")
        while True:
            rx, tx = self.snic.rx.stats(), self.snic.tx.stats()
            record = {
                "rate_bytes_per_s": rx.rate_bytes_per_s,
                "rx_bytes": rx.total_bytes,
                "rx_busy_s": rx.busy_s,
                "tx_bytes": tx.total_bytes,
                "wall_s": rx.wall_s,
            }
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record))
            tmp.replace(path)  # readers never see a half-written file
            time.sleep(0.5)

    # ================================ scheduler side ================================================
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        pd = _pd_params(request)
        if pd.get("role") == "decode":  # the KV of the prompt comes from the prefill instance (pd.py)
            prompt_tokens = len(request.prompt_token_ids or [])
            tokens = min(int(pd["tokens"]), prompt_tokens - 1) - num_computed_tokens
            return (tokens, True) if tokens > 0 else (0, False)
        if num_computed_tokens % self.full_block_tokens:
            return 0, False  # a local hit ending inside a Full Block: loads start at Full Block boundaries
        first = num_computed_tokens // self.full_block_tokens
        keys, hit = hit_blocks(
            request.prompt_token_ids or [], self.full_block_tokens, self._on_disk, start_block=first
        )
        self._hits[request.request_id] = keys
        tokens = max(0, (hit - first) * self.full_block_tokens)
        return tokens, self.staged and tokens > 0

    def _on_disk(self, key: bytes) -> bool:
        # The file, not this process's index: the worker's store drops a corrupt block from disk.
        return self.store.path_of(key).is_file()

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        rid = request.request_id
        self._live[rid] = request
        track = self._tracks.setdefault(rid, RequestTrack())
        if num_external_tokens <= 0:
            return
        pd = _pd_params(request)
        if pd.get("role") == "decode":
            blocks_needed = -(-(request.num_computed_tokens + num_external_tokens) // self.vllm_block_tokens)
            self._pending_pd[rid] = PdLoad(
                request_id=rid,
                job=str(pd["job"]),
                prefill_endpoint=str(pd["prefill_endpoint"]),
                vllm_block_ids=tuple(blocks.get_block_ids()[0][:blocks_needed]),
            )
            self._pd_loaded[rid] = (self._pending_pd[rid], num_external_tokens)
            # the prefill instance persisted the prompt's Full Blocks; this one persists what it decodes
            track.persisted_blocks = (
                request.num_computed_tokens + num_external_tokens
            ) // self.full_block_tokens
            return
        keys = self._hits.pop(rid)
        n = num_external_tokens // self.full_block_tokens
        first = request.num_computed_tokens // self.full_block_tokens  # tokens vLLM had before this hit
        params = (request.kv_transfer_params or {}).get("dualpath", {})
        spec = LoadSpec(
            request_id=rid,
            read_path=params.get("read_path", self.config.read_path),
            de_endpoint=params.get("de_endpoint", self.config.de_endpoint),
            blocks=spans(keys, first, first + n, blocks.get_block_ids()[0], self.per_full_block),
            tokens=num_external_tokens,
        )
        self._pending[rid] = _Loaded(spec=spec, first_block=first)
        track.keys = list(keys[: first + n])
        track.persisted_blocks = first + n  # the hit is in the store already

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        specs = tuple(p.spec for p in self._pending.values())
        self._loaded.update(self._pending)
        self._pending.clear()
        scheduled = scheduler_output.num_scheduled_tokens
        copy = tuple(rid for rid in self._awaiting_copy if rid in scheduled)
        self._awaiting_copy.difference_update(copy)
        if self.staged:
            self._awaiting_copy.update(s.request_id for s in specs)
        assert self._kv_cache_manager is not None, "vLLM binds the cache manager before scheduling"
        saves = []
        for rid, tokens in scheduled.items():
            track, request = self._tracks.get(rid), self._live.get(rid)
            if track is None or request is None:
                continue
            blocks = blocks_to_persist(
                track,
                request.all_token_ids,
                request.num_computed_tokens + tokens,
                self._kv_cache_manager.get_block_ids(rid)[0],
                self.per_full_block,
                self.full_block_tokens,
            )
            if blocks:
                saves.append(SaveSpec(request_id=rid, blocks=blocks))
        holds, self._pending_holds = tuple(self._pending_holds), []
        pd_loads = tuple(self._pending_pd.values())
        self._pending_pd.clear()
        return DualPathMetadata(
            holds=holds,
            pd_loads=pd_loads,
            idle=scheduler_output.total_num_scheduled_tokens == 0,
            stage=specs if self.staged else (),
            copy=copy,
            loads=() if self.staged else specs,
            saves=tuple(saves),
        )

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        invalid = connector_output.invalid_block_ids or set()
        if not invalid:
            return
        for rid, (pd_load, _) in list(self._pd_loaded.items()):
            if invalid.intersection(pd_load.vllm_block_ids):
                self._pd_loaded[rid] = (pd_load, 0)  # recomputed here, not handed off
        for rid, loaded in self._loaded.items():
            track = self._tracks.get(rid)
            bad = [j for j, b in enumerate(loaded.spec.blocks) if invalid.intersection(b.vllm_block_ids)]
            if track is not None and bad:
                # vLLM recomputes from the first bad block on, so it is persisted again from there on.
                first = loaded.first_block + bad[0]
                track.persisted_blocks = min(track.persisted_blocks, first)
                del track.keys[first:]

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        for table in (self._tracks, self._loaded, self._pending, self._hits, self._live):
            table.pop(rid, None)
        self._awaiting_copy.discard(rid)
        self._pending_pd.pop(rid, None)
        pd = _pd_params(request)
        handed_off = self._pd_loaded.pop(rid, None)
        if handed_off is not None:  # the answer says how many prompt tokens came from the prefill instance
            return False, {"dualpath": {"pd_loaded_tokens": handed_off[1]}}
        if pd.get("role") == "prefill" and request.num_computed_tokens > 0:
            # Keep the blocks until the decode instance has taken them (freed after get_finished says so).
            n = -(-request.num_computed_tokens // self.vllm_block_tokens)
            self._pending_holds.append(
                HoldSpec(request_id=rid, job=str(pd["job"]), vllm_block_ids=tuple(block_ids[:n]))
            )
            return True, None
        return False, None

    # ================================ worker side ===================================================
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = sorted(kv_caches, key=extract_layer_index)
        self._layer_index = {name: i for i, name in enumerate(names)}
        self._kv_layers = [kv_caches[n] for n in names]
        self._loader = KvLoader(
            store=self.store,
            snic=self.snic,
            kv_layers=self._kv_layers,
            layer_block_bytes=layer_block_bytes(self._kv_layers[0], self.per_full_block),
            endpoint=shard_name(self.config.endpoint, self.tp_rank, self.tp_size),
            namespace=self.config.namespace,
            de_buffer_bytes=self.config.de_buffer_bytes if self.config.endpoint else 0,
            peer_name=lambda de: shard_name(de, self.tp_rank, self.tp_size),
            transport=self.config.transport,
            host=self.config.listen_host,
            port=_rank_port(self.config.listen_port, self.tp_rank),
            peer_addresses=parse_peers(self.config.peers),
        )
        self._writer = StorageWriter(self.store, self.snic)
        loader = self._loader
        if loader.backend is not None:
            self._pd_sender = PdSender(self._kv_layers, loader.backend, loader.peers)
            self._pd_receiver = PdReceiver(
                self._kv_layers,
                loader.backend,
                loader.receive_buffer,
                loader.pool,
                loader.peers,
                endpoint=loader.endpoint,
                peer_name=lambda name: shard_name(name, self.tp_rank, self.tp_size),
            )
            loader.on_ask = self._pd_sender.on_ask
            loader.on_pd_layer = self._pd_receiver.on_layer

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        # Every load starts here, before the forward pass: vLLM calls start_load_kv after the forward when
        # a step has no synchronous load, and a staged hit's copy must precede the layers that read it.
        super().bind_connector_metadata(connector_metadata)
        assert isinstance(connector_metadata, DualPathMetadata)
        if self._loader is not None:
            self._begin_step(self._loader, connector_metadata)

    def _begin_step(self, loader: KvLoader, meta: DualPathMetadata) -> None:
        for hold in meta.holds:
            if self._pd_sender is not None:
                self._pd_sender.hold(hold)
            else:
                self._pd_unsent.add(hold.request_id)
        for pd_load in meta.pd_loads:
            if self._pd_receiver is not None:
                self._pd_receiver.start(pd_load)
        for spec in meta.stage:
            old = self._staged.pop(spec.request_id, None)
            if old is not None:
                loader.release(old)
            self._staged[spec.request_id] = loader.stage(spec, on_ready=self._staging_ready)
        copies = [self._staged.pop(rid) for rid in meta.copy if rid in self._staged]
        if not meta.loads and not copies:
            self._step = None
            return
        step = LayerLoads(loader.num_layers)
        self._step, self._step_stagings = step, list(copies)
        for layer in range(loader.num_layers):
            step.expect(layer, len(meta.loads) + (1 if copies else 0))
        for spec in meta.loads:
            self._step_stagings.append(
                loader.stage(spec, on_layer=lambda st, layer: self._layer_landed(loader, st, layer, step))
            )
        if copies:
            threading.Thread(target=self._copy_staged, args=(loader, copies, step), daemon=True).start()
        if self.config.record_timeline:
            self.timelines.append(StepTimeline(landed_s=step.landed_at_s))

    def _layer_landed(self, loader: KvLoader, st: Staging, layer: int, step: LayerLoads) -> None:
        try:
            loader.copy_layer(st, layer)
        except Exception:  # the whole hit is recomputed instead
            st.bad_blocks.update(range(len(st.spec.blocks)))
        step.done(layer, invalid_ids=st.bad_vllm_block_ids())

    def _copy_staged(self, loader: KvLoader, copies: list[Staging], step: LayerLoads) -> None:
        for layer in range(loader.num_layers):
            for st in copies:
                loader.copy_layer(st, layer)
            step.done(layer)

    def _staging_ready(self, st: Staging) -> None:
        with self._ready_lock:
            self._ready.append(st)
        self._ready_event.set()

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        return  # started in bind_connector_metadata

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._step is None:
            return
        try:
            self._step.wait(self._layer_index[layer_name], LOAD_TIMEOUT_S)
        except LoadTimeout:
            self._fail_step()
        if self.config.record_timeline and self.timelines:
            self.timelines[-1].compute_start_s.append(time.monotonic())

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        if self._step is not None and self.config.record_timeline and self.timelines:
            self.timelines[-1].compute_end_s.append(time.monotonic())

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, DualPathMetadata)
        failed: set[str] = set()
        layerwise = {s.request_id for s in meta.loads}
        if self._step is not None:
            try:
                self._step.wait_all(LOAD_TIMEOUT_S)
            except LoadTimeout:
                self._fail_step()
            for st in self._step_stagings:
                bad = st.bad_vllm_block_ids()
                if bad and st.spec.request_id in layerwise:
                    failed.add(st.spec.request_id)
                    self._invalid |= bad
                if self._loader is not None:
                    self._loader.release(st)
            self._step, self._step_stagings = None, []
        self._persist(meta.saves, skip=failed)

    def _fail_step(self) -> None:
        assert self._step is not None
        self._step.fail_all(())
        for st in self._step_stagings:
            st.bad_blocks.update(range(len(st.spec.blocks)))

    def _persist(self, saves: tuple[SaveSpec, ...], *, skip: set[str]) -> None:
        # A request whose load failed computed this step on top of bad KV: none of its blocks are kept.
        writes = [
            BlockWrite(
                key=b.key,
                data=full_block(self._kv_layers, b.vllm_block_ids),
                num_layers=len(self._kv_layers),
                parent=b.parent,
            )
            for s in saves
            if s.request_id not in skip
            for b in s.blocks
        ]
        if not writes or self._writer is None:
            return
        job = WriteJob(job_id=f"persist-{time.monotonic_ns()}", blocks=tuple(writes))
        future = self._writer.submit(job)
        if self.config.persist_wait:
            future.result()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Staged hits now in DRAM; their bad blocks go out in the same pass (vLLM's contract)."""
        meta = self._connector_metadata
        waiting = self._staged or (self._pd_receiver is not None and self._pd_receiver.pending())
        if isinstance(meta, DualPathMetadata) and meta.idle and waiting:
            # Nothing to compute: wait briefly for a staging instead of letting vLLM's loop spin, which would
            # hold the GIL that the read threads need.
            self._ready_event.wait(IDLE_WAIT_S)
        self._ready_event.clear()
        with self._ready_lock:
            ready, self._ready = self._ready, []
        now = time.monotonic()
        for st in self._staged.values():  # a staging that never finishes is given up, so its request goes on
            if not st.ready and now - st.started_s > LOAD_TIMEOUT_S and self._loader is not None:
                self._loader.abandon(st)
                ready.append(st)
        for st in ready:
            self._invalid |= st.bad_vllm_block_ids()
        for rid in finished_req_ids:  # finished (or aborted) before its staged hit was used
            st = self._staged.pop(rid, None)
            if st is not None and self._loader is not None:
                self._loader.release(st)
        recving = {st.spec.request_id for st in ready}
        sending, self._pd_unsent = self._pd_unsent, set()
        if self._pd_sender is not None:
            sending |= self._pd_sender.take_finished()
        if self._pd_receiver is not None:
            for rid, bad in self._pd_receiver.take_ready():
                recving.add(rid)
                self._invalid.update(bad)
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._invalid = self._invalid, set()
        return out

    def shutdown(self) -> None:
        if self._loader is not None:
            self._loader.close()
        if self._writer is not None:
            self._writer.close()
        if self._de_service is not None:
            self._de_service.close()


def _tp_rank() -> int:
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


def _pd_params(request: Request) -> dict[str, Any]:
    pd = ((request.kv_transfer_params or {}).get("dualpath") or {}).get("pd")
    return pd if isinstance(pd, dict) else {}


def _rank_port(port: int, rank: int) -> int:
    return port + rank if port else 0
