"""Writing files so that a crash never leaves half of one under its real name, and reading their digests."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def write_atomically(path: str | Path, chunks: Iterable[str] | str) -> str:
    """Write `chunks` (text) to a fresh temporary file beside `path`, flush it to disk and rename it over `path`:
    readers see the old file or the whole new one, never a part. The temporary name is unique, so no other file is
    touched. Returns the SHA-256 of what was written (UTF-8)."""
    path = Path(path)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for chunk in [chunks] if isinstance(chunks, str) else chunks:
                digest.update(chunk.encode("utf-8"))
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return digest.hexdigest()


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
