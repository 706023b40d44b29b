"""How the driver watches the worker processes it calls (the ranks of a worker group, a sampler of its own, a Ray
actor): every call has a deadline, and a worker that stays silent past it is named, killed, and the run stopped in
one paragraph, resumable with `--resume` (docs/reliability.md, "Liveness").

A call's deadline follows from what it does (`runtime.deadline`): `first_call` seconds while no call of its kind
has answered yet (a start loads a model; a first call may compile or warm up), then `factor` x the slowest answer of
its kind so far, at least `minimum` seconds. A kind is the call's description with its numbers taken out
("sampling at step #", "learning at step #", "evaluating at step #", "loading its checkpoint part"), kept per worker,
so a small agent's deadlines follow its own times and a benchmark's evaluation is not held to the eval split's.

The processes it starts (ranks, samplers, scoring processes) die with their parent, even when it is killed
(`die_with_parent`: the kernel's PR_SET_PDEATHSIG on Linux, a watchdog thread elsewhere), and carry names that say
whose they are.

Why a process is silent is told where the operating system says it: stopped (SIGSTOP, a debugger), in
uninterruptible sleep (a hung device or file system call), or running (a livelock or a very slow call).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Hashable
from pathlib import Path

from hacrl.errors import INTACT, WorkerError

_NUMBERS = re.compile(r"\d+")


def kind_of(what: str) -> str:
    """A call's kind: its description without its numbers (`sampling at step 3` -> `sampling at step #`)."""
    return _NUMBERS.sub("#", what)


class Deadlines:
    """The deadline of each kind of call to one set of workers, from `runtime.deadline` and the answers seen so far
    (`observe`)."""

    def __init__(self, settings=None) -> None:
        from hacrl.config import DeadlineConfig

        self.settings = settings if settings is not None else DeadlineConfig()
        self.slowest: dict[Hashable, float] = {}

    def limit(self, key: Hashable) -> float:
        """Seconds a call of kind `key` may go unanswered."""
        seen = self.slowest.get(key)
        if seen is None:
            return self.settings.first_call
        return max(self.settings.minimum, self.settings.factor * seen)

    def observe(self, key: Hashable, seconds: float) -> None:
        """A call of kind `key` answered after `seconds`."""
        self.slowest[key] = max(self.slowest.get(key, 0.0), seconds)

    def rule(self, key: Hashable) -> str:
        """How `limit(key)` came about, in words, with the keys that set it."""
        s = self.settings
        seen = self.slowest.get(key)
        if seen is None:
            return f"runtime.deadline.first_call={s.first_call:g} s (no call of this kind had answered yet)"
        return (
            f"{s.factor:g} x the slowest earlier answer of this kind ({seen:.1f} s), at least {s.minimum:g} s "
            "(runtime.deadline.factor / .minimum)"
        )


_STATES = {
    "T": "it is stopped (SIGSTOP or a debugger)",
    "t": "it is stopped by a debugger",
    "D": "it is in uninterruptible sleep (a hung device, driver or file-system call)",
    "Z": "it has exited and not been reaped",
    "R": "it is running (a livelock, a deadlock that spins, or a call far slower than before)",
    "S": "it is sleeping (waiting on a lock, a peer or a collective that will not come)",
}


def process_state(pid: int | None) -> str:
    """What the operating system says process `pid` is doing, in words ("" where it cannot say)."""
    if pid is None:
        return ""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    state = stat[stat.rfind(")") + 2 : stat.rfind(")") + 3]  # the field after the command name, which may hold spaces
    return _STATES.get(state, f"its state is {state!r}")


def is_stopped(pid: int | None) -> bool:
    return process_state(pid).startswith("it is stopped")


def silent(who: str, pid: int | None, what: str, waited: float, rule: str, *, state: str | None = None) -> WorkerError:
    """The error of a worker that did not answer `what` within its deadline (it has been killed)."""
    why = process_state(pid) if state is None else state
    return WorkerError(
        f"{who}{'' if pid is None else f' (pid {pid})'} did not answer within {waited:.1f} s while {what}"
        f"{f'; {why}' if why else ''}. It was killed; its deadline was {rule}. {INTACT} (if calls like this one "
        "really take that long, raise the setting named there)."
    )


def die_with_parent(parent_pid: int | None = None, name: str | None = None) -> None:
    """This process is killed when its parent dies, even by SIGKILL (Linux: PR_SET_PDEATHSIG; elsewhere a watchdog
    thread checks every second). `parent_pid`: the parent it must still have (one that died before the kernel took
    the request ends this process at once); `name`: what `ps` and `top` show for it (Linux keeps 15 bytes)."""
    parent_pid = os.getppid() if parent_pid is None else parent_pid
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if name is not None:
            libc.prctl(15, ctypes.c_char_p(name.encode()[:15]))  # PR_SET_NAME
        if libc.prctl(1, signal.SIGKILL) == 0:  # PR_SET_PDEATHSIG
            if os.getppid() != parent_pid:  # the parent died before the request took effect
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass
    import threading

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
