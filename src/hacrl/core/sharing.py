"""Which of the other agents' rows enter a learner's loss: sharing policies (hacrl extension; docs/design.md, "Which
rollouts a learner receives").

HACPO trains every learner on every scored response of every agent and lets its corrections weight them (spec 2,
step 5). A sharing policy chooses instead, per learner and per step, which foreign rows the learner trains on. The
order in the trainer, and why:
1. The advantages are computed over every scored response of the prompt, own and foreign, exactly as without a
   policy: rewards cost nothing once scored, and the whole group gives the better baseline (spec 3.2).
2. The policy keeps a subset of the foreign rows; the learner's own rows are always kept.
3. The kept rows are trained in pool order with the same mini-batch size, so keeping fewer rows means fewer
   optimizer steps (the step index m of spec 3.5 counts those taken).
A policy reads only what the spec lets cross between agents (rewards, sources, groups) and, for `top_k`, the
learner's own view of a row (its relevance, computed by the learner); never another agent's parameters or logits.

Policies (`POLICIES`):
    all            every foreign row (the paper; the default)
    correct        foreign rows whose reward reaches `min_reward` (success-gated transfer)
    learner_fails  every foreign row of a prompt where the learner's own mean reward is below `fail_below`
    top_k          per prompt, the `k` foreign rows of highest `relevance` (ties: pool order)
    adaptive       per prompt and source, the source's rows when its mean reward on the prompt exceeds the
                   learner's own mean there by more than `margin` (sharing follows the gap, prompt by prompt)
A prompt on which the learner has no own row (it never happens in the trainer) counts as failed by it (its own
mean is taken as -inf).

After the policy, an optional budget (`sharing.budget_per_prompt`, `within_budget`) keeps per prompt at most that
many of the kept foreign rows, those of largest |rho A|: a learner's update is bounded by its own rows plus the
budget whatever the number of agents and their rollout budgets. With groups (`sharing.groups`, `cross_group`) the
budget bounds only the rows from outside the learner's group (none cross without a budget); inside its group a
learner takes what the policy keeps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

from hacrl.core._checks import check_1d, check_finite, check_ids, check_index, check_integer

SETTINGS = {
    "all": (),
    "correct": ("min_reward",),
    "learner_fails": ("fail_below",),
    "top_k": ("k",),
    "adaptive": ("margin",),
}
"""Every policy, with the `sharing.*` settings it reads (the others are neither checked nor compared on resume)."""
POLICIES = tuple(SETTINGS)
"""The policies' names: the one registry (`sharing.policy` is checked against it)."""

Entry = TypeVar("Entry")


def in_pool_order(entries: Iterable[Entry]) -> list[Entry]:
    """`entries` (anything with a `source`: answers, episodes) in pool order: sources in config order, within a
    source in the order they were sampled."""
    return sorted(entries, key=lambda e: e.source)


def foreign_of(pool: Iterable[Entry], learner: int, *, shared: bool = True) -> list[Entry]:
    """The other agents' entries learner `learner` trains on (spec 2, step 5a): when the algorithm shares, every
    other agent's, in pool order; none otherwise. A learner's pool is its own entries, then these: mini-batches
    are taken in that order, so the own rows get the first optimizer steps and m counts the same for every
    learner. The one rule for the LLM trainer (its driver and its Ray actors) and the control trainer.

    >>> from types import SimpleNamespace as E
    >>> pool = [E(source=s, i=i) for i, s in enumerate((2, 0, 1, 0, 2))]
    >>> [(e.source, e.i) for e in foreign_of(pool, 1)]
    [(0, 1), (0, 3), (2, 0), (2, 4)]
    >>> foreign_of(pool, 2, shared=False)
    []
    """
    return in_pool_order(e for e in pool if e.source != learner) if shared else []


def foreign_per_prompt(group_sizes: Sequence[int], learner: int, *, budget: int | None,
                       group_of: Sequence[int] | None = None) -> int:  # fmt: skip
    """The most foreign answers per prompt learner `learner`'s update takes when agent j offers `group_sizes[j]`
    answers per prompt: every other agent's, at most `budget` (`sharing.budget_per_prompt`); with groups
    (`group_of[j]`: agent j's group, `sharing.groups`) every answer of its own group's, and at most `budget` (none
    without one) from outside it. Exact under `sharing.policy: all`, an upper bound under the others; the one rule
    for `hacrl plan`, `hacrl plan --measure` and `--devices` (the run applies it row by row: `within_budget`).

    >>> foreign_per_prompt([4, 2, 8], 0, budget=None)
    10
    >>> foreign_per_prompt([4, 2, 8], 0, budget=3)
    3
    >>> foreign_per_prompt([4, 2, 8], 0, budget=3, group_of=[0, 0, 1])  # agent 1's 2, and 3 of agent 2's 8
    5
    >>> foreign_per_prompt([4, 2, 8], 2, budget=None, group_of=[0, 0, 1])  # alone in its group, no budget
    0
    """
    same = [
        g for j, g in enumerate(group_sizes) if j != learner and (group_of is None or group_of[j] == group_of[learner])
    ]
    other = [g for j, g in enumerate(group_sizes) if group_of is not None and group_of[j] != group_of[learner]]
    inside, across = sum(same), sum(other)
    if group_of is not None:
        across = min(across, budget or 0)
    elif budget is not None:
        inside = min(inside, budget)
    return inside + across


def select_foreign(
    rewards: Tensor,
    group_ids: Tensor,
    source: Tensor,
    *,
    learner: int,
    policy: str,
    num_agents: int,
    min_reward: float = 1.0,
    fail_below: float = 0.5,
    k: int = 4,
    margin: float = 0.0,
    relevance: Tensor | None = None,
) -> Tensor:
    """Which rows of learner `learner`'s pool enter its loss under `policy`: a (N,) bool mask, True on every own row.

    rewards:   (N,) the pool's rewards (own and foreign)
    group_ids: (N,) the prompt of each row
    source:    (N,) long: the agent that generated each row
    relevance: (N,) float, `top_k` only: a row's relevance to the learner (read on foreign rows; higher is kept)

    >>> r = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    >>> g = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])
    >>> s = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    >>> def keep(policy, **kw):
    ...     return select_foreign(r, g, s, learner=0, policy=policy, num_agents=2, **kw).int().tolist()
    >>> keep("all"), keep("correct")
    ([1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 1, 1, 1])
    >>> keep("learner_fails", fail_below=0.6), keep("adaptive")
    ([1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 1, 1])
    >>> keep("top_k", k=1, relevance=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.3, 0.3, 0.1, 0.2]))
    [1, 1, 1, 1, 1, 0, 0, 1]
    """
    check_1d("rewards", rewards)
    n = rewards.shape[0]
    check_1d("group_ids", group_ids, n)
    check_1d("source", source, n)
    check_integer("group_ids", group_ids)
    check_integer("source", source)
    check_index("learner", learner, num_agents, "agent")
    check_ids("source", source, num_agents, "agent")
    check_finite("rewards", rewards)
    if policy not in POLICIES:
        raise ValueError(f"sharing policy must be one of {POLICIES}, got {policy!r}")
    own = source == learner
    if policy == "all" or n == 0:
        return torch.ones(n, dtype=torch.bool)
    if policy == "correct":
        return own | (rewards >= min_reward)
    if policy == "top_k":
        if relevance is None:
            raise ValueError("the top_k policy needs `relevance`, one value per row")
        check_1d("relevance", relevance, n)
        check_finite("relevance", relevance, ~own)
    keep = own.clone()
    rewards = rewards.to(torch.float64)
    for g in torch.unique(group_ids).tolist():
        keep |= _kept_in_group(group_ids == g, rewards, source, own, policy, fail_below, k, margin, relevance)
    return keep


def _kept_in_group(in_group: Tensor, rewards: Tensor, source: Tensor, own: Tensor, policy: str, fail_below: float,
                   k: int, margin: float, relevance: Tensor | None) -> Tensor:  # fmt: skip
    """The foreign rows of one prompt's group that `policy` keeps (`select_foreign`, the per-group policies)."""
    mine = rewards[in_group & own]
    own_mean = float(mine.mean()) if mine.numel() else float("-inf")
    foreign = in_group & ~own
    if policy == "learner_fails":
        return foreign if own_mean < fail_below else torch.zeros_like(foreign)
    if policy == "adaptive":
        keep = torch.zeros_like(foreign)
        for j in torch.unique(source[foreign]).tolist():
            rows = foreign & (source == j)
            if float(rewards[rows].mean()) > own_mean + margin:
                keep |= rows
        return keep
    index = foreign.nonzero().flatten()  # top_k
    order = sorted(range(index.numel()), key=lambda i: (-float(relevance[index[i]]), i))
    keep = torch.zeros_like(foreign)
    keep[index[order[:k]]] = True
    return keep


def within_budget(keep: Tensor, weight: Tensor, group_ids: Tensor, source: Tensor, *, learner: int,
                  per_prompt: int, budgeted: Tensor | None = None) -> Tensor:  # fmt: skip
    """The sharing budget (`sharing.budget_per_prompt`, applied after the policy): of the foreign rows `keep` holds,
    per prompt the `per_prompt` of largest `weight` (ties: pool order); own rows always stay. The trainer's weight
    is |rho_j A_i|: in the learner's loss a foreign row's term is s_hat sg(s_hat)^alpha rho A with s_hat clipped
    into [lo_m, 1], so |rho A| bounds the row's pull up to a factor in [lo_m^(1+alpha), 1], and a row with A = 0
    (a uniform group) pulls nothing. It needs no forward pass (top_k's exact relevance does) and no random draw
    (so a resume repeats it). The learner's update is then at most its own rows + `per_prompt` per prompt, whatever
    the number of agents or their budgets. `budgeted` (bool, per row): only these foreign rows count against the
    budget, the others kept stay (hierarchical sharing: the rows from outside the learner's group; None: every
    foreign row).

    >>> keep = torch.tensor([True, True, True, True, True, False, True])
    >>> weight = torch.tensor([0.0, 0.0, 0.5, 0.9, 0.5, 2.0, 0.1])
    >>> groups, source = torch.tensor([0, 1, 0, 0, 0, 0, 1]), torch.tensor([0, 0, 1, 1, 2, 2, 1])
    >>> within_budget(keep, weight, groups, source, learner=0, per_prompt=2).int().tolist()
    [1, 1, 1, 1, 0, 0, 1]
    """
    n = keep.shape[0]
    for name, t in (("weight", weight), ("group_ids", group_ids), ("source", source)):
        check_1d(name, t, n)
    if per_prompt < 0:
        raise ValueError(f"per_prompt must be >= 0, got {per_prompt}")
    own = source == learner
    out = keep.clone()
    foreign = keep & ~own
    if budgeted is not None:
        check_1d("budgeted", budgeted, n)
        foreign = foreign & budgeted.bool()
    for g in torch.unique(group_ids[foreign]).tolist():
        index = (foreign & (group_ids == g)).nonzero().flatten().tolist()
        order = sorted(range(len(index)), key=lambda i: (-float(weight[index[i]]), i))
        for i in order[per_prompt:]:
            out[index[i]] = False
    return out


def cross_group(source: Tensor, learner: int, group_of: list[int]) -> Tensor:
    """Hierarchical sharing (`sharing.groups`): which rows come from an agent outside the learner's group.
    `group_of[j]`: agent j's group.

    >>> cross_group(torch.tensor([0, 1, 2, 3, 1]), 0, [0, 0, 1, 1]).tolist()
    [False, False, True, True, False]
    """
    check_integer("source", source)
    check_index("learner", learner, len(group_of), "agent")
    groups = torch.tensor(group_of)
    return groups[source] != group_of[learner]


def kept_rows(
    rewards: Tensor,
    group_ids: Tensor,
    source: Tensor,
    adv: Tensor,
    *,
    learner: int,
    num_agents: int,
    sharing,
    r_max: float,
    rho: Tensor | None = None,
    relevance: Tensor | None = None,
    group_of: list[int] | None = None,
) -> Tensor:
    """The one keep rule of every trainer (`hacrl train`'s learners and `hacrl control`'s policies alike): which
    rows of learner `learner`'s pool enter its loss, a (N,) bool mask. The sharing policy first (`select_foreign`,
    `sharing.policy`, `min_reward_or(r_max)`, `fail_below`, `k`, `margin`: a `SharingConfig`), then the budget
    (`within_budget`, `sharing.budget_per_prompt`) by |rho_j A_i|, with `rho` each source's coefficient in this
    learner's loss (`Algorithm.loss_rho`: HACPO's under `capability_coef`; None: every source 1, as in a loss that
    has no rho, so `naive` keeps the rows of largest |A|); with groups (`group_of[j]`: agent j's group) the budget
    bounds only the rows from outside the learner's group, and none of those cross without one.

    >>> class Sharing:
    ...     policy, fail_below, k, margin, budget_per_prompt = "all", 0.5, 4, 0.0, 1
    ...     def min_reward_or(self, r_max): return r_max
    >>> r, g, s = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 0]), torch.tensor([0, 0, 1, 2])
    >>> adv = torch.tensor([0.5, -0.5, 0.2, 0.4])
    >>> kept_rows(r, g, s, adv, learner=0, num_agents=3, sharing=Sharing(), r_max=1.0).tolist()
    [True, True, False, True]
    >>> kept_rows(r, g, s, adv, learner=0, num_agents=3, sharing=Sharing(), r_max=1.0,
    ...           rho=torch.tensor([1.0, 4.0, 1.0])).tolist()  # |rho A|: 0.8 against 0.4
    [True, True, True, False]
    """
    if sharing.policy == "all":
        keep = torch.ones(source.shape[0], dtype=torch.bool)
    else:
        keep = select_foreign(rewards, group_ids, source, learner=learner, policy=sharing.policy,
                              num_agents=num_agents, min_reward=sharing.min_reward_or(r_max),
                              fail_below=sharing.fail_below, k=sharing.k, margin=sharing.margin,
                              relevance=relevance)  # fmt: skip
    cross = cross_group(source, learner, group_of) if group_of else None
    if sharing.budget_per_prompt is None and cross is None:
        return keep
    coefficient = torch.ones(num_agents, dtype=torch.float64) if rho is None else rho.to(torch.float64)
    weight = coefficient[source] * adv.to(torch.float64).abs()
    return within_budget(keep, weight, group_ids, source, learner=learner, per_prompt=sharing.budget_per_prompt or 0,
                         budgeted=cross)  # fmt: skip
