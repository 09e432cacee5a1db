"""The bottleneck-free P/D range (paper §4.2, eq. 9), derived from each link's traffic.

Each link's load is k0 + k1·r + k2/r with r = P/D (`dualpath.plan.traffic`). Requiring load ≤ C
gives, per link, an interval of r:

    k1 = k2 = 0   constant: all r if k0 ≤ C, else none           (eq. 1: s ≤ g/2)
    k2 = 0        r ≤ (C - k0)/k1                                 (eq. 5, 7, 8)
    k1 = 0        r ≥ k2/(C - k0)                                 (eq. 3)
    both          k1·r² - (C - k0)·r + k2 ≤ 0: between the roots

The range is the intersection; the binding constraints are the links whose own bound equals it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dualpath.config.specs import HardwareSpec
from dualpath.plan.traffic import LinkLoad, link_loads


@dataclass(frozen=True, kw_only=True)
class LinkBound:
    link: LinkLoad
    pd_ratio_min: Fraction  # 0 when unbounded below
    pd_ratio_max: Fraction | None  # None when unbounded above
    feasible: bool  # False when no r satisfies this link


@dataclass(frozen=True, kw_only=True)
class PdRange:
    """s/(g−s) ≤ P/D ≤ min{...} in general form, with the links that set each end."""

    pd_ratio_min: Fraction
    pd_ratio_max: Fraction | None
    binding_lower: tuple[str, ...]  # link labels, e.g. ("PE CNIC write",)
    binding_upper: tuple[str, ...]  # e.g. ("DE CNIC write", "DE DRAM")
    infeasible_links: tuple[str, ...]
    bounds: tuple[LinkBound, ...]

    @property
    def is_empty(self) -> bool:
        too_narrow = self.pd_ratio_max is not None and self.pd_ratio_max < self.pd_ratio_min
        return bool(self.infeasible_links) or too_narrow

    def contains(self, num_prefill_nodes: int, num_decode_nodes: int) -> bool:
        r = Fraction(num_prefill_nodes, num_decode_nodes)
        upper_ok = self.pd_ratio_max is None or r <= self.pd_ratio_max
        return not self.is_empty and self.pd_ratio_min <= r and upper_ok


def pd_range(hw: HardwareSpec) -> PdRange:
    bounds = tuple(link_bound(load) for load in link_loads(hw))
    lower = max(b.pd_ratio_min for b in bounds)
    finite_uppers = [b.pd_ratio_max for b in bounds if b.pd_ratio_max is not None]
    upper = min(finite_uppers) if finite_uppers else None
    return PdRange(
        pd_ratio_min=lower,
        pd_ratio_max=upper,
        binding_lower=tuple(b.link.label for b in bounds if lower > 0 and b.pd_ratio_min == lower),
        binding_upper=tuple(b.link.label for b in bounds if upper is not None and b.pd_ratio_max == upper),
        infeasible_links=tuple(b.link.label for b in bounds if not b.feasible),
        bounds=bounds,
    )


def link_bound(load: LinkLoad) -> LinkBound:
    """The interval of r = P/D on which this link stays within capacity."""
    headroom = load.capacity_bytes_per_s - load.constant_bytes_per_s
    k1, k2 = load.per_pd_ratio_bytes_per_s, load.per_dp_ratio_bytes_per_s
    if headroom < 0 or (headroom == 0 and (k1 > 0 or k2 > 0)):
        return LinkBound(link=load, pd_ratio_min=Fraction(0), pd_ratio_max=None, feasible=False)
    if k1 == 0 and k2 == 0:
        return LinkBound(link=load, pd_ratio_min=Fraction(0), pd_ratio_max=None, feasible=True)
    if k2 == 0:
        return LinkBound(link=load, pd_ratio_min=Fraction(0), pd_ratio_max=headroom / k1, feasible=True)
    if k1 == 0:
        return LinkBound(link=load, pd_ratio_min=k2 / headroom, pd_ratio_max=None, feasible=True)
    return _quadratic_bound(load, headroom, k1, k2)


def _quadratic_bound(load: LinkLoad, headroom: Fraction, k1: Fraction, k2: Fraction) -> LinkBound:
    # k1·r² − headroom·r + k2 ≤ 0; roots are irrational in general, so this one case is in floats.
    disc = float(headroom) ** 2 - 4 * float(k1) * float(k2)
    if disc < 0:
        return LinkBound(link=load, pd_ratio_min=Fraction(0), pd_ratio_max=None, feasible=False)
    low = (float(headroom) - math.sqrt(disc)) / (2 * float(k1))
    high = (float(headroom) + math.sqrt(disc)) / (2 * float(k1))
    return LinkBound(link=load, pd_ratio_min=Fraction(low), pd_ratio_max=Fraction(high), feasible=True)
