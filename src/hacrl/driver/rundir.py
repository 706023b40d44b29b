"""The run directory: one writer at a time, and a metrics log that survives being cut off.

1. `RunLock`: `RUN_DIR/.hacrl.lock` holds the owner's pid, host, start time and command, and an exclusive `flock`
   on it is held for the whole run. The kernel drops the flock when its process dies, even by `kill -9`, so a lock
   file whose flock can be taken is stale: it is taken over with a notice. A second process on the same directory
   finds the flock held and refuses at once, naming the owner. (On network file systems without working `flock`
   the pid/host check is all there is.)
2. `claim_run_dir`: hacrl writes only into an empty (or new) directory or one of its own runs, which it marks with
   `RUN_DIR/.hacrl-run` when it first claims it. A non-empty directory without the mark is refused before anything
   is written, read or deleted there (a user's files would otherwise be overwritten: config.yaml, eval records),
   whatever files it holds: files named like hacrl's (a user's own config.yaml and metrics.jsonl) do not make it a
   run. A start that fails after the claim takes it back (`Claim.undo`): nothing stays behind.
3. `trim_metrics`: on resume, `metrics.jsonl` keeps the lines up to the checkpoint's step; a last line cut off by a
   crash is dropped with a notice; a damaged line anywhere else stops the run, naming the file and line.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hacrl.errors import RunDirError, clip

LOCK_NAME = ".hacrl.lock"
RUN_MARKER = ".hacrl-run"
"""Present in every directory hacrl has claimed as a run directory."""


class Claim:
    """What `claim_run_dir` created, so that a start that fails can take it back (`undo`): a refused start leaves
    the file system as it found it."""

    def __init__(self, run_dir: Path, created_dir: bool, marked: bool) -> None:
        self.run_dir, self.created_dir, self.marked = run_dir, created_dir, marked

    def undo(self) -> None:
        """Remove the mark this claim wrote and the directory it created, if nothing else was written there since."""
        if self.marked:
            (self.run_dir / RUN_MARKER).unlink(missing_ok=True)
        if self.created_dir:
            try:
                self.run_dir.rmdir()  # only when empty
            except OSError:
                pass


def claim_run_dir(run_dir: str | Path) -> Claim:
    """Refuse a `trainer.output_dir` that is a file or a non-empty directory that hacrl did not mark as a run;
    otherwise create it if needed and mark it as a hacrl run directory (before the lock, so a refused directory is
    left as it was: nothing created in it). `Claim.undo` takes the claim back when the start fails later."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(
            f"trainer.output_dir={str(run_dir)!r} is a file, not a directory; choose a directory path (it is "
            "created if missing)"
        )
    marked = (run_dir / RUN_MARKER).exists()
    if run_dir.is_dir() and not marked:
        try:
            entries = sorted(e for e in os.listdir(run_dir) if e != LOCK_NAME)
        except OSError as e:
            raise RunDirError(f"trainer.output_dir={str(run_dir)!r} cannot be read: {e.strerror or e}") from e
        if entries:
            shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
            raise RunDirError(
                f"trainer.output_dir={str(run_dir)!r} already holds files that hacrl did not write ({shown}). hacrl "
                "writes a run only into a new or empty directory, or one of its own runs (marked by a "
                f"{RUN_MARKER} file), so that it never overwrites or deletes your files: choose another "
                "trainer.output_dir (e.g. a subdirectory) or move those files away."
            )
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RUN_MARKER).touch()
    except OSError as e:
        raise RunDirError(f"trainer.output_dir={str(run_dir)!r} cannot be created or written: {e}") from e
    return Claim(run_dir, created_dir=created, marked=not marked)


class RunLock:
    """An exclusive lock on a run directory (see the module docstring). `release` is idempotent."""

    def __init__(self, run_dir: str | Path, *, notice: Callable[[str], None] = print) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None
        self._notice = notice

    def acquire(self) -> RunLock:
        import fcntl

        self.run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                owner = _read_owner(fd)
                os.close(fd)
                raise RunDirError(_in_use_message(self.run_dir, owner)) from None
            try:  # the previous owner may have unlinked the file between our open and our flock
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            break
        previous = _read_owner(fd)
        if previous and previous.get("pid") is not None:
            where = f"pid {previous.get('pid')} on {previous.get('host')}"
            self._notice(f"{self.path}: taking over a stale lock left by {where} (that process no longer holds it)")
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # while still holding the flock: nobody can be mid-way through taking it
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_owner(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        return json.loads(raw) if raw else {}
    except (OSError, ValueError):
        return {}


def _in_use_message(run_dir: Path, owner: dict[str, Any]) -> str:
    who = (
        f"pid {owner.get('pid')} on host {owner.get('host')} (since {owner.get('started')}: {owner.get('command')})"
        if owner
        else "another process"
    )
    return (
        f"run directory {str(run_dir)!r} is in use by {who}. Two processes writing one run directory would corrupt "
        "its checkpoints and metrics: wait for that run to finish or stop it, or choose another trainer.output_dir."
    )


def read_metrics(path: Path, *, notice: Callable[[str], None] = print) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) pairs of a metrics.jsonl; a cut-off last line is dropped with a notice."""
    lines = path.read_text(errors="replace").splitlines()
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not a metrics record with an integer 'step'")
        except ValueError as e:
            if number == len(lines):
                notice(f"{path}: dropped its last line, cut off when the run stopped mid-write ({clip(line)!r})")
                continue
            raise RunDirError(
                f"{path}:{number} is damaged ({e}); this is not what an interrupted write leaves (only the last "
                "line can be cut off). Delete or repair that line, then resume."
            ) from None
        out.append((line, record))
    return out


def trim_metrics(path: Path, up_to_step: int | None, *, notice: Callable[[str], None] = print) -> int:
    """Keep the records with step <= `up_to_step` (None: keep none), rewritten atomically; returns how many stay."""
    if not path.exists():
        return 0
    kept = [
        line
        for line, record in read_metrics(path, notice=notice)
        if up_to_step is not None and record["step"] <= up_to_step
    ]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
    return len(kept)


def last_logged_step(path: Path) -> int | None:
    """The last step logged in a metrics.jsonl (ignoring a cut-off last line), or None."""
    if not path.exists():
        return None
    records = read_metrics(path, notice=lambda _: None)
    return records[-1][1]["step"] if records else None
