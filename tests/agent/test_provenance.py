"""The log-prob plan (`hacrl.provenance`): which log-probs each own row carries, from whom and when, for the settings
that change it; and the learner taking a proximal pass by row index."""

from __future__ import annotations

import pytest
import torch

from hacrl.config import AgentConfig, AlgorithmConfig, RolloutConfig, TrainerConfig
from hacrl.messages import WorkerSpec
from hacrl.provenance import LogprobPlan, ProximalLogprobs

PASS, REPORT, NONE = "the learner's pass at sampling", "the sampler's report", "none"
FORWARD = "the training forward"


def plan(*, algorithm="hacpo", agents=2, lag=0, old_logprobs="recompute", mini_batch=4, **agent) -> LogprobPlan:
    trainer = TrainerConfig(lag=lag, old_logprobs=old_logprobs, mini_batch_size=mini_batch)
    spec = WorkerSpec(0, AgentConfig(name="a", model="m", **agent), RolloutConfig(), trainer,
                      AlgorithmConfig(name=algorithm), num_agents=agents)  # fmt: skip
    return LogprobPlan.of(spec)


def table(p: LogprobPlan, count: int) -> list[tuple[str, str]]:
    return [(s.behaviour, s.proximal) for s in p.sources(count)]


def test_at_lag_0_the_first_mini_batch_trains_on_its_forward_and_the_rest_on_the_sampling_pass():
    shared = plan()  # hacpo with two agents: the others read every row's log-prob sum
    assert shared.at_sampling(6) == [0, 1, 2, 3, 4, 5] and shared.proximal_rows(6) == range(0)
    assert table(shared, 6) == [(PASS, FORWARD)] * 4 + [(PASS, PASS)] * 2
    alone = plan(algorithm="gspo", agents=1)  # nobody reads the sums: only the rows after the first mini-batch
    assert alone.at_sampling(6) == [4, 5]
    assert table(alone, 6) == [(NONE, FORWARD)] * 4 + [(PASS, PASS)] * 2
    assert plan(algorithm="gspo", agents=1, old_logprobs="sampler").at_sampling(6) == [4, 5]
    assert table(plan(algorithm="gspo", agents=1, old_logprobs="sampler"), 6)[4] == (REPORT, REPORT)
    corrected = plan(old_logprobs="corrected", lag=0)
    assert corrected.weighs_behaviour and corrected.at_sampling(6) == [4, 5]
    assert table(corrected, 6) == [(REPORT, FORWARD)] * 4 + [(REPORT, PASS)] * 2
    assert not shared.weighs_behaviour


@pytest.mark.parametrize(
    ("agent", "by"),
    [
        ({}, "learner"),  # one worker: its own process makes the pass before its update
        ({"sampler_devices": ["cpu"]}, "sampler"),  # a sampler of its own, while the first mini-batch trains
        ({"sampler_devices": ["cpu"], "devices": ["cpu", "cpu"]}, "learner"),  # a worker group's ranks make theirs
        ({"frozen": True}, "none"),  # learns nothing
    ],
)
def test_a_lagged_update_takes_its_proximal_pass_from_the_one_the_plan_names(agent, by):
    p = plan(lag=1, **agent)
    assert p.proximal_by == by and p.weighs_behaviour
    assert p.at_sampling(6) == list(range(6))  # every row's behaviour: the update starts from other weights
    assert p.proximal_rows(6) == (range(4, 6) if by != "none" else range(0))
    assert p.proximal_rows(3) == range(0)  # one mini-batch: nothing to compute
    who = {"learner": "the learner's", "sampler": "its sampler's"}.get(by)
    assert table(p, 6)[4:] == [(PASS, f"{who} pass when the update starts" if who else NONE)] * 2
    assert table(p, 6)[:4] == [(PASS, FORWARD)] * 4


def test_the_learner_takes_a_proximal_pass_by_row_index_and_refuses_one_for_other_rows():
    from hacrl.agent.exchange import LearnerRow
    from hacrl.agent.learning import _take_proximal

    def row(source: int) -> LearnerRow:
        return LearnerRow([1], [2, 3], source, 0, 1.0, None, False)

    rows = [row(0), row(0), row(0), row(1)]  # three own rows, then a foreign one
    _take_proximal("a", 0, 3, rows, ProximalLogprobs(5, [1, 2], [[-0.5, -1.0], [-2.0, -0.25]]))
    assert rows[0].old_logp is None and rows[3].old_logp is None
    assert rows[1].old_logp.tolist() == [-0.5, -1.0] and rows[2].old_logp.tolist() == [-2.0, -0.25]
    with pytest.raises(RuntimeError, match="own rows"):  # the pool does not start with the three own rows
        _take_proximal("a", 0, 3, [row(0), row(1), row(0), row(0)], ProximalLogprobs(5, [2], [[-1.0, -1.0]]))
    with pytest.raises(RuntimeError, match="names rows"):
        _take_proximal("a", 0, 3, rows, ProximalLogprobs(5, [3], [[-1.0, -1.0]]))
    with pytest.raises(ValueError, match="non-finite"):
        _take_proximal("a", 0, 3, rows, ProximalLogprobs(5, [1], [[float("nan"), -1.0]]))
    assert torch.equal(rows[1].old_logp, torch.tensor([-0.5, -1.0]))
