"""A frozen peer (`agents.<i>.frozen`): it samples, is scored and shares its rollouts, but never learns."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from hacrl.config import ConfigError, load_config
from hacrl.tools.cli import main
from tests.conftest import assert_resumes_exactly, record_pool_sources, records, write_config


def _three(tiny_agents, tmp_path, run, **sections):
    cfg = write_config(tmp_path / f"{run.name}.yaml", tiny_agents, ["llama", "qwen", "tiny"], run, **sections)
    text = cfg.read_text().replace("name: tiny", "frozen: true\n  name: tiny", 1)
    cfg.write_text(text)
    return cfg


@pytest.mark.slow
def test_a_frozen_peer_shares_its_rollouts_and_never_changes(tiny_agents, tmp_path, monkeypatch):
    seen = record_pool_sources(monkeypatch)
    run = tmp_path / "run"
    cfg = _three(tiny_agents, tmp_path, run, trainer={"steps": 2}, eval={"at_start": True})
    assert load_config(cfg).agents[2].frozen
    assert main(["train", str(cfg)]) == 0
    per_agent = 2 * 4  # prompts x group size
    for k in (0, 1):  # each learner's pool: its own rows, then the others', the frozen peer's included
        others = [j for j in range(3) if j != k]
        assert seen[k] == [k] * per_agent + [j for j in others for _ in range(per_agent)]
    assert 2 not in seen  # the frozen peer builds no pool and computes no loss
    last = records(run)[-1]
    assert "tiny/reward_mean" in last and "tiny/capability" in last and "eval/tiny/pass@1" in last
    assert "tiny/loss" not in last and "tiny/optimizer_steps" not in last and "tiny/rho/llama" not in last
    assert last["llama/optimizer_steps"] == 6  # 3 agents x 8 responses / mini-batch 4
    checkpoint = run / "checkpoints" / "step_000002"
    assert not (checkpoint / "agents" / "tiny").exists() and not (checkpoint / "optimizer" / "tiny.pt").exists()
    assert (checkpoint / "rng" / "tiny.pt").is_file()
    assert json.loads((checkpoint / "state.json").read_text())["frozen"] == ["tiny"]
    # the learners moved, the frozen peer did not: its model directory is the run's only copy, and it is unchanged
    before = load_file(tiny_agents["llama"] / "model.safetensors")
    after = load_file(checkpoint / "agents" / "llama" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_a_frozen_peer_allocates_nothing_to_learn_and_its_weights_stay_bit_identical(tiny_agents, tmp_path):
    from hacrl.driver.trainer import Trainer

    cfg = _three(tiny_agents, tmp_path, tmp_path / "run", trainer={"steps": 1})
    trainer = Trainer(load_config(cfg))
    try:
        frozen = trainer.schedule.transport.learners[2].agent
        assert frozen.optimizer is None and frozen.ref_model is None
        assert not any(p.requires_grad for p in frozen.model.parameters())
        before = {k: v.clone() for k, v in frozen.model.state_dict().items()}
        trainer.train_step()
        assert all(torch.equal(before[k], v) for k, v in frozen.model.state_dict().items())
    finally:
        trainer.close()


@pytest.mark.slow
def test_a_frozen_teacher_under_a_sharing_policy_gives_only_the_rows_the_policy_keeps(tiny_agents, tmp_path, capsys):
    """Success-gated transfer from a frozen peer (`sharing.policy=correct`): each learner is offered the frozen
    peer's 8 rows a step and keeps exactly those at or above min_reward; the frozen peer learns nothing, so it has
    no sharing metrics and no line in the run's sharing summary."""
    run = tmp_path / "run"
    cfg = _three(tiny_agents, tmp_path, run, trainer={"steps": 2}, sharing={"policy": "correct", "min_reward": 0.5})
    assert main(["train", str(cfg)]) == 0
    out = capsys.readouterr().out
    kept = 0
    for r in records(run):
        for learner in ("llama", "qwen"):
            assert r[f"{learner}/shared/tiny/offered"] == 8
            kept += r[f"{learner}/shared/tiny/kept"]
            if r[f"{learner}/shared/tiny/kept"]:
                assert r[f"{learner}/shared/tiny/kept_reward_mean"] >= 0.5
        assert "tiny/shared_offered" not in r
    assert "sharing.policy=correct:" in out and "  llama: kept" in out and "  tiny: kept" not in out
    assert 0 <= kept < 2 * 2 * 8


@pytest.mark.slow
def test_a_run_with_a_frozen_peer_resumes_exactly(tiny_agents, tmp_path):
    assert_resumes_exactly(lambda run: _three(tiny_agents, tmp_path, run, trainer={"steps": 2}), tmp_path, 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.name=gspo"], "a frozen agent contributes only its rollouts to the others' pools"),
        (["algorithm.share_rollouts=false"], "share_rollouts=False shares nothing"),
        (["agents.0.frozen=true", "agents.1.frozen=true"], "every agent is frozen, so nothing would learn"),
    ],
)
def test_a_frozen_peer_that_could_not_share_is_refused(overrides, message, tiny_agents, tmp_path):
    cfg = _three(tiny_agents, tmp_path, tmp_path / "run")
    with pytest.raises(ConfigError, match=message):
        load_config(cfg, overrides)
