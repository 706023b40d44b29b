"""Policy losses of GRPO, GSPO, naive sharing and HACPO over one (micro-)batch of a learner's pool.

Every loss has the signature ``loss(inputs: LossInputs, *, params: AlgorithmParams, step_index: int) -> LossOutput``
so that the trainer calls them through the registry without knowing which one runs.

Choices, in order (spec 3.4-3.6, 4, 5):
1. Own responses (GSPO, Eq. 47): objective = min(s A, clamp(s, 1 - eps_low, 1 + eps_high) A), s the
   length-normalised sequence ratio against the learner's own pre-update log-probs.
2. Foreign responses (HACPO, Eqs. 12-14): s_hat = clamp(s, lo_m, 1), objective = s_hat * sg(s_hat)**alpha * rho * A,
   s against the *source's* stored mean log-prob. No min() with an unclipped term: outside [lo_m, 1] the
   objective is constant, so it gives no gradient whatever the sign of A.
3. A (micro-)batch loss is -sum(objective) / num_seqs: every sequence weighs the same, whatever its length. With
   gradient accumulation the caller passes the mini-batch's totals, so the accumulated gradient equals the
   mini-batch's.
4. Optional k3 KL to a frozen reference on own rows only, token-mean per sequence, averaged over own rows (spec
   3.6 and 5: the authors' code divided by the whole mini-batch and so halved it).
5. Metrics are detached tensors, 0-dim except `foreign_ratios` (each foreign row's s, for its distribution);
   nothing here calls .item(). Means over an empty subset (a mini-batch with no foreign rows, say) read 0;
   `num_own` and `num_foreign` let a logger weight them.
6. GRPO (spec 4) is token-level: ratio pi/pi_old per token, PPO clip, token mean per sequence, mean over sequences.
7. Stale own rows (`trainer.lag` > 0; docs/design.md, "Stale own rows"): when `behaviour_logp` is given, `old_logp`
   is the proximal policy (the learner's weights when its update starts: clipping is around it) and each own row's
   objective is multiplied by w = min(exp(l_prox - l_behav), behaviour_cap) (`behaviour_weight`); foreign rows are
   unchanged (their ratio is already taken against the policy that sampled them). Without it nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from hacrl.core._checks import check_1d, check_2d, check_finite, check_ids, check_index, check_integer
from hacrl.core.capability import loss_coefficients
from hacrl.core.params import AlgorithmParams
from hacrl.core.ratios import (
    behaviour_weight,
    foreign_lower_bound,
    foreign_terms,
    k3_kl,
    masked_mean,
    sequence_ratio,
)


@dataclass(frozen=True)
class LossInputs:
    """One (micro-)batch of learner k's pool: B responses in k's tokenization, T token positions.

    Checked on construction: shapes agree, no response has an empty mask, every value that is read is finite,
    every source id is known.
    """

    logp: Tensor
    """(B, T) learner's current per-token log-probs at the sampling temperature (requires grad for training)."""
    mask: Tensor
    """(B, T) bool or {0, 1}: response tokens that count in the loss, the final EOS included (spec 5)."""
    old_logp: Tensor
    """(B, T) learner's pre-update per-token log-probs; read on own rows only (foreign rows: any finite value)."""
    adv: Tensor
    """(B,) advantage of each response for this learner."""
    source: Tensor
    """(B,) long: agent that generated each response."""
    learner: int
    """k: id of the agent being updated; rows with source == learner are its own."""
    capabilities: Tensor
    """(n,) P_hat per agent, for the coefficient rho (`CapabilityTracker.capabilities()`)."""
    ref_logp: Tensor | None = None
    """(B, T) frozen reference per-token log-probs for the KL term; read on own rows only. None: no KL."""
    num_seqs: int | None = None
    """Rows of the whole mini-batch when this is one micro-batch of it (gradient accumulation); None: B."""
    num_own: int | None = None
    """Own rows of the whole mini-batch (the KL normaliser) under gradient accumulation; None: this batch's."""
    source_logp_sum: Tensor | None = None
    """(B,) the source's summed pre-update log-probs of each response, in the source's tokens (EOS included); read on
    foreign rows only. Needed when the batch has foreign rows; None for a batch of own rows."""
    source_num_tokens: Tensor | None = None
    """(B,) each response's length in the source's tokens (>= 1); read on foreign rows only, with
    `source_logp_sum`."""
    num_bytes: Tensor | None = None
    """(B,) UTF-8 bytes of each response's text (>= 1); read on foreign rows only, by the `bytes` normalisation
    (`AlgorithmParams.foreign_ratio`, spec 3.4b)."""
    behaviour_logp: Tensor | None = None
    """(B, T) per-token log-probs of the weights that sampled each own row, when they are older than `old_logp`'s (the
    proximal policy: the learner's weights when its update starts; `trainer.lag` > 0); read on own rows only. None:
    `old_logp` is the behaviour policy (today's loop)."""
    foreign_shift: Tensor | None = None
    """(B,) float64: added to each foreign row's behaviour term, so its log-ratio is log s - shift (`foreign_center:
    median`: its source's median log-ratio, `foreign_centers`); read on foreign rows only. None: 0."""
    check_values: bool = True
    """Check values (finite, known ids, no empty row): each check reads the device once. A trainer that checked its
    inputs once per update passes False, so the micro-batch loop never waits for the device (shapes are always
    checked; a non-finite log-prob then shows as a non-finite gradient norm, and the step is skipped)."""
    is_own: Tensor = field(init=False, repr=False)
    """(B,) bool, derived: source == learner."""

    def __post_init__(self) -> None:
        check_2d("logp", self.logp)
        shape = tuple(self.logp.shape)
        batch = shape[0]
        check_2d("mask", self.mask, shape)
        check_2d("old_logp", self.old_logp, shape)
        for name in ("adv", "source"):
            check_1d(name, getattr(self, name), batch)
        if (self.source_logp_sum is None) != (self.source_num_tokens is None):
            raise ValueError("source_logp_sum and source_num_tokens go together: pass both (foreign rows) or neither")
        for name in ("source_logp_sum", "source_num_tokens", "num_bytes", "foreign_shift"):
            if getattr(self, name) is not None:
                check_1d(name, getattr(self, name), batch)
        check_integer("source", self.source)
        caps = torch.as_tensor(self.capabilities)
        check_1d("capabilities", caps)
        check_index("learner", self.learner, caps.shape[0], "agent")
        is_own = self.source == self.learner
        object.__setattr__(self, "is_own", is_own)
        if self.ref_logp is not None:
            check_2d("ref_logp", self.ref_logp, shape)
        if self.behaviour_logp is not None:
            check_2d("behaviour_logp", self.behaviour_logp, shape)
        for name in ("num_seqs", "num_own"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int (a mini-batch total) or None, got {value!r}")
        if self.check_values:
            self._check_values(caps.shape[0])

    def _check_values(self, num_agents: int) -> None:
        check_ids("source", self.source, num_agents, "agent")
        mask = self.mask.bool()
        empty = ~mask.any(dim=-1)
        if bool(empty.any()):
            row = int(empty.nonzero()[0])
            raise ValueError(
                f"mask row {row} selects no token; every response needs at least one token in the loss (a finished "
                "response keeps its EOS); drop responses that are empty in the learner's tokenization"
            )
        own_tokens = mask & self.is_own.unsqueeze(-1)
        check_finite("logp", self.logp.detach(), mask)
        check_finite("old_logp", self.old_logp, own_tokens)
        foreign = ~self.is_own
        if self.source_logp_sum is None:
            if bool(foreign.any()):
                raise ValueError(
                    "the batch has rows of other agents but no source_logp_sum / source_num_tokens: a foreign row's "
                    "ratio is taken against its source's log-probs (spec 3.4), so pass both"
                )
        else:
            check_finite("source_logp_sum", self.source_logp_sum, foreign)
            _check_at_least_one("source_num_tokens", self.source_num_tokens, foreign)
        if self.num_bytes is not None:
            _check_at_least_one("num_bytes", self.num_bytes, foreign)
        check_finite("adv", self.adv)
        if self.ref_logp is not None:
            check_finite("ref_logp", self.ref_logp, own_tokens)
        if self.behaviour_logp is not None:
            check_finite("behaviour_logp", self.behaviour_logp, own_tokens)

    def own_weights(self, cap: float) -> Tensor | None:
        """(B,) each row's behaviour weight: `behaviour_weight` on own rows, 1 on foreign rows; None without
        `behaviour_logp` (every weight 1: nothing is multiplied)."""
        if self.behaviour_logp is None:
            return None
        w = behaviour_weight(self.old_logp, self.behaviour_logp, self.mask, cap=cap).to(self.logp.dtype)
        return torch.where(self.is_own, w, torch.ones_like(w))

    def behaviour_terms(self, mode: str) -> tuple[Tensor, Tensor | None]:
        """The behaviour side of each row's sequence log-ratio, (B,), and the divisor of the learner's summed
        log-probs, (B,) or None for token means, under the foreign-ratio normalisation `mode` (spec 3.4b).

        Own rows: the learner's pre-update token mean (GSPO). Foreign rows: `foreign_terms` of the source's sum and
        token count, the learner's token count and the bytes, in float64, then in the log-probs' dtype.
        """
        own_mean = masked_mean(self.old_logp.detach(), self.mask)
        if self.source_logp_sum is None:  # own rows only (checked on construction)
            return own_mean, None
        if mode == "bytes" and self.num_bytes is None:
            raise ValueError("foreign_ratio=bytes needs num_bytes (each response's UTF-8 byte count) in the inputs")
        f64, dtype = torch.float64, self.logp.dtype
        foreign = ~self.is_own
        counts = self.mask.bool().sum(-1)

        def foreign_only(x: Tensor) -> Tensor:  # own rows read 1, so nothing non-finite is computed there
            return torch.where(foreign, x.to(f64), torch.ones((), dtype=f64, device=x.device))

        term, divisor = foreign_terms(
            foreign_only(self.source_logp_sum),
            foreign_only(self.source_num_tokens),
            foreign_only(counts.clamp(min=1)),
            foreign_only(self.num_bytes) if self.num_bytes is not None else torch.ones_like(own_mean, dtype=f64),
            mode,
        )
        if self.foreign_shift is not None:
            term = term + foreign_only(self.foreign_shift)
        old = torch.where(self.is_own, own_mean, term.to(own_mean.dtype))
        if divisor is None:
            return old, None
        return old, torch.where(self.is_own, counts.to(dtype), divisor.to(dtype))

    def seq_normaliser(self) -> int:
        return self.num_seqs if self.num_seqs is not None else self.logp.shape[0]


@dataclass(frozen=True)
class LossOutput:
    """What a loss returns: the scalar to call .backward() on and detached metrics (0-dim tensors)."""

    loss: Tensor
    """() scalar, with gradient."""
    metrics: dict[str, Tensor] = field(default_factory=dict)
    """Detached 0-dim tensors, keyed by name; the logger calls .item()."""


def sequence_log_ratios(inputs: LossInputs, mode: str) -> Tensor:
    """(B,) each row's sequence log-ratio log s (before the [-10, 10] guard) under the foreign-ratio normalisation
    `mode`, detached: with `inputs.logp` the learner's pre-update log-probs, what `foreign_center: median` centres."""
    old, divisor = inputs.behaviour_terms(mode)
    logp = inputs.logp.detach()
    if divisor is None:
        learner = masked_mean(logp, inputs.mask)
    else:
        learner = torch.where(inputs.mask.bool(), logp, torch.zeros_like(logp)).sum(-1) / divisor
    return learner - old.detach()


def median_by_source(values: Tensor, source: Tensor, rows: Tensor) -> Tensor:
    """(B,) float64: for each row in `rows` the median of `values` over the rows of its source in `rows` (the lower
    of the two middle values for an even count, torch's), 0 elsewhere (`foreign_center: median`'s shift).

    >>> median_by_source(torch.tensor([1.0, -3.0, -1.0, -2.0, 5.0]), torch.tensor([0, 1, 1, 1, 2]),
    ...                  torch.tensor([False, True, True, True, True])).tolist()
    [0.0, -2.0, -2.0, -2.0, 5.0]
    """
    out = torch.zeros(values.shape, dtype=torch.float64, device=values.device)
    for s in torch.unique(source[rows]).tolist():
        sel = rows & (source == s)
        out[sel] = values[sel].double().median()
    return out


def gspo_objective(seq_ratio: Tensor, adv: Tensor, *, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """GSPO's clipped objective per sequence: min(s A, clamp(s, 1 - eps_low, 1 + eps_high) A) (spec 3.6, Eq. 47).

    seq_ratio: (B,) sequence ratios s (with gradient)
    adv:       (B,) advantages
    returns:   objective (B,), clipped (B,) bool: rows where the clipped term is taken and gives no gradient
    """
    unclipped = seq_ratio * adv
    clipped = seq_ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    return torch.minimum(unclipped, clipped), (clipped < unclipped).detach()


def foreign_objective(
    seq_ratio: Tensor, adv: Tensor, rho: Tensor, *, lower: float, alpha: float, clip: bool = True
) -> tuple[Tensor, Tensor]:
    """HACPO's objective for a response from another agent: s_hat * sg(s_hat)**alpha * rho * A (spec 3.5, Eqs. 12-14).

    s_hat = clamp(s, lower, 1) when `clip`, else s. Inside [lower, 1] the gradient with respect to each of the
    learner's token log-probs is rho * A * s**(alpha + 1) / |y|; outside it is 0 for either sign of A.

    seq_ratio: (B,) sequence ratios s of the learner against the source (with gradient)
    adv:       (B,) advantages
    rho:       (B,) capability coefficients rho_jk
    lower:     lo_m, see `foreign_lower_bound`
    returns:   objective (B,), clipped (B,) bool: rows outside [lower, 1] (always False when clip is off)
    """
    if clip:
        s_hat = seq_ratio.clamp(lower, 1.0)
        clipped = ((seq_ratio < lower) | (seq_ratio > 1.0)).detach()
    else:
        s_hat = seq_ratio
        clipped = torch.zeros_like(seq_ratio, dtype=torch.bool)
    return s_hat * s_hat.detach() ** alpha * rho * adv, clipped


def gspo_loss(inputs: LossInputs, *, params: AlgorithmParams, step_index: int = 0) -> LossOutput:
    """GSPO loss; also naive sharing, which treats every row like an own one against its source (spec 4).

    L = -(1/B) sum_i min(s_i A_i, clamp(s_i, 1 - eps_low, 1 + eps_high) A_i) [+ kl_coef * KL], with s_i against the
    behaviour policy of row i (the learner's old policy for own rows, the source's for foreign rows).
    `step_index` is unused: GSPO has no schedule.
    """
    old_seq_logp, divisor = inputs.behaviour_terms(params.foreign_ratio)
    ratio = sequence_ratio(inputs.logp, inputs.mask, old_seq_logp, divisor=divisor)
    objective, clipped = gspo_objective(
        ratio, inputs.adv.to(ratio.dtype), eps_low=params.eps_low, eps_high=params.eps_high
    )
    weights = inputs.own_weights(params.behaviour_cap)
    if weights is not None:
        objective = objective * weights
    return _finish(inputs, params, objective, ratio, clipped_own=clipped, clipped_foreign=clipped, weights=weights)


def hacpo_loss(inputs: LossInputs, *, params: AlgorithmParams, step_index: int) -> LossOutput:
    """HACPO loss of learner k in its `step_index`-th optimizer step of the training step (spec 3.4-3.6).

    Own rows: GSPO's objective. Foreign rows from source j: clamp(s, lo_m, 1) * sg(.)**alpha * rho_jk * A with
    lo_m = min(1, 1 - delta + m * delta_step) and rho_jk = clamp(P_hat_j / P_hat_k, 0.1, 10) (1 when
    `params.capability_coef` is off). L = -(1/B) sum_i objective_i [+ kl_coef * KL over own rows].
    """
    old_seq_logp, divisor = inputs.behaviour_terms(params.foreign_ratio)
    ratio = sequence_ratio(inputs.logp, inputs.mask, old_seq_logp, divisor=divisor)
    adv = inputs.adv.to(ratio.dtype)
    own_objective, own_clipped = gspo_objective(ratio, adv, eps_low=params.eps_low, eps_high=params.eps_high)
    weights = inputs.own_weights(params.behaviour_cap)
    if weights is not None:  # 1 on foreign rows
        own_objective = own_objective * weights
    if params.capability_coef:
        rho = loss_coefficients(inputs.capabilities, inputs.learner).to(ratio.device, ratio.dtype)[inputs.source]
    else:
        rho = torch.ones_like(ratio)
    lower = foreign_lower_bound(step_index, delta=params.delta, delta_step=params.delta_step)
    foreign_obj, foreign_clipped = foreign_objective(
        ratio, adv, rho, lower=lower, alpha=params.alpha, clip=params.foreign_clip
    )
    objective = torch.where(inputs.is_own, own_objective, foreign_obj)
    out = _finish(
        inputs, params, objective, ratio, clipped_own=own_clipped, clipped_foreign=foreign_clipped, weights=weights
    )
    foreign = ~inputs.is_own
    out.metrics["foreign_below_frac"] = _subset_mean((ratio.detach() < lower).float(), foreign)  # s < lo_m
    out.metrics["foreign_above_frac"] = _subset_mean((ratio.detach() > 1.0).float(), foreign)  # s > 1
    out.metrics["foreign_lower_bound"] = torch.tensor(lower)
    out.metrics["rho_foreign_mean"] = _subset_mean(rho.detach(), ~inputs.is_own)
    return out


def grpo_loss(inputs: LossInputs, *, params: AlgorithmParams, step_index: int = 0) -> LossOutput:
    """GRPO's token-level clipped loss over own responses (spec 4; DeepSeekMath arXiv:2402.03300, Eq. 3).

    r_t = exp(logp_t - old_logp_t); per token min(r_t A, clamp(r_t, 1 - eps, 1 + eps) A); token mean per sequence;
    L = -(1/B) sum over sequences [+ kl_coef * KL]. Rows from other agents are an error: GRPO does not share.
    """
    if inputs.behaviour_logp is not None:
        raise ValueError(
            "grpo takes no stale own rows (its ratio is token-level; the behaviour correction is GSPO's "
            "sequence-level form): use trainer.lag=0 or algorithm gspo / hacpo / naive"
        )
    if not bool(inputs.is_own.all()):
        raise ValueError(
            "grpo trains on the learner's own responses only, but the batch has rows from other "
            "agents; use algorithm 'naive' or 'hacpo' to share rollouts"
        )
    keep = inputs.mask.bool()
    log_ratio = torch.where(keep, inputs.logp - inputs.old_logp.detach(), torch.zeros_like(inputs.logp))
    ratio = log_ratio.exp()  # (B, T)
    adv = inputs.adv.to(ratio.dtype).unsqueeze(-1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - params.grpo_eps, 1.0 + params.grpo_eps) * adv
    objective = masked_mean(torch.minimum(unclipped, clipped), keep)  # (B,)
    out = _finish(inputs, params, objective, masked_mean(ratio, keep), clipped_own=None, clipped_foreign=None)
    tokens = keep.sum().clamp(min=1)
    out.metrics["own_clip_frac"] = (((clipped < unclipped) & keep).sum() / tokens).detach()  # token-level here
    return out


def _finish(
    inputs: LossInputs,
    params: AlgorithmParams,
    objective: Tensor,
    ratio: Tensor,
    *,
    clipped_own: Tensor | None,
    clipped_foreign: Tensor | None,
    weights: Tensor | None = None,
) -> LossOutput:
    """Reduce per-sequence objectives to the loss, add the KL term, and collect the shared metrics."""
    is_own = inputs.is_own
    policy_loss = -objective.sum() / inputs.seq_normaliser()
    loss = policy_loss
    metrics: dict[str, Tensor] = {"policy_loss": policy_loss.detach()}
    if params.kl_coef > 0 and inputs.ref_logp is None:
        raise ValueError(
            f"kl_coef={params.kl_coef} needs ref_logp (the frozen reference's log-probs); pass it or "
            "set algorithm.kl_coef=0"
        )
    if inputs.ref_logp is not None:
        kl_seq = masked_mean(k3_kl(inputs.logp, inputs.ref_logp), inputs.mask)  # (B,)
        kl_seq = torch.where(is_own, kl_seq, torch.zeros_like(kl_seq))
        num_own = inputs.num_own if inputs.num_own is not None else is_own.sum().clamp(min=1)
        kl = kl_seq.sum() / num_own
        if params.kl_coef > 0:
            loss = loss + params.kl_coef * kl
        metrics["kl"] = kl.detach()
    metrics["loss"] = loss.detach()
    metrics["num_own"] = is_own.sum().detach()
    metrics["num_foreign"] = (~is_own).sum().detach()
    metrics["own_ratio_mean"] = _subset_mean(ratio.detach(), is_own)
    metrics["foreign_ratio_mean"] = _subset_mean(ratio.detach(), ~is_own)
    metrics["foreign_ratios"] = ratio.detach()[~is_own]  # every foreign row's s: its distribution per update
    if clipped_own is not None:
        metrics["own_clip_frac"] = _subset_mean(clipped_own.float(), is_own)
    if clipped_foreign is not None:
        metrics["foreign_clip_frac"] = _subset_mean(clipped_foreign.float(), ~is_own)
    if weights is not None:  # stale own rows (trainer.lag > 0)
        metrics["behaviour_weight_mean"] = _subset_mean(weights, is_own)
        metrics["behaviour_capped_frac"] = _subset_mean((weights >= params.behaviour_cap).float(), is_own)
    return LossOutput(loss=loss, metrics=metrics)


def _subset_mean(values: Tensor, subset: Tensor) -> Tensor:
    """Mean of `values` over rows in `subset`; 0 for an empty subset (detached, 0-dim)."""
    values = values.detach().float()
    return torch.where(subset, values, torch.zeros_like(values)).sum() / subset.sum().clamp(min=1)


def _check_at_least_one(name: str, values: Tensor, rows: Tensor) -> None:
    """`values` >= 1 (a count) on `rows`."""
    bad = rows & ~(values >= 1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0])
        raise ValueError(f"{name} must be >= 1 on the rows it is read for; row {row} holds {values[row]}")
