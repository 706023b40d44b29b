"""An agent's sampler of its own (`agents.<i>.sampler_devices`, with `trainer.lag` >= 1): a process that holds the
agent's compute-dtype weights, its sampler and its old-log-prob pass, and samples while the learner learns.

It is an `AgentWorker` of the same agent, frozen (no optimizer, no reference) on its own device, drawing from the
same stream the learner's worker would have drawn from (`seeds.training(seed, index)`), so a run with a sampler
samples what the same run without one samples. Before sampling batch s it takes the weights after update
s - 1 - lag from the learner (`hacrl.agent.weightsync.WeightChannel`) unless it holds them. Its stream travels in
the learner's checkpoint part (the backend hands it over before a save, `AgentWorker.adopt_stream`), so a
checkpoint looks the same with or without a sampler and resumes either way.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from hacrl.agent.weightsync import HandedWeights, WeightChannel
from hacrl.agent.worker import AgentWorker
from hacrl.checkpoint import agent_part, read_rng
from hacrl.messages import LearnCall, Learned, SampleCall, Sampled, WorkerInfo, WorkerSpec


class SamplerWorker(AgentWorker):
    def __init__(self, spec: WorkerSpec, channel: WeightChannel | HandedWeights, device: str) -> None:
        agent = replace(spec.agent, frozen=True, device=device, sampler_devices=None)
        super().__init__(replace(spec, agent=agent, algorithm=replace(spec.algorithm, kl_coef=0.0)), device=device)
        self.channel = channel
        self.lag = spec.trainer.lag
        self.learns = not spec.agent.frozen  # a frozen agent's weights never change: nothing to take
        self.version = 0
        """The update whose weights it holds (0: the starting weights; a resumed run's: its checkpoint's step)."""

    def sample(self, call: SampleCall) -> Sampled:
        wanted, sync_s = max(0, call.step - 1 - self.lag), 0.0
        if self.learns and wanted != self.version:
            sync_s = self.channel.take(self.agent.sampling_model, wanted)
            self.agent.weights_changed()
            self.version = wanted
        return replace(super().sample(call), sync_s=sync_s)

    def learn(self, call: LearnCall) -> Learned:
        raise RuntimeError(f"the sampler of agent {self.name!r} does not learn")

    def stream(self) -> dict:
        """Its random stream now (the learner saves it as the agent's, `AgentWorker.adopt_stream`)."""
        return self._rng

    def save(self, directory: str) -> None:
        """Nothing: its stream is saved by the learner, its weights are the learner's."""

    def load(self, directory: str) -> None:
        """The agent's stream from a checkpoint (its weights were loaded at construction), and which update's
        weights those are."""
        self._rng, _ = read_rng(agent_part(directory, self.name).rng_file, f"the sampler of agent {self.name!r}")
        self.version = int(json.loads((Path(directory) / "state.json").read_text())["step"])

    def describe(self) -> WorkerInfo:
        info = super().describe()
        return replace(info, device=f"{info.device} (sampler)")
