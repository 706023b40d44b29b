"""Sharing policies (`hacrl.core.sharing`): on hand-made pools, each policy keeps exactly the rows it should."""

import pytest
import torch

from hacrl.core import select_foreign

# Learner 1 of three agents, two prompts, G = 3. Rows in pool order: the learner's own, then agent 0's, agent 2's.
#                   own (1)            agent 0            agent 2
REWARDS = [1, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 1, 0.5, 0.5, 0]
GROUPS = [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1]
SOURCE = [1] * 6 + [0] * 6 + [2] * 6
# learner's own mean: prompt 0 1/3, prompt 1 0; agent 0: 2/3 and 1; agent 2: 1/3 and 1/3


def keep(policy, **kw):
    return select_foreign(
        torch.tensor(REWARDS, dtype=torch.float64),
        torch.tensor(GROUPS),
        torch.tensor(SOURCE),
        learner=1,
        policy=policy,
        num_agents=3,
        **kw,
    ).tolist()


def rows(*indices):
    """The mask keeping the 6 own rows and `indices` (pool positions)."""
    return [i < 6 or i in indices for i in range(18)]


def test_all_keeps_every_row():
    assert keep("all") == [True] * 18


def test_correct_keeps_the_foreign_rows_at_or_above_the_reward():
    assert keep("correct", min_reward=1.0) == rows(6, 7, 9, 10, 11, 14)
    assert keep("correct", min_reward=0.5) == rows(6, 7, 9, 10, 11, 14, 15, 16)  # partial credit counts at 0.5
    assert keep("correct", min_reward=0.0) == [True] * 18


def test_learner_fails_keeps_every_foreign_row_of_the_prompts_the_learner_fails():
    assert keep("learner_fails", fail_below=0.5) == [True] * 18  # own means 1/3 and 0: both failed
    assert keep("learner_fails", fail_below=0.3) == rows(9, 10, 11, 15, 16, 17)  # only prompt 1 (mean 0 < 0.3)
    assert keep("learner_fails", fail_below=1e-9) == rows(9, 10, 11, 15, 16, 17)
    # prompt 0's own mean is exactly 1/3: "below" is strict
    assert keep("learner_fails", fail_below=1 / 3) == rows(9, 10, 11, 15, 16, 17)


def test_adaptive_keeps_a_source_on_a_prompt_only_where_it_beat_the_learner():
    # prompt 0: agent 0 2/3 > 1/3 kept, agent 2 1/3 = 1/3 not; prompt 1: both above 0
    assert keep("adaptive") == rows(6, 7, 8, 9, 10, 11, 15, 16, 17)
    # margin 0.4: prompt 0 agent 0 (gap 1/3) no longer; prompt 1 agent 0 (gap 1) and agent 2 (gap 1/3)? only agent 0
    assert keep("adaptive", margin=0.4) == rows(9, 10, 11)


def test_top_k_keeps_the_k_most_relevant_foreign_rows_per_prompt_over_all_sources():
    relevance = torch.tensor(
        [9.0] * 6  # own rows' values are never read
        + [0.2, 0.9, 0.0, 0.5, 0.5, 0.1]
        + [0.3, 0.9, 0.4, 0.0, 0.6, 0.5],
        dtype=torch.float64,
    )
    # prompt 0 (rows 6-8, 12-14): 0.9 (7), 0.9 (13), 0.4 (14); ties by pool order: 7 before 13
    # prompt 1 (rows 9-11, 15-17): 0.6 (16), 0.5 (9), 0.5 (10), 0.5 (17)
    assert keep("top_k", k=1, relevance=relevance) == rows(7, 16)
    assert keep("top_k", k=2, relevance=relevance) == rows(7, 13, 16, 9)
    assert keep("top_k", k=3, relevance=relevance) == rows(7, 13, 14, 16, 9, 10)
    assert keep("top_k", k=6, relevance=relevance) == [True] * 18
    assert keep("top_k", k=100, relevance=relevance) == [True] * 18


def test_own_rows_are_always_kept_and_a_learner_alone_keeps_everything():
    alone = select_foreign(
        torch.tensor([0.0, 1.0]), torch.tensor([0, 0]), torch.tensor([0, 0]), learner=0, policy="correct", num_agents=1
    )
    assert alone.tolist() == [True, True]
    empty = select_foreign(
        torch.zeros(0), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
        learner=0, policy="adaptive", num_agents=2,
    )  # fmt: skip
    assert empty.shape == (0,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "some"}, "sharing policy must be one of"),
        ({"policy": "top_k"}, "the top_k policy needs `relevance`"),
        ({"policy": "top_k", "relevance": torch.tensor([float("nan")] * 18)}, "relevance contains 12 non-finite"),
        ({"policy": "top_k", "relevance": torch.zeros(3)}, "relevance has 3 entries"),
        ({"policy": "all", "learner": 3}, "learner=3 is not a valid agent id"),
        ({"policy": "correct", "num_agents": 2}, "source contains unknown agent id 2; valid ids are 0..1"),
    ],
)
def test_bad_inputs_are_named(kwargs, message):
    args = {"learner": 1, "num_agents": 3, **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        select_foreign(torch.tensor(REWARDS), torch.tensor(GROUPS), torch.tensor(SOURCE), **args)


def test_a_non_finite_reward_is_refused():
    bad = torch.tensor([float("nan")] + REWARDS[1:])
    with pytest.raises(ValueError, match="rewards contains 1 non-finite"):
        select_foreign(bad, torch.tensor(GROUPS), torch.tensor(SOURCE), learner=1, policy="correct", num_agents=3)


# -- the sharing budget (`within_budget`, issue 64 / 58) ------------------------------------------------------------


def _budget(per_prompt, weight=None, kept=None):
    from hacrl.core import within_budget

    weight = torch.tensor(weight if weight is not None else [0.0] * 6 + [float(i) for i in range(12)])
    kept = torch.tensor(kept if kept is not None else [True] * 18)
    return within_budget(kept, weight, torch.tensor(GROUPS), torch.tensor(SOURCE), learner=1,
                         per_prompt=per_prompt).tolist()  # fmt: skip


def test_a_budget_keeps_per_prompt_the_foreign_rows_of_largest_weight_over_all_sources():
    """Weights rise with pool position: prompt 0's foreign rows are 6, 7, 8 (agent 0) and 12, 13, 14 (agent 2),
    prompt 1's 9, 10, 11 and 15, 16, 17; a budget of 2 keeps 13, 14 and 16, 17."""
    assert _budget(2) == rows(13, 14, 16, 17)
    assert _budget(0) == rows()  # only the learner's own rows
    assert _budget(6) == rows(*range(6, 18)) == _budget(100)  # a budget above what is offered changes nothing


def test_a_budget_breaks_ties_by_pool_order_and_never_brings_back_a_row_the_policy_dropped():
    flat = [0.0] * 18
    assert _budget(1, weight=flat) == rows(6, 9)  # ties: the first foreign row of each prompt
    kept = rows(7, 12, 14, 15)
    assert _budget(1, kept=kept) == rows(14, 15)
    assert _budget(3, kept=kept) == kept


def test_a_budget_below_zero_is_refused():
    with pytest.raises(ValueError, match="per_prompt must be >= 0"):
        _budget(-1)
