"""The paper's headline claims, with where they are stated, to print beside our numbers.

Source: DualPath (arXiv 2602.21548) as summarised in the project's paper notes, §11 "Headline claims".
These are comparison points only; no simulator parameter is derived from them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Claim:
    key: str
    text: str
    paper_value: float
    source: str


CLAIMS = (
    Claim(
        key="offline_speedup_ds660b",
        text="Offline JCT speedup over Basic, DS 660B 2P4D 64K",
        paper_value=1.87,
        source="§7.3, Fig. 7",
    ),
    Claim(
        key="offline_speedup_ds27b",
        text="Offline JCT speedup over Basic, DS 27B 1P1D",
        paper_value=1.78,
        source="§7.3, Fig. 7",
    ),
    Claim(
        key="online_capacity_ds660b",
        text="Online APS capacity within SLO vs Basic, DS 660B 2P4D",
        paper_value=2.25,
        source="§7.4, Fig. 10",
    ),
    Claim(
        key="online_capacity_ds27b",
        text="Online APS capacity within SLO vs Basic, DS 27B 1P1D",
        paper_value=1.67,
        source="§7.4, Fig. 10",
    ),
    Claim(
        key="scale_offline_jct_ratio",
        text="48P96D/48K agents JCT ÷ 2P4D/2K agents JCT (1.0 = linear)",
        paper_value=1.0,
        source="§7.6, Table 3",
    ),
)

CLAIMS_BY_KEY = {claim.key: claim for claim in CLAIMS}
