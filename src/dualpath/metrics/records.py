"""Per-request records, emitted alike by the simulator, the runtime and the load generator (DESIGN §4).

Times are seconds on the driver's clock (virtual or wall); ``None`` where a stage did not happen or is
unknown. Derived latencies are properties, never stored twice (STYLE habit 3)::

    arrival  scheduled  read_start  read_end  prefill_start  prefill_end  first  second  ...  last
       |<----------------------- ttft_s ------------------------------------->|
                                                                               |<ttst>|
                                                                               |<-- tpot_s × (n-1) -->|
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

ReadSide = Literal["pe", "de", "none", "split"]
READ_SIDES = ("pe", "de", "none", "split")


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    request_id: int | str
    trajectory_id: int | None
    round_index: int | None
    prompt_tokens: int
    hit_tokens: int
    generated_tokens: int
    arrival_s: float
    scheduled_s: float | None = None
    read_start_s: float | None = None
    read_end_s: float | None = None
    prefill_start_s: float | None = None
    prefill_end_s: float | None = None
    first_token_s: float | None = None
    second_token_s: float | None = None
    last_token_s: float | None = None
    read_side: ReadSide = "none"
    pe_id: int | None = None
    de_id: int | None = None

    def __post_init__(self) -> None:
        if self.read_side not in READ_SIDES:
            raise ValueError(f"read_side must be one of {READ_SIDES}, got {self.read_side!r}")
        if not 0 <= self.hit_tokens <= self.prompt_tokens:
            raise ValueError(f"hit_tokens {self.hit_tokens} outside [0, prompt_tokens={self.prompt_tokens}]")

    @property
    def miss_tokens(self) -> int:
        return self.prompt_tokens - self.hit_tokens

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def ttst_s(self) -> float | None:
        """Second-token time minus first-token time (paper §7.2: TTST)."""
        if self.first_token_s is None or self.second_token_s is None:
            return None
        return self.second_token_s - self.first_token_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first: (last - first) / (n - 1)."""
        if self.first_token_s is None or self.last_token_s is None or self.generated_tokens < 2:
            return None
        return (self.last_token_s - self.first_token_s) / (self.generated_tokens - 1)

    @property
    def finished(self) -> bool:
        return self.last_token_s is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
