"""`runtime.backend: local`: every worker lives in the driver's process and is called in agent order; an agent on
its own devices (`agents.<i>.devices`) is a group of K local processes (`hacrl.driver.backends.ranks`), and an agent
with a sampler of its own (`agents.<i>.sampler_devices`, `trainer.lag` >= 1) has one more process that samples while
its learner learns (`hacrl.agent.sampler_worker`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from hacrl.agent.worker import AgentWorker
from hacrl.driver.backends import T, WorkerGroup
from hacrl.driver.backends.ranks import LocalRanks
from hacrl.messages import LearnCall, Learned, SampleCall, Sampled, WorkerSpec


class LocalWorkers(WorkerGroup):
    def __init__(self, runtime, specs: list[WorkerSpec]) -> None:
        self.workers: list[Any] = []
        self.samplers: list[LocalRanks | None] = []
        self.names = [spec.agent.name for spec in specs]
        self.specs = specs
        deadlines = runtime.deadline
        try:
            for spec in specs:
                worker = LocalRanks(spec, deadlines=deadlines) if spec.agent.devices else AgentWorker(spec)
                self.workers.append(worker)
                sampled_apart = spec.placement.sampler_device is not None
                channel = worker.open_weight_channel(*_channel_kind(spec)) if sampled_apart else None
                sampler = LocalRanks(spec, channel=channel, deadlines=deadlines) if channel is not None else None
                self.samplers.append(sampler)
        except BaseException:
            self.close()
            raise

    def _map(self, method: str, args: Sequence[tuple], what: str) -> list[Any]:
        return [self._call(j, method, a, what) for j, a in enumerate(args)]

    def sample(self, calls: Sequence[SampleCall]) -> list[Sampled]:
        what = f"sampling at step {calls[0].step}"
        return self._end_sampling(self._begin_sampling(calls, what), what)

    def sample_then_learn(
        self, samples: Sequence[SampleCall], learns: Sequence[LearnCall], between: Callable[[list[Sampled]], T]
    ) -> tuple[list[Sampled], T, list[Learned]]:
        """With samplers of their own: they sample while the learners learn here, then `between`; otherwise as
        `WorkerGroup`'s (every sample, then `between` beside the learns)."""
        if not any(self.samplers):
            return super().sample_then_learn(samples, learns, between)
        what = f"sampling at step {samples[0].step}"
        learns, deferred = self._proximal_on_samplers(learns)
        own = self._begin_sampling(samples, what)
        learned = self.learn(learns)
        for handle in deferred:  # taken by its learner unless every row after its first mini-batch was empty
            handle()
        sampled = self._end_sampling(own, what)
        self._broadcast_weights(learns)
        return sampled, between(sampled), learned

    def _broadcast_weights(self, learns: Sequence[LearnCall]) -> None:
        """Each broadcast channel's transfer of the weights after this step's update (`BroadcastWeights`): the
        sampler receives while its learner sends, both idle now."""
        for j, (sampler, call) in enumerate(zip(self.samplers, learns, strict=True)):
            spec = self.specs[j]
            if sampler is None or spec.agent.frozen or not spec.placement.broadcasts:
                continue
            what = f"handing over the weights after update {call.step}"
            sampler.submit("recv_weights", (call.step,), what)
            try:
                self._call(j, "send_weights", (call.step,), what)
            except Exception:
                sampler.raise_if_dead(what)  # a sampler that died mid-transfer is the cause, named
                sampler.collect(what)  # ... or one that is silent (past its deadline) or failed on its side
                raise
            sampler.collect(what)

    def _proximal_on_samplers(self, learns: Sequence[LearnCall]) -> tuple[list[LearnCall], list[_Reply]]:
        """Each sampler first computes its learner's proximal log-probs (`SamplerWorker.proximal`), the learner
        taking them after its first optimizer step; for learners in this process with rows after their first
        mini-batch (a worker group's ranks compute theirs)."""
        calls, deferred = list(learns), []
        for j, (sampler, call) in enumerate(zip(self.samplers, learns, strict=True)):
            spec = self.specs[j]
            first = spec.trainer.mini_batch_size
            if sampler is None or spec.agent.devices or spec.agent.frozen or call.rollout is None:
                continue
            if len(call.rollout.response_ids) <= first:
                continue
            what = f"computing proximal log-probs for step {call.step}"
            sampler.submit("proximal", (call.step, call.rollout, first), what)
            deferred.append(_Reply(sampler, what))
            calls[j] = replace(call, proximal=deferred[-1])
        return calls, deferred

    def _begin_sampling(self, calls: Sequence[SampleCall], what: str) -> dict[int, Sampled]:
        """Send each sampler of its own its call (it samples meanwhile), then sample the other agents here."""
        for sampler, call in zip(self.samplers, calls, strict=True):
            if sampler is not None:
                sampler.submit("sample", (call,), what)
        return {j: self._call(j, "sample", (c,), what) for j, c in enumerate(calls) if self.samplers[j] is None}

    def _end_sampling(self, own: dict[int, Sampled], what: str) -> list[Sampled]:
        """Every agent's batch in agent order: the ones sampled here, and the samplers' answers."""
        return [own[j] if sampler is None else sampler.collect(what) for j, sampler in enumerate(self.samplers)]

    def save(self, directory: str, *, what: str) -> None:
        """Each learner saves its agent's part, a sampler's stream in it as the agent's (`AgentWorker.adopt_stream`)."""
        for j, sampler in enumerate(self.samplers):
            if sampler is not None:
                self._call(j, "adopt_stream", (sampler.call("stream", (), what),), what)
        super().save(directory, what=what)

    def load(self, directory: str) -> None:
        super().load(directory)
        for sampler in self.samplers:
            if sampler is not None:
                sampler.call("load", (directory,), "loading its checkpoint part")

    def pids(self) -> list[int]:
        """The processes of the agents' ranks and samplers (tests kill one)."""
        return [p for w in [*self.workers, *self.samplers] if isinstance(w, LocalRanks) for p in w.pids()]

    def _call(self, j: int, method: str, args: tuple, what: str) -> Any:
        worker = self.workers[j]
        return worker.call(method, args, what) if isinstance(worker, LocalRanks) else getattr(worker, method)(*args)

    def close(self, *, force: bool = False) -> None:
        for worker in [*self.workers, *self.samplers]:
            if isinstance(worker, LocalRanks):
                worker.close(force=force)
        self.workers, self.samplers = [], []


def _channel_kind(spec: WorkerSpec) -> tuple[type, dict | None]:
    """The weight channel of an agent with a sampler of its own on this machine: shared memory, or a broadcast."""
    from hacrl.agent.weightsync import BroadcastWeights, WeightChannel
    from hacrl.driver.backends.ranks import free_port

    placement = spec.placement
    if not placement.broadcasts:
        return WeightChannel, None
    return BroadcastWeights, {"init": f"tcp://127.0.0.1:{free_port()}", "backend": placement.link_backend}


class _Reply:
    """A sampler's reply to a call submitted earlier, collected once, when first asked for (its pipe answers in
    order, so it must be collected before the sampler's next reply)."""

    def __init__(self, sampler: LocalRanks, what: str) -> None:
        self.sampler, self.what, self.taken, self.value = sampler, what, False, None

    def __call__(self) -> Any:
        if not self.taken:
            self.value, self.taken = self.sampler.collect(self.what), True
        return self.value
