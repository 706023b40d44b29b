"""hacrl.core: the HACPO equations as pure tensor functions (imports only torch).

Reusable from any trainer (verl, TRL, your own). See ``shared/spec/HACPO.md`` / the README for the contract.
"""

from hacrl.core.advantages import group_advantages, hacpo_advantages, naive_advantages, pooled_advantages
from hacrl.core.algorithms import ALGORITHMS, Algorithm, get_algorithm, register
from hacrl.core.capability import (
    CapabilityTracker,
    baseline_weights,
    loss_coefficients,
    step_mean_rewards,
)
from hacrl.core.losses import (
    LossInputs,
    LossOutput,
    foreign_objective,
    grpo_loss,
    gspo_loss,
    gspo_objective,
    hacpo_loss,
)
from hacrl.core.params import AlgorithmParams
from hacrl.core.ratios import foreign_lower_bound, k3_kl, masked_mean, sequence_ratio

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AlgorithmParams",
    "CapabilityTracker",
    "LossInputs",
    "LossOutput",
    "baseline_weights",
    "foreign_lower_bound",
    "foreign_objective",
    "get_algorithm",
    "group_advantages",
    "grpo_loss",
    "gspo_loss",
    "gspo_objective",
    "hacpo_advantages",
    "hacpo_loss",
    "k3_kl",
    "loss_coefficients",
    "masked_mean",
    "naive_advantages",
    "pooled_advantages",
    "register",
    "sequence_ratio",
    "step_mean_rewards",
]
