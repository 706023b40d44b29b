"""The driver: the training loop (spec 2) for N >= 1 agents and any registered algorithm, and the one owner of a
step at any lag (`trainer.lag` = k; lag 0 is k = 0).

The driver owns the data stream, scoring, the capability tracker, pool assembly, logging, the evaluation schedule
and checkpoint coordination; each agent's tensors live in its worker (`hacrl.agent.worker`), which runs in this process,
in processes of this machine or as a Ray actor (`runtime.backend`). Only prompts, trajectories, capabilities and
metrics cross. One step (`Trainer.train_step`) trains on batch t, sampled k steps ago, and samples batch t + k:

    k = 0     prompts -> sample t -> score t -> capabilities -> learn t
    k >= 1    capabilities (batch t was scored a step ago) -> the proximal pass -> sample t + k and learn t at once,
              prompts t + k scored beside the learns -> the weight link
    then      log; evaluate every `eval.every` steps; checkpoint every `checkpoint.every` steps

    prompts             the stream's next B prompts
    sample              every agent's sampling role (its sampler of its own, else its learner): G responses per
                        prompt and their behaviour log-probs; every agent samples before any update
    score               every response on its decoded text, in time-limited scoring processes (`hacrl.driver.scoring`);
                        at k >= 1 in a thread of the driver while the learners learn
    capabilities        the tracker takes the batch's rewards (spec 3.1)
    learn               every learning role: its own rows first, then the others' scored answers when the algorithm
                        shares (the step's pool sent once for all, `Transport.share`, each learner taking its foreign
                        rows from it); mini-batch updates
    the proximal pass   an agent's sampler of its own computes the proximal log-probs of its learner's own rows after
                        the first mini-batch (it holds the weights the update starts from) while that mini-batch trains
    the weight link     the learner's weights after update t to its sampler, for a link whose two ends meet
                        (`hacrl.agent.weightsync`: a broadcast, or Ray's handed copy); shared memory is read by the
                        sampler itself just before the batch that needs it

`Trainer` decides what a step does; `Schedule` sends its calls, in that order, through a transport
(`hacrl.driver.backends`), which only carries them: on Ray the proximal pass, the samples and the learns all run at
once (an actor runs its calls in order), on the local backend the learners run in the driver while the samplers'
processes sample. A checkpoint takes each sampler's random stream into its learner's part (`Schedule.save`), so a
checkpoint is the same with or without samplers and resumes either way.

Around the loop (`hacrl.driver.runloop.RunLoop`, shared with `hacrl control`; docs/reliability.md, "Failure and
safety"): the run directory is locked for the trainer's lifetime; a resume takes the newest checkpoint that passes
its checks and refuses settings that would change the numbers; SIGTERM or Ctrl-C finish the current step, write a
checkpoint and raise `TrainingInterrupted`.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from hacrl import faults, seeds
from hacrl.checkpoint import driver_state, remove_stale_temporaries, save_checkpoint
from hacrl.config import TrainConfig, config_to_yaml, save_config
from hacrl.config.settings import AgentSettings
from hacrl.config.validation import check_devices_here
from hacrl.core import CapabilityTracker, get_algorithm, step_mean_rewards
from hacrl.driver.backends import Handle, Transport, host_workers_here, start_transport
from hacrl.driver.evaluation import evaluate_agents, write_benchmark_table, write_eval_records
from hacrl.driver.metrics import agent_key, eval_key
from hacrl.driver.pace import pace_metrics, pace_summary, pipeline_pace, run_shape
from hacrl.driver.resume import plan_resume
from hacrl.driver.runloop import RunLoop
from hacrl.driver.scoring import ScoreResult, math_scorer, scorer_for
from hacrl.errors import restoring
from hacrl.inflight import Pending, read_pending, write_pending
from hacrl.messages import Completion, GenerateCall, LearnCall, Learned, SampleCall, Sampled, Trajectory, WorkerSpec
from hacrl.model_dirs import require_model_dir
from hacrl.provenance import LogprobPlan
from hacrl.tasks.data import Example, PromptStream, load_benchmark, load_task

T = TypeVar("T")


class Trainer(RunLoop):
    """The driver of one run: owns its run directory (locked until `close`, which `train` calls) and the agent
    workers trained in it. The run around the steps (directory, logger, schedule, graceful stop) is `RunLoop`'s."""

    command = "hacrl train"

    def __init__(self, config: TrainConfig, *, resume: str | None = None) -> None:
        self.schedule: Schedule | None = None
        super().__init__(config, resume=resume)

    def _setup(self, resume: str) -> None:
        config = self.config
        host_workers_here(config.runtime)  # before this process allocates a tensor
        self.algorithm, self.params = get_algorithm(config.algorithm.name), config.algorithm.params()
        remove_stale_temporaries(self.run_dir, self.notice)
        self.plan = plan = plan_resume(config, self.run_dir, resume, self.notice)
        names = [a.name for a in config.agents]
        self.pending: deque[Pending] = deque()
        """trainer.lag > 0: the batches sampled and scored but not yet trained on (steps step + 1 .. step + k)."""
        if plan.checkpoint is not None:  # before any model loads: a file that changed since its check fails fast
            self.pending = deque(read_pending(plan.checkpoint, plan.step, config.trainer.lag, self.notice))
        self.frozen = [a.frozen for a in config.agents]
        if config.runtime.backend == "local":  # a Ray worker may run on another machine: its own start checks
            check_devices_here(config)
        if config.runtime.backend == "local" and plan.checkpoint is None:
            # a fresh start needs every model directory: say so before the data (a Hub set can take a minute to fail
            # offline); a resume may need none (a checkpoint holds full weights), a Ray worker may see other paths:
            # those are checked where the weights load
            for i, agent in enumerate(config.agents):
                require_model_dir(agent.model, f"agents.{i}.model")
        self.task = load_task(config.data, config.scoring)
        self.scorer = scorer_for(self.task, config.scoring, r_max=self.params.r_max).start()
        self.stream = PromptStream(self.task.train, seed=config.trainer.seed)
        self.benchmarks = {  # eval.benchmarks: named sets, each agent alone, scored by the math verifier
            name: load_benchmark(config.data, name, config.eval.max_prompts) for name in config.eval.benchmarks
        }
        self.benchmark_scorer = (
            math_scorer(config.scoring, r_max=self.params.r_max).start() if self.benchmarks else None
        )
        self.tracker = CapabilityTracker(
            len(config.agents),
            window=config.algorithm.capability_window,
            warmup_steps=config.algorithm.capability_warmup_steps,
        )
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.names = names
        self.group_sizes = [AgentSettings.resolve(a, config.rollout).group_size for a in config.agents]
        """Each agent's answers per prompt (`agents.<i>.group_size`, else `rollout.group_size`)."""
        specs = [
            WorkerSpec(
                index=i,
                agent=cfg,
                rollout=config.rollout,
                trainer=config.trainer,
                algorithm=config.algorithm,
                weights_from=plan.weights_from(cfg),
                torch_threads=config.runtime.torch_threads,
                host_memory=config.runtime.host_memory,
                eval_batch_size=config.eval.batch_size,
                num_agents=len(config.agents),
                sharing=config.sharing,
                agent_names=tuple(names),
            )
            for i, cfg in enumerate(config.agents)
        ]
        self.schedule = Schedule.start(config.runtime, specs)
        self.scorer.wait_ready()  # its reward module imported (in the scoring processes) while the models loaded
        if plan.checkpoint is not None:
            self._restore(plan)

    def _restore(self, plan) -> None:
        """The checkpoint's state: the workers' parts, the step, the capability history, the data position and the
        batches in flight."""
        self.schedule.load(str(plan.checkpoint))
        self.step = plan.step
        with restoring(plan.checkpoint, "capability history and data position"):
            self.tracker.load_state_dict(plan.state["capability"])
            self.stream.load_state_dict(plan.state["data"])

    def close(self, *, force: bool = False) -> None:
        """Stop the workers and release the run directory (idempotent; the scorers are shared across trainers in
        a process, `hacrl.driver.scoring.shared_scorer`, and stop at its exit)."""
        if self.schedule is not None:
            schedule, self.schedule = self.schedule, None
            try:
                schedule.close(force=force)
            finally:
                super().close()
            return
        super().close()

    def _write_config(self, path: Path) -> None:
        save_config(self.config, path)

    def _finished(self) -> str | None:
        records = self._run_records()
        parts = [self.sharing_summary(records) if self.config.sharing.policy != "all" else None]
        if len(self.names) > 1:
            parts.append(pace_summary(records, run_shape(self.config, concurrent=self.schedule.concurrent)))
        return "\n".join(p for p in parts if p) or None

    def _run_records(self) -> list[dict[str, Any]]:
        """Every record of the run, resumed parts included (metrics.jsonl where it is written)."""
        import json

        path = self.run_dir / "metrics.jsonl"
        if self.config.logging.jsonl and path.is_file():
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return self.history

    # -- one step --------------------------------------------------------------------------------------------------

    def train_step(self) -> dict[str, Any]:
        """One step at `trainer.lag` = k (the module's order): train on batch t, sampled k steps ago, while
        batch t + k is sampled by the weights before this update and scored on the driver meanwhile. At k = 0 batch t
        is sampled and scored first (every agent samples before any update); at k >= 1 the run's first step first
        samples batches 1..k by the starting weights (a resumed run has them from its checkpoint)."""
        step, k = self.step + 1, self.config.trainer.lag
        totals: dict[str, float] = defaultdict(float)
        start = time.perf_counter()
        if k == 0:  # prompts; every agent samples (keeping its old log-probs); rewards on decoded text
            batch, sampled = self._sample(step)
            totals["sampling"] = (began := time.perf_counter()) - start
            self.pending.append(Pending(step, sampled, self._score_all(batch, [s.trajectories for s in sampled])))
            faults.hit("scoring")
            totals["scoring"] = time.perf_counter() - began
        while len(self.pending) < k:  # the run's start: batches step .. step + k - 1, by the starting weights
            s = step + len(self.pending)
            batch, sampled = self._sample(s)
            self.pending.append(Pending(s, sampled, self._score_all(batch, [x.trajectories for x in sampled])))
            totals["fill"] = time.perf_counter() - start
        current = self.pending.popleft()
        if current.step != step:
            raise RuntimeError(f"the pipeline holds batch {current.step} where step {step} should train")
        pool, capabilities, calls = self._learn_calls(current)  # capabilities; each learner's call
        shared = pool if self.algorithm.pool_is_shared(self.params) else None
        if k == 0:
            began = time.perf_counter()
            learned = self.schedule.learn(calls, shared)
            totals["update"] = time.perf_counter() - began
            return self._step_metrics(pool, current.sampled, current.scored, learned, capabilities, totals)
        batch, sample_start = self.stream.next_batch(self.config.trainer.prompts_per_step), time.perf_counter()
        prompts = [ex.messages for ex in batch]

        def score(sampled: list[Sampled]) -> tuple[list[ScoreResult], float, float]:
            began = time.perf_counter()
            scored = self._score_all(batch, [s.trajectories for s in sampled])
            faults.hit("scoring")
            return scored, began, time.perf_counter()

        new, (scored, scoring_began, scoring_ended), learned = self.schedule.step(
            [SampleCall(step + k, prompts, g) for g in self.group_sizes], calls, shared, score
        )
        end = time.perf_counter()
        self.pending.append(Pending(step + k, new, scored))
        totals["sampling"] = scoring_began - sample_start
        totals["update"] = end - scoring_began
        totals["scoring_overlapped"] = scoring_ended - scoring_began
        return self._step_metrics(pool, current.sampled, current.scored, learned, capabilities, totals, now=new)

    def _sample(self, step: int) -> tuple[list[Example], list[Sampled]]:
        """The next B prompts of the stream, and every agent's answers to them as batch `step`."""
        batch = self.stream.next_batch(self.config.trainer.prompts_per_step)
        prompts = [ex.messages for ex in batch]
        return batch, self.schedule.sample([SampleCall(step, prompts, g) for g in self.group_sizes])

    def _learn_calls(self, batch: Pending) -> tuple[list[Trajectory], torch.Tensor, list[LearnCall]]:
        """The scored pool of `batch`, the capabilities after its rewards (the tracker takes them here, once per
        step) and each learner's call: its own rewards (and rollout, when it waited). The others' scored answers
        are not in the calls: the schedule sends the pool once and each learner takes its own (`Schedule.learn`)."""
        n, sampled, scored = len(self.names), batch.sampled, batch.scored
        pool = [
            replace(t, reward=reward)
            for j in range(n)
            for t, reward in zip(sampled[j].trajectories, scored[j].rewards, strict=True)
        ]
        all_rewards = torch.tensor([t.reward for t in pool], dtype=torch.float64)
        all_sources = torch.tensor([t.source for t in pool])
        self.tracker.update(step_mean_rewards(all_rewards, all_sources, n))
        capabilities = self.tracker.capabilities()
        caps = capabilities.tolist()
        calls = [LearnCall(batch.step, list(scored[k].rewards), [], caps, rollout=sampled[k].rollout) for k in range(n)]
        return pool, capabilities, calls

    def _step_metrics(self, pool, sampled, scored, learned, capabilities, totals, *, now=None) -> dict[str, Any]:
        """The step's record: each agent's rollout (of the batch trained on), update, timing and pace metrics, then
        the step's own. `now`: the batch sampled in this step when it is not the one trained on (trainer.lag)."""
        n = len(self.names)
        shared = self.algorithm.pool_is_shared(self.params)
        timing = sampled if now is None else now
        busy = {
            "sampling": [s.span[1] - s.span[0] for s in timing],
            "update": [r.span[1] - r.span[0] for r in learned],
        }
        if now is None:
            pace, step_pace = pace_metrics(busy, totals, totals["scoring"], concurrent=self.schedule.concurrent)
        else:
            wall = totals["sampling"] + totals["update"]
            beside = [bool(a.sampler_devices) for a in self.config.agents]
            concurrent = self.schedule.concurrent or any(beside)
            pace, step_pace = pipeline_pace(busy, wall, concurrent=concurrent, beside=beside)
        metrics: dict[str, Any] = {}
        for j, name in enumerate(self.names):
            own = [t for t in pool if t.source == j]
            agent = {
                **learned[j].metrics,
                **self._rollout_metrics(j, own, capabilities),
                "reward_timeouts": len(scored[j].timeouts),
                "reward_errors": len(scored[j].errors),
                "time/generate": timing[j].generate_s,
                "time/logprobs": timing[j].logprobs_s,
                "time/update": learned[j].update_s,
                **pace[j],
                **timing[j].metrics,
            }
            if "time/weight_sync" in agent:  # a sampler of its own: the learner's write + the sampler's read
                agent["time/weight_sync"] += timing[j].sync_s
            metrics.update({agent_key(name, k): v for k, v in agent.items()})
        if shared and n > 1:
            metrics["foreign_ratio_mode"] = self.params.foreign_ratio
        metrics.update({f"time/{k}": v for k, v in totals.items()})
        metrics["time/step"] = sum(v for k, v in totals.items() if k != "scoring_overlapped")
        metrics.update(step_pace)
        offload = [learned[j].metrics["time/offload"] for j in range(n) if "time/offload" in learned[j].metrics]
        if offload:  # inside the update phase: not added to time/step
            metrics["time/offload"] = sum(offload)
        tokens = sum(t.source_num_tokens for s in timing for t in s.trajectories)
        metrics["tokens_per_second/sampling"] = tokens / max(totals["sampling"], 1e-9)
        return metrics

    def sharing_summary(self, history: list[dict[str, Any]] | None = None) -> str:
        """The run's sharing in one line per learner: foreign rows kept of those offered, tokens not trained, update
        seconds and the seconds the policy saved (estimated from each update's speed); over the whole run, resumed
        parts included (`history`: the run's records; None: read them)."""
        history = self._run_records() if history is None else history
        lines = [f"sharing.policy={self.config.sharing.policy}:"]
        for name in self.names:

            def total(metric: str, name: str = name) -> float:
                return sum(r.get(agent_key(name, metric)) or 0 for r in history)

            offered = total("shared_offered")
            if not offered:
                continue
            kept, update, saved = total("shared_kept"), total("time/update"), total("time/update_saved_est")
            lines.append(
                f"  {name}: kept {kept:,.0f} of {offered:,.0f} foreign rows ({100 * kept / offered:.0f} %), "
                f"{total('shared_tokens_saved'):,.0f} tokens not trained; update {update:.1f} s, about {saved:.1f} s "
                "saved (estimated from each update's seconds per trained token)"
            )
        return "\n".join(lines)

    # -- phases ----------------------------------------------------------------------------------------------------

    def _score_all(self, batch: list[Example], per_agent: list[list[Trajectory]]) -> list[ScoreResult]:
        """Every agent's completions in one scoring call (the scoring processes take slices of them side by side),
        split back per agent."""
        examples = [batch[t.group] for trajectories in per_agent for t in trajectories]
        columns = {key: [ex.columns.get(key) for ex in examples] for key in examples[0].columns}
        texts = [t.text for trajectories in per_agent for t in trajectories]
        whole = self.scorer.score([ex.prompt for ex in examples], texts, columns)
        out, start = [], 0
        for trajectories in per_agent:
            end = start + len(trajectories)
            out.append(ScoreResult(
                whole.rewards[start:end],
                [i - start for i in whole.timeouts if start <= i < end],
                [i - start for i in whole.errors if start <= i < end],
            ))  # fmt: skip
            start = end
        return out

    def _rollout_metrics(self, j: int, own: list[Trajectory], capabilities) -> dict[str, float]:
        rewards = [t.reward for t in own]
        by_prompt: dict[int, list[float]] = defaultdict(list)
        for t in own:
            by_prompt[t.group].append(t.reward)
        groups = list(by_prompt.values())
        out = {
            "reward_mean": sum(rewards) / len(rewards),
            "accuracy": sum(r >= self.params.r_max for r in rewards) / len(rewards),
            "capability": float(capabilities[j]),
            "response_length_mean": sum(t.source_num_tokens for t in own) / len(own),
            "finished_frac": sum(t.finish_reason == "eos" for t in own) / len(own),
            "informative_group_frac": sum(max(x) > min(x) for x in groups) / len(groups),
        }
        if not self.frozen[j]:
            out.update(self.algorithm.rho_metrics(self.tracker.capabilities(), j, self.params, self.names))
        return out

    def evaluate(self) -> dict[str, float]:
        """Each agent alone on the eval split (concurrently on Ray). Sampled evaluation draws from a stream seeded
        by the run's seed, the step, the split and the agent (`seeds.evaluation`), so evaluating, or changing eval.*
        on resume, never changes training."""
        cfg, n = self.config, len(self.names)
        examples = self.task.eval[: cfg.eval.max_prompts] if cfg.eval.max_prompts else self.task.eval
        out: dict[str, float] = {}
        splits = [(None, examples, self.scorer)] if examples else []
        splits += [(name, rows, self.benchmark_scorer) for name, rows in self.benchmarks.items()]
        table: dict[str, dict[str, dict[str, float]]] = {name: {} for name in self.names}
        for benchmark, rows, scorer in splits:
            what = f"evaluating{f' on {benchmark}' if benchmark else ''} at step {self.step}"
            streams = [seeds.evaluation(cfg.trainer.seed, self.step, benchmark or "", j) for j in range(n)]
            results, greedy, rewards = evaluate_agents(
                rows,
                lambda calls, what=what: self.schedule.generate(calls, what=what),
                scorer,
                num_agents=n,
                num_samples=cfg.eval.num_samples,
                seeds=streams,
            )
            prefix = f"{benchmark}/" if benchmark else ""
            for name, result in zip(self.names, results, strict=True):
                out.update({eval_key(name, prefix + k): v for k, v in result.items()})
                if benchmark:
                    table[name][benchmark] = result
            if cfg.eval.save_completions:
                write_eval_records(self.run_dir, self.step, rows, self.names, greedy, rewards, benchmark)
        if self.benchmarks:
            write_benchmark_table(self.run_dir / "eval" / "benchmarks", self.step, table)
        return out

    def save(self) -> Path:
        state = driver_state(
            step=self.step,
            agents=self.names,
            capability=self.tracker.state_dict(),
            data=self.stream.state_dict(),
            algorithm=self.config.algorithm.name,
            frozen=[name for name, frozen in zip(self.names, self.frozen, strict=True) if frozen],
        )

        def write_parts(directory: Path) -> None:
            self.schedule.save(str(directory), what=f"writing checkpoint {self.step}")
            if self.config.trainer.lag:  # the batches in flight: steps step + 1 .. step + k
                write_pending(directory, list(self.pending))

        return save_checkpoint(
            self.run_dir,
            self.step,
            write_parts,
            state,
            keep_last=self.config.checkpoint.keep_last,
            config_yaml=config_to_yaml(self.config),
        )


class Schedule:
    """The calls of a run's steps, evaluations and checkpoints, in the module's order, over `transport` (started for
    `specs`): which role of which agent does what, and when."""

    def __init__(self, transport: Transport, specs: Sequence[WorkerSpec]) -> None:
        self.transport, self.specs = transport, list(specs)
        self.concurrent = transport.concurrent
        self.apart = [s.placement.sampler_device is not None for s in specs]
        """Each agent: whether it has a sampler of its own."""
        self.plans = [LogprobPlan.of(s) for s in specs]
        """Each agent: which log-probs its rows carry, from whom and when (`hacrl.provenance`)."""
        self.meets = [False] * len(specs)
        """Each agent: whether its weight link's two ends meet at the step's end (the schedule runs them)."""
        what = "opening the weight link to its sampler"
        for i in (i for i, apart in enumerate(self.apart) if apart):  # the learner opens it, its sampler is given it
            link = self._call(i, "learner", "open_weight_link", (transport.across_machines,), what)
            self._call(i, "sampler", "attach_weight_link", (link,), what)
            self.meets[i] = link.meets

    @classmethod
    def start(cls, runtime, specs: Sequence[WorkerSpec]) -> Schedule:
        """Start the agents' processes on `runtime.backend` and open their weight links."""
        transport = start_transport(runtime, list(specs))
        try:
            return cls(transport, specs)
        except BaseException:
            transport.close(force=True)
            raise

    def _call(self, i: int, role: str, method: str, args: tuple, what: str) -> Any:
        return self.transport.gather([self.transport.submit(i, role, method, args, what)])[0]

    # -- a step ------------------------------------------------------------------------------------------------------

    def sample(self, calls: Sequence[SampleCall]) -> list[Sampled]:
        """Every agent's batch, on its sampling role."""
        return self.transport.gather(self._submit_samples(calls))

    def learn(self, calls: Sequence[LearnCall], pool: list[Trajectory] | None) -> list[Learned]:
        """Every learner's update (lag 0: on the batch it sampled; `pool`: `_submit_learns`)."""
        return self.transport.gather(self._submit_learns(calls, pool))

    def step(
        self,
        samples: Sequence[SampleCall],
        learns: Sequence[LearnCall],
        pool: list[Trajectory] | None,
        between: Callable[[list[Sampled]], T],
    ) -> tuple[list[Sampled], T, list[Learned]]:
        """Lag k >= 1, in the module's order: the proximal pass, sample t + k and learn t at once, the weight link.
        `between(sampled)` (the driver's scoring) runs in a thread of the driver once every sample is in, while the
        learners learn; its error comes first (the learns' own is raised after it)."""
        learns = self._with_proximal(learns)
        sampling = self._submit_samples(samples)
        learning = self._submit_learns(learns, pool)
        sampled = self.transport.gather(sampling)
        with ThreadPoolExecutor(1, thread_name_prefix="hacrl-between") as thread:
            future = thread.submit(between, sampled)
            try:
                learned = self.transport.gather(learning)
            finally:
                extra = future.result()
        self._link(learns)
        return sampled, extra, learned

    def _submit_samples(self, calls: Sequence[SampleCall]) -> list[Handle]:
        return [
            self.transport.submit(i, "sampler", "sample", (c,), f"sampling at step {c.step}")
            for i, c in enumerate(calls)
        ]

    def _submit_learns(self, calls: Sequence[LearnCall], pool: list[Trajectory] | None) -> list[Handle]:
        """The learn calls, with the step's scored `pool` (None: the algorithm does not share) sent once for all
        (`Transport.share`): each learner takes its foreign answers from it (`AgentWorker.learn(call, pool)`,
        `foreign_of`) instead of its own copy of every other agent's (N copies of the pool, one per learner, would grow
        as N^2). A learner with none to take (frozen, or no other agent's answer in the pool) gets its call alone."""
        sources = {t.source for t in pool} if pool is not None else set()  # once, not once per learner
        takes = [not spec.agent.frozen and bool(sources - {i}) for i, spec in enumerate(self.specs)]
        shared = self.transport.share(pool) if any(takes) else None
        return [
            self.transport.submit(
                i, "learner", "learn", (c, shared) if takes[i] else (c,), f"learning at step {c.step}"
            )
            for i, c in enumerate(calls)
        ]

    def _with_proximal(self, learns: Sequence[LearnCall]) -> list[LearnCall]:
        """The proximal pass: each learner's call, with the reply of its sampler's proximal pass where its plan says
        its sampler makes it and it has rows after its first mini-batch (the learner takes it after its first
        optimizer step, `SamplingRole.proximal`); the other learners make their own (`hacrl.provenance`)."""
        out = list(learns)
        for i, call in enumerate(learns):
            plan = self.plans[i]
            if plan.proximal_by == "sampler" and plan.proximal_rows(len(call.rollout.response_ids)):
                what = f"computing proximal log-probs for step {call.step}"
                handle = self.transport.submit(i, "sampler", "proximal", (call.step, call.rollout), what)
                out[i] = replace(call, proximal=handle)
        return out

    def _link(self, learns: Sequence[LearnCall]) -> None:
        """The weight link: each meeting link's transfer of the weights after this step's update, both ends at once (the
        learner's reply is what the sampler receives: Ray hands it over by reference)."""
        handles = []
        for i, call in enumerate(learns):
            if not self.meets[i] or self.specs[i].agent.frozen:
                continue
            what = f"handing over the weights after update {call.step}"
            if self.specs[i].placement.broadcasts:  # the two ends of one collective
                receive = self.transport.submit(i, "sampler", "receive_weights", (call.step,), what)
                handles += [receive, self.transport.submit(i, "learner", "send_weights", (call.step,), what)]
            else:  # the sampler's call waits for the learner's reply, which the driver never fetches (a failure of
                # the learner's end is raised by the sampler's)
                sent = self.transport.submit(i, "learner", "send_weights", (call.step,), what)
                handles.append(self.transport.submit(i, "sampler", "receive_weights", (call.step, sent), what))
        if handles:
            self.transport.gather(handles, peers=True)

    # -- around the steps ----------------------------------------------------------------------------------------------

    def generate(self, calls: Sequence[GenerateCall], *, what: str) -> list[list[Completion]]:
        """Evaluation: each agent's learner (it holds the newest weights)."""
        return self.transport.gather([self.transport.submit(i, "learner", "generate", (c,), what)
                                      for i, c in enumerate(calls)])  # fmt: skip

    def save(self, directory: str, *, what: str) -> None:
        """Each learner saves its agent's part, a sampler's stream in it as the agent's (`AgentWorker.adopt_stream`;
        a worker group's ranks each take their own)."""
        for i in (i for i, apart in enumerate(self.apart) if apart):
            stream = self._call(i, "sampler", "stream", (), what)
            self._call(i, "learner", "adopt_stream", (stream,), what)
        self._all("learner", "save", (directory,), what)

    def load(self, directory: str) -> None:
        what = "loading its checkpoint part"
        self._all("learner", "load", (directory,), what)
        self._all("sampler", "load", (directory,), what, only=self.apart)

    def _all(self, role: str, method: str, args: tuple, what: str, only: Sequence[bool] | None = None) -> list:
        agents = [i for i in range(len(self.specs)) if only is None or only[i]]
        return self.transport.gather([self.transport.submit(i, role, method, args, what) for i in agents])

    def pids(self) -> list[int]:
        return self.transport.pids()

    def close(self, *, force: bool = False) -> None:
        self.transport.close(force=force)
