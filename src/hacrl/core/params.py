"""Hyper-parameters and ablation switches of every registered algorithm, with the paper's defaults (spec 3, 4, 6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class AlgorithmParams:
    """Scalars the advantage and loss functions read. Fields a given algorithm does not use are ignored by it.

    The trainer's `algorithm:` config section extends this class, so these defaults are the config's defaults.
    """

    eps_low: float = 3e-4
    """GSPO clip below 1 for own sequence ratios: clamp(s, 1 - eps_low, 1 + eps_high) (spec 3.6; GSPO's value)."""
    eps_high: float = 4e-4
    """GSPO clip above 1 for own sequence ratios (spec 3.6; GSPO's value)."""
    grpo_eps: float = 0.2
    """PPO clip range of GRPO's token-level ratios (spec 4)."""
    delta: float = 0.2
    """Foreign ratios are clipped below at 1 - delta in the first mini-batch (spec 3.5; the paper's table writes the
    bound 0.8 as "delta")."""
    delta_step: float = 0.025
    """Rise of the foreign lower bound per mini-batch index m; 0 is the "static clipping" ablation (spec 3.5)."""
    alpha: float = 1.0
    """Exponent of the stop-gradient factor s_hat ** alpha; 0 is plain sequence importance sampling (spec 3.5)."""
    capability_baseline: bool = True
    """HACPO's capability-weighted baseline; False is the ablation "plain pooled mean" (spec 3.2)."""
    capability_coef: bool = True
    """HACPO's coefficient rho = P_hat_j / P_hat_k on foreign advantages; False sets rho = 1 (spec 3.3)."""
    foreign_clip: bool = True
    """Clamp foreign ratios to [lo_m, 1]; False is the ablation "cross clipping off" (spec 3.5)."""
    foreign_ratio: Literal["source_mean", "learner_length", "bytes"] = "source_mean"
    """How a foreign row's sequence ratio is normalised across tokenizers (spec 3.4b): `source_mean` (the paper:
    log s = S_k/n_k - S_src/n_src), `learner_length` ((S_k - S_src)/n_k), `bytes` ((S_k - S_src)/b, b the response's
    UTF-8 byte count). S = summed log-probs, n = token counts in each agent's own tokens."""
    foreign_center: Literal["none", "median"] = "none"
    """A hacrl extension of spec 3.5 for agents far apart (docs/design.md, "A window that fits the pair"). `none`:
    the paper's window on s. `median`: each source's log-ratios are first centred by their median over the learner's
    update (its pre-update weights, one no-grad pass over the foreign rows it keeps), s' = s / exp(median), so the
    window [lo_m, 1] holds back the answers that are unlikely for the learner relative to how that partner's answers
    usually are for it, rather than every answer of a partner whose style is far from its own."""
    share_rollouts: bool = True
    """For algorithms that share (naive, hacpo): False trains each agent on its own rollouts only (equals gspo)."""
    kl_coef: float = 0.0
    """Coefficient of the k3 KL to the frozen initial weights, own responses only; 0 turns it off (spec 3.6)."""
    r_max: float = 1.0
    """Largest possible reward; rewards outside [0, r_max] are an error (spec 5)."""
    adv_eps: float = 1e-6
    """Added to the group std of the advantage (spec 3.2). TRL's GRPOTrainer adds 1e-4: 1e-4 here gives its
    advantages (with binary rewards and G = 8 the two differ by at most 2.8e-4 relative)."""
    behaviour_cap: float = 2.0
    """With `trainer.lag` > 0, a learner's own rows were sampled by older weights than its update starts from: each is
    weighted by min(exp(l_prox - l_behav), behaviour_cap), sequence-level means (docs/design.md, "Stale own rows");
    >= 1. Unused at lag 0 (the weight is exactly 1)."""

    def __post_init__(self) -> None:
        for name in ("eps_low", "eps_high", "grpo_eps", "delta_step", "alpha", "kl_coef"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"algorithm.{name} must be >= 0, got {value}")
        if not 0 <= self.eps_low < 1:
            raise ValueError(f"algorithm.eps_low must be in [0, 1) so that 1 - eps_low > 0, got {self.eps_low}")
        if not 0 < self.grpo_eps < 1:
            raise ValueError(f"algorithm.grpo_eps must be in (0, 1), got {self.grpo_eps}")
        if not 0 <= self.delta <= 1:
            raise ValueError(f"algorithm.delta must be in [0, 1] (lower bound 1 - delta), got {self.delta}")
        if not self.r_max > 0:
            raise ValueError(f"algorithm.r_max must be positive, got {self.r_max}")
        if not self.behaviour_cap >= 1:
            raise ValueError(
                f"algorithm.behaviour_cap must be >= 1 (a weight of 1 is on-policy), got {self.behaviour_cap}"
            )
        if not self.adv_eps > 0:
            raise ValueError(f"algorithm.adv_eps must be positive, got {self.adv_eps}")
        if self.foreign_center not in ("none", "median"):
            raise ValueError(f"algorithm.foreign_center must be none or median, got {self.foreign_center!r}")
        if self.foreign_ratio not in ("source_mean", "learner_length", "bytes"):
            raise ValueError(
                f"algorithm.foreign_ratio must be source_mean, learner_length or bytes, got {self.foreign_ratio!r}"
            )
