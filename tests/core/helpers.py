"""Build LossInputs from a readable per-row description (used by the loss tests)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hacrl.core import LossInputs


@dataclass
class Row:
    length: int  # response tokens in the learner's tokenization
    new_mean: float  # mean of the learner's current per-token log-probs
    old_mean: float  # own: the learner's pre-update mean; foreign: the source's stored mean
    adv: float
    source: int


def make_inputs(rows, *, learner=0, capabilities=(0.5, 0.5), ref_shift=None, seed=0, **kwargs):
    """Per-token log-probs with the requested means plus zero-mean noise; padding holds -inf/nan to prove masking."""
    g = torch.Generator().manual_seed(seed)
    width = max(r.length for r in rows) + 2
    logp = torch.full((len(rows), width), float("-inf"), dtype=torch.float64)
    old = torch.full_like(logp, float("nan"))
    mask = torch.zeros_like(logp, dtype=torch.bool)
    for i, r in enumerate(rows):
        noise = torch.randn(r.length, generator=g, dtype=torch.float64) * 0.3
        noise -= noise.mean()
        logp[i, : r.length] = r.new_mean + noise
        if r.source == learner:
            other = torch.randn(r.length, generator=g, dtype=torch.float64) * 0.3
            old[i, : r.length] = r.old_mean + other - other.mean()
        mask[i, : r.length] = True
    logp.requires_grad_(True)
    ref = None
    if ref_shift is not None:
        ref = torch.where(mask, logp.detach() + ref_shift, torch.full_like(logp, float("nan")))
    src_mean = torch.tensor([float("nan") if r.source == learner else r.old_mean for r in rows], dtype=torch.float64)
    return LossInputs(
        logp=logp,
        mask=mask,
        old_logp=old,
        source_logp_sum=src_mean,  # over one source token: the source's mean is the sum
        source_num_tokens=torch.ones(len(rows), dtype=torch.long),
        adv=torch.tensor([r.adv for r in rows], dtype=torch.float64),
        source=torch.tensor([r.source for r in rows]),
        learner=learner,
        capabilities=torch.tensor(capabilities, dtype=torch.float64),
        ref_logp=ref,
        **kwargs,
    )


def grad_of(loss_out, inputs):
    (grad,) = torch.autograd.grad(loss_out.loss, inputs.logp)
    return grad
