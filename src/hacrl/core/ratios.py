"""Sequence ratios, the stepwise clipping bound and the KL estimator (spec 3.4-3.6; paper Eqs. 11-14, 48, 51-53).

Choices, in order:
1. A sequence ratio is length-normalised (GSPO, arXiv:2507.18071): s = exp(mean_t log pi_new - mean_t log pi_old).
   Each mean is taken in the tokenization of the policy that produced it, so a response sampled by another agent
   with another tokenizer still has a well-defined ratio against the learner (spec 3.4).
2. Across tokenizers the two means are over different units; `foreign_terms` gives the spec's three
   normalisations of a foreign row's log-ratio (3.4b): the paper's, per learner token, per UTF-8 byte.
3. The log-ratio is clamped to [-10, 10] before exp, for every row: only an overflow guard, it never binds in a
   healthy run.
4. The foreign lower bound rises with the optimizer-step index m inside a training step (Eq. 52):
   lo_m = min(1, 1 - delta + m * delta_step).
5. KL uses the k3 estimator exp(ref - logp) - (ref - logp) - 1 (Schulman, "Approximating KL Divergence"), >= 0.
6. A learner's own row sampled by older weights than its update starts from (`trainer.lag` > 0) is weighted by the
   truncated behaviour ratio w = min(exp(clamp(mean_t l_prox - mean_t l_behav, -10, 10)), cap), GSPO's sequence-level
   form of the decoupled objective (docs/design.md, "Stale own rows"); constant in the gradient.
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


def sequence_ratio(
    logp: Tensor,
    mask: Tensor,
    old_seq_logp: Tensor,
    *,
    clamp: float = LOG_RATIO_CLAMP,
    divisor: Tensor | None = None,
) -> Tensor:
    """s = exp(clamp(mean_t logp - old_seq_logp, -clamp, clamp)), differentiable with respect to `logp`.

    Paper Eq. 11 (own rows: GSPO's ratio) and Eq. 48 (foreign rows: old side is the source's mean log-prob in the
    source's own tokens). The gradient with respect to each response token's log-prob is s / |y| inside the clamp.

    logp:         (B, T) current per-token log-probs of the learner, in its tokenization
    mask:         (B, T) response tokens (EOS included)
    old_seq_logp: (B,) the behaviour side of each row's log-ratio (no gradient): the behaviour policy's mean
                  per-token log-prob, or a foreign row's term from `foreign_terms`
    divisor:      (B,) optional: divide each row's summed log-probs by this instead of its token count (the
                  `bytes` normalisation; give own rows their token count)
    returns:      (B,)
    """
    if divisor is None:
        learner = masked_mean(logp, mask)
    else:
        learner = torch.where(mask.bool(), logp, torch.zeros_like(logp)).sum(-1) / divisor.to(logp.dtype)
    log_ratio = learner - old_seq_logp.detach()
    return log_ratio.clamp(-clamp, clamp).exp()


FOREIGN_RATIO_MODES = ("source_mean", "learner_length", "bytes")


def foreign_terms(
    source_logp_sum: Tensor,
    source_num_tokens: Tensor,
    learner_num_tokens: Tensor,
    num_bytes: Tensor,
    mode: str,
) -> tuple[Tensor, Tensor | None]:
    """The two sides of foreign rows' log-ratios under each normalisation of spec 3.4b.

    With S = summed log-probs of the response, n = token counts (each in its own agent's tokens), b = UTF-8 bytes:
        source_mean     log s = S_k / n_k - S_src / n_src   (the paper)      -> (S_src / n_src, None)
        learner_length  log s = (S_k - S_src) / n_k                          -> (S_src / n_k,   None)
        bytes           log s = (S_k - S_src) / b                            -> (S_src / b,     b)
    Returns (old_seq_logp for `sequence_ratio`, its `divisor`, None where the learner's side is its token mean).
    With identical tokenizations (n_k = n_src) `learner_length` gives the paper's values exactly.

    All inputs (B,), float64 (counts as floats); b >= 1.

    >>> S, n_src, n_k, b = (torch.tensor([x], dtype=torch.float64) for x in (-6.0, 3.0, 2.0, 4.0))
    >>> [float(foreign_terms(S, n_src, n_k, b, m)[0]) for m in FOREIGN_RATIO_MODES]
    [-2.0, -3.0, -1.5]
    """
    if mode == "source_mean":
        return source_logp_sum / source_num_tokens, None
    if mode == "learner_length":
        return source_logp_sum / learner_num_tokens, None
    if mode == "bytes":
        return source_logp_sum / num_bytes, num_bytes
    raise ValueError(f"foreign ratio mode must be one of {FOREIGN_RATIO_MODES}, got {mode!r}")


def behaviour_weight(prox_logp: Tensor, behav_logp: Tensor, mask: Tensor, *, cap: float) -> Tensor:
    """w = min(exp(clamp(mean_t prox - mean_t behav, -10, 10)), cap) per row, detached: the truncated sequence-level
    ratio of the proximal policy (the learner's weights when its update starts) to the behaviour policy (the weights
    that sampled the row). Identical log-probs give exactly 1.

    prox_logp, behav_logp: (B, T) per-token log-probs of the same tokens
    mask:                  (B, T) response tokens
    returns:               (B,)

    >>> prox = torch.tensor([[-1.0, -1.0], [-1.0, -3.0], [-2.0, -2.0]])
    >>> behav = torch.tensor([[-1.0, -1.0], [-2.0, -2.0], [-0.5, -0.5]])
    >>> behaviour_weight(prox, behav, torch.ones(3, 2), cap=2.0).tolist()  # 1; exp(0) = 1; exp(-1.5)
    [1.0, 1.0, 0.22313016653060913]
    >>> float(behaviour_weight(behav[2:], prox[2:], torch.ones(1, 2), cap=2.0)[0])  # exp(1.5) = 4.48, capped
    2.0
    """
    log_w = masked_mean(prox_logp.detach(), mask) - masked_mean(behav_logp.detach(), mask)
    return log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp().clamp(max=cap)


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
