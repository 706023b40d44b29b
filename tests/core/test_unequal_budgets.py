"""Unequal rollout budgets (`agents.<i>.group_size`): a prompt's pool holds G_j answers of each source j, and every
quantity of the spec is the same formula over the pooled answers (docs/design.md, "Unequal rollout budgets"):
the baseline divides by the prompt's pooled count, the std is over the pooled raw rewards, P_k is the mean of k's
own answers, the policies compare each source's mean. Hand-computed pools: 3 agents with G = 2, 4, 8; a prompt
where an agent has a single answer; the guard under unequal counts."""

from __future__ import annotations

import math

import pytest
import torch

from hacrl.core import hacpo_advantages, naive_advantages, step_mean_rewards
from hacrl.core.sharing import select_foreign
from tests.core.reference import hacpo_advantages_ref

EPS = 1e-6

# one prompt, agents 0, 1, 2 with G = 2, 4, 8: 6 of 14 answers right
REWARDS = torch.tensor([1.0, 0.0] + [1.0, 1.0, 1.0, 0.0] + [0.0] * 6 + [1.0, 1.0], dtype=torch.float64)
SOURCE = torch.tensor([0] * 2 + [1] * 4 + [2] * 8)
GROUPS = torch.zeros(14, dtype=torch.long)
CAPS = torch.tensor([0.5, 0.75, 0.25], dtype=torch.float64)
STD = math.sqrt(24 / 91)  # unbiased std of 6 ones and 8 zeros: (6 (4/7)^2 + 8 (3/7)^2) / 13 = 24/91


def _expected(mu: float) -> torch.Tensor:
    return (REWARDS - mu) / (STD + EPS)


def test_the_capability_estimate_is_each_agents_own_mean_whatever_its_count():
    torch.testing.assert_close(step_mean_rewards(REWARDS, SOURCE, 3), CAPS, rtol=0, atol=0)


def test_hacpo_divides_the_weighted_sum_by_the_prompts_pooled_count():
    """Learner 0: w = (1, 0.5/0.75, 0.5/0.25) = (1, 2/3, 2); mu = (1 + 2/3 x 3 + 2 x 2) / 14 = 1/2.
    Learner 2: w = (0.25/0.5, 0.25/0.75, 1) = (1/2, 1/3, 1); mu = (1/2 + 1 + 2) / 14 = 1/4."""
    for learner, mu in ((0, 0.5), (2, 0.25)):
        adv = hacpo_advantages(REWARDS, GROUPS, SOURCE, learner=learner, capabilities=CAPS)
        torch.testing.assert_close(adv, _expected(mu), rtol=1e-12, atol=1e-12)
        ref = hacpo_advantages_ref(REWARDS.tolist(), GROUPS.tolist(), SOURCE.tolist(), learner, CAPS.tolist())
        torch.testing.assert_close(adv, torch.tensor(ref, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_naive_sharing_is_the_plain_mean_over_every_pooled_answer():
    adv = naive_advantages(REWARDS, GROUPS, SOURCE, num_agents=3)
    torch.testing.assert_close(adv, _expected(6 / 14), rtol=1e-12, atol=1e-12)


def test_a_prompt_where_the_learner_has_a_single_answer():
    """G = (1, 3): agent 0 answers once (right), agent 1 three times (one right); P = (0.4, 0.8). Learner 0:
    w_01 = 1/2, mu = (1 + 1/2) / 4 = 0.375; learner 1: w_10 = 2, mu = (2 + 1) / 4 = 0.75; std of (1, 0, 0, 1) is
    sqrt(1/3). Learner 0 alone (GSPO) has a group of one: A = 0."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    source, groups = torch.tensor([0, 1, 1, 1]), torch.zeros(4, dtype=torch.long)
    caps = torch.tensor([0.4, 0.8], dtype=torch.float64)
    std = math.sqrt(1 / 3)
    for learner, mu in ((0, 0.375), (1, 0.75)):
        adv = hacpo_advantages(rewards, groups, source, learner=learner, capabilities=caps)
        torch.testing.assert_close(adv, (rewards - mu) / (std + EPS), rtol=1e-12, atol=1e-12)
    own = hacpo_advantages(rewards[:1], groups[:1], source[:1], learner=0, capabilities=caps)
    assert own.tolist() == [0.0]


def test_the_guard_falls_back_to_the_learners_own_mean_under_unequal_counts():
    """Learner 0 (two answers: 0, 1) beside a weak source's single right answer with w = 10: mu = (0 + 1 + 10) / 3
    > r_max, so mu = the learner's own mean 1/2; std of (0, 1, 1) = sqrt(1/3)."""
    rewards = torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64)
    caps = torch.tensor([1.0, 0.1], dtype=torch.float64)
    adv = hacpo_advantages(rewards, torch.zeros(3, dtype=torch.long), torch.tensor([0, 0, 1]), learner=0,
                           capabilities=caps)  # fmt: skip
    torch.testing.assert_close(adv, (rewards - 0.5) / (math.sqrt(1 / 3) + EPS), rtol=1e-12, atol=1e-12)


def test_a_uniform_pool_of_unequal_counts_gives_exactly_zero():
    rewards = torch.full((14,), 0.7, dtype=torch.float64)
    adv = hacpo_advantages(rewards, GROUPS, SOURCE, learner=1, capabilities=CAPS)
    assert adv.tolist() == [0.0] * 14


@pytest.mark.parametrize(
    ("policy", "kept_sources"),
    [("all", {1, 2}), ("correct", {1, 2}), ("learner_fails", {1, 2}), ("adaptive", {1})],
)
def test_the_sharing_policies_compare_each_sources_own_mean(policy, kept_sources):
    """Learner 0's own mean is 1/2 (< fail_below 0.6); agent 1's 3/4 is above it (adaptive keeps it), agent 2's
    1/4 below (adaptive drops it); `correct` keeps the right answers of both."""
    keep = select_foreign(REWARDS, GROUPS, SOURCE, learner=0, policy=policy, num_agents=3, fail_below=0.6)
    assert bool(keep[:2].all())
    foreign = keep[2:] if policy != "correct" else keep[2:][REWARDS[2:] == 1.0]
    assert {int(s) for s, k in zip(SOURCE[2:], keep[2:], strict=True) if k} == kept_sources
    assert bool(foreign.all()) if policy != "adaptive" else bool(keep[2:6].all() and not keep[6:].any())
