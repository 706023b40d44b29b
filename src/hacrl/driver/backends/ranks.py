"""An agent's role in processes of its own under `runtime.backend: local`: a worker group's K ranks, one per device,
or its sampler of its own.

`LocalProcesses` answers the calls of one `hacrl.agent.worker.AgentWorker` (`submit(method, args, what)` -> a
`Reply`): it sends the call to every rank (`AgentWorker(spec, rank=info)`, in a process of its own) and its reply is
rank 0's answer. The processes are forked from one server per driver (multiprocessing's `forkserver`) that imported
torch, transformers and the worker once (`PRELOAD`), so a rank starts without paying those imports (~4.5 s of CPU
each on a 2-core CPU machine); the server never runs a step, so no thread pool or device state is forked. Each rank
takes the driver's environment of the moment it starts, as a spawned one would, except what the libraries read when
they load (OMP_*, MKL_*, LD_PRELOAD): that is the driver's environment when its first rank started. The
ranks meet in a torch.distributed group whose rendezvous is a free TCP port of this machine. An agent's sampler of
its own is one more such process (`LocalProcesses(spec, sampler=True)`, an `AgentWorker(spec, role="sampler")`).

Failures: an error raised in a rank reaches the user as itself (the other ranks, perhaps waiting for it inside a
collective, are stopped); a rank process that dies (kill -9, the kernel's OOM killer) stops the run at once with a
`WorkerError` that names the agent, the rank and what it was doing. The newest checkpoint stays valid (`--resume`).
The ranks ignore SIGINT and SIGTERM (a Ctrl-C reaches the whole terminal's process group; the driver finishes
its step, checkpoints and stops them) and die with the driver (Linux: the driver's death ends the fork server, and
PR_SET_PDEATHSIG the ranks it forked; elsewhere each rank finds its pipe closed at its next call and exits).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import signal
import time
import weakref
from collections import deque
from dataclasses import replace
from multiprocessing.connection import wait
from typing import Any, NoReturn

from hacrl.driver.backends import PEER_GRACE_S
from hacrl.driver.supervision import Deadlines, die_with_parent, is_stopped, kind_of, process_state, silent
from hacrl.errors import INTACT, WorkerError
from hacrl.messages import WorkerInfo, WorkerSpec


def portable(error: BaseException, where: str) -> BaseException:
    """`error`, noted with where it happened, as something that survives pickling to the driver."""
    error.add_note(where)
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - an exception type that cannot travel: its type and message do
        return RuntimeError(f"{type(error).__name__}: {error} ({where})")


def _rank_main(spec: WorkerSpec, info, conn, environment: dict[str, str]) -> None:
    """A rank's process: build the worker, then answer calls until the driver says stop or goes away."""
    from hacrl import faults

    _follow_the_driver(f"hacrl:{spec.agent.name}:{info.rank}", environment)
    faults.set_rank(info.rank)
    _serve(lambda: _sharded(spec, info), f"rank {info.rank} of agent {spec.agent.name!r}", conn)


def _sharded(spec: WorkerSpec, info):
    from hacrl.agent.worker import AgentWorker

    return AgentWorker(spec, rank=info)


def _sampler_main(spec: WorkerSpec, conn, environment: dict[str, str]) -> None:
    """A sampler's process (`agents.<i>.sampler_devices`): as a rank's, with the sampling role only."""
    from hacrl import faults

    _follow_the_driver(f"hacrl:{spec.agent.name}:s", environment)
    faults.set_rank("sampler")

    def build():
        from hacrl.agent.worker import AgentWorker

        return AgentWorker(spec, role="sampler")

    _serve(build, f"the sampler of agent {spec.agent.name!r}", conn)


def _serve(build, where: str, conn) -> None:
    """Build the worker, then answer calls until the driver says stop or goes away."""
    from hacrl import faults

    try:
        worker = build()
        faults.hit("start")
        conn.send(("ok", worker.describe()))
    except BaseException as e:  # noqa: BLE001 - sent to the driver, which raises it
        conn.send(("error", portable(e, where)))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the driver is gone
            break
        if message is None:
            break
        method, args = message
        try:
            reply = ("ok", getattr(worker, method)(*args))
        except BaseException as e:  # noqa: BLE001 - sent to the driver, which raises it
            reply = ("error", portable(e, where))
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            break
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _follow_the_driver(name: str, environment: dict[str, str]) -> None:
    """A rank lives and stops with the driver: Ctrl-C in a terminal reaches every process of the group, but the
    driver's handler finishes the step and checkpoints with its ranks, so they ignore SIGINT and SIGTERM (the driver
    stops them); and on Linux a rank is killed when the driver dies, even inside a collective. Its process name
    (`name`, what `ps` and `top` show: `hacrl:<agent>:<rank>`, `hacrl:<agent>:s` for a sampler; the kernel keeps 15
    bytes) says whose it is. `environment`: the driver's when it started this process (the fork server's is the one
    it had when the server started)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STARTUP_SIGNALS)  # blocked by the driver while it started us
    if os.environ != environment:
        os.environ.clear()
        os.environ.update(environment)
    _no_process_locks_for_progress_bars()
    _leave_the_servers_lifeline()
    die_with_parent(name=name)  # the parent is the fork server, which exits when the driver does


def _leave_the_servers_lifeline() -> None:
    """Close this process's copy of the fork server's lifeline, the pipe whose end tells the server that its driver
    is gone. Every process the server forks is handed a copy; kept open, a killed driver would leave the server,
    and so these processes, running. Closed, the driver's death ends the server, and PR_SET_PDEATHSIG (set on the
    server as parent) ends this process: the kernel's guarantee, even inside a collective."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(fd, int):
        try:
            os.close(fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None


PRELOAD = ("torch", "transformers", "hacrl.agent.worker", "hacrl.driver.backends.ranks")
"""What the fork server imports once for every rank and sampler it forks (the model's own transformers module is
imported by the rank that loads it)."""


def _context():
    """multiprocessing's forkserver, the server importing `PRELOAD` (where this process starts it: one that already
    runs keeps what it imported; a rank then imports the rest itself)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


_STARTUP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _no_process_locks_for_progress_bars() -> None:
    """tqdm guards its bars with a multiprocessing lock, a named semaphore that a killed rank cannot give back: the
    driver then ended with the resource tracker's 'leaked semaphore objects' warning. A rank's bars need a thread
    lock only."""
    import threading

    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def _start_ignoring_stops(process) -> None:
    """Start a rank process with SIGINT / SIGTERM ignored from its first instruction: a Ctrl-C while it started
    (before `_follow_the_driver` runs) printed its KeyboardInterrupt traceback. Blocking them was not enough: a
    signal sent to the process group stays pending and is delivered to any thread of the rank that unblocks it, and
    Python then raises KeyboardInterrupt there. An ignored disposition survives the exec and the fork, and Python
    installs no KeyboardInterrupt handler over it: the first start execs the fork server inside this window, so the
    server ignores both (a group's SIGTERM must not end it: its death ends every rank, PR_SET_PDEATHSIG) and forks
    every rank with both ignored. Here the two signals are blocked meanwhile, so the driver only delays them (a
    thread that does not block them could take one in the instant of the start: it is ignored)."""
    import threading

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STARTUP_SIGNALS)
    main = threading.current_thread() is threading.main_thread()  # only the main thread may set a handler
    handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STARTUP_SIGNALS} if main else {}
    try:
        process.start()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class Reply:
    """Rank 0's answer to one call `LocalProcesses.submit` sent, taken when first asked for (`value`). The ranks answer
    in order: asking for one takes every earlier one first."""

    def __init__(self, ranks: LocalProcesses, what: str) -> None:
        self.ranks, self.what, self.taken, self.result = ranks, what, False, None

    def value(self) -> Any:
        while not self.taken:
            self.ranks._take_oldest()
        return self.result


class LocalProcesses:
    """The processes of one agent's role: its worker group's K ranks, or its sampler's one; `submit` runs a worker
    method on all of them, its `Reply` is rank 0's answer."""

    def __init__(self, spec: WorkerSpec, *, sampler: bool = False, deadlines=None) -> None:
        """The ranks of `spec.agent.devices`; `sampler`: instead the one process of its sampler on
        `spec.agent.sampler_devices`. `deadlines` (`runtime.deadline`): how long a call may go unanswered
        (`hacrl.driver.supervision`)."""
        from hacrl.agent.distributed import RankInfo, free_port

        self.name = spec.agent.name
        self.sampler = sampler
        self.deadlines = Deadlines(deadlines)
        self._calls: deque[tuple[str, float]] = deque()
        """The calls sent and not yet answered, in order: (kind, when it was sent)."""
        self._waiting: deque[Reply] = deque()
        """Their replies, in the same order."""
        self._answered = time.monotonic()
        """When the last answer came (a call sent before it waited in the pipe until then)."""
        devices = [spec.placement.sampler_device] if self.sampler else list(spec.agent.devices or [])
        context = _context()
        environment = dict(os.environ)
        init = f"tcp://127.0.0.1:{free_port()}"
        self.processes: list[Any] = []
        self.pipes: list[Any] = []
        if spec.torch_threads is None:  # one share of this machine's cores per process, not every core each
            share = max(1, (os.cpu_count() or 1) // (2 if self.sampler else len(devices)))
            spec = replace(spec, torch_threads=share)
        try:
            for rank, device in enumerate(devices):
                ours, theirs = context.Pipe()
                info = RankInfo(rank, len(devices), init, device)
                target, args = ((_sampler_main, (spec, theirs, environment)) if self.sampler
                                else (_rank_main, (spec, info, theirs, environment)))  # fmt: skip
                process = context.Process(target=target, args=args, daemon=True)
                _start_ignoring_stops(process)
                theirs.close()
                self.processes.append(process)
                self.pipes.append(ours)
            _LIVE.add(self)
            self._calls.append(("starting", time.monotonic()))
            self.infos: list[WorkerInfo] = self._replies("starting")
        except KeyboardInterrupt:
            self.close(force=True)  # the ranks may be loading for minutes: do not wait for them
            raise
        except BaseException:
            self.close()
            raise

    def describe(self) -> WorkerInfo:
        return self.infos[0]

    def raise_if_dead(self, what: str) -> None:
        """After an error that may be this process's death seen from its peer: within a grace, the death, named."""
        ready = wait([p.sentinel for p in self.processes], timeout=PEER_GRACE_S)
        for rank, process in enumerate(self.processes):
            if process.sentinel in ready:
                self._died(rank, what)

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def call(self, method: str, args: tuple, what: str) -> Any:
        return self.submit(method, args, what).value()

    def submit(self, method: str, args: tuple, what: str) -> Reply:
        """Send the call to every rank without waiting for it."""
        self._calls.append((kind_of(what), time.monotonic()))
        reply = Reply(self, what)
        self._waiting.append(reply)
        for rank, pipe in enumerate(self.pipes):
            try:
                pipe.send((method, args))
            except OSError:  # BrokenPipeError: the rank died since the last call (kill -9, the OOM killer)
                self._died(rank, what)
        return reply

    def _take_oldest(self) -> None:
        """Rank 0's answer to the oldest call sent, into its reply."""
        if not self._waiting:  # closed after an error or a death, which was raised
            raise WorkerError(f"{self._who(0)} was stopped before it answered. {INTACT}.")
        reply = self._waiting[0]
        reply.result, reply.taken = self._replies(reply.what)[0], True
        self._waiting.popleft()

    def _died(self, rank: int, what: str) -> NoReturn:
        process = self.processes[rank]
        who = self._who(rank)
        self.close(force=True)
        process.join(timeout=5)
        raise WorkerError(f"{who} (pid {process.pid}) died while {what} ({_exit_reason(process.exitcode)}). {INTACT}.")

    def _replies(self, what: str) -> list[Any]:
        """Every rank's answer to the oldest call sent, in rank order; the first error, death or silence past the
        call's deadline stops the group and is raised."""
        kind, sent = self._calls.popleft()
        start = max(sent, self._answered)  # the ranks answer in order: this call began when the one before ended
        deadline = start + self.deadlines.limit(kind)
        replies: list[Any] = [None] * len(self.pipes)
        pending = set(range(len(self.pipes)))
        while pending:
            watched = [self.pipes[r] for r in pending] + [self.processes[r].sentinel for r in pending]
            ready = set(wait(watched, timeout=max(0.0, deadline - time.monotonic())))
            if not ready and time.monotonic() >= deadline:
                self._silent(pending, what, kind, time.monotonic() - start)
            for rank in sorted(pending):
                pipe, process = self.pipes[rank], self.processes[rank]
                if pipe in ready or pipe.poll():
                    try:
                        status, value = pipe.recv()
                    except (EOFError, OSError):
                        status, value = "died", None
                elif process.sentinel in ready:
                    status, value = "died", None
                else:
                    continue
                if status == "ok":
                    replies[rank] = value
                    pending.discard(rank)
                    continue
                if status == "error":
                    self._raise_if_a_peer_died(rank, what)
                    self.close(force=True)
                    raise value
                self._died(rank, what)
        self._answered = time.monotonic()
        self.deadlines.observe(kind, self._answered - start)
        return replies

    def _silent(self, pending: set[int], what: str, kind: str, waited: float) -> NoReturn:
        """No answer within the deadline: name the silent rank (a stopped one first: its peers wait for it inside a
        collective), kill the group, raise."""
        ranks = sorted(pending, key=lambda r: (not is_stopped(self.processes[r].pid), r))
        rank = ranks[0]
        pid = self.processes[rank].pid
        state = process_state(pid)
        rule = self.deadlines.rule(kind)
        self.close(force=True)
        raise silent(self._who(rank), pid, what, waited, rule, state=state)

    def _who(self, rank: int) -> str:
        return f"the sampler of agent {self.name!r}" if self.sampler else f"rank {rank} of agent {self.name!r}"

    def _raise_if_a_peer_died(self, rank: int, what: str) -> None:
        """A rank's error may be a peer's death seen through the collective (gloo: 'Connection reset by peer'):
        give the other ranks a grace to die, and report the death as the cause."""
        peers = [r for r in range(len(self.processes)) if r != rank]
        if not peers:
            return
        ready = wait([self.processes[r].sentinel for r in peers], timeout=PEER_GRACE_S)
        for r in peers:
            if self.processes[r].sentinel in ready:  # its end closed: it died (reaped a moment later)
                self._died(r, what)

    def close(self, *, force: bool = False) -> None:
        """Stop the ranks (idempotent): ask them to exit and give them CLOSE_GRACE_S to, then kill what is still
        there; `force`: kill them at once (a second Ctrl-C, an error mid-call)."""
        if not force:
            for pipe in self.pipes:
                try:
                    pipe.send(None)
                except (BrokenPipeError, OSError):
                    pass
            deadline = time.monotonic() + CLOSE_GRACE_S
            for process in self.processes:
                if not is_stopped(process.pid):  # a stopped rank never reads the request: no grace for it
                    process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.kill()  # SIGKILL also ends a stopped process
                process.join(timeout=10)
        for pipe in self.pipes:
            pipe.close()
        self.processes, self.pipes = [], []
        self._calls.clear()
        self._waiting.clear()
        _LIVE.discard(self)


CLOSE_GRACE_S = 30.0
"""How long a close waits for the ranks to finish their call and exit before it kills them."""

_LIVE: weakref.WeakSet[LocalProcesses] = weakref.WeakSet()
"""The groups started and not yet closed in this process."""


@atexit.register
def _kill_leftovers() -> None:
    """At the interpreter's exit, kill the rank and sampler processes that nothing closed. multiprocessing's own exit
    handler (registered before this one, so it runs after it) would send them SIGTERM, which they ignore, then join
    them: forever (a run that stopped on a full disk hung there). Nothing is left to save at that point."""
    for ranks in list(_LIVE):
        ranks.close(force=True)


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
