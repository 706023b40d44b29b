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
whose they are. A process that runs untrusted code (a scoring process) runs below a keeper (`keep`), the subreaper
of everything it starts, which kills the whole tree (`kill_below`) when it ends or the trainer dies.

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
from typing import NoReturn

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
            return min(self.settings.first_call, self.settings.LONGEST)
        return min(max(self.settings.minimum, self.settings.factor * seen), self.settings.LONGEST)

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


# -- a process tree that dies whole (the scoring processes and whatever a reward function starts) ---------------


def signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def descendants(root: int) -> list[int]:
    """Every process below `root` (Linux /proc; elsewhere none). A scoring process is a child subreaper, so the
    processes its reward function starts stay below it even when they detach (setsid and a double fork)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def ignore(signum, frame) -> None:
    """A handler that does nothing: the signal is not acted on, and (unlike SIG_IGN) a child does not inherit it."""


def keep(scoring: int, trainer: int) -> NoReturn:
    """The keeper of one scoring process (the process `hacrl.driver.scoring` starts; the scoring process is its
    child): the subreaper of everything the reward function starts, so those stay below it even when they detach.
    When the scoring process ends, the keeper kills whatever it left and ends the same way (the trainer reads that
    exit status); when the trainer dies (even by `kill -9`, which no handler sees), the keeper kills everything below
    it within 0.1 s and exits. The kernel kills the scoring process when its keeper dies (PR_SET_PDEATHSIG)."""
    me = os.getpid()
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # nothing below any more
            os._exit(1)
        if pid == scoring:
            break
        if pid:
            continue  # an orphan it adopted, reaped: look again at once
        if os.getppid() != trainer:  # the trainer is gone: so is everything it started
            kill_below(me)
            os._exit(1)
        time.sleep(0.1)
    kill_below(me)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two keep their default: no handler may be set
            signal.signal(sig, signal.SIG_DFL)  # (setting one raised EINVAL: a traceback per killed scorer)
        os.kill(me, sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def kill_below(root: int) -> None:
    """Kill every process below `root` (stopped first, so none starts another meanwhile) and reap them."""
    for sig in (signal.SIGSTOP, signal.SIGSTOP, signal.SIGKILL, signal.SIGKILL):
        for pid in descendants(root):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                time.sleep(0.01)
        except ChildProcessError:
            return


def become_subreaper() -> None:
    """Linux: processes started below this one that detach (setsid, a double fork) are re-parented to it instead of
    to init, so their keeper finds and kills them."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass
