"""The step's pool is shared once (`Transport.share`: one object in Ray's store): each learner's call carries it,
not its own copy of every other agent's answers (N copies would grow as N^2 in the object store), and the learner
takes its foreign answers from it (`foreign_of`, applied in the worker only). A scripted transport, no Ray started: the
end-to-end identity of the two backends is `test_backends.py`'s."""

from __future__ import annotations

from hacrl.core.sharing import foreign_of
from hacrl.messages import LearnCall, Trajectory


def _pool() -> list[Trajectory]:
    return [Trajectory(g, f"{s}-{g}", 1.0, s, -1.0, 2, "eos", 3) for s in (0, 1, 2) for g in (0, 1)]


class _Transport:
    """Records what is sent and shared."""

    names, concurrent, across_machines = ["a", "b", "c"], True, True

    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.shared: list[object] = []

    def submit(self, agent, role, method, args, what):
        self.sent.append((agent, role, method, args))
        return len(self.sent)

    def share(self, value):
        self.shared.append(value)
        return f"obj-{len(self.shared) - 1}"


def _schedule(transport, n, frozen=()):
    from hacrl.config import AgentConfig, AlgorithmConfig, RolloutConfig, TrainerConfig
    from hacrl.driver.trainer import Schedule
    from hacrl.messages import WorkerSpec

    specs = [
        WorkerSpec(
            i,
            AgentConfig(name=f"a{i}", model="m", frozen=i in frozen),
            RolloutConfig(),
            TrainerConfig(),
            AlgorithmConfig(name="hacpo"),
            num_agents=n,
        )  # fmt: skip
        for i in range(n)
    ]
    return Schedule(transport, specs)


def test_the_pool_is_shared_once_and_each_learner_takes_its_foreign_answers_from_it():
    pool, transport, frozen = _pool(), _Transport(), 2
    calls = [LearnCall(1, [1.0, 0.0], [], [0.5] * 3) for _ in range(3)]
    assert _schedule(transport, 3, frozen=(frozen,))._submit_learns(calls, pool) == [1, 2, 3]
    (shared,) = transport.shared  # one copy of the pool, the whole of it
    assert shared is pool
    for k, (agent, role, method, args) in enumerate(transport.sent):
        assert (agent, role, method) == (k, "learner", "learn")
        if k == frozen:  # a frozen learner trains on nothing: the call as it is, no reference
            assert args == (calls[k],)
            continue
        assert args == (calls[k], "obj-0")
        assert [(t.source, t.group) for t in foreign_of(shared, k)] == [  # what `AgentWorker.learn(call, pool)` takes
            (s, g) for s in (0, 1, 2) if s != k for g in (0, 1)
        ]


def test_a_step_where_no_learner_takes_foreign_answers_sends_the_calls_as_they_are():
    """No sharing (pool None), one agent (no other agent's answer), or every learner frozen: no reference."""
    for pool, n, frozen in [(None, 2, ()), (_pool()[:2], 1, ()), (_pool()[:4], 2, (0, 1))]:
        transport = _Transport()
        calls = [LearnCall(1, [1.0], [], [0.5] * n) for _ in range(n)]
        _schedule(transport, n, frozen)._submit_learns(calls, pool)
        assert transport.shared == [] and [args for *_, args in transport.sent] == [(c,) for c in calls]
