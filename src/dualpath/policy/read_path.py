"""Read-path choice (paper §6.3): which node's SNIC reads a request's hit KV.

One strategy class per policy, one method each (STYLE habit 7); `READ_PATH_POLICIES` maps the
CLI names to classes. Plans are in whole Full Blocks (`block_tokens`) because storage holds Full
Blocks (§4.1); `hit_tokens` is already a whole number of blocks.
"""

from __future__ import annotations

from dualpath.policy.types import NodeReadState, ReadPlan


class ReadPathPolicy:
    """A read-path policy: `plan` splits a request's hit between the PE's and the DE's SNIC.

    A base class rather than a protocol: the scheduler calls `plan` once per placed request, and in the
    compiled build a call through a base class is a direct call, through a protocol a generic one that
    looks the method up by name and passes its keywords as objects (docs/simulator-native.md)."""

    name = ""

    def plan(
        self, hit_tokens: int, *, pe_node: NodeReadState, de_node: NodeReadState, block_tokens: int
    ) -> ReadPlan:
        raise NotImplementedError


class PrefillSide(ReadPathPolicy):
    """Always the PE's SNIC (the baseline's only path, Fig. 4a)."""

    name = "pe-read"

    def plan(
        self, hit_tokens: int, *, pe_node: NodeReadState, de_node: NodeReadState, block_tokens: int
    ) -> ReadPlan:
        return ReadPlan(pe_read_tokens=hit_tokens, de_read_tokens=0)


class DecodeSide(ReadPathPolicy):
    """Always the DE's SNIC (Fig. 4b)."""

    name = "de-read"

    def plan(
        self, hit_tokens: int, *, pe_node: NodeReadState, de_node: NodeReadState, block_tokens: int
    ) -> ReadPlan:
        return ReadPlan(pe_read_tokens=0, de_read_tokens=hit_tokens)


class ShorterQueue(ReadPathPolicy):
    """The paper's policy: the whole request from the node with the shorter read queue (PE on a tie)."""

    name = "shorter-queue"

    def plan(
        self, hit_tokens: int, *, pe_node: NodeReadState, de_node: NodeReadState, block_tokens: int
    ) -> ReadPlan:
        if de_node.read_q_tokens < pe_node.read_q_tokens:
            return ReadPlan(pe_read_tokens=0, de_read_tokens=hit_tokens)
        return ReadPlan(pe_read_tokens=hit_tokens, de_read_tokens=0)


class Split(ReadPathPolicy):
    """Beyond the paper (its §6.3 future work): divide the hit blocks so both sides finish together.

    With queues q_pe, q_de (tokens) draining at r_pe, r_de (tokens/s) and H hit tokens, the PE share
    x solves (q_pe + x)/r_pe = (q_de + H - x)/r_de, i.e.
    x = (r_pe·(q_de + H) - r_de·q_pe) / (r_pe + r_de), clamped to [0, H], rounded to whole blocks.
    """

    name = "split"

    def plan(
        self, hit_tokens: int, *, pe_node: NodeReadState, de_node: NodeReadState, block_tokens: int
    ) -> ReadPlan:
        r_pe, r_de = pe_node.read_tokens_per_s, de_node.read_tokens_per_s
        if r_pe + r_de <= 0:
            return ReadPlan(pe_read_tokens=hit_tokens, de_read_tokens=0)
        x = (r_pe * (de_node.read_q_tokens + hit_tokens) - r_de * pe_node.read_q_tokens) / (r_pe + r_de)
        x = min(max(x, 0.0), float(hit_tokens))
        pe_tokens = min(hit_tokens, int(round(x / block_tokens)) * block_tokens)
        return ReadPlan(pe_read_tokens=pe_tokens, de_read_tokens=hit_tokens - pe_tokens)


class Alternating(ReadPathPolicy):
    """Round-robin baseline: PE side, DE side, PE side, … per request (`dualpath-rr` default)."""

    name = "alternating"

    def __init__(self) -> None:
        self._next_de = False

    def plan(
        self, hit_tokens: int, *, pe_node: NodeReadState, de_node: NodeReadState, block_tokens: int
    ) -> ReadPlan:
        de, self._next_de = self._next_de, not self._next_de
        return ReadPlan(pe_read_tokens=0 if de else hit_tokens, de_read_tokens=hit_tokens if de else 0)


READ_PATH_POLICIES: dict[str, type[ReadPathPolicy]] = {
    # `cls().name`, not `cls.name`: compiled by mypyc, `name` is an instance attribute (native.py).
    cls().name: cls
    for cls in (PrefillSide, DecodeSide, ShorterQueue, Split, Alternating)
}


def make_read_path_policy(name: str) -> ReadPathPolicy:
    try:
        return READ_PATH_POLICIES[name]()
    except KeyError:
        known = ", ".join(sorted(READ_PATH_POLICIES))
        raise ValueError(f"unknown read path policy {name!r} (known: {known})") from None
