"""Streamed text from the protocol package: incremental detokenization and stop strings, as properties
over every way of splitting the same output into deltas."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.protocol import CompletionBody, ProtocolError
from dualpath.protocol.text import IncrementalDetokenizer, StopStringMatcher


def _bytes_decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def _split(items: list, cuts: list[int]) -> list[list]:
    points = sorted({c % (len(items) + 1) for c in cuts})
    edges = [0, *points, len(items)]
    return [items[a:b] for a, b in zip(edges, edges[1:], strict=False)]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=st.text(max_size=30), cuts=st.lists(st.integers(0, 200), max_size=8))
def test_streamed_text_is_the_whole_decode_and_never_splits_a_character(text, cuts):
    ids = list(text.encode("utf-8"))
    detokenizer = IncrementalDetokenizer(_bytes_decode, context_ids=[104, 105])
    deltas = [detokenizer.push(part) for part in _split(ids, cuts)]
    assert "".join(deltas) + detokenizer.flush() == text
    assert all("\ufffd" not in d for d in deltas)


def test_an_incomplete_character_at_the_end_is_flushed_as_a_replacement():
    detokenizer = IncrementalDetokenizer(_bytes_decode)
    assert detokenizer.push([104]) == "h"
    assert detokenizer.push([0xC3]) == ""  # the first byte of "é": held for the next token
    assert detokenizer.flush() == "\ufffd"


def test_a_leading_space_the_decoder_drops_for_a_first_token_survives_with_context():
    def strip_first(ids: list[int]) -> str:  # SentencePiece-like: the first token's leading space goes
        return _bytes_decode(ids).removeprefix(" ")

    detokenizer = IncrementalDetokenizer(strip_first, context_ids=[97])
    assert detokenizer.push([32, 98]) == " b"


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    text=st.text(alphabet="abc d", max_size=30),
    stops=st.lists(st.text(alphabet="abcd", min_size=1, max_size=3), max_size=3),
    cuts=st.lists(st.integers(0, 200), max_size=8),
)
def test_stop_strings_cut_at_the_first_match_however_the_text_arrives(text, stops, cuts):
    matcher = StopStringMatcher(stops)
    out = "".join(matcher.feed("".join(part)) for part in _split(list(text), cuts)) + matcher.flush()
    # the stop string complete first (smallest end) cuts the text where it starts
    ends = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    assert out == (text[: min(ends)[1]] if ends else text)
    assert matcher.stopped == bool(ends)


def test_the_stop_string_complete_first_wins_over_one_that_starts_earlier():
    matcher = StopStringMatcher(["d", "ada"])
    assert matcher.feed("ada") == "a" and matcher.stopped


def test_one_prompt_per_request():
    assert CompletionBody(prompt=[[1, 2]]).single_prompt() == [1, 2]
    assert CompletionBody(prompt=["a"]).single_prompt() == "a"
    try:
        CompletionBody(prompt=["a", "b"]).single_prompt()
    except ProtocolError as error:
        assert error.param == "prompt" and error.status == 400
    else:
        raise AssertionError("two prompts were accepted")
