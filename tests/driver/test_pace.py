"""How long each agent waits on the others (issue 58, 1): the waits of a phase from the agents' busy times, the
idle fraction, the critical path, the end-of-run summary with the setting that would use the wait; and the same
metrics from real runs on both backends."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hacrl.driver.pace import Costs, advise, pace_metrics, pace_summary, phase_waits, propose, step_costs


def test_a_phase_lasts_its_wall_time_when_agents_run_concurrently_and_its_slowest_agent_otherwise():
    assert phase_waits([1.0, 3.0], 3.5, concurrent=True) == (3.5, [2.5, 0.5])  # dispatch counts as waiting
    assert phase_waits([1.0, 3.0], 4.2, concurrent=False) == (3.0, [2.0, 0.0])  # the critical path
    assert phase_waits([2.0], 2.0, concurrent=False) == (2.0, [0.0])


def test_pace_metrics_by_hand():
    """Sampling: busy 1 and 3 s -> waits 2 and 0; update: busy 2 and 1 s -> waits 0 and 1. Idle worker-seconds
    2 + 1 = 3 of 2 x (3 + 2) = 10; critical path 3 + 0.5 (scoring) + 2."""
    busy = {"sampling": [1.0, 3.0], "update": [2.0, 1.0]}
    per_agent, step = pace_metrics(busy, {"sampling": 4.0, "update": 3.0}, 0.5, concurrent=False)
    assert per_agent == [
        {"time/busy_sampling": 1.0, "time/wait_sampling": 2.0, "time/busy_update": 2.0, "time/wait_update": 0.0},
        {"time/busy_sampling": 3.0, "time/wait_sampling": 0.0, "time/busy_update": 1.0, "time/wait_update": 1.0},
    ]
    assert step == {"time/idle_frac": 0.3, "time/critical_path": 5.5}
    _, concurrent = pace_metrics(busy, {"sampling": 3.0, "update": 2.0}, 0.5, concurrent=True)
    assert concurrent["time/idle_frac"] == 0.3


def _records(steps, fast=(1.0, 3.0, 1.0, 1.0), slow=(4.0, 0.0, 2.0, 0.0), rows=128):
    keys = ("time/busy_sampling", "time/wait_sampling", "time/busy_update", "time/wait_update")
    values = {"a": fast, "b": slow}
    return [{"step": s, "time/scoring": 0.0, **{f"{a}/trained_sequences": rows for a in values},
             **{f"{a}/{k}": v for a in values for k, v in zip(keys, values[a], strict=True)}}
            for s in range(1, steps + 1)]  # fmt: skip


def _shape(shared=False, learns=(True, True), concurrent=True) -> Costs:
    return Costs(names=["a", "b"], group_sizes=[8, 8], per_answer=[0.0, 0.0], per_row=[0.0, 0.0], scoring=0.0,
                 shared=shared, learns=list(learns), prompts=16, mini_batch_size=64, concurrent=concurrent)  # fmt: skip


def test_the_summary_names_each_agents_wait_and_the_setting_that_would_use_it():
    """B = 16, G = 8 each, mini-batches of 64. Agent a samples in 1 s of a 4 s phase and learns its 128 rows in 1 of
    2 s: it waited 4 of 6 s. The time model (`hacrl plan --measure`'s, fed with the run's steps): without sharing
    a's update grows with its own answers (1/128 s a row), so G = 20 (S 2.5 s, U 2.5 s: a 6.5 s step, within 10 %
    of 6 s; 24 would take 7 s); idle (3 + 1) / (2 x 6) = 33 % -> (1.5 + 0.5) / (2 x 6.5) = 15 %, answers per second
    16 x 16 / 6 = 42.7 -> 16 x 28 / 6.5 = 68.9. Its update waits on b, which only more devices shorten."""
    text = pace_summary(_records(3), _shape())
    lines = text.splitlines()
    assert lines[0] == "pace: the agents ran concurrently:"
    assert lines[1].startswith("  a: waited 67 % of its sampling and update time (sampling 50 %, update 17 %)")
    assert ("agents.0.group_size=20 would use its sampling wait (predicted from this run's steps: idle 33 % -> 15 %, "
            "answers per second 42.7 -> 68.9)") in lines[1]  # fmt: skip
    assert "its update waits on b: give it more devices (agents.1.devices)" in lines[1]
    assert lines[2] == "  b: waited 0 % of its sampling and update time (sampling 0 %, update 0 %)"
    frozen = pace_summary(_records(3), _shape(learns=(False, True)))
    assert "group_size=" in frozen and "its update waits" not in frozen  # a frozen agent's update wait: no fix
    local = pace_summary(_records(1), _shape(concurrent=False))
    assert "one after another (runtime.backend=local); these are the waits of the critical path" in local
    assert pace_summary([{"step": 1}], _shape()) is None


def test_under_sharing_the_summary_proposes_a_sharing_budget_with_the_group_size():
    """HACPO without a sharing budget: each learner trains on 256 rows (1/256 s a row for a, 2/256 for b), so each
    answer a adds also lengthens b's update: G 12 at most (b's update 2.5 s). With sharing.budget_per_prompt=8
    (what each learner takes of the other today) b's update stays 2 s and a grows to 32 (S 4 s, U 2.5 s: 6.5 s),
    16 x 40 / 6.5 = 98.5 answers per second against 49.2: proposed with the budget; idle 33 % -> 4 %."""
    text = pace_summary(_records(3, rows=256), _shape(shared=True))
    assert ("agents.0.group_size=32 with sharing.budget_per_prompt=8 would use its sampling wait (predicted from "
            "this run's steps: idle 33 % -> 4 %, answers per second 42.7 -> 98.5)") in text  # fmt: skip
    now, proposed = propose(step_costs(_records(1, rows=256)[0], _shape(shared=True)))
    assert proposed.group_sizes == [32, 8] and proposed.foreign_cap == 8 and proposed.step == pytest.approx(6.5)
    unbudgeted = propose(replace(step_costs(_records(1, rows=256)[0], _shape(shared=True)), foreign_cap=16))[1]
    assert unbudgeted.group_sizes == [12, 8]  # a budget as large as the pool bounds nothing: G 12, as without one


def test_the_advice_says_how_much_the_steps_vary():
    """Three steps whose a sampled in 0.9, 1.0 and 1.1 s: the median's proposal, each step's own, and the spread of
    a's seconds per answer ((1.1 - 0.9) / 1.0 = 20 %)."""
    records = [{**r, "a/time/busy_sampling": x} for r, x in zip(_records(3), (0.9, 1.0, 1.1), strict=True)]
    advice = advise([step_costs(r, _shape()) for r in records])
    assert advice.proposed.group_sizes == [20, 8] and advice.steps == 3
    assert advice.per_answer_spread[0] == pytest.approx(0.2) and advice.per_answer_spread[1] == 0.0
    assert advice.group_sizes[0][0] <= 20 <= advice.group_sizes[0][1]


def test_the_advice_says_what_each_measurement_alone_would_propose():
    """Two measurements (each its own run) of the same pair: in the second, a's update took 0.5 s instead of 1 s
    (1/256 s a row): G = 20 from the first alone (its update bounds it, as above), 32 from the second (a's
    sampling, 1/128 s an answer x 16 x 32 = 4 s, reaches b's: 4 + 2 s, within 10 % of 6 s). The pooled proposal
    is the one from both runs' median costs, and the text names both."""
    from hacrl.tools.budgets import render

    first = [step_costs(r, _shape()) for r in _records(3)]
    second = [step_costs({**r, "a/time/busy_update": 0.5}, _shape()) for r in _records(3)]
    advice = advise(first + second, runs=[first, second])
    assert [p.group_sizes for p in advice.between_runs] == [[20, 8], [32, 8]]
    assert "between the 2 measurements (each its own run), the proposal of each alone: G a 20, 32; b 8, 8" in render(
        advice
    )
    assert advise(first, runs=[first]).between_runs == []
    assert "`--runs 2` measures twice" in render(advise(first))


@pytest.mark.slow
def test_a_local_run_logs_the_waits_of_its_critical_path(tiny_agents, tmp_path, capsys):
    """Every step: per phase, busy + wait is the same for every agent (the slowest agent's busy time) and the
    slowest agent waits 0; the idle fraction and critical path follow; the step line names the slowest agents and
    the run ends with the pace summary."""
    from hacrl.tools.cli import main
    from tests.conftest import pair_config, records

    cfg = pair_config(tiny_agents, tmp_path, trainer={"steps": 2}, logging={"console": True})
    assert main(["train", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "slowest: sampling " in out and "pace: the agents ran one after another" in out
    for r in records(tmp_path / "run"):
        idle = total = 0.0
        for phase in ("sampling", "update"):
            lengths = {round(r[f"{a}/time/busy_{phase}"] + r[f"{a}/time/wait_{phase}"], 9) for a in ("llama", "qwen")}
            assert len(lengths) == 1
            assert min(r[f"{a}/time/wait_{phase}"] for a in ("llama", "qwen")) == 0.0
            idle += sum(r[f"{a}/time/wait_{phase}"] for a in ("llama", "qwen"))
            total += 2 * lengths.pop()
        assert r["time/idle_frac"] == pytest.approx(idle / total)
        assert r["time/critical_path"] <= r["time/step"]


def test_costs_that_measured_nothing_propose_nothing_and_a_free_agent_stops_at_the_largest_budget():
    zero = _shape()
    assert propose(zero)[1].group_sizes == [8, 8]
    free = replace(_shape(), per_answer=[0.0, 0.01], per_row=[0.0, 0.0])  # a's answers cost nothing measurable
    assert propose(free)[1].group_sizes[0] == 4096


def test_without_sharing_a_budget_that_cannot_grow_names_the_slack():
    """Slack 0: the step (4 s sampling + 2 s update) may not grow. a's update grows with its answers (1/128 s a
    row): G 16 gives U 2 s (fits), 20 gives 2.5 s (does not). With a's rows twice as slow (2/128 s), already G 12
    gives U 3 s: nothing fits, and the line names the slack it was held to."""
    assert "agents.0.group_size=16" in pace_summary(_records(3), _shape(), slack=0.0)
    slow = _records(3, fast=(1.0, 3.0, 2.0, 0.0))
    assert "no larger group_size keeps the step within 0 % of today's" in pace_summary(slow, _shape(), slack=0.0)
