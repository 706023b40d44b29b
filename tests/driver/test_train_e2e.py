"""End-to-end runs through the real CLI path on tiny heterogeneous agents (two families, two tokenizers)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from hacrl.config import load_config
from hacrl.driver.metrics import unknown_keys
from hacrl.tools.cli import main
from tests.conftest import record_pool_sources, records, write_config

PER_AGENT_KEYS = [
    "reward_mean",
    "accuracy",
    "capability",
    "loss",
    "own_clip_frac",
    "own_ratio_mean",
    "grad_norm",
    "response_length_mean",
    "optimizer_steps",
]


def _weights(path):
    return load_file(path / "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["hacpo", "gspo", "naive", "grpo"])
def test_two_heterogeneous_agents_train_and_save_plain_hf_models(algorithm, tiny_agents, tmp_path):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    # graded rewards (a quarter point per digit), so that groups are informative even for untrained agents
    graded = {"function": "tests.reward_fixtures:digits"}
    cfg = write_config(
        tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, algorithm={"name": algorithm}, scoring=graded
    )
    assert main(["train", str(cfg)]) == 0

    logged_records = records(run)
    assert [r["step"] for r in logged_records] == [1, 2]
    assert [key for r in logged_records for key in unknown_keys(r)] == []  # every logged key is a registered metric
    for name in ("llama", "qwen"):
        for key in PER_AGENT_KEYS:
            assert math.isfinite(logged_records[-1][f"{name}/{key}"]), f"{name}/{key}"
        # pool = 2 prompts x 4 per agent; mini-batch 4: 2 optimizer steps alone, 4 when the pool is shared
        assert logged_records[-1][f"{name}/optimizer_steps"] == (4 if algorithm in ("hacpo", "naive") else 2)
        # pass@1 is what the per-prompt evaluation records say: the share of greedy completions with full reward
        evaluated = [json.loads(line)["agents"][name] for line in (run / "eval" / "step_000002.jsonl").open()]
        full = sum(record["reward"] >= 1.0 for record in evaluated) / len(evaluated)
        assert len(evaluated) == 8 and logged_records[-1][f"eval/{name}/pass@1"] == pytest.approx(full)
        final = run / "checkpoints" / "step_000002" / "agents" / name
        before, after = _weights(tiny_agents[name]), _weights(final)
        assert all(not torch.equal(before[k], after[k]) for k in after if "norm" not in k), "every weight moves"
        model = AutoModelForCausalLM.from_pretrained(final)  # nothing of ours needed
        assert model.config.vocab_size == before["model.embed_tokens.weight"].shape[0]
    if algorithm == "hacpo":
        assert "llama/rho/qwen" in logged_records[-1] and "llama/foreign_clip_frac" in logged_records[-1]
        assert logged_records[-1]["llama/foreign_lower_bound"] > 0.8  # m > 0 for the foreign mini-batches
    assert (run / "config.yaml").is_file()
    saved = load_config(run / "checkpoints" / "step_000002" / "config.yaml")  # the resolved config round-trips
    assert saved.algorithm.name == algorithm and saved.agents[1].model == str(tiny_agents["qwen"])
    assert any((run / "tensorboard").iterdir())


@pytest.mark.slow
def test_three_agents(tiny_agents, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml",
        tiny_agents,
        ["llama", "qwen", "tiny"],
        run,
        trainer={"steps": 1},
        checkpoint={"every": 0},
        eval={"at_start": False, "save_completions": False},
    )
    assert main(["train", str(cfg)]) == 0
    assert "eval/llama/pass@1" in records(run)[-1] and not (run / "eval").exists()  # evaluated, nothing written
    last = records(run)[-1]
    for name in ("llama", "qwen", "tiny"):
        assert last[f"{name}/optimizer_steps"] == 6  # 3 agents x 8 responses / mini-batch 4
        others = {"llama", "qwen", "tiny"} - {name}
        assert {f"{name}/rho/{o}" for o in others} <= set(last)


@pytest.mark.slow
def test_resume_reproduces_the_next_step(tiny_agents, tmp_path):
    full_run, cut_run = tmp_path / "full", tmp_path / "cut"
    full = write_config(tmp_path / "full.yaml", tiny_agents, ["llama", "qwen"], full_run, trainer={"steps": 3})
    assert main(["train", str(full)]) == 0
    cut = write_config(tmp_path / "cut.yaml", tiny_agents, ["llama", "qwen"], cut_run, trainer={"steps": 3})
    assert main(["train", str(cut), "trainer.steps=2"]) == 0  # "crashes" after step 2
    assert main(["train", str(cut), "--resume"]) == 0
    expected, resumed = records(full_run)[2], records(cut_run)[2]
    assert resumed["step"] == expected["step"] == 3
    for key, value in expected.items():
        if not key.startswith(("time/", "tokens_per_second")) and "/time/" not in key:
            assert resumed[key] == value, key
    a = _weights(full_run / "checkpoints" / "step_000003" / "agents" / "qwen")
    b = _weights(cut_run / "checkpoints" / "step_000003" / "agents" / "qwen")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_help_is_fast_and_does_not_import_torch():
    code = "import sys, hacrl, hacrl.tools.cli; hacrl.tools.cli._parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    help_text = subprocess.run(
        [sys.executable, "-m", "hacrl", "train", "--help-config"], capture_output=True, text=True, check=True
    ).stdout
    for group in (
        "agents:",
        "algorithm:",
        "rollout:",
        "data:",
        "scoring:",
        "trainer:",
        "eval:",
        "logging:",
        "checkpoint:",
    ):
        assert group in help_text
    assert "capability_window = 5" in help_text


@pytest.mark.slow
def test_config_errors_fail_before_any_model_loads(tiny_agents, tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama"], tmp_path / "run")
    assert main(["train", str(cfg)]) == 2  # hacpo with one agent
    assert "needs at least 2 entries in `agents`" in capsys.readouterr().err
    assert main(["train", str(cfg), "algorithm.name=gspo", "trainer.mini_batch_size=3"]) == 2
    assert "choose one of [1, 2, 4, 8]" in capsys.readouterr().err
    assert main(["train", str(cfg), "algorithm.name=gspo", "trainer.stepz=3"]) == 2
    assert "Did you mean: 'steps'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_config_reference_doc_is_up_to_date():
    """docs/config-reference.txt is `hacrl train --help-config`; regenerate it when a config field changes."""
    from pathlib import Path

    from hacrl.config import describe

    doc = Path(__file__).resolve().parents[2] / "docs" / "config-reference.txt"
    assert doc.read_text().strip() == describe().strip(), "run: hacrl train --help-config > docs/config-reference.txt"


def test_every_config_field_has_a_docstring():
    from dataclasses import fields

    from hacrl import config as c

    for cls in (
        c.AgentConfig,
        c.AlgorithmConfig,
        c.RolloutConfig,
        c.DataConfig,
        c.ScoringConfig,
        c.TrainerConfig,
        c.EvalConfig,
        c.LoggingConfig,
        c.CheckpointConfig,
    ):
        docs = c.field_docs(cls)
        assert [f.name for f in fields(cls) if not docs.get(f.name)] == [], cls.__name__


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["hacpo", "gspo"])
def test_every_learner_trains_on_its_own_rows_first(algorithm, tiny_agents, tmp_path, monkeypatch):
    """Spec 2, step 5a: each learner's pool is its own responses, then the others' in config order, so its own rows
    take the first optimizer steps (m = 0, 1, ...) whatever its index; the learner that is not first in the config
    must not see foreign rows first."""
    seen = record_pool_sources(monkeypatch)
    run = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml",
        tiny_agents,
        ["llama", "qwen", "tiny"],
        run,
        algorithm={"name": algorithm},
        trainer={"steps": 1},
        checkpoint={"every": 0},
    )
    assert main(["train", str(cfg)]) == 0
    per_agent = 2 * 4  # prompts x group size
    for k in range(3):
        others = [j for j in range(3) if j != k] if algorithm == "hacpo" else []
        assert seen[k] == [k] * per_agent + [j for j in others for _ in range(per_agent)], k


@pytest.mark.parametrize("preset", ["qwen3-1.7b_qwen3-4b.yaml", "qwen3-4b_llama3.2-3b.yaml"])
def test_the_paper_presets_load_validate_and_carry_the_papers_hyper_parameters(preset):
    from pathlib import Path

    config = load_config(Path(__file__).resolve().parents[2] / "configs" / "paper" / preset)
    assert config.algorithm.name == "hacpo" and (config.algorithm.alpha, config.algorithm.delta) == (1.0, 0.2)
    assert (config.trainer.prompts_per_step, config.rollout.group_size, config.trainer.mini_batch_size) == (128, 8, 512)
    assert config.rollout.max_new_tokens == 4096 and config.eval.every == 3
    for agent in config.agents:
        assert (agent.lr, agent.dtype, agent.grad_clip) == (1e-6, "bfloat16", 1.0)
        assert agent.device.startswith("cuda") and agent.model.startswith("/path/to/")
    assert config.rollout.backend == "static" and config.rollout.batch_size == "auto"
    assert config.trainer.logprob_chunk_size == "auto"
    assert config.data.source == "datasets" and (config.data.train.set, config.data.eval.set) == ("math", "math500")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["learner_length", "bytes"])
def test_each_foreign_ratio_mode_trains_across_tokenizers_and_reports_its_distribution(mode, tiny_agents, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run,
        algorithm={"foreign_ratio": mode}, scoring={"function": "tests.reward_fixtures:digits"},
    )  # fmt: skip
    assert main(["train", str(cfg)]) == 0
    last = records(run)[-1]
    assert last["foreign_ratio_mode"] == mode
    for name in ("llama", "qwen"):
        p10, p50, p90 = (last[f"{name}/foreign_ratio_p{q}"] for q in (10, 50, 90))
        assert 0 < p10 <= p50 <= p90 and math.isfinite(last[f"{name}/loss"])


@pytest.mark.slow
def test_an_algorithm_registered_in_one_call_trains(tiny_agents, tmp_path):
    """Adding an algorithm is one `register` call: the config accepts its name, the loop runs it (its advantage
    function sees each learner's pool) and the agent's weights move. Here: REINFORCE with a fixed baseline of 0.5,
    under the GSPO loss."""
    from hacrl.core import ALGORITHMS, Algorithm, gspo_loss, register

    seen = []

    def fixed_baseline(rewards, group_ids, source, *, learner, capabilities, params):
        seen.append((learner, rewards.numel()))
        return rewards - 0.5

    register(Algorithm("reinforce-fixed", fixed_baseline, gspo_loss, shares_rollouts=False))
    try:
        cfg = write_config(
            tmp_path / "c.yaml", tiny_agents, ["qwen"], tmp_path / "run", algorithm={"name": "reinforce-fixed"},
            trainer={"steps": 1, "prompts_per_step": 2, "mini_batch_size": 8, "micro_batch_size": 4},
        )  # fmt: skip
        assert main(["train", str(cfg)]) == 0
    finally:
        del ALGORITHMS["reinforce-fixed"]
    assert seen == [(0, 8)]  # one learner, B x G = 2 x 4 own rows
    (record,) = records(tmp_path / "run")
    assert record["qwen/optimizer_steps"] == 1 and math.isfinite(record["qwen/loss"])
    before, after = _weights(tiny_agents["qwen"]), _weights(tmp_path / "run/checkpoints/step_000001/agents/qwen")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(Exception, match="'reinforce-fixed' is not a registered algorithm; known: grpo, gspo, hacpo"):
        load_config(cfg)
