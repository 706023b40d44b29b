"""The training loop (spec 2), for N >= 1 agents and any registered algorithm.

One step, top to bottom:
    1. take B prompts
    2. every agent samples G responses per prompt (all sample before any update)
    3. score every response on its decoded text (in time-limited scoring processes: `hacrl.scoring`)
    4. each agent's pre-update ("old") log-probs of its own responses
    5. update the capability tracker from this step's rewards
    6. for each learner: its pool (own first, then the others in config order, when the algorithm shares), its
       advantages, then mini-batch updates in pool order with the stepwise index m and gradient accumulation
    7. log; evaluate every `eval.every` steps; checkpoint every `checkpoint.every` steps

Around the loop (see README, "Failure and safety"): the run directory is locked for the trainer's lifetime; a
resume takes the newest checkpoint that passes its checks and refuses settings that would change the numbers;
SIGTERM or Ctrl-C finish the current step, write a checkpoint and raise `TrainingInterrupted`.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import weakref
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from hacrl import faults
from hacrl.agents import Agent
from hacrl.checkpoint import (
    agent_weights_dir,
    latest_checkpoint,
    load_training_state,
    read_checkpoint_state,
    remove_stale_temporaries,
    resume_point,
    save_checkpoint,
)
from hacrl.config import TrainConfig, config_to_yaml, resume_differences, save_config
from hacrl.core import CapabilityTracker, LossInputs, get_algorithm, step_mean_rewards
from hacrl.data import Example, PromptStream, load_task
from hacrl.errors import CheckpointError, RunDirError, TrainingInterrupted, warn
from hacrl.evaluation import evaluate
from hacrl.exchange import LearnerRow, Trajectory, learner_pool, learner_view
from hacrl.logger import MetricsLogger
from hacrl.rollout import Sample, TokenBatch, generate, token_logprobs
from hacrl.rundir import RunLock, last_logged_step, trim_metrics
from hacrl.scoring import ScoreResult, scorer_for


class Trainer:
    """Owns one run directory (locked until `close`, which `train` calls) and the agents trained in it."""

    def __init__(self, config: TrainConfig, *, resume: str | None = None) -> None:
        self.config = config
        self.run_dir = Path(config.trainer.output_dir)
        self._logger: MetricsLogger | None = None
        self.lock = RunLock(self.run_dir, notice=self.notice).acquire()
        self._release = weakref.finalize(self, self.lock.release)  # also when a Trainer is dropped without close()
        try:
            self._setup(resume or config.checkpoint.resume)
        except BaseException:
            self.close()
            raise

    def _setup(self, resume: str) -> None:
        config = self.config
        self.algorithm = get_algorithm(config.algorithm.name)
        self.params = config.algorithm.params()
        remove_stale_temporaries(self.run_dir, self.notice)
        checkpoint = self._choose_checkpoint(resume)
        names = [a.name for a in config.agents]
        state = read_checkpoint_state(checkpoint, names) if checkpoint else None
        if checkpoint:
            self._check_resume_settings(checkpoint, state)
        self.task = load_task(config.data)
        self.scorer = scorer_for(self.task, config.data, r_max=self.params.r_max).start()
        self.stream = PromptStream(self.task.train, seed=config.trainer.seed)
        self.tracker = CapabilityTracker(
            len(config.agents),
            window=config.algorithm.capability_window,
            warmup_steps=config.algorithm.capability_warmup_steps,
        )
        self.step = 0
        self.history: list[dict[str, Any]] = []
        torch.manual_seed(config.trainer.seed)
        self.agents = [
            Agent(
                i,
                cfg,
                config.rollout,
                with_reference=config.algorithm.kl_coef > 0,
                weights_from=agent_weights_dir(checkpoint, cfg.name) if checkpoint else None,
            )
            for i, cfg in enumerate(config.agents)
        ]
        if state is not None:
            load_training_state(checkpoint, self.agents)
            self.step = state["step"]
            self.tracker.load_state_dict(state["capability"])
            self.stream.load_state_dict(state["data"])
        self.resumed_from = checkpoint

    def _choose_checkpoint(self, resume: str) -> Path | None:
        """`never`: none. A path: that one, or an error. `auto`: the newest good one; none when the run stopped
        before its first checkpoint (it starts again from step 0: `self.restarting`)."""
        self.restarting = False
        if resume == "never":
            return None
        if resume != "auto":
            return Path(resume)
        checkpoint, damaged = resume_point(
            self.run_dir, verify_digests=self.config.checkpoint.verify_digests, notice=self.notice
        )
        if checkpoint is None and damaged:
            raise CheckpointError(
                f"no usable checkpoint in {str(self.run_dir)!r}: every one is damaged ({len(damaged)}, kept as "
                "step_N.damaged). To train again from step 0, move the run directory away or choose another "
                "trainer.output_dir."
            )
        if checkpoint is None and (self.run_dir / "metrics.jsonl").exists():
            last = last_logged_step(self.run_dir / "metrics.jsonl")
            self.notice(
                f"{self.run_dir} has no checkpoint: the earlier attempt stopped before its first one"
                f"{f' (it logged up to step {last})' if last is not None else ''}. Starting again from step 0 in "
                "place; its metrics.jsonl is replaced."
            )
            self.restarting = True
        return checkpoint

    def _check_resume_settings(self, checkpoint: Path, state: dict[str, Any]) -> None:
        import yaml

        saved_file = checkpoint / "config.yaml"
        if saved_file.is_file():
            refused, not_exact = resume_differences(yaml.safe_load(saved_file.read_text()) or {}, self.config)
        else:  # checkpoints of early versions record only the algorithm
            saved = state.get("algorithm", self.config.algorithm.name)
            now = self.config.algorithm.name
            refused = [] if saved == now else [f"algorithm.name: {saved!r} in the checkpoint, {now!r} now"]
            not_exact = []
        if refused and self.config.checkpoint.strict_resume:
            raise CheckpointError(
                f"resuming from {checkpoint} would change settings of the run that wrote it, so it would not "
                "continue that run: " + "; ".join(refused) + ". Set them back, or start a new run in another "
                "trainer.output_dir. Safe to change on resume: trainer.steps, eval.*, logging.*, checkpoint.*, "
                "data.reward_* (timeouts, workers); allowed but no longer bit-exact: agents.<i>.device / model / "
                "tokenizer paths, trainer.micro_batch_size, trainer.logprob_batch_size. To resume anyway, set "
                "checkpoint.strict_resume=false."
            )
        for line in refused:
            warn(f"resuming with a changed setting (checkpoint.strict_resume=false): {line}")
        for line in not_exact:
            self.notice(f"resuming with {line}: allowed, but no longer bit-identical to an uninterrupted run")

    def notice(self, message: str) -> None:
        """Something the user should see now (a fallback, a takeover, a stop): the console, or stderr."""
        if self._logger is not None:
            self._logger.print(message)
        else:
            print(f"hacrl: {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Release the run directory (idempotent). The agents stay usable."""
        self._release()

    # -- the loop ------------------------------------------------------------------------------------------------

    def train(self) -> list[dict[str, Any]]:
        cfg = self.config
        try:
            self._prepare_run_dir()
            save_config(cfg, self.run_dir / "config.yaml")
            purge = self.step + 1 if self.resumed_from else 0 if self.restarting else None
            self._logger = MetricsLogger(
                cfg.logging, self.run_dir, cfg.trainer.steps, [a.name for a in self.agents], purge_step=purge
            )
            if self.resumed_from:
                self._logger.print(f"resumed from {self.resumed_from} at step {self.step}")
            with _GracefulStop(self.notice, lambda: self.step) as stop:
                self._loop(stop)
        finally:
            if self._logger is not None:
                self._logger.close()
                self._logger = None
            self.close()
        return self.history

    def _loop(self, stop: _GracefulStop) -> None:
        cfg = self.config
        last_saved = self.step if self.resumed_from else None
        if self.step == 0 and cfg.eval.at_start:
            self._logger.log(0, self.evaluate())
        for step in range(self.step + 1, cfg.trainer.steps + 1):
            if stop.signum is not None:
                break
            metrics = self.train_step()
            self.step = step
            if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.trainer.steps:
                metrics.update(self.evaluate())
            if step == cfg.trainer.steps:
                metrics.update(self.evaluate())
            self._logger.log(step, metrics)
            self._logger.step_done(step, metrics)
            self.history.append({"step": step, **metrics})
            if (cfg.checkpoint.every and step % cfg.checkpoint.every == 0) or step == cfg.trainer.steps:
                self.save()
                last_saved = step
        if stop.signum is not None and self.step < cfg.trainer.steps:
            name = signal.Signals(stop.signum).name
            if self.step > 0 and last_saved != self.step:
                where = f"wrote checkpoint {self.save()}"
            elif last_saved is not None:
                where = f"its latest checkpoint is {latest_checkpoint(self.run_dir)}"
            else:
                where = "no step had finished, so there is nothing to save"
            raise TrainingInterrupted(
                f"stopped by {name} after step {self.step} of {cfg.trainer.steps}; {where}. Continue with "
                f"`hacrl train <config> --resume` (trainer.output_dir={str(self.run_dir)!r}).",
                stop.signum,
            )

    def _prepare_run_dir(self) -> None:
        """A fresh run never writes into an old one; a resumed run drops metrics logged after its checkpoint."""
        metrics = self.run_dir / "metrics.jsonl"
        if self.resumed_from is None and not self.restarting:
            if metrics.exists() or latest_checkpoint(self.run_dir) is not None:
                last = last_logged_step(metrics) if metrics.exists() else None
                has_checkpoint = latest_checkpoint(self.run_dir) is not None
                what = f"metrics up to step {last}" if last is not None else "an earlier run"
                how = (
                    "continue it with --resume (or checkpoint.resume=auto)"
                    if has_checkpoint
                    else "it has no checkpoint, so --resume starts it again from step 0 in place"
                )
                raise RunDirError(
                    f"trainer.output_dir={str(self.run_dir)!r} already holds a run ({what}"
                    f"{', with checkpoints' if has_checkpoint else ''}); {how}, or choose another trainer.output_dir"
                )
        elif metrics.exists():
            trim_metrics(metrics, self.step if self.resumed_from else None, notice=self.notice)
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def train_step(self) -> dict[str, Any]:
        cfg, n = self.config, len(self.agents)
        metrics: dict[str, Any] = {}
        timer = _Timer()
        batch = self.stream.next_batch(cfg.trainer.prompts_per_step)  # 1. prompts

        with timer("sampling"):  # 2. every agent samples before any update
            rendered = [[agent.render_prompt(ex.messages)[0] for ex in batch] for agent in self.agents]
            samples = []
            for j, agent in enumerate(self.agents):
                samples.append(
                    generate(agent, rendered[j], cfg.rollout.group_size, batch_size=cfg.trainer.logprob_batch_size)
                )
                faults.hit("sampling")
        with timer("scoring"):  # 3. rewards on decoded text, time-limited
            scored = []
            for j in range(n):
                scored.append(self._score(batch, samples[j], cfg.rollout.group_size))
                faults.hit("scoring")
            rewards = [result.rewards for result in scored]
        with timer("logprobs"):  # 4. pre-update log-probs of own responses
            old_logp = [self._old_logprobs(agent, samples[j]) for j, agent in enumerate(self.agents)]

        pool = [
            Trajectory(
                group=i // cfg.rollout.group_size,
                messages=batch[i // cfg.rollout.group_size].messages,
                text=s.text,
                reward=rewards[j][i],
                source=j,
                source_logp_sum=float(old_logp[j][i].sum()),
                source_num_tokens=len(s.response_ids),
                finish_reason=s.finish_reason,
            )
            for j in range(n)
            for i, s in enumerate(samples[j])
        ]
        all_rewards = torch.tensor([t.reward for t in pool], dtype=torch.float64)
        all_sources = torch.tensor([t.source for t in pool])
        self.tracker.update(step_mean_rewards(all_rewards, all_sources, n))  # 5. capabilities
        capabilities = self.tracker.capabilities()

        with timer("update"):  # 6. each learner's update on the same pre-update pool
            for k, agent in enumerate(self.agents):
                own_first = learner_pool(pool, k, shared=self.algorithm.pool_is_shared(self.params))
                rows = learner_view(agent, own_first, rendered[k], [s.response_ids for s in samples[k]], old_logp[k])
                metrics.update(_prefixed(agent.name, self._update(agent, rows, capabilities)))

        generated = sum(len(s.response_ids) for per_agent in samples for s in per_agent)
        for j, agent in enumerate(self.agents):
            metrics.update(_prefixed(agent.name, self._rollout_metrics(j, samples[j], rewards[j], capabilities)))
            metrics[f"{agent.name}/reward_timeouts"] = len(scored[j].timeouts)
            metrics[f"{agent.name}/reward_errors"] = len(scored[j].errors)
        metrics.update({f"time/{k}": v for k, v in timer.totals.items()})
        metrics["time/step"] = sum(timer.totals.values())
        metrics["tokens_per_second/sampling"] = generated / max(timer.totals["sampling"], 1e-9)
        return metrics

    # -- phases ----------------------------------------------------------------------------------------------------

    def _score(self, batch: list[Example], samples: list[Sample], group_size: int) -> ScoreResult:
        examples = [batch[i // group_size] for i in range(len(samples))]
        columns = {key: [ex.columns.get(key) for ex in examples] for key in examples[0].columns}
        return self.scorer.score([ex.prompt for ex in examples], [s.text for s in samples], columns)

    @torch.no_grad()
    def _old_logprobs(self, agent: Agent, samples: list[Sample]) -> list[torch.Tensor]:
        """Per-token log-probs (CPU, one tensor per response) of each own response under the current weights."""
        out: list[torch.Tensor] = []
        size = self.config.trainer.logprob_batch_size
        for start in range(0, len(samples), size):
            chunk = samples[start : start + size]
            tb = TokenBatch.build(
                [s.prompt_ids for s in chunk], [s.response_ids for s in chunk], agent.pad_id, agent.device
            )
            logp = token_logprobs(agent.model, tb, agent.temperature)
            out.extend(logp[i][tb.response_mask[i]].cpu() for i in range(len(chunk)))
        return out

    def _update(self, agent: Agent, rows: list[LearnerRow], capabilities: torch.Tensor) -> dict[str, float]:
        """Advantages over the learner's pool, then one optimizer step per mini-batch in pool order."""
        cfg = self.config.trainer
        adv = self.algorithm.advantages(
            torch.tensor([r.reward for r in rows], dtype=torch.float64),
            torch.tensor([r.group for r in rows]),
            torch.tensor([r.source for r in rows]),
            learner=agent.index,
            capabilities=capabilities,
            params=self.params,
        ).tolist()
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, float] = defaultdict(float)
        skipped = 0
        for m, start in enumerate(range(0, len(rows), cfg.mini_batch_size)):
            # rows that are empty in the learner's tokens (an unfinished empty response) cannot enter the loss
            mini = [i for i in range(start, min(start + cfg.mini_batch_size, len(rows))) if rows[i].response_ids]
            if not mini:
                continue
            num_own = sum(rows[i].source == agent.index for i in mini)
            agent.optimizer.zero_grad(set_to_none=True)
            for micro_start in range(0, len(mini), cfg.micro_batch_size):
                micro = mini[micro_start : micro_start + cfg.micro_batch_size]
                out = self._micro_batch_loss(
                    agent,
                    [rows[i] for i in micro],
                    [adv[i] for i in micro],
                    capabilities,
                    step_index=m,
                    num_seqs=len(mini),
                    num_own=max(num_own, 1),
                )
                out.loss.backward()
                faults.hit("update.micro_batch")
                for key, value in out.metrics.items():
                    weight = _metric_weight(key, out.metrics)
                    sums[key] += float(value) * weight
                    counts[key] += 0.0 if key in _ADDITIVE else weight
            for key in _ADDITIVE & set(out.metrics):  # micro-batch parts add up to the mini-batch's value
                counts[key] += 1
            grad_norm = torch.nn.utils.clip_grad_norm_(agent.trainable_parameters(), agent.cfg.grad_clip)
            if torch.isfinite(grad_norm):
                agent.optimizer.step()
                faults.hit("update.optimizer")
                sums["grad_norm"] += float(grad_norm)
                counts["grad_norm"] += 1
            else:  # spec 3.6: a non-finite gradient skips the step, and we say so
                agent.optimizer.zero_grad(set_to_none=True)
                skipped += 1
        metrics = {k: sums[k] / counts[k] for k in sums if counts[k] > 0 and not k.startswith("num_")}
        metrics["skipped_steps"] = skipped
        metrics["optimizer_steps"] = len(range(0, len(rows), cfg.mini_batch_size))
        metrics["trained_sequences"] = sum(bool(r.response_ids) for r in rows)
        foreign = [r for r in rows if r.source != agent.index]
        if foreign:
            metrics["foreign_length_mean"] = sum(len(r.response_ids) for r in foreign) / len(foreign)
            metrics["foreign_cut_frac"] = sum(r.cut for r in foreign) / len(foreign)
            metrics["foreign_empty"] = sum(not r.response_ids for r in foreign)
        metrics["advantage_abs_mean"] = sum(abs(a) for a in adv) / len(adv)
        return metrics

    def _micro_batch_loss(self, agent, rows, adv, capabilities, *, step_index, num_seqs, num_own):
        device = agent.device
        tb = TokenBatch.build([r.prompt_ids for r in rows], [r.response_ids for r in rows], agent.pad_id, device)
        logp = token_logprobs(agent.model, tb, agent.temperature)
        old = torch.zeros_like(logp)
        for i, r in enumerate(rows):
            if r.old_logp is not None:
                old[i, tb.response_mask[i]] = r.old_logp.to(device, old.dtype)
        ref = None
        if agent.ref_model is not None:
            with torch.no_grad():
                ref = token_logprobs(agent.ref_model, tb, agent.temperature)
        inputs = LossInputs(
            logp=logp,
            mask=tb.response_mask,
            old_logp=old,
            source_logp_mean=torch.tensor([r.source_logp_mean for r in rows], dtype=torch.float32, device=device),
            adv=torch.tensor(adv, dtype=torch.float32, device=device),
            source=torch.tensor([r.source for r in rows], device=device),
            learner=agent.index,
            capabilities=capabilities.to(device),
            ref_logp=ref,
            num_seqs=num_seqs,
            num_own=num_own,
        )
        return self.algorithm.loss(inputs, params=self.params, step_index=step_index)

    def _rollout_metrics(self, j: int, samples: list[Sample], rewards: list[float], capabilities) -> dict[str, float]:
        g = self.config.rollout.group_size
        groups = [rewards[i : i + g] for i in range(0, len(rewards), g)]
        out = {
            "reward_mean": sum(rewards) / len(rewards),
            "accuracy": sum(r >= self.params.r_max for r in rewards) / len(rewards),
            "capability": float(capabilities[j]),
            "response_length_mean": sum(len(s.response_ids) for s in samples) / len(samples),
            "finished_frac": sum(s.finished for s in samples) / len(samples),
            "informative_group_frac": sum(max(x) > min(x) for x in groups) / len(groups),
        }
        if self.algorithm.pool_is_shared(self.params) and len(self.agents) > 1:
            rho = self.tracker.loss_coefficients(j)
            for src, other in enumerate(self.agents):
                if src != j:
                    out[f"rho/{other.name}"] = float(rho[src]) if self.params.capability_coef else 1.0
        return out

    def evaluate(self) -> dict[str, float]:
        """Each agent alone on the eval split. Sampled evaluation draws from its own random stream (seeded by the
        run's seed and the step), so evaluating, or changing eval.* on resume, never changes training."""
        cfg = self.config
        examples = self.task.eval[: cfg.eval.max_prompts] if cfg.eval.max_prompts else self.task.eval
        out: dict[str, float] = {}
        cuda = sorted({a.device.index or 0 for a in self.agents if a.device.type == "cuda"})
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(cfg.trainer.seed * 1_000_003 + self.step)
            for agent in self.agents:
                result = evaluate(
                    agent,
                    examples,
                    self.scorer,
                    num_samples=cfg.eval.num_samples,
                    batch_size=cfg.eval.batch_size,
                )
                out.update({f"eval/{agent.name}/{k}": v for k, v in result.items()})
        return out

    def save(self) -> Path:
        state = {
            "step": self.step,
            "agents": [a.name for a in self.agents],
            "capability": self.tracker.state_dict(),
            "data": self.stream.state_dict(),
            "algorithm": self.config.algorithm.name,
        }
        return save_checkpoint(
            self.run_dir,
            self.step,
            self.agents,
            state,
            keep_last=self.config.checkpoint.keep_last,
            config_yaml=config_to_yaml(self.config),
        )


def _prefixed(name: str, metrics: dict[str, Any]) -> dict[str, Any]:
    return {f"{name}/{k}": v for k, v in metrics.items()}


_ADDITIVE = {"loss", "policy_loss", "kl"}


def _metric_weight(key: str, metrics: dict[str, torch.Tensor]) -> float:
    """Weight of a micro-batch's metric when averaging: own/foreign means by their row counts."""
    if key.startswith("own_"):
        return float(metrics["num_own"])
    if key.startswith("foreign_") or key.startswith("rho_"):
        return float(metrics["num_foreign"])
    return 1.0


class _GracefulStop:
    """SIGTERM / SIGINT while training: note it, let the loop finish its step and checkpoint. A second Ctrl-C
    stops at once (KeyboardInterrupt). Installed only in the main thread (signals cannot be caught elsewhere)."""

    def __init__(self, notice, current_step) -> None:
        self.signum: int | None = None
        self._notice = notice
        self._current_step = current_step
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.signum = signum
        again = " (Ctrl-C again stops at once, without a checkpoint)" if signum == signal.SIGINT else ""
        self._notice(
            f"{signal.Signals(signum).name} received: finishing step {self._current_step() + 1}, then writing a "
            f"checkpoint and stopping{again}"
        )

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _Timer:
    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)

    def __call__(self, name: str):
        timer = self

        class _Span:
            def __enter__(self):
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                timer.totals[name] += time.perf_counter() - self.start

        return _Span()
