"""Scoring completions under a time limit that no reward function and no text can get past.

A reward function runs in separate scoring processes (`scoring.workers` of them, started once and reused),
never in the training process. The trainer sends a step's completions, waits, and stops waiting at the deadline:

- Built-in scorers (math-verify, reasoning-gym) are called one completion at a time, and each completion gets
  `scoring.timeout` seconds. A user's `scoring.function` is called once per worker on its slice of the
  batch, with `reward_timeout` seconds per completion in it, at most SLICE_LIMIT (30 s) in all; when that runs out,
  the slice is scored again one completion at a time, so only the completions that really hang are affected, each
  costing its timeout once (the slice's attempt before is bounded by SLICE_LIMIT).
- A user function that is hung (past its limit on the whole slice, then on each of the first HUNG_AFTER
  completions retried alone, without returning once) stops the run with a message naming the function, the
  timeout and the knobs, within about a minute at the defaults; `scoring.on_hung: continue` scores those
  completions `reward_on_timeout` and goes on instead.
- A completion whose scoring runs past its limit gets `scoring.on_timeout` (or stops the run with
  `scoring.stop_on_timeout`); the process is killed and a fresh one takes over (its start-up is not counted
  against any deadline). Timeouts are counted in the metrics, and a function that keeps timing out is named in a
  warning.
- A built-in scorer that raises or crashes on some text scores that completion 0 (model output is untrusted; it
  is counted as `reward_errors`). A user function that raises, returns the wrong count or a value that is not a
  finite number in [0, r_max] stops the run with a message naming the function and the sample.
- A user's reward module is imported only in the scoring processes, never in the trainer: `wait_ready` waits
  for the import before step 1, at most `scoring.start_timeout` seconds, and a hang, an exception or an exit
  (sys.exit, os._exit) at import stops the run naming the module.
- Each scoring process has an address-space limit (`scoring.memory_mb`, or a lower one it inherited: `ulimit -v`),
  ignores SIGINT / SIGTERM (the trainer decides when it ends; its reward function's subprocesses do not inherit
  that) and runs below a keeper process (`supervision.keep`) in a process group of its own that is killed whole. The
  keeper is the subreaper of whatever the reward function starts, also what leaves the group (setsid, a double fork);
  when the trainer dies, even by `kill -9`, the keeper kills everything below it within 0.1 s, and the kernel
  kills the scoring process with its keeper. A process that died while idle is replaced before the next job is
  sent to it.

Results do not depend on the number of workers (each scores a contiguous slice, and the slices are put back in
order), and they are what calling the function in-process would give, except for completions that time out.
`scoring.isolation: inline` calls the function in the training process instead (for debugging with pdb):
then nothing but the built-in scorers' own math-verify limits bounds it.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from hacrl.config import ScoringConfig
from hacrl.driver.supervision import (
    become_subreaper,
    descendants,
    die_with_parent,
    ignore,
    keep,
    kill_quietly,
    signal_group,
)
from hacrl.errors import RewardError, clip, warn
from hacrl.messages import ScoreResult
from hacrl.tasks.rewards import (
    RewardFn,
    call_reward,
    import_reward_function,
    math_reward,
    reward_name,
    validate_rewards,
)

SLICE_LIMIT = 30.0
"""Seconds a user function's call on a whole slice may take at most (else `reward_timeout` x the slice's size)."""
HUNG_AFTER = 3
"""A user function past its limit on a slice and then on this many completions retried alone is hung."""


# -- the messages between the trainer and a scoring process (pickled over its socket) -----------------------------


@dataclass(frozen=True)
class _Start:
    """Trainer -> a new scoring process, first: its reward function (("path", "pkg.mod:fn") or ("pickle", bytes)),
    its address-space limit and the trainer's pid (the keeper watches it)."""

    function: tuple[str, Any]
    memory_mb: int | None
    trainer_pid: int


@dataclass(frozen=True)
class _Slice:
    """Trainer -> scoring process: completions to score, `batch` in one call of the function, `each` one call a
    completion (one reply each)."""

    mode: str
    prompts: list[Any]
    completions: list[str]
    columns: dict[str, list[Any]]


@dataclass(frozen=True)
class _Ready:
    """Its reward function is imported: it takes slices now."""


@dataclass(frozen=True)
class _Failed:
    """Its reward function could not be imported (why)."""

    detail: str


@dataclass(frozen=True)
class _Scored:
    """The function's output: a batch's rewards, or one completion's (`_portable`)."""

    values: Any


@dataclass(frozen=True)
class _Raised:
    """The function raised (its error, where)."""

    error: str


@dataclass(frozen=True)
class _Died:
    """Not sent: the trainer's note for a process whose socket closed (how it ended)."""

    how: str


Reply = _Ready | _Failed | _Scored | _Raised | _Died


class Scorer:
    """Scores completions with a reward function under the `scoring:` settings (see the module docstring); a reward
    outside [0, r_max] is an error.

    `fn` is a picklable reward function (the built-in scorers are), or a `package.module:function` path that each
    scoring process imports. `builtin` says whether it is one of hacrl's scorers (called per completion; errors score
    0) or a user's (called per slice; errors stop the run).
    """

    def __init__(self, fn: RewardFn | str, settings: ScoringConfig, *, builtin: bool, r_max: float = 1.0) -> None:
        self.settings = settings
        self.r_max = r_max
        self.builtin = builtin
        self._fn = fn
        self._local = None if isinstance(fn, str) else fn  # a user's module is imported in the scoring processes only
        self.name = fn if isinstance(fn, str) else reward_name(fn)
        self._payload = ("path", fn) if isinstance(fn, str) else ("pickle", pickle.dumps(fn))
        self._workers: list[_Worker | None] = [None] * max(1, settings.workers)
        self.total_timeouts = 0
        self._next_warning = 1
        self._closed = False

    # -- public ----------------------------------------------------------------------------------------------------

    def start(self) -> Scorer:
        """Start the scoring processes now (they import their reward function in the background)."""
        if self.settings.isolation == "process":
            for i, worker in enumerate(self._workers):
                if worker is None:
                    self._workers[i] = _Worker(self._payload, self.settings.memory_mb)
        return self

    def wait_ready(self) -> Scorer:
        """Wait until every scoring process has imported its reward function, at most `scoring.start_timeout`
        seconds: a RewardError naming the module when its import raises, exits or does not finish in time (a
        run stops before step 1, not at its first scoring). Inline isolation imports it here, unbounded."""
        if self.settings.isolation == "inline":
            self._inline_function()
            return self
        self.start()
        deadline = time.monotonic() + self.settings.start_timeout
        waiting = [w for w in self._workers if not w.ready]
        try:
            while waiting:
                ready = wait([w.conn for w in waiting], timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise RewardError(self._start_problem(None))
                for worker in [w for w in waiting if w.conn in ready]:
                    message = worker.receive()
                    if not isinstance(message, _Ready):
                        raise RewardError(self._start_problem(message))
                    worker.ready = True
                    waiting.remove(worker)
        except BaseException:
            self.close()
            raise
        return self

    def _start_problem(self, message: Reply | None) -> str:
        """Why a scoring process did not start: `message` instead of `_Ready`, None for a timeout."""
        if isinstance(message, _Failed):
            return f"the scoring process could not load reward function {self.name}: {message.detail}" + (
                address_space_note(self.settings.memory_mb)
            )
        if isinstance(message, _Died):
            return (
                f"the scoring process exited while importing reward function {self.name} ({message.how}): its module "
                "ends the process at import (os._exit, a crash in native code, the memory limit)"
                + address_space_note(self.settings.memory_mb)
            )
        return (
            f"the scoring process did not finish importing reward function {self.name} within "
            f"scoring.start_timeout={self.settings.start_timeout:g}s: its module blocks at import (a model load, a "
            "network call, a lock?). Make the import finish, or raise scoring.start_timeout if it is only slow"
        )

    def _inline_function(self) -> RewardFn:
        if self._local is None:
            self._local = import_reward_function(self._fn)
        return self._local

    def score(self, prompts: Sequence[Any], completions: Sequence[str], columns: dict[str, Sequence[Any]]):
        """Rewards for `completions` (aligned with `prompts` and every column), with timeouts and errors noted."""
        n = len(completions)
        if n == 0:
            return ScoreResult([])
        prompts, completions = list(prompts), list(completions)
        columns = {k: list(v) for k, v in columns.items()}
        if self.settings.isolation == "inline":
            return self._score_inline(prompts, completions, columns)
        self.start()
        result = ScoreResult([0.0] * n)
        try:
            self._score_in_workers(prompts, completions, columns, result)
        except BaseException:
            self.close()  # a worker may be half-way through a job: never reuse it
            raise
        result.timeouts.sort()
        result.errors.sort()
        if result.timeouts:
            self._note_timeouts(result, completions)
        return result

    def close(self) -> None:
        for i, worker in enumerate(self._workers):
            if worker is not None:
                worker.stop()
                self._workers[i] = None

    # -- in this process -------------------------------------------------------------------------------------------

    def _score_inline(self, prompts, completions, columns) -> ScoreResult:
        result = ScoreResult([0.0] * len(completions))
        self._inline_function()
        if not self.builtin:
            raw = call_reward(self._local, prompts, completions, columns, name=self.name)
            result.rewards = validate_rewards(self.name, raw, completions, r_max=self.r_max)
            return result
        for i in range(len(completions)):
            try:
                raw = self._local(prompts=[prompts[i]], completions=[completions[i]], **_pick(columns, i))
                result.rewards[i] = validate_rewards(self.name, raw, completions[i : i + 1], r_max=self.r_max)[0]
            except Exception:  # noqa: BLE001 - model output broke a built-in scorer: that completion scores 0
                result.errors.append(i)
        return result

    # -- in scoring processes --------------------------------------------------------------------------------------

    def _score_in_workers(self, prompts, completions, columns, result: ScoreResult) -> None:
        n = len(completions)
        size = -(-n // len(self._workers))
        jobs: dict[int, _Job] = {}
        for w, start in enumerate(range(0, n, size)):
            mode = "each" if self.builtin else "batch"
            jobs[w] = _Job(list(range(start, min(start + size, n))), mode)
        for w, job in jobs.items():
            self._send(w, job, prompts, completions, columns)
        while jobs:
            now = time.monotonic()
            deadlines = [self._deadline(w, job) for w, job in jobs.items()]
            timeout = max(0.0, min(deadlines) - now)
            ready = wait([self._workers[w].conn for w in jobs], timeout=timeout)
            for w in list(jobs):
                worker, job = self._workers[w], jobs[w]
                if worker.conn in ready:
                    done = self._handle(w, job, worker.receive(), prompts, completions, columns, result)
                    if done:
                        del jobs[w]
                elif time.monotonic() >= self._deadline(w, job):
                    if job.phase == "starting":
                        raise RewardError(self._start_problem(None))
                    if job.mode == "batch":  # find the completions that hang, one at a time
                        self._restart(w)
                        job.mode, job.retried = "each", True
                        self._send(w, job, prompts, completions, columns)
                        continue
                    index = job.indexes[job.next]
                    self._timeout(index, result, completions)  # stops first with scoring.stop_on_timeout
                    self._stop_if_hung(job)
                    self._restart(w)
                    job.next += 1
                    if job.next == len(job.indexes):
                        del jobs[w]
                    else:
                        self._send(w, job, prompts, completions, columns)

    def _deadline(self, w: int, job: _Job) -> float:
        if job.phase == "starting":
            return job.since + self.settings.start_timeout
        per = self.settings.timeout
        return job.since + (self._slice_limit(len(job.indexes) - job.next) if job.mode == "batch" else per)

    def _slice_limit(self, count: int) -> float:
        """Seconds a user function's call on `count` completions may take."""
        per = self.settings.timeout
        return min(per * count, max(per, SLICE_LIMIT))

    def _send(self, w: int, job: _Job, prompts, completions, columns) -> None:
        """Send the rest of `job` to worker `w` (the deadline starts once the worker is ready)."""
        worker = self._workers[w]
        if worker.process.poll() is not None:  # died while idle (killed, out of memory): a fresh one takes over
            self._restart(w)
            worker = self._workers[w]
        todo = job.indexes[job.next :]
        job.phase = "scoring" if worker.ready else "starting"
        job.since = time.monotonic()
        job.pending = _Slice(
            job.mode,
            [prompts[i] for i in todo],
            [completions[i] for i in todo],
            {k: [v[i] for i in todo] for k, v in columns.items()},
        )
        if worker.ready:
            try:
                worker.conn.send(job.pending)
            except OSError:  # it died between the check and the send: restart and queue the job for it
                self._restart(w)
                job.phase = "starting"

    def _handle(self, w, job, message: Reply, prompts, completions, columns, result) -> bool:
        """Process one message of worker `w`; True when its job is complete."""
        worker = self._workers[w]
        if isinstance(message, _Ready):
            worker.ready = True
            job.phase, job.since = "scoring", time.monotonic()
            worker.conn.send(job.pending)
            return False
        if isinstance(message, _Failed):  # the reward function could not be loaded in the scoring process
            raise RewardError(self._start_problem(message))
        if isinstance(message, _Died) and job.phase == "starting":
            job.start_failures += 1
            if job.start_failures == 1:  # killed from outside before its first job (OOM killer, a stray kill): again
                self._restart(w)
                self._send(w, job, prompts, completions, columns)
                return False
            raise RewardError(
                f"the scoring process for reward function {self.name} exited while starting, twice ({message.how})"
                + address_space_note(self.settings.memory_mb)
            )
        if job.mode == "batch":
            self._handle_batch(job, message, completions, result)
            return True
        index = job.indexes[job.next]
        if isinstance(message, _Scored):
            result.rewards[index] = self._checked(message.values, [completions[index]], index)[0]
        elif isinstance(message, _Raised) and self.builtin:
            result.errors.append(index)
        elif isinstance(message, _Raised):
            raise RewardError(
                f"reward function {self.name} raised {message.error} (while scoring sample {index}: "
                f"{clip(completions[index], 77)!r})"
            )
        elif isinstance(message, _Died):
            if not self.builtin:
                raise RewardError(
                    f"the scoring process of reward function {self.name} died ({message.how}) while scoring sample "
                    f"{index}: {clip(completions[index], 77)!r}" + address_space_note(self.settings.memory_mb)
                )
            result.errors.append(index)  # model output crashed a built-in scorer: that completion scores 0
            self._restart(w)
            job.next += 1
            if job.next < len(job.indexes):
                self._send(w, job, prompts, completions, columns)
            return job.next == len(job.indexes)
        job.next += 1
        job.scored += 1
        job.since = time.monotonic()
        return job.next == len(job.indexes)

    def _handle_batch(self, job, message: Reply, completions, result) -> None:
        """A batch job's answer: every reward of its rows, or the error that stops the run."""
        todo = job.indexes[job.next :]
        where = f"samples {todo[0]}-{todo[-1]}, the first: {clip(completions[todo[0]], 77)!r}"
        if isinstance(message, _Raised):
            raise RewardError(f"reward function {self.name} raised {message.error} (while scoring {where})")
        if isinstance(message, _Died):
            raise RewardError(
                f"the scoring process of reward function {self.name} died ({message.how}) while scoring {where}"
                + address_space_note(self.settings.memory_mb)
            )
        values = self._checked(message.values, [completions[i] for i in todo], todo[0])
        for i, value in zip(todo, values, strict=True):
            result.rewards[i] = value

    def _checked(self, raw: Any, texts: list[str], offset: int) -> list[float]:
        if isinstance(raw, _Unusable):  # not a list: say what it was
            raise RewardError(f"reward function {self.name} must return a list of {len(texts)} floats, got {raw}")
        return validate_rewards(self.name, raw, texts, r_max=self.r_max, offset=offset)

    def _stop_if_hung(self, job: _Job) -> None:
        """Called at a timeout of completion `job.next` in the one-at-a-time retry: with nothing scored yet, every
        completion so far (job.next + 1 of them) timed out."""
        s = self.settings
        hung_after = min(HUNG_AFTER, len(job.indexes))
        if self.builtin or s.on_hung != "stop" or not job.retried or job.scored or job.next + 1 < hung_after:
            return
        raise RewardError(
            f"reward function {self.name} is hung: its call on a slice of {len(job.indexes)} completion(s) ran past "
            f"{self._slice_limit(len(job.indexes)):g}s, then it ran past scoring.timeout={s.timeout:g}s on each "
            f"of the first {hung_after} completion(s) retried alone without returning once. The run stops instead "
            f"of training on scoring.on_timeout={s.on_timeout:g} rewards. If the function is only slow, raise "
            "scoring.timeout or scoring.workers; to score such completions scoring.on_timeout and go "
            "on, set scoring.on_hung=continue."
        )

    def _restart(self, w: int) -> None:
        self._workers[w].stop()
        self._workers[w] = _Worker(self._payload, self.settings.memory_mb)

    def _timeout(self, index: int, result: ScoreResult, completions: Sequence[str]) -> None:
        s = self.settings
        if s.stop_on_timeout:
            raise RewardError(
                f"reward function {self.name} ran past scoring.timeout={s.timeout:g}s on sample {index} "
                f"({clip(completions[index], 77)!r}); the run stops because scoring.stop_on_timeout=true"
            )
        result.rewards[index] = s.on_timeout
        result.timeouts.append(index)

    def _note_timeouts(self, result: ScoreResult, completions: Sequence[str]) -> None:
        before = self.total_timeouts
        self.total_timeouts += len(result.timeouts)
        if self.total_timeouts >= self._next_warning > before:
            while self._next_warning <= self.total_timeouts:
                self._next_warning *= 10
            s = self.settings
            warn(
                f"reward function {self.name} ran past scoring.timeout={s.timeout:g}s on "
                f"{self.total_timeouts} completion(s) so far (the latest: "
                f"{clip(completions[result.timeouts[-1]], 77)!r}); each scored scoring.on_timeout="
                f"{s.on_timeout:g}. Raise scoring.timeout if the function is only slow, or make it return "
                "faster on such text."
            )


def _pick(columns: dict[str, list[Any]], i: int) -> dict[str, list[Any]]:
    return {k: [v[i]] for k, v in columns.items()}


@dataclass
class _Job:
    indexes: list[int]
    mode: str
    next: int = 0
    phase: str = "starting"
    since: float = 0.0
    pending: _Slice | None = None
    retried: bool = False
    """One completion at a time after the slice's call ran past its limit."""
    scored: int = 0
    start_failures: int = 0


class _Worker:
    """One scoring process, connected by a socket pair; started with the parent's `sys.path`."""

    def __init__(self, payload: tuple[str, Any], memory_mb: int | None) -> None:
        parent, child = socket.socketpair()
        code = (
            "import json, os, sys; sys.path[:] = json.loads(os.environ['HACRL_SCORER_PATH']); "
            "from hacrl.driver.scoring import _worker_main; _worker_main(int(sys.argv[1]))"
        )
        env = {**os.environ, "HACRL_SCORER_PATH": json.dumps(sys.path), "HACRL_FAULTS": ""}
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, str(child.fileno())],
            pass_fds=[child.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: killed whole, with whatever the function started
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.conn.send(_Start(payload, memory_mb, os.getpid()))
        self.ready = False
        _LIVE.add(self)

    def receive(self) -> Reply:
        """Its next message; `_Died` when its socket closed."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return _Died(self.exit_description())

    def exit_description(self) -> str:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "its connection closed"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"

    def stop(self) -> None:
        _LIVE.discard(self)
        if self.process.returncode is None:  # not reaped yet: its pid cannot belong to anyone else
            signal_group(self.process.pid, signal.SIGSTOP)  # freeze the group: nothing new starts while we look
            for _ in range(2):  # the function's own processes, also those that left the group (setsid, double fork)
                for pid in descendants(self.process.pid):
                    kill_quietly(pid)
        signal_group(self.process.pid, signal.SIGKILL)  # the group: the function's own children too
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()


_LIVE: set[_Worker] = set()


@atexit.register
def _stop_all() -> None:
    for worker in list(_LIVE):
        worker.stop()


# -- the scoring process ---------------------------------------------------------------------------------------------


def _worker_main(fd: int) -> None:
    conn = Connection(fd)
    start: _Start = conn.recv()
    payload, memory_mb, parent_pid = start.function, start.memory_mb, start.trainer_pid
    # the trainer decides when scoring ends, not Ctrl-C or a TERM: a handler that does nothing, not SIG_IGN, which
    # the reward function's own subprocesses would inherit (and then ignore a TERM from anyone)
    signal.signal(signal.SIGINT, ignore)
    signal.signal(signal.SIGTERM, ignore)
    become_subreaper()
    keeper = os.getpid()
    scoring = os.fork()
    if scoring:
        conn.close()  # the scoring process below holds the connection; here only its keeper stays
        keep(scoring, parent_pid)
    die_with_parent(keeper)
    if memory_mb:
        import resource

        limit = memory_mb * MIB
        inherited = inherited_address_space_limit()
        if inherited is not None and inherited < limit:  # a process cannot raise its hard limit: keep the lower one
            limit = inherited
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        import warnings

        kind, value = payload
        with warnings.catch_warnings():  # a library's SyntaxWarnings when Python first compiles it (cellpylib)
            warnings.simplefilter("ignore", SyntaxWarning)
            fn = import_reward_function(value) if kind == "path" else pickle.loads(value)
    except SystemExit as e:  # sys.exit at import: a message, not a silent end of the process
        conn.send(_Failed(f"its module called sys.exit({e.code!r}) while being imported"))
        return
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, which stops with this message
        conn.send(_Failed(f"{type(e).__name__}: {e}"))
        return
    conn.send(_Ready())
    while True:
        try:
            job: _Slice = conn.recv()
        except (EOFError, OSError):
            return
        if job.mode == "batch":
            try:
                conn.send(_Scored(_portable(fn(prompts=job.prompts, completions=job.completions, **job.columns))))
            except Exception as e:  # noqa: BLE001 - the trainer names the function and sample
                conn.send(_Raised(_describe(e)))
            continue
        for i in range(len(job.completions)):
            try:
                out = fn(prompts=[job.prompts[i]], completions=[job.completions[i]], **_pick(job.columns, i))
                conn.send(_Scored(_portable(out)))
            except Exception as e:  # noqa: BLE001 - as above
                conn.send(_Raised(_describe(e)))


MIB = 1024 * 1024


def inherited_address_space_limit() -> int | None:
    """This process's address-space limit in bytes (`ulimit -v` of the shell that started it), None when unlimited."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    finite = [v for v in (soft, hard) if v != resource.RLIM_INFINITY]
    return min(finite) if finite else None


def address_space_note(memory_mb: int | None) -> str:
    """What to say when a scoring process fails under an inherited address-space limit below `scoring.memory_mb`
    (it cannot be raised from inside): the limit, where it comes from and the fix; "" when there is none."""
    inherited = inherited_address_space_limit()
    if inherited is None or (memory_mb is not None and inherited >= memory_mb * MIB):
        return ""
    asked = f"scoring.memory_mb={memory_mb}" if memory_mb is not None else "no limit (scoring.memory_mb=null)"
    return (
        f"; note: hacrl runs under an address-space limit of {inherited // MIB} MiB inherited from the shell that "
        f"started it (`ulimit -v`), below {asked}, and its scoring processes cannot raise it: run `ulimit -v "
        "unlimited` (or a larger value) before hacrl, or lower scoring.memory_mb"
    )


def _portable(out: Any) -> Any:
    """The function's output in a form that pickles whatever it held: numbers stay numbers, the rest says what
    it was (so the trainer's message can name it)."""
    if not isinstance(out, (list, tuple)):
        return _Unusable(type(out).__name__)
    return [_portable_value(v) for v in out]


def _portable_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item"):
        try:
            return _portable_value(value.item())
        except Exception:  # noqa: BLE001 - not a scalar
            pass
    return _Unusable(f"{type(value).__name__} {clip(repr(value), 57)}")


@dataclass(frozen=True)
class _Unusable:
    """Something a reward function returned that is not a number (shown by name in the error message)."""

    what: str

    def __repr__(self) -> str:
        return self.what


def _describe(e: BaseException) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" at {os.path.basename(where.filename)}:{where.lineno}" if where else ""
    return f"{type(e).__name__}: {clip(str(e), 297)}{at}"


# -- one scorer per reward function and settings, shared by the trainers and evaluations of a process ------------

_SHARED: dict[tuple, Scorer] = {}
_MAX_SHARED = 4


def shared_scorer(fn: RewardFn | str, settings: ScoringConfig, *, builtin: bool, r_max: float) -> Scorer:
    """A `Scorer` for this function and settings, reused across trainers in one process (its processes start
    once); the least recently used is closed when more than a few are alive."""
    key = (fn if isinstance(fn, str) else pickle.dumps(fn), astuple(settings), builtin, r_max)
    scorer = _SHARED.pop(key, None) or Scorer(fn, settings, builtin=builtin, r_max=r_max)
    _SHARED[key] = scorer
    while len(_SHARED) > _MAX_SHARED:
        _SHARED.pop(next(iter(_SHARED))).close()
    return scorer


def math_scorer(scoring: ScoringConfig, *, r_max: float) -> Scorer:
    """The math verifier under the `scoring:` settings, whatever the training reward (the named benchmarks)."""
    return shared_scorer(math_reward(scoring.timeout, scoring.max_answer_chars), scoring, builtin=True, r_max=r_max)


def scorer_for(task, scoring: ScoringConfig, *, r_max: float) -> Scorer:
    """The scorer of a loaded task (`hacrl.tasks.data.TaskData`) under the config's `scoring:` settings."""
    return shared_scorer(task.reward_source, scoring, builtin=task.builtin, r_max=r_max)
