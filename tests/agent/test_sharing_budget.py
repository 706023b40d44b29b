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
