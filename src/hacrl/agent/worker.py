"""An agent worker: one process of an agent, behind calls that move only text and numbers.

A worker holds the agent's model (`hacrl.agent.model`) and one role or both, by composition: the sampling role
(`hacrl.agent.sampling`: its answers, behaviour log-probs, the proximal pass, its random stream, evaluation) and the
learning role (`hacrl.agent.learning`: the update, the optimizer's checkpoint part, the learner's end of the weight
link). Which part of each batch it handles is a strategy both roles are given (`hacrl.agent.share`):

    AgentWorker(spec)                    the agent's one worker: both roles, the whole batch
    AgentWorker(spec, rank=info)         rank r of a worker group (`agents.<i>.devices`, FSDP2): both roles, rank r's
                                         share; a group answers each call as one worker would (rank 0 replies)
    AgentWorker(spec, role="sampler")    a sampler of its own (`agents.<i>.sampler_devices`): the sampling role only,
                                         on its own device, every rank's share of a group's batch

The driver (`hacrl.driver.trainer.Schedule`) calls it in the driver's process, a rank's process or a Ray actor, with
the same typed messages (`hacrl.messages`):

    sample(SampleCall)      -> Sampled: its trajectories (text, source log-prob sum and token count, finish reason);
                               keeps them, the sampled ids and per-token old log-probs for `learn`
    learn(LearnCall, pool)  -> Learned: its own rewards and the foreign trajectories in, metrics out (spec 2, step 5)
    generate(GenerateCall)  -> completions for evaluation (the driver scores them)
    save(directory) / load(directory) -> its part of a checkpoint (layout: `hacrl.checkpoint`)
    describe()              -> WorkerInfo: name, device, process id

No tensor of a model, no logit and no gradient leaves a worker but over a weight link to its own sampler. Its random
stream is its own (seeded by the run's seed and its index, saved in its checkpoint part), so the numbers do not
depend on where the worker runs or on what the other workers draw.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

import torch

from hacrl import seeds
from hacrl.agent import guards, host_memory
from hacrl.agent.learning import LearningRole
from hacrl.agent.model import Agent
from hacrl.agent.sampling import OwnSamples, SamplingRole
from hacrl.agent.share import Share
from hacrl.agent.weightsync import WeightLink
from hacrl.config.settings import Role
from hacrl.core.sharing import foreign_of
from hacrl.messages import (
    Completion,
    GenerateCall,
    LearnCall,
    Learned,
    OwnRollout,
    SampleCall,
    Sampled,
    Trajectory,
    WorkerInfo,
    WorkerSpec,
)
from hacrl.provenance import ProximalLogprobs


class AgentWorker:
    """One process of one agent (see the module docstring)."""

    def __init__(self, spec: WorkerSpec, *, rank=None, role: Role | None = None) -> None:
        """`rank` (`hacrl.agent.distributed.RankInfo`): this process is that rank of the agent's worker group;
        `role` "sampler": the agent's sampler of its own (its sampling role only)."""
        if spec.torch_threads:
            torch.set_num_threads(spec.torch_threads)
        host_memory.apply(spec.host_memory)
        self.spec, self.index, self.name = spec, spec.index, spec.agent.name
        placement = spec.placement
        if rank is not None:
            from hacrl.agent.distributed import init_group

            init_group(rank)  # before the agent: it shards its model over the group (`Precision.trains == "shards"`)
            share, device = Share.of_rank(rank), rank.device
        elif role == "sampler":
            share = Share.every_rank(placement.ranks) if placement.group else Share.whole()
            device = placement.sampler_device
        else:
            share, device = Share.whole(), None
        self.share = share
        self.agent = Agent(
            spec.index,
            spec.agent,
            spec.rollout,
            with_reference=spec.algorithm.kl_coef > 0,
            weights_from=spec.weights_from,
            init_seed=seeds.adapters(spec.trainer.seed, spec.index),
            device=device,
            role=role or "learner",
        )
        self.sampling = SamplingRole(self.agent, spec, share)
        self.learning = None if role == "sampler" else LearningRole(self.agent, spec, share)
        self._rollout: OwnSamples | None = None
        """What `sample` kept for `learn` (at lag 0)."""

    # -- the calls ---------------------------------------------------------------------------------------------------

    def sample(self, call: SampleCall) -> Sampled:
        """G responses per prompt from the current policy, and their pre-update log-probs (spec 2, steps 1 and 3):
        kept for `learn`, or handed over (`trainer.lag`: the driver gives the rollout back k steps later)."""
        began = time.time()
        rollout, generate_s, logprobs_s, sync_s = self.sampling.sample(call)
        lagged = self.spec.trainer.lag > 0
        self._rollout = None if lagged else rollout
        portable = rollout.portable() if lagged else None
        span = (began, time.time())
        return Sampled(rollout.trajectories, generate_s, logprobs_s, span, rollout=portable, sync_s=sync_s,
                       metrics=rollout.gap_metrics())  # fmt: skip

    def learn(self, call: LearnCall, pool: list[Trajectory] | None = None) -> Learned:
        """One training step's update of this learner on its pool (`LearningRole.learn`). `pool`: the step's whole
        pool, sent once for every learner (`hacrl.driver.trainer.Schedule`), of which it takes the other agents'
        answers as its foreign ones (`foreign_of`: the one place a learner's foreign rows are chosen from a pool)."""
        if self.learning is None:
            raise RuntimeError(f"the sampler of agent {self.name!r} does not learn")
        if pool is not None:
            call = replace(call, foreign=foreign_of(pool, self.index))
        rollout = OwnSamples.from_portable(call.rollout) if call.rollout is not None else self._rollout
        try:
            learned = self.learning.learn(call, rollout, self.sampling.proximal_pass)
        finally:
            self._rollout = None
        if self.share.collective:
            self.agent.sync_sampling_weights()  # a gather: on every rank here, once per update, never in `generate`
        return learned

    def generate(self, call: GenerateCall) -> list[Completion]:
        return self.sampling.generate(call)

    def proximal(self, step: int, rollout: OwnRollout) -> ProximalLogprobs:
        return self.sampling.proximal(step, rollout)

    def save(self, directory: str) -> None:
        """Its agent's part of a checkpoint (a sampler of its own writes nothing: its stream is saved by its learner,
        `adopt_stream`, and its weights are the learner's)."""
        if self.learning is not None:
            self.learning.save(directory, self.sampling.streams[0])

    def load(self, directory: str) -> None:
        """The optimizer state, update count and random stream(s) of a checkpoint (the weights were loaded at
        construction)."""
        if self.learning is not None:
            self.learning.load(directory)
        who = f"agent {self.name!r}" if self.learning is not None else f"the sampler of agent {self.name!r}"
        self.sampling.load(directory, who)

    def describe(self) -> WorkerInfo:
        device = str(self.agent.device)
        if self.learning is None:
            device += " (sampler)"
        elif self.share.collective:
            device += f" (rank {self.share.rank} of {self.share.world})"
        return WorkerInfo(name=self.name, device=device, pid=os.getpid())

    # -- between an agent's two roles (a sampler of its own) ---------------------------------------------------------

    def stream(self) -> dict | list[dict]:
        return self.sampling.stream()

    def adopt_stream(self, rng: dict | list[dict]) -> None:
        """Take its sampler's stream as its own (saved in its checkpoint part: the agent's sampling stream)."""
        self.sampling.adopt(rng)

    def open_weight_link(self, across_machines: bool) -> WeightLink | None:
        return self.learning.open_weight_link(across_machines)

    def send_weights(self, step: int):
        return self.learning.send_weights(step)

    def attach_weight_link(self, link: WeightLink) -> None:
        self.sampling.attach(link)

    def receive_weights(self, step: int, sent=None) -> None:
        self.sampling.receive(step, sent)

    def memory(self) -> dict[str, int]:
        """This worker's device memory (`guards.device_memory`); benchmarks ask it of workers in other processes."""
        return guards.device_memory(self.agent.device)
