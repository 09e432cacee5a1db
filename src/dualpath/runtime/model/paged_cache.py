"""`PagedKVCache`: the device KV pool of an engine, in pages that are Full Blocks.

    pages  [num_pages, layers, block_tokens, kv_row_elems]   (model dtype, on the device)
    page p             = one Full Block  [layers, tokens, bytes]   contiguous
    page p, layer l    = one Layer Block [1,      tokens, bytes]   contiguous

So a Full Block read from storage, or a Layer Block arriving from a peer, is copied into a page as is,
and a page that fills during decode is persisted as is (paper §4.1: no layout conversion anywhere).
A sequence owns a block table (page ids in token order); token t of a sequence lives in page
`table[t // block_tokens]`, slot `t % block_tokens`. Free capacity in tokens is the DE's "free HBM"
that the scheduler packs against (§6.2).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from dualpath.runtime.model.config import TransformerConfig
from dualpath.runtime.model.kv_layout import LayerKV


@dataclass(kw_only=True)
class _SequencePages:
    num_tokens: int = 0
    pages: list[int] = field(default_factory=list)


class PagedKVCache:
    """Fixed-size pages of `block_tokens` tokens, allocated per sequence.

    Free pages sit in a min-heap rather than a stack so that allocation order (and so every page id)
    depends only on the sequence of calls, never on the order frees happened to come in: the same run
    gives the same block tables.
    """

    def __init__(self, config: TransformerConfig, *, num_pages: int, block_tokens: int) -> None:
        if num_pages <= 0 or block_tokens <= 0:
            raise ValueError(f"num_pages and block_tokens must be > 0, got {num_pages}, {block_tokens}")
        self.config = config
        self.block_tokens = block_tokens
        self.pages = torch.zeros(
            (num_pages, config.num_layers, block_tokens, config.kv_row_elems),
            dtype=config.torch_dtype,
            device=config.device,
        )
        self._free_pages = list(range(num_pages))  # already a valid heap
        self._sequences: dict[Hashable, _SequencePages] = {}

    @classmethod
    def for_memory(cls, config: TransformerConfig, *, memory_bytes: float, block_tokens: int) -> PagedKVCache:
        """As many pages as fit in `memory_bytes` of device memory."""
        page_bytes = config.num_layers * block_tokens * config.kv_bytes_per_token_per_layer
        return cls(config, num_pages=int(memory_bytes // page_bytes), block_tokens=block_tokens)

    # -- capacity ----------------------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        return self.pages.shape[0]

    @property
    def num_free_pages(self) -> int:
        return len(self._free_pages)

    @property
    def free_tokens(self) -> int:
        """Tokens that fit in free pages (slack inside partly filled pages is not counted)."""
        return self.num_free_pages * self.block_tokens

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.block_tokens

    @property
    def page_bytes(self) -> int:
        return self.config.num_layers * self.block_tokens * self.config.kv_bytes_per_token_per_layer

    def _pages_needed(self, seq_id: Hashable, num_tokens: int) -> int:
        sequence = self._sequences.get(seq_id, _SequencePages())
        total_pages = -(-(sequence.num_tokens + num_tokens) // self.block_tokens)
        return total_pages - len(sequence.pages)

    def can_allocate(self, seq_id: Hashable, num_tokens: int) -> bool:
        """Whether `seq_id` (new or existing) can grow by `num_tokens` tokens."""
        return self._pages_needed(seq_id, num_tokens) <= self.num_free_pages

    def allocate(self, seq_id: Hashable, num_tokens: int) -> int:
        """Grow `seq_id` by `num_tokens` slots; returns the position of the first new slot."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        needed = self._pages_needed(seq_id, num_tokens)
        if needed > self.num_free_pages:
            raise MemoryError(f"sequence {seq_id!r} needs {needed} pages, {self.num_free_pages} are free")
        sequence = self._sequences.setdefault(seq_id, _SequencePages())
        sequence.pages.extend(heapq.heappop(self._free_pages) for _ in range(needed))
        start = sequence.num_tokens
        sequence.num_tokens += num_tokens
        return start

    def free(self, seq_id: Hashable) -> None:
        for page in self._sequences.pop(seq_id).pages:
            heapq.heappush(self._free_pages, page)

    # -- contents ----------------------------------------------------------------------------------

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._sequences

    def num_tokens(self, seq_id: Hashable) -> int:
        return self._sequences[seq_id].num_tokens

    def block_table(self, seq_id: Hashable) -> tuple[int, ...]:
        return tuple(self._sequences[seq_id].pages)

    def write(self, seq_id: Hashable, layer: int, start_token: int, kv: LayerKV) -> None:
        """Write rows `kv[tokens, row]` at positions `start_token..` of an allocated sequence."""
        end_token = start_token + kv.shape[0]
        if start_token < 0 or end_token > self.num_tokens(seq_id):
            raise IndexError(f"tokens {start_token}..{end_token} outside allocated {self.num_tokens(seq_id)}")
        pages = self._sequences[seq_id].pages
        for page_index, lo, hi in self._spans(start_token, end_token):
            offset = page_index * self.block_tokens
            self.pages[pages[page_index], layer, lo - offset : hi - offset] = kv[
                lo - start_token : hi - start_token
            ]

    def append(self, seq_id: Hashable, layer_kvs: Sequence[LayerKV]) -> int:
        """Allocate and write new tokens for every layer at once; returns their first position."""
        start = self.allocate(seq_id, layer_kvs[0].shape[0])
        for layer, kv in enumerate(layer_kvs):
            self.write(seq_id, layer, start, kv)
        return start

    def read(self, seq_id: Hashable, layer: int, num_tokens: int | None = None) -> LayerKV:
        """A copy of the sequence's KV for one layer, positions `0..num_tokens-1`."""
        count = self.num_tokens(seq_id) if num_tokens is None else num_tokens
        pages = self._sequences[seq_id].pages[: -(-count // self.block_tokens)]
        index = torch.tensor(pages, dtype=torch.long, device=self.pages.device)
        return self.pages[index, layer].reshape(-1, self.config.kv_row_elems)[:count]

    def page_index(self, seq_id: Hashable) -> torch.Tensor:
        """The sequence's block table as an index tensor on the device (for `tiled_rows`)."""
        return torch.tensor(self._sequences[seq_id].pages, dtype=torch.long, device=self.pages.device)

    def tiled_rows(
        self, page_index: torch.Tensor, num_tokens: int, layer: int, new_rows: LayerKV, tile_tokens: int
    ) -> torch.Tensor:
        """One layer of a sequence as attention reads it: rows `0..num_tokens-1` from its pages, then
        `new_rows`, then zero rows up to a whole number of `tile_tokens` (`numerics.tiled_kv`'s layout),
        gathered page by page straight into that buffer (one copy). `page_index`: `page_index(seq_id)`."""
        total = num_tokens + new_rows.shape[0]
        out = torch.empty((-(-total // tile_tokens) * tile_tokens, self.config.kv_row_elems),
                          dtype=self.pages.dtype, device=self.pages.device)  # fmt: skip
        pages = -(-num_tokens // self.block_tokens)
        gathered = out[: pages * self.block_tokens].view(pages, self.block_tokens, -1)
        torch.index_select(self.pages[:, layer], 0, page_index[:pages], out=gathered)
        out[num_tokens:total] = new_rows
        out[total:] = 0
        return out

    def context(self, seq_id: Hashable) -> Sequence[LayerKV]:
        """A lazy per-layer view of the sequence's KV, for `Transformer.decode_step`."""
        return _Context(self, seq_id, self.num_tokens(seq_id))

    def full_block(self, seq_id: Hashable, block_index: int) -> torch.Tensor:
        """The page holding tokens `block_index * block_tokens ..`: `[layers, block_tokens, row]`, a view."""
        return self.pages[self._sequences[seq_id].pages[block_index]]

    def layer_block(self, seq_id: Hashable, block_index: int, layer: int) -> torch.Tensor:
        """One layer of that page: `[block_tokens, row]`, a contiguous view."""
        return self.full_block(seq_id, block_index)[layer]

    def _spans(self, start_token: int, end_token: int) -> Iterator[tuple[int, int, int]]:
        """(page index in the table, first token, end token) for each page the range touches."""
        token = start_token
        while token < end_token:
            page_index = token // self.block_tokens
            hi = min(end_token, (page_index + 1) * self.block_tokens)
            yield page_index, token, hi
            token = hi

    def check_invariants(self) -> None:
        """Every page is free or owned by exactly one sequence; no sequence holds a page it cannot use."""
        owned = [page for sequence in self._sequences.values() for page in sequence.pages]
        everything = owned + self._free_pages
        assert sorted(everything) == list(range(self.num_pages)), "a page is lost or held twice"
        assert _is_heap(self._free_pages), "free-page heap order broken"
        for seq_id, sequence in self._sequences.items():
            need = -(-sequence.num_tokens // self.block_tokens)
            assert len(sequence.pages) == need, (
                f"sequence {seq_id!r} holds {len(sequence.pages)} pages, needs {need}"
            )


class _Context(Sequence[LayerKV]):
    def __init__(self, cache: PagedKVCache, seq_id: Hashable, num_tokens: int) -> None:
        self._cache, self._seq_id, self._num_tokens = cache, seq_id, num_tokens

    def __len__(self) -> int:
        return self._cache.config.num_layers

    def __getitem__(self, layer: int) -> LayerKV:  # type: ignore[override]
        if not 0 <= layer < len(self):
            raise IndexError(layer)
        return self._cache.read(self._seq_id, layer, self._num_tokens)


def _is_heap(items: list[int]) -> bool:
    return all(items[(i - 1) // 2] <= items[i] for i in range(1, len(items)))
