"""The update loop both trainers share (`hacrl.learner.update`): `trainer.zero_grad_step`, on the loop alone and on
the real learner path of `hacrl train` and `hacrl control`, exact across a resume."""

from __future__ import annotations

import copy

import pytest
import torch

from hacrl.learner import update
from tests.conftest import assert_resumes_exactly, records, write_config


def _two_steps(skip_zero: bool):
    """A linear model stepped by AdamW on a mini-batch with a gradient, then on one whose gradient is exactly 0."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(4, 3)
    states = []

    def backward(m, scale, reducer):
        (model(x).pow(2).sum() * scale).backward()
        reducer.add({"loss": torch.tensor(float(scale))})

    def stepped():
        states.append((copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())))

    metrics = update(optimizer, enumerate([1.0, 0.0]), backward,
                     lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0), stepped,
                     skip_zero=skip_zero)  # fmt: skip
    return model, optimizer, states, metrics


def test_a_zero_gradient_is_stepped_by_default_and_skipped_with_skip():
    model, optimizer, states, metrics = _two_steps(skip_zero=False)
    assert metrics["optimizer_steps"] == 2 and "zero_grad_skipped" not in metrics
    after_first = states[0][0]
    assert not torch.equal(model.weight, after_first["weight"])  # AdamW's momentum moved it on a zero gradient

    model, optimizer, states, metrics = _two_steps(skip_zero=True)
    assert metrics["optimizer_steps"] == 1 and metrics["zero_grad_skipped"] == 1 and metrics["skipped_steps"] == 0
    weights, state = states[0]
    assert torch.equal(model.weight, weights["weight"]) and torch.equal(model.bias, weights["bias"])
    now = optimizer.state_dict()["state"]
    for key, value in state["state"].items():  # the step count and both moments as after the first step
        assert all(torch.equal(torch.as_tensor(value[k]), torch.as_tensor(now[key][k])) for k in value)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.slow
def test_skip_leaves_every_all_clipped_foreign_mini_batch_unstepped_and_resumes_exactly(tiny_agents, tmp_path):
    """`hacrl train` with a window of one point (delta 0: every foreign ratio but exactly 1 is clipped): each
    learner's two foreign mini-batches have a zero gradient and are skipped, its two own ones stepped; `take` steps
    all four. A run stopped a step early and resumed ends as the straight one."""

    def make(run, mode="skip"):
        return write_config(run.with_suffix(".yaml"), tiny_agents, ["llama", "qwen"], run,
                            algorithm={"name": "hacpo", "delta": 0.0, "delta_step": 0.0},
                            trainer={"steps": 3, "zero_grad_step": mode},
                            scoring={"function": "tests.reward_fixtures:digits"})  # fmt: skip

    full, _ = assert_resumes_exactly(make, tmp_path, steps=3)
    for record in records(full):
        for name in ("llama", "qwen"):
            assert record[f"{name}/foreign_clip_frac"] == 1.0
            assert record[f"{name}/zero_grad_skipped"] == 2 and record[f"{name}/optimizer_steps"] == 2
    from hacrl.tools.cli import main

    taken = tmp_path / "take"
    assert main(["train", str(make(taken, "take"))]) == 0
    assert [r["llama/optimizer_steps"] for r in records(taken)] == [4, 4, 4]
    assert "llama/zero_grad_skipped" not in records(taken)[-1]
