"""Mappings between the arms' action spaces (issue 72, part 2): the defined mapping against hand-computed kinematics,
replays that are real episodes of the learner's arm, the learned mapping's error on held-out transitions, its state
through a checkpoint, and the refusals before any run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco")

from hacrl.control import arms  # noqa: E402
from hacrl.control.arms import PLATFORMS, STEP_SECONDS, Reach, fingertip, jacobian, task_action  # noqa: E402
from hacrl.control.env import Episode  # noqa: E402
from hacrl.control.mapping import Behaviour, Defined, InverseModel, replay, tips  # noqa: E402
from tests.conftest import fails_cleanly  # noqa: E402

CONFIG = "configs/reach.yaml"
SMALL = ["trainer.initial_states_per_step=2", "trainer.group_size=4", "trainer.mini_batch_size=4",
         "eval.initial_states=4", "logging.console=false", "logging.tensorboard=false"]  # fmt: skip


def test_the_jacobian_is_the_hand_computed_one():
    """Column i: the fingertip's velocity per unit speed of joint i, (-sum_{l>=i} L_l sin theta_l, sum_{l>=i} L_l
    cos theta_l)."""
    # arm2 with its elbow at a right angle: theta = (0, pi/2)
    assert np.allclose(jacobian(PLATFORMS["arm2"], np.array([0.0, math.pi / 2])), [[-0.4, -0.4], [0.5, 0.0]])
    # arm3 up, then along x: theta = (pi/2, 0, 0)
    got = jacobian(PLATFORMS["arm3"], np.array([math.pi / 2, -math.pi / 2, 0.0]))
    assert np.allclose(got, [[-0.35, 0.0, 0.0], [0.55, 0.55, 0.25]])


def test_the_defined_mapping_inverts_the_learners_kinematics():
    """arm2 at (0, pi/2), the fingertip to move 1 cm along y: by hand, J dq = (0, 0.01) gives dq = (0.02, -0.02)
    (the shoulder turns, the elbow turns back), so the action is dq / (STEP_SECONDS x MAX_SPEED) = (2/15, -2/15).
    With the damping: J J^T + 0.01^2 I = [[0.3201, -0.2], [-0.2, 0.2501]], determinant 0.04005701, its inverse
    times (0, 0.01) is (0.002, 0.003201) / 0.04005701 =: (x, y), and J^T (x, y) = (-0.4 x + 0.5 y, -0.4 x): within
    1.5e-3 of the undamped answer (damping^2 over J's smaller squared singular value, 0.082 m^2). A longer move (4 cm,
    still under the speed limit) needs the iterations: the first-order answer misses by a millimetre, three land
    within 1e-7 m. arm3 (three
    joints for two task coordinates) takes the smallest joint motion that does it: none along J's null space."""
    q = np.array([0.0, math.pi / 2])
    action = task_action(PLATFORMS["arm2"], q, np.array([0.0, 0.01]), iterations=1)
    x, y = 0.002 / 0.04005701, 0.003201 / 0.04005701
    assert np.allclose(action, np.array([-0.4 * x + 0.5 * y, -0.4 * x]) / 0.15, rtol=1e-12)
    assert np.allclose(action, [2 / 15, -2 / 15], rtol=1.5e-3)
    move = np.array([-0.024, 0.032])
    for iterations, miss in ((1, 1e-3), (3, 1e-7)):
        dq = task_action(PLATFORMS["arm2"], q, move, iterations) * STEP_SECONDS * arms.MAX_SPEED
        reached = np.linalg.norm(fingertip(PLATFORMS["arm2"], q + dq) - (fingertip(PLATFORMS["arm2"], q) + move))
        assert (reached > miss) if iterations == 1 else (reached < miss)
    q3 = np.array([0.3, 0.8, -0.5])
    dq = task_action(PLATFORMS["arm3"], q3, np.array([0.01, 0.0]), iterations=1)
    _, _, vt = np.linalg.svd(jacobian(PLATFORMS["arm3"], q3))
    assert abs(float(vt[2] @ dq)) < 1e-12  # no motion along the null space


def _episodes(platform: str, seeds: list[int], steps: int, scale: float, noise: float, seed: int = 0):
    """Episodes of `platform` under a seeded random controller (a constant drift per episode plus noise)."""
    rng = np.random.default_rng(seed)
    env = Reach(platform, steps)
    states, actions = [np.stack(env.reset(seeds))], []
    drift = rng.uniform(-scale, scale, (len(seeds), env.joints))
    for _ in range(steps):
        actions.append(drift + noise * rng.standard_normal((len(seeds), env.joints)))
        states.append(np.stack(env.step(actions[-1])))
    trajectories, acts = np.stack(states, axis=1), np.stack(actions, axis=1).astype(np.float32)
    out = []
    for i in range(len(seeds)):
        reward, success = env.reward(trajectories[i])
        out.append(Episode(i, trajectories[i], acts[i], reward, 0, source_logp_sum=-1.0, success=success))
    return out


@pytest.mark.parametrize(("source", "learner"), [("arm2", "arm3"), ("arm3", "arm2")])
def test_a_replay_is_an_episode_of_the_learners_arm_along_the_sources_path(source, learner):
    """The learner's arm starts where the source's fingertip did (the same start point, each arm's own posture),
    follows its path within the bound, and the replay is an episode of the learner's own: its logged actions
    replayed in a fresh pool give its logged states bit for bit; its reward is its own, close to the source's; an
    episode whose path the learner's arm cannot follow (too fast for its speed limit) is filtered, counted."""
    seeds = list(range(16))
    episodes = _episodes(source, seeds, 30, scale=0.3, noise=0.05)
    env = Reach(learner, 30)
    out = replay(env, Defined(env), episodes, seeds, bound=0.05)
    assert len(out.episodes) + out.filtered == 16 and len(out.episodes) >= 12
    kept = [i for i in range(16) if out.errors[i] <= 0.05]
    assert np.median(out.errors) < 0.01
    fresh = Reach(learner, 30)
    first = np.stack(fresh.reset([seeds[episodes[i].group] for i in kept]))
    mapped = out.episodes
    assert np.array_equal(first, np.stack([e.states[0] for e in mapped]))
    assert np.allclose(tips(first), tips(np.stack([episodes[i].states[0] for i in kept])), atol=1e-12)
    for t in range(30):
        after = np.stack(fresh.step(np.stack([e.actions[t] for e in mapped])))
        assert np.array_equal(after, np.stack([e.states[t + 1] for e in mapped]))
    for e, i in zip(mapped, kept, strict=True):
        assert e.actions.shape == (30, env.joints) and e.source_num_tokens == episodes[i].actions.size
        assert e.reward == env.reward(e.states)[0] and abs(e.reward - episodes[i].reward) < 0.1
        assert np.sqrt(((tips(e.states) - tips(episodes[i].states)) ** 2).sum(-1)).mean() <= 0.05
    fast = _episodes(source, seeds, 30, scale=1.0, noise=0.8, seed=1)
    assert replay(Reach(learner, 30), Defined(env), fast, seeds, bound=0.05).filtered > 0


def test_a_replay_whose_physics_goes_unstable_is_filtered_and_counted(unstable_physics):
    """A non-finite state in one replay: that replay is left out (error inf, counted in `filtered`), the others are
    kept; nothing raises."""
    seeds = list(range(4))
    unstable_physics["left"] = 0
    episodes = _episodes("arm2", seeds, 10, scale=0.3, noise=0.05)
    unstable_physics["left"] = 1
    env = Reach("arm3", 10)
    out = replay(env, Defined(env), episodes, seeds, bound=0.1)
    assert out.filtered == 1 and len(out.episodes) == 3 and np.isinf(out.errors).sum() == 1
    assert out.metrics("arm2")["mapped/arm2/filtered"] == 1 and np.isfinite(
        out.metrics("arm2")["mapped/arm2/error_max"]
    )


def test_a_replay_with_the_learners_noise_carries_its_behaviours_exact_log_density():
    """With the learner's exploration (`Behaviour`): each action is the mapping's at that state plus noise of the
    learner's std, and the replay's "source" log-prob is the behaviour's log-density of its logged actions, over the
    learner's T x A coordinates (its `source_num_tokens`); the noise comes from the given stream (a second replay
    from the same stream state repeats it bit for bit) and the replay still follows the path within centimetres."""
    seeds = list(range(8))
    episodes = _episodes("arm2", seeds, 20, scale=0.3, noise=0.05)
    std = np.array([0.3, 0.2, 0.25])
    env = Reach("arm3", 20)
    out = replay(env, Defined(env), episodes, seeds, 0.1, Behaviour(std, torch.Generator().manual_seed(4)))
    again = replay(Reach("arm3", 20), Defined(env), episodes, seeds, 0.1,
                   Behaviour(std, torch.Generator().manual_seed(4)))  # fmt: skip
    assert len(out.episodes) == 8 and np.array_equal(out.errors, again.errors)
    assert np.median(out.errors) < 0.05
    for e, twin, source in zip(out.episodes, again.episodes, episodes, strict=True):
        assert np.array_equal(e.actions, twin.actions) and e.source_num_tokens == 20 * 3
        moves = tips(source.states[1:]) - tips(e.states[:-1])  # to the source's next point, from where it is
        means = np.stack([task_action(PLATFORMS["arm3"], e.states[t, :3], moves[t]) for t in range(20)])
        z = (e.actions.astype(np.float64) - means) / std
        want = (-0.5 * z * z - np.log(std) - 0.5 * math.log(2 * math.pi)).sum()
        assert abs(e.source_logp_sum - want) < 1e-9 and 0.5 < np.abs(z).std() < 1.5


def test_the_learned_mapping_is_measured_on_transitions_it_has_not_seen():
    """Fitted on arm2's own transitions step after step, the inverse model's error on a new step's transitions
    (reported before it fits on them) falls far below the unfitted model's; replays through it then follow a path
    within centimetres; its state (weights, optimizer, window, random stream) round-trips exactly."""
    env = Reach("arm2", 20)
    model = InverseModel(env, hidden=64, lr=3e-3, fit_steps=200, batch=256, window=4, seed=0)
    errors = [model.observe_own(_episodes("arm2", list(range(32)), 20, 0.5, 0.3, seed=s))["mapping/inverse_error"]
              for s in range(6)]  # fmt: skip
    assert errors[-1] < errors[0] / 10 and errors[-1] < 0.03
    assert len(model.inputs) == 4  # the window: the last 4 steps
    held_out = _episodes("arm2", list(range(100, 116)), 20, 0.3, 0.05, seed=9)
    source = _episodes("arm3", list(range(100, 116)), 20, 0.3, 0.05, seed=9)
    out = replay(Reach("arm2", 20), model, source, list(range(100, 116)), bound=1.0)
    assert np.median(out.errors) < 0.05
    x, y = InverseModel.transitions(held_out, 2)
    twin = InverseModel(env, hidden=64, lr=3e-3, fit_steps=200, batch=256, window=4, seed=5)
    state = model.state_dict()
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    twin.load_state_dict(torch.load(buffer, weights_only=True))
    assert twin.error(x, y) == model.error(x, y)
    step = _episodes("arm2", list(range(32)), 20, 0.5, 0.3, seed=7)
    assert twin.observe_own(step) == model.observe_own(step)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.name=hacpo"], "set mapping.default (defined"),
        (
            ["algorithm.name=hacpo", "mapping.default=defined", "mapping.pairs.arm2->arm3=learn"],
            "mapping.pairs.arm2->arm3='learn': one of none, defined, learned",
        ),
        (
            ["algorithm.name=hacpo", "mapping.default=defined", "mapping.pairs.arm2->arm9=learned"],
            "mapping.pairs: 'arm2->arm9' is not",
        ),
        (
            ["algorithm.name=hacpo", "mapping.default=defined", "mapping.pairs.arm3->arm2=none"],
            "policies.1 (arm3, arm3) and policies.0 (arm2, arm2) act in different action spaces",
        ),
        (
            [
                "algorithm.name=hacpo",
                "mapping.default=defined",
                "policies.1.platform=arm2",
                "mapping.pairs.arm2->arm3=learned",
            ],
            "both arm2: one action space",
        ),
        (["algorithm.name=hacpo", "mapping.default=defined", "mapping.error_bound=0"], "mapping.error_bound must be"),
        (["mapping.default=sideways"], "mapping.default: Invalid value 'sideways'"),
    ],  # fmt: skip
)
def test_bad_mappings_are_refused_naming_the_key(overrides, message, tmp_path, capsys):
    run = tmp_path / "run"
    fails_cleanly(capsys, ["control", CONFIG, *SMALL, f"trainer.output_dir={run}", *overrides], message)
    assert not run.exists()


def test_a_mapping_on_the_particle_environment_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    fails_cleanly(capsys, ["control", "configs/control.yaml", "mapping.default=defined", f"trainer.output_dir={run}"],
                  "mapping.* maps between robot platforms")  # fmt: skip


def test_a_pair_no_mapping_can_carry_is_refused(monkeypatch, tmp_path, capsys):
    """A learner whose arm cannot reach the tasks' start and goal points cannot replay anyone's episodes."""
    monkeypatch.setitem(PLATFORMS, "arm2", (0.2, 0.15))
    run = tmp_path / "run"
    argv = ["control", CONFIG, *SMALL, f"trainer.output_dir={run}", "algorithm.name=hacpo", "mapping.default=learned"]
    fails_cleanly(capsys, argv, "mapping of arm3->arm2 (learned)", "cannot be replayed on it")
    assert not run.exists()
