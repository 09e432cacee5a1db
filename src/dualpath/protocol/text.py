"""Generated tokens to streamed text: incremental detokenization and stop strings, tokenizer-agnostic.

Both work on any `decode(ids) -> str`, so a front end needs only the served model's tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_INCOMPLETE = "\ufffd"  # what a decoder makes of a character whose bytes have not all arrived yet
_CONTEXT_TOKENS = 6  # prompt tokens decoded before the first generated one (leading-space rules)


class IncrementalDetokenizer:
    """Text deltas from token deltas; a character split across tokens is held until it is whole.

    NOTE: each step decodes a short window `ids[prefix:]` and returns what it adds to `ids[prefix:read]`
    (vLLM's scheme). The window starts on earlier tokens, so a tokenizer that drops the leading space of the
    first decoded token (SentencePiece) still gives that space to a later token; a decode ending in U+FFFD is
    an incomplete character and waits for the next token (until `flush`).
    """

    def __init__(self, decode: Callable[[list[int]], str], context_ids: Sequence[int] = ()) -> None:
        self._decode = decode
        self.ids = list(context_ids[-_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self.ids)

    def push(self, token_ids: Sequence[int]) -> str:
        self.ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """What is left, incomplete characters included (the stream ended)."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self._read == len(self.ids):
            return ""
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) <= len(before) and not final:
            return ""
        if after.endswith(_INCOMPLETE) and not final:
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before) :]


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the text is cut: the start of the stop string that is complete first (the smallest end; on a
    tie the earliest start), as generation would meet it token by token; None without one."""
    found = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    return min(found)[1] if found else None


class StopStringMatcher:
    """Cuts the text at the first stop string; holds back a tail that may be the start of one.

    A stop string can span several deltas, so the longest suffix of the text that is a proper prefix of a
    stop string is not emitted until the next delta decides it. Which stop string ends the text does not
    depend on how the text arrived (`first_stop`).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        """The text safe to emit; sets `stopped` when a stop string appeared (it and the rest are cut)."""
        if self.stopped:
            return ""
        text = self._held + delta
        cut = first_stop(text, self.stops)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = self._partial_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix(self, text: str) -> int:
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
