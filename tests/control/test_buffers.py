"""Experience buffers (`sharing.replay`; issue 72, part 3): ages and counts bounded, the draw, the buffers through a
checkpoint, the learner's own buffered episodes in the baseline only, the sharing policy and budget in `hacrl
control`, and runs that resume exactly."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from hacrl.control.buffers import Buffers
from hacrl.control.env import Episode
from tests.conftest import fails_cleanly, records, without_timings


def _step(step: int, policies: int = 2, groups: int = 2, size: int = 3) -> tuple[list[int], list[list[Episode]]]:
    """One step's episodes: `groups` initial states (seeds 100 step + g), `size` episodes per policy of each; each
    episode's reward names it (step + policy / 10 + its index / 100)."""
    seeds = [100 * step + g for g in range(groups)]
    sampled = [
        [Episode(g, np.full((3, 4), step, dtype=np.float64), np.zeros((2, 2), np.float32),
                 step + j / 10 + (g * size + i) / 100, j, source_logp_sum=-float(step), old_logp=torch.zeros(4))
         for g in range(groups) for i in range(size)]
        for j in range(policies)
    ]  # fmt: skip
    return seeds, sampled


def test_buffers_keep_the_last_steps_within_the_count_and_draw_from_them():
    """steps=3: after five steps the buffers hold steps 2-4; max_episodes=12 (two steps of 6) drops a third; a draw
    is distinct earlier initial states in buffer order, each with every policy's episodes of it (relabelled), from
    a seeded stream that repeats; old_logp (the learner-side copy) is not kept."""
    buffers = Buffers(2, steps=3, max_episodes=1000, seed=7)
    for step in range(5):
        buffers.add(*_step(step))
    assert [s.step for s in buffers.held[0]] == [2, 3, 4] and buffers.size(1) == 18
    assert all(e.old_logp is None for s in buffers.held[0] for e in s.episodes)
    drawn = buffers.draw(4)
    assert len(drawn) == len(set(drawn)) == 4 and drawn == sorted(drawn)
    assert all(2 <= step <= 4 and seed == 100 * step + g for step, g, seed in drawn)
    step, g, _ = drawn[0]
    got = buffers.episodes(1, step, g, as_group=9)
    assert [e.group for e in got] == [9, 9, 9] and [e.source for e in got] == [1, 1, 1]
    assert [round(e.reward, 2) for e in got] == [round(step + 0.1 + (g * 3 + i) / 100, 2) for i in range(3)]
    assert len(buffers.draw(100)) == 6  # every one held, no more
    twin = Buffers(2, steps=3, max_episodes=1000, seed=7)
    for step in range(5):
        twin.add(*_step(step))
    assert twin.draw(4) == drawn
    small = Buffers(2, steps=3, max_episodes=12, seed=7)
    for step in range(5):
        small.add(*_step(step))
    assert [s.step for s in small.held[0]] == [3, 4]


def test_buffers_round_trip_through_a_checkpoint_file():
    """Every field of every buffered episode, the step counter and the draw's stream come back exactly (the file
    loads with weights_only, as a checkpoint's does)."""
    buffers = Buffers(2, steps=2, max_episodes=100, seed=3)
    for step in range(3):
        buffers.add(*_step(step))
    buffers.draw(2)
    out = io.BytesIO()
    torch.save(buffers.state_dict(), out)
    out.seek(0)
    twin = Buffers(2, steps=2, max_episodes=100, seed=99)
    twin.load_state_dict(torch.load(out, weights_only=True))
    assert twin.added == 3 and twin.draw(3) == buffers.draw(3)
    for a, b in zip(buffers.held, twin.held, strict=True):
        for x, y in zip(a, b, strict=True):
            assert (x.step, x.seeds) == (y.step, y.seeds)
            for e, f in zip(x.episodes, y.episodes, strict=True):
                assert np.array_equal(e.states, f.states) and np.array_equal(e.actions, f.actions)
                assert (e.group, e.reward, e.source, e.source_logp_sum, e.success, e.unstable) == (
                    f.group, f.reward, f.source, f.source_logp_sum, f.success, f.unstable)  # fmt: skip
    with pytest.raises(ValueError, match="the buffers of 2 policies, this run has 3"):
        Buffers(3, 2, 100, 0).load_state_dict(buffers.state_dict())


pytest.importorskip("mpe2")
CONTROL = "configs/control.yaml"
SMALL = ["trainer.initial_states_per_step=2", "trainer.group_size=4", "trainer.mini_batch_size=4",
         "eval.initial_states=4", "logging.console=false", "logging.tensorboard=false", "env.max_cycles=8"]  # fmt: skip


def test_a_learners_own_buffered_episodes_are_in_the_baseline_not_the_loss(monkeypatch, tmp_path):
    """Step 2 of a run with replay: each learner's update gets its own 8 episodes of the step, the other's 8, the
    other's buffered episodes of the drawn initial states, and then its own buffered ones of those, which the loss
    never sees (trained = 16 + the other's replayed)."""
    from hacrl.control.trainer import ControlTrainer
    from hacrl.tools.cli import main

    calls = []
    real = ControlTrainer.learn

    def spy(self, k, pool, caps, baseline_only=0, past_from=None):
        calls.append((k, [(e.source, e.group) for e in pool], baseline_only, past_from))
        return real(self, k, pool, caps, baseline_only, past_from)

    monkeypatch.setattr(ControlTrainer, "learn", spy)
    run = tmp_path / "run"
    args = [*SMALL, "trainer.steps=2", "eval.at_start=false", "eval.every=0", "checkpoint.every=0",
            "algorithm.name=hacpo", "sharing.replay.steps=1", "sharing.replay.groups=1",
            f"trainer.output_dir={run}"]  # fmt: skip
    assert main(["control", CONTROL, *args]) == 0
    assert [c[2] for c in calls] == [0, 0, 4, 4] and [c[3] for c in calls] == [None, None, 2, 2]
    k, pool, baseline_only, _ = calls[2]
    assert pool[:8] == [(0, g) for g in (0, 0, 0, 0, 1, 1, 1, 1)]  # its own, this step
    assert pool[8:16] == [(1, g) for g in (0, 0, 0, 0, 1, 1, 1, 1)] and pool[16:20] == [(1, 2)] * 4  # the other's
    assert pool[20:] == [(0, 2)] * 4  # its own of the drawn initial state: baseline only
    last = records(run)[-1]
    assert last["mlp-full/trained_sequences"] == 20 and last["mlp-full/replay/kept"] == 4
    assert last["mlp-full/replay/offered"] == 4 and last["mlp-full/replay/age_mean"] == 1


@pytest.mark.slow
def test_a_run_with_buffers_and_a_budget_resumes_exactly(tmp_path):
    """Two policies share through buffers of 2 steps under the `correct` policy and a budget; cut after step 2 and
    resumed, step 3 matches the uninterrupted run (the buffers and their draw are in the checkpoint)."""
    from hacrl.driver.metrics import unknown_keys
    from hacrl.tools.cli import main

    full_run, cut_run = tmp_path / "full", tmp_path / "cut"
    args = [*SMALL, "trainer.steps=3", "eval.every=3", "checkpoint.every=1", "algorithm.name=hacpo",
            "sharing.replay.steps=2", "sharing.replay.groups=2", "sharing.policy=correct", "sharing.min_reward=0.3",
            "sharing.budget_per_prompt=2"]  # fmt: skip
    assert main(["control", CONTROL, *args, f"trainer.output_dir={full_run}"]) == 0
    assert main(["control", CONTROL, *args, "trainer.steps=2", f"trainer.output_dir={cut_run}"]) == 0
    assert main(["control", CONTROL, *args, f"trainer.output_dir={cut_run}", "--resume"]) == 0
    assert without_timings(records(cut_run)[-1]) == without_timings(records(full_run)[-1])
    last = records(full_run)[-1]
    for name in ("mlp-full", "gru-polar"):
        assert last[f"{name}/shared_kept"] <= 2 * 4  # at most 2 foreign rows for each of the 4 groups
        assert last[f"{name}/replay/offered"] == 8
    assert all(unknown_keys(r) == [] for r in records(full_run))


def test_turning_buffers_on_at_a_resume_is_refused_as_a_changed_setting():
    """`sharing.replay.*` is read by every sharing policy: a resume that changes it would change the numbers."""
    from dataclasses import asdict, replace

    from hacrl.control.config import ControlConfig, ControlSharingConfig, ReplayConfig
    from hacrl.driver.resume import resume_differences

    saved = asdict(ControlConfig())
    now = replace(ControlConfig(), sharing=ControlSharingConfig(replay=ReplayConfig(steps=2)))
    assert resume_differences(saved, now)[0] == ["sharing.replay.steps: 0 in the checkpoint, 2 now"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.name=gspo", "sharing.replay.steps=2"],
            "sharing.replay.steps chooses which of the other policies' episodes",
        ),
        (["algorithm.name=hacpo", "sharing.policy=top_k"], "sharing.policy=top_k is not in hacrl control"),
        (["algorithm.name=hacpo", "sharing.groups=[[mlp-full,gru-polar]]"], "sharing.groups is not in hacrl control"),
        (
            ["algorithm.name=hacpo", "sharing.replay.steps=2", "sharing.replay.max_episodes=4"],
            "sharing.replay.max_episodes=4 must hold one step's episodes",
        ),
        (["algorithm.name=hacpo", "sharing.replay.steps=-1"], "sharing.replay.steps >= 0"),
        (["algorithm.name=hacpo", "sharing.policy=everything"], "sharing.policy='everything' is not a sharing policy"),
    ],  # fmt: skip
)
def test_bad_sharing_settings_are_refused_naming_the_key(overrides, message, tmp_path, capsys):
    run = tmp_path / "run"
    fails_cleanly(capsys, ["control", CONTROL, *SMALL, f"trainer.output_dir={run}", *overrides], message)
    assert not run.exists()
