"""The manipulation domain (`env.name: reach`, issue 72, part 1): MuJoCo arms that differ in their actuators. Their
kinematics against hand-computed values, the same task for every platform, deterministic physics, unstable physics
ending an episode (never the run), Gaussian policies' log-probs, and runs through `hacrl control` that resume
exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco")

from hacrl.control.arms import GOAL_RADII, PLATFORMS, Reach, fingertip, full, polar, pull  # noqa: E402
from hacrl.tools.cli import main  # noqa: E402
from tests.conftest import fails_cleanly, records, without_timings  # noqa: E402

CONFIG = "configs/reach.yaml"
SMALL = ["trainer.initial_states_per_step=2", "trainer.group_size=4", "trainer.mini_batch_size=4",
         "eval.initial_states=4", "logging.console=false", "logging.tensorboard=false"]  # fmt: skip


@pytest.mark.parametrize(
    ("platform", "q", "tip"),
    [
        ("arm2", (0.0, 0.0), (0.9, 0.0)),  # stretched along x: 0.5 + 0.4
        ("arm2", (0.0, math.pi / 2), (0.5, 0.4)),  # elbow at a right angle
        ("arm2", (math.pi, 0.0), (-0.9, 0.0)),
        ("arm3", (math.pi / 2, -math.pi / 2, 0.0), (0.55, 0.35)),  # up 0.35, then along x 0.30 + 0.25
        ("arm3", (0.0, math.pi, math.pi), (0.3, 0.0)),  # folded back and forth: 0.35 - 0.30 + 0.25
    ],
)
def test_the_fingertip_is_where_hand_computed_kinematics_put_it(platform, q, tip):
    """The fingertip MuJoCo reports (the task space logged with every state) against the hand-computed values,
    and `fingertip` (the forward kinematics the mappings will use) against both."""
    import mujoco

    env = Reach(platform)
    env.reset([0])
    data = env._data[0]
    data.qpos[:] = q
    mujoco.mj_forward(env.model, data)
    assert np.allclose(data.site("tip").xpos[:2], tip, atol=1e-12)
    assert np.allclose(fingertip(PLATFORMS[platform], np.array(q)), tip, atol=1e-12)


def test_every_platform_gets_the_same_goals_and_its_physics_repeat():
    """A seed is one task: the same goal for both arms, inside the annulus both reach; the logged fingertip stays
    the forward kinematics of the logged joints at every step; the same seeds and actions give the same states bit
    for bit (a second pool); an action past [-1, 1] is clipped there."""
    seeds = list(range(16))
    goals = {}
    for platform in PLATFORMS:
        env, again = Reach(platform), Reach(platform)
        n = env.joints
        states, repeat = np.stack(env.reset(seeds)), np.stack(again.reset(seeds))
        goals[platform] = states[:, -2:]
        rng = np.random.default_rng(0)
        for _ in range(10):
            actions = rng.uniform(-1, 1, (len(seeds), n))
            states, repeat = np.stack(env.step(actions)), np.stack(again.step(actions))
            assert np.array_equal(states, repeat)
            assert np.allclose(fingertip(env.lengths, states[:, :n]), states[:, 2 * n : 2 * n + 2], atol=1e-12)
        one, big = Reach(platform), Reach(platform)
        one.reset([3]), big.reset([3])
        assert np.array_equal(one.step([np.ones(n)])[0], big.step([5 * np.ones(n)])[0])
    assert np.array_equal(goals["arm2"], goals["arm3"])
    radii = np.hypot(goals["arm2"][:, 0], goals["arm2"][:, 1])
    assert ((GOAL_RADII[0] <= radii) & (radii <= GOAL_RADII[1])).all()


def test_the_views_of_an_arm_read_one_state_each():
    """`full`: cos and sin of the joints, speeds per MAX_SPEED, the goal's offset from the fingertip; `polar`: the
    same posture, the offset as distance and direction; `pull`: `full` and each joint's pull toward the goal."""
    state = np.array([[0.0, math.pi / 2, 1.5, -3.0, 0.5, 0.4, 0.5, 1.4]])
    view = full(state, 2)[0]
    assert np.allclose(view, [1, 0, 0, 1, 0.5, -1, 0, 1], atol=1e-7)
    assert np.allclose(polar(state, 2)[0], [1, 0, 0, 1, 0.5, -1, 1, 0, 1], atol=1e-7)
    # `pull`: J^T offset; J = [[-0.4, -0.4], [0.5, 0]] here, offset (0, 1): the shoulder pulls 0.5 m per radian,
    # the elbow (which moves the fingertip along -x, across the offset) 0
    assert np.allclose(pull(state, 2, PLATFORMS["arm2"])[0], [*view, 0.5, 0.0], atol=1e-7)
    with pytest.raises(ValueError, match="needs the arm's 2 link lengths"):
        pull(state, 2)


def test_unstable_physics_ends_that_episode_only(unstable_physics, tmp_path):
    """A non-finite state in one arm: that arm keeps its last sound state from there on, is counted, scores 0; the
    others go on; through a run, `unstable_episodes` counts it and the run ends normally."""
    broken = unstable_physics
    env = Reach("arm2")
    first = np.stack(env.reset([1, 2]))
    after = [np.stack(env.step([np.ones(2), np.ones(2)])) for _ in range(3)]
    assert env.unstable == [True, False]
    assert np.array_equal(after[0][0], first[0]) and np.array_equal(after[2][0], first[0])
    assert np.isfinite(np.stack(after)).all() and not np.array_equal(after[2][1], first[1])
    broken["left"] = 1
    run = tmp_path / "run"
    args = [*SMALL, "trainer.steps=1", "eval.at_start=false", "checkpoint.every=0", f"trainer.output_dir={run}"]
    assert main(["control", CONFIG, *args]) == 0
    last = records(run)[-1]
    assert last["arm2/unstable_episodes"] + last["arm3/unstable_episodes"] == 1


def test_mujocos_silent_reset_of_a_huge_value_is_an_unstable_episode_and_writes_no_log(tmp_path, monkeypatch):
    """Issue 87.8: MuJoCo, meeting a huge acceleration (`qvel` 1e9), resets the arm to joint angles 0 and steps on;
    the episode read as sound (angles 0, `unstable` false). Now it is unstable from that step (its last sound state
    kept), the other arm goes on. Issue 87.15: MuJoCo's warning is not written to MUJOCO_LOG.TXT in the working
    directory (nor printed); hacrl keeps the last one."""
    import os

    from hacrl.control import arms

    monkeypatch.chdir(tmp_path)
    env = Reach("arm3")
    first = np.stack(env.reset([446, 7]))
    env._data[0].qvel[:] = 1e9
    after = np.stack(env.step([np.zeros(3), np.zeros(3)]))
    assert env.unstable == [True, False]
    assert np.array_equal(after[0][:3], first[0][:3]) and not np.allclose(after[0][:3], 0)  # not reset to angles 0
    assert "Nan, Inf or huge value" in arms.last_mujoco_warning
    assert os.listdir(tmp_path) == []


def test_start_postures_never_touch_and_contacts_are_counted():
    """Issue 87.7: arm3's first and last link can touch, and 34 of 1,000 seeds started with them overlapping (seed
    446 by 40 mm), so the arm moved under zero actions. No start posture of 1,000 seeds touches now, seeds that did
    not keep today's posture, the fingertip is on the start point, and zero actions leave the arm where it is; an
    episode whose links touch later is counted."""
    import mujoco

    from hacrl.control.arms import fingertip, inverse_kinematics

    env = Reach("arm3")
    data = mujoco.MjData(env.model)
    redrawn = 0
    for seed in range(1000):
        q = env.start_posture(seed)
        mujoco.mj_resetData(env.model, data)
        data.qpos[:] = q
        mujoco.mj_forward(env.model, data)
        assert data.ncon == 0, seed
        assert np.allclose(fingertip(env.lengths, q), env.start(seed), atol=1e-9)
        first = inverse_kinematics(env.lengths, env.start(seed), np.random.default_rng([seed, 2]))
        redrawn += not np.array_equal(q, first)
    assert redrawn == 34
    start = np.stack(env.reset([446]))
    still = [np.stack(env.step([np.zeros(3)])) for _ in range(20)][-1]
    assert np.abs(still[0][6:8] - start[0][6:8]).max() < 1e-3 and env.contact == [False]  # the tip stays put
    env.reset([446])
    for _ in range(40):  # fold the last link back onto the first: they touch
        env.step([np.array([0.0, 1.0, 1.0])])
    assert env.contact == [True]


def test_a_gaussian_policys_log_probs_are_its_densitys():
    """The per-step log-prob of a continuous action is the Gaussian's (mean from the network, std exp(log_std)
    times the temperature), summed over the action's dimensions; drawing from a seeded generator repeats."""
    from hacrl.control.policies import MLPPolicy, draw, step_logprobs

    torch.manual_seed(0)
    policy = MLPPolicy(5, 16, 3, continuous=True)
    obs, actions = torch.randn(2, 4, 5), torch.randn(2, 4, 3)
    with torch.no_grad():
        policy.log_std.copy_(torch.tensor([-0.5, 0.0, 0.3]))
        got = step_logprobs(policy, obs, actions, temperature=0.7)
        std = policy.log_std.exp() * 0.7
        want = torch.distributions.Normal(policy(obs), std).log_prob(actions).sum(-1)
        assert torch.allclose(got, want, atol=1e-5)
        out = policy(obs[:, 0])
        a = draw(policy, out, 0.7, torch.Generator().manual_seed(3), greedy=False)
        b = draw(policy, out, 0.7, torch.Generator().manual_seed(3), greedy=False)
        assert torch.equal(a, b) and not torch.equal(a, out)
        assert torch.equal(draw(policy, out, 0.7, torch.Generator(), greedy=True), out)


@pytest.mark.slow
@pytest.mark.parametrize(
    "pair",
    [
        [],  # configs/reach.yaml: arm2 and arm3, each alone (GSPO)
        [
            "algorithm.name=hacpo",
            "policies.1.name=arm2-gru",
            "policies.1.platform=arm2",
            "policies.1.observation=polar",
            "policies.1.architecture=gru",
        ],  # two arm2 policies that see and compute
        # differently share episodes
        ["algorithm.name=hacpo", "mapping.default=defined"],  # arm2 and arm3 through their kinematics
        [
            "algorithm.name=hacpo",
            "mapping.default=learned",
            "mapping.pairs.arm2->arm3=defined",
            "sharing.replay.steps=1",
        ],  # a mapping each way, and experience buffers
    ],  # fmt: skip
)
def test_a_run_of_each_platform_pair_resumes_exactly(pair, tmp_path):
    full_run, cut_run = tmp_path / "full", tmp_path / "cut"
    args = [*SMALL, *pair, "trainer.steps=2", "eval.every=2", "checkpoint.every=1"]
    assert main(["control", CONFIG, *args, f"trainer.output_dir={full_run}"]) == 0
    assert main(["control", CONFIG, *args, "trainer.steps=1", f"trainer.output_dir={cut_run}"]) == 0
    assert main(["control", CONFIG, *args, f"trainer.output_dir={cut_run}", "--resume"]) == 0
    assert without_timings(records(cut_run)[-1]) == without_timings(records(full_run)[-1])
    last = records(full_run)[-1]
    assert 0 <= last["eval/arm2/success"] <= 1 and last["arm2/unstable_episodes"] == 0
    if "mapping.default=defined" in pair or "mapping.default=learned" in pair:  # own 8 + the replays kept
        for learner, source in (("arm2", "arm3"), ("arm3", "arm2")):
            kept = last[f"{learner}/mapped/{source}/kept"]
            offered = 8 + last.get(f"{learner}/replay/offered", 0)  # the step's 8, and those the buffers brought
            assert kept + last[f"{learner}/mapped/{source}/filtered"] == offered
            assert last[f"{learner}/trained_sequences"] == 8 + kept
        if "sharing.replay.steps=1" in pair:  # step 1's 2 initial states, 4 episodes each of the other arm
            assert last["arm2/replay/offered"] == last["arm3/replay/offered"] == 8
        learned = "mapping.default=learned" in pair  # arm3->arm2 learned (arm2's model), arm2->arm3 defined
        assert ("arm2/mapping/inverse_error" in last) == learned and "arm3/mapping/inverse_error" not in last
        assert (cut_run / "checkpoints" / "step_000001" / "mappings" / "arm2.pt").exists() == learned
    elif pair:
        assert last["arm2/trained_sequences"] == 16 and "arm2/foreign_ratio_mean" in last  # 8 own + 8 foreign
    from hacrl.driver.metrics import unknown_keys

    assert all(unknown_keys(r) == [] for r in records(full_run))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.name=hacpo"],
            "policies.1 (arm3, arm3) and policies.0 (arm2, arm2) act in different action spaces",
        ),
        (["policies.0.platform=null"], "policies.0.platform is required with env.name=reach"),
        (["env.name=simple_v3"], "policies.0.platform='arm2' is for env.name=reach"),
        (["policies.0.platform=arm7"], "policies[0].platform: Invalid value 'arm7'"),
        (
            ["env.name=simple_v3", "policies.0.platform=null", "policies.1.platform=null"],
            "policies.0.observation=pull is an arm's view",
        ),
    ],
)
def test_bad_reach_settings_are_refused_naming_the_key(overrides, message, tmp_path, capsys):
    run = tmp_path / "run"
    fails_cleanly(capsys, ["control", CONFIG, *SMALL, f"trainer.output_dir={run}", *overrides], message)
    assert not run.exists()


def test_without_mujoco_the_message_names_the_extra(monkeypatch, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mujoco" else real(name, *a))
    run = tmp_path / "run"
    fails_cleanly(capsys, ["control", CONFIG, *SMALL, f"trainer.output_dir={run}"], 'pip install "hacrl[control]"',
                  "mujoco")  # fmt: skip
    assert not run.exists()
