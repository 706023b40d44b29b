"""LoRA agents (`agents.<i>.lora`, peft): only the adapters train, a LoRA + full pair trains and resumes exactly,
the samplers decode with the adapters, and `hacrl export` gives a plain Hugging Face model directory."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")

from hacrl.agent.logprobs import TokenBatch, token_logprobs  # noqa: E402
from hacrl.agent.model import Agent  # noqa: E402
from hacrl.config import AgentConfig, ConfigError, LoraConfig, RolloutConfig, load_config  # noqa: E402
from hacrl.tools.cli import main  # noqa: E402
from tests.conftest import assert_resumes_exactly, records, without_timings, write_config  # noqa: E402

LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "up_proj"]}


def _config(tiny_agents, tmp_path, run, **sections):
    cfg = write_config(tmp_path / f"{run.name}.yaml", tiny_agents, ["llama", "qwen"], run, **sections)
    data = cfg.read_text().replace("name: llama", "lora: " + json.dumps(LORA) + "\n  name: llama", 1)
    cfg.write_text(data)
    return cfg


def test_a_zero_initialised_adapter_computes_exactly_the_base_model(tiny_agents):
    rollout = RolloutConfig(max_new_tokens=8, max_prompt_tokens=64)
    base = Agent(0, AgentConfig(name="a", model=str(tiny_agents["qwen"])), rollout)
    lora = Agent(0, AgentConfig(name="a", model=str(tiny_agents["qwen"]), lora=LoraConfig(**LORA)), rollout)
    prompts, responses = [[5, 6, 7], [8, 9]], [[10, 11, 12], [13]]
    batch = TokenBatch.build(prompts, responses, base.pad_id, "cpu")
    assert torch.equal(token_logprobs(base.model, batch, 1.0), token_logprobs(lora.model, batch, 1.0))
    trainable = {n for n, p in lora.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {id(p) for group in lora.optimizer.param_groups for p in group["params"]} == {
        id(p) for p in lora.model.parameters() if p.requires_grad
    }


@pytest.mark.slow
def test_the_base_weights_of_a_lora_agent_never_change(tiny_agents, tmp_path):
    from hacrl.driver.trainer import Trainer

    cfg = _config(tiny_agents, tmp_path, tmp_path / "run", trainer={"steps": 1},
                  scoring={"function": "tests.reward_fixtures:digits"})  # fmt: skip
    trainer = Trainer(load_config(cfg))
    try:
        model = trainer.schedule.transport.learners[0].agent.model
        base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
        lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
        trainer.train_step()
        after = dict(model.named_parameters())
        assert all(torch.equal(base[n], after[n]) for n in base)
        assert any(not torch.equal(lora[n], after[n]) for n in lora)
    finally:
        trainer.close()


@pytest.mark.slow
def test_a_lora_and_full_pair_resumes_exactly(tiny_agents, tmp_path):
    full_run, cut_run = assert_resumes_exactly(
        lambda run: _config(tiny_agents, tmp_path, run, trainer={"steps": 3}), tmp_path, 3
    )
    a = load_file(full_run / "checkpoints" / "step_000003" / "agents" / "llama" / "adapter_model.safetensors")
    b = load_file(cut_run / "checkpoints" / "step_000003" / "agents" / "llama" / "adapter_model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_the_static_sampler_decodes_with_the_adapters_like_hf(tiny_agents):
    from hacrl.agent.samplers.hf import HFSampler
    from hacrl.agent.samplers.static import StaticSampler

    rollout = RolloutConfig(max_new_tokens=10, max_prompt_tokens=64)
    agent = Agent(0, AgentConfig(name="a", model=str(tiny_agents["qwen"]), lora=LoraConfig(**LORA)), rollout)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # non-zero adapters: the samplers must read them
        for name, p in agent.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    prompts = [[5, 6, 7], [8, 9, 10, 11], [12]]
    hf = HFSampler(agent).sample(prompts, 1, greedy=True, batch_size=3)
    static = StaticSampler(agent, compile_backend="eager").sample(prompts, 1, greedy=True, batch_size=3)
    assert [s.response_ids for s in static] == [s.response_ids for s in hf]


@pytest.mark.slow
def test_export_merges_the_adapters_into_a_plain_model(tiny_agents, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    cfg = _config(
        tiny_agents, tmp_path, run, trainer={"steps": 1}, scoring={"function": "tests.reward_fixtures:digits"}
    )
    assert main(["train", str(cfg)]) == 0
    part = run / "checkpoints" / "step_000001" / "agents" / "llama"  # the adapters only, in peft's format
    assert (part / "adapter_config.json").is_file() and not (part / "model.safetensors").exists()
    adapters = load_file(part / "adapter_model.safetensors")
    assert adapters and all("lora_" in k for k in adapters)
    assert any(v.abs().sum() > 0 for k, v in adapters.items() if "lora_B" in k)  # the up-projections moved
    base = json.loads((part / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str(tiny_agents["llama"])
    last = records(run)[-1]
    assert last["llama/optimizer_steps"] == 4 and last["qwen/optimizer_steps"] == 4  # a LoRA + full pair trained
    out = tmp_path / "llama-merged"
    assert main(["export", str(run), "--agent", "llama", str(out)]) == 0
    assert not (out / "adapter_config.json").exists() and (out / "config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(out)  # nothing of peft or hacrl needed
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    rollout = RolloutConfig(max_new_tokens=8, max_prompt_tokens=64)
    trained = Agent(0, AgentConfig(name="llama", model=str(tiny_agents["llama"]), lora=LoraConfig(**LORA)), rollout,
                    weights_from=part)  # fmt: skip
    batch = TokenBatch.build([[3, 4, 5]], [[6, 7]], trained.pad_id, "cpu")
    trained.model.eval()
    torch.testing.assert_close(token_logprobs(merged, batch, 1.0), token_logprobs(trained.model, batch, 1.0))
    assert main(["export", str(run), "--agent", "llama", str(tmp_path / "adapters"), "--adapters-only"]) == 0
    assert (tmp_path / "adapters" / "adapter_model.safetensors").is_file()
    assert main(["export", str(run), "--agent", "qwen", str(tmp_path / "q"), "--adapters-only"]) == 2
    assert "fully fine-tuned" in capsys.readouterr().err
    assert main(["export", str(run), "--agent", "qwen", str(tmp_path / "q")]) == 0  # a full agent: copied
    assert main(["eval", str(run), "--config", str(cfg)]) == 0  # the checkpoint's LoRA agent evaluates


@pytest.mark.slow
def test_a_bf16_lora_agent_exports_in_bf16_by_default(tiny_agents, tmp_path):
    """Issue 61, 23: `auto` is the agent's compute dtype; a bf16 LoRA agent's part holds adapters only (no
    config.json), and its export came out float32 (the base's). Now `auto` reads the agent's dtype from the
    checkpoint's config; the merge happens in float32, then the weights are cast."""
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    cfg = _config(tiny_agents, tmp_path, run, trainer={"steps": 1}, algorithm={"name": "gspo"})
    assert main(["train", str(cfg), "agents.0.dtype=bfloat16"]) == 0
    assert main(["export", str(run), "--agent", "llama", str(tmp_path / "auto")]) == 0
    assert json.loads((tmp_path / "auto" / "config.json").read_text())["dtype"] == "bfloat16"
    assert next(AutoModelForCausalLM.from_pretrained(tmp_path / "auto").parameters()).dtype == torch.bfloat16
    assert main(["export", str(run), "--agent", "llama", str(tmp_path / "f32"), "--dtype", "float32"]) == 0
    assert next(AutoModelForCausalLM.from_pretrained(tmp_path / "f32").parameters()).dtype == torch.float32


def test_lora_settings_that_cannot_work_are_refused(tiny_agents, tmp_path):
    cfg = _config(tiny_agents, tmp_path, tmp_path / "run")
    with pytest.raises(ConfigError, match="a frozen agent trains nothing"):
        load_config(cfg, ["agents.0.frozen=true"])
    with pytest.raises(ConfigError, match="r >= 1"):
        load_config(cfg, ["agents.0.lora.r=0"])


@pytest.mark.slow
def test_lora_on_the_embedding_is_one_message(tiny_agents, tmp_path, capsys):
    """Issue 42: `target_modules: [embed_tokens]` ended in an AttributeError traceback."""
    cfg = _config(tiny_agents, tmp_path, tmp_path / "run")
    assert main(["train", str(cfg), "agents.0.lora.target_modules=[q_proj,embed_tokens]"]) == 2
    err = capsys.readouterr().err
    assert "adapters go on linear layers only, and embed_tokens (Embedding) is not one" in err, err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_a_merged_sampling_copy_follows_the_adapters_and_leaves_the_base_alone(tiny_agents):
    from hacrl.agent.samplers.hf import HFSampler

    rollout = RolloutConfig(max_new_tokens=10, max_prompt_tokens=64)
    spec = LoraConfig(**LORA, merge_for_sampling=True)
    agent = Agent(0, AgentConfig(name="a", model=str(tiny_agents["qwen"]), lora=spec), rollout)
    sampling_model = agent.sampler.model
    assert sampling_model is agent.sampling_model
    assert sampling_model is not agent.model and not any("lora_" in n for n, _ in sampling_model.named_parameters())
    base = load_file(tiny_agents["qwen"] / "model.safetensors")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # an update moved the adapters
        for name, p in agent.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    agent.weights_changed()
    agent.sync_sampling_weights()
    batch = TokenBatch.build([[5, 6, 7], [8, 9]], [[10, 11], [12]], agent.pad_id, "cpu")
    agent.model.eval()
    torch.testing.assert_close(token_logprobs(sampling_model, batch, 1.0), token_logprobs(agent.model, batch, 1.0))
    prompts = [[5, 6, 7], [8, 9, 10, 11], [12]]
    merged = agent.sampler.sample(prompts, 1, greedy=True, batch_size=3)
    unmerged = HFSampler(agent).sample(prompts, 1, greedy=True, batch_size=3)
    assert [s.response_ids for s in merged] == [s.response_ids for s in unmerged]
    weights = {n.removeprefix("base_model.model."): p for n, p in agent.peft_model.named_parameters()}
    checked = 0
    for key, value in base.items():  # the training model's base weights are untouched by the merge
        name = key.replace(".weight", ".base_layer.weight") if f"{key[:-7]}.base_layer.weight" in weights else key
        if name in weights:
            assert torch.equal(weights[name], value), key
            checked += name.endswith("base_layer.weight")
    assert checked == 3 * 2  # q, v and up projections of both layers


@pytest.mark.slow
def test_a_lora_agent_with_a_sampler_of_its_own_hands_over_its_adapters_only(tiny_agents, tmp_path):
    """llama (LoRA, its merged copy sampling) with a sampler process of its own at lag 1: the learner hands over
    only its adapters, the sampler merges them into its own copy of the base, and every number and adapter weight
    is that of the run without the sampler; stopped one step early and resumed, the same."""
    import yaml

    def config(run, sampler=True):
        cfg = _config(tiny_agents, tmp_path, run, trainer={"steps": 3, "lag": 1}, checkpoint={"every": 1},
                      scoring={"function": "tests.reward_fixtures:digits"})  # fmt: skip
        if sampler:
            data = yaml.safe_load(cfg.read_text())
            data["agents"][0]["sampler_devices"] = ["cpu"]
            cfg.write_text(yaml.safe_dump(data))
        return cfg

    reference = tmp_path / "alone"
    assert main(["train", str(config(reference, sampler=False))]) == 0
    full, _ = assert_resumes_exactly(config, tmp_path, 3)
    ours, theirs = records(full), records(reference)
    assert [without_timings(r) for r in ours] == [without_timings(r) for r in theirs]
    a = load_file(full / "checkpoints" / "step_000003" / "agents" / "llama" / "adapter_model.safetensors")
    b = load_file(reference / "checkpoints" / "step_000003" / "agents" / "llama" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(v.abs().sum() > 0 for k, v in a.items() if "lora_B" in k)  # the adapters moved
    assert all(r["llama/time/weight_sync"] > 0 for r in ours[1:])
