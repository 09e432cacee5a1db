"""KV-cache store library: block keys, Full/Layer Block layout, prefix index, stores (docs/kvcache.md).

Independent of the DualPath engine (DESIGN §4) and free of torch: data is any bytes-like buffer.
"""

from dualpath.kvcache.file_store import FileStore
from dualpath.kvcache.index import BlockMeta, LruEviction, PrefixIndex
from dualpath.kvcache.keys import KEY_BYTES, ROOT_KEY, BlockKey, block_keys, key_from_hex, key_hex
from dualpath.kvcache.layout import BlockLayout
from dualpath.kvcache.memory_store import MemoryStore
from dualpath.kvcache.store import BlockMissingError, CorruptBlockError, KVStore, StoreStats

__all__ = [
    "KEY_BYTES",
    "ROOT_KEY",
    "BlockKey",
    "BlockLayout",
    "BlockMeta",
    "BlockMissingError",
    "CorruptBlockError",
    "FileStore",
    "KVStore",
    "LruEviction",
    "MemoryStore",
    "PrefixIndex",
    "StoreStats",
    "block_keys",
    "key_from_hex",
    "key_hex",
]
