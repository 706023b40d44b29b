"""An agent's sampler of its own (`agents.<i>.sampler_devices`, with `trainer.lag` >= 1): a process that holds the
agent's compute-dtype weights, its sampler and its old-log-prob pass, and samples while the learner learns.

It is an `AgentWorker` of the same agent in the sampler's role (no optimizer, no reference) on its own device
(`Placement.sampler_device`, `Precision.of_sampler`), drawing from the
same stream the learner's worker would have drawn from (`seeds.training(seed, index)`), so a run with a sampler
samples what the same run without one samples. Before sampling batch s it takes the weights after update
s - 1 - lag from the learner (`hacrl.agent.weightsync.WeightChannel`) unless it holds them. Its stream travels in
the learner's checkpoint part (the backend hands it over before a save, `AgentWorker.adopt_stream`), so a
checkpoint looks the same with or without a sampler and resumes either way.

For an agent on a worker group (`agents.<i>.devices`, FSDP2): rank 0 writes the group's whole compute copy after
each update (the gather every rank does anyway), and the sampler draws rank r's share of each batch from rank r's
stream, so the run is again the one without a sampler; each rank saves its own stream back.

It also computes its learner's proximal log-probs (`proximal`: the own rows after the first mini-batch, under the
weights update s starts from, which are the ones it samples batch s + lag with) while the learner trains its first
mini-batch: that pass leaves the learner, whose update is the longer role where sampling and learning take similar
time.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from hacrl import faults, seeds
from hacrl.agent.sharded import rank_share
from hacrl.agent.weightsync import BroadcastWeights, HandedWeights, WeightChannel
from hacrl.agent.worker import AgentWorker, OwnSamples
from hacrl.checkpoint import agent_part, read_rng
from hacrl.messages import LearnCall, Learned, OwnRollout, SampleCall, Sampled, WorkerInfo, WorkerSpec

Channel = WeightChannel | HandedWeights | BroadcastWeights


class SamplerWorker(AgentWorker):
    def __init__(self, spec: WorkerSpec, channel: Channel) -> None:
        placement = spec.placement
        self.world = placement.ranks
        """The ranks of its learner's worker group (1: one worker): it samples rank r's share of every batch from
        rank r's stream, as the group would have (`rank_share`, `seeds.rank`)."""
        # the sampler's role: its compute-dtype weights on its own device, nothing stepped (`Precision.of_sampler`;
        # a LoRA agent's keeps the adapters, its old log-probs the learner's)
        super().__init__(spec, device=placement.sampler_device, role="sampler")
        self._streams = [self._seeded(r) for r in range(self.world)] if self.world > 1 else []
        self.channel = channel
        self.lag = spec.trainer.lag
        self.learns = not spec.agent.frozen  # a frozen agent's weights never change: nothing to take
        self.version = 0
        """The update whose weights it holds (0: the starting weights; a resumed run's: its checkpoint's step)."""
        self._sync_s = 0.0
        """Seconds spent taking weights since the last batch (reported with it as `Sampled.sync_s`)."""

    def _seeded(self, rank: int) -> dict:
        """Rank `rank`'s stream of a worker group, as `ShardedWorker.stream_seed` seeds it."""
        with torch.random.fork_rng(devices=self._cuda_devices):
            torch.manual_seed(seeds.rank(self.stream_seed(), rank))
            return self._capture_rng()

    def sample(self, call: SampleCall) -> Sampled:
        self._take(max(0, call.step - 1 - self.lag))
        sync_s, self._sync_s = self._sync_s, 0.0
        if self.world == 1:
            return replace(super().sample(call), sync_s=sync_s)
        began, parts, generate_s, logprobs_s = time.time(), [], 0.0, 0.0
        self.agent.sync_sampling_weights()
        for rank in range(self.world):  # each rank's share from its stream, in rank order: what the group samples
            self._rng = self._streams[rank]
            part, g, lp = self._sample_share(call, rank_share(len(call.prompts), rank, self.world))
            self._streams[rank] = self._rng
            parts.append(part)
            generate_s, logprobs_s = generate_s + g, logprobs_s + lp
        rollout = OwnSamples.joined(call.step, parts)
        return replace(self._sampled(rollout, generate_s, logprobs_s, began), sync_s=sync_s)

    def proximal(self, step: int, rollout: OwnRollout, first: int) -> list[list[float]]:
        """The proximal log-probs of its learner's update `step` for the own rows of `rollout` from `first` on: under
        the weights after update step - 1 (the update's starting weights, which it then samples batch step + lag
        with), by the learner's own pass (`_old_logprobs`), so the values are the learner's. As lists of floats (the
        float32 values exactly): a tensor would travel as shared memory this process hands over, lost if it dies
        before the learner reads the reply."""
        self._take(max(0, step - 1))
        with self._guarded("proximal log-probs", step):
            values = [x.tolist() for x in self._old_logprobs(OwnSamples.from_portable(rollout).samples[first:])]
        faults.hit("proximal")
        return values

    def recv_weights(self, step: int) -> None:
        """A broadcast channel's transfer of the weights after update `step` (its learner sends meanwhile)."""
        self._sync_s += self.channel.recv(self.agent.handed_over(), step)
        self.agent.weights_changed()
        self.version = step

    def _take(self, wanted: int) -> None:
        """Hold the weights after update `wanted` (taken from the learner unless held already)."""
        if self.learns and wanted != self.version:
            self._sync_s += self.channel.take(self.agent.handed_over(), wanted)
            self.agent.weights_changed()
            self.version = wanted

    def learn(self, call: LearnCall) -> Learned:
        raise RuntimeError(f"the sampler of agent {self.name!r} does not learn")

    def stream(self) -> dict | list[dict]:
        """Its random stream now (the learner saves it as the agent's, `AgentWorker.adopt_stream`); for a worker
        group's, each rank's (rank r saves the r-th, `ShardedWorker.adopt_stream`)."""
        return self._rng if self.world == 1 else list(self._streams)

    def save(self, directory: str) -> None:
        """Nothing: its stream is saved by the learner, its weights are the learner's."""

    def load(self, directory: str) -> None:
        """The agent's stream from a checkpoint (its weights were loaded at construction), and which update's
        weights those are."""
        part = agent_part(directory, self.name)
        if self.world == 1:
            self._rng, _ = read_rng(part.rng_file, f"the sampler of agent {self.name!r}")
        else:
            for rank in range(self.world):  # a rank with no stream there keeps its fresh one, as a group's rank does
                if part.rank_rng_file(rank).is_file():
                    what = f"the sampler of agent {self.name!r}, rank {rank}'s stream"
                    self._streams[rank], _ = read_rng(part.rank_rng_file(rank), what)
        self.version = int(json.loads((Path(directory) / "state.json").read_text())["step"])

    def describe(self) -> WorkerInfo:
        info = super().describe()
        return replace(info, device=f"{info.device} (sampler)")
