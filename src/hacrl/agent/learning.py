"""An agent's learning role: its update on a step's pool (spec 2, step 5), its optimizer's part of a checkpoint, and
the learner's end of the weight link to a sampler of its own (`hacrl.agent.weightsync`).

On one worker: advantages over the learner's pool (its own rows, then the others' re-tokenized), the sharing
policy's selection, then one optimizer step per mini-batch in pool order, each accumulated over micro-batches. On a
worker group's rank (`hacrl.agent.share`, FSDP2, mechanics in `hacrl.agent.distributed`): every rank builds the same
pool and advantages (cheap, on the host); each mini-batch's rows are split across the ranks (contiguous); every loss
is divided by the mini-batch's global counts and the gradients are summed across ranks, so the update is the
one-device update up to float summation order; ranks with fewer rows run zero-weight micro-batches, so that every
rank runs the same collectives; rank 0 reduces every rank's metrics in rank order. A group's checkpoint part: rank 0
writes the Hugging Face directory (the gathered float32 masters), every rank its shard of the optimizer state
(torch.distributed.checkpoint) and its random stream.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hacrl import faults
from hacrl.agent import guards
from hacrl.agent.distributed import (
    full_state_dict,
    load_full_optimizer,
    load_optimizer_tensors,
    optimizer_tensors,
    save_optimizer_tensors,
)
from hacrl.agent.exchange import LearnerRow, learner_rows
from hacrl.agent.logprobs import TokenBatch, rows_logprobs, token_logprobs
from hacrl.agent.model import Agent, first_nonfinite
from hacrl.agent.precision import MasterStep
from hacrl.agent.sampling import OwnSamples
from hacrl.agent.share import Share
from hacrl.agent.sharing import relevance, select_pool
from hacrl.agent.weightsync import WeightLink, WeightsPublisher
from hacrl.checkpoint import agent_part, read_optimizer, read_rng, write_optimizer, write_rng, writing_part
from hacrl.core import get_algorithm
from hacrl.core.losses import median_by_source, sequence_log_ratios
from hacrl.core.metrics import MetricReducer
from hacrl.errors import CheckpointError, NonFiniteError, first_line
from hacrl.learner import loss_inputs, mini_batches, update
from hacrl.messages import Deferred, LearnCall, Learned, Trajectory, WorkerSpec
from hacrl.provenance import LogprobPlan, ProximalLogprobs


class LearningRole(WeightsPublisher):
    """An agent's learning in one process (module docstring); `share`: one worker's, or a group rank's."""

    def __init__(self, agent: Agent, spec: WorkerSpec, share: Share) -> None:
        self.agent, self.spec, self.share = agent, spec, share
        self.index, self.name = spec.index, spec.agent.name
        self.algorithm, self.params = get_algorithm(spec.algorithm.name), spec.algorithm.params()
        self.optimizer_steps = 0
        self.plan = LogprobPlan.of(spec)
        """Which log-probs its own rows carry, from whom and when (`hacrl.provenance`)."""
        self.link: WeightLink | None = None
        """Where it sends its weights after each update for a sampler of its own (`open_weight_link`)."""

    def learn(self, call: LearnCall, rollout: OwnSamples | None,
              proximal_pass: Callable[[int, OwnSamples], ProximalLogprobs]) -> Learned:  # fmt: skip
        """One training step's update on its pool: its own rows (`rollout`: the one its sampling role kept, or
        under `trainer.lag` the one the driver handed back in `call`), then `call.foreign`. Under lag the own rows
        after the first mini-batch take their proximal log-probs (`LogprobPlan.proximal_rows`) after the first
        optimizer step, from one reply: `call.proximal` (a sampler of its own computes them meanwhile), or the pass
        of the process's own sampling role (`proximal_pass`), made now, before the update."""
        step, began = call.step, time.time()
        stale = call.rollout is not None  # trainer.lag > 0: sampled by older weights, handed back by the driver
        if rollout is None or rollout.step != step:
            raise RuntimeError(f"agent {self.name!r}: learn(step {step}) without sample(step {step}) first")
        if len(call.rewards) != len(rollout.trajectories):
            raise ValueError(
                f"agent {self.name!r}: {len(call.rewards)} rewards for the {len(rollout.trajectories)} responses it "
                f"sampled at step {step}"
            )
        if self.agent.frozen:  # a peer that shares without learning (agents.<i>.frozen)
            return Learned({}, 0.0, (began, time.time()))
        start = time.perf_counter()
        own = [replace(t, reward=float(r)) for t, r in zip(rollout.trajectories, call.rewards, strict=True)]
        old_logp, proximal = rollout.behaviour_logp, None
        if rollout.proximal_logp is not None:  # `corrected` at lag 0: the behaviour log-probs are the sampler's
            old_logp = rollout.proximal_logp
        elif stale:  # the proximal policy: these weights before the update; the first mini-batch's are its forward's
            old_logp, proximal = [None] * len(rollout.samples), call.proximal
            if self.plan.proximal_by == "learner" and self.plan.proximal_rows(len(rollout.samples)):
                with self._guarded("proximal log-probs", step):
                    proximal = proximal_pass(step, rollout)
        own_rows = learner_rows(
            self.agent, own, [], rollout.prompt_ids, [s.response_ids for s in rollout.samples], old_logp
        )
        if self.plan.weighs_behaviour:
            for row, behaviour in zip(own_rows, rollout.behaviour_logp, strict=True):
                row.behaviour_logp = behaviour
        caps = torch.tensor(call.capabilities, dtype=torch.float64)
        with self._guarded("the update", step):
            metrics = self._update(own_rows, call.foreign, rollout.prompt_ids, caps, proximal=proximal)
        metrics.update(self.publish_weights(step))
        update_s = time.perf_counter() - start
        if saved := metrics.get("shared_tokens_saved"):  # what the dropped rows would have cost, at this update's speed
            metrics["time/update_saved_est"] = update_s * saved / max(metrics["trained_tokens"], 1)
        return Learned(metrics, update_s, (began, time.time()))

    def publish_weights(self, step: int) -> dict[str, float]:
        """A group's ranks first gather the compute copy (a collective: every rank, before rank 0 sends it)."""
        if self.share.collective:
            self.agent.sync_sampling_weights()
        return super().publish_weights(step)

    def open_weight_link(self, across_machines: bool) -> WeightLink | None:
        """A group's rank 0 sends the group's weights (the whole compute copy every rank gathers); the other ranks
        hold no link."""
        return super().open_weight_link(across_machines) if self.share.rank == 0 else None

    # -- its checkpoint part -----------------------------------------------------------------------------------------

    def save(self, directory: str, rng: dict) -> None:
        """Write this agent's part of a checkpoint under `directory` (`hacrl.checkpoint.AgentPart`: a plain Hugging
        Face model directory, its optimizer state, its random stream `rng`; a frozen agent's random stream only)."""
        if self.share.collective:
            self._save_group(directory, rng)
            return
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
        with writing_part(f"agent {self.name!r}", root, "hacrl train <config> --resume"):
            if not self.agent.frozen:  # a frozen agent's weights are those of its model directory, unchanged
                # a LoRA agent: its adapters (peft's format; the base is its model directory, `hacrl export` merges)
                # float32 masters under a bf16 compute copy: the masters (resume is exact, export picks the dtype)
                (self.agent.peft_model or self.agent.model).save_pretrained(
                    part.weights_dir, safe_serialization=True, state_dict=self.agent.trained_state_dict()
                )
                self.agent.tokenizer.save_pretrained(part.weights_dir)
                write_optimizer(part.optimizer_file, self.agent.optimizer.state_dict())
            write_rng(part.rng_file, rng, self.optimizer_steps)
        faults.hit("checkpoint.agent")

    def load(self, directory: str) -> None:
        """Optimizer state and update count from a checkpoint (the weights were loaded at construction; the random
        stream is the sampling role's)."""
        if self.share.collective:
            self._load_group(directory)
            return
        part = agent_part(directory, self.name)
        if self.agent.optimizer is not None:  # a frozen agent has none
            _load_optimizer(self.agent, part)
        _, self.optimizer_steps = read_rng(part.rng_file, f"agent {self.name!r}")

    def _save_group(self, directory: str, rng: dict) -> None:
        agent, root, rank = self.agent, Path(directory), self.share.rank
        part = agent_part(root, self.name)
        finite = torch.tensor(
            [all(bool(torch.isfinite(_local(p)).all()) for p in agent.model.parameters())], dtype=torch.int32
        )
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        if not bool(finite.item()):
            raise NonFiniteError(
                f"agent {self.name!r}: its weights hold NaN or inf after {self.optimizer_steps} optimizer steps, so no "
                f"checkpoint is written from them; the newest checkpoint in the run directory is the last good state. "
                f"Lower agents.{self.index}.lr or agents.{self.index}.grad_clip and resume from it."
            )
        with writing_part(f"rank {rank} of agent {self.name!r}", root, "hacrl train <config> --resume"):
            state = full_state_dict(agent.model, agent.sampling_model, agent.device, keep=rank == 0)
            if rank == 0:
                agent.sampling_model.save_pretrained(part.weights_dir, safe_serialization=True, state_dict=state)
                agent.tokenizer.save_pretrained(part.weights_dir)
            names = [n for n, _ in agent.model.named_parameters()]
            tensors = optimizer_tensors(agent.optimizer, agent.optimizer.params, names)
            save_optimizer_tensors(tensors, part.optimizer_dir)
            write_rng(part.rank_rng_file(rank), rng, self.optimizer_steps)
        dist.barrier()  # the group's part is whole when rank 0 answers
        faults.hit("checkpoint.agent")

    def _load_group(self, directory: str) -> None:
        """Optimizer shards (a checkpoint of another K, or of one device, loads resharded) and the update count."""
        part = agent_part(directory, self.name)
        agent = self.agent
        names = [n for n, _ in agent.model.named_parameters()]
        try:
            if part.optimizer_dir.is_dir():
                load_optimizer_tensors(agent.optimizer, agent.optimizer.params, names, part.optimizer_dir)
            else:
                load_full_optimizer(agent.optimizer, agent.optimizer.params, part.optimizer_file, agent.device)
        except Exception as e:  # noqa: BLE001 - named, with what to do
            raise CheckpointError(
                f"{part.optimizer_dir if part.optimizer_dir.is_dir() else part.optimizer_file}: cannot load the "
                f"optimizer state of agent {self.name!r} on rank {self.share.rank} ({type(e).__name__}: "
                f"{first_line(e)}); "
                "resume from an earlier checkpoint (checkpoint.resume=<its directory>)"
            ) from e
        _, self.optimizer_steps = read_rng(part.rng_file, f"agent {self.name!r}")  # rank 0's count is the group's

    # -- the update --------------------------------------------------------------------------------------------------

    def _training_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """The training forward: per-token log-probs of `batch` under the trained weights, with autograd (a group's
        sharded model: inside its root module's call)."""
        chunk, temperature = self.spec.trainer.logprob_chunk_size, self.agent.settings.temperature
        if self.share.collective:
            from hacrl.agent.distributed import root_logprobs

            return root_logprobs(self.agent.model, batch, temperature, chunk_size=chunk)
        return token_logprobs(self.agent.model, batch, temperature, chunk_size=chunk)

    def _accumulate(self, rows, adv, mini: list[int], capabilities, m: int, reducer: MetricReducer) -> None:
        """The gradient of mini-batch `mini` (row indices; optimizer step `m`), accumulated micro-batch by
        micro-batch; each micro-batch's loss is divided by the mini-batch's sizes, so the sum is its gradient."""
        if self.share.collective:
            self._accumulate_share(rows, adv, mini, capabilities, m, reducer)
            return
        num_own = sum(rows[i].source == self.index for i in mini)
        for micro in micro_batches(rows, mini, self.spec.trainer.micro_batch_size, self.spec.trainer.micro_batch_order):
            reducer.add(self._micro_backward(rows, adv, micro, capabilities, m, len(mini), num_own))

    def _accumulate_share(self, rows, adv, mini: list[int], capabilities, m: int, reducer: MetricReducer) -> None:
        """A group's rank: its share of the mini-batch's rows (the same number of micro-batches on every rank, a
        zero-weight pass where its rows ran out, so every rank runs the same collectives); rank 0 reduces every
        rank's metrics in rank order."""
        num_own = sum(rows[i].source == self.index for i in mini)
        size = self.spec.trainer.micro_batch_size
        mine = micro_batches(rows, [mini[i] for i in self.share.part(len(mini), self.share.rank)], size,
                             self.spec.trainer.micro_batch_order)  # fmt: skip
        passes = math.ceil(math.ceil(len(mini) / self.share.world) / size)  # the same on every rank
        collected = []
        for j in range(passes):
            micro = mine[j] if j < len(mine) else []
            if not micro:  # this rank's rows ran out: a zero-weight pass keeps the collectives in step
                self._idle_backward()
                continue
            metrics = self._micro_backward(rows, adv, micro, capabilities, m, len(mini), num_own)
            collected.append({k: v.detach().cpu() for k, v in metrics.items()})
        gathered = self.share.at_first(collected)
        if gathered is not None:
            for metrics in (m for part in gathered for m in part):
                reducer.add(metrics)

    def _idle_backward(self) -> None:
        agent = self.agent
        batch = TokenBatch.build([[agent.eos_id]], [[agent.eos_id]], agent.pad_id, agent.device)
        (self._training_logprobs(batch).sum() * 0.0).backward()

    def _update(self, own_rows: list[LearnerRow], foreign: list[Trajectory], prompt_ids: list[list[int]],
                capabilities: torch.Tensor, *, proximal: Deferred | None = None) -> dict[str, Any]:  # fmt: skip
        """Advantages over the learner's pool (its own rows, then `foreign`), the sharing policy's selection, then
        one optimizer step per mini-batch in pool order. `proximal`: a lagged update's proximal pass, whose
        `value()` (`ProximalLogprobs`) the own rows it names take once the first optimizer step is done (before it,
        nothing reads them)."""
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
        centres = self._foreign_centres(rows, capabilities) if self.params.foreign_center == "median" else None

        def steps():
            layout = mini_batches([r.source for r in rows], cfg.mini_batch_size, cfg.mini_batch_layout)
            for m, step_rows in enumerate(layout):
                if m == 1 and proximal is not None:
                    _take_proximal(self.name, self.index, len(own_rows), rows, proximal.value())
                # rows that are empty in the learner's tokens (an unfinished empty response) cannot enter the loss
                mini = [i for i in step_rows if rows[i].response_ids]
                if mini:
                    yield m, mini

        def stepped() -> None:
            agent.weights_changed()
            self.optimizer_steps += 1
            faults.hit("update.optimizer")

        metrics = update(
            agent.optimizer,
            steps(),
            lambda m, mini, reducer: self._accumulate(rows, adv, mini, capabilities, m, reducer),
            lambda: agent.optimizer.clip_grad_norm(agent.cfg.grad_clip),  # float32 with masters
            stepped,
            skip_zero=cfg.zero_grad_step == "skip",
        )  # optimizer_steps: the steps taken (not the skipped ones, not empty mini-batches)
        if agent.optimizer.offload:
            metrics["time/offload"] = agent.optimizer.take_offload_seconds()
        metrics.update(shared)
        metrics.update(_pool_metrics(rows, self.index, centres))
        metrics["advantage_abs_mean"] = advantage_abs_mean
        return metrics

    def _foreign_centres(self, rows: list[LearnerRow], capabilities: torch.Tensor) -> list[float]:
        """`algorithm.foreign_center: median`: each foreign row's shift (`LearnerRow.foreign_shift`), its source's
        median log-ratio under the pre-update weights (one no-grad pass over the foreign rows, as `top_k`'s); the
        foreign rows' shifts, for the metric."""
        foreign = [i for i, r in enumerate(rows) if r.source != self.index and r.response_ids]
        if not foreign:
            return []
        trainer, values = self.spec.trainer, []
        for start in range(0, len(foreign), trainer.logprob_batch_size):
            chunk = [rows[i] for i in foreign[start : start + trainer.logprob_batch_size]]
            with torch.no_grad():
                logp, tb = rows_logprobs(self.agent, chunk, chunk_size=trainer.logprob_chunk_size)
            inputs = loss_inputs(chunk, logp, tb.response_mask, torch.zeros_like(logp), [0.0] * len(chunk),
                                 self.index, capabilities, check_values=False)  # fmt: skip
            values.append(sequence_log_ratios(inputs, self.params.foreign_ratio).cpu())
        sources = torch.tensor([rows[i].source for i in foreign])
        shifts = median_by_source(torch.cat(values), sources, torch.ones(len(foreign), dtype=torch.bool)).tolist()
        for i, shift in zip(foreign, shifts, strict=True):
            rows[i].foreign_shift = shift
        return shifts

    def _rho(self, capabilities: torch.Tensor) -> torch.Tensor | None:
        """Each source's coefficient in this learner's loss (spec 3.3): HACPO's rho, None (all 1) otherwise."""
        return self.algorithm.loss_rho(capabilities, self.index, self.params)

    def _relevance(self, rows: list[LearnerRow], adv: list[float], capabilities: torch.Tensor) -> torch.Tensor:
        """`top_k`'s relevance of each foreign row to this learner (`hacrl.agent.sharing.relevance`)."""
        trainer = self.spec.trainer
        chunk = trainer.logprob_chunk_size
        return relevance(rows, adv, capabilities, learner=self.index, algorithm=self.algorithm, params=self.params,
                         mini_batch_size=trainer.mini_batch_size, batch_size=trainer.logprob_batch_size,
                         logprobs=lambda r: rows_logprobs(self.agent, r, chunk_size=chunk))  # fmt: skip

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
        logp = self._training_logprobs(tb)
        # own rows with no old log-probs were trained before any update: the policy is the sampling one
        fresh = torch.tensor([r.old_logp is None and r.source == self.index for r in rows], device=device)
        old = _per_row(
            tb.response_mask,
            [r.old_logp for r in rows],
            torch.where(fresh[:, None] & tb.response_mask, logp.detach(), 0.0),
        )
        behaviour = None
        if self.plan.weighs_behaviour:
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
            foreign_shift=_shifts(rows, device),
            check_values=False,  # `_check_rows` checked them for the whole update
        )
        return self.algorithm.loss(inputs, params=self.params, step_index=step_index)

    def _guarded(self, phase: str, step: int | None):
        """Out of memory or NaN / inf in `phase` of `step`: one clear stop (`hacrl.agent.guards.phase`)."""
        return guards.phase(self.name, self.index, self.agent.device, phase, step)


def micro_batches(rows, mini: list[int], size: int, order: str) -> list[list[int]]:
    """The row indices `mini` in micro-batches of `size` (`trainer.micro_batch_order`): consecutive in pool order,
    or, with `length` and more than one micro-batch, longest first (prompt + response tokens; ties keep pool order),
    so that each micro-batch pads its rows to about their own length."""
    if order == "length" and len(mini) > size:
        mini = sorted(mini, key=lambda i: -(len(rows[i].prompt_ids) + len(rows[i].response_ids)))
    return [mini[start : start + size] for start in range(0, len(mini), size)]


def _take_proximal(name: str, index: int, own: int, rows: list[LearnerRow], reply: ProximalLogprobs) -> None:
    """The proximal log-probs of a lagged update's own rows, by row index: the pool's first `own` rows are the
    agent's own, in the order it sampled them (the keep rule keeps them all, `hacrl.core.sharing.kept_rows`); the
    values are checked as `_check_rows` checks the others."""
    if sum(r.source == index for r in rows) != own or any(r.source != index for r in rows[:own]):
        raise RuntimeError(f"agent {name!r}: the pool's own rows are not the ones whose proximal pass was made")
    if any(not 0 <= i < own for i in reply.rows) or len(reply.rows) != len(reply.values):
        raise RuntimeError(f"agent {name!r}: its proximal pass names rows {reply.rows[:3]}..., it has {own} own rows")
    values = [torch.tensor(v, dtype=torch.float32) for v in reply.values]
    if not all(bool(torch.isfinite(v).all()) for v in values):
        raise ValueError(f"agent {name!r}: its old log-probs hold non-finite values (a diverged model?)")
    for i, logp in zip(reply.rows, values, strict=True):
        rows[i].old_logp = logp


def _pool_metrics(rows: list[LearnerRow], index: int, centres: list[float] | None) -> dict[str, float]:
    """What an update trained on: its rows and tokens, and of the foreign rows their length, the share cut to the
    learner's limit, the empty ones, and their mean centre (`algorithm.foreign_center`)."""
    metrics = {
        "trained_sequences": sum(bool(r.response_ids) for r in rows),
        "trained_tokens": sum(len(r.prompt_ids) + len(r.response_ids) for r in rows if r.response_ids),
    }
    foreign = [r for r in rows if r.source != index]
    if foreign:
        metrics["foreign_length_mean"] = sum(len(r.response_ids) for r in foreign) / len(foreign)
        metrics["foreign_cut_frac"] = sum(r.cut for r in foreign) / len(foreign)
        metrics["foreign_empty"] = sum(not r.response_ids for r in foreign)
    if centres:
        metrics["foreign_center"] = sum(centres) / len(centres)
    return metrics


def _shifts(rows: list[LearnerRow], device: torch.device) -> torch.Tensor | None:
    """The rows' `foreign_shift`s (`algorithm.foreign_center`), None where every one is 0 (the paper's window)."""
    shifts = [r.foreign_shift for r in rows]
    return torch.tensor(shifts, dtype=torch.float64, device=device) if any(shifts) else None


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
            settings = {"lr": agent.cfg.lr, "betas": tuple(agent.cfg.betas), "weight_decay": agent.cfg.weight_decay}
            optimizer.load_state_dict(read_optimizer(file, f"agent {agent.name!r}", where, settings))
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


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p
