"""How long each agent waits on the others in a lockstep step, and what would use that time.

A step's sampling phase lasts until the slowest agent has sampled, its update phase until the slowest learner has
learned. Agent j's busy time in a phase is its worker's call from start to end (`Sampled.span`, `Learned.span`);
its wait is the phase's length minus that:

    <agent>/time/busy_sampling, <agent>/time/busy_update    seconds its worker computed in the phase
    <agent>/time/wait_sampling, <agent>/time/wait_update    seconds it waited for the others
    time/idle_frac       idle worker-seconds / worker-seconds, over both phases
    time/critical_path   the slowest agent's sampling + scoring + the slowest learner's update

Where the agents run concurrently (Ray: `Transport.concurrent`), a phase's length is its wall time on the driver (so the
calls' dispatch counts as waiting). The local backend calls the agents one after another in one process: there a phase
lasts the sum of the busy times, and the waits logged are those of the critical path, what each agent would wait with
devices of its own (the phase's length is then the slowest agent's busy time).

`pace_summary` says at the end of a run, per agent, what share of its sampling and update time it waited, and
what would use that time: a larger rollout budget (`agents.<i>.group_size`, and a sharing budget where every learner
trains on every answer) for an agent that waits in sampling, from the time model below (the one `hacrl plan
--measure` uses, here fed with the run's own steps); devices for the learner the others wait on in the update.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hacrl.core.sharing import foreign_per_prompt

PHASES = ("sampling", "update")

MAX_GROUP_SIZE = 4096
"""The most answers per prompt the time model proposes for an agent (an agent whose answers cost nothing measurable
would otherwise grow without end)."""

SUMMARY_THRESHOLD = 0.10
"""`pace_summary` names what would use an agent's waiting time from this share of its phase time up."""


def phase_waits(busy: Sequence[float], wall: float, *, concurrent: bool) -> tuple[float, list[float]]:
    """(the phase's length, each agent's wait): the wall time where the agents ran concurrently, the slowest
    agent's busy time where they ran one after another (see the module docstring)."""
    length = wall if concurrent else max(busy, default=0.0)
    return length, [max(0.0, length - b) for b in busy]


def pace_metrics(
    busy: dict[str, Sequence[float]], walls: dict[str, float], scoring_s: float, *, concurrent: bool
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Per agent (in order) and for the step: the metrics of the module docstring. `busy[phase]`: each agent's busy
    seconds in `sampling` and `update`; `walls[phase]`: the phase's wall time on the driver."""
    per_agent: list[dict[str, float]] = [{} for _ in busy["sampling"]]
    idle = total = 0.0
    for phase in PHASES:
        length, waits = phase_waits(busy[phase], walls[phase], concurrent=concurrent)
        for j, (b, w) in enumerate(zip(busy[phase], waits, strict=True)):
            per_agent[j][f"time/busy_{phase}"] = b
            per_agent[j][f"time/wait_{phase}"] = w
        idle += sum(waits)
        total += length * len(waits)
    step = {
        "time/idle_frac": idle / total if total > 0 else 0.0,
        "time/critical_path": max(busy["sampling"], default=0.0) + scoring_s + max(busy["update"], default=0.0),
    }
    return per_agent, step


def pipeline_pace(
    busy: dict[str, Sequence[float]], wall: float, *, concurrent: bool, beside: Sequence[bool] = ()
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """`trainer.lag` > 0: each agent samples, then learns, with no barrier between, so an agent waits only for the
    step's end: `time/wait_step` = the step's length less its busy time (the step's length: its wall time where the
    agents run concurrently, else the busiest agent's). An agent with a sampler of its own (`beside[j]`) samples
    while it learns: its busy time is the longer of the two."""
    beside = list(beside) or [False] * len(busy["sampling"])
    totals = [max(s, u) if b else s + u for s, u, b in zip(busy["sampling"], busy["update"], beside, strict=True)]
    length = wall if concurrent else max(totals, default=0.0)
    waits = [max(0.0, length - b) for b in totals]
    per_agent = [
        {"time/busy_sampling": s, "time/busy_update": u, "time/wait_step": w}
        for s, u, w in zip(busy["sampling"], busy["update"], waits, strict=True)
    ]
    total = length * len(waits)
    step = {"time/idle_frac": sum(waits) / total if total > 0 else 0.0, "time/critical_path": max(totals, default=0.0)}
    return per_agent, step


def pace_summary(records: list[dict[str, Any]], shape: Costs, *, slack: float = 0.1) -> str | None:
    """The run's waits in one line per agent, with the setting that would use them (see the module docstring);
    None before any step logged them. `shape`: the run's (`run_shape`). The group sizes come from the time model
    `hacrl plan --measure` uses (`advise`), fed with this run's own steps (all but the first, which pays one-time
    costs): the same advice either way. A frozen agent learns nothing, so its update wait has no fix."""
    from hacrl.driver.metrics import agent_key

    names = shape.names

    def total(name: str, metric: str) -> float:
        return sum(r.get(agent_key(name, metric)) or 0.0 for r in records)

    steps = [r for r in records if agent_key(names[0], "time/wait_sampling") in r]
    if not steps:
        return None
    advice = advise([step_costs(r, shape) for r in (steps[1:] or steps)], slack=slack)
    local = "ran one after another (runtime.backend=local); these are the waits of the critical path"
    how = "ran concurrently" if shape.concurrent else local + ", with a device per agent"
    lines = [f"pace: the agents {how}:"]
    slowest_update = max(names, key=lambda n: total(n, "time/busy_update"))
    for i, name in enumerate(names):
        busy = {p: total(name, f"time/busy_{p}") for p in PHASES}
        wait = {p: total(name, f"time/wait_{p}") for p in PHASES}
        spent = sum(busy.values()) + sum(wait.values())
        if spent <= 0:
            continue
        share = {p: f"{100 * wait[p] / spent:.0f} %" for p in PHASES}
        line = (f"  {name}: waited {100 * sum(wait.values()) / spent:.0f} % of its sampling and update time "
                f"(sampling {share['sampling']}, update {share['update']})")  # fmt: skip
        advice_lines = []
        if wait["sampling"] >= SUMMARY_THRESHOLD * spent and busy["sampling"] > 0:
            advice_lines.append(_budget_advice(advice, i, slack))
        if wait["update"] >= SUMMARY_THRESHOLD * spent and name != slowest_update and shape.learns[i]:
            j = list(names).index(slowest_update)
            advice_lines.append(f"its update waits on {slowest_update}: give it more devices (agents.{j}.devices)")
        lines.append(line + ("; " + "; ".join(advice_lines) if advice_lines else ""))
    return "\n".join(lines)


def _budget_advice(advice: Advice, i: int, slack: float) -> str:
    """What would use agent i's sampling wait, by the time model (`advise`)."""
    now, proposed = advice.now, advice.proposed
    g, lo, hi = proposed.group_sizes[i], *advice.group_sizes[i]
    if g == now.group_sizes[i]:
        if advice.costs.shared:
            return ("no larger group_size pays: every learner trains on its answers, so each added one lengthens the "
                    "slowest update (hacrl plan --measure says what would)")  # fmt: skip
        return f"no larger group_size keeps the step within {100 * slack:.0f} % of today's"
    cap = proposed.foreign_cap
    budget = f" with sharing.budget_per_prompt={cap}" if cap is not None and cap != advice.costs.foreign_cap else ""
    by_step = f"; {lo}-{hi} from single steps" if lo != hi else ""
    return (f"agents.{i}.group_size={g}{budget} would use its sampling wait (predicted from this run's steps: idle "
            f"{100 * now.idle_frac:.0f} % -> {100 * proposed.idle_frac:.0f} %, answers per second "
            f"{now.answers_per_second:.3g} -> {proposed.answers_per_second:.3g}{by_step})")  # fmt: skip


# -- the time model of a lockstep step: `hacrl plan --measure`, `--devices` and the end-of-run advice ---------------


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
    foreign_cap: int | None = None
    """The sharing budget (`sharing.budget_per_prompt`) the prediction assumes."""


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
                      b * total / step if step > 0 else 0.0, costs.foreign_cap)  # fmt: skip


def propose(costs: Costs, *, slack: float = 0.1) -> tuple[Prediction, Prediction]:
    """(today's prediction, the proposed budgets'). Answers are added (whole mini-batches) to the agent with the
    most sampling wait while its sampling still ends within the slowest agent's and the step stays within `slack`
    of today's. Where every learner trains on every answer (sharing without `sharing.budget_per_prompt`), each
    added answer also lengthens the slowest update; then a sharing budget is tried too (each learner's foreign
    answers per prompt today, and each agent's group size), and proposed with the budgets when it lets them
    deliver at least 5 % more answers per second."""
    now = predict(costs, costs.group_sizes)
    best = _grown(costs, now, slack)
    if costs.shared and costs.foreign_cap is None and len(costs.names) > 1:
        n, sizes = len(costs.names), costs.group_sizes
        caps = {foreign_per_prompt(sizes, k, budget=None, group_of=costs.group_of) for k in range(n)} | set(sizes)
        for cap in sorted(c for c in caps if c > 0):
            trial = _grown(replace(costs, foreign_cap=cap), now, slack)
            if trial.answers_per_second > 1.05 * best.answers_per_second:
                best = trial
    return now, best


def _grown(costs: Costs, now: Prediction, slack: float) -> Prediction:
    """The budgets `propose` reaches under `costs` from today's, held to `now`'s step and slowest sampling."""
    sizes, limit, slowest = list(costs.group_sizes), (1 + slack) * now.step, max(now.sampling)
    if now.step <= 0 or slowest <= 0:  # nothing measured: nothing to fill
        return predict(costs, sizes)
    while True:
        best = None
        for j in range(len(sizes)):
            bigger = _next_whole(sizes[j], costs.prompts, costs.mini_batch_size)
            trial = predict(costs, [*sizes[:j], bigger, *sizes[j + 1 :]])
            if bigger > MAX_GROUP_SIZE or trial.sampling[j] > slowest + 1e-12 or trial.step > limit:
                continue
            wait = slowest - predict(costs, sizes).sampling[j]
            if best is None or wait > best[0]:
                best = (wait, j, bigger)
        if best is None:
            return predict(costs, sizes)
        sizes[best[1]] = best[2]


def _next_whole(group_size: int, prompts: int, mini_batch_size: int) -> int:
    """The next group size above `group_size` whose prompts x group size is a whole number of mini-batches."""
    g = group_size + 1
    while (prompts * g) % mini_batch_size:
        g += 1
    return g


def step_costs(record: dict[str, Any], base: Costs) -> Costs:
    """`base` (the run's shape: names, group sizes, sharing) with the per-unit costs of one lockstep step's record:
    each agent's busy seconds per answer sampled and per row trained, the scoring seconds per answer."""
    from hacrl.driver.metrics import agent_key

    def value(name: str, metric: str) -> float:
        return float(record.get(agent_key(name, metric)) or 0.0)

    b, names, sizes = base.prompts, base.names, base.group_sizes
    return replace(
        base,
        per_answer=[value(n, "time/busy_sampling") / (b * g) for n, g in zip(names, sizes, strict=True)],
        per_row=[value(n, "time/busy_update") / max(value(n, "trained_sequences"), 1) for n in names],
        scoring=float(record.get("time/scoring") or 0.0) / (b * sum(sizes)),
        measured={"time/step": float(record.get("time/step") or 0.0),
                  "time/idle_frac": float(record.get("time/idle_frac") or 0.0)},
    )  # fmt: skip


def median_costs(per_step: list[Costs]) -> Costs:
    """The per-unit costs of several steps' measurements, each the median over the steps."""

    def med(values):
        return statistics.median(values)

    first = per_step[0]
    return replace(
        first,
        per_answer=[med(c.per_answer[j] for c in per_step) for j in range(len(first.names))],
        per_row=[med(c.per_row[j] for c in per_step) for j in range(len(first.names))],
        scoring=med(c.scoring for c in per_step),
        measured={k: med(c.measured.get(k, 0.0) for c in per_step) for k in first.measured},
    )


@dataclass
class Advice:
    """The budgets proposed from several steps' measurements, and how much they vary between the steps."""

    costs: Costs
    """The median costs the proposal is made from."""
    now: Prediction
    proposed: Prediction
    steps: int
    """Steps measured."""
    group_sizes: list[tuple[int, int]]
    """Per agent, the least and the most group size proposed from one step's costs alone."""
    idle_now: tuple[float, float]
    """The least and the most idle fraction predicted for today's budgets from one step's costs alone."""
    measured_idle: tuple[float, float]
    """The least and the most idle fraction the steps measured."""
    per_answer_spread: list[float]
    """Per agent, (most - least) / median seconds per answer over the steps."""
    between_runs: list[Prediction] = field(default_factory=list)
    """With several measurements (each its own run, `hacrl plan --measure --runs N`): each one's own proposal."""


def advise(per_step: list[Costs], *, slack: float = 0.1, runs: list[list[Costs]] | None = None) -> Advice:
    """`propose` on the steps' median costs, with the spread of what each step alone would have proposed; `runs`:
    the steps grouped by the measurement (run) they came from, each run's own proposal kept (a second run of the
    same config on the same quiet machine can propose other budgets: its costs differ more than its steps do)."""
    between = [propose(median_costs(run), slack=slack)[1] for run in runs] if runs and len(runs) > 1 else []
    costs = median_costs(per_step)
    now, proposed = propose(costs, slack=slack)
    alone = [propose(c, slack=slack) for c in per_step]
    n = len(costs.names)
    sizes = [(min(p.group_sizes[j] for _, p in alone), max(p.group_sizes[j] for _, p in alone)) for j in range(n)]
    idle = [w.idle_frac for w, _ in alone]
    measured = [c.measured.get("time/idle_frac", 0.0) for c in per_step]
    spread = [(max(c.per_answer[j] for c in per_step) - min(c.per_answer[j] for c in per_step))
              / max(costs.per_answer[j], 1e-12) for j in range(n)]  # fmt: skip
    return Advice(costs, now, proposed, len(per_step), sizes, (min(idle), max(idle)), (min(measured), max(measured)),
                  spread, between)  # fmt: skip


def run_shape(config, *, concurrent: bool) -> Costs:
    """A run's shape for the time model (names, group sizes, prompts, mini-batches, who learns, what is shared and
    within which budget), its per-unit costs still zero: `step_costs` or a model fills them."""
    from hacrl.config.settings import AgentSettings
    from hacrl.core import get_algorithm

    names, zeros = [a.name for a in config.agents], [0.0] * len(config.agents)
    return Costs(
        names=names, group_sizes=[AgentSettings.resolve(a, config.rollout).group_size for a in config.agents],
        per_answer=zeros, per_row=zeros, scoring=0.0, prompts=config.trainer.prompts_per_step,
        mini_batch_size=config.trainer.mini_batch_size, concurrent=concurrent,
        shared=get_algorithm(config.algorithm.name).pool_is_shared(config.algorithm) and len(names) > 1,
        learns=[not a.frozen for a in config.agents], **sharing_terms(config),
    )  # fmt: skip


def sharing_terms(config) -> dict:
    """What of `sharing` bounds a learner's foreign answers (`Costs.foreign_cap`, `Costs.group_of`)."""
    sharing, names = config.sharing, [a.name for a in config.agents]
    group_of = {m: g for g, members in enumerate(sharing.groups) for m in members} if sharing.groups else None
    return {"foreign_cap": sharing.budget_per_prompt, "group_of": [group_of[n] for n in names] if group_of else None}
