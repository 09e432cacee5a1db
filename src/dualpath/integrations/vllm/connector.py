"""`DualPathConnector`: a vLLM KV connector (v1 API) backed by the DualPath store, with both read paths.

Load it with
    --kv-transfer-config '{"kv_connector": "DualPathConnector",
                           "kv_connector_module_path": "dualpath.integrations.vllm",
                           "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                           "kv_connector_extra_config": {"store_dir": "/mnt/kv", ...}}'

One class serves both of vLLM's roles:

    scheduler side  get_num_new_matched_tokens  hit length: leading Full Blocks of the prompt in the store
                    update_state_after_alloc    the hit's vLLM blocks and its read path (PE or DE)
                    build_connector_meta        this step's loads, and the Full Blocks complete after it
                    update_connector_output     a failed load: persist those blocks again once recomputed
    worker side     start_load_kv               start reading every layer of the hit (KvLoader)
                    wait_for_layer_load(l)      block until layer l is in the paged cache
                    save_kv_layer(l)            layer l computed (timeline only)
                    wait_for_save               all loads landed; copy the new Full Blocks out, persist them
                    get_block_ids_with_load_errors   blocks that were missing or failed their checksum

The read path of a request is `kv_transfer_params["dualpath"]["read_path"]` ("pe" or "de", with
"de_endpoint"), else the configured default. Sync loads (not vLLM's async mode) keep the load inside the
forward pass, which is what lets layer i+1 load under layer i's compute (paper §4.1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.model_executor.models.utils import extract_layer_index

from dualpath.integrations.vllm.config import ConnectorConfig
from dualpath.integrations.vllm.de_service import DeReadService, make_snic
from dualpath.integrations.vllm.layer_wait import LayerLoads, LoadTimeout
from dualpath.integrations.vllm.loader import KvLoader
from dualpath.integrations.vllm.paged import full_block, layer_block_bytes
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


@dataclass
class DualPathMetadata(KVConnectorMetadata):
    loads: tuple[LoadSpec, ...] = ()
    saves: tuple[SaveSpec, ...] = ()


@dataclass
class StepTimeline:
    """Hook times of one step with loads (monotonic seconds), per layer."""

    landed_s: list[float]
    compute_start_s: list[float] = field(default_factory=list)
    compute_end_s: list[float] = field(default_factory=list)


@dataclass
class _Pending:
    spec: LoadSpec
    first_block: int


class DualPathConnector(KVConnectorBase_V1):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.config = ConnectorConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config or {})
        self.vllm_block_tokens = vllm_config.cache_config.block_size
        self.per_full_block = self.config.full_block_vllm_blocks
        self.full_block_tokens = self.vllm_block_tokens * self.per_full_block
        self.store = FileStore(self.config.store_dir, self.config.store_capacity_bytes)
        # scheduler side
        self._live: dict[str, Request] = {}
        self._tracks: dict[str, RequestTrack] = {}
        self._loaded: dict[str, _Pending] = {}
        self._pending: dict[str, _Pending] = {}
        self._hits: dict[str, list[bytes]] = {}
        # worker side
        self._layer_index: dict[str, int] = {}
        self._kv_layers: list[torch.Tensor] = []
        self._loader: KvLoader | None = None
        self._writer: StorageWriter | None = None
        self._de_service: DeReadService | None = None
        self._step: LayerLoads | None = None
        self._step_failed: set[str] = set()
        self._invalid: set[int] = set()
        self.timelines: list[StepTimeline] = []
        self.snic = make_snic(f"{self.config.endpoint or 'vllm'}.snic", self.config.snic_bytes_per_s)
        if role == KVConnectorRole.WORKER and self.config.de_serve_endpoint:
            # This instance is also a DE for others: it reads their hits through its own SNIC (paper §4.1).
            self._de_service = DeReadService(
                endpoint=self.config.de_serve_endpoint,
                namespace=self.config.namespace,
                store=self.store,
                snic=self.snic,
            )

    # ================================ scheduler side ================================================
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if num_computed_tokens % self.full_block_tokens:
            return 0, False  # a local hit ending inside a Full Block: loads start at Full Block boundaries
        first = num_computed_tokens // self.full_block_tokens
        keys, hit = hit_blocks(
            request.prompt_token_ids or [], self.full_block_tokens, self._on_disk, start_block=first
        )
        self._hits[request.request_id] = keys
        return max(0, (hit - first) * self.full_block_tokens), False

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
        keys = self._hits.pop(rid)
        n = num_external_tokens // self.full_block_tokens
        local_tokens = request.num_computed_tokens  # tokens vLLM already had before this hit
        first = local_tokens // self.full_block_tokens
        params = (request.kv_transfer_params or {}).get("dualpath", {})
        read_path = params.get("read_path", self.config.read_path)
        spec = LoadSpec(
            request_id=rid,
            read_path=read_path,
            de_endpoint=params.get("de_endpoint", self.config.de_endpoint),
            blocks=spans(keys, first, first + n, blocks.get_block_ids()[0], self.per_full_block),
            tokens=num_external_tokens,
        )
        self._pending[rid] = _Pending(spec=spec, first_block=first)
        track.keys = list(keys[: first + n])
        track.persisted_blocks = max(track.persisted_blocks, first + n)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        loads = tuple(p.spec for p in self._pending.values())
        self._loaded.update(self._pending)
        self._pending.clear()
        saves = []
        assert self._kv_cache_manager is not None, "vLLM binds the cache manager before scheduling"
        for rid, scheduled in scheduler_output.num_scheduled_tokens.items():
            track = self._tracks.get(rid)
            request = self._live.get(rid)
            if track is None or request is None:
                continue
            blocks = blocks_to_persist(
                track,
                request.all_token_ids,
                request.num_computed_tokens + scheduled,
                self._kv_cache_manager.get_block_ids(rid)[0],
                self.per_full_block,
                self.full_block_tokens,
            )
            if blocks:
                saves.append(SaveSpec(request_id=rid, blocks=blocks))
        return DualPathMetadata(loads=loads, saves=tuple(saves))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        invalid = connector_output.invalid_block_ids or set()
        if not invalid:
            return
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
        return False, None

    # ================================ worker side ===================================================
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = sorted(kv_caches, key=extract_layer_index)
        self._layer_index = {name: i for i, name in enumerate(names)}
        self._kv_layers = [kv_caches[n] for n in names]
        lb = layer_block_bytes(self._kv_layers[0], self.per_full_block)
        self._loader = KvLoader(
            store=self.store,
            snic=self.snic,
            kv_layers=self._kv_layers,
            layer_block_bytes=lb,
            endpoint=self.config.endpoint,
            namespace=self.config.namespace,
            de_buffer_bytes=self.config.de_buffer_bytes if self.config.endpoint else 0,
        )
        self._writer = StorageWriter(self.store, self.snic)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, DualPathMetadata)
        if not meta.loads or self._loader is None:
            self._step = None
            return
        self._step = self._loader.start(meta.loads)
        if self.config.record_timeline:
            self.timelines.append(StepTimeline(landed_s=self._step.landed_at_s))

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._step is None:
            return
        layer = self._layer_index[layer_name]
        try:
            self._step.wait(layer, LOAD_TIMEOUT_S)
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
        if self._step is not None:
            try:
                self._step.wait_all(LOAD_TIMEOUT_S)
            except LoadTimeout:
                self._fail_step()
            invalid = self._step.invalid_block_ids
            self._invalid |= invalid
            failed = {s.request_id for s in meta.loads if invalid.intersection(_ids(s))}
            self._step = None
        self._persist(meta.saves, skip=failed)

    def _fail_step(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, DualPathMetadata) and self._step is not None
        self._step.fail_all(i for s in meta.loads for i in _ids(s))

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
        future = self._writer.submit(WriteJob(job_id=f"persist-{time.monotonic_ns()}", blocks=tuple(writes)))
        if self.config.persist_wait:
            future.result()

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


def _ids(spec: LoadSpec) -> list[int]:
    return [i for b in spec.blocks for i in b.vllm_block_ids]
