"""Full Block and Layer Block layout (paper §4.1, Appendix A.5).

    Full Block  [layers, tokens, bytes]           bytes = KV bytes per token per layer
    +----------------+----------------+-----+------------------+
    | Layer Block 0  | Layer Block 1  | ... | Layer Block L-1  |
    +----------------+----------------+-----+------------------+
    0                LB               2·LB                     L·LB      (LB = tokens × bytes)

    Layer Block [1, tokens, bytes] = the contiguous bytes [l·LB, (l+1)·LB) of its Full Block.

Storage holds Full Blocks; layerwise transfers move Layer Blocks. Because a Layer Block is a slice of its
Full Block, no layout conversion exists anywhere: a read of layer l is one positional read at l·LB.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class BlockLayout:
    num_layers: int
    block_tokens: int
    bytes_per_token_per_layer: int

    def __post_init__(self) -> None:
        for name in ("num_layers", "block_tokens", "bytes_per_token_per_layer"):
            if getattr(self, name) <= 0:
                raise ValueError(f"BlockLayout.{name} must be positive, got {getattr(self, name)}")

    @property
    def layer_block_bytes(self) -> int:
        return self.block_tokens * self.bytes_per_token_per_layer

    @property
    def full_block_bytes(self) -> int:
        return self.num_layers * self.layer_block_bytes

    def layer_offset_bytes(self, layer: int) -> int:
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} outside [0, {self.num_layers})")
        return layer * self.layer_block_bytes

    def layer_slice(self, layer: int) -> slice:
        start = self.layer_offset_bytes(layer)
        return slice(start, start + self.layer_block_bytes)
