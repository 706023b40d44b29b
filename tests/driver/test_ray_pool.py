"""On Ray the step's pool goes into the object store once: each learner's call carries a reference to it, not its own
copy of every other agent's answers (N copies would grow as N^2 in the object store), and the actor rebuilds exactly
the foreign list the driver would have sent (`foreign_of`). Scripted actors, no Ray started: the end-to-end
identity of the two backends is `test_backends.py`'s."""

from __future__ import annotations

from hacrl.core.sharing import foreign_of
from hacrl.messages import LearnCall, Trajectory


def _pool() -> list[Trajectory]:
    return [Trajectory(g, f"{s}-{g}", 1.0, s, -1.0, 2, "eos", 3) for s in (0, 1, 2) for g in (0, 1)]


class _Method:
    def __init__(self, log: list, actor: int, name: str) -> None:
        self.log, self.actor, self.name = log, actor, name

    def remote(self, *args):
        self.log.append((self.actor, self.name, args))
        return f"ref-{len(self.log)}"


class _ScriptedActor:
    def __init__(self, log: list, i: int) -> None:
        self.learn = _Method(log, i, "learn")
        self.call = _Method(log, i, "call")


class _Store:
    def __init__(self) -> None:
        self.objects: dict[str, object] = {}

    def put(self, value):
        self.objects[f"obj-{len(self.objects)}"] = value
        return f"obj-{len(self.objects) - 1}"


def test_the_pool_is_put_once_and_each_actor_rebuilds_its_foreign_answers():
    from hacrl.driver.backends.ray import RayWorkers, _Actor

    pool, log, store = _pool(), [], _Store()
    workers = RayWorkers.__new__(RayWorkers)
    workers._ray, workers.groups = store, [[_ScriptedActor(log, i)] for i in range(3)]
    frozen = 2
    calls = [
        LearnCall(1, [1.0, 0.0], [] if k == frozen else foreign_of(pool, k, shared=True), [0.5] * 3) for k in range(3)
    ]
    refs, first = workers._submit_learns(calls)
    assert first == [0, 1, 2] and len(store.objects) == 1  # one copy of the pool
    (shared,) = store.objects.values()
    assert [t.source for t in shared] == [0, 0, 1, 1, 2, 2]
    for k, (actor, method, args) in enumerate(log):
        assert actor == k and method == "learn"
        call, ref = args
        if k == frozen:  # nothing to share: the call as it is, no reference
            assert ref is None and call.foreign == []
            continue
        assert call.foreign == [] and ref == "obj-0"

        class Worker:  # what the actor's `learn` hands to the worker
            index = k

            def learn(self, c):
                return c.foreign

        actor_side = _Actor.__new__(_Actor)
        actor_side.worker = Worker()
        assert actor_side.learn(call, shared) == calls[k].foreign


def test_a_step_where_no_learner_takes_foreign_answers_sends_the_calls_as_they_are():
    from hacrl.driver.backends.ray import RayWorkers

    log, store = [], _Store()
    workers = RayWorkers.__new__(RayWorkers)
    workers._ray, workers.groups = store, [[_ScriptedActor(log, i)] for i in range(2)]
    calls = [LearnCall(1, [1.0], [], [0.5, 0.5]) for _ in range(2)]
    workers._submit_learns(calls)
    assert store.objects == {} and [(a, m) for a, m, _ in log] == [(0, "call"), (1, "call")]
