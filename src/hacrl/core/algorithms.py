"""The algorithm registry: name -> (advantage function, loss function, whether rollouts are shared).

The trainer looks an algorithm up by its config name and calls its three members; it never branches on the name.
Adding an algorithm is one advantage or loss function and one `register` call.

| name  | pool                     | advantage                         | loss                                   |
|-------|--------------------------|-----------------------------------|----------------------------------------|
| grpo  | own responses            | group mean/std                    | token-level PPO clip                   |
| gspo  | own responses            | group mean/std                    | sequence ratio, GSPO clip              |
| naive | every agent's responses  | pooled mean/std                   | GSPO clip on every row vs its source   |
| hacpo | every agent's responses  | capability-weighted pooled mean   | GSPO on own rows, HACPO on foreign     |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from hacrl.core.advantages import hacpo_advantages, naive_advantages, pooled_advantages
from hacrl.core.capability import loss_coefficients
from hacrl.core.losses import LossOutput, grpo_loss, gspo_loss, hacpo_loss
from hacrl.core.params import AlgorithmParams


class AdvantageFn(Protocol):
    def __call__(
        self,
        rewards: Tensor,
        group_ids: Tensor,
        source: Tensor,
        *,
        learner: int,
        capabilities: Tensor,
        params: AlgorithmParams,
    ) -> Tensor: ...


LossFn = Callable[..., LossOutput]
"""``loss(inputs: LossInputs, *, params: AlgorithmParams, step_index: int) -> LossOutput``."""


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm. `advantages` and `loss` have the uniform signatures above."""

    name: str
    advantages: AdvantageFn
    loss: LossFn
    shares_rollouts: bool
    """Whether a learner's pool holds the other agents' responses (before `params.share_rollouts`)."""
    takes_stale_rows: bool = True
    """Whether its loss weights own rows sampled by older weights (`LossInputs.behaviour_logp`, `trainer.lag` > 0)."""
    weighs_by_rho: bool = False
    """Whether its loss multiplies a foreign row by rho_jk (spec 3.3; HACPO's, under `params.capability_coef`)."""

    def pool_is_shared(self, params: AlgorithmParams) -> bool:
        """Whether learner k's pool holds other agents' responses under these params (spec 2, step 5a)."""
        return self.shares_rollouts and params.share_rollouts

    def loss_rho(self, capabilities: Tensor, learner: int, params: AlgorithmParams) -> Tensor | None:
        """Each source's coefficient in learner `learner`'s loss: rho (`loss_coefficients`) where the loss has it,
        None (every source 1) otherwise. The sharing budget weighs rows by it (`sharing.kept_rows`)."""
        if not (self.weighs_by_rho and params.capability_coef):
            return None
        return loss_coefficients(capabilities, learner)

    def rho_metrics(self, capabilities: Tensor, learner: int, params: AlgorithmParams, names) -> dict[str, float]:
        """`rho/<other>` for learner `learner` (named sources `names`): the coefficient of each other agent's rows in
        its loss, 1 with `capability_coef` off; none for a loss without rho (`naive`, gspo) or an unshared pool."""
        if not (self.weighs_by_rho and self.pool_is_shared(params)) or len(names) < 2:
            return {}
        rho = self.loss_rho(capabilities, learner, params)
        return {f"rho/{other}": 1.0 if rho is None else float(rho[j]) for j, other in enumerate(names) if j != learner}


def _own_group_advantages(rewards, group_ids, source, *, learner, capabilities, params):
    """GRPO/GSPO: group mean/std over the learner's own responses; the pool must hold nothing else."""
    if bool((source != learner).any()):
        raise ValueError(
            "grpo/gspo advantages take the learner's own responses only, but the pool has rows from "
            "other agents; build the pool without sharing or use 'naive' / 'hacpo'"
        )
    weights = capabilities.new_ones(capabilities.shape[0])
    return pooled_advantages(
        rewards, group_ids, source, learner=learner, weights=weights, r_max=params.r_max, eps=params.adv_eps
    )


def _naive_advantages(rewards, group_ids, source, *, learner, capabilities, params):
    del learner  # every source weighs 1, whoever learns
    return naive_advantages(
        rewards, group_ids, source, num_agents=capabilities.shape[0], r_max=params.r_max, eps=params.adv_eps
    )


def _hacpo_advantages(rewards, group_ids, source, *, learner, capabilities, params):
    return hacpo_advantages(
        rewards,
        group_ids,
        source,
        learner=learner,
        capabilities=capabilities,
        r_max=params.r_max,
        eps=params.adv_eps,
        capability_baseline=params.capability_baseline,
    )


ALGORITHMS: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    if algorithm.name in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm.name!r} is already registered")
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm


register(Algorithm("grpo", _own_group_advantages, grpo_loss, shares_rollouts=False, takes_stale_rows=False))
register(Algorithm("gspo", _own_group_advantages, gspo_loss, shares_rollouts=False))
register(Algorithm("naive", _naive_advantages, gspo_loss, shares_rollouts=True))
register(Algorithm("hacpo", _hacpo_advantages, hacpo_loss, shares_rollouts=True, weighs_by_rho=True))


def get_algorithm(name: str) -> Algorithm:
    """The registered algorithm called `name`; a ValueError lists the known names otherwise."""
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}; known algorithms: {sorted(ALGORITHMS)}") from None
