"""Sequence ratios, the stepwise clipping bound and the KL estimator (spec 3.4-3.6; paper Eqs. 11-14, 48, 51-53).

Choices, in order:
1. A sequence ratio is length-normalised (GSPO, arXiv:2507.18071): s = exp(mean_t log pi_new - mean_t log pi_old).
   Each mean is taken in the tokenization of the policy that produced it, so a response sampled by another agent
   with another tokenizer still has a well-defined ratio against the learner (spec 3.4).
2. The log-ratio is clamped to [-10, 10] before exp, for every row: only an overflow guard, it never binds in a
   healthy run.
3. The foreign lower bound rises with the optimizer-step index m inside a training step (Eq. 52):
   lo_m = min(1, 1 - delta + m * delta_step).
4. KL uses the k3 estimator exp(ref - logp) - (ref - logp) - 1 (Schulman, "Approximating KL Divergence"), >= 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 10.0
"""Sequence log-ratios are clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before exp (spec 3.4)."""


def masked_mean(x: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """Mean of `x` over the positions where `mask` is set; masked-out entries (even inf/nan) never leak in.

    x:    (B, T) float
    mask: (B, T) bool or {0, 1}
    returns (B,) for dim=-1; rows with an empty mask give 0/0 = nan (the loss inputs reject them earlier)
    """
    keep = mask.bool()
    return torch.where(keep, x, torch.zeros_like(x)).sum(dim) / keep.sum(dim)


def sequence_ratio(logp: Tensor, mask: Tensor, old_seq_logp: Tensor, *, clamp: float = LOG_RATIO_CLAMP) -> Tensor:
    """s = exp(clamp(mean_t logp - old_seq_logp, -clamp, clamp)), differentiable with respect to `logp`.

    Paper Eq. 11 (own rows: GSPO's ratio) and Eq. 48 (foreign rows: old side is the source's mean log-prob in the
    source's own tokens). The gradient with respect to each response token's log-prob is s / |y| inside the clamp.

    logp:         (B, T) current per-token log-probs of the learner, in its tokenization
    mask:         (B, T) response tokens (EOS included)
    old_seq_logp: (B,) behaviour policy's mean per-token log-prob of the same response (no gradient)
    returns:      (B,)
    """
    log_ratio = masked_mean(logp, mask) - old_seq_logp.detach()
    return log_ratio.clamp(-clamp, clamp).exp()


def foreign_lower_bound(step_index: int, *, delta: float, delta_step: float) -> float:
    """lo_m = min(1, 1 - delta + m * delta_step), the lower clip of a foreign ratio in optimizer step m (Eq. 52).

    `step_index` m counts the learner's optimizer steps (mini-batches, own or foreign) within one training step,
    starting at 0. delta_step = 0 is static clipping.
    """
    if not isinstance(step_index, int) or isinstance(step_index, bool) or step_index < 0:
        raise ValueError(f"step_index must be an int >= 0 (the mini-batch index m), got {step_index!r}")
    return min(1.0, 1.0 - delta + step_index * delta_step)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1, elementwise and >= 0.

    logp:     (B, T) current log-probs (with gradient)
    ref_logp: (B, T) frozen reference log-probs of the same tokens
    returns:  (B, T)
    """
    diff = (ref_logp.detach() - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return diff.exp() - diff - 1.0
