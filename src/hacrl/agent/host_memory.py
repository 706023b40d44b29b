"""`runtime.host_memory`: what a worker's process does with host memory it frees, all of it here. `keep`: glibc's
malloc as it is; `release`: every large allocation mapped on its own and returned when freed (`apply`); `mimalloc`:
the process on Microsoft's mimalloc allocator instead of glibc's malloc.

Why mimalloc: on the CPU an update's activations (hundreds of MiB in tensors of a few MiB each) are freed after every
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

import ctypes
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


def restart_with_mimalloc(mode: str) -> None:
    """`hacrl train` (or `hacrl plan --measure`) with `runtime.host_memory: mimalloc`: run this same command again in
    this process, with the library preloaded (nothing for the other settings, or where it already runs on it). Called
    before torch loads: the restart costs the interpreter's start-up."""
    if mode != "mimalloc" or loaded():
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


MMAP_THRESHOLD = 1 << 20
"""`apply("release")`: glibc maps allocations of this many bytes or more on their own (`M_MMAP_THRESHOLD`)."""
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
_released = False
"""Whether this process gives freed memory back (`apply("release")` took effect, or it runs on mimalloc): no
use suggesting it."""


def apply(mode: str) -> bool:
    """`runtime.host_memory` for this process; True where it changed glibc's behaviour.

    By default glibc serves allocations below a threshold that rises to 32 MiB from its heap, and a heap whose top
    is still in use cannot shrink: an update's activations (hundreds of MiB in tensors of a few MiB each, freed
    after each backward) stay resident after they are freed, and the next phase's allocations land beside them. With
    `release`, every allocation of MMAP_THRESHOLD bytes or more is its own mapping, returned when freed. The cost is
    the kernel's work on a fresh mapping's first touch (a fault and zeroed pages); torch's tensors of 2 MiB or more
    are then also asked to be backed by transparent huge pages (`THP_MEM_ALLOC_ENABLE`, where the kernel allows
    `madvise`), one fault per 2 MiB instead of per 4 KiB: on SmolLM2 the cost fell from 1.46x to 1.22x keep's step
    (docs/benchmarks.md). torch reads that setting at the process's first allocation, so `release` must
    come before the process allocates a tensor (the trainer sets it first thing for the workers in its own process,
    `hacrl.driver.backends.host_workers_here`; a worker's process as it starts). Tensors are 64-byte aligned either
    way (2 MiB-aligned with huge pages), so no computation sees a difference. Once set it holds for the process
    (`keep` changes nothing). `mimalloc`: the process must run on that allocator, preloaded at its start
    (`restart_with_mimalloc`); a clear stop where it does not."""
    global _released
    if mode == "mimalloc":
        require()
        _released = True
        return True
    if mode == "keep" or not sys.platform.startswith("linux"):
        return False
    try:  # the process's own symbols: its C library's mallopt, without a search for the library
        _released = _released or bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):  # another C library (musl has no mallopt): its own behaviour stands
        return False
    if _released:
        os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # a user's own 0 stands; child processes inherit it
    return _released


def released() -> bool:
    """Whether this process gives freed memory back (`apply` took effect, or it runs on mimalloc)."""
    return _released
