"""Capability tracking and ratios (spec 3.1, 3.3; paper Eqs. 6, 9, 10)."""

import json

import pytest
import torch

from hacrl.core import CapabilityTracker, baseline_weights, loss_coefficients, step_mean_rewards


def test_before_any_step_every_capability_is_one():
    tracker = CapabilityTracker(num_agents=3)
    assert tracker.capabilities().tolist() == [1.0, 1.0, 1.0]
    assert tracker.baseline_weights(0).tolist() == [1.0, 1.0, 1.0]


def test_window_includes_current_step_and_drops_old_ones():
    tracker = CapabilityTracker(num_agents=2, window=3)
    for step in ([0.0, 1.0], [0.25, 0.5], [0.5, 0.5], [1.0, 0.0]):
        tracker.update(step)
    # last 3 steps, the one just recorded included: (0.25 + 0.5 + 1.0) / 3 and (0.5 + 0.5 + 0.0) / 3
    torch.testing.assert_close(tracker.capabilities(), torch.tensor([1.75 / 3, 1.0 / 3], dtype=torch.float64))
    assert tracker.num_steps == 4
    assert tracker.history.shape == (4, 2)


def test_capability_is_floored_so_ratios_stay_finite():
    tracker = CapabilityTracker(num_agents=2, window=2)
    tracker.update([0.0, 0.5])
    assert tracker.capabilities().tolist() == [1e-8, 0.5]
    # the hopeless agent 0 learning from agent 1: weight clamps at 0.1, coefficient at 10
    assert tracker.baseline_weights(0).tolist() == [1.0, 0.1]
    assert tracker.loss_coefficients(0).tolist() == [1.0, 10.0]


def test_warmup_keeps_ratios_at_one():
    tracker = CapabilityTracker(num_agents=2, window=5, warmup_steps=2)
    tracker.update([0.8, 0.2])
    tracker.update([0.8, 0.2])
    assert tracker.loss_coefficients(1).tolist() == [1.0, 1.0]  # seen 2 <= warm-up 2
    tracker.update([0.8, 0.2])
    torch.testing.assert_close(tracker.loss_coefficients(1), torch.tensor([4.0, 1.0], dtype=torch.float64))


def test_the_two_directions_of_the_ratio():
    caps = torch.tensor([0.6, 0.3], dtype=torch.float64)  # agent 0 is twice as capable
    # baseline weight is learner / source: the strong learner weighs the weak source's rewards up ...
    assert baseline_weights(caps, learner=0).tolist() == [1.0, 2.0]
    assert baseline_weights(caps, learner=1).tolist() == [0.5, 1.0]
    # ... the loss coefficient is source / learner: the strong source speaks louder to the weak learner
    assert loss_coefficients(caps, learner=0).tolist() == [1.0, 0.5]
    assert loss_coefficients(caps, learner=1).tolist() == [2.0, 1.0]


@pytest.mark.parametrize(
    ("caps", "weights", "coefficients"),
    [
        ([1.0, 0.05, 20.0], [1.0, 10.0, 0.1], [1.0, 0.1, 10.0]),  # both clamps bind
        ([1.0, 0.1, 10.0], [1.0, 10.0, 0.1], [1.0, 0.1, 10.0]),  # exactly at the clamps
        ([0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]),  # equal capabilities: exactly 1
    ],
)
def test_ratio_clamps_at_0_1_and_10(caps, weights, coefficients):
    caps = torch.tensor(caps, dtype=torch.float64)
    torch.testing.assert_close(baseline_weights(caps, 0), torch.tensor(weights, dtype=torch.float64))
    torch.testing.assert_close(loss_coefficients(caps, 0), torch.tensor(coefficients, dtype=torch.float64))


def test_step_mean_rewards_is_the_mean_over_each_agents_own_responses():
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.0])
    source = torch.tensor([0, 0, 0, 1, 1, 2])
    assert step_mean_rewards(rewards, source, num_agents=3).tolist() == [0.5, 1.0, 0.0]


def test_step_mean_rewards_requires_every_agent():
    with pytest.raises(ValueError, match=r"no response from agent\(s\) \[1\]"):
        step_mean_rewards(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), num_agents=2)


def test_state_dict_round_trips_exactly_through_json():
    tracker = CapabilityTracker(num_agents=3, window=4, warmup_steps=1)
    g = torch.Generator().manual_seed(0)
    for _ in range(7):
        tracker.update(torch.rand(3, generator=g, dtype=torch.float64))
    state = json.loads(json.dumps(tracker.state_dict()))
    restored = CapabilityTracker(num_agents=3, window=4, warmup_steps=1)
    restored.load_state_dict(state)
    assert torch.equal(restored.capabilities(), tracker.capabilities())
    assert torch.equal(restored.history, tracker.history)
    tracker.update([0.1, 0.2, 0.3])
    restored.update([0.1, 0.2, 0.3])
    assert torch.equal(restored.capabilities(), tracker.capabilities())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_agents": 3, "window": 5}, "num_agents=2 but this tracker has num_agents=3"),
        ({"num_agents": 2, "window": 4}, "window=5 but this tracker has window=4"),
        ({"num_agents": 2, "window": 5, "warmup_steps": 1}, "warmup_steps=0 but this tracker has warmup_steps=1"),
    ],
)
def test_load_state_dict_refuses_a_mismatched_state(kwargs, message):
    saved = CapabilityTracker(num_agents=2, window=5)
    saved.update([0.5, 0.5])
    with pytest.raises(ValueError, match=message):
        CapabilityTracker(**kwargs).load_state_dict(saved.state_dict())


def test_bad_updates_and_settings_are_rejected():
    tracker = CapabilityTracker(num_agents=2)
    with pytest.raises(ValueError, match="mean_rewards has 3 entries but the batch has 2"):
        tracker.update([0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="mean_rewards contains 1 non-finite"):
        tracker.update([0.1, float("nan")])
    with pytest.raises(ValueError, match="window must be a positive int"):
        CapabilityTracker(num_agents=2, window=0)
    with pytest.raises(ValueError, match="learner=2 is not a valid agent id"):
        tracker.loss_coefficients(2)
