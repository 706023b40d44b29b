"""How long each agent waits on the others (issue 58, 1): the waits of a phase from the agents' busy times, the
idle fraction, the critical path, the end-of-run summary with the setting that would use the wait; and the same
metrics from real runs on both backends."""

from __future__ import annotations

import pytest

from hacrl.driver.pace import filling_budget, pace_metrics, pace_summary, phase_waits


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


def _records(steps, fast=(1.0, 3.0, 1.0, 1.0), slow=(4.0, 0.0, 2.0, 0.0)):
    keys = ("time/busy_sampling", "time/wait_sampling", "time/busy_update", "time/wait_update")
    values = {"a": fast, "b": slow}
    return [{"step": s, **{f"{a}/{k}": v for a in values for k, v in zip(keys, values[a], strict=True)}}
            for s in range(1, steps + 1)]  # fmt: skip


def test_the_summary_names_each_agents_wait_and_the_setting_that_would_use_it():
    """Agent a samples in 1 s of a 4 s phase (3 s waited) and learns in 1 of 2 s: it waited 4 of 6 s. At its
    measured seconds per answer G = 8 could become 32 in the phase's 4 s (16 x 32 = 512 rows, whole mini-batches
    of 64); its update waits on b, which only more devices shorten."""
    text = pace_summary(_records(3), ["a", "b"], [8, 8], prompts_per_step=16, mini_batch_size=64, concurrent=True)
    lines = text.splitlines()
    assert lines[0] == "pace: the agents ran concurrently:"
    assert lines[1].startswith("  a: waited 67 % of its sampling and update time (sampling 50 %, update 17 %)")
    assert "agents.0.group_size=32 would fill its sampling wait" in lines[1]
    assert "its update waits on b: give it more devices (agents.1.devices)" in lines[1]
    assert lines[2] == "  b: waited 0 % of its sampling and update time (sampling 0 %, update 0 %)"
    frozen = pace_summary(_records(3), ["a", "b"], [8, 8], prompts_per_step=16, mini_batch_size=64, concurrent=True,
                          frozen=[True, False])  # fmt: skip
    assert "group_size=32" in frozen and "its update waits" not in frozen  # a frozen agent's update wait: no fix
    local = pace_summary(_records(1), ["a", "b"], [8, 8], prompts_per_step=16, mini_batch_size=64, concurrent=False)
    assert "one after another (runtime.backend=local); these are the waits of the critical path" in local
    assert pace_summary([{"step": 1}], ["a", "b"], [8, 8], prompts_per_step=16, mini_batch_size=64,
                        concurrent=True) is None  # fmt: skip


def test_a_budget_only_grows_to_whole_mini_batches_within_the_phase():
    assert filling_budget(8, 1.0, 4.0, 16, 64) == 32
    assert filling_budget(8, 1.0, 1.9, 16, 64) == 12  # 15 would fit; 12 is the largest whole number of batches
    assert filling_budget(8, 1.0, 1.2, 16, 64) is None
    assert filling_budget(4, 2.0, 9.0, 3, 3) == 18


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
