"""One simulator run of a sweep, as the argument list of `dualpath simulate`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """Everything that identifies one `dualpath simulate` run; its hash names the cached result file."""

    model: str
    p: int
    d: int
    mode: str
    dataset: str = "64k"
    agents: int = 256
    aps: float | None = None  # None: offline (all agents start at once)
    duration_s: float | None = None  # online runs only
    hardware: str = "hopper-8x400g"
    read_path: str | None = None
    overrides: tuple[str, ...] = field(default_factory=tuple)  # `--set key=value` items
    seed: int = 1
    # Online sweeps: stop a run once it is clearly past this TTFT SLO (sim/early_stop.py); None: run it all.
    early_stop_ttft_s: float | None = None
    # Stop a run once its TTFT p90 is certain to exceed this (sim/early_stop.py, a proof); None: off.
    early_stop_p90_ttft_s: float | None = None
    # Record every link for the result's `link_utilisation` (`simulate --link-summary`).
    link_summary: bool = False

    def argv(self) -> list[str]:
        args = [
            "simulate",
            "--hardware",
            self.hardware,
            "--model",
            self.model,
            "--p",
            str(self.p),
            "--d",
            str(self.d),
            "--dataset",
            self.dataset,
            "--agents",
            str(self.agents),
            "--mode",
            self.mode,
            "--seed",
            str(self.seed),
            "--json",
            "--quiet",
        ]
        if self.aps is not None:
            args += ["--aps", f"{self.aps:g}"]
        if self.duration_s is not None:
            args += ["--duration", f"{self.duration_s:g}"]
        if self.read_path:
            args += ["--read-path", self.read_path]
        for item in self.overrides:
            args += ["--set", item]
        if self.early_stop_ttft_s is not None:
            args += ["--early-stop-ttft-s", f"{self.early_stop_ttft_s:g}"]
        if self.early_stop_p90_ttft_s is not None:
            args += ["--early-stop-p90-ttft-s", f"{self.early_stop_p90_ttft_s:g}"]
        if self.link_summary:
            args.append("--link-summary")
        return args

    def key(self) -> str:
        fields = asdict(self)
        for name in ("early_stop_ttft_s", "early_stop_p90_ttft_s", "link_summary"):
            if fields[name] in (None, False):
                del fields[name]  # runs without it keep the keys they were cached under
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.blake2b(blob, digest_size=8).hexdigest()

    def label(self) -> str:
        load = f"{self.aps:g} APS" if self.aps is not None else f"{self.agents} agents"
        extra = f" {self.read_path}" if self.read_path else ""
        sets = f" [{', '.join(self.overrides)}]" if self.overrides else ""
        return f"{self.model} {self.p}P{self.d}D {self.dataset} {load} {self.mode}{extra}{sets}"
