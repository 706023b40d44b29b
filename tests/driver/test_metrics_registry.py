"""The metric registry (`hacrl.driver.metrics`): every metric a loss reports is declared, keys parse back to their
metric, and an undeclared metric of a user's own loss is reduced, never a crash."""

from __future__ import annotations

import pytest
import torch

from hacrl.core import ALGORITHMS, AlgorithmParams
from hacrl.core.metrics import METRIC_KINDS, MetricReducer
from hacrl.driver.metrics import AGENT, agent_key, eval_key, parse, unknown_keys
from tests.core.helpers import Row, make_inputs

MIXED = [
    Row(length=2, new_mean=-1.0, old_mean=-1.1, adv=1.0, source=0),
    Row(length=3, new_mean=-1.0, old_mean=-0.8, adv=-1.0, source=1),
]


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_loss_metric_is_declared_with_its_reduction_and_registered(name):
    algorithm = ALGORITHMS[name]
    rows = MIXED if name != "grpo" else MIXED[:1]
    inputs = make_inputs(rows, capabilities=(0.5, 0.5), ref_shift=0.1)
    out = algorithm.loss(inputs, params=AlgorithmParams(kl_coef=0.1), step_index=0)
    undeclared = sorted(set(out.metrics) - set(METRIC_KINDS))
    assert undeclared == [], f"declare their kind in hacrl.core.metrics.METRIC_KINDS: {undeclared}"
    reducer = MetricReducer()
    reducer.add(out.metrics)
    reducer.end_mini_batch()
    reducer.add({"grad_norm": torch.tensor(1.0)})  # stands in for any key the trainer adds itself
    logged = {agent_key("llama", key): value for key, value in reducer.result().items()}
    assert unknown_keys(logged) == []
    for key in METRIC_KINDS:  # the declared kind and the registry's agree
        if METRIC_KINDS[key] != "count":
            registered = parse(agent_key("a", key if METRIC_KINDS[key] != "values" else "foreign_ratio_p50"))
            assert registered is not None and registered[2].kind == METRIC_KINDS[key], key


def test_an_undeclared_metric_is_averaged_not_an_error():
    reducer = MetricReducer()
    reducer.add({"my_metric": torch.tensor(1.0)})
    reducer.add({"my_metric": torch.tensor(3.0)})
    reducer.end_mini_batch()
    assert reducer.result() == {"my_metric": 2.0}


def test_keys_parse_back_to_their_metric():
    assert parse(agent_key("qwen-bpe", "rho/llama-char"))[:2] == ("agent", "qwen-bpe")
    assert parse(eval_key("llama", "avg@16"))[2].name == "avg@{k}"
    assert parse("time/scoring")[0] == "step"
    assert parse("llama/time/generate")[:2] == ("agent", "llama")
    assert parse(agent_key("llama", "foreign_ratio_p90"))[2].kind == "values"
    assert unknown_keys({"step": 3, "llama/reward_mean": 0.1, "llama/typo_mean": 1.0, "eval/x/nope": 0}) == [
        "llama/typo_mean",
        "eval/x/nope",
    ]
    assert all(metric.doc for metric in AGENT.values())
