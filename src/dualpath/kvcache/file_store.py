"""`FileStore`: one file per Full Block in a directory (local disk, or a 3FS / shared-FS mount).

File layout (little-endian)::

    offset 0   magic "DPKV" | version u16 | pad u16 | num_layers u32 | layer_block_bytes u64
               | key 16 B | parent 16 B | header crc32 u32                          (56 bytes)
    offset 56  crc32 of Layer Block 0 .. L-1, u32 each                             (4·L bytes)
    data_off   Layer Block 0 | Layer Block 1 | ... | Layer Block L-1               (L·LB bytes)

    data_off = 56 + 4·L; Layer Block l starts at data_off + l·LB, so reading it is one os.pread.

The header crc covers the 52 bytes before it and the crc table. Files live at `<dir>/<hex[:2]>/<hex>.kvb`
(a 256-way fan-out keeps directories small). Writes go to a temp file in the same directory, are fsynced,
then `os.replace`d into place and the directory fsynced: a crash leaves the old state or the new one,
never a torn block, at most a `.tmp` file that is ignored (and cleaned once stale).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import struct
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from dualpath.kvcache.index import BlockMeta, LruEviction
from dualpath.kvcache.keys import BlockKey, key_from_hex, key_hex
from dualpath.kvcache.store import BlockMissingError, CorruptBlockError, IndexedStore

MAGIC = b"DPKV"
VERSION = 1
_FIXED = struct.Struct("<4sHHIQ16s16s")  # fields before the header crc
_CRC = struct.Struct("<I")
HEADER_BYTES = _FIXED.size + _CRC.size
SUFFIX = ".kvb"
TMP_SUFFIX = ".tmp"
_NOT_BLOCKS = ("lost+found",)  # found at the root of a mounted file system: skipped without a word
_SKIPPED_SHOWN = 5
_log = logging.getLogger(__name__)


def data_offset_bytes(num_layers: int) -> int:
    return HEADER_BYTES + _CRC.size * num_layers


def encode_header(meta: BlockMeta) -> bytes:
    fixed = _FIXED.pack(MAGIC, VERSION, 0, meta.num_layers, meta.layer_block_bytes, meta.key, meta.parent)
    table = struct.pack(f"<{meta.num_layers}I", *meta.layer_crc32s)
    return fixed + _CRC.pack(zlib.crc32(table, zlib.crc32(fixed))) + table


def decode_header(key: BlockKey, head: bytes, read_table: Callable[[int], bytes]) -> BlockMeta:
    """Parse a header; `read_table(num_layers)` returns the crc table bytes. Raises CorruptBlockError."""
    if len(head) < HEADER_BYTES:
        raise CorruptBlockError(key, "short header")
    magic, version, _, num_layers, layer_bytes, file_key, parent = _FIXED.unpack_from(head)
    if magic != MAGIC or version != VERSION or file_key != key or num_layers <= 0:
        raise CorruptBlockError(key, "bad magic, version, key or layer count")
    table = read_table(num_layers)
    (header_crc,) = _CRC.unpack_from(head, _FIXED.size)
    if (
        len(table) != _CRC.size * num_layers
        or zlib.crc32(table, zlib.crc32(head[: _FIXED.size])) != header_crc
    ):
        raise CorruptBlockError(key, "header checksum mismatch")
    crcs = struct.unpack(f"<{num_layers}I", table)
    return BlockMeta(
        key=key, parent=parent, num_layers=num_layers, layer_block_bytes=layer_bytes, layer_crc32s=crcs
    )


class FileStore(IndexedStore):
    def __init__(
        self,
        directory: str | os.PathLike[str],
        capacity_bytes: int,
        *,
        stale_tmp_s: float = 60.0,
        eviction: LruEviction | None = None,
    ) -> None:
        super().__init__(capacity_bytes, eviction)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._rebuild(stale_tmp_s)

    def path_of(self, key: BlockKey) -> Path:
        name = key_hex(key)
        return self.directory / name[:2] / (name + SUFFIX)

    # ---- start-up ---------------------------------------------------------------------------
    def _rebuild(self, stale_tmp_s: float) -> None:
        """Index every block on disk, oldest first (so LRU order survives a restart); drop torn temp files
        and blocks whose header is unreadable. Anything else in the folder (a name that is not a block
        key, a directory or symlink named like a block, a block in the wrong fan-out folder) is not
        ours to delete: it is skipped, with one warning naming a few of them."""
        now = time.time()
        found: list[tuple[float, str, BlockKey]] = []
        skipped: list[str] = []
        for sub in sorted(self.directory.iterdir()):
            if not (len(sub.name) == 2 and sub.is_dir() and not sub.is_symlink()):
                if sub.name not in _NOT_BLOCKS:
                    skipped.append(sub.name)
                continue
            for path in sorted(sub.iterdir()):
                entry = _block_entry(path, sub.name, now, stale_tmp_s)
                if isinstance(entry, str):
                    skipped += [f"{sub.name}/{path.name}"] if entry else []
                else:
                    found.append(entry)
        if skipped:
            shown = ", ".join(skipped[:_SKIPPED_SHOWN]) + (", ..." if len(skipped) > _SKIPPED_SHOWN else "")
            _log.warning("KV store %s: skipped %d entries that are not blocks: %s", self.directory,
                         len(skipped), shown)  # fmt: skip
        with self._lock:
            for _, _, key in sorted(found):
                try:
                    meta = self._probe(key)
                except CorruptBlockError:
                    self._counts["corrupt_blocks"] += 1
                    self._drop(key)
                    continue
                if meta is not None and key not in self._index:
                    self._index.insert(meta)
            self._evict_until_fits(keep=b"")

    # ---- hooks ------------------------------------------------------------------------------
    def _probe(self, key: BlockKey) -> BlockMeta | None:
        try:
            fd = os.open(self.path_of(key), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as error:
            if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):  # ELOOP: a symlink, not ours
                return None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory named like a block
                return None
            head = os.pread(fd, HEADER_BYTES, 0)
            return decode_header(key, head, lambda n: os.pread(fd, _CRC.size * n, HEADER_BYTES))
        finally:
            os.close(fd)

    def _present(self, key: BlockKey) -> bool:
        return self.path_of(key).is_file()

    def _write(self, key: BlockKey, parent: BlockKey, num_layers: int, data: memoryview) -> BlockMeta:
        layer_bytes = data.nbytes // num_layers
        crcs = tuple(zlib.crc32(data[i * layer_bytes : (i + 1) * layer_bytes]) for i in range(num_layers))
        meta = BlockMeta(
            key=key, parent=parent, num_layers=num_layers, layer_block_bytes=layer_bytes, layer_crc32s=crcs
        )
        path = self.path_of(key)
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".", suffix=TMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(encode_header(meta))
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)
        return meta

    def _read_into(self, meta: BlockMeta, first_layer: int, num_layers: int, out: memoryview) -> None:
        offset = data_offset_bytes(meta.num_layers) + first_layer * meta.layer_block_bytes
        try:
            fd = os.open(self.path_of(meta.key), os.O_RDONLY)
        except FileNotFoundError:
            raise BlockMissingError(key_hex(meta.key)) from None
        except OSError as error:  # unreadable (EIO, EACCES, a directory): as good as corrupt, recomputed
            raise CorruptBlockError(meta.key, f"unreadable: {error.strerror}") from None
        try:
            got = os.preadv(fd, [out], offset)  # one positional read straight into the caller's buffer
        except OSError as error:
            raise CorruptBlockError(meta.key, f"unreadable: {error.strerror}") from None
        finally:
            os.close(fd)
        if got != out.nbytes:
            raise CorruptBlockError(meta.key, f"short read: {got} of {out.nbytes} bytes")
        lb = meta.layer_block_bytes
        for i in range(num_layers):
            if zlib.crc32(out[i * lb : (i + 1) * lb]) != meta.layer_crc32s[first_layer + i]:
                raise CorruptBlockError(meta.key, f"layer {first_layer + i} checksum mismatch")

    def _drop(self, key: BlockKey) -> None:
        try:
            self.path_of(key).unlink(missing_ok=True)
        except OSError as error:  # not ours to remove (a directory, no permission): it stays unindexed
            _log.warning("KV store %s: cannot remove block %s: %s", self.directory, key_hex(key), error)


def _block_entry(path: Path, sub: str, now: float, stale_tmp_s: float) -> tuple[float, str, BlockKey] | str:
    """(mtime, name, key) of a block file; else "" for a temp file (removed once stale) or the reason
    to skip it, non-empty."""
    try:
        info = path.lstat()
        if path.name.endswith(TMP_SUFFIX):
            if stat.S_ISREG(info.st_mode) and now - info.st_mtime >= stale_tmp_s:
                path.unlink(missing_ok=True)
            return ""
        key = key_from_hex(path.name.removesuffix(SUFFIX)) if path.name.endswith(SUFFIX) else None
    except FileNotFoundError:  # removed meanwhile (another process cleaned it)
        return ""
    except (OSError, ValueError) as error:
        return str(error) or "unreadable"
    if (
        key is None
        or not stat.S_ISREG(info.st_mode)
        or path.name != key_hex(key) + SUFFIX
        or path.name[:2] != sub
    ):
        return "not a block"  # (also a block in the wrong fan-out folder, or with upper-case hex)
    return info.st_mtime, path.name, key


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
