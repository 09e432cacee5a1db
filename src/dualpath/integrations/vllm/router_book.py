"""The router's decisions for vLLM instances, made with our policy code (paper §6), without I/O.

    basic     prefill instance by round robin; every hit read by that instance's node (PE read path)
    dualpath  prefill instance by Algorithm 1 (`choose_prefill_engine`: α on the node's read queue, β on its
              unfinished miss tokens, then least `tok`); read side by `ShorterQueue` between that node and the
              decode node with the shorter read queue (§6.3)

The book counts what the router itself sent: `tok` = prompt tokens of unfinished requests, `compute_tok` = their
miss tokens, a node's read queue = hit tokens sent to it whose load has not finished (the first token marks it).
vLLM's own scheduler batches inside an instance (§6.2's rule runs there, not here).
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.policy.de_assign import DeCandidate, choose_decode_engine
from dualpath.policy.pe_assign import PeCandidate, choose_prefill_engine
from dualpath.policy.read_path import ShorterQueue
from dualpath.policy.types import NodeReadState, ReadSide

MODES = ("basic", "dualpath")


@dataclass(frozen=True, kw_only=True)
class Placement:
    prefill: int  # index of the prefill instance
    read_path: str  # "pe" or "de"
    de_endpoint: str  # the decode node that reads, for "de"
    prompt_tokens: int
    hit_tokens: int

    @property
    def kv_transfer_params(self) -> dict[str, dict[str, str]]:
        path = {"read_path": self.read_path}
        if self.read_path == "de":
            path["de_endpoint"] = self.de_endpoint
        return {"dualpath": path}


class RouterBook:
    def __init__(
        self,
        num_prefill: int,
        de_endpoints: list[str],
        *,
        mode: str,
        block_tokens: int,
        alpha_tokens: float = float("inf"),
        beta_tokens: float = float("inf"),
        read_tokens_per_s: float = 1.0,
        num_decode: int = 0,
        z_tokens: float = float("inf"),
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if num_prefill <= 0:
            raise ValueError("the router needs at least one prefill instance")
        self.mode = mode
        self.block_tokens = block_tokens
        self.alpha_tokens, self.beta_tokens = alpha_tokens, beta_tokens
        self.read_tokens_per_s = read_tokens_per_s
        self.tok = [0] * num_prefill
        self.compute_tok = [0] * num_prefill
        self.pe_read_q = [0] * num_prefill
        self.de_read_q = dict.fromkeys(de_endpoints, 0)
        self._next = 0
        self._read_policy = ShorterQueue()
        self.decode_tok = [
            0
        ] * num_decode  # len_r (prompt + output) of unfinished requests per decode instance
        self.z_tokens = z_tokens

    def place(self, prompt_tokens: int, hit_tokens: int) -> Placement:
        if self.mode == "basic":
            prefill, self._next = self._next, (self._next + 1) % len(self.tok)
            read_path, de = "pe", ""
        else:
            prefill = self._choose_prefill()
            read_path, de = self._choose_read_side(prefill, hit_tokens)
        placement = Placement(
            prefill=prefill,
            read_path=read_path,
            de_endpoint=de,
            prompt_tokens=prompt_tokens,
            hit_tokens=hit_tokens,
        )
        self.tok[prefill] += prompt_tokens
        self.compute_tok[prefill] += prompt_tokens - hit_tokens
        self._read_queue(placement, +hit_tokens)
        return placement

    def _choose_prefill(self) -> int:
        candidates = [
            PeCandidate(engine_id=i, node_id=i, tok=t, compute_tok=c, read_q_tokens=q)
            for i, (t, c, q) in enumerate(zip(self.tok, self.compute_tok, self.pe_read_q, strict=True))
        ]
        chosen = choose_prefill_engine(
            candidates, alpha_tokens=self.alpha_tokens, beta_tokens=self.beta_tokens
        )
        if chosen is None:  # every instance over β: the least loaded still takes it (vLLM queues it)
            return min(range(len(self.tok)), key=lambda i: (self.compute_tok[i], i))
        return chosen.engine_id

    def _choose_read_side(self, prefill: int, hit_tokens: int) -> tuple[str, str]:
        if not hit_tokens or not self.de_read_q:
            return "pe", ""
        de = min(self.de_read_q, key=lambda name: (self.de_read_q[name], name))
        plan = self._read_policy.plan(
            hit_tokens,
            pe_node=NodeReadState(self.pe_read_q[prefill], self.read_tokens_per_s),
            de_node=NodeReadState(self.de_read_q[de], self.read_tokens_per_s),
            block_tokens=self.block_tokens,
        )
        return ("de", de) if plan.side is ReadSide.DE else ("pe", "")

    def _read_queue(self, placement: Placement, delta: int) -> None:
        if placement.read_path == "de":
            self.de_read_q[placement.de_endpoint] += delta
        else:
            self.pe_read_q[placement.prefill] += delta

    def loaded(self, placement: Placement) -> None:
        """The request's first token came: its hit is loaded and its prompt computed."""
        self._read_queue(placement, -placement.hit_tokens)
        self.compute_tok[placement.prefill] -= placement.prompt_tokens - placement.hit_tokens

    def finished(self, placement: Placement, *, loaded: bool) -> None:
        if not loaded:
            self.loaded(placement)
        self.tok[placement.prefill] -= placement.prompt_tokens

    # ---- the PD hand-off: which decode instance takes the request (§6.2, one engine per group) --------------
    def place_decode(self, len_tokens: int) -> int:
        candidates = [
            DeCandidate(engine_id=i, node_id=i, seq=0, tok=t, free_hbm_tokens=2**62)
            for i, t in enumerate(self.decode_tok)
        ]
        chosen = choose_decode_engine(len_tokens, candidates, z_tokens=self.z_tokens)
        assert chosen is not None, "free HBM is not tracked here, so every decode instance fits"
        self.decode_tok[chosen.engine_id] += len_tokens
        return chosen.engine_id

    def decode_finished(self, decode: int, len_tokens: int) -> None:
        self.decode_tok[decode] -= len_tokens
