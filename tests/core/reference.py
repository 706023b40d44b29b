"""Slow, obviously-correct plain-Python references for the vectorised core (spec 3.2, 3.4-3.6).

Written from the spec's text, one prompt and one response at a time, with Python floats (float64).
"""

from __future__ import annotations

import math
from collections import defaultdict


def capability_ratio(p_num: float, p_den: float) -> float:
    return min(10.0, max(0.1, p_num / p_den))


def hacpo_advantages_ref(rewards, group_ids, source, learner, capabilities, r_max=1.0, eps=1e-6, baseline=True):
    """Spec 3.2, literally: per prompt, weighted mean baseline with guard, unbiased raw std, uniform/singleton -> 0."""
    groups = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[g].append(i)
    adv = [0.0] * len(rewards)
    for rows in groups.values():
        pool = [rewards[i] for i in rows]
        if len(rows) == 1 or max(pool) == min(pool):
            continue  # zeros
        weights = []
        for i in rows:
            j = source[i]
            w = 1.0 if (j == learner or not baseline) else capability_ratio(capabilities[learner], capabilities[j])
            weights.append(w)
        mu = sum(w * r for w, r in zip(weights, pool, strict=True)) / len(pool)
        if mu > r_max:
            own = [rewards[i] for i in rows if source[i] == learner]
            mu = sum(own) / len(own) if own else sum(pool) / len(pool)
        mean = sum(pool) / len(pool)
        std = math.sqrt(sum((r - mean) ** 2 for r in pool) / (len(pool) - 1))
        for i in rows:
            adv[i] = (rewards[i] - mu) / (std + eps)
    return adv


def group_advantages_ref(rewards, group_ids, eps=1e-6):
    return hacpo_advantages_ref(rewards, group_ids, [0] * len(rewards), 0, [1.0], eps=eps)


def sequence_ratio_ref(token_logps, old_mean):
    log_ratio = sum(token_logps) / len(token_logps) - old_mean
    return math.exp(min(10.0, max(-10.0, log_ratio)))


def hacpo_objective_ref(s, adv, *, own, rho, lower, alpha, eps_low, eps_high, clip=True):
    """Spec 3.5-3.6 for one response: GSPO's min-clip for own rows, clamp(s, lo, 1) * s_hat**alpha * rho * A else."""
    if own:
        return min(s * adv, min(1 + eps_high, max(1 - eps_low, s)) * adv)
    s_hat = min(1.0, max(lower, s)) if clip else s
    return s_hat * s_hat**alpha * rho * adv
