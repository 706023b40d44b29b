"""A kill -9 of one rank reaches its peers first as a collective's error (gloo: 'Connection reset by peer'), and only
then as the death it is. Both backends give the other ranks a grace and report the death, naming agent and rank;
an error with no dead peer is raised as itself. (The whole-run version, with real gloo ranks, is in
test_worker_groups.py and test_backends.py; here the order of the two news is forced, which a real run only
sometimes gives: CI once saw the RuntimeError win.)"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import deque

import pytest

from hacrl.config import DeadlineConfig
from hacrl.driver.backends import ranks
from hacrl.driver.supervision import Deadlines, kind_of
from hacrl.errors import WorkerError

PEER_ERROR = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")


def _answers_with_the_collective_error(conn) -> None:
    conn.send(("error", PEER_ERROR))
    time.sleep(30)


def _dies_a_moment_later(conn) -> None:
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)


def _stays_alive(conn) -> None:
    time.sleep(30)


def _local_group(*targets) -> ranks.LocalProcesses:
    context = multiprocessing.get_context("fork")
    group = ranks.LocalProcesses.__new__(ranks.LocalProcesses)
    group.name, group.processes, group.pipes, group.sampler = "qwen", [], [], False
    group.deadlines, group._answered = Deadlines(), 0.0
    group._calls = deque([("sampling at step #", time.monotonic())])  # the call the test collects
    group._waiting = deque()
    for target in targets:
        ours, theirs = context.Pipe()
        process = context.Process(target=target, args=(theirs,), daemon=True)
        process.start()
        theirs.close()
        group.processes.append(process)
        group.pipes.append(ours)
    return group


def test_local_ranks_report_the_dead_peer_not_the_error_it_caused():
    group = _local_group(_answers_with_the_collective_error, _dies_a_moment_later)
    expected = r"rank 1 of agent 'qwen' .*died while sampling at step 2 \(killed by SIGKILL\)"
    with pytest.raises(WorkerError, match=expected):
        group._replies("sampling at step 2")
    assert group.processes == []  # the group is stopped


def test_local_ranks_raise_an_error_as_itself_when_no_peer_died(monkeypatch):
    monkeypatch.setattr(ranks, "PEER_GRACE_S", 0.5)
    group = _local_group(_answers_with_the_collective_error, _stays_alive)
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        group._replies("sampling at step 2")
    assert group.processes == []


class _FakeRay:
    """Ray's wait/get over scripted refs: `order` is the order in which the refs become ready, `outcomes` what
    `get` gives for each (a value, or an exception to raise)."""

    class exceptions:  # noqa: N801 - the shape of the ray module
        class RayTaskError(Exception):
            def __init__(self, cause):
                super().__init__(str(cause))
                self.cause = cause

        class RayActorError(Exception):
            pass

    def __init__(self, order, outcomes):
        self.order, self.outcomes = list(order), outcomes

    def wait(self, refs, num_returns=1, timeout=None):
        ready = [r for r in self.order if r in refs][:num_returns]
        return ready, [r for r in refs if r not in ready]

    def get(self, ref):
        outcome = self.outcomes[ref]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def _ray_workers(fake):
    from hacrl.driver.backends.ray import RayTransport

    workers = RayTransport.__new__(RayTransport)
    workers._ray, workers.names, workers.deadlines, workers._placed = fake, ["llama", "qwen"], Deadlines(), {}
    workers.owners = [(0, None), (1, 0), (1, 1)]  # llama; qwen rank 0, qwen rank 1
    return workers


def test_ray_reports_the_dead_rank_even_when_its_peers_error_comes_first():
    ex = _FakeRay.exceptions
    outcomes = {
        "llama": "sampled",
        "qwen0": ex.RayTaskError(PEER_ERROR),
        "qwen1": ex.RayActorError("The actor died unexpectedly before finishing this task."),
    }
    workers = _ray_workers(_FakeRay(["llama", "qwen0", "qwen1"], outcomes))
    with pytest.raises(WorkerError, match=r"agent 'qwen' \(rank 1\) died while sampling at step 2 \(The actor died"):
        workers._gather(["llama", "qwen0", "qwen1"], "sampling at step 2")


def test_ray_raises_a_ranks_error_as_itself_when_its_peers_live():
    ex = _FakeRay.exceptions
    outcomes = {"llama": "sampled", "qwen0": ex.RayTaskError(PEER_ERROR), "qwen1": "sampled"}
    workers = _ray_workers(_FakeRay(["qwen0", "llama", "qwen1"], outcomes))
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        workers._gather(["llama", "qwen0", "qwen1"], "sampling at step 2")


def test_ray_names_a_dead_sampler_actor_and_does_not_wait_for_peers_of_a_sampler():
    ex = _FakeRay.exceptions
    workers = _ray_workers(_FakeRay(["qwen-sampler"], {"qwen-sampler": ex.RayActorError("gone")}))
    with pytest.raises(WorkerError, match=r"agent 'qwen' \(sampler\) died while sampling at step 3 \(gone\)"):
        workers._gather(["qwen-sampler"], "sampling at step 3", [(1, "sampler")])
    workers = _ray_workers(_FakeRay(["qwen-sampler"], {"qwen-sampler": ex.RayTaskError(ValueError("its own"))}))
    with pytest.raises(ValueError, match="its own"):  # no grace: a sampler has no peers in a collective
        workers._gather(["qwen-sampler"], "sampling at step 3", [(1, "sampler")])


# -- silence: a call's deadline (runtime.deadline) ------------------------------------------------------------------


def test_a_calls_deadline_is_the_first_call_allowance_then_a_multiple_of_its_kinds_slowest_answer():
    deadlines = Deadlines(DeadlineConfig(first_call=600, factor=10, minimum=30))
    kind = kind_of("sampling at step 12")
    assert kind == kind_of("sampling at step 3") == "sampling at step #" != kind_of("evaluating at step 3")
    assert deadlines.limit(kind) == 600 and "first_call=600" in deadlines.rule(kind)
    deadlines.observe(kind, 1.5)
    assert deadlines.limit(kind) == 30  # 10 x 1.5 = 15, at least 30
    deadlines.observe(kind, 4.0)
    deadlines.observe(kind, 2.0)  # the slowest answer counts
    assert deadlines.limit(kind) == 40 and "(4.0 s)" in deadlines.rule(kind)
    assert deadlines.limit("evaluating at step #") == 600  # each kind its own
    huge = Deadlines(DeadlineConfig(factor=1e300))  # issue 87.2: never past what the operating system can wait
    huge.observe(kind, 2.0)
    assert huge.limit(kind) == DeadlineConfig.LONGEST == 1e6


def test_a_deadline_longer_than_any_wait_is_refused_before_the_run(tiny_agents, tmp_path, capsys):
    """Issue 87.2: `runtime.deadline.first_call=1e7` (anything over ~2.1e6 s, also 1e300 or inf) was accepted, then
    the first call to a worker died with `OverflowError: timeout is too large`."""
    from tests.conftest import fails_cleanly, pair_config

    cfg = pair_config(tiny_agents, tmp_path)
    for key, value in (("first_call", "1e7"), ("first_call", "1e300"), ("minimum", "3e6")):
        fails_cleanly(capsys, ["train", str(cfg), f"runtime.deadline.{key}={value}"], f"runtime.deadline.{key} is",
                      "over the longest deadline hacrl can wait (1e+06 s, 11.6 days): set it to at most")  # fmt: skip
    assert not (tmp_path / "run").exists()
    from multiprocessing import Pipe
    from multiprocessing.connection import wait

    mine, theirs = Pipe()
    theirs.send("answer")  # the wait a worker group's call makes (ranks.py) takes the longest deadline
    assert wait([mine], timeout=DeadlineConfig.LONGEST) == [mine]
    with pytest.raises(OverflowError):
        wait([mine], timeout=1e7)


def test_a_rank_that_does_not_answer_is_named_and_the_group_killed_at_the_deadline():
    group = _local_group(_stays_alive, _stays_alive)
    group.deadlines = Deadlines(DeadlineConfig(first_call=0.5))
    pids = [p.pid for p in group.processes]
    os.kill(pids[1], signal.SIGSTOP)  # the stopped rank is named, not rank 0 (silent too, waiting for it)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank 1 of agent 'qwen' \(pid \d+\) did not answer within 0\.\d s while "
                       r"sampling at step 2; it is stopped \(SIGSTOP.*first_call=0.5 s"):  # fmt: skip
        group._replies("sampling at step 2")
    assert time.monotonic() - start < 5
    assert group.processes == [] and not any(os.path.exists(f"/proc/{pid}/stat") and _state(pid) != "Z" for pid in pids)


def _state(pid: int) -> str:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return "gone"
    return stat[stat.rfind(")") + 2]


def test_ray_names_an_actor_silent_past_its_deadline():
    workers = _ray_workers(_FakeRay(["llama", "qwen0"], {"llama": "sampled", "qwen0": "sampled"}))
    workers.deadlines = Deadlines(DeadlineConfig(first_call=0.2))
    with pytest.raises(WorkerError, match=r"agent 'qwen' \(rank 1\) did not answer within 0\.\d s while "
                       "sampling at step 2"):  # fmt: skip
        workers._gather(["llama", "qwen0", "qwen1"], "sampling at step 2")
