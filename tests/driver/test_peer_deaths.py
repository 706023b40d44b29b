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

import pytest

from hacrl.driver.backends import ranks
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


def _local_group(*targets) -> ranks.LocalRanks:
    context = multiprocessing.get_context("fork")
    group = ranks.LocalRanks.__new__(ranks.LocalRanks)
    group.name, group.processes, group.pipes, group.sampler = "qwen", [], [], False
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
    from hacrl.driver.backends.ray import RayWorkers

    workers = RayWorkers.__new__(RayWorkers)
    workers._ray, workers.names = fake, ["llama", "qwen"]
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
