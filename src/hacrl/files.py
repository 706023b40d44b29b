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
        # mkstemp's file is 0600: give it the mode of the file it replaces, or what open() would (0666 & ~umask)
        os.fchmod(fd, path.stat().st_mode & 0o7777 if path.is_file() else default_mode(0o666))
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


def default_mode(mode: int) -> int:
    """`mode` less this process's umask: what open() / mkdir() would give a new file or directory (mkstemp and
    mkdtemp give 0600 / 0700, private to the writer; a file under its final name must be readable as usual). The
    umask is read from /proc (Linux): setting it to read it would, for an instant, unmask the files other threads
    create (the trainer has some)."""
    try:
        with open("/proc/self/status") as f:
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0)
        os.umask(umask)
    return mode & ~umask


def private_dir_beside(path: str | Path) -> Path:
    """A new, empty directory next to `path` with a name no one else has (`.<name>.tmp-<random>`), to write into
    and rename to `path` once whole; its mode is a new directory's (0777 & ~umask), not mkdtemp's 0700."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    os.chmod(tmp, default_mode(0o777))
    return tmp


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
