"""`runtime.host_memory: mimalloc`: a worker's process on Microsoft's mimalloc allocator instead of glibc's malloc.

Why: on the CPU an update's activations (hundreds of MiB in tensors of a few MiB each) are freed after every
backward. glibc keeps them in its heap, where the gradients and the next phase's tensors land among them, so the
resident memory stays ~1 GiB above what is live on SmolLM2 (`keep`); mapping each large tensor on its own
(`release`) gives it back at the price of the kernel's work on every fresh mapping (1.2x keep's step). mimalloc
reuses freed memory from per-size pages and gives unused pages back to the system after a short delay, so it
serves both: the numbers are in docs/benchmarks.md.

An allocator must be in place before the process's first allocation, so it is preloaded (`LD_PRELOAD`) when the
process starts: `hacrl train` and `hacrl plan --measure` restart themselves with it (`restart_with_mimalloc`, before
torch loads); processes the run starts inherit it (ranks, samplers) or are given it (Ray actors: `runtime_env`); a
process that does not run on it stops with the fix (`require`). The library comes from the `cmeel-mimalloc` wheel
(`pip install "hacrl[mimalloc]"`, or `hacrl[gguf]`; 0.5 MB, MIT). Linux only. Nothing here imports torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from hacrl.errors import ConfigError

RESTARTED = "HACRL_MIMALLOC_RESTARTED"
"""Set in the environment of the process `restart_with_mimalloc` started (so it never restarts twice)."""


def library() -> str:
    """The path of the mimalloc shared library of the installed `cmeel-mimalloc` wheel."""
    from importlib import metadata

    try:
        files = metadata.files("cmeel-mimalloc") or []
    except metadata.PackageNotFoundError:
        files = []
    found = sorted((f for f in files if f.name.startswith("libmimalloc.so")), key=lambda f: len(f.name))
    for f in found:
        path = Path(f.locate()).resolve()
        if path.is_file():
            return str(path)
    raise ConfigError(
        'runtime.host_memory=mimalloc needs the mimalloc library: pip install "hacrl[mimalloc]" (the cmeel-mimalloc '
        "wheel), or set runtime.host_memory to keep or release"
    )


def loaded() -> bool:
    """Whether this process runs on mimalloc (its library is mapped: preloaded at the start)."""
    try:
        return "libmimalloc" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def preloaded(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the mimalloc library first in LD_PRELOAD."""
    lib, current = library(), env.get("LD_PRELOAD", "")
    return {**env, "LD_PRELOAD": current if lib in current.split() else f"{lib} {current}".strip()}


def ray_options(host_memory: str) -> dict:
    """Ray actor options that start the actor's process on mimalloc (nothing for the other settings)."""
    if host_memory != "mimalloc":
        return {}
    return {"runtime_env": {"env_vars": {"LD_PRELOAD": preloaded({})["LD_PRELOAD"]}}}


def require() -> None:
    """This process must run on mimalloc (a worker's, with `runtime.host_memory: mimalloc`): else a clear stop."""
    if not sys.platform.startswith("linux"):
        raise ConfigError(f"runtime.host_memory=mimalloc is for Linux (this is {sys.platform}): use keep or release")
    if loaded():
        return
    raise ConfigError(
        "runtime.host_memory=mimalloc: this process does not run on mimalloc, which must be preloaded when a process "
        "starts. `hacrl train` and `hacrl plan --measure` restart themselves with it; from Python, start the "
        f"interpreter with LD_PRELOAD={library()} (or use runtime.host_memory=keep or release)"
    )


def restart_with_mimalloc() -> None:
    """`hacrl train` with `runtime.host_memory: mimalloc`: run this same command again in this process, with the
    library preloaded (nothing where it already runs on it). Called before torch loads: the restart costs the
    interpreter's start-up."""
    if loaded():
        return
    if not sys.platform.startswith("linux"):
        require()  # the message for other systems
    if os.environ.get(RESTARTED):  # preloaded, yet not mapped: the loader ignored LD_PRELOAD
        raise ConfigError(
            f"runtime.host_memory=mimalloc: LD_PRELOAD={library()} was set, yet the process does not run on it "
            "(the dynamic loader ignored it): use runtime.host_memory=keep or release"
        )
    env = {**preloaded(os.environ), RESTARTED: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), env)
