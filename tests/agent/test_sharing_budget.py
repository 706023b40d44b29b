"""The sharing budget inside a learner (`hacrl.agent.sharing.select_rows`): per prompt the foreign rows of largest
|rho A|, rho being each source's coefficient in this learner's HACPO loss (spec 3.3)."""

from __future__ import annotations

import torch

from hacrl.agent.exchange import LearnerRow
from hacrl.agent.sharing import select_rows
from hacrl.config import SharingConfig
from hacrl.core.capability import loss_coefficients


def _row(source: int, reward: float) -> LearnerRow:
    return LearnerRow([1], [2], source, 0, reward, None, False)


def _select(rho):
    rows = [_row(0, 1.0), _row(0, 0.0), _row(1, 1.0), _row(2, 1.0)]
    adv = [0.7, -0.7, 0.4, 1.0]
    capabilities = torch.tensor([0.5, 1.0, 0.25], dtype=torch.float64)
    kept, kept_adv, metrics = select_rows(
        rows, adv, capabilities, learner=0, sharing=SharingConfig(budget_per_prompt=1), r_max=1.0,
        names=["a", "b", "c"], relevance=lambda: None, rho=rho(capabilities),
    )  # fmt: skip
    return [r.source for r in kept], kept_adv, metrics


def test_the_budget_weighs_each_foreign_row_by_its_sources_rho():
    """rho for learner 0 = clamp(P_j / P_0) = (1, 2, 0.5): |rho A| is 0.8 for agent 1's row and 0.5 for agent 2's,
    so a budget of one row keeps agent 1's although its |A| is smaller; without rho (naive, capability_coef off)
    agent 2's."""
    sources, adv, metrics = _select(lambda caps: loss_coefficients(caps, 0))
    assert sources == [0, 0, 1] and adv == [0.7, -0.7, 0.4]
    assert metrics["shared/b/kept"] == 1 and metrics["shared/c/kept"] == 0 and metrics["shared_kept"] == 1
    assert _select(lambda caps: None)[0] == [0, 0, 2]


def _grouped(budget, *, policy="all"):
    """Learner a (0) of four agents grouped [[a, b], [c, d]]; prompt 0: a, b, c, d one row each; prompt 1: b, c,
    d one row each (|A|: c's rows 0.9 and 0.2, d's 0.5 and 0.6)."""
    rows = [_row(0, 1.0), _row(1, 1.0), _row(2, 1.0), _row(3, 0.0), _row(1, 0.0), _row(2, 0.0), _row(3, 1.0)]
    for row, group in zip(rows, [0, 0, 0, 0, 1, 1, 1], strict=True):
        row.group = group
    adv = [0.1, 0.3, 0.9, -0.5, -0.3, -0.2, 0.6]
    sharing = SharingConfig(policy=policy, budget_per_prompt=budget, groups=[["a", "b"], ["c", "d"]], min_reward=1.0)
    kept, _, metrics = select_rows(rows, adv, torch.ones(4, dtype=torch.float64), learner=0, sharing=sharing,
                                   r_max=1.0, names=["a", "b", "c", "d"], relevance=lambda: None)  # fmt: skip
    return [(r.source, r.group) for r in kept], metrics


def test_groups_share_fully_inside_and_across_only_through_the_budget():
    # no budget: nothing crosses; b's rows (its group) all stay, whatever their |A|
    assert _grouped(None)[0] == [(0, 0), (1, 0), (1, 1)]
    # one per prompt across: prompt 0 c (0.9) over d (0.5); prompt 1 d (0.6) over c (0.2); b's rows are not counted
    kept, metrics = _grouped(1)
    assert kept == [(0, 0), (1, 0), (2, 0), (1, 1), (3, 1)]
    assert metrics["shared/b/kept"] == 2 and metrics["shared/c/kept"] == 1 and metrics["shared/d/kept"] == 1
    assert _grouped(5)[0] == [(0, 0), (1, 0), (2, 0), (3, 0), (1, 1), (2, 1), (3, 1)]  # a budget above the offer
    # the policy first, inside the group too: `correct` drops b's wrong row and d's wrong row before the budget
    assert _grouped(1, policy="correct")[0] == [(0, 0), (1, 0), (2, 0), (3, 1)]
