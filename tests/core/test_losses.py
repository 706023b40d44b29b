"""Sequence ratios, clipping and the GRPO / GSPO / naive / HACPO losses (spec 3.4-3.6, 4)."""

import dataclasses
import math

import pytest
import torch

from hacrl.core import (
    AlgorithmParams,
    LossInputs,
    LossOutput,
    foreign_lower_bound,
    foreign_objective,
    grpo_loss,
    gspo_loss,
    gspo_objective,
    hacpo_loss,
    k3_kl,
    sequence_ratio,
)
from tests.core.helpers import Row, grad_of, make_inputs
from tests.core.reference import hacpo_objective_ref

F64 = torch.float64
DEFAULTS = AlgorithmParams()


# --- stepwise lower bound (Eq. 52) -------------------------------------------------------------------------------


def test_lower_bound_rises_by_delta_step_per_mini_batch():
    bounds = [foreign_lower_bound(m, delta=0.2, delta_step=0.025) for m in range(6)]
    assert bounds == pytest.approx([0.8, 0.825, 0.85, 0.875, 0.9, 0.925], abs=1e-15)


def test_lower_bound_is_capped_at_one():
    bounds = [foreign_lower_bound(m, delta=0.1, delta_step=0.05) for m in range(6)]
    assert bounds == pytest.approx([0.9, 0.95, 1.0, 1.0, 1.0, 1.0], abs=1e-15)
    assert max(bounds) == 1.0


def test_static_clipping_keeps_the_bound():
    assert {foreign_lower_bound(m, delta=0.2, delta_step=0.0) for m in range(6)} == {0.8}


def test_lower_bound_rejects_a_negative_index():
    with pytest.raises(ValueError, match="step_index must be an int >= 0"):
        foreign_lower_bound(-1, delta=0.2, delta_step=0.025)


# --- sequence ratio (Eqs. 11, 48) --------------------------------------------------------------------------------


def test_sequence_ratio_is_exp_of_the_mean_log_ratio_and_its_gradient_is_s_over_length():
    logp = torch.tensor([[-1.0, -2.0, -3.0, 0.0], [-0.5, -0.5, 0.0, 0.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    old = torch.tensor([-2.5, -0.25], dtype=F64)
    s = sequence_ratio(logp, mask, old)
    torch.testing.assert_close(s, torch.tensor([math.exp(0.5), math.exp(-0.25)], dtype=F64))
    (grad,) = torch.autograd.grad(s.sum(), logp)
    s0, s1 = s.detach().tolist()
    expected = torch.tensor([[s0 / 3] * 3 + [0.0], [s1 / 2] * 2 + [0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize(("old", "expected"), [(-50.0, math.exp(10.0)), (50.0, math.exp(-10.0)), (-9.0, math.exp(9.0))])
def test_log_ratio_is_clamped_to_plus_minus_ten(old, expected):
    logp = torch.zeros(1, 3, dtype=F64, requires_grad=True)
    s = sequence_ratio(logp, torch.ones(1, 3), torch.tensor([old], dtype=F64))
    torch.testing.assert_close(s, torch.tensor([expected], dtype=F64))
    (grad,) = torch.autograd.grad(s.sum(), logp)
    assert bool((grad == 0).all()) == (abs(old) > 10)  # clamped: constant, no gradient


# --- per-row objectives -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("s", "adv", "value", "clipped"),
    [
        (1.1, 1.0, 1.0004, True),  # above 1 + eps_high with A > 0: capped, no gradient
        (1.1, -1.0, -1.1, False),  # above with A < 0: min takes the unclipped term
        (0.9, -1.0, -0.9997, True),  # below 1 - eps_low with A < 0: capped
        (0.9, 1.0, 0.9, False),  # below with A > 0: unclipped
        (1.0002, 2.0, 2.0004, False),  # inside the window
    ],
)
def test_gspo_objective_min_clip(s, adv, value, clipped):
    ratio = torch.tensor([s], dtype=F64, requires_grad=True)
    obj, was_clipped = gspo_objective(ratio, torch.tensor([adv], dtype=F64), eps_low=3e-4, eps_high=4e-4)
    torch.testing.assert_close(obj, torch.tensor([value], dtype=F64))
    assert bool(was_clipped) == clipped
    (grad,) = torch.autograd.grad(obj.sum(), ratio)
    assert float(grad) == (0.0 if clipped else adv)


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("adv", [1.3, -0.7])
def test_foreign_gradient_inside_the_window_is_rho_a_s_to_the_alpha_plus_one_over_length(alpha, adv):
    logp = torch.tensor([[-0.9, -1.3, -1.1, 0.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0]])
    src_mean = torch.tensor([-1.0], dtype=F64)  # s = exp(-1.1 + 1.0) = 0.905, inside [0.8, 1]
    s = sequence_ratio(logp, mask, src_mean)
    rho = torch.tensor([2.5], dtype=F64)
    obj, clipped = foreign_objective(s, torch.tensor([adv], dtype=F64), rho, lower=0.8, alpha=alpha)
    assert not bool(clipped)
    torch.testing.assert_close(obj, rho * adv * s.detach() ** (alpha + 1))
    (grad,) = torch.autograd.grad(obj.sum(), logp)
    per_token = float(rho) * adv * float(s.detach()) ** (alpha + 1) / 3
    torch.testing.assert_close(grad, torch.tensor([[per_token] * 3 + [0.0]], dtype=F64))


@pytest.mark.parametrize("log_ratio", [0.2, -0.5])  # s = 1.22 above 1, s = 0.61 below lo = 0.8
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_foreign_objective_has_no_gradient_outside_the_window_for_either_sign(log_ratio, adv):
    logp = torch.full((1, 2), -1.0 + log_ratio, dtype=F64, requires_grad=True)
    s = sequence_ratio(logp, torch.ones(1, 2), torch.tensor([-1.0], dtype=F64))
    obj, clipped = foreign_objective(s, torch.tensor([adv], dtype=F64), torch.ones(1, dtype=F64), lower=0.8, alpha=1.0)
    assert bool(clipped)
    bound = 1.0 if log_ratio > 0 else 0.8
    torch.testing.assert_close(obj, torch.tensor([bound * bound * adv], dtype=F64))
    (grad,) = torch.autograd.grad(obj.sum(), logp)
    assert torch.equal(grad, torch.zeros_like(grad))


def test_foreign_clip_off_lets_ratios_above_one_through():
    s = torch.tensor([1.5, 0.5], dtype=F64, requires_grad=True)
    obj, clipped = foreign_objective(
        s, torch.ones(2, dtype=F64), torch.ones(2, dtype=F64), lower=0.8, alpha=1.0, clip=False
    )
    torch.testing.assert_close(obj, torch.tensor([2.25, 0.25], dtype=F64))
    assert not bool(clipped.any())


# --- whole losses ------------------------------------------------------------------------------------------------

MIXED = [
    Row(length=3, new_mean=-1.0, old_mean=-1.0, adv=1.0, source=0),  # own, s = 1
    Row(length=4, new_mean=-0.99, old_mean=-1.0, adv=-0.5, source=0),  # own, s = 1.01 > 1 + eps_high, A < 0
    Row(length=2, new_mean=-1.1, old_mean=-1.0, adv=1.0, source=1),  # foreign, s = 0.905 inside [0.825, 1]
    Row(length=5, new_mean=-1.5, old_mean=-1.0, adv=-1.0, source=1),  # foreign, s = 0.607 below: clamped
    Row(length=3, new_mean=-0.8, old_mean=-1.0, adv=2.0, source=2),  # foreign, s = 1.22 above 1: clamped
]
CAPS = (0.3, 0.6, 0.15)  # rho from source 1 = 2, from source 2 = 0.5 (learner 0)


def _expected(rows, params, step_index, caps=CAPS, learner=0):
    lower = foreign_lower_bound(step_index, delta=params.delta, delta_step=params.delta_step)
    objectives, grads = [], []
    for r in rows:
        s = math.exp(r.new_mean - r.old_mean)
        own = r.source == learner
        rho = 1.0 if own or not params.capability_coef else min(10, max(0.1, caps[r.source] / caps[learner]))
        objectives.append(
            hacpo_objective_ref(
                s,
                r.adv,
                own=own,
                rho=rho,
                lower=lower,
                alpha=params.alpha,
                eps_low=params.eps_low,
                eps_high=params.eps_high,
                clip=params.foreign_clip,
            )
        )
        if own:
            inside = not (min(s * r.adv, min(1 + params.eps_high, max(1 - params.eps_low, s)) * r.adv) < s * r.adv)
            g = r.adv * s if inside else 0.0
        else:
            inside = lower <= s <= 1.0 or not params.foreign_clip
            g = rho * r.adv * s ** (params.alpha + 1) if inside else 0.0
        grads.append(-g / len(rows) / r.length)  # d loss / d logp_t, the same for every token of the row
    return -sum(objectives) / len(rows), grads


@pytest.mark.parametrize("step_index", [0, 1, 3])
def test_hacpo_loss_and_gradient_hand_computed_on_a_mixed_batch(step_index):
    inputs = make_inputs(MIXED, capabilities=CAPS)
    out = hacpo_loss(inputs, params=DEFAULTS, step_index=step_index)
    expected_loss, expected_grads = _expected(MIXED, DEFAULTS, step_index)
    torch.testing.assert_close(out.loss, torch.tensor(expected_loss, dtype=F64))
    grad = grad_of(out, inputs)
    for i, r in enumerate(MIXED):
        torch.testing.assert_close(grad[i, : r.length], torch.full((r.length,), expected_grads[i], dtype=F64))
        assert torch.equal(grad[i, r.length :], torch.zeros_like(grad[i, r.length :]))
    m = out.metrics
    assert int(m["num_own"]) == 2 and int(m["num_foreign"]) == 3
    assert float(m["own_clip_frac"]) == 0.0  # row 1 has A < 0 and s > 1: the unclipped term is the smaller
    assert float(m["foreign_clip_frac"]) == pytest.approx(2 / 3)
    assert float(m["foreign_below_frac"]) == pytest.approx(1 / 3)  # row 3, s = 0.61
    assert float(m["foreign_above_frac"]) == pytest.approx(1 / 3)  # row 4, s = 1.22
    assert float(m["foreign_lower_bound"]) == pytest.approx(0.8 + 0.025 * step_index)
    assert float(m["rho_foreign_mean"]) == pytest.approx((2 + 2 + 0.5) / 3)
    assert float(m["foreign_ratio_mean"]) == pytest.approx((math.exp(-0.1) + math.exp(-0.5) + math.exp(0.2)) / 3)


@pytest.mark.parametrize(
    "params",
    [
        AlgorithmParams(capability_coef=False),
        AlgorithmParams(alpha=0.0),
        AlgorithmParams(alpha=2.0, delta=0.5, delta_step=0.1),
        AlgorithmParams(foreign_clip=False),
    ],
    ids=["rho-off", "alpha-0", "alpha-2", "clip-off"],
)
def test_hacpo_ablations_hand_computed(params):
    inputs = make_inputs(MIXED, capabilities=CAPS)
    out = hacpo_loss(inputs, params=params, step_index=2)
    expected_loss, expected_grads = _expected(MIXED, params, 2)
    torch.testing.assert_close(out.loss, torch.tensor(expected_loss, dtype=F64))
    grad = grad_of(out, inputs)
    torch.testing.assert_close(grad[:, 0], torch.tensor(expected_grads, dtype=F64))


def test_stronger_source_speaks_louder_rho_direction():
    rows = [Row(length=2, new_mean=-1.05, old_mean=-1.0, adv=1.0, source=1)]
    weak_learner = hacpo_loss(make_inputs(rows, capabilities=(0.2, 0.8)), params=DEFAULTS, step_index=0)
    strong_learner = hacpo_loss(make_inputs(rows, capabilities=(0.8, 0.2)), params=DEFAULTS, step_index=0)
    assert float(weak_learner.metrics["rho_foreign_mean"]) == 4.0
    assert float(strong_learner.metrics["rho_foreign_mean"]) == 0.25
    torch.testing.assert_close(weak_learner.loss, 16 * strong_learner.loss)


def test_foreign_objective_reduces_to_sequence_importance_sampling():
    """Equal capabilities, alpha 0, delta 1, delta_step 0, clipping off: objective = s * A."""
    params = AlgorithmParams(alpha=0.0, delta=1.0, delta_step=0.0, foreign_clip=False)
    rows = [r for r in MIXED if r.source != 0]
    inputs = make_inputs(rows, capabilities=(0.4, 0.4, 0.4))
    out = hacpo_loss(inputs, params=params, step_index=4)
    s = torch.tensor([math.exp(r.new_mean - r.old_mean) for r in rows], dtype=F64)
    adv = torch.tensor([r.adv for r in rows], dtype=F64)
    torch.testing.assert_close(out.loss, -(s * adv).mean())
    grad = grad_of(out, inputs)
    for i, r in enumerate(rows):
        torch.testing.assert_close(
            grad[i, : r.length], torch.full((r.length,), float(-s[i] * adv[i] / 3 / r.length), dtype=F64)
        )


def test_own_rows_in_hacpo_get_exactly_gspos_loss_and_gradient():
    own = [r for r in MIXED if r.source == 0] + [Row(length=6, new_mean=-2.0, old_mean=-2.0003, adv=0.3, source=0)]
    for step_index in (0, 5):
        a, b = make_inputs(own, capabilities=CAPS), make_inputs(own, capabilities=CAPS)
        h = hacpo_loss(a, params=DEFAULTS, step_index=step_index)
        g = gspo_loss(b, params=DEFAULTS)
        assert torch.equal(h.loss, g.loss)
        assert torch.equal(grad_of(h, a), grad_of(g, b))


def test_naive_treats_foreign_rows_like_own_ones_against_their_source():
    inputs = make_inputs(MIXED, capabilities=CAPS)
    out = gspo_loss(inputs, params=DEFAULTS)
    expected = []
    for r in MIXED:
        s = math.exp(r.new_mean - r.old_mean)
        expected.append(min(s * r.adv, min(1 + 4e-4, max(1 - 3e-4, s)) * r.adv))
    torch.testing.assert_close(out.loss, torch.tensor(-sum(expected) / len(MIXED), dtype=F64))
    # rows 2 (s 0.905, A > 0) and 3 (s 0.607, A < 0) and 4 (s 1.22, A > 0): only row 2 keeps its gradient
    assert float(out.metrics["foreign_clip_frac"]) == pytest.approx(2 / 3)


def test_grpo_token_level_clip_hand_computed():
    logp = torch.tensor([[0.5, -0.1, 9.0]], dtype=F64, requires_grad=True)
    inputs = make_inputs([Row(length=2, new_mean=0.0, old_mean=0.0, adv=1.0, source=0)])
    inputs = type(inputs)(
        logp=logp,
        mask=torch.tensor([[1, 1, 0]]),
        old_logp=torch.zeros(1, 3, dtype=F64),
        adv=torch.ones(1, dtype=F64),
        source=torch.zeros(1, dtype=torch.long),
        learner=0,
        capabilities=torch.ones(1, dtype=F64),
    )
    out = grpo_loss(inputs, params=DEFAULTS)
    # token ratios e^0.5 = 1.65 (clipped to 1.2, A > 0) and e^-0.1 = 0.905 (kept); token mean, one sequence
    torch.testing.assert_close(out.loss, torch.tensor(-(1.2 + math.exp(-0.1)) / 2, dtype=F64))
    grad = grad_of(out, inputs)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -math.exp(-0.1) / 2, 0.0]], dtype=F64))
    assert float(out.metrics["own_clip_frac"]) == 0.5


def test_grpo_refuses_foreign_rows():
    with pytest.raises(ValueError, match="grpo trains on the learner's own responses only"):
        grpo_loss(make_inputs(MIXED, capabilities=CAPS), params=DEFAULTS)


# --- KL (spec 3.6) -----------------------------------------------------------------------------------------------


def test_k3_kl_hand_value():
    kl = k3_kl(torch.tensor([math.log(0.5)], dtype=F64), torch.tensor([math.log(0.25)], dtype=F64))
    torch.testing.assert_close(kl, torch.tensor([0.5 - math.log(0.5) - 1], dtype=F64))


def test_kl_is_averaged_over_own_rows_only():
    shift = math.log(0.5)  # ref = logp + log 0.5 on every token: k3 = 0.5 - log 0.5 - 1 per token
    per_token = 0.5 - shift - 1
    inputs = make_inputs(MIXED, capabilities=CAPS, ref_shift=shift)
    no_kl = hacpo_loss(make_inputs(MIXED, capabilities=CAPS), params=DEFAULTS, step_index=0)
    out = hacpo_loss(inputs, params=AlgorithmParams(kl_coef=0.1), step_index=0)
    assert float(out.metrics["kl"]) == pytest.approx(per_token)  # 2 own rows of 5: not halved by the foreign ones
    torch.testing.assert_close(out.loss, no_kl.loss + 0.1 * per_token)


def test_kl_coef_without_reference_is_an_error():
    with pytest.raises(ValueError, match="kl_coef=0.1 needs ref_logp"):
        gspo_loss(make_inputs(MIXED[:2]), params=AlgorithmParams(kl_coef=0.1))


# --- micro-batches, outputs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_fn", [hacpo_loss, gspo_loss])
def test_gradient_accumulation_over_micro_batches_equals_the_mini_batch(loss_fn):
    params = AlgorithmParams(kl_coef=0.05)
    full = make_inputs(MIXED, capabilities=CAPS, ref_shift=-0.2)
    full_grad = grad_of(loss_fn(full, params=params, step_index=1), full)
    total = torch.zeros_like(full_grad)
    for rows in ([0, 2], [1, 3, 4]):
        sub = [MIXED[i] for i in rows]
        micro = make_inputs(sub, capabilities=CAPS, ref_shift=-0.2, num_seqs=5, num_own=2)
        with torch.no_grad():  # same per-token values as the full batch's rows
            for j, i in enumerate(rows):
                micro.logp[j, : MIXED[i].length] = full.logp[i, : MIXED[i].length]
                micro.old_logp[j] = full.old_logp[i, : micro.old_logp.shape[1]]
                micro.ref_logp[j] = full.ref_logp[i, : micro.ref_logp.shape[1]]
        grad = grad_of(loss_fn(micro, params=params, step_index=1), micro)
        for j, i in enumerate(rows):
            total[i, : MIXED[i].length] += grad[j, : MIXED[i].length]
    torch.testing.assert_close(total, full_grad)


@pytest.mark.parametrize("loss_fn", [hacpo_loss, gspo_loss])
def test_losses_return_named_detached_results_without_item(loss_fn, monkeypatch):
    def no_item(self):
        raise AssertionError("the core must not call .item()")

    inputs = make_inputs(MIXED, capabilities=CAPS, ref_shift=0.1)
    monkeypatch.setattr(torch.Tensor, "item", no_item)
    out = loss_fn(inputs, params=AlgorithmParams(kl_coef=0.01), step_index=0)
    assert isinstance(out, LossOutput)
    assert out.loss.dim() == 0 and out.loss.requires_grad
    for name, value in out.metrics.items():
        assert value.dim() == (1 if name == "foreign_ratios" else 0) and not value.requires_grad, name


# -- foreign ratio normalisations across tokenizers (spec 3.4b) --------------------------------------------------------


def _two_row_inputs():
    """Row 0 own (2 tokens, unchanged policy); row 1 foreign: the learner's log-probs -1, -2 over its 2 tokens
    (S_k = -3, n_k = 2); the source's sum S_src = -6 over n_src = 3 tokens; the text is b = 4 bytes. The own row's
    source fields are not read (NaN / 0 here)."""
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    inputs = LossInputs(
        logp=logp,
        mask=torch.ones(2, 2, dtype=torch.bool),
        old_logp=torch.full((2, 2), -1.0, dtype=torch.float64),
        adv=torch.tensor([0.0, 1.0], dtype=torch.float64),
        source=torch.tensor([0, 1]),
        learner=0,
        capabilities=torch.tensor([0.5, 0.5]),
        source_logp_sum=torch.tensor([float("nan"), -6.0], dtype=torch.float64),
        source_num_tokens=torch.tensor([0, 3]),
        num_bytes=torch.tensor([0, 4]),
    )
    return inputs, logp


@pytest.mark.parametrize(
    ("mode", "log_s", "grad_per_token"),
    [
        ("source_mean", -1.5 - (-6.0 / 3), 1 / 2),  # S_k/n_k - S_src/n_src = 0.5; d log s / d logp_t = 1/n_k
        ("learner_length", (-3.0 + 6.0) / 2, 1 / 2),  # (S_k - S_src)/n_k = 1.5
        ("bytes", (-3.0 + 6.0) / 4, 1 / 4),  # (S_k - S_src)/b = 0.75; the paper's gradient times n_k / b
    ],
)
def test_the_foreign_ratio_under_each_normalisation_hand_computed(mode, log_s, grad_per_token):
    inputs, logp = _two_row_inputs()
    params = AlgorithmParams(foreign_clip=False, alpha=0.0, capability_coef=False, foreign_ratio=mode)
    out = hacpo_loss(inputs, params=params, step_index=0)
    s = math.exp(log_s)
    assert out.metrics["foreign_ratios"].tolist() == pytest.approx([s], abs=1e-12)
    out.loss.backward()
    # loss = -(own objective + s * A) / 2 with A = 1 on the foreign row: d/d logp_t = -s * grad_per_token / 2
    assert logp.grad[1].tolist() == pytest.approx([-s * grad_per_token / 2] * 2, abs=1e-12)
    assert logp.grad[0].abs().sum() == 0  # the own row has A = 0


def test_learner_length_equals_source_mean_when_the_tokenizations_agree():
    from hacrl.core.ratios import foreign_terms

    g = torch.Generator().manual_seed(0)
    sums = -torch.rand(50, generator=g, dtype=torch.float64) * 30
    counts = torch.randint(1, 40, (50,), generator=g).double()
    bytes_ = counts * 2
    a, _ = foreign_terms(sums, counts, counts, bytes_, "source_mean")
    b, _ = foreign_terms(sums, counts, counts, bytes_, "learner_length")
    assert torch.equal(a, b)


def test_the_bytes_normalisation_needs_the_byte_counts():
    inputs, _ = _two_row_inputs()
    inputs = dataclasses.replace(inputs, num_bytes=None)
    with pytest.raises(ValueError, match="foreign_ratio=bytes needs num_bytes"):
        hacpo_loss(inputs, params=AlgorithmParams(foreign_ratio="bytes"), step_index=0)
    hacpo_loss(inputs, params=AlgorithmParams(foreign_ratio="learner_length"), step_index=0)  # the others do not


def test_an_unknown_foreign_ratio_mode_is_rejected():
    with pytest.raises(ValueError, match="algorithm.foreign_ratio must be source_mean, learner_length or bytes"):
        AlgorithmParams(foreign_ratio="chars")
