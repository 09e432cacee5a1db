"""Early stop of an online run that is clearly past its TTFT SLO (off unless `SimConfig.early_stop`).

NOTE: the rule. After every first token, with W = the last `window_first_tokens` first tokens:

    stop when  mean TTFT over W  >  factor × ttft_slo_s   and   mean TTFT of all first tokens so far > ttft_slo_s

A saturated online run (arrivals faster than the cluster serves them) only grows its queue, so its TTFT
climbs until the run's end; it may take an hour of simulated time to get there. Stopping changes no
decision before the stop, only what is measured after it: the run's summary covers the first tokens up
to the stop and says `stopped_early: true` with the reason, and `experiments` counts it as not within
the SLO. Why that verdict is the run's own: at the stop the mean TTFT of everything measured so far is
already above the SLO (second condition), so the stopped run *as reported* fails on its own numbers;
and for the full-length run to pass instead, the requests after the stop would have to average under
the SLO by enough to pull the whole mean back below it, while the latest `window` of them are already
above `factor ×` the SLO and queueing delay only grows while the queue does. That is an argument, not
a proof: a load that stops arriving (an online run's agents all done) could drain the queue. The
reproduce sweeps run agents arriving for the whole duration, and tests/sim/test_early_stop.py checks
that a run within the SLO never stops. A run that misses only the TPOT SLO is never stopped.

NOTE: a verdict that cannot change (`SimConfig.stop_p90_ttft_s`, `TtftP90Watch`). The summary's TTFT p90
is numpy's linear percentile over the N first tokens of the run: with them sorted x_0 <= ... <= x_{N-1}
and j = floor(0.9 (N - 1)), p90 = x_j + f (x_{j+1} - x_j) >= x_j, so p90 > T as soon as at least N - j of
them exceed T. N - floor(0.9 (N - 1)) never falls as N grows, every round yields at most one first token,
and a TTFT once measured never changes; so with M = the rounds that can arrive before the run's end, once
M - floor(0.9 (M - 1)) first tokens are over T, the full run's p90 is over T whatever comes later: it
misses a TTFT p90 <= T target for certain, and the run stops there. (The watch asks for one first token
more, in case numpy's float index lands just under an integer.) Unlike the rule above this is a proof,
not an argument. The opposite verdict (within the target) can change until the last first token.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class EarlyStop:
    """When an online run stops early (module NOTE)."""

    ttft_slo_s: float = 4.0  # the paper's TTFT SLO (§7.4)
    factor: float = 2.0  # the recent mean must exceed factor × SLO: far past it, not at its edge
    window_first_tokens: int = 256  # recent = this many latest first tokens (noise of single requests)

    def __post_init__(self) -> None:
        if self.ttft_slo_s <= 0 or self.factor < 1.0 or self.window_first_tokens < 1:
            raise ValueError("early stop needs ttft_slo_s > 0, factor >= 1 and window_first_tokens >= 1")


class EarlyStopWatch:
    """Feeds on each first token's TTFT; says why to stop once the rule holds (None until then)."""

    __slots__ = ("rule", "_window", "_window_sum_s", "_count", "_total_s")

    def __init__(self, rule: EarlyStop) -> None:
        self.rule = rule
        self._window: deque[float] = deque()
        self._window_sum_s = 0.0
        self._count = 0
        self._total_s = 0.0

    def first_token(self, ttft_s: float, now_s: float) -> str | None:
        rule, window = self.rule, self._window
        window.append(ttft_s)
        self._count += 1
        self._total_s += ttft_s
        if len(window) > rule.window_first_tokens:
            window.popleft()
        elif len(window) < rule.window_first_tokens:
            return None
        recent_s = sum(window) / len(window)  # exact each time (no drift of a running sum)
        overall_s = self._total_s / self._count
        if recent_s <= rule.factor * rule.ttft_slo_s or overall_s <= rule.ttft_slo_s:
            return None
        return (
            f"at {now_s:.0f} s: mean TTFT of the last {len(window)} first tokens {recent_s:.1f} s > "
            f"{rule.factor:g} x the {rule.ttft_slo_s:g} s SLO, mean of all {self._count} so far {overall_s:.1f} s"
        )


class TtftP90Watch:
    """Feeds on each first token's TTFT; says why to stop once the run's TTFT p90 is certain to exceed
    `target_s` (module NOTE), given that at most `max_first_tokens` first tokens can come (None until then)."""

    __slots__ = ("target_s", "max_first_tokens", "needed", "over")

    def __init__(self, target_s: float, max_first_tokens: int) -> None:
        if target_s <= 0 or max_first_tokens < 1:
            raise ValueError("the TTFT p90 watch needs target_s > 0 and max_first_tokens >= 1")
        self.target_s = target_s
        self.max_first_tokens = max_first_tokens
        # First tokens over the target that settle it (module NOTE), one more for the float index.
        self.needed = max_first_tokens - math.floor(0.9 * (max_first_tokens - 1)) + 1
        self.over = 0

    def first_token(self, ttft_s: float, now_s: float) -> str | None:
        if ttft_s <= self.target_s:
            return None
        self.over += 1
        if self.over < self.needed:
            return None
        return (
            f"at {now_s:.0f} s: TTFT p90 certainly > {self.target_s:g} s ({self.over} first tokens over it, "
            f"of at most {self.max_first_tokens} in the run)"
        )
