"""Reading users' text files defensively: compression detected by content, UTF-8 checked.

A trace, a bench log or a config may arrive gzip-, bzip2-, xz- or zstd-compressed whatever its
name says, and in any encoding; `read_text` sniffs the compression from the first bytes (the
file name is not trusted: a `.jsonl` may be gzip and a `.gz` may be plain), decompresses, and
decodes UTF-8 (a BOM is dropped). Anything else is a one-line error naming the file and what is
wrong with it, never a traceback.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from pathlib import Path

from sim.core.errors import DataError, PipeSimError

MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"))
ALLOWED = "UTF-8 text, plain or gzip/bzip2/xz compressed"


def compression(head: bytes) -> str | None:
    """The compression whose magic number `head` starts with, or None for plain bytes."""
    for magic, name in MAGIC:
        if head.startswith(magic):
            return name
    return None


def read_bytes(path: str | Path, error: type[PipeSimError] = DataError) -> bytes:
    """The file's bytes, decompressed when its content is compressed."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise error(f"{path}: is a folder, not a file") from None
    kind = compression(raw[:8])
    if kind is None:
        return raw
    if kind == "zstd":
        raise error(f"{path}: zstd-compressed; allowed: {ALLOWED} (decompress it with `zstd -d` first)")
    opener = {"gzip": gzip.decompress, "bzip2": bz2.decompress, "xz": lzma.decompress}[kind]
    try:
        return opener(raw)
    except (OSError, EOFError, lzma.LZMAError, ValueError, zlib.error) as exc:  # (zlib.error: a damaged gzip stream)
        raise error(f"{path}: a damaged or cut {kind} file ({' '.join(str(exc).split()) or type(exc).__name__})") from None


def read_text(path: str | Path, error: type[PipeSimError] = DataError) -> str:
    """The file as text (see the module docstring)."""
    data = read_bytes(path, error)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                    f"allowed: {ALLOWED}") from None
    if "\x00" in text:
        raise error(f"{path}: a binary file (it holds NUL bytes); allowed: {ALLOWED}")
    return text[1:] if text.startswith("\ufeff") else text


def text_stream(path: str | Path, error: type[PipeSimError] = DataError) -> io.StringIO:
    """`read_text` as a file object, for readers that take one (csv, pandas)."""
    return io.StringIO(read_text(path, error))
