"""`hacrl plan`: the exact parts equal the real tensors' sizes, the activation estimate is within 20 % of what
autograd saves for the backward pass (Llama, Qwen2, Qwen3 families, with and without gradient checkpointing), and
the command says whether a run fits and what to turn."""

from __future__ import annotations

import pytest
import torch

from hacrl.config import load_config
from hacrl.errors import ModelError
from hacrl.tools.cli import main
from hacrl.tools.plan import activation_bytes, model_shape, plan
from tests.conftest import write_config


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """One model directory per family, large enough that activations dominate what autograd saves."""
    from hacrl.tools.testbed.models import char_tokenizer, save_agent, tiny_model
    from tests.conftest import ALPHABET

    root = tmp_path_factory.mktemp("plan")
    char = char_tokenizer(ALPHABET)
    return {
        family: save_agent(tiny_model(family, char, hidden=128, layers=3, heads=4, kv_heads=2, seed=1), char,
                           root / family)
        for family in ("llama", "qwen2", "qwen3")
    }  # fmt: skip


def _saved_for_backward(model, rows: int, tokens: int) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass of one forward (left-padded rows)."""
    ids = torch.randint(3, model.config.vocab_size, (rows, tokens))
    mask = torch.ones(rows, tokens, dtype=torch.long)
    mask[0, : tokens // 4] = 0
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    use_cache=False)  # fmt: skip
    return sum(storages.values())


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_activation_estimate_is_within_20_percent_of_what_autograd_saves(family, checkpointing, families):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(families[family]).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    shape = model_shape(families[family], torch.float32)
    for rows, tokens in ((4, 96), (2, 256)):
        measured = _saved_for_backward(model, rows, tokens)
        estimate = activation_bytes(shape, rows, tokens, checkpointing=checkpointing)
        if checkpointing:  # the forward keeps the layer inputs; one layer's full set exists again in its recompute
            estimate -= rows * tokens * shape.activation_elements(tokens) * shape.dtype_bytes
        assert abs(estimate - measured) <= 0.2 * measured, (family, rows, tokens, estimate, measured)


def test_the_exact_parts_equal_the_real_tensors(families, tmp_path):
    """Weights, gradients, AdamW state and the static sampler's KV pool: bytes of the real tensors."""
    from hacrl.agent.model import Agent
    from hacrl.config import AgentConfig, RolloutConfig

    cfg = write_config(tmp_path / "c.yaml", {"a": families["qwen3"]}, ["a"], tmp_path / "run",
                       algorithm={"name": "gspo"}, rollout={"backend": "static", "batch_size": 8,
                                                           "max_prompt_tokens": 40, "max_new_tokens": 24})  # fmt: skip
    (p,) = plan(load_config(cfg))
    agent = Agent(0, AgentConfig(name="a", model=str(families["qwen3"]), rollout_backend="static"),
                  RolloutConfig(max_prompt_tokens=40, max_new_tokens=24))  # fmt: skip
    size = sum(t.numel() * t.element_size() for t in agent.model.parameters())
    assert p.parts["weights"] == p.parts["gradients"] == size and p.parts["optimizer state (AdamW)"] == 2 * size
    agent.sampler.sample([[5, 6, 7]] * 8, 1, batch_size=8)
    assert p.rows == 8 and p.parts["KV cache (sampling)"] == agent.sampler.pool.bytes


def test_hacrl_plan_says_whether_it_fits_and_what_to_turn(families, tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", {"a": families["llama"], "b": families["qwen3"]}, ["a", "b"],
                       tmp_path / "run", rollout={"max_new_tokens": 512})  # fmt: skip
    assert main(["plan", str(cfg), "--device-memory", "80"]) == 0
    out = capsys.readouterr().out
    assert "activations, gradient checkpointing" in out and "KV cache (sampling)" in out and "yes" in out
    assert not (tmp_path / "run").exists()  # planning writes nothing
    assert main(["plan", str(cfg), "--device-memory", "0.05"]) == 3  # 51 MiB: the KV cache alone needs more
    out = capsys.readouterr().out
    assert "NO" in out and "a: lower rollout.batch_size" in out, out


def test_a_preset_s_placeholder_model_path_is_named_with_its_key_and_the_fix(capsys):
    """The paper presets ship `/path/to/...` models: planning one as it is names the key, the missing directory
    and how to override, and exits with the model error's code (no traceback)."""
    from pathlib import Path

    preset = Path(__file__).resolve().parents[2] / "configs" / "paper" / "qwen3-4b_llama3.2-3b.yaml"
    assert main(["plan", str(preset), "--device-memory", "80"]) == 2
    err = capsys.readouterr().err
    assert "agents.0.model: '/path/to/Qwen3-4B' is not a Hugging Face model directory (does not exist)" in err, err
    assert "`agents.0.model=/models/<name>` on the command line" in err and "Traceback" not in err
    with pytest.raises(ModelError, match=r"agents\.0\.model: '\.' is not a .* \(holds no config\.json\)"):
        plan(load_config(preset, ["agents.0.model=."]), device_memory=80)


def test_the_paper_presets_fit_an_80_gb_gpu_per_agent(tmp_path):
    """The shapes of the paper's models (config.json only): with `rollout.batch_size: auto` and gradient
    checkpointing every agent of both presets fits one 80 GiB card (docs/gpu.md: what each agent needs)."""
    from pathlib import Path

    from transformers import LlamaConfig, Qwen3Config

    shapes = {"qwen3-1.7b": (Qwen3Config, 2048, 28, 16, 8, 128, 6144, 151_936),
              "qwen3-4b": (Qwen3Config, 2560, 36, 32, 8, 128, 9728, 151_936),
              "llama3.2-3b": (LlamaConfig, 3072, 28, 24, 8, 128, 8192, 128_256)}  # fmt: skip
    for name, (cls, hidden, layers, heads, kv, head_dim, ffn, vocab) in shapes.items():
        cls(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=kv, head_dim=head_dim, intermediate_size=ffn,
            tie_word_embeddings=True).save_pretrained(tmp_path / name)  # fmt: skip
    root = Path(__file__).resolve().parents[2] / "configs" / "paper"
    for preset in ("qwen3-1.7b_qwen3-4b.yaml", "qwen3-4b_llama3.2-3b.yaml"):
        config = load_config(root / preset)
        overrides = [f"agents.{i}.model={tmp_path / a.name}" for i, a in enumerate(config.agents)]
        plans = plan(load_config(root / preset, overrides), device_memory=80)
        for p in plans:
            assert p.fits and p.checkpointing and p.rows >= 16, (preset, p.name, p.peak / 2**30, p.rows)


def test_the_plan_bounds_the_log_prob_memory_measured_on_gpus(tmp_path):
    """benchmarks/results: teacher-forced log-probs + backward at 16 x 4,096 tokens (rows of one length, so no
    padding mask) on the Qwen3-0.6B shape in bf16, chunks of 1,024 positions: 126.1 GiB above the model on an H200
    (gpu.md), 9.1 GiB with gradient checkpointing on an H100 (gpu-h100.md). The plan (gradients + activations +
    log-prob head) never under-estimates them: 16 % over without checkpointing, 31 % over with it (the recomputed
    layer is counted whole)."""
    from transformers import Qwen3Config

    from hacrl.tools.plan import logprob_head_bytes

    Qwen3Config(vocab_size=151_936, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                tie_word_embeddings=True).save_pretrained(tmp_path)  # fmt: skip
    shape = model_shape(tmp_path, torch.bfloat16)
    fixed = shape.params * shape.dtype_bytes + logprob_head_bytes(shape, 16, 4096, 1024, cpu=False)
    for checkpointing, measured, over in ((False, 126.1, 1.2), (True, 9.1, 1.35)):
        planned = (fixed + activation_bytes(shape, 16, 4096, checkpointing=checkpointing, padded=False)) / 2**30
        assert measured <= planned <= over * measured, (checkpointing, planned, measured)


def test_a_frozen_peer_is_planned_with_its_weights_and_sampling_only(families, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", {"a": families["llama"], "b": families["qwen3"]}, ["a", "b"],
                       tmp_path / "run", algorithm={"kl_coef": 0.1})  # fmt: skip
    learner, frozen = plan(load_config(cfg, ["agents.1.frozen=true"]))
    for part in ("gradients", "optimizer state (AdamW)", "reference model (KL)", "activations, one micro-batch"):
        assert frozen.parts[part] == 0, part
    assert learner.parts["optimizer state (AdamW)"] > 0 and frozen.parts["KV cache (sampling)"] > 0
    assert frozen.update_peak < learner.update_peak


def test_a_sampler_of_its_own_is_planned_on_its_device_as_a_frozen_copy(families, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", {"a": families["llama"], "b": families["qwen3"]}, ["a", "b"],
                       tmp_path / "run", algorithm={"kl_coef": 0.1})  # fmt: skip
    plans = plan(load_config(cfg, ["trainer.lag=1", "agents.1.sampler_devices=[cpu]"]))
    assert [p.name for p in plans] == ["a", "b", "b (sampler)"]
    learner, sampler = plans[1], plans[2]
    assert sampler.precision.endswith("(frozen)") and sampler.devices == ["cpu"]
    assert sampler.parts["weights"] == learner.parts["weights"] and sampler.parts["KV cache (sampling)"] > 0
    for part in ("gradients", "optimizer state (AdamW)", "reference model (KL)", "activations, one micro-batch"):
        assert sampler.parts[part] == 0, part
    group = plan(load_config(cfg, ["trainer.lag=1", "agents.1.devices=[cpu, cpu]", "agents.1.sampler_devices=[cpu]"]))
    assert group[2].devices == ["cpu"] and group[2].parts["weights"] == learner.parts["weights"]  # the whole copy


def test_the_plan_counts_adapter_state_only(families, tmp_path):
    pytest.importorskip("peft")
    from hacrl.agent.model import Agent
    from hacrl.config import AgentConfig, LoraConfig, RolloutConfig

    cfg = write_config(tmp_path / "c.yaml", {"a": families["qwen3"], "b": families["qwen3"]}, ["a", "b"],
                       tmp_path / "run")  # fmt: skip
    full, lora = plan(load_config(cfg, ["agents.1.lora={r: 2, target_modules: [q_proj]}"]))
    spec = LoraConfig(r=2, target_modules=["q_proj"])
    agent = Agent(1, AgentConfig(name="b", model=str(families["qwen3"]), lora=spec), RolloutConfig())
    adapters = sum(p.numel() for p in agent.model.parameters() if p.requires_grad)
    assert lora.parts["gradients"] == 4 * adapters and lora.parts["optimizer state (AdamW)"] == 8 * adapters
    assert lora.parts["optimizer state (AdamW)"] < full.parts["optimizer state (AdamW)"] / 10


def test_the_plan_bounds_the_paper_shape_step_measured_on_an_h100_and_proposes_more_rows(tmp_path):
    """benchmarks/results/gpu-h100-paper-step.md: one Qwen3-4B-shape agent (8 prompts x 8 x 4,096 new tokens,
    prompts up to 1,024, `batch_size: auto`, gradient checkpointing, micro-batches of 8) on an H100 80GB (79.18 GiB):
    16 rows per call, peak 48.9 GiB, measured in pure bf16 (before float32 masters: `master_weights: none` here).
    The plan predicts the rows exactly and the peak on the safe side (within 20 %),
    and, its update estimate leaving room, proposes the `kv_cache_margin` that doubles the rows per call, under
    which it plans 32 rows within the card."""
    import yaml
    from transformers import Qwen3Config

    Qwen3Config(vocab_size=151_936, hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, intermediate_size=9728,
                tie_word_embeddings=True).save_pretrained(tmp_path / "qwen3-4b")  # fmt: skip
    (tmp_path / "d.jsonl").write_text('{"problem": "1 + 1", "answer": "2"}\n')
    config = {
        "agents": [{"name": "qwen3-4b", "model": str(tmp_path / "qwen3-4b"), "lr": 1e-6, "device": "cuda",
                    "dtype": "bfloat16", "master_weights": "none", "gradient_checkpointing": True}],
        "algorithm": {"name": "gspo"},
        "rollout": {"group_size": 8, "max_new_tokens": 4096, "max_prompt_tokens": 1024, "backend": "static",
                    "cuda_graphs": True, "batch_size": "auto"},
        "data": {"source": "file", "train_file": str(tmp_path / "d.jsonl"), "prompt_column": "problem"},
        "trainer": {"steps": 1, "prompts_per_step": 8, "mini_batch_size": 64, "micro_batch_size": 8,
                    "logprob_batch_size": 32, "output_dir": str(tmp_path / "run")},
    }  # fmt: skip
    path = tmp_path / "paper.yaml"
    path.write_text(yaml.safe_dump(config))
    (p,) = plan(load_config(path), device_memory=79.18)
    assert p.rows == 16
    assert 48.9 <= p.peak / 2**30 <= 1.2 * 48.9, p.peak / 2**30
    (advice,) = p.advice
    assert advice.startswith("rollout.kv_cache_margin=0.30 (now 0.35) gives 32 rows"), advice
    (more,) = plan(load_config(path, ["rollout.kv_cache_margin=0.30"]), device_memory=79.18)
    assert more.rows == 32 and more.fits and more.peak <= 0.95 * more.device_total and not more.advice


def test_a_model_of_100000_layers_is_planned_at_once_and_bad_sizes_are_named(families, tmp_path, capsys):
    """Issue 42: `hacrl plan` built the whole model on the meta device before any check (100,000 layers: nothing
    printed in 90 s). Deep models are counted from a 1- and a 2-layer copy, exactly; impossible sizes are named."""
    import json
    import shutil
    import time

    deep = tmp_path / "deep"
    shutil.copytree(families["qwen3"], deep)
    config = json.loads((deep / "config.json").read_text())
    config["num_hidden_layers"] = 100_000
    config["layer_types"] = ["full_attention"] * 100_000
    (deep / "config.json").write_text(json.dumps(config))
    start = time.perf_counter()
    shape = model_shape(deep, torch.float32)
    assert time.perf_counter() - start < 20
    three = model_shape(families["qwen3"], torch.float32)  # the same model with 3 layers, built whole
    per_layer = three.params - model_shape(_layers(families["qwen3"], tmp_path / "two", 2), torch.float32).params
    assert shape.params == three.params + (100_000 - 3) * per_layer and shape.layers == 100_000
    bad = _layers(families["llama"], tmp_path / "bad", 2)
    config = json.loads((bad / "config.json").read_text())
    for key, value in (("num_hidden_layers", 0), ("num_hidden_layers", -4), ("hidden_size", 0), ("vocab_size", -1)):
        (bad / "config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(ModelError, match=rf"config.json has {key}={value!r}; it must be a positive integer"):
            model_shape(bad, torch.float32)
    (bad / "config.json").write_text(json.dumps({**config, "vocab_size": 10**18}))  # issue 61, 17: an overflow
    with pytest.raises(ModelError, match=r"config.json has vocab_size=1,000,000,000,000,000,000, past the 16,777,216"):
        model_shape(bad, torch.float32)
    cfg = write_config(tmp_path / "c.yaml", families, ["llama"], tmp_path / "run")
    for bad in ("nan", "-5", "0", "inf", "lots"):
        with pytest.raises(SystemExit) as stop:
            main(["plan", str(cfg), "--device-memory", bad])
        assert stop.value.code == 2
        assert f"argument --device-memory: {bad!r} is not a memory size" in capsys.readouterr().err


def _layers(model_dir, out, layers):
    import json
    import shutil

    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config["num_hidden_layers"] = layers
    config.pop("layer_types", None)
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_masters_offload_and_agents_sharing_a_device_are_planned(tmp_path):
    """Issue 41: a Qwen3-4B-shape agent with float32 masters does not fit an 80 GiB card beside its pool, and the
    plan says to offload; offloaded it fits, its masters and AdamW state counted on the host. Two agents on one
    device each count the other's resident bytes (weights, device-resident state, KV pool); on two devices none."""
    import yaml
    from transformers import Qwen3Config

    Qwen3Config(vocab_size=151_936, hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, intermediate_size=9728,
                tie_word_embeddings=True).save_pretrained(tmp_path / "qwen3-4b")  # fmt: skip
    (tmp_path / "d.jsonl").write_text('{"problem": "1 + 1", "answer": "2"}\n')
    agent = {"model": str(tmp_path / "qwen3-4b"), "device": "cuda:0", "dtype": "bfloat16",
             "gradient_checkpointing": True}  # fmt: skip
    config = {
        "agents": [{"name": "a", **agent}, {"name": "b", **agent}],
        "rollout": {"max_new_tokens": 4096, "max_prompt_tokens": 1024, "backend": "static", "batch_size": 16},
        "data": {"source": "file", "train_file": str(tmp_path / "d.jsonl"), "prompt_column": "problem"},
        "trainer": {"micro_batch_size": 8, "output_dir": str(tmp_path / "run")},
    }
    path = tmp_path / "pair.yaml"
    path.write_text(yaml.safe_dump(config))
    alone = ["agents.1.device=cuda:1"]
    a, _ = plan(load_config(path, alone), device_memory=80)
    n = a.shape.trainable
    assert a.precision == "bfloat16 + fp32 masters" and a.host == {} and a.others_resident == 0
    assert a.parts["master weights (float32)"] == 4 * n and a.parts["optimizer state (AdamW)"] == 8 * n
    assert a.parts["gradients"] == 4 * n and not a.fits
    assert any(line.startswith("set agents.0.offload=optimizer") for line in a.advice), a.advice
    a, _ = plan(load_config(path, [*alone, "agents.0.offload=optimizer"]), device_memory=80)
    assert a.fits and a.parts["master weights (float32)"] == a.parts["optimizer state (AdamW)"] == 0
    assert a.host == {"master weights (float32)": 4 * n, "optimizer state (AdamW)": 8 * n,
                      "gradients (the step's copy)": 4 * n}  # fmt: skip
    offloaded = ["agents.0.offload=optimizer", "agents.1.offload=optimizer"]
    a, b = plan(load_config(path, offloaded), device_memory=141)  # both on cuda:0, taking turns
    assert a.others_resident == b.resident and b.others_resident == a.resident > 0
    apart, _ = plan(load_config(path, [*offloaded, *alone]), device_memory=141)
    assert a.peak == apart.peak + b.resident


def test_an_agent_on_k_devices_is_planned_per_rank(tmp_path, capsys):
    """Issue 43: a Qwen3-4B-shape bf16 agent on K GPUs holds the whole compute copy, 1/K of the float32 master
    shards, gradient shards and AdamW state, and what FSDP2 gathers for the update; it does not fit one 80 GiB card
    with its pool and fits on 4. `hacrl plan --ranks` shows the peak per rank for K = 1..8, falling with K."""
    import yaml
    from transformers import Qwen3Config

    from hacrl.tools.cli import main
    from hacrl.tools.plan import plan_ranks

    Qwen3Config(vocab_size=151_936, hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, intermediate_size=9728,
                tie_word_embeddings=True).save_pretrained(tmp_path / "qwen3-4b")  # fmt: skip
    (tmp_path / "d.jsonl").write_text('{"problem": "1 + 1", "answer": "2"}\n')
    config = {
        "agents": [{"name": "a", "model": str(tmp_path / "qwen3-4b"), "device": "cuda:0", "dtype": "bfloat16",
                    "gradient_checkpointing": True}],
        "rollout": {"max_new_tokens": 4096, "max_prompt_tokens": 1024, "backend": "static", "batch_size": 16},
        "data": {"source": "file", "train_file": str(tmp_path / "d.jsonl"), "prompt_column": "problem"},
        "trainer": {"micro_batch_size": 8, "output_dir": str(tmp_path / "run")},
        "algorithm": {"name": "gspo"},
    }  # fmt: skip
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(config))
    (one,) = plan(load_config(path), device_memory=80)
    (four,) = plan(load_config(path, ["agents.0.devices=[cuda:0,cuda:1,cuda:2,cuda:3]"]), device_memory=80)
    n = four.shape.trainable
    assert not one.fits and four.fits and four.precision == "bfloat16 + fp32 masters, FSDP2 x4"
    assert four.parts["weights"] == one.parts["weights"] == 2 * four.shape.params  # the gathered copy samples
    assert four.parts["master weights (float32)"] == 4 * n // 4 and four.parts["gradients"] == 4 * n // 4
    assert four.parts["optimizer state (AdamW)"] == 8 * n // 4 and four.parts["gathered for the update (FSDP2)"] > 0
    peaks = plan_ranks(load_config(path), device_memory=80)["a"]
    assert peaks[0] == one.peak and all(a > b for a, b in zip(peaks, peaks[1:], strict=False))
    assert main(["plan", str(path), "--ranks", "--device-memory", "80"]) == 3  # K = 1 does not fit
    out = capsys.readouterr().out
    assert "peak per rank with the agent on K devices" in out and out.count("\na ") == 1, out


def test_the_plan_states_the_pool_and_each_learners_update_rows():
    """16 agents x 1,024 answers of up to 4,096 tokens (the issue's case): the driver holds at most ~258 MiB of pool
    text per step; `all` trains each learner on 16,384 rows, a budget of 8 per prompt on 1,024 + 1,024; groups of 8
    take their group's rows and the budget's across."""
    from dataclasses import replace

    from hacrl.config import AgentConfig, SharingConfig, TrainConfig
    from hacrl.tools.plan import pool_summary

    config = TrainConfig()
    config.agents = [AgentConfig(name=f"a{i}", model=".") for i in range(16)]
    config.trainer = replace(config.trainer, prompts_per_step=128)
    config.rollout = replace(config.rollout, group_size=8, max_new_tokens=4096)
    text = pool_summary(config)
    assert "pool per step: 16,384 answers" in text and "at most 257.9 MiB in the driver" in text
    assert "a0 16,384 (own 1,024 + foreign 15,360)" in text
    config.sharing = SharingConfig(budget_per_prompt=8)
    assert "a3 2,048 (own 1,024 + foreign 1,024)" in pool_summary(config)
    config.sharing = SharingConfig(budget_per_prompt=1, groups=[[f"a{i}" for i in range(8)],
                                                               [f"a{i}" for i in range(8, 16)]])  # fmt: skip
    assert "a9 8,320 (own 1,024 + foreign 7,296)" in pool_summary(config)  # 7 x 1,024 inside + 128 across
    config.sharing = SharingConfig(policy="correct")
    assert "a0 at most 16,384 (own 1,024 + foreign at most 15,360)" in pool_summary(config)
