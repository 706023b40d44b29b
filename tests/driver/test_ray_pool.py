"""The step's pool is shared once (`Transport.share`: one object in Ray's store): each learner's call carries it,
not its own copy of every other agent's answers (N copies would grow as N^2 in the object store), and the learner
rebuilds exactly the foreign list the driver computed (`foreign_of`). A scripted transport, no Ray started: the
end-to-end identity of the two backends is `test_backends.py`'s."""

from __future__ import annotations

from types import SimpleNamespace

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


def _schedule(transport, n):
    from hacrl.driver.schedule import Schedule

    specs = [SimpleNamespace(placement=SimpleNamespace(sampler_device=None)) for _ in range(n)]
    return Schedule(transport, specs)


def test_the_pool_is_shared_once_and_each_learner_rebuilds_its_foreign_answers():
    pool, transport, frozen = _pool(), _Transport(), 2
    calls = [
        LearnCall(1, [1.0, 0.0], [] if k == frozen else foreign_of(pool, k, shared=True), [0.5] * 3) for k in range(3)
    ]
    assert _schedule(transport, 3)._submit_learns(calls) == [1, 2, 3]
    (shared,) = transport.shared  # one copy of the pool
    assert [t.source for t in shared] == [0, 0, 1, 1, 2, 2]
    for k, (agent, role, method, args) in enumerate(transport.sent):
        assert (agent, role, method) == (k, "learner", "learn")
        if k == frozen:  # nothing to share: the call as it is, no reference
            assert args == (calls[k],)
            continue
        call, ref = args
        assert call.foreign == [] and ref == "obj-0"
        assert foreign_of(shared, k) == calls[k].foreign  # what `AgentWorker.learn(call, pool)` takes


def test_a_step_where_no_learner_takes_foreign_answers_sends_the_calls_as_they_are():
    transport = _Transport()
    calls = [LearnCall(1, [1.0], [], [0.5, 0.5]) for _ in range(2)]
    _schedule(transport, 2)._submit_learns(calls)
    assert transport.shared == [] and [args for *_, args in transport.sent] == [(c,) for c in calls]
