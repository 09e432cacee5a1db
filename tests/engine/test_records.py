"""The decision core's plain records show every field in their `repr` (dualpath/records.py)."""

from __future__ import annotations

from dualpath.engine.commands import StartPersist
from dualpath.engine.decode import DecodeEvent
from dualpath.policy.de_assign import DeCandidate
from dualpath.policy.pe_assign import PeCandidate
from dualpath.policy.types import EngineLoad
from dualpath.request import Request


def _request() -> Request:
    return Request(request_id=7, trajectory_id=1, round_index=2, prompt_tokens=100, hit_tokens=64,
                   gen_tokens=5, arrival_s=1.5)  # fmt: skip


def test_each_record_shows_its_class_and_every_field_by_name() -> None:
    r = _request()
    assert repr(EngineLoad(engine_id=3, node_id=1, seq=4, tok=10, compute_tok=2, read_q_tokens=6)) == (
        "EngineLoad(engine_id=3, node_id=1, seq=4, tok=10, compute_tok=2, read_q_tokens=6, free_hbm_tokens=0)"
    )
    assert repr(PeCandidate(engine_id=3, node_id=1, tok=10, compute_tok=2, read_q_tokens=6)) == (
        "PeCandidate(engine_id=3, node_id=1, tok=10, compute_tok=2, read_q_tokens=6)"
    )
    assert repr(DeCandidate(engine_id=3, node_id=1, seq=4, tok=10, free_hbm_tokens=9)) == (
        "DeCandidate(engine_id=3, node_id=1, seq=4, tok=10, free_hbm_tokens=9)"
    )
    assert repr(r).startswith("Request(request_id=7, trajectory_id=1, round_index=2, prompt_tokens=100, ")
    assert repr(r).endswith("persisted_tokens=64, parts_reading=0, persists_in_flight=0, dram_holds=-1)")
    event = DecodeEvent(
        request=r, step=3, second_token=True, persist_tokens=0, persisted_tokens=64, finished=False
    )
    assert repr(event) == (
        f"DecodeEvent(request={r!r}, step=3, second_token=True, persist_tokens=0, persisted_tokens=64, finished=False)"
    )
    persist = StartPersist(de_engine=2, request_id=7, start_tokens=64, tokens=64, from_hbm=True)
    assert (
        repr(persist) == "StartPersist(de_engine=2, request_id=7, start_tokens=64, tokens=64, from_hbm=True)"
    )
    assert persist.end_tokens == 128
