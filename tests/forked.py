"""`hacrl` runs in processes of their own, without an interpreter start each.

The fault tests kill, signal and resume a run in 11 processes; each used to be `python -m hacrl`, and each paid
torch's and transformers' imports (~5 s on a CI core) before its first step. Here every such process is forked from
one server (multiprocessing's forkserver) that imported them once: a fresh process all the same (its own pid, kill
-9 kills it, signals reach its own handlers, its exit status is the run's), with the same stdout / stderr buffering
as an interpreter writing to a file or pipe. The server itself never runs a step, so no thread pool or allocator
state is forked into a run.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PRELOAD = [
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
    "hacrl.tools.cli",
    "hacrl.driver.trainer",
    "tests.forked",
]

_context = None


def _forkserver():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _child(args: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """The run, in the forked process: `main(args)` as `python -m hacrl ARGS` runs it, its output in two files, in
    the caller's environment (`env`: the whole of it, not the server's) with an interpreter's signal dispositions
    (the server is shared with hacrl's own rank processes, `hacrl.driver.backends.ranks`: one they started ignores
    SIGINT and SIGTERM)."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    os.chdir(cwd)
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (block-buffered, as a pipe is)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 (line-buffered, as Python's stderr is)
    os.environ.clear()
    os.environ.update(env)
    import torch

    from hacrl import faults
    from hacrl.tools.cli import main

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads()))
    faults.reset()  # the plan is this process's HACRL_FAULTS, read afresh
    try:
        code = main(args)
    finally:
        atexit._run_exitfuncs()  # an interpreter's exit runs them; multiprocessing's child exit does not
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


def hacrl(
    args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """`python -m hacrl ARGS` in `cwd` with `env` added to the environment, in a forked process; its returncode is
    negative for a signal, as subprocess's is, and the run is killed after `timeout` seconds."""
    context = _forkserver()
    out = Path(tempfile.mkdtemp(prefix="hacrl-forked-"))
    stdout, stderr = out / "stdout", out / "stderr"
    environment = {**os.environ, **(env or {})}
    process = context.Process(
        target=_child, args=(list(args), environment, str(cwd or Path.cwd()), str(stdout), str(stderr))
    )
    process.start()
    process.join(timeout)
    try:
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(["hacrl", *args], timeout, _read(stdout), _read(stderr))
        return subprocess.CompletedProcess(["hacrl", *args], process.exitcode, _read(stdout), _read(stderr))
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""
