"""Advantages: GRPO/GSPO group normalisation, naive pooling, HACPO capability-aware baseline (spec 3.2)."""

import math

import pytest
import torch

from hacrl.core import group_advantages, hacpo_advantages, naive_advantages
from tests.core.reference import group_advantages_ref, hacpo_advantages_ref

F64 = torch.float64


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def ids(values):
    return torch.tensor(values, dtype=torch.long)


def test_group_advantages_hand_computed():
    # group 0: [1, 0, 0, 0], mean 0.25, unbiased std 0.5; group 1: [1, 0], mean 0.5, std sqrt(0.5)
    adv = group_advantages(t([1, 0, 0, 0, 1, 0]), ids([0, 0, 0, 0, 1, 1]), eps=0.0)
    s = math.sqrt(0.5)
    torch.testing.assert_close(adv, t([1.5, -0.5, -0.5, -0.5, 0.5 / s, -0.5 / s]))


def test_group_advantages_adds_eps_to_the_std():
    adv = group_advantages(t([1, 0]), ids([0, 0]), eps=1e-6)
    s = math.sqrt(0.5)
    torch.testing.assert_close(adv, t([0.5 / (s + 1e-6), -0.5 / (s + 1e-6)]))


def test_hacpo_advantages_hand_computed_for_both_learners():
    # one prompt, G = 4 per agent; P_hat = (0.6, 0.3)
    rewards = t([1, 0, 1, 0, 1, 1, 0, 0])
    group = ids([0] * 8)
    source = ids([0, 0, 0, 0, 1, 1, 1, 1])
    caps = t([0.6, 0.3])
    std = math.sqrt(8 * 0.25 / 7)  # raw pooled rewards: four 1s and four 0s, unbiased
    # learner 0: w = (1, 0.6/0.3 = 2): mu = (1 + 1 + 2 * (1 + 1)) / 8 = 0.75
    adv0 = hacpo_advantages(rewards, group, source, learner=0, capabilities=caps, eps=0.0)
    torch.testing.assert_close(adv0, (rewards - 0.75) / std)
    # learner 1: w = (0.3/0.6 = 0.5, 1): mu = (0.5 * 2 + 2) / 8 = 0.375
    adv1 = hacpo_advantages(rewards, group, source, learner=1, capabilities=caps, eps=0.0)
    torch.testing.assert_close(adv1, (rewards - 0.375) / std)


def test_baseline_guard_falls_back_to_the_learners_own_mean():
    # the weak source gets weight 10: mu = (0 + 1 + 10 * 1 + 10 * 1) / 4 = 5.25 > r_max = 1
    rewards = t([0, 1, 1, 1])
    source = ids([0, 0, 1, 1])
    caps = t([0.5, 0.05])
    adv = hacpo_advantages(rewards, ids([0] * 4), source, learner=0, capabilities=caps, eps=0.0)
    std = 0.5  # raw [0, 1, 1, 1]
    torch.testing.assert_close(adv, (rewards - 0.5) / std)  # own mean (0 + 1) / 2


def test_baseline_guard_fires_only_above_r_max():
    source = ids([0, 0, 1, 1])
    caps = t([0.5, 0.25])  # the source's weight is 2
    rewards = t([0, 1, 1, 1])  # mu = (0 + 1 + 2 + 2) / 4 = 1.25 > 1: own mean 0.5
    adv = hacpo_advantages(rewards, ids([0] * 4), source, learner=0, capabilities=caps, eps=0.0)
    torch.testing.assert_close(adv, (rewards - 0.5) / 0.5)
    rewards = t([0, 0, 1, 1])  # mu = (0 + 0 + 2 + 2) / 4 = 1.0, not above r_max: kept
    adv = hacpo_advantages(rewards, ids([0] * 4), source, learner=0, capabilities=caps, eps=0.0)
    torch.testing.assert_close(adv, (rewards - 1.0) / math.sqrt(1 / 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("value", [0.0, 0.7, 1.0, 0.1])
def test_uniform_groups_give_exactly_zero(value, dtype):
    # weights 10 and 0.1 would otherwise invent a signal; 0.7 in float32 used to give ~0.1 in the authors' code
    rewards = torch.full((9,), value, dtype=dtype)
    source = ids([0, 0, 0, 1, 1, 1, 2, 2, 2])
    caps = t([1.0, 0.05, 20.0])
    for learner in range(3):
        adv = hacpo_advantages(rewards, ids([5] * 9), source, learner=learner, capabilities=caps)
        assert adv.dtype == dtype
        assert torch.equal(adv, torch.zeros_like(adv))
    assert torch.equal(group_advantages(rewards, ids([0] * 9)), torch.zeros_like(rewards))


def test_singleton_groups_give_zero():
    rewards = t([1, 0.3, 1, 0])
    group = ids([0, 1, 2, 2])  # groups 0 and 1 hold one response each
    adv = hacpo_advantages(rewards, group, ids([0, 1, 0, 1]), learner=0, capabilities=t([0.5, 0.5]), eps=0.0)
    assert adv[:2].tolist() == [0.0, 0.0]
    torch.testing.assert_close(adv[2:], t([0.5, -0.5]) / math.sqrt(0.5))


def test_group_ids_need_not_be_contiguous():
    rewards = t([1, 0, 0, 1, 1, 0.5])
    a = group_advantages(rewards, ids([7, 7, 42, 42, 3, 3]))
    b = group_advantages(rewards, ids([0, 0, 1, 1, 2, 2]))
    assert torch.equal(a, b)


def test_empty_pool_gives_empty_advantages():
    out = group_advantages(t([]), ids([]))
    assert out.shape == (0,)


def test_naive_equals_hacpo_with_equal_capabilities_and_with_the_baseline_off():
    g = torch.Generator().manual_seed(3)
    rewards = torch.randint(0, 2, (24,), generator=g).double()
    group = torch.arange(24) // 6
    source = torch.arange(24) % 3
    naive = naive_advantages(rewards, group, source, num_agents=3)
    equal = hacpo_advantages(rewards, group, source, learner=1, capabilities=t([0.4, 0.4, 0.4]))
    off = hacpo_advantages(
        rewards, group, source, learner=1, capabilities=t([0.9, 0.1, 0.4]), capability_baseline=False
    )
    assert torch.equal(naive, equal)
    assert torch.equal(naive, off)


def _random_pool(seed: int):
    """2-4 agents, 3-6 prompts, unequal group sizes per (prompt, agent), fractional or binary rewards."""
    g = torch.Generator().manual_seed(seed)
    num_agents = int(torch.randint(2, 5, (1,), generator=g))
    rewards, group, source = [], [], []
    for prompt in range(int(torch.randint(3, 7, (1,), generator=g))):
        for agent in range(num_agents):
            for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
                if seed % 2:
                    rewards.append(float(torch.randint(0, 2, (1,), generator=g)))
                else:
                    rewards.append(round(float(torch.rand(1, generator=g)), 2))
                group.append(prompt * 11 + 3)  # not contiguous
                source.append(agent)
    caps = torch.rand(num_agents, generator=g, dtype=F64) ** 3 + 1e-3  # spread: ratios hit both clamps
    return t(rewards), ids(group), ids(source), caps


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("baseline", [True, False])
def test_vectorised_hacpo_advantages_match_the_reference_loop(seed, baseline):
    rewards, group, source, caps = _random_pool(seed)
    for learner in range(caps.shape[0]):
        fast = hacpo_advantages(
            rewards, group, source, learner=learner, capabilities=caps, capability_baseline=baseline
        )
        slow = hacpo_advantages_ref(
            rewards.tolist(), group.tolist(), source.tolist(), learner, caps.tolist(), baseline=baseline
        )
        torch.testing.assert_close(fast, t(slow), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_vectorised_group_advantages_match_the_reference_loop(seed):
    rewards, group, _, _ = _random_pool(seed)
    torch.testing.assert_close(
        group_advantages(rewards, group), t(group_advantages_ref(rewards.tolist(), group.tolist()))
    )


def test_guard_fires_in_random_pools_too():
    """The reference comparison above only proves something about the guard if some pool triggers it."""
    fired = 0
    for seed in range(8):
        rewards, group, source, caps = _random_pool(seed)
        for learner in range(caps.shape[0]):
            w = (caps[learner] / caps).clamp(0.1, 10)
            w[learner] = 1
            for g in group.unique():
                rows = group == g
                fired += int((w[source[rows]] * rewards[rows]).mean() > 1)
    assert fired > 0


@pytest.mark.parametrize("eps", [1e-6, 1e-4])  # hacrl's default (the spec's) and TRL GRPOTrainer's
def test_the_std_epsilon_is_algorithm_adv_eps_and_is_why_hacrl_and_trl_advantages_differ(eps):
    """A = (r - mean) / (std + adv_eps), std unbiased, as in TRL's GRPOTrainer (`scale_rewards="group"`) except for
    the epsilon: TRL adds 1e-4, the spec (and hacrl's default) 1e-6. With binary rewards and G = 8 the smallest
    non-zero std is sqrt(7/64 * 8/7) = 0.354, so the two differ by at most (1e-4 - 1e-6) / 0.354 = 2.8e-4 relative;
    `algorithm.adv_eps=1e-4` gives TRL's values (docs/benchmarks.md)."""
    from hacrl.core import AlgorithmParams, get_algorithm

    rewards = t([1, 0, 0, 0, 0, 0, 0, 0])
    params = AlgorithmParams(adv_eps=eps)
    adv = get_algorithm("gspo").advantages(rewards, ids([0] * 8), ids([0] * 8), learner=0,
                                           capabilities=t([1.0]), params=params)  # fmt: skip
    std = math.sqrt((0.875**2 + 7 * 0.125**2) / 7)
    assert std == pytest.approx(0.3535534, abs=1e-7)
    torch.testing.assert_close(adv, t([0.875 / (std + eps)] + [-0.125 / (std + eps)] * 7))
    other = 1e-4 if eps == 1e-6 else 1e-6
    gap = abs(float(adv[0]) / (0.875 / (std + other)) - 1)
    assert gap == pytest.approx(abs(other - eps) / (std + eps), rel=1e-6) and gap < 2.81e-4
