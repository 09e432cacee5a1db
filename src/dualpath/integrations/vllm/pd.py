"""The prefill → decode hand-off between two vLLM instances (paper §3: the PE ships the request's KV to the DE,
which loads it once and decodes).

    router ──max_tokens=1, pd {role: prefill, job}──► prefill instance P (computes; hit via PE/DE read path)
        P.request_finished: the request's blocks are held (not freed) under `job`
    router ──prompt + first token, pd {role: decode, job, prefill_endpoint, tokens}──► decode instance D
        D: the request waits (vLLM's async load); D's worker takes a range of its receive buffer and asks P
        ──notice {op: send, job, reply_to, offset}──► P's worker writes layer by layer into D's buffer
        ◄──write + notice {pd_job, layer}── D copies each layer into its paged cache; all in: D decodes
        P frees the blocks once all layers are written

D persists the Full Blocks its decode completes (P persisted the prompt's). Shared memory on one host, TCP
across hosts (endpoints.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from dualpath.integrations.vllm.buffer_pool import BufferPool
from dualpath.integrations.vllm.de_service import RECEIVE_BUFFER
from dualpath.integrations.vllm.endpoints import Backend, Peers
from dualpath.integrations.vllm.paged import read_layer_block, write_layer_block
from dualpath.transfer import Notice

PD_TIMEOUT_S = 120.0


@dataclass(frozen=True, kw_only=True)
class HoldSpec:
    """P side: a finished prefill's blocks, kept until D has taken them."""

    request_id: str
    job: str
    vllm_block_ids: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class PdLoad:
    """D side: the blocks that receive P's KV for `tokens` tokens."""

    request_id: str
    job: str
    prefill_endpoint: str
    vllm_block_ids: tuple[int, ...]


@dataclass
class _Receiving:
    spec: PdLoad
    offset_bytes: int
    nbytes: int
    layers_left: int
    started_s: float = field(default_factory=time.monotonic)


class PdSender:
    """P's worker: holds finished prefills and writes them into the decode instance that asks."""

    def __init__(self, kv_layers: Sequence[torch.Tensor], backend: Backend, peers: Peers) -> None:
        self.kv_layers, self.backend, self.peers = list(kv_layers), backend, peers
        self._lock = threading.Lock()
        self._holds: dict[str, tuple[HoldSpec, float]] = {}
        self._asks: dict[str, Notice] = {}  # asks that came before their hold
        self._done: set[str] = set()

    def hold(self, spec: HoldSpec) -> None:
        with self._lock:
            self._holds[spec.job] = (spec, time.monotonic())
            ask = self._asks.pop(spec.job, None)
        if ask is not None:
            self._send(ask)

    def on_ask(self, notice: Notice) -> None:
        with self._lock:
            if notice.payload["job"] not in self._holds:
                self._asks[notice.payload["job"]] = notice
                return
        threading.Thread(target=self._send, args=(notice,), daemon=True).start()

    def _send(self, notice: Notice) -> None:
        p = notice.payload
        with self._lock:
            spec, _ = self._holds.pop(p["job"])
        peer, offset = self.peers(p["reply_to"], p.get("reply_address")), int(p["offset_bytes"])
        try:
            for layer, kv in enumerate(self.kv_layers):  # layer by layer, layer 0 first
                data = read_layer_block(kv, spec.vllm_block_ids)
                self.backend.write(
                    peer, RECEIVE_BUFFER, offset, data.numpy(), notice={"pd_job": p["job"], "layer": layer}
                )
                offset += data.numel()
        except Exception as error:  # D gives up after its timeout and recomputes
            self.backend.notify(peer, {"pd_job": p["job"], "layer": -1, "error": str(error)})
        with self._lock:
            self._done.add(spec.request_id)

    def take_finished(self) -> set[str]:
        """Requests whose blocks may be freed: sent, or never asked for within PD_TIMEOUT_S."""
        now = time.monotonic()
        with self._lock:
            for job, (spec, held_s) in list(self._holds.items()):
                if now - held_s > PD_TIMEOUT_S:
                    del self._holds[job]
                    self._done.add(spec.request_id)
            done, self._done = self._done, set()
        return done


class PdReceiver:
    """D's worker: asks P for a request's KV and copies each layer into the paged cache as it lands."""

    def __init__(
        self,
        kv_layers: Sequence[torch.Tensor],
        backend: Backend,
        receive: memoryview,
        pool: BufferPool,
        peers: Peers,
        endpoint: str,
        peer_name: Callable[[str], str],
    ) -> None:
        self.kv_layers, self.backend, self.receive, self.pool = list(kv_layers), backend, receive, pool
        self.peers, self.endpoint, self.peer_name = peers, endpoint, peer_name
        self._lock = threading.Lock()
        self._receiving: dict[str, _Receiving] = {}
        self._ready: list[tuple[str, tuple[int, ...]]] = []  # (request id, vLLM blocks that failed)

    def layer_bytes(self, spec: PdLoad) -> int:
        kv = self.kv_layers[0]
        return len(spec.vllm_block_ids) * kv[0].numel() * kv.element_size()

    def start(self, spec: PdLoad) -> None:
        nbytes = self.layer_bytes(spec) * len(self.kv_layers)
        offset = self.pool.allocate(nbytes)
        if offset is None:  # no room: vLLM recomputes the prompt
            with self._lock:
                self._ready.append((spec.request_id, spec.vllm_block_ids))
            return
        with self._lock:
            self._receiving[spec.job] = _Receiving(spec, offset, nbytes, len(self.kv_layers))
        peer = self.peers(self.peer_name(spec.prefill_endpoint))
        self.backend.notify(
            peer, {"op": "send", "job": spec.job, "reply_to": self.endpoint, "offset_bytes": offset}
        )

    def on_layer(self, notice: Notice) -> None:
        p = notice.payload
        with self._lock:
            rx = self._receiving.get(p["pd_job"])
        if rx is None:
            return
        layer = int(p["layer"])
        failed = bool(p.get("error") or notice.error) or layer < 0
        if not failed:
            n = self.layer_bytes(rx.spec)
            at = rx.offset_bytes + layer * n
            write_layer_block(self.kv_layers[layer], rx.spec.vllm_block_ids, self.receive[at : at + n])
        with self._lock:
            rx.layers_left -= 1
            if failed or rx.layers_left == 0:
                self._finish(p["pd_job"], rx, failed)

    def _finish(self, job: str, rx: _Receiving, failed: bool) -> None:
        del self._receiving[job]
        self.pool.release(rx.offset_bytes, rx.nbytes)
        self._ready.append((rx.spec.request_id, rx.spec.vllm_block_ids if failed else ()))

    def pending(self) -> bool:
        with self._lock:
            return bool(self._receiving)

    def take_ready(self) -> list[tuple[str, tuple[int, ...]]]:
        now = time.monotonic()
        with self._lock:
            for job, rx in list(self._receiving.items()):
                if now - rx.started_s > PD_TIMEOUT_S:  # P never answered: its range is never reused
                    del self._receiving[job]
                    self._ready.append((rx.spec.request_id, rx.spec.vllm_block_ids))
            ready, self._ready = self._ready, []
        return ready
