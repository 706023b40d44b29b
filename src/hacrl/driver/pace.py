"""How long each agent waits on the others in a lockstep step, and what would use that time.

A step's sampling phase lasts until the slowest agent has sampled, its update phase until the slowest learner has
learned. Agent j's busy time in a phase is its worker's call from start to end (`Sampled.span`, `Learned.span`);
its wait is the phase's length minus that:

    <agent>/time/busy_sampling, <agent>/time/busy_update    seconds its worker computed in the phase
    <agent>/time/wait_sampling, <agent>/time/wait_update    seconds it waited for the others
    time/idle_frac       idle worker-seconds / worker-seconds, over both phases
    time/critical_path   the slowest agent's sampling + scoring + the slowest learner's update

Where the agents run concurrently (Ray: `Workers.concurrent`), a phase's length is its wall time on the driver (so the
calls' dispatch counts as waiting). The local backend calls the agents one after another in one process: there a phase
lasts the sum of the busy times, and the waits logged are those of the critical path, what each agent would wait with
devices of its own (the phase's length is then the slowest agent's busy time).

`pace_summary` says at the end of a run, per agent, what share of its sampling and update time it waited, and
what would use that time: a larger rollout budget (`agents.<i>.group_size`) for an agent that waits in sampling,
devices for the learner the others wait on in the update (every learner of a sharing run trains on the same pool,
so budgets cannot balance the update).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PHASES = ("sampling", "update")

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


def pace_summary(
    records: list[dict[str, Any]],
    names: Sequence[str],
    group_sizes: Sequence[int],
    *,
    prompts_per_step: int,
    mini_batch_size: int,
    concurrent: bool,
    frozen: Sequence[bool] = (),
) -> str | None:
    """The run's waits in one line per agent, with the setting that would use them (see the module docstring);
    None before any step logged them. A frozen agent (`frozen[i]`) learns nothing, so its update wait has no fix."""
    from hacrl.driver.metrics import agent_key

    def total(name: str, metric: str) -> float:
        return sum(r.get(agent_key(name, metric)) or 0.0 for r in records)

    if not any(agent_key(names[0], "time/wait_sampling") in r for r in records):
        return None
    local = "ran one after another (runtime.backend=local); these are the waits of the critical path"
    how = "ran concurrently" if concurrent else local + ", with a device per agent"
    lines = [f"pace: the agents {how}:"]
    slowest_update = max(names, key=lambda n: total(n, "time/busy_update"))
    for i, (name, g) in enumerate(zip(names, group_sizes, strict=True)):
        busy = {p: total(name, f"time/busy_{p}") for p in PHASES}
        wait = {p: total(name, f"time/wait_{p}") for p in PHASES}
        spent = sum(busy.values()) + sum(wait.values())
        if spent <= 0:
            continue
        share = {p: f"{100 * wait[p] / spent:.0f} %" for p in PHASES}
        line = (f"  {name}: waited {100 * sum(wait.values()) / spent:.0f} % of its sampling and update time "
                f"(sampling {share['sampling']}, update {share['update']})")  # fmt: skip
        advice = []
        if wait["sampling"] >= SUMMARY_THRESHOLD * spent and busy["sampling"] > 0:
            budget = filling_budget(g, busy["sampling"], busy["sampling"] + wait["sampling"], prompts_per_step,
                                    mini_batch_size)  # fmt: skip
            if budget is not None:
                advice.append(f"agents.{i}.group_size={budget} would fill its sampling wait (the other learners then "
                              "train on more of its answers, so every update grows)")  # fmt: skip
        learns = not (i < len(frozen) and frozen[i])
        if wait["update"] >= SUMMARY_THRESHOLD * spent and name != slowest_update and learns:
            j = list(names).index(slowest_update)
            advice.append(f"its update waits on {slowest_update}: give it more devices (agents.{j}.devices)")
        lines.append(line + ("; " + "; ".join(advice) if advice else ""))
    return "\n".join(lines)


def filling_budget(group_size: int, busy_s: float, length_s: float, prompts: int, mini_batch_size: int) -> int | None:
    """The largest group size above `group_size` whose sampling, at this agent's measured seconds per answer, still
    ends within the phase's length, and whose prompts x group size is a whole number of mini-batches; None if none.

    >>> filling_budget(8, busy_s=1.0, length_s=4.0, prompts=16, mini_batch_size=64)  # 4x the time: up to 32
    32
    >>> filling_budget(8, busy_s=1.0, length_s=1.9, prompts=16, mini_batch_size=64)  # 15 fits, 12 is the largest whole
    12
    >>> filling_budget(8, busy_s=1.0, length_s=1.2, prompts=16, mini_batch_size=64) is None
    True
    """
    most = int(group_size * length_s / busy_s)
    for g in range(most, group_size, -1):
        if (prompts * g) % mini_batch_size == 0:
            return g
    return None
