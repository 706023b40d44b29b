"""The trainer on a CUDA device: same numbers as the CPU where they must agree, and the full loop on the GPU.

Skipped where no CUDA device is present (CI has none); run on a GPU machine with `pytest tests/gpu`.
`HACRL_TEST_DEVICE=cpu pytest tests/gpu` dry-runs the same tests on the CPU (checks the tests, not the GPU).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import yaml

from hacrl.tools.cli import main
from tests.conftest import write_config

DEVICE = os.environ.get("HACRL_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA device"
)


def _set_devices(path, devices: dict[str, str], dtype: str = "float32"):
    """Put the config's agents on `devices`; its data becomes a local JSONL file scored by a plain function, so the
    GPU machine needs no reasoning-gym (its image does not have it, and it does not install without compiling)."""
    cfg = yaml.safe_load(path.read_text())
    for agent in cfg["agents"]:
        agent["device"] = devices[agent["name"]]
        agent["dtype"] = dtype if devices[agent["name"]] == DEVICE else "float32"
    train, held_out = path.with_name("sums.jsonl"), path.with_name("held_out.jsonl")
    for file, numbers in ((train, range(9)), (held_out, range(10, 13))):
        file.write_text("".join(json.dumps({"prompt": f"{a} + {b} =", "answer": str(a + b)}) + "\n"
                                for a in numbers for b in numbers))  # fmt: skip
    cfg["data"] = {"source": "file", "train_file": str(train), "eval_file": str(held_out), "eval_size": 8}
    cfg["scoring"] = {"function": "tests.reward_fixtures:digits"}
    path.write_text(yaml.safe_dump(cfg))
    return path


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_token_logprobs_and_hacpo_gradients_match_the_cpu(tiny_agents):
    """float32 on the GPU computes what the CPU computes: token log-probs, the HACPO loss and its gradient."""
    from transformers import AutoModelForCausalLM

    from hacrl.agent.logprobs import TokenBatch, token_logprobs
    from hacrl.agent.model import load_tokenizer
    from hacrl.core import AlgorithmParams, LossInputs, hacpo_loss

    tok = load_tokenizer(tiny_agents["qwen"])
    prompts = [tok("Q:3 + 4 =\nA:").input_ids, tok("Q:12 + 9 =\nA:").input_ids, tok("Q:1 + 1 =\nA:").input_ids]
    responses = [tok("7").input_ids + [tok.eos_token_id], tok("21").input_ids, tok("2").input_ids]
    results = {}
    for device in ("cpu", DEVICE):
        torch.backends.cuda.matmul.allow_tf32 = False
        model = AutoModelForCausalLM.from_pretrained(tiny_agents["qwen"]).to(device)
        batch = TokenBatch.build(prompts, responses, tok.pad_token_id, device)
        logp = token_logprobs(model, batch, temperature=1.0)
        mask = batch.response_mask.float()
        inputs = LossInputs(
            logp=logp,
            old_logp=(logp.detach() + 0.05 * mask),
            mask=mask,
            adv=torch.tensor([1.0, -0.5, 0.25], device=device),
            source=torch.tensor([0, 1, 1], device=device),
            learner=0,
            capabilities=torch.tensor([0.4, 0.6], device=device),
            source_logp_sum=torch.tensor([0.0, -2.4, -0.7], device=device),
            source_num_tokens=torch.tensor([1, 2, 1], device=device),
            num_own=1,
        )
        out = hacpo_loss(inputs, params=AlgorithmParams(), step_index=1)
        out.loss.backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).cpu()
        results[device] = (logp.detach().cpu(), mask.cpu(), out.loss.detach().cpu(), grad)
    (lc, mc, loss_c, gc), (lg, mg, loss_g, gg) = results["cpu"], results[DEVICE]
    assert torch.equal(mc, mg)
    torch.testing.assert_close(lg * mg, lc * mc, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(loss_g, loss_c, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(gg, gc, atol=2e-5, rtol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "offload"), [("float32", "none"), ("bfloat16", "none"), ("bfloat16", "optimizer")])
def test_two_agents_train_checkpoint_and_resume_on_cuda(dtype, offload, tiny_agents, tmp_path):
    """bf16 agents train float32 masters (issue 41): the checkpoint holds them; with `offload: optimizer` they
    live in pinned host memory and the copies are timed."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 2})
    _set_devices(cfg, {"llama": DEVICE, "qwen": DEVICE}, dtype)
    if offload != "none":
        cfg.write_text(cfg.read_text().replace("dtype: bfloat16", f"dtype: bfloat16\n  offload: {offload}"))
    assert main(["train", str(cfg)]) == 0
    assert main(["train", str(cfg), "trainer.steps=3", "--resume"]) == 0
    records = _metrics(run)
    assert [r["step"] for r in records] == [1, 2, 3]
    for name in ("llama", "qwen"):
        for key in ("loss", "reward_mean", "grad_norm", "own_ratio_mean", "foreign_clip_frac"):
            assert math.isfinite(records[-1][f"{name}/{key}"]), (name, key)
        saved = run / "checkpoints" / "step_000003" / "agents" / name
        weights = load_file(saved / "model.safetensors")
        assert {str(w.dtype) for w in weights.values()} == {"torch.float32"}  # float32 masters for bf16 agents
        assert all(w.device.type == "cpu" for w in weights.values())
        before = load_file(tiny_agents[name] / "model.safetensors")
        assert any(not torch.equal(before[k].to(weights[k].dtype), weights[k]) for k in weights)
        AutoModelForCausalLM.from_pretrained(saved)  # loads anywhere, with plain transformers
        assert (f"{name}/time/offload" in records[-1]) == (offload != "none")


@pytest.mark.slow
def test_resume_on_cuda_reproduces_the_next_step(tiny_agents, tmp_path, monkeypatch):
    """With deterministic kernels, a run cut after step 2 and resumed gives step 3 bit for bit (CUDA RNG restored)."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        runs = {}
        for kind in ("full", "cut"):
            runs[kind] = tmp_path / kind
            cfg = tmp_path / f"{kind}.yaml"
            write_config(cfg, tiny_agents, ["llama", "qwen"], runs[kind], trainer={"steps": 3})
            _set_devices(cfg, {"llama": DEVICE, "qwen": DEVICE})
            if kind == "full":
                assert main(["train", str(cfg)]) == 0
            else:
                assert main(["train", str(cfg), "trainer.steps=2"]) == 0
                assert main(["train", str(cfg), "--resume"]) == 0
    finally:
        torch.use_deterministic_algorithms(False)
    expected, resumed = _metrics(runs["full"])[2], _metrics(runs["cut"])[2]
    for key, value in expected.items():
        if not key.startswith(("time/", "tokens_per_second")) and "/time/" not in key:
            assert resumed[key] == value, key


@pytest.mark.slow
def test_agents_on_different_devices_share_rollouts(tiny_agents, tmp_path):
    """One agent on the CPU, one on the GPU: the pool is device-neutral, both learn from each other."""
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 1})
    _set_devices(cfg, {"llama": "cpu", "qwen": DEVICE})
    assert main(["train", str(cfg)]) == 0
    last = _metrics(run)[-1]
    for name in ("llama", "qwen"):
        assert last[f"{name}/optimizer_steps"] == 4  # own and foreign mini-batches
        assert math.isfinite(last[f"{name}/loss"]) and math.isfinite(last[f"{name}/foreign_clip_frac"])


def _lively(tmp_path, name: str):
    """A tiny agent initialised with std 0.3 (its greedy outputs depend on the prompt), as in test_samplers."""
    from hacrl.tools.testbed.models import bpe_tokenizer, char_tokenizer, save_agent, tiny_model
    from tests.conftest import ALPHABET, sum_corpus

    if name == "llama":
        char = char_tokenizer(ALPHABET)
        model = tiny_model("llama", char, hidden=32, heads=2, kv_heads=1, seed=1, init_std=0.3)
        return save_agent(model, char, tmp_path / name)
    bpe = bpe_tokenizer(sum_corpus(), 80)
    return save_agent(tiny_model("qwen2", bpe, hidden=48, heads=4, kv_heads=2, seed=2, init_std=0.3), bpe,
                      tmp_path / name)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_decode_kernel_equals_the_reference(dtype):
    """The compiled kernel (what the static sampler's decode step runs on CUDA) against the plain-torch reference:
    rows of length 1 and of the full pool, grouped heads, head dims 64 and 128, one split and several."""
    import hacrl.agent.samplers.attention as attention

    if not DEVICE.startswith("cuda") or attention._triton_kernel() is None:
        pytest.skip("needs CUDA and Triton")
    torch.manual_seed(0)
    for batch, heads, kv_heads, length, dim in [(256, 16, 8, 576, 128), (3, 32, 8, 5120, 64), (17, 8, 2, 1000, 128)]:
        query = torch.randn(batch, heads, dim, device=DEVICE, dtype=dtype)
        key = torch.randn(batch + 5, kv_heads, length, dim, device=DEVICE, dtype=dtype)[:batch]
        value = torch.randn(batch + 5, kv_heads, length, dim, device=DEVICE, dtype=dtype)[:batch]
        lengths = torch.randint(1, length + 1, (batch,), device=DEVICE)
        lengths[0], lengths[-1] = 1, length
        expected = attention.reference_decode_attention(query.float(), key.float(), value.float(), lengths, 0.088)
        out = attention.decode_attention(query, key, value, lengths, 0.088)
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
        torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


def test_the_cuda_graph_sampler_keeps_its_graphs_when_rows_stop_at_different_steps(tmp_path):
    """After one warm-up, calls whose rows stop at different steps (and so compact into other row counts) cause
    no recompilation and no CUDA-graph skip (torch's own counters), two agents in one process each compile once,
    and greedy outputs equal `hf`'s on the same device."""
    from torch._dynamo.utils import counters

    from hacrl.agent.model import Agent
    from hacrl.agent.samplers.static import StaticSampler
    from hacrl.config import AgentConfig, RolloutConfig

    def counts():
        skips = sum(v for k, v in counters["inductor"].items() if "cudagraph_skip" in k)
        return int(counters["stats"].get("unique_graphs", 0)), skips  # a recompilation is another unique graph

    questions = [f"{a} + {b} =" for a in range(6) for b in range(6)]
    for name in ("llama", "qwen"):
        cfg = AgentConfig(name=name, model=str(_lively(tmp_path, name)), device=DEVICE, rollout_backend="hf")
        agent = Agent(0, cfg, RolloutConfig(max_new_tokens=40))
        prompts = [agent.render_prompt([{"role": "user", "content": q}])[0] for q in questions]
        plain = agent.sampler.sample(prompts, 1, greedy=True, batch_size=36)
        agent.stop_ids = sorted({agent.eos_id, *(plain[i].response_ids[2 + i % 5] for i in range(6))})
        reference = agent.sampler.sample(prompts, 1, greedy=True, batch_size=36)
        assert len({len(s.response_ids) for s in reference}) > 3
        sampler = StaticSampler(agent, cuda_graphs=True, sync_every=4)
        sampler.sample(prompts, 1, greedy=True, batch_size=36)  # warm-up: compiles, captures graphs as met
        sampler.sample(prompts, 2, batch_size=36)
        before = counts()
        for rows in (36, 30, 11):
            out = sampler.sample(prompts[:rows], 1, greedy=True, batch_size=36)
            assert [s.response_ids for s in out] == [s.response_ids for s in reference[:rows]]
        sampler.sample(prompts, 3, batch_size=36, temperature=0.7)
        assert counts() == before, (name, before, counts())
