"""`hacrl plan CONFIG --measure`: time a short run of the real config on this machine and propose a rollout budget
per agent (`agents.<i>.group_size`) under which the agents' phases end together.

The time model (per step, B = `trainer.prompts_per_step`, G_j = agent j's group size):

    sampling of agent j      S_j = a_j * B * G_j           a_j: its measured seconds per answer
    update of learner k      U_k = b_k * B * P_k           b_k: its measured seconds per trained row; P_k the answers
                                                           per prompt in its pool: sum_j G_j when the algorithm shares
                                                           (G_k + at most `sharing.budget_per_prompt` of the others'
                                                           with a budget; with groups: `foreign_per_prompt`), G_k
                                                           when it does not, 0 for a frozen agent; a policy that
                                                           keeps fewer rows makes this an upper bound
    scoring                  C = c * B * sum_j G_j         c: seconds per answer
    a lockstep step          T = max_j S_j + C + max_k U_k (agents concurrent: Ray, or a device each)

An agent that samples faster than the slowest one waits max S - S_j each step; more answers fill that wait. But in
a sharing run every learner trains on every answer, so each answer added also lengthens the slowest update: the
proposal adds answers (whole mini-batches) to the agent with the most sampling wait while its sampling still ends
within the slowest agent's and the step stays within `slack` of today's, and reports the predicted idle fraction,
answers per second and step time before and after. Without sharing (gspo, grpo), or with a sharing budget
(`sharing.budget_per_prompt`) that bounds what the other learners take of them, a fast agent's extra answers only
lengthen its own, faster update, so both phases can end together.

The measurements are the second step of a 2-step run of the config as given (backend, threads, devices), in a
temporary directory (the first step pays one-time costs); it writes nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hacrl.config import TrainConfig
from hacrl.core.sharing import foreign_per_prompt


@dataclass
class Costs:
    """Measured per-unit costs of a run's agents (seconds)."""

    names: list[str]
    group_sizes: list[int]
    per_answer: list[float]
    """a_j: sampling seconds per answer."""
    per_row: list[float]
    """b_k: update seconds per trained row (0 for a frozen agent)."""
    scoring: float
    """c: scoring seconds per answer."""
    shared: bool
    learns: list[bool]
    prompts: int
    mini_batch_size: int
    concurrent: bool
    measured: dict[str, float] = field(default_factory=dict)
    """The measured step: time/step, time/idle_frac."""
    foreign_cap: int | None = None
    """`sharing.budget_per_prompt`: the foreign answers per prompt a learner trains on at most (None: all)."""
    group_of: list[int] | None = None
    """Each agent's group (`sharing.groups`; None: one group): with groups the budget bounds only the answers from
    outside the learner's group, and none of those cross without one (`foreign_per_prompt`)."""


@dataclass
class Prediction:
    group_sizes: list[int]
    sampling: list[float]
    update: list[float]
    step: float
    idle_frac: float
    answers_per_second: float


def predict(costs: Costs, group_sizes: list[int]) -> Prediction:
    """The time model of the module docstring for these group sizes."""
    b, total = costs.prompts, sum(group_sizes)
    sampling = [a * b * g for a, g in zip(costs.per_answer, group_sizes, strict=True)]
    pools = [(g + costs.shared * foreign_per_prompt(group_sizes, k, budget=costs.foreign_cap,
                                                     group_of=costs.group_of)) * learns
             for k, (g, learns) in enumerate(zip(group_sizes, costs.learns, strict=True))]  # fmt: skip
    update = [r * b * p for r, p in zip(costs.per_row, pools, strict=True)]
    s, u = max(sampling), max(update)
    step = s + costs.scoring * b * total + u
    n = len(group_sizes)
    idle = sum(s - x for x in sampling) + sum(u - x for x in update)
    return Prediction(list(group_sizes), sampling, update, step, idle / (n * (s + u)) if s + u > 0 else 0.0,
                      b * total / step if step > 0 else 0.0)  # fmt: skip


def propose(costs: Costs, *, slack: float = 0.1) -> tuple[Prediction, Prediction]:
    """(today's prediction, the proposed budgets'): see the module docstring."""
    now = predict(costs, costs.group_sizes)
    sizes, limit, slowest = list(costs.group_sizes), (1 + slack) * now.step, max(now.sampling)
    while True:
        best = None
        for j in range(len(sizes)):
            bigger = _next_whole(sizes[j], costs.prompts, costs.mini_batch_size)
            trial = predict(costs, [*sizes[:j], bigger, *sizes[j + 1 :]])
            if trial.sampling[j] > slowest + 1e-12 or trial.step > limit:
                continue
            wait = slowest - predict(costs, sizes).sampling[j]
            if best is None or wait > best[0]:
                best = (wait, j, bigger)
        if best is None:
            return now, predict(costs, sizes)
        sizes[best[1]] = best[2]


def _next_whole(group_size: int, prompts: int, mini_batch_size: int) -> int:
    """The next group size above `group_size` whose prompts x group size is a whole number of mini-batches."""
    g = group_size + 1
    while (prompts * g) % mini_batch_size:
        g += 1
    return g


def measure(config: TrainConfig) -> Costs:
    """Run 2 steps of `config` in a temporary directory and read each agent's costs from the second."""
    import contextlib
    import io
    import tempfile

    from hacrl.config.settings import AgentSettings
    from hacrl.core import get_algorithm
    from hacrl.driver.metrics import agent_key
    from hacrl.driver.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="hacrl-measure-") as tmp:
        run = _measuring_copy(config, tmp)
        trainer = Trainer(run)
        concurrent = trainer.workers.concurrent
        with contextlib.redirect_stdout(io.StringIO()):  # its step lines and summary are not this command's output
            record = trainer.train()[-1]
    sizes = [AgentSettings.resolve(a, config.rollout).group_size for a in config.agents]
    b, names = config.trainer.prompts_per_step, [a.name for a in config.agents]

    def value(name: str, metric: str) -> float:
        return float(record.get(agent_key(name, metric)) or 0.0)

    return Costs(
        names=names, group_sizes=sizes, prompts=b, mini_batch_size=config.trainer.mini_batch_size,
        per_answer=[value(n, "time/busy_sampling") / (b * g) for n, g in zip(names, sizes, strict=True)],
        per_row=[value(n, "time/busy_update") / max(value(n, "trained_sequences"), 1) for n in names],
        scoring=record["time/scoring"] / (b * sum(sizes)),
        shared=get_algorithm(config.algorithm.name).pool_is_shared(config.algorithm) and len(names) > 1,
        learns=[not a.frozen for a in config.agents], concurrent=concurrent,
        measured={"time/step": record["time/step"], "time/idle_frac": record["time/idle_frac"]},
        **sharing_terms(config),
    )  # fmt: skip


def sharing_terms(config: TrainConfig) -> dict:
    """What of `sharing` bounds a learner's foreign answers (`Costs.foreign_cap`, `Costs.group_of`)."""
    sharing, names = config.sharing, [a.name for a in config.agents]
    group_of = {m: g for g, members in enumerate(sharing.groups) for m in members} if sharing.groups else None
    return {"foreign_cap": sharing.budget_per_prompt, "group_of": [group_of[n] for n in names] if group_of else None}


def _measuring_copy(config: TrainConfig, directory: str) -> TrainConfig:
    """`config` for 2 steps in `directory`: evaluation on one prompt, no checkpoint before the end, no trackers."""
    import copy

    run = copy.deepcopy(config)
    run.trainer = replace(run.trainer, steps=2, output_dir=directory)
    # the last step always evaluates: on one prompt
    run.eval = replace(run.eval, every=0, at_start=False, max_prompts=1, num_samples=0, benchmarks=[],
                       save_completions=False)  # fmt: skip
    run.checkpoint = replace(run.checkpoint, every=0)
    run.logging = replace(run.logging, console=False, tensorboard=False, wandb=None, trackio=None)
    return run


def render(costs: Costs, now: Prediction, proposed: Prediction) -> str:
    """The measured costs, today's prediction and the proposal, with the settings to type."""
    lines = [f"measured (step 2 of 2 on this machine; B = {costs.prompts} prompts per step):", ""]
    lines.append(f"{'agent':<16}{'s/answer':>10}{'s/row trained':>15}{'G now':>7}{'G proposed':>12}"
                 f"{'sampling s':>12}{'update s':>10}")  # fmt: skip
    for j, name in enumerate(costs.names):
        lines.append(f"{name:<16}{costs.per_answer[j]:>10.4f}{costs.per_row[j]:>15.4f}{now.group_sizes[j]:>7}"
                     f"{proposed.group_sizes[j]:>12}{now.sampling[j]:>6.2f}->{proposed.sampling[j]:<5.2f}"
                     f"{now.update[j]:>5.2f}->{proposed.update[j]:.2f}")  # fmt: skip
    lines += ["", f"{'predicted':<22}{'now':>10}{'proposed':>10}"]
    for label, a, b in (("step (s)", now.step, proposed.step),
                        ("idle fraction", now.idle_frac, proposed.idle_frac),
                        ("answers per second", now.answers_per_second, proposed.answers_per_second)):  # fmt: skip
        lines.append(f"{label:<22}{a:>10.3f}{b:>10.3f}")
    lines.append(f"(measured step: {costs.measured['time/step']:.3f} s, idle fraction "
                 f"{costs.measured['time/idle_frac']:.3f})")  # fmt: skip
    if not costs.concurrent:
        lines.append("runtime.backend=local runs the agents one after another; the prediction is for concurrent "
                     "agents (runtime.backend=ray, or a device each)")  # fmt: skip
    changes = [f"agents.{j}.group_size={g}" for j, (g, g0) in enumerate(zip(proposed.group_sizes, now.group_sizes,
                                                                           strict=True)) if g != g0]  # fmt: skip
    lines.append("set: " + " ".join(changes) if changes else "no budget change keeps the step within its slack")
    return "\n".join(lines)
