"""`hacrl plan --devices N` (issue 58, 3): the time model on GPUs places the agents (more devices for the slower
one, FSDP2 where one device is too small) and proposes budgets; a model, each constant with its source."""

from __future__ import annotations

import pytest

from hacrl.config import load_config
from hacrl.tools.placement import DECODE_BYTES_PER_S, TRAIN_FLOPS_PER_S, modelled_costs, place
from tests.conftest import write_config


def _config(tiny_agents, tmp_path, **sections):
    sections.setdefault("rollout", {"group_size": 4, "max_new_tokens": 64, "max_prompt_tokens": 96, "batch_size": 8})
    return load_config(write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run",
                                    **sections))  # fmt: skip


def test_the_modelled_costs_by_hand(tiny_agents, tmp_path):
    """With 8 rows per call: a decode step reads the weights and 8 rows x (p + L/2) positions of keys and values;
    an answer costs L steps / 8 rows; a trained row 6 x parameters x (p + L) FLOPs. On K = 2 devices both halve."""
    from hacrl.tools.plan import plan

    config = _config(tiny_agents, tmp_path)
    one, two = (modelled_costs(config, [k, 1], 80) for k in (1, 2))
    (p, _) = plan(config, device_memory=80)
    prompt, length = 96, 64  # the prompt limit is below PROMPT_TOKENS
    step = (p.shape.params * p.shape.dtype_bytes + 8 * (prompt + length / 2) * p.shape.kv_bytes_per_token) / (
        DECODE_BYTES_PER_S
    )
    assert one.per_answer[0] == pytest.approx(length * step / 8)
    assert one.per_row[0] == pytest.approx(6 * p.shape.params * (prompt + length) / TRAIN_FLOPS_PER_S)
    assert two.per_answer[0] == pytest.approx(one.per_answer[0] / 2) and two.per_row[0] == pytest.approx(
        one.per_row[0] / 2
    )
    assert two.per_answer[1] == one.per_answer[1]


def test_the_slower_agent_gets_the_devices_and_a_frozen_one_learns_nothing(tiny_agents, tmp_path):
    """qwen (2.4x llama's parameters here) is the slower one: of 3 devices it gets 2; with llama frozen its rows
    cost nothing to train."""
    config = _config(tiny_agents, tmp_path)
    tried, chosen = place(config, 3, 80)
    assert chosen.devices == [1, 2] and tried[0][0] == [1, 2]
    assert [s for s, _ in tried] == sorted([s for s, _ in tried], key=lambda s: next(p.step for t, p in tried
                                                                                     if t == s))  # fmt: skip
    frozen = _config(tiny_agents, tmp_path)
    frozen.agents[0].frozen = True
    assert modelled_costs(frozen, [1, 1], 80).per_row[0] == 0.0


@pytest.mark.slow
def test_plan_devices_prints_the_split_and_the_settings(tiny_agents, tmp_path, capsys):
    from hacrl.tools.cli import main
    from tests.conftest import fails_cleanly

    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run")
    assert main(["plan", str(cfg), "--devices", "2", "--device-memory", "80"]) == 0
    out = capsys.readouterr().out
    assert "a model, not a measurement" in out and "chosen: llama on 1, qwen on 1" in out
    assert "set: agents.0.device=cuda:0 agents.1.device=cuda:1" in out
    fails_cleanly(capsys, ["plan", str(cfg), "--devices", "0"], "--devices 0")
    fails_cleanly(capsys, ["plan", str(cfg), "--devices", "2", "--slack", "inf"], "--slack inf")  # was accepted
    # fewer devices than agents: it blamed memory
    fails_cleanly(
        capsys, ["plan", str(cfg), "--devices", "1"], "each of the 2 agents at least one device", "--devices 2"
    )


def test_each_agent_is_planned_once_per_device_count_and_many_devices_take_the_greedy_search(
    tiny_agents, tmp_path, monkeypatch
):
    """The exhaustive search over 3 devices plans each (agent, devices) once (2 agents x 2 device counts that fit a
    split: 4 plans, not one per split); past EXHAUSTIVE_SPLITS the greedy search (one device at a time to the agent
    whose extra device shortens the step most) reaches the same split, and 64 devices stay a few dozen plans."""
    import hacrl.tools.placement as placement

    calls = []
    real = placement.agent_costs

    def counting(config, i, k, memory):
        calls.append((i, k))
        return real(config, i, k, memory)

    monkeypatch.setattr(placement, "agent_costs", counting)
    config = _config(tiny_agents, tmp_path)
    assert place(config, 3, 80)[1].devices == [1, 2] and sorted(calls) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    monkeypatch.setattr(placement, "EXHAUSTIVE_SPLITS", 1)
    calls.clear()
    assert place(config, 3, 80)[1].devices == [1, 2]
    calls.clear()
    tried, chosen = place(config, 64, 80)
    assert chosen is not None and sum(chosen.devices) <= 64 and len(calls) == len(set(calls)) <= 2 * 64
