"""Bad input raises a ValueError that names the tensor and the problem."""

import dataclasses

import pytest
import torch

from hacrl.core import AlgorithmParams, LossInputs, hacpo_advantages, hacpo_loss
from tests.core.helpers import Row, make_inputs

F64 = torch.float64
CAPS = torch.tensor([0.5, 0.5], dtype=F64)


def adv(rewards, group=None, source=None, learner=0, caps=CAPS, **kwargs):
    rewards = torch.as_tensor(rewards, dtype=F64)
    group = torch.zeros(rewards.shape[0], dtype=torch.long) if group is None else torch.as_tensor(group)
    source = torch.zeros(rewards.shape[0], dtype=torch.long) if source is None else torch.as_tensor(source)
    return hacpo_advantages(rewards, group, source, learner=learner, capabilities=caps, **kwargs)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: adv([1.0, 0.0], group=[0, 0, 0]), "group_ids has 3 entries but the batch has 2"),
        (lambda: adv([1.0, 0.0], source=[0]), "source has 1 entries but the batch has 2"),
        (lambda: adv([1.0, float("nan")]), "rewards contains 1 non-finite value"),
        (lambda: adv([1.0, float("inf")]), "rewards contains 1 non-finite value"),
        (lambda: adv([1.0, 1.5]), r"rewards must lie in \[0, r_max=1.0\], got 1.5 at index 1"),
        (lambda: adv([1.0, -0.1]), r"rewards must lie in \[0, r_max=1.0\], got -0.1 at index 1"),
        (lambda: adv([1.0, 0.0], source=[0, 2]), "source contains unknown agent id 2; valid ids are 0..1"),
        (lambda: adv([1.0, 0.0], learner=5), "learner=5 is not a valid agent id"),
        (lambda: adv([1.0, 0.0], group=[0.0, 1.0]), "group_ids must be an integer tensor"),
        (lambda: adv([[1.0, 0.0]]), r"rewards must be 1-D .* got shape \(1, 2\)"),
        (
            lambda: hacpo_advantages(
                torch.tensor([1, 0]), torch.tensor([0, 0]), torch.tensor([0, 0]), learner=0, capabilities=CAPS
            ),
            "rewards must be a floating tensor",
        ),
    ],
)
def test_bad_advantage_inputs(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_fractional_rewards_with_a_larger_r_max_are_fine():
    out = adv([2.0, 0.5], r_max=2.0, group=[0, 0])
    assert out[0] > 0 > out[1]


ROWS = [
    Row(length=2, new_mean=-1.0, old_mean=-1.0, adv=1.0, source=0),
    Row(length=3, new_mean=-1.0, old_mean=-1.1, adv=-1.0, source=1),
]


def _replace(**changes):
    base = make_inputs(ROWS)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(LossInputs) if f.init}
    fields.update(changes)
    return LossInputs(**fields)


def test_loss_inputs_reject_bad_tensors():
    base = make_inputs(ROWS)
    cases = [
        ({"mask": base.mask[:, :3]}, r"mask has shape \(2, 3\) but the batch's log-probs have shape \(2, 5\)"),
        ({"adv": torch.ones(3, dtype=F64)}, "adv has 3 entries but the batch has 2"),
        ({"source": torch.tensor([0, 3])}, "source contains unknown agent id 3"),
        ({"mask": torch.zeros_like(base.mask).index_fill_(0, torch.tensor([0]), True)}, "mask row 1 selects no token"),
        ({"adv": torch.tensor([1.0, float("nan")], dtype=F64)}, "adv contains 1 non-finite"),
        ({"source_logp_sum": torch.tensor([0.0, float("-inf")], dtype=F64)}, "source_logp_sum contains 1 non-finite"),
        ({"source_num_tokens": torch.tensor([1, 0])}, "source_num_tokens must be >= 1 on the rows it is read for"),
        ({"num_bytes": torch.tensor([1, 0])}, "num_bytes must be >= 1 on the rows it is read for"),
        ({"source_logp_sum": None}, "source_logp_sum and source_num_tokens go together"),
        ({"source_logp_sum": None, "source_num_tokens": None}, "rows of other agents but no source_logp_sum"),
        ({"learner": 2}, "learner=2 is not a valid agent id"),
        ({"num_seqs": 0}, "num_seqs must be a positive int"),
    ]
    for changes, message in cases:
        with pytest.raises(ValueError, match=message):
            _replace(**changes)


def test_non_finite_log_probs_are_rejected_on_response_tokens_only():
    base = make_inputs(ROWS)  # padding already holds -inf / nan: accepted
    logp = base.logp.detach().clone()
    logp[1, 0] = float("nan")
    with pytest.raises(ValueError, match="logp contains 1 non-finite value"):
        _replace(logp=logp)
    old = base.old_logp.clone()
    old[0, 1] = float("inf")
    with pytest.raises(ValueError, match="old_logp contains 1 non-finite value"):
        _replace(old_logp=old)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delta": 1.5}, r"algorithm.delta must be in \[0, 1\]"),
        ({"alpha": -1.0}, "algorithm.alpha must be >= 0"),
        ({"eps_low": 1.0}, r"algorithm.eps_low must be in \[0, 1\)"),
        ({"r_max": 0.0}, "algorithm.r_max must be positive"),
        ({"grpo_eps": 0.0}, r"algorithm.grpo_eps must be in \(0, 1\)"),
    ],
)
def test_bad_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AlgorithmParams(**kwargs)


def test_negative_step_index_is_rejected_by_the_loss():
    with pytest.raises(ValueError, match="step_index must be an int >= 0"):
        hacpo_loss(make_inputs(ROWS), params=AlgorithmParams(), step_index=-1)
