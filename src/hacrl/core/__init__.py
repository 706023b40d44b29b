"""hacrl.core: the HACPO equations as pure tensor functions (imports only torch).

Reusable from any trainer (verl, TRL, your own). Names load lazily, so `hacrl.core.params` (used by the config and
the CLI) does not import torch. Besides the modules below, `metrics` reduces a loss's metrics by declared kind and
`_checks` holds the input checks every function runs (a ValueError naming the tensor).
"""

import importlib

_EXPORTS = {
    "hacrl.core.advantages": ["group_advantages", "hacpo_advantages", "naive_advantages", "pooled_advantages"],
    "hacrl.core.algorithms": ["ALGORITHMS", "Algorithm", "get_algorithm", "register"],
    "hacrl.core.capability": ["CapabilityTracker", "baseline_weights", "loss_coefficients", "step_mean_rewards"],
    "hacrl.core.losses": [
        "LossInputs",
        "LossOutput",
        "foreign_objective",
        "grpo_loss",
        "gspo_loss",
        "gspo_objective",
        "hacpo_loss",
        "median_by_source",
        "sequence_log_ratios",
    ],
    "hacrl.core.params": ["AlgorithmParams"],
    "hacrl.core.sharing": ["kept_rows", "select_foreign", "within_budget"],
    "hacrl.core.ratios": ["foreign_lower_bound", "foreign_terms", "k3_kl", "masked_mean", "sequence_ratio"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'hacrl.core' has no attribute {name!r}")
