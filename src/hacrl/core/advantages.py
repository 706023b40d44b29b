"""Group-normalised advantages: GRPO/GSPO, naive pooled sharing and HACPO's capability-aware baseline.

All three are one computation over a *pool* of scored responses, grouped by prompt (spec 3.2; paper Eqs. 7-8):

    mu_g  = (1 / |g|) * sum_{i in g} w_{src(i)} * r_i        weighted rewards, divided by the count, not by sum(w)
    A_i   = (r_i - mu_g) / (std_g(r) + eps)                  std: unbiased, of the raw (unweighted) rewards

- GRPO/GSPO: the pool holds only the learner's own responses and every weight is 1 (plain group mean and std).
- naive sharing: the pool holds every agent's responses, every weight is 1.
- HACPO: the pool holds every agent's responses and w_j = clamp(P_hat_k / P_hat_j, 0.1, 10) (`baseline_weights`).

Choices, in order:
1. Guard: if mu_g > r_max (possible when a weak source gets weight > 1), mu_g falls back to the mean of the
   learner's own rewards in g (spec 3.2). A group without own responses, which the trainer never builds, falls
   back to the plain pooled mean.
2. A group whose rewards are all equal, and so a group of one response, gets A = 0 exactly: the weights would
   otherwise invent a signal, and std is undefined for one response.
3. Everything runs in float64, so identical fractional rewards (0.7, 0.7, ...) give exactly 0, not float32 noise.
4. Vectorised with scatter/index_add over prompt groups; group ids may be any integers (they are relabelled).
"""

from __future__ import annotations

import torch
from torch import Tensor

from hacrl.core._checks import check_1d, check_finite, check_ids, check_index, check_integer
from hacrl.core.capability import baseline_weights

ADV_EPS = 1e-6
"""Added to the group std before dividing (spec 3.2)."""


def group_advantages(rewards: Tensor, group_ids: Tensor, *, r_max: float = 1.0, eps: float = ADV_EPS) -> Tensor:
    """GRPO/GSPO advantage over one agent's own responses: A_i = (r_i - mean_g(r)) / (std_g(r) + eps).

    Paper Eq. 2 (GRPO's normalisation, also GSPO's). Uniform and single-response groups give exactly 0.

    rewards:   (N,) float in [0, r_max], one reward per response
    group_ids: (N,) long, prompt group of each response
    returns:   (N,) in the dtype of `rewards`
    """
    source = torch.zeros_like(group_ids) if isinstance(group_ids, Tensor) else group_ids
    return pooled_advantages(
        rewards, group_ids, source, learner=0, weights=torch.ones(1, dtype=torch.float64), r_max=r_max, eps=eps
    )


def naive_advantages(
    rewards: Tensor, group_ids: Tensor, source: Tensor, *, num_agents: int, r_max: float = 1.0, eps: float = ADV_EPS
) -> Tensor:
    """Naive rollout sharing: plain group normalisation over the whole pool, every source weighted 1 (spec 4).

    rewards:   (N,) float in [0, r_max]
    group_ids: (N,) long, prompt group of each response
    source:    (N,) long in [0, num_agents), agent that generated each response
    returns:   (N,) in the dtype of `rewards`
    """
    weights = torch.ones(num_agents, dtype=torch.float64)
    return pooled_advantages(rewards, group_ids, source, learner=0, weights=weights, r_max=r_max, eps=eps)


def hacpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    source: Tensor,
    *,
    learner: int,
    capabilities: Tensor,
    r_max: float = 1.0,
    eps: float = ADV_EPS,
    capability_baseline: bool = True,
) -> Tensor:
    """HACPO agent-capability-aware advantage of learner k over a shared pool (spec 3.2; paper Eqs. 6-8).

    mu_g = (1/|g|) sum_i w_{k,src(i)} r_i with w_kj = clamp(P_hat_k / P_hat_j, 0.1, 10), w_kk = 1;
    A_i = (r_i - mu_g) / (std_g(r) + eps), the same mu_g and std for own and foreign responses.

    rewards:             (N,) float in [0, r_max]
    group_ids:           (N,) long, prompt group of each response
    source:              (N,) long in [0, n), agent that generated each response
    learner:             k, id of the agent being updated
    capabilities:        (n,) P_hat per agent (`CapabilityTracker.capabilities()`)
    capability_baseline: False is the ablation "capability baseline off": every weight 1 (naive pooled mean)
    returns:             (N,) in the dtype of `rewards`
    """
    weights = baseline_weights(capabilities, learner)
    if not capability_baseline:
        weights = torch.ones_like(weights)
    return pooled_advantages(rewards, group_ids, source, learner=learner, weights=weights, r_max=r_max, eps=eps)


def pooled_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    source: Tensor,
    *,
    learner: int,
    weights: Tensor,
    r_max: float = 1.0,
    eps: float = ADV_EPS,
) -> Tensor:
    """The shared computation behind every advantage above (see the module docstring for the formula).

    rewards:   (N,) float in [0, r_max]
    group_ids: (N,) long, prompt group of each response
    source:    (N,) long in [0, n), agent that generated each response
    learner:   k, whose own rewards the baseline guard falls back to
    weights:   (n,) baseline weight of each source's rewards
    returns:   (N,) in the dtype of `rewards`
    """
    _check_pool(rewards, group_ids, source, learner, weights, r_max)
    if rewards.shape[0] == 0:
        return rewards.clone()
    r = rewards.detach().to(torch.float64)  # (N,)
    _, gid = torch.unique(group_ids, return_inverse=True)  # (N,) relabelled 0..num_groups-1
    zeros = r.new_zeros(int(gid.max()) + 1)  # (num_groups,)

    count = zeros.index_add(0, gid, torch.ones_like(r))
    plain_mean = zeros.index_add(0, gid, r) / count
    w = weights.to(device=r.device, dtype=torch.float64)[source]  # (N,) weight of each row's source
    mu = zeros.index_add(0, gid, w * r) / count  # Eq. 7: divided by the count, not by the sum of weights

    own = (source == learner).to(torch.float64)
    own_count = zeros.index_add(0, gid, own)
    own_mean = zeros.index_add(0, gid, own * r) / own_count.clamp(min=1)
    fallback = torch.where(own_count > 0, own_mean, plain_mean)
    mu = torch.where(mu > r_max, fallback, mu)  # guard (spec 3.2)

    var = zeros.index_add(0, gid, (r - plain_mean[gid]) ** 2) / (count - 1).clamp(min=1)  # unbiased
    std = var.sqrt()
    high = zeros.scatter_reduce(0, gid, r, "amax", include_self=False)
    low = zeros.scatter_reduce(0, gid, r, "amin", include_self=False)
    informative = high > low  # False for uniform groups and single responses

    adv = (r - mu[gid]) / (std[gid] + eps)
    adv = torch.where(informative[gid], adv, torch.zeros_like(adv))
    return adv.to(rewards.dtype)


def _check_pool(
    rewards: Tensor, group_ids: Tensor, source: Tensor, learner: int, weights: Tensor, r_max: float
) -> None:
    check_1d("rewards", rewards)
    if not rewards.dtype.is_floating_point:
        raise ValueError(f"rewards must be a floating tensor, got dtype {rewards.dtype}; use rewards.float()")
    n = rewards.shape[0]
    check_1d("group_ids", group_ids, n)
    check_integer("group_ids", group_ids)
    check_1d("source", source, n)
    check_integer("source", source)
    check_1d("weights", weights)
    check_index("learner", learner, weights.shape[0], "agent")
    check_ids("source", source, weights.shape[0], "agent")
    check_finite("rewards", rewards)
    if not r_max > 0:
        raise ValueError(f"r_max must be positive, got {r_max}")
    if n:
        out_of_range = (rewards < 0) | (rewards > r_max)
        if bool(out_of_range.any()):
            i = int(out_of_range.nonzero()[0])
            raise ValueError(
                f"rewards must lie in [0, r_max={r_max}], got {float(rewards[i])} at index {i}; rescale the reward "
                "function or set algorithm.r_max (rewards are never clamped silently, spec 5)"
            )
