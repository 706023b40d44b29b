"""An agent's sampling role: its answers to a step's prompts from its own random stream, their behaviour log-probs,
the proximal pass of its learner's update, and evaluation's generations.

It runs in the agent's one worker beside the learning role (`hacrl.agent.learning`), on each rank of a worker group
(its share of the prompts, `hacrl.agent.share`), or alone in a process of its own (`agents.<i>.sampler_devices`,
with `trainer.lag` >= 1): a sampler of its own holds the agent's compute-dtype weights on its own device
(`Placement.sampler_device`, `Precision.of_sampler`: nothing stepped), draws from the stream the agent's worker would
have drawn from (a worker group's: each rank's share from that rank's stream, in rank order), so a run with a
sampler samples what the same run without one samples. It samples batch s with the weights after update s - 1 - lag,
which come over its learner's link (`hacrl.agent.weightsync`: read from shared memory just before the batch, or
received at the end of the step that made them); its stream is saved in its learner's checkpoint part (the schedule
hands it over before a save, `AgentWorker.adopt_stream`), so a checkpoint is the same with or without a sampler.

The proximal pass (`proximal`): under `trainer.lag` the own rows after the first mini-batch need their log-probs
under the weights the update starts from, which are the ones a sampler of its own holds while its learner trains
the first mini-batch: the pass leaves the learner, whose update is the longer role when sampling and learning take
similar time.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hacrl import faults, seeds
from hacrl.agent import guards
from hacrl.agent.logprobs import rows_logprobs
from hacrl.agent.model import Agent
from hacrl.agent.rollout import generate, generate_completions
from hacrl.agent.samplers.base import Sample
from hacrl.agent.share import Share
from hacrl.agent.weightsync import WeightLink, refuse
from hacrl.checkpoint import agent_part, read_rng
from hacrl.messages import Completion, GenerateCall, OwnRollout, SampleCall, Trajectory, WorkerSpec
from hacrl.provenance import LogprobPlan, ProximalLogprobs


@dataclass
class OwnSamples:
    """What sampling gives the learning role (kept in the worker, or handed over under `trainer.lag` as
    `OwnRollout`): the agent's own token ids, behaviour log-probs and trajectories of one step."""

    step: int
    prompt_ids: list[list[int]]
    samples: list[Sample]
    behaviour_logp: list[torch.Tensor | None]
    """Each row's per-token log-probs under the weights that sampled it (at lag 0 also the update's old ones, but
    with `trainer.old_logprobs: corrected`: then the sampler's, and the old ones are `proximal_logp`)."""
    trajectories: list[Trajectory]
    proximal_logp: list[torch.Tensor | None] | None = None
    """`corrected` at lag 0: the learner's own pass over the rows after the first mini-batch (None: the others)."""
    gap: tuple[float, int, float] = (0.0, 0, 0.0)
    """The sampler's reported log-probs against the learner's pass under the same weights, where both were
    computed: the sum of |difference| over tokens, the tokens, the largest |difference|."""

    def portable(self) -> OwnRollout:
        """The rollout as lists (`trainer.lag` > 0: it waits in the driver, and in checkpoints, until its update);
        every row's log-probs are those of the sampling weights."""
        return OwnRollout(
            self.step,
            self.prompt_ids,
            [s.response_ids for s in self.samples],
            [t.tolist() for t in self.behaviour_logp],
            self.trajectories,
        )

    @classmethod
    def joined(cls, step: int, parts: list[OwnSamples]) -> OwnSamples:
        """The shares of a worker group's ranks, in rank order: the rollout one worker would have sampled."""
        proximal = [part.proximal_logp for part in parts]
        return cls(
            step,
            [ids for part in parts for ids in part.prompt_ids],
            [s for part in parts for s in part.samples],
            [t for part in parts for t in part.behaviour_logp],
            [t for part in parts for t in part.trajectories],
            None if all(p is None for p in proximal) else [t for p in proximal for t in (p or [])],
            (sum(p.gap[0] for p in parts), sum(p.gap[1] for p in parts), max((p.gap[2] for p in parts), default=0.0)),
        )

    def gap_metrics(self) -> dict[str, float]:
        """`sampler_logp_gap` (mean |difference| a token) and its largest, where the sampler's log-probs were checked
        against the learner's pass (`trainer.old_logprobs`; always for a vLLM agent's recomputed rows)."""
        total, tokens, worst = self.gap
        return {"sampler_logp_gap": total / tokens, "sampler_logp_gap_max": worst} if tokens else {}

    @classmethod
    def from_portable(cls, rollout: OwnRollout) -> OwnSamples:
        samples = [
            Sample(rollout.prompt_ids[t.group], ids, t.text, t.finish_reason == "eos")
            for ids, t in zip(rollout.response_ids, rollout.trajectories, strict=True)
        ]
        behaviour = [torch.tensor(x, dtype=torch.float32) for x in rollout.behaviour_logp]
        return cls(rollout.step, rollout.prompt_ids, samples, behaviour, rollout.trajectories)


class SamplingRole:
    """An agent's sampling in one process (module docstring); `share`: the ranks' shares it samples, each from its
    stream."""

    def __init__(self, agent: Agent, spec: WorkerSpec, share: Share) -> None:
        self.agent, self.spec, self.share = agent, spec, share
        self.index, self.name = spec.index, spec.agent.name
        self.plan = LogprobPlan.of(spec)
        """Which log-probs its rows carry, from whom and when (`hacrl.provenance`)."""
        self.cuda = [agent.device.index or 0] if agent.device.type == "cuda" else []
        base = seeds.training(spec.trainer.seed, spec.index)
        self.streams = [self._seeded(share.seed(base, rank)) for rank in share.ranks]
        """The random stream of each rank share it samples (sampling only: the update draws nothing)."""
        self.link: WeightLink | None = None
        """A sampler of its own: its learner's link (`attach`); None where it shares the learner's weights."""
        self.version: int | None = 0
        """A sampler of its own: the update whose weights it holds (0: the starting weights; a resumed run's: its
        checkpoint's step; None: a transfer failed halfway)."""
        self.resumed_at = 0
        """The update whose weights a resumed run starts from (its checkpoint's step; 0: a fresh run)."""
        self._sync_s = 0.0
        """Seconds spent taking weights since the last batch (reported with it as `Sampled.sync_s`)."""

    # -- the calls ---------------------------------------------------------------------------------------------------

    def sample(self, call: SampleCall) -> tuple[OwnSamples, float, float, float]:
        """G responses per prompt of this process's shares, from the current policy, with the log-probs that step's
        update needs (spec 2, steps 1 and 3): the whole step's rollout (a group's ranks exchange their shares), the
        seconds spent generating, computing log-probs and taking weights."""
        if self.link is not None:  # a sampler of its own: the weights after update s - 1 - lag, never older than
            # those it was resumed with (a resume at a larger lag samples its missing batches with the checkpoint's)
            self.take(max(self.resumed_at, call.step - 1 - self.spec.trainer.lag))
        sync_s, self._sync_s = self._sync_s, 0.0
        self.agent.sync_sampling_weights()
        parts, generate_s, logprobs_s = [], 0.0, 0.0
        for j, rank in enumerate(self.share.ranks):  # each rank's share from its stream, in rank order
            part, g, lp = self._sample_share(call, self.share.part(len(call.prompts), rank), j)
            parts.append(part)
            generate_s, logprobs_s = generate_s + g, logprobs_s + lp
        return OwnSamples.joined(call.step, self.share.joined(parts)), generate_s, logprobs_s, sync_s

    def proximal(self, step: int, rollout: OwnRollout) -> ProximalLogprobs:
        """A sampler of its own: the proximal pass of its learner's update `step` (`LogprobPlan.proximal_rows` of
        `rollout`) under the weights after update step - 1 (the update's starting weights, which it then samples
        batch step + lag with), by the learner's own pass, so the values are the learner's."""
        self.take(max(0, step - 1))
        with self._guarded("proximal log-probs", step):
            reply = self.proximal_pass(step, OwnSamples.from_portable(rollout))
        faults.hit("proximal")
        return reply

    def proximal_pass(self, step: int, rollout: OwnSamples) -> ProximalLogprobs:
        """The proximal pass over `rollout` with the weights held now (its learner's process: before its update)."""
        rows = list(self.plan.proximal_rows(len(rollout.samples)))
        values = self.old_logprobs([rollout.samples[i] for i in rows])
        return ProximalLogprobs(step, rows, [x.tolist() for x in values])

    def generate(self, call: GenerateCall) -> list[Completion]:
        """Completions for evaluation (this process's share of the prompts, every rank's joined): greedy, or sampled
        from a stream seeded by `call.seed` (a group's rank r: `seeds.rank(call.seed, r)`), never the training one."""
        rank = self.share.rank
        share = self.share.part(len(call.prompts), rank)
        seed = seeds.rank(call.seed, rank) if call.seed is not None and self.share.collective else call.seed
        mine: list[Completion] = []
        if share:
            with torch.random.fork_rng(devices=self.cuda):
                if seed is not None:
                    torch.manual_seed(seed)
                self.agent.sync_sampling_weights()
                with self._guarded("evaluation", None):
                    prompts = [call.prompts[i] for i in share]
                    mine = generate_completions(self.agent, prompts, call.num_samples, greedy=call.greedy,
                                                batch_size=self.spec.eval_batch_size)  # fmt: skip
        return [c for part in self.share.joined([mine]) for c in part]

    @torch.no_grad()
    def old_logprobs(self, samples: list[Sample]) -> list[torch.Tensor]:
        """Per-token log-probs (CPU, one tensor per response) of each own response under the current weights."""
        size, out = self.spec.trainer.logprob_batch_size, []
        for start in range(0, len(samples), size):
            chunk = self.spec.trainer.logprob_chunk_size
            logp, tb = rows_logprobs(self.agent, samples[start : start + size], chunk_size=chunk)
            out.extend(logp[i][tb.response_mask[i]].cpu() for i in range(logp.shape[0]))
        return out

    # -- a sampler of its own's weights ------------------------------------------------------------------------------

    def attach(self, link: WeightLink) -> None:
        """The link its learner opened (`WeightsPublisher.open_weight_link`)."""
        self.link = link

    def receive(self, step: int, sent=None) -> None:
        """The weights after update `step` over its link (a meeting link's end: the learner sends meanwhile, or
        `sent` is what it sent)."""
        start, self.version = time.perf_counter(), None  # nothing whole until the transfer ends
        self.link.receive(self.agent.handed_over(), step, sent)
        self.agent.weights_changed()
        self.version = step
        self._sync_s += time.perf_counter() - start

    def take(self, wanted: int) -> None:
        """Hold the weights after update `wanted`: read them now over a link whose ends work alone; over a meeting
        link they came at the end of that update's step, or it refuses. A frozen agent's never change."""
        if self.spec.agent.frozen or wanted == self.version:
            return
        if self.link is None or self.link.meets:
            refuse(self.name, wanted, self.version)
        self.receive(wanted)

    # -- its streams -------------------------------------------------------------------------------------------------

    def stream(self) -> dict | list[dict]:
        """Its random stream now (its learner saves it as the agent's); a group's sampler: each rank's, in order."""
        return self.streams[0] if self.share.world == 1 else list(self.streams)

    def adopt(self, rng: dict | list[dict]) -> None:
        """Take a sampler's stream as its own (a group's rank: its rank's)."""
        self.streams[0] = rng[self.share.rank] if isinstance(rng, list) else rng

    def load(self, directory: str, who: str) -> None:
        """Its streams from a checkpoint part (one worker's must be there; a group's rank without one keeps its fresh
        stream: not bit-exact, said at resume); a sampler of its own also holds the checkpoint's weights."""
        part = agent_part(directory, self.name)
        for j, rank in enumerate(self.share.ranks):
            file = part.rank_rng_file(rank)
            if self.share.world == 1 or file.is_file():
                what = who if self.share.world == 1 else f"{who}, rank {rank}"
                self.streams[j], _ = read_rng(file, what)
        if self.link is not None:
            self.version = self.resumed_at = int(json.loads((Path(directory) / "state.json").read_text())["step"])

    # -- inside ------------------------------------------------------------------------------------------------------

    def _sample_share(self, call: SampleCall, groups: range, j: int) -> tuple[OwnSamples, float, float]:
        """Prompts `groups` of `call`, sampled from stream `j`: the rollout (row i is response i % G of prompt
        groups[i // G]), the seconds spent sampling and computing old log-probs."""
        agent, step, group_size = self.agent, call.step, call.group_size
        if not groups:  # a rank of a group with more ranks than the step has prompts
            return OwnSamples(step, [], [], [], []), 0.0, 0.0
        start = time.perf_counter()
        prompt_ids = [agent.render_prompt(call.prompts[g])[0] for g in groups]
        mode = self.plan.mode
        reported = mode != "recompute" or agent.settings.sampler == "vllm"  # vLLM's cost nothing: the gap is logged
        with self._stream(j), self._guarded("sampling", step):
            samples = generate(agent, prompt_ids, group_size, logprobs=reported)
        faults.hit("sampling")
        generated = time.perf_counter()
        first = groups.start * group_size  # the share's first row in the whole step's order
        needed = [i - first for i in self.plan.at_sampling(len(call.prompts) * group_size)
                  if first <= i < first + len(samples)]  # fmt: skip
        recomputed: dict[int, torch.Tensor] = {}
        if mode != "sampler":  # the learner's own pass
            with self._guarded("old log-probs", step):
                recomputed = dict(zip(needed, self.old_logprobs([samples[i] for i in needed]), strict=True))
        sampler = {i: torch.tensor(s.logprobs, dtype=torch.float32) for i, s in enumerate(samples) if reported}
        if mode == "recompute":
            old_logp = [recomputed.get(i) for i in range(len(samples))]
        elif mode == "sampler":  # no extra pass: the sampler's, where needed
            wanted = set(needed)
            old_logp = [sampler[i] if i in wanted else None for i in range(len(samples))]
        else:  # corrected: every row's behaviour is the sampler's; the learner's pass gives the proximal ones
            old_logp = [sampler[i] for i in range(len(samples))]
        proximal = [recomputed.get(i) for i in range(len(samples))] if mode == "corrected" else None
        done = time.perf_counter()
        trajectories = [
            Trajectory(
                group=groups.start + i // group_size,
                text=s.text,
                reward=float("nan"),
                source=self.index,
                source_logp_sum=float(old_logp[i].sum()) if old_logp[i] is not None else float("nan"),
                source_num_tokens=len(s.response_ids),
                finish_reason=s.finish_reason,
                num_bytes=len(s.text.encode("utf-8", errors="surrogatepass")),
            )
            for i, s in enumerate(samples)
        ]
        both = [(sampler[i], recomputed[i]) for i in recomputed if i in sampler]
        diffs = torch.cat([(a - b).abs() for a, b in both]) if both else torch.zeros(0)
        gap = (float(diffs.sum()), diffs.numel(), float(diffs.max()) if diffs.numel() else 0.0)
        own = OwnSamples(step, prompt_ids, samples, old_logp, trajectories, proximal, gap)
        return own, generated - start, done - generated

    def _seeded(self, seed: int) -> dict[str, torch.Tensor]:
        with torch.random.fork_rng(devices=self.cuda):
            torch.manual_seed(seed)
            return self._capture_rng()

    def _capture_rng(self) -> dict[str, torch.Tensor]:
        state = {"cpu": torch.get_rng_state()}
        if self.cuda:
            state["cuda"] = torch.cuda.get_rng_state(self.cuda[0])
        return state

    @contextlib.contextmanager
    def _stream(self, j: int):
        """Draw from stream `j` (then put the process's stream back as it was)."""
        with torch.random.fork_rng(devices=self.cuda):
            torch.set_rng_state(self.streams[j]["cpu"])
            if self.cuda and "cuda" in self.streams[j]:
                torch.cuda.set_rng_state(self.streams[j]["cuda"], self.cuda[0])
            yield
            self.streams[j] = self._capture_rng()

    def _guarded(self, phase: str, step: int | None):
        """Out of memory or NaN / inf in `phase` of `step`: one clear stop (`hacrl.agent.guards.phase`)."""
        return guards.phase(self.name, self.index, self.agent.device, phase, step)
