"""Stale own rows (`trainer.lag` > 0, docs/design.md "Stale own rows"): an own row sampled by weights older than
those its update starts from is clipped around the proximal policy (`old_logp`) and weighted by the truncated
behaviour ratio w = min(exp(l_prox - l_behav), behaviour_cap), sequence-level means; foreign rows are unchanged.
Hand-computed values; behaviour = proximal gives today's loss bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from hacrl.core import LossInputs, get_algorithm
from hacrl.core.params import AlgorithmParams
from hacrl.core.ratios import behaviour_weight

MASK = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]], dtype=torch.bool)


def _inputs(behaviour=None, *, source=(0, 0, 0, 1), logp=None) -> LossInputs:
    old = torch.tensor([[-1.0, -1.2], [-0.5, -0.7], [-2.0, 0.0], [-1.0, -1.0]], dtype=torch.float64)
    logp = (old.clone() if logp is None else logp).requires_grad_(True)
    return LossInputs(
        logp=logp,
        mask=MASK,
        old_logp=old,
        adv=torch.tensor([1.0, -0.5, 2.0, 1.5]),
        source=torch.tensor(source),
        learner=0,
        capabilities=torch.tensor([0.5, 0.5], dtype=torch.float64),
        source_logp_sum=torch.tensor([0.0, 0.0, 0.0, -2.0], dtype=torch.float64),
        source_num_tokens=torch.tensor([1, 1, 1, 2]),
        num_bytes=torch.tensor([1, 1, 1, 4]),
        behaviour_logp=behaviour,
    )


def _loss(name: str, inputs: LossInputs, **params):
    out = get_algorithm(name).loss(inputs, params=AlgorithmParams(**params), step_index=0)
    out.loss.backward()
    return out, inputs.logp.grad.clone()


@pytest.mark.parametrize("name", ["gspo", "hacpo", "naive"])
def test_behaviour_equal_to_proximal_gives_todays_loss_and_gradient_exactly(name):
    source = (0, 0, 0, 0) if name == "gspo" else (0, 0, 0, 1)
    base, base_grad = _loss(name, _inputs(source=source))
    same = _inputs(source=source)
    stale, stale_grad = _loss(name, _inputs(same.old_logp.clone(), source=source))
    assert stale.loss.item() == base.loss.item()
    assert torch.equal(stale_grad, base_grad)
    assert stale.metrics["behaviour_weight_mean"].item() == 1.0
    assert "behaviour_weight_mean" not in base.metrics


def test_stale_own_rows_are_weighted_by_the_truncated_behaviour_ratio_hand_computed():
    # logp = old (proximal): every own s = 1, inside the clip, objective = w A. Behaviour log-probs per row:
    # row 0: mean(prox) - mean(behav) = -1.1 - (-1.6) = 0.5 -> w = e^0.5; row 1: -0.6 - 0.4 = -1.0 -> w = e^-1;
    # row 2 (one token): -2.0 - (-4.0) = 2 -> e^2 = 7.39, capped at 2. Row 3 is foreign: unchanged.
    behav = torch.tensor([[-1.5, -1.7], [0.5, 0.3], [-4.0, 99.0], [-7.0, -7.0]], dtype=torch.float64)
    out, grad = _loss("hacpo", _inputs(behav), behaviour_cap=2.0)
    w = [math.exp(0.5), math.exp(-1.0), 2.0]
    adv = [1.0, -0.5, 2.0]
    # the foreign row: s = exp(mean(logp) - S_src/n_src) = exp(-1 + 1) = 1, inside [0.8, 1]: s * s^1 * rho(=1) * A
    own_part = sum(wi * ai for wi, ai in zip(w, adv, strict=True))
    expected = -(own_part + 1.5) / 4
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    assert out.metrics["behaviour_weight_mean"].item() == pytest.approx(sum(w) / 3, rel=1e-6)
    assert out.metrics["behaviour_capped_frac"].item() == pytest.approx(1 / 3)
    # d loss / d logp_t of own row i = -w_i A_i s / |y_i| / B (s = 1): row 0's two tokens, row 2's one
    assert grad[0, 0].item() == pytest.approx(-w[0] * adv[0] / 2 / 4, rel=1e-9)
    assert grad[2, 0].item() == pytest.approx(-w[2] * adv[2] / 1 / 4, rel=1e-9)
    assert grad[2, 1].item() == 0.0  # masked
    # the foreign row: rho A s^(alpha+1) / |y| / B = 1.5 / 2 / 4 (sg(s)^alpha is constant), whatever its behaviour
    assert grad[3, 0].item() == pytest.approx(-1.5 / 2 / 4, rel=1e-9)


def test_the_foreign_rows_do_not_read_the_behaviour_log_probs():
    behav = torch.tensor([[-1.0, -1.2], [-0.5, -0.7], [-2.0, 0.0], [-50.0, 3.0]], dtype=torch.float64)
    other = behav.clone()
    other[3] = torch.tensor([0.0, -9.0], dtype=torch.float64)
    a, ga = _loss("hacpo", _inputs(behav))
    b, gb = _loss("hacpo", _inputs(other))
    assert a.loss.item() == b.loss.item() and torch.equal(ga, gb)


def test_clipping_is_around_the_proximal_policy_not_the_behaviour_one():
    # logp moved past 1 + eps_high against the proximal policy on row 0: clipped (no gradient for A > 0), whatever
    # the behaviour policy was
    logp = torch.tensor([[-0.9, -1.1], [-0.5, -0.7], [-2.0, 0.0], [-1.0, -1.0]], dtype=torch.float64)
    behav = torch.tensor([[-0.9, -1.1], [-0.5, -0.7], [-2.0, 0.0], [-1.0, -1.0]], dtype=torch.float64)
    out, grad = _loss("gspo", _inputs(behav, source=(0, 0, 0, 0), logp=logp))
    assert out.metrics["own_clip_frac"].item() == pytest.approx(0.25)
    assert grad[0].abs().sum().item() == 0.0


def test_behaviour_weight_is_one_on_identical_log_probs_and_capped_above():
    x = torch.randn(5, 7, dtype=torch.float64)
    mask = torch.rand(5, 7) > 0.3
    mask[:, 0] = True
    assert torch.equal(behaviour_weight(x, x.clone(), mask, cap=2.0), torch.ones(5, dtype=torch.float64))
    assert behaviour_weight(x, x - 5.0, mask, cap=3.0).tolist() == [3.0] * 5


def test_grpo_refuses_stale_rows_and_the_registry_says_so():
    inputs = _inputs(torch.zeros(4, 2, dtype=torch.float64), source=(0, 0, 0, 0))
    with pytest.raises(ValueError, match="grpo takes no stale own rows"):
        get_algorithm("grpo").loss(inputs, params=AlgorithmParams(), step_index=0)
    assert not get_algorithm("grpo").takes_stale_rows
    assert all(get_algorithm(n).takes_stale_rows for n in ("gspo", "naive", "hacpo"))


def test_a_behaviour_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="behaviour_cap must be >= 1"):
        AlgorithmParams(behaviour_cap=0.5)
