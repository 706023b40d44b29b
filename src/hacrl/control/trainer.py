"""The control trainer: N heterogeneous policies on one task, the LLM trainer's loop with episodes for responses.

One step (spec 2, read with the analogy of `hacrl.control`):
    1. take B initial states (seeds of the environment's reset) from the run's stream
    2. every policy plays G episodes from each (all policies before any update), then computes its pre-update
       per-step log-probs of its own actions with a teacher-forced pass
    3. rewards from the logged states (`env.Simple.reward`)
    4. the capability tracker (`hacrl.core`) from this step's rewards
    5. each learner: its own episodes first, then the others' in config order when the algorithm shares; another
       policy's episode is re-observed through the learner's observation function from the logged states, its
       actions kept; advantages, then one optimizer step per mini-batch in pool order, with `hacrl.core`'s loss
    6. log, evaluate (each policy alone, greedy, on held-out initial states), checkpoint
Checkpoints use the LLM trainer's layout and checks (`hacrl.checkpoint`): `agents/<name>/model.safetensors` and
`config.json`, `optimizer/<name>.pt`, `rng/<name>.pt`, state.json with the capability tracker and the seed stream;
resume is exact. Metrics: the same keys, sinks and `hacrl plot` as the LLM trainer.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from hacrl import seeds
from hacrl.agent.model import first_nonfinite
from hacrl.checkpoint import (
    agent_part,
    driver_state,
    latest_checkpoint,
    read_optimizer,
    read_rng,
    remove_stale_temporaries,
    save_checkpoint,
    write_optimizer,
    write_rng,
    writing_part,
)
from hacrl.control.buffers import Buffers
from hacrl.control.config import control_config_to_yaml, mapping_of
from hacrl.control.env import Episode, environments
from hacrl.control.policies import ARCHITECTURES, draw, token_logprobs
from hacrl.core import CapabilityTracker, get_algorithm, step_mean_rewards
from hacrl.core.losses import median_by_source, sequence_log_ratios
from hacrl.core.metrics import MetricReducer
from hacrl.core.sharing import foreign_of, in_pool_order, kept_rows
from hacrl.driver.metrics import agent_key, eval_key
from hacrl.driver.resume import plan_resume
from hacrl.driver.runloop import RunLoop
from hacrl.errors import CheckpointError, NonFiniteError, restoring
from hacrl.learner import loss_inputs, mini_batches, update

EVAL_SEED_BASE = 2**30
"""Held-out initial states are seeds EVAL_SEED_BASE + i; training draws seeds below it."""


BUFFERS_FILE = "buffers.pt"
"""The experience buffers and their draw's random stream in a checkpoint (`control.buffers.Buffers.state_dict`)."""


def mapping_file(checkpoint: Path, name: str) -> Path:
    """Policy `name`'s learned mapping (`control.mapping.InverseModel`: weights, optimizer, transition window, random
    stream) in a checkpoint."""
    return Path(checkpoint) / "mappings" / f"{name}.pt"


class ControlTrainer(RunLoop):
    """One control run: its policies, their optimizers and samplers; the run around the steps (directory, logger,
    schedule, graceful stop) is `RunLoop`'s, as for the LLM trainer."""

    command = "hacrl control"

    def _setup(self, resume: str) -> None:
        cfg = self.config
        torch.set_num_threads(cfg.trainer.torch_threads)
        self.algorithm = get_algorithm(cfg.algorithm.name)
        self.params = cfg.algorithm.params()
        self.names = [p.name for p in cfg.policies]
        self.envs, self.observe, sizes = environments(cfg)
        self.policies, self.optimizers, self.generators = [], [], []
        seed = cfg.trainer.seed
        for i, p in enumerate(cfg.policies):
            torch.manual_seed(p.init_seed if p.init_seed is not None else seeds.adapters(seed, i))
            env = self.envs[i]
            policy = ARCHITECTURES[p.architecture](sizes[i], p.hidden, env.action_size, continuous=not env.discrete)
            self.policies.append(policy)
            self.optimizers.append(
                torch.optim.AdamW(policy.parameters(), lr=p.lr, weight_decay=p.weight_decay, betas=(0.9, 0.999))
            )
            self.generators.append(torch.Generator().manual_seed(seeds.training(seed, i)))
        self.optimizer_steps = [0] * len(self.policies)
        self._setup_mappings()
        replay = cfg.sharing.replay
        self.buffers = (
            Buffers(len(self.policies), replay.steps, replay.max_episodes, seeds.control(seed, "replay"))
            if replay.steps
            else None
        )
        self.tracker = CapabilityTracker(
            len(self.policies),
            window=cfg.algorithm.capability_window,
            warmup_steps=cfg.algorithm.capability_warmup_steps,
        )
        self.stream = np.random.Generator(np.random.PCG64(seeds.prompts(seed, 0)))  # the initial states
        self.step = 0
        self.history: list[dict[str, Any]] = []
        remove_stale_temporaries(self.run_dir, self.notice)
        self.plan = plan_resume(cfg, self.run_dir, resume, self.notice, names=self.names)  # as `hacrl train` does
        if self.plan.checkpoint is not None:
            self._load(self.plan.checkpoint, self.plan.state)

    def _setup_mappings(self) -> None:
        """Per learner, the mapping of each source on another platform (`mapping_of`), the mappings' objects (one
        of each kind a learner uses: a learned one is fitted once on its own transitions, whoever it maps) and a
        pool of its arms to replay others' episodes on."""
        from hacrl.control import mapping as maps
        from hacrl.control.arms import Reach

        cfg, n = self.config, len(self.config.policies)
        self.read_as = [[mapping_of(cfg, j, k) if j != k else "own" for j in range(n)] for k in range(n)]
        self.mappers: list[dict[str, Any]] = []
        self.replay_noise: list[torch.Generator | None] = []  # each learner's exploration in its replays
        self.replay_envs: list[Any] = []
        m = cfg.mapping
        for k in range(n):
            kinds = {kind for kind in self.read_as[k] if kind in ("defined", "learned")}
            env = self.envs[k]
            mappers: dict[str, Any] = {}
            if "defined" in kinds:
                mappers["defined"] = maps.Defined(env)
            if "learned" in kinds:
                mappers["learned"] = maps.InverseModel(env, m.hidden, m.lr, m.fit_steps, m.batch, m.window,
                                                       seed=seeds.control(cfg.trainer.seed, "mapping", k))  # fmt: skip
            self.mappers.append(mappers)
            self.replay_noise.append(
                torch.Generator().manual_seed(seeds.control(cfg.trainer.seed, "replay_noise", k)) if kinds else None
            )
            self.replay_envs.append(
                Reach(env.platform, cfg.env.max_cycles, cfg.env.success_distance) if kinds else None
            )

    def _write_config(self, path: Path) -> None:
        path.write_text(control_config_to_yaml(self.config))

    # -- one step --------------------------------------------------------------------------------------------------

    def train_step(self) -> dict[str, Any]:
        cfg, n = self.config, len(self.policies)
        seeds = [int(s) for s in self.stream.integers(0, EVAL_SEED_BASE, size=cfg.trainer.initial_states_per_step)]
        began = time.perf_counter()
        sampled, generate_s = [], []
        for j in range(n):  # 1-3: every policy plays before any update
            start = time.perf_counter()
            sampled.append(self.sample(j, seeds, cfg.trainer.group_size))
            generate_s.append(time.perf_counter() - start)
        sampling = time.perf_counter() - began
        pool = [e for episodes in sampled for e in episodes]
        rewards = torch.tensor([e.reward for e in pool], dtype=torch.float64)
        self.tracker.update(step_mean_rewards(rewards, torch.tensor([e.source for e in pool]), n))  # 4
        caps = self.tracker.capabilities()
        shared = self.algorithm.pool_is_shared(self.params)
        drawn, seed_of, past = self._draw_replay(seeds, shared)
        metrics: dict[str, Any] = {}
        update_total = mapping_total = 0.0
        for k in range(n):  # 5
            values = self._learner_step(k, sampled, pool, past, seed_of, caps, shared, len(seeds) if drawn else None)
            values["time/generate"] = generate_s[k]
            update_total += values["time/update"]
            mapping_total += values.get("time/mapping", 0.0)
            if drawn:
                values["replay/offered"] = sum(len(past[j]) for j in range(n) if j != k)
                values["replay/age_mean"] = sum(self.buffers.added - step for step, _, _ in drawn) / len(drawn)
            metrics.update({agent_key(self.names[k], key): v for key, v in values.items()})
        if self.buffers is not None:
            self.buffers.add(seeds, sampled)  # after the draw: a step never replays its own episodes
        metrics["time/sampling"], metrics["time/update"] = sampling, update_total
        if any(env is not None for env in self.replay_envs):
            metrics["time/mapping"] = mapping_total
        metrics["time/step"] = sampling + mapping_total + update_total
        return metrics

    def _draw_replay(self, seeds: list[int], shared: bool) -> tuple[list, dict[int, int], list[list[Episode]]]:
        """The experience buffers' earlier initial states for this step (`control.buffers`): (step, group, seed) of
        each drawn, every group id's seed (the step's own 0..B-1, the drawn B, B + 1, ...), and every policy's
        buffered episodes of the drawn ones under those ids."""
        n, b = len(self.policies), len(seeds)
        drawn = self.buffers.draw(self.config.sharing.replay.groups) if self.buffers is not None and shared else []
        seed_of = dict(enumerate(seeds)) | {b + i: seed for i, (_, _, seed) in enumerate(drawn)}
        past = [[e for i, (step, g, _) in enumerate(drawn) for e in self.buffers.episodes(j, step, g, b + i)]
                for j in range(n)]  # fmt: skip
        return drawn, seed_of, past

    def _learner_step(self, k: int, sampled: list[list[Episode]], pool: list[Episode], past: list[list[Episode]],
                      seed_of: dict[int, int], caps: torch.Tensor, shared: bool,
                      past_from: int | None) -> dict[str, Any]:  # fmt: skip
        """Learner k's part of step 5: its learned mapping sees its own episodes, the others' episodes (the step's,
        then the buffers') become its foreign rows (replayed across platforms), its update; its metrics."""
        n, own = len(self.policies), sampled[k]
        start = time.perf_counter()
        mapped = {}
        for mapper in self.mappers[k].values():  # a learned mapping sees the learner's own step, then maps
            mapped.update(mapper.observe_own(own))
        offered = foreign_of(pool, k, shared=shared) + [e for j in range(n) if j != k for e in past[j]]
        foreign, replays = self.readable(k, offered, seed_of)
        for j, replay in replays.items():
            mapped.update(replay.metrics(self.names[j]))
        map_s = time.perf_counter() - start
        start = time.perf_counter()
        # the learner's own buffered episodes join their groups' baselines, never its loss (stale own rows)
        learned = self.learn(k, own + foreign + past[k], caps, baseline_only=len(past[k]), past_from=past_from)
        values = {
            **learned,
            "reward_mean": sum(e.reward for e in own) / len(own),
            "success_frac": sum(e.success for e in own) / len(own),
            **(
                {"unstable_episodes": sum(e.unstable for e in own), "contact_episodes": sum(e.contact for e in own)}
                if not self.envs[k].discrete
                else {}
            ),  # fmt: skip
            "capability": float(caps[k]),
            "time/update": time.perf_counter() - start,
            **({"time/mapping": map_s, **mapped} if self.replay_envs[k] is not None else {}),
        }
        values.update(self.algorithm.rho_metrics(self.tracker.capabilities(), k, self.params, self.names))
        return values

    # -- sampling and learning -------------------------------------------------------------------------------------

    def sample(self, j: int, seeds: list[int], group_size: int, *, greedy: bool = False) -> list[Episode]:
        """Policy j plays `group_size` episodes from each initial state (group-major order); with its pre-update
        per-step log-probs (teacher-forced) summed into each episode's `source_logp_sum`."""
        policy, observe, temperature = self.policies[j], self.observe[j], self.config.trainer.temperature
        env = self.envs[j]
        runs = [s for s in seeds for _ in range(group_size)]
        states = [env.reset(runs)]
        actions = []
        hidden = policy.initial_state(len(runs))
        with torch.no_grad():
            for _ in range(self.config.env.max_cycles):
                obs = torch.from_numpy(np.stack([observe(s[None])[0] for s in states[-1]]))
                out, hidden = policy.step(obs, hidden)
                action = draw(policy, out, temperature, self.generators[j], greedy)
                if not (bool(out.isfinite().all()) and bool(action.float().isfinite().all())):
                    self._diverged(j, "drew NaN or inf actions")  # never handed to the simulator
                actions.append(action.numpy())
                states.append(env.step(action.tolist()))
        trajectories = np.stack([np.stack(step) for step in states], axis=1)  # (runs, T + 1, state size)
        # (runs, T): discrete actions; (runs, T, A): continuous ones, as drawn (the env clips what it applies)
        acts = np.stack(actions, axis=1).astype(np.int64 if env.discrete else np.float32)
        unstable, contact = env.unstable, getattr(env, "contact", None)
        episodes = []
        for i in range(len(runs)):
            reward, success = (0.0, False) if unstable[i] else env.reward(trajectories[i])
            episodes.append(
                Episode(
                    i // group_size,
                    trajectories[i],
                    acts[i],
                    reward,
                    j,
                    success=success,
                    unstable=unstable[i],
                    contact=bool(contact[i]) if contact else False,
                )  # fmt: skip
            )
        if not greedy:
            with torch.no_grad():
                old = self.logprobs(j, episodes)
            for episode, row in zip(episodes, old, strict=True):
                episode.source_logp_sum = float(row.double().sum())
                episode.old_logp = row
        return episodes

    def _diverged(self, j: int, what: str) -> NoReturn:
        """Policy j's numbers left the finite range (its weights, or its actions at this temperature): the run stops
        before they reach the simulator, an optimizer step or a checkpoint, so the newest checkpoint is the last
        finite state."""
        bad = first_nonfinite(self.policies[j])
        cause = (
            f"its weights hold NaN or inf (first: {bad}) after {self.optimizer_steps[j]} optimizer steps"
            if bad is not None
            else f"its weights are finite, its outputs at trainer.temperature={self.config.trainer.temperature:g} "
            "are not"
        )
        newest = latest_checkpoint(self.run_dir)
        where = (
            f"its newest checkpoint ({newest}) is the last finite state: continue from it with {self.command} "
            "CONFIG --resume"
            if newest is not None
            else "this run has no checkpoint yet: start it again"
        )
        raise NonFiniteError(
            f"policy {self.names[j]!r} {what} at step {self.step + 1}: {cause}. Nothing is written from this state; "
            f"lower policies.{j}.lr (now {self.config.policies[j].lr:g}) or policies.{j}.grad_clip, or "
            f"trainer.temperature; {where}"
        )

    def readable(self, k: int, foreign: list[Episode], seeds: dict[int, int]) -> tuple[list[Episode], dict[int, Any]]:
        """Learner k's foreign episodes as it trains on them, in their order: a source on its platform as it is (the
        learner re-observes the logged states); one on another platform replayed on the learner's arm through the
        pair's mapping (`control.mapping.replay`), those past `mapping.error_bound` left out. And the replays by
        source."""
        from hacrl.control.mapping import Behaviour, replay

        behaviour = None
        if self.replay_noise[k] is not None:  # the learner's own exploration, its current std at the temperature
            std = self.policies[k].log_std.detach().double().exp() * self.config.trainer.temperature
            behaviour = Behaviour(std.numpy(), self.replay_noise[k])
        by_source: dict[int, list[Episode]] = {}
        for e in foreign:
            by_source.setdefault(e.source, []).append(e)
        replays = {
            j: replay(self.replay_envs[k], self.mappers[k][self.read_as[k][j]], episodes, seeds,
                      self.config.mapping.error_bound, behaviour)
            for j, episodes in by_source.items() if self.read_as[k][j] in ("defined", "learned")
        }  # fmt: skip
        readable = [e for j, episodes in by_source.items() for e in (replays[j].episodes if j in replays else episodes)]
        return in_pool_order(readable), replays

    def observations(self, k: int, episodes: list[Episode]) -> torch.Tensor:
        """Learner k's view of episodes (any source's): its observation of each state before an action, (N, T, D)."""
        return torch.from_numpy(np.stack([self.observe[k](e.states[:-1]) for e in episodes]))

    def logprobs(self, k: int, episodes: list[Episode]) -> torch.Tensor:
        actions = torch.from_numpy(np.stack([e.actions for e in episodes]))
        return token_logprobs(
            self.policies[k], self.observations(k, episodes), actions, self.config.trainer.temperature
        )

    def learn(self, k: int, pool: list[Episode], caps: torch.Tensor, baseline_only: int = 0,
              past_from: int | None = None) -> dict[str, Any]:  # fmt: skip
        """Learner k's update on its pool (own episodes first, then the others' in config order, then
        `baseline_only` rows that count in their groups' baselines but not in the loss): advantages over the pool,
        the sharing policy's and budget's choice of foreign rows (`hacrl.core.sharing`), then one optimizer step per
        mini-batch of the rows kept, in pool order, each with `hacrl.core`'s loss. Groups from `past_from` on are
        earlier initial states (the experience buffers): their kept rows are counted in `replay/kept`."""
        cfg, policy, optimizer = self.config, self.policies[k], self.optimizers[k]
        rewards = torch.tensor([e.reward for e in pool], dtype=torch.float64)
        groups, sources = torch.tensor([e.group for e in pool]), torch.tensor([e.source for e in pool])
        adv = self.algorithm.advantages(rewards, groups, sources, learner=k, capabilities=caps, params=self.params)
        keep = self._kept(k, rewards, groups, sources, adv)
        keep[len(pool) - baseline_only :] = False
        foreign = sources != k
        offered, kept = int(foreign.sum()), int((keep & foreign).sum())
        replayed = int((keep & foreign & (groups >= past_from)).sum()) if past_from is not None else None
        rows_kept = keep.nonzero().flatten().tolist()
        pool, adv = [pool[i] for i in rows_kept], adv[rows_kept]
        obs = self.observations(k, pool)
        actions = torch.from_numpy(np.stack([e.actions for e in pool]))
        width = actions[0].numel()  # its tokens: steps (discrete) or action coordinates (continuous)
        old = torch.stack([e.old_logp if e.source == k else torch.zeros(width) for e in pool])
        ages = self._replay_ratios(k, pool, obs, actions, past_from) if past_from is not None else {}
        shift = self._foreign_centres(k, pool, obs, actions, old, caps)

        def backward(m: int, rows: list[int], reducer: MetricReducer) -> None:
            # every step of an episode is in the loss (an episode has no padding)
            logp = token_logprobs(policy, obs[rows], actions[rows], cfg.trainer.temperature)
            # check_values=False: a non-finite log-prob shows as a non-finite gradient norm, and `update` skips the
            # step and counts it (`skipped_steps`), as in the LLM trainer
            inputs = loss_inputs([pool[i] for i in rows], logp, torch.ones_like(logp, dtype=torch.bool), old[rows],
                                 adv[rows], k, caps, check_values=False,
                                 foreign_shift=shift[rows] if shift is not None else None)  # fmt: skip
            out = self.algorithm.loss(inputs, params=self.params, step_index=m)
            out.loss.backward()
            reducer.add(out.metrics)

        layout = mini_batches([e.source for e in pool], cfg.trainer.mini_batch_size, cfg.trainer.mini_batch_layout)
        metrics = update(
            optimizer,
            enumerate(layout),
            backward,
            lambda: torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.policies[k].grad_clip),
            lambda: self._stepped(k),
            skip_zero=cfg.trainer.zero_grad_step == "skip",
        )
        if first_nonfinite(policy) is not None:  # a finite gradient at a huge learning rate
            self._diverged(k, "was updated to non-finite weights")
        metrics["trained_sequences"] = len(pool)
        metrics["advantage_abs_mean"] = float(adv.abs().mean())
        if shift is not None and (kept_foreign := [i for i, e in enumerate(pool) if e.source != k]):
            metrics["foreign_center"] = float(shift[kept_foreign].mean())
        if offered:
            metrics["shared_offered"], metrics["shared_kept"] = offered, kept
        if replayed is not None:
            metrics["replay/kept"] = replayed
            metrics.update(ages)
        return metrics

    def _stepped(self, k: int) -> None:
        self.optimizer_steps[k] += 1

    def _foreign_centres(self, k, pool, obs, actions, old, caps) -> torch.Tensor | None:
        """`algorithm.foreign_center: median`: each foreign episode's shift, its source's median log-ratio under
        policy k's weights before this update (`hacrl.core.losses.median_by_source`); 0 on its own episodes. None:
        the paper's window."""
        if self.params.foreign_center != "median":
            return None
        with torch.no_grad():
            logp = token_logprobs(self.policies[k], obs, actions, self.config.trainer.temperature)
        inputs = loss_inputs(pool, logp, torch.ones_like(logp, dtype=torch.bool), old, [0.0] * len(pool), k, caps,
                             check_values=False)  # fmt: skip
        return median_by_source(sequence_log_ratios(inputs, self.params.foreign_ratio), inputs.source, ~inputs.is_own)

    def _kept(self, k: int, rewards: torch.Tensor, groups: torch.Tensor, sources: torch.Tensor,
              adv: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Which of learner k's pool rows it trains on: its own, and the foreign ones the sharing policy and budget
        choose (`hacrl.core.sharing`)."""
        rho = self.algorithm.loss_rho(self.tracker.capabilities(), k, self.params)
        return kept_rows(rewards, groups, sources, adv, learner=k, num_agents=len(self.policies),
                         sharing=self.config.sharing, r_max=self.config.algorithm.r_max, rho=rho)  # fmt: skip

    def _replay_ratios(self, k: int, pool: list[Episode], obs: torch.Tensor, actions: torch.Tensor,
                       past_from: int) -> dict[str, float]:  # fmt: skip
        """How usable the buffers' rows are: learner k's foreign ratios s = exp(l_k - l_src) (spec 3.4, source_mean)
        at the start of its update, of the rows from earlier steps against the step's own foreign rows: the share
        below the first mini-batch's lower clip 1 - delta (outside it a foreign row gives no gradient), the median."""
        foreign = [i for i, e in enumerate(pool) if e.source != k]
        if not foreign:
            return {}
        with torch.no_grad():
            logp = token_logprobs(self.policies[k], obs[foreign], actions[foreign], self.config.trainer.temperature)
        src = torch.tensor([pool[i].source_logp_sum / pool[i].source_num_tokens for i in foreign], dtype=torch.float64)
        ratio = torch.exp((logp.double().mean(-1) - src).clamp(-10, 10))
        past = torch.tensor([pool[i].group >= past_from for i in foreign])
        out = {}
        for key, rows in (("replay", past), ("replay/fresh", ~past)):
            if rows.any():
                out[f"{key}/below_frac"] = float((ratio[rows] < 1 - self.params.delta).double().mean())
        if past.any():
            out["replay/ratio_p50"] = float(ratio[past].median())
        return out

    def evaluate(self) -> dict[str, float]:
        """Each policy alone: one greedy episode from each held-out initial state."""
        cfg = self.config
        seeds = [EVAL_SEED_BASE + i for i in range(cfg.eval.initial_states)]
        out = {}
        for j, name in enumerate(self.names):
            episodes = self.sample(j, seeds, 1, greedy=True)
            out[eval_key(name, "success")] = sum(e.success for e in episodes) / len(episodes)
            out[eval_key(name, "reward_mean")] = sum(e.reward for e in episodes) / len(episodes)
        return out

    # -- checkpoints ---------------------------------------------------------------------------------------------------

    def save(self) -> Path:
        from safetensors.torch import save_file

        def write_parts(directory: Path) -> None:
            for j, name in enumerate(self.names):
                with writing_part(f"policy {name!r}", directory, "hacrl control <config> --resume"):
                    write_part(j, directory)

        def write_part(j: int, directory: Path) -> None:
            name, part = self.names[j], agent_part(directory, self.names[j])
            part.weights_dir.mkdir(parents=True, exist_ok=True)
            state = {k: v.detach().contiguous() for k, v in self.policies[j].state_dict().items()}
            save_file(state, str(part.weights_dir / "model.safetensors"))
            (part.weights_dir / "config.json").write_text(json.dumps(asdict(self.config.policies[j]), indent=1))
            write_optimizer(part.optimizer_file, self.optimizers[j].state_dict())
            streams = {"cpu": self.generators[j].get_state()}
            if self.replay_noise[j] is not None:
                streams["replay"] = self.replay_noise[j].get_state()
            write_rng(part.rng_file, streams, self.optimizer_steps[j])
            if "learned" in self.mappers[j]:
                mapping_file(directory, name).parent.mkdir(parents=True, exist_ok=True)
                torch.save(self.mappers[j]["learned"].state_dict(), mapping_file(directory, name))

        def write_all(directory: Path) -> None:
            write_parts(directory)
            if self.buffers is not None:
                with writing_part("the replay buffers", directory, "hacrl control <config> --resume"):
                    torch.save(self.buffers.state_dict(), Path(directory) / BUFFERS_FILE)

        state = driver_state(
            step=self.step,
            agents=self.names,
            capability=self.tracker.state_dict(),
            data=self.stream.bit_generator.state,
            algorithm=self.config.algorithm.name,
        )
        return save_checkpoint(
            self.run_dir, self.step, write_all, state, keep_last=self.config.checkpoint.keep_last,
            config_yaml=control_config_to_yaml(self.config),
        )  # fmt: skip

    def _episode_shapes(self) -> list[tuple[tuple, tuple]]:
        """Each policy's episode record: its states' shape (T + 1, state size) and its actions' ((T,) discrete, or
        (T, actuators))."""
        t = self.config.env.max_cycles
        return [((t + 1, env.state_size), (t,) if env.discrete else (t, env.action_size)) for env in self.envs]

    def _load(self, checkpoint: Path, state: dict[str, Any]) -> None:
        from safetensors.torch import load_file

        for j, name in enumerate(self.names):
            part = agent_part(checkpoint, name)
            try:
                self.policies[j].load_state_dict(load_file(str(part.weights_dir / "model.safetensors")))
                if (bad := first_nonfinite(self.policies[j])) is not None:
                    raise CheckpointError(
                        f"{checkpoint}: policy {name!r}'s weights hold NaN or inf (first: {bad}), so it cannot be "
                        "resumed; resume from an earlier checkpoint (checkpoint.resume=<its directory>)"
                    )
                settings = {"lr": self.config.policies[j].lr, "weight_decay": self.config.policies[j].weight_decay}
                self.optimizers[j].load_state_dict(read_optimizer(part.optimizer_file, f"policy {name!r}", "cpu",
                                                                  settings))  # fmt: skip
                rng, self.optimizer_steps[j] = read_rng(part.rng_file, f"policy {name!r}")
                self.generators[j].set_state(rng["cpu"])
                if self.replay_noise[j] is not None:
                    self.replay_noise[j].set_state(rng["replay"])
                if "learned" in self.mappers[j]:
                    mapper = torch.load(mapping_file(checkpoint, name), weights_only=True)
                    self.mappers[j]["learned"].load_state_dict(mapper)
            except CheckpointError:
                raise
            except Exception as e:  # noqa: BLE001 - named, with what to do
                raise CheckpointError(
                    f"{checkpoint}: cannot load policy {name!r} ({type(e).__name__}: {e}); resume from an earlier "
                    "checkpoint (checkpoint.resume=<its directory>)"
                ) from e
        if self.buffers is not None:
            try:
                self.buffers.load_state_dict(torch.load(Path(checkpoint) / BUFFERS_FILE, weights_only=True),
                                             shapes=self._episode_shapes())  # fmt: skip
            except Exception as e:  # noqa: BLE001 - named, with what to do
                raise CheckpointError(
                    f"{checkpoint}: cannot load its experience buffers ({BUFFERS_FILE}: {type(e).__name__}: {e}); "
                    "resume with the settings of the run that wrote it (sharing.replay), or from another checkpoint "
                    "(checkpoint.resume=<its directory>)"
                ) from e
        with restoring(checkpoint, "capability history and data position"):
            self.tracker.load_state_dict(state["capability"])
            self.stream.bit_generator.state = state["data"]
        self.step = state["step"]
