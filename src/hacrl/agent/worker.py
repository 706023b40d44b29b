"""An agent worker: everything one agent does, behind calls that move only text and numbers.

A worker owns one agent end to end: model, tokenizer, optimizer, frozen reference (KL), sampler and its random
stream. The driver (`hacrl.driver.trainer`) calls it; whether in its own process (`runtime.backend: local`) or as a Ray
actor (`ray`), the calls and their results are the same typed messages (`hacrl.messages`):

    sample(SampleCall)      -> Sampled: its trajectories (text, source log-prob sum and token count, finish reason);
                               keeps them, the sampled ids and per-token old log-probs for `learn`
    learn(LearnCall)        -> Learned: its own rewards and the foreign trajectories in, metrics out (spec 2, step 5)
    generate(GenerateCall)  -> completions for evaluation (the driver scores them)
    save(directory) / load(directory) -> its part of a checkpoint (layout: `hacrl.checkpoint`)
    describe()              -> WorkerInfo: name, device, process id

No tensor of a model, no logit and no gradient leaves a worker. Its random stream is its own (seeded by the run's
seed and its index, saved in its checkpoint part), so the numbers do not depend on where the worker runs or on
what the other workers draw.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from hacrl import faults, seeds
from hacrl.agent import guards
from hacrl.agent.exchange import LearnerRow, learner_rows
from hacrl.agent.logprobs import TokenBatch, token_logprobs
from hacrl.agent.model import Agent, first_nonfinite
from hacrl.agent.precision import MasterStep
from hacrl.agent.rollout import generate, generate_completions
from hacrl.agent.samplers.base import Sample
from hacrl.agent.sharing import relevance, select_pool
from hacrl.agent.weightsync import WeightChannel, WeightsPublisher
from hacrl.checkpoint import agent_part, read_optimizer, read_rng, write_optimizer, write_rng
from hacrl.config.settings import Role
from hacrl.core import get_algorithm
from hacrl.core.metrics import MetricReducer
from hacrl.errors import CheckpointError, NonFiniteError, first_line
from hacrl.learner import loss_inputs, update
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


@dataclass
class OwnSamples:
    """What `sample` keeps for `learn` (or hands over under `trainer.lag`, as `OwnRollout`): the agent's own token
    ids, behaviour log-probs and trajectories of one step; also what a sampler of its own and a worker group's ranks
    build a batch from."""

    step: int
    prompt_ids: list[list[int]]
    samples: list[Sample]
    behaviour_logp: list[torch.Tensor | None]
    """Each row's per-token log-probs under the weights that sampled it (at lag 0 also the update's old ones)."""
    trajectories: list[Trajectory]

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
        return cls(
            step,
            [ids for part in parts for ids in part.prompt_ids],
            [s for part in parts for s in part.samples],
            [t for part in parts for t in part.behaviour_logp],
            [t for part in parts for t in part.trajectories],
        )

    @classmethod
    def from_portable(cls, rollout: OwnRollout) -> OwnSamples:
        samples = [
            Sample(rollout.prompt_ids[t.group], ids, t.text, t.finish_reason == "eos")
            for ids, t in zip(rollout.response_ids, rollout.trajectories, strict=True)
        ]
        behaviour = [torch.tensor(x, dtype=torch.float32) for x in rollout.behaviour_logp]
        return cls(rollout.step, rollout.prompt_ids, samples, behaviour, rollout.trajectories)


class AgentWorker(WeightsPublisher):
    """One agent's worker on one device (see the module docstring). A worker group (`hacrl.agent.sharded`) is this
    class on each rank with its extension points overridden: `stream_seed` (a rank's own stream),
    `training_logprobs` (the sharded forward) and `accumulate` (a rank's share of a mini-batch), besides the calls
    themselves, which it wraps with the group's collectives."""

    def __init__(self, spec: WorkerSpec, *, device: str | None = None, role: Role = "learner") -> None:
        """`device`: where this process holds the agent (a rank's device; None: `spec.agent.device`); `role`: what
        it does with it (`hacrl.config.settings.Role`: a sampler of its own steps nothing)."""
        if spec.torch_threads:
            torch.set_num_threads(spec.torch_threads)
        self.spec = spec
        self.index = spec.index
        self.name = spec.agent.name
        self.algorithm = get_algorithm(spec.algorithm.name)
        self.params = spec.algorithm.params()
        self.agent = Agent(
            spec.index,
            spec.agent,
            spec.rollout,
            with_reference=spec.algorithm.kl_coef > 0,
            weights_from=spec.weights_from,
            init_seed=seeds.adapters(spec.trainer.seed, spec.index),
            device=device,
            role=role,
        )
        cuda = [self.agent.device.index or 0] if self.agent.device.type == "cuda" else []
        self._cuda_devices = cuda
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(self.stream_seed())
            self._rng = self._capture_rng()
        self._rollout: OwnSamples | None = None
        self.optimizer_steps = 0
        self.channel: WeightChannel | None = None
        """Where it publishes its weights after each update for a sampler of its own (`open_weight_channel`)."""

    # -- the five calls ----------------------------------------------------------------------------------------------

    def sample(self, call: SampleCall) -> Sampled:
        """G responses per prompt from the current policy, and their pre-update log-probs (spec 2, steps 1 and 3)."""
        began = time.time()
        self.agent.sync_sampling_weights()
        rollout, generate_s, logprobs_s = self._sample_share(call, range(len(call.prompts)))
        return self._sampled(rollout, generate_s, logprobs_s, began)

    def _sampled(self, rollout: OwnSamples, generate_s: float, logprobs_s: float, began: float) -> Sampled:
        """Keep the rollout for `learn`, or hand it over (`trainer.lag`: the driver gives it back k steps later)."""
        lagged = self.spec.trainer.lag > 0
        self._rollout = None if lagged else rollout
        portable = rollout.portable() if lagged else None
        return Sampled(rollout.trajectories, generate_s, logprobs_s, (began, time.time()), rollout=portable)

    def _sample_share(self, call: SampleCall, groups: range) -> tuple[OwnSamples, float, float]:
        """Prompts `groups` of `call` (all of them on one worker; a rank's share in a worker group), sampled from
        this worker's stream: the rollout (row i is response i % G of prompt groups[i // G]), the seconds spent
        sampling and computing old log-probs."""
        agent, step, group_size = self.agent, call.step, call.group_size
        if not groups:  # a rank of a group with more ranks than the step has prompts
            return OwnSamples(step, [], [], [], []), 0.0, 0.0
        start = time.perf_counter()
        prompt_ids = [agent.render_prompt(call.prompts[g])[0] for g in groups]
        from_sampler = self.spec.trainer.old_logprobs == "sampler"
        with self._own_rng(), self._guarded("sampling", step):
            samples = generate(agent, prompt_ids, group_size, logprobs=from_sampler)
        faults.hit("sampling")
        generated = time.perf_counter()
        first = groups.start * group_size  # the share's first row in the whole step's order
        needed = [i - first for i in self._rows_needing_old_logprobs(len(call.prompts) * group_size)
                  if first <= i < first + len(samples)]  # fmt: skip
        if from_sampler:  # trainer.old_logprobs=sampler: what the sampler computed while drawing, no extra pass
            computed = iter(torch.tensor(samples[i].logprobs, dtype=torch.float32) for i in needed)
        else:
            with self._guarded("old log-probs", step):
                computed = iter(self._old_logprobs([samples[i] for i in needed]))
        wanted = set(needed)
        old_logp = [next(computed) if i in wanted else None for i in range(len(samples))]
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
        return OwnSamples(step, prompt_ids, samples, old_logp, trajectories), generated - start, done - generated

    def learn(self, call: LearnCall) -> Learned:
        """One training step's update of this learner on its pool: advantages, then one optimizer step per
        mini-batch in pool order (own rows first, then `call.foreign`), each accumulated over micro-batches (spec 2,
        step 5)."""
        step, began = call.step, time.time()
        stale = call.rollout is not None  # trainer.lag > 0: sampled by older weights, handed back by the driver
        rollout = OwnSamples.from_portable(call.rollout) if stale else self._rollout
        if rollout is None or rollout.step != step:
            raise RuntimeError(f"agent {self.name!r}: learn(step {step}) without sample(step {step}) first")
        if len(call.rewards) != len(rollout.trajectories):
            raise ValueError(
                f"agent {self.name!r}: {len(call.rewards)} rewards for the {len(rollout.trajectories)} responses it "
                f"sampled at step {step}"
            )
        if self.agent.frozen:  # a peer that shares without learning (agents.<i>.frozen)
            self._rollout = None
            return Learned({}, 0.0, (began, time.time()))
        start = time.perf_counter()
        own = [replace(t, reward=float(r)) for t, r in zip(rollout.trajectories, call.rewards, strict=True)]
        old_logp, deferred = rollout.behaviour_logp, None
        if stale:  # the proximal policy: these weights before the update; the first mini-batch's are its forward's
            first = min(self.spec.trainer.mini_batch_size, len(rollout.samples))
            if call.proximal is not None:  # its sampler computes the rest meanwhile (it holds these weights)
                old_logp, deferred = [None] * len(rollout.samples), (first, call.proximal)
            else:
                with self._guarded("proximal log-probs", step):
                    old_logp = [None] * first + self._old_logprobs(rollout.samples[first:])
        own_rows = learner_rows(
            self.agent, own, [], rollout.prompt_ids, [s.response_ids for s in rollout.samples], old_logp
        )
        if stale:
            for row, behaviour in zip(own_rows, rollout.behaviour_logp, strict=True):
                row.behaviour_logp = behaviour
        caps = torch.tensor(call.capabilities, dtype=torch.float64)
        with self._guarded("the update", step):
            metrics = self._update(own_rows, call.foreign, rollout.prompt_ids, caps, deferred=deferred)
        self._rollout = None
        metrics.update(self.publish_weights(step))
        update_s = time.perf_counter() - start
        if saved := metrics.get("shared_tokens_saved"):  # what the dropped rows would have cost, at this update's speed
            metrics["time/update_saved_est"] = update_s * saved / max(metrics["trained_tokens"], 1)
        return Learned(metrics, update_s, (began, time.time()))

    def generate(self, call: GenerateCall) -> list[Completion]:
        """Completions for evaluation: greedy, or sampled from a stream seeded by `call.seed` (never the training
        one)."""
        with torch.random.fork_rng(devices=self._cuda_devices):
            if call.seed is not None:
                torch.manual_seed(call.seed)
            self.agent.sync_sampling_weights()
            with self._guarded("evaluation", None):
                return generate_completions(
                    self.agent, call.prompts, call.num_samples, greedy=call.greedy, batch_size=self.spec.eval_batch_size
                )

    def save(self, directory: str) -> None:
        """Write this agent's part of a checkpoint under `directory` (`hacrl.checkpoint.AgentPart`: a plain Hugging
        Face model directory, its optimizer state, its random stream; a frozen agent's random stream only)."""
        bad = None if self.agent.frozen else first_nonfinite(self.agent.model)
        if bad is not None:  # never a checkpoint from a non-finite state: the previous one stays the newest
            raise NonFiniteError(
                f"agent {self.name!r}: its weights hold NaN or inf after {self.optimizer_steps} optimizer steps "
                f"(first: {bad}), so no checkpoint is written from them; the newest checkpoint in the run directory "
                f"is the last good state. Lower agents.{self.index}.lr or agents.{self.index}.grad_clip and resume "
                "from it (`hacrl train CONFIG --resume`)."
            )
        root = Path(directory)
        part = agent_part(root, self.name)
        try:
            if not self.agent.frozen:  # a frozen agent's weights are those of its model directory, unchanged
                # a LoRA agent: its adapters (peft's format; the base is its model directory, `hacrl export` merges)
                # float32 masters under a bf16 compute copy: the masters (resume is exact, export picks the dtype)
                (self.agent.peft_model or self.agent.model).save_pretrained(
                    part.weights_dir, safe_serialization=True, state_dict=self.agent.trained_state_dict()
                )
                self.agent.tokenizer.save_pretrained(part.weights_dir)
                write_optimizer(part.optimizer_file, self.agent.optimizer.state_dict())
            write_rng(part.rng_file, self._rng, self.optimizer_steps)
        except OSError:
            raise  # the one error path names the errno, the file and the fix (cli._os_error_message)
        except Exception as e:  # noqa: BLE001 - disk full, quota, I/O: torch and safetensors raise their own types
            raise CheckpointError(
                f"could not write agent {self.name!r}'s part of a checkpoint into {str(root)!r}: {type(e).__name__}: "
                f"{first_line(e, 300)}. The previous checkpoint is intact (a checkpoint "
                "is only moved into place once whole); free disk space or fix the directory's permissions, then "
                "continue with `hacrl train <config> --resume`."
            ) from e
        faults.hit("checkpoint.agent")

    def load(self, directory: str) -> None:
        """Optimizer and random stream from a checkpoint (the weights were loaded at construction)."""
        part = agent_part(directory, self.name)
        if self.agent.optimizer is not None:  # a frozen agent has none
            _load_optimizer(self.agent, part)
        self._rng, self.optimizer_steps = read_rng(part.rng_file, f"agent {self.name!r}")

    def describe(self) -> WorkerInfo:
        return WorkerInfo(name=self.name, device=str(self.agent.device), pid=os.getpid())

    def adopt_stream(self, rng: dict) -> None:
        """Take a sampler's stream as its own (saved in its checkpoint part: the agent's sampling stream)."""
        self._rng = rng

    def memory(self) -> dict[str, int]:
        """This worker's device memory (`guards.device_memory`); benchmarks ask it of workers in other processes."""
        return guards.device_memory(self.agent.device)

    # -- extension points (a worker group overrides these) -----------------------------------------------------------

    def stream_seed(self) -> int:
        """The seed of this worker's own stream (sampling, dropout)."""
        return seeds.training(self.spec.trainer.seed, self.index)

    def training_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """The training forward: per-token log-probs of `batch` under the trained weights, with autograd."""
        chunk = self.spec.trainer.logprob_chunk_size
        return token_logprobs(self.agent.model, batch, self.agent.settings.temperature, chunk_size=chunk)

    def accumulate(self, rows, adv, mini: list[int], capabilities, m: int, reducer: MetricReducer) -> None:
        """The gradient of mini-batch `mini` (row indices; optimizer step `m`), accumulated micro-batch by
        micro-batch; each micro-batch's loss is divided by the mini-batch's sizes, so the sum is its gradient."""
        num_own = sum(rows[i].source == self.index for i in mini)
        size = self.spec.trainer.micro_batch_size
        for micro_start in range(0, len(mini), size):
            micro = mini[micro_start : micro_start + size]
            reducer.add(self._micro_backward(rows, adv, micro, capabilities, m, len(mini), num_own))

    # -- inside ------------------------------------------------------------------------------------------------------

    def _capture_rng(self) -> dict[str, torch.Tensor]:
        state = {"cpu": torch.get_rng_state()}
        if self._cuda_devices:
            state["cuda"] = torch.cuda.get_rng_state(self._cuda_devices[0])
        return state

    @contextlib.contextmanager
    def _own_rng(self):
        """Draw from this worker's stream (then put the process's stream back as it was)."""
        with torch.random.fork_rng(devices=self._cuda_devices):
            torch.set_rng_state(self._rng["cpu"])
            if self._cuda_devices and "cuda" in self._rng:
                torch.cuda.set_rng_state(self._rng["cuda"], self._cuda_devices[0])
            yield
            self._rng = self._capture_rng()

    def _rows_needing_old_logprobs(self, count: int) -> list[int]:
        """Which sampled rows need a pre-update log-prob pass. When other learners read this agent's log-prob sums
        (a sharing algorithm with several agents): all. Otherwise only the rows trained after the first optimizer
        step of the update: the first mini-batch's rows are trained before any update, so their old log-probs are
        the training forward's own (detached), and their ratio is exactly 1."""
        if self.spec.trainer.lag or (self.algorithm.pool_is_shared(self.params) and self.spec.num_agents > 1):
            return list(range(count))  # lag: every row's behaviour log-probs (its update starts from other weights)
        return list(range(min(count, self.spec.trainer.mini_batch_size), count))

    @torch.no_grad()
    def _old_logprobs(self, samples: list[Sample]) -> list[torch.Tensor]:
        """Per-token log-probs (CPU, one tensor per response) of each own response under the current weights."""
        size, out = self.spec.trainer.logprob_batch_size, []
        for start in range(0, len(samples), size):
            logp, tb = self._logprobs_no_grad(samples[start : start + size])
            out.extend(logp[i][tb.response_mask[i]].cpu() for i in range(logp.shape[0]))
        return out

    def _guarded(self, phase: str, step: int | None):
        """Out of memory or NaN / inf in `phase` of `step`: one clear stop (`hacrl.agent.guards.phase`)."""
        return guards.phase(self.name, self.index, self.agent.device, phase, step)

    def _update(self, own_rows: list[LearnerRow], foreign: list[Trajectory], prompt_ids: list[list[int]],
                capabilities: torch.Tensor, *, deferred=None) -> dict[str, Any]:  # fmt: skip
        """Advantages over the learner's pool (its own rows, then `foreign`), the sharing policy's selection, then
        one optimizer step per mini-batch in pool order. `deferred` = (first, handle): the own rows from `first` on
        take their old log-probs from `handle()` once the first optimizer step is done (before it, nothing reads
        them)."""
        agent, cfg = self.agent, self.spec.trainer
        pool = [*own_rows, *foreign]  # what the advantages and the selection read: reward, group, source
        adv = self.algorithm.advantages(
            torch.tensor([r.reward for r in pool], dtype=torch.float64),
            torch.tensor([r.group for r in pool]),
            torch.tensor([r.source for r in pool]),
            learner=self.index,
            capabilities=capabilities,
            params=self.params,
        ).tolist()
        advantage_abs_mean = sum(abs(a) for a in adv) / len(adv)
        rows, adv, shared = select_pool(  # after the advantages: over every scored answer
            agent, own_rows, foreign, prompt_ids, adv, capabilities, sharing=self.spec.sharing,
            r_max=self.params.r_max, names=self.spec.agent_names, rho=self._rho(capabilities),
            relevance=lambda rows: self._relevance(rows, adv, capabilities),
        )  # fmt: skip
        # the value checks once per update, on the host, so that the micro-batch loop never waits for the device
        _check_rows(self.name, self.index, rows, adv, len(capabilities))

        def mini_batches():
            for m, start in enumerate(range(0, len(rows), cfg.mini_batch_size)):
                if m == 1 and deferred is not None:
                    _take_deferred(self.name, own_rows, rows, *deferred)
                # rows that are empty in the learner's tokens (an unfinished empty response) cannot enter the loss
                mini = [i for i in range(start, min(start + cfg.mini_batch_size, len(rows))) if rows[i].response_ids]
                if mini:
                    yield m, mini

        def stepped() -> None:
            agent.weights_changed()
            self.optimizer_steps += 1
            faults.hit("update.optimizer")

        metrics = update(
            agent.optimizer,
            mini_batches(),
            lambda m, mini, reducer: self.accumulate(rows, adv, mini, capabilities, m, reducer),
            lambda: agent.optimizer.clip_grad_norm(agent.cfg.grad_clip),  # float32 with masters
            stepped,
        )  # optimizer_steps: the steps taken (not the skipped ones, not empty mini-batches)
        if agent.optimizer.offload:
            metrics["time/offload"] = agent.optimizer.take_offload_seconds()
        metrics["trained_sequences"] = sum(bool(r.response_ids) for r in rows)
        metrics["trained_tokens"] = sum(len(r.prompt_ids) + len(r.response_ids) for r in rows if r.response_ids)
        metrics.update(shared)
        foreign = [r for r in rows if r.source != self.index]
        if foreign:
            metrics["foreign_length_mean"] = sum(len(r.response_ids) for r in foreign) / len(foreign)
            metrics["foreign_cut_frac"] = sum(r.cut for r in foreign) / len(foreign)
            metrics["foreign_empty"] = sum(not r.response_ids for r in foreign)
        metrics["advantage_abs_mean"] = advantage_abs_mean
        return metrics

    @torch.no_grad()
    def _logprobs_no_grad(self, rows: list[LearnerRow] | list[Sample]) -> tuple[torch.Tensor, TokenBatch]:
        """Per-token log-probs of `rows` (prompt and response ids) under the current weights, and their batch."""
        agent = self.agent
        tb = TokenBatch.build([r.prompt_ids for r in rows], [r.response_ids for r in rows], agent.pad_id, agent.device)
        chunk = self.spec.trainer.logprob_chunk_size
        return token_logprobs(self.agent.logprob_model, tb, agent.settings.temperature, chunk_size=chunk), tb

    def _rho(self, capabilities: torch.Tensor) -> torch.Tensor | None:
        """Each source's coefficient in this learner's loss (spec 3.3): HACPO's rho, None (all 1) otherwise."""
        if self.algorithm.name != "hacpo" or not self.params.capability_coef:
            return None
        from hacrl.core.capability import loss_coefficients

        return loss_coefficients(capabilities, self.index)

    def _relevance(self, rows: list[LearnerRow], adv: list[float], capabilities: torch.Tensor) -> torch.Tensor:
        """`top_k`'s relevance of each foreign row to this learner (`hacrl.agent.sharing.relevance`)."""
        trainer = self.spec.trainer
        return relevance(rows, adv, capabilities, learner=self.index, algorithm=self.algorithm, params=self.params,
                         mini_batch_size=trainer.mini_batch_size, batch_size=trainer.logprob_batch_size,
                         logprobs=self._logprobs_no_grad)  # fmt: skip

    def _micro_backward(self, rows, adv, micro: list[int], capabilities, m: int, num_seqs: int, num_own: int):
        """Forward and backward of the micro-batch of rows `micro`, its loss divided by its mini-batch's sizes
        (`num_seqs` sequences, `num_own` own rows); its metrics."""
        out = self._micro_batch_loss(
            [rows[i] for i in micro],
            [adv[i] for i in micro],
            capabilities,
            step_index=m,
            num_seqs=num_seqs,
            num_own=max(num_own, 1),
        )
        out.loss.backward()
        faults.hit("update.micro_batch")
        return out.metrics

    def _micro_batch_loss(self, rows, adv, capabilities, *, step_index, num_seqs, num_own):
        agent = self.agent
        device = agent.device
        tb = TokenBatch.build([r.prompt_ids for r in rows], [r.response_ids for r in rows], agent.pad_id, device)
        chunk = self.spec.trainer.logprob_chunk_size
        logp = self.training_logprobs(tb)
        # own rows with no old log-probs were trained before any update: the policy is the sampling one
        fresh = torch.tensor([r.old_logp is None and r.source == self.index for r in rows], device=device)
        old = _per_row(
            tb.response_mask,
            [r.old_logp for r in rows],
            torch.where(fresh[:, None] & tb.response_mask, logp.detach(), 0.0),
        )
        behaviour = None
        if self.spec.trainer.lag:
            behaviour = _per_row(tb.response_mask, [r.behaviour_logp for r in rows], torch.zeros_like(logp))
        ref = None
        if agent.ref_model is not None:
            with torch.no_grad():
                ref = token_logprobs(agent.ref_model, tb, agent.settings.temperature, chunk_size=chunk)
        inputs = loss_inputs(
            rows,
            logp,
            tb.response_mask,
            old,
            adv,
            self.index,
            capabilities,
            ref_logp=ref,
            num_seqs=num_seqs,
            num_own=num_own,
            behaviour_logp=behaviour,
            check_values=False,  # `_check_rows` checked them for the whole update
        )
        return self.algorithm.loss(inputs, params=self.params, step_index=step_index)


def _take_deferred(name: str, own_rows: list[LearnerRow], rows: list[LearnerRow], first: int, handle) -> None:
    """The own rows' old log-probs from `first` on, from `handle()` (the sampler's proximal pass: float lists),
    checked as `_check_rows` checks the others."""
    own = {id(r) for r in own_rows}
    if [id(r) for r in rows if id(r) in own] != [id(r) for r in own_rows]:  # every own row kept, as it is
        raise RuntimeError(f"agent {name!r}: the pool's own rows are not the ones whose log-probs were deferred")
    values = [torch.tensor(v, dtype=torch.float32) for v in handle()]
    if not all(bool(torch.isfinite(v).all()) for v in values):
        raise ValueError(f"agent {name!r}: its old log-probs hold non-finite values (a diverged model?)")
    for row, logp in zip(own_rows[first:], values, strict=True):
        row.old_logp = logp


def _per_row(mask: torch.Tensor, values: list[torch.Tensor | None], base: torch.Tensor) -> torch.Tensor:
    """`base` with each row's response positions (`mask`) set to that row's `values` where it has some: one scatter
    for the micro-batch instead of two indexing operations per row (a row's values are as long as its mask)."""
    has = [v is not None for v in values]
    if not any(has):
        return base
    rows = torch.tensor(has, device=mask.device)[:, None] & mask
    return base.masked_scatter(rows, torch.cat([v for v in values if v is not None]).to(base.device, base.dtype))


def _load_optimizer(agent: Agent, part) -> None:
    """An agent's optimizer state from its checkpoint part (`hacrl.checkpoint.AgentPart`): one file, or the shards a
    worker group wrote (gathered by parameter name); a CheckpointError naming the file otherwise."""
    file, optimizer = part.optimizer_file, agent.optimizer
    try:
        if not file.exists() and part.optimizer_dir.is_dir():
            # written by a worker group (agents.<i>.devices): its shards, gathered by parameter name
            from hacrl.agent.distributed import load_optimizer_tensors

            file = part.optimizer_dir
            names = [n for n, p in agent.model.named_parameters() if p.requires_grad]
            stepped = optimizer.masters if isinstance(optimizer, MasterStep) else optimizer.params
            load_optimizer_tensors(optimizer, stepped, names, file)
        else:
            # offloaded: the state stays on the host (read onto the device first, a 4B agent's 32 GB would be)
            where = "cpu" if optimizer.offload else agent.device
            optimizer.load_state_dict(read_optimizer(file, f"agent {agent.name!r}", where))
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - named, with what to do
        raise CheckpointError(
            f"{file}: cannot load the optimizer state of agent {agent.name!r} ({type(e).__name__}: "
            f"{first_line(e)}); resume from an earlier checkpoint (checkpoint.resume=<its directory>)"
        ) from e


def _check_rows(name: str, learner: int, rows: list[LearnerRow], adv: list[float], num_agents: int) -> None:
    """The value checks of `LossInputs`, once per update on host data: known source ids, finite advantages and old
    log-probs, a finite source mean on foreign rows (empty rows never enter the loss)."""
    import math

    if any(not 0 <= r.source < num_agents for r in rows):
        raise ValueError(f"agent {name!r}: the pool holds a trajectory of an unknown agent")
    if not all(math.isfinite(a) for a in adv):
        raise ValueError(f"agent {name!r}: non-finite advantages (check the rewards)")
    own = [r.old_logp for r in rows if r.old_logp is not None]
    if own and not bool(torch.isfinite(torch.cat(own)).all()):
        raise ValueError(f"agent {name!r}: its old log-probs hold non-finite values (a diverged model?)")
    behaviour = [r.behaviour_logp for r in rows if r.behaviour_logp is not None]
    if behaviour and not bool(torch.isfinite(torch.cat(behaviour)).all()):
        raise ValueError(f"agent {name!r}: the log-probs of its stale rows' sampling hold non-finite values")
    if not all(math.isfinite(r.source_logp_sum) for r in rows if r.source != learner and r.response_ids):
        raise ValueError(f"agent {name!r}: a foreign trajectory's source log-prob sum is not finite")
