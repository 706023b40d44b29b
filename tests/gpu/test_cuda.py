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

from hacrl.cli import main
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
    cfg["data"] = {"source": "file", "train_file": str(train), "eval_file": str(held_out), "eval_size": 8,
                   "reward_function": "tests.reward_fixtures:digits"}  # fmt: skip
    path.write_text(yaml.safe_dump(cfg))
    return path


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_token_logprobs_and_hacpo_gradients_match_the_cpu(tiny_agents):
    """float32 on the GPU computes what the CPU computes: token log-probs, the HACPO loss and its gradient."""
    from transformers import AutoModelForCausalLM

    from hacrl.agents import load_tokenizer
    from hacrl.core import AlgorithmParams, LossInputs, hacpo_loss
    from hacrl.rollout import TokenBatch, token_logprobs

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
            source_logp_mean=torch.tensor([0.0, -1.2, -0.7], device=device),
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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_agents_train_checkpoint_and_resume_on_cuda(dtype, tiny_agents, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 2})
    _set_devices(cfg, {"llama": DEVICE, "qwen": DEVICE}, dtype)
    assert main(["train", str(cfg)]) == 0
    assert main(["train", str(cfg), "trainer.steps=3", "--resume"]) == 0
    records = _metrics(run)
    assert [r["step"] for r in records] == [1, 2, 3]
    for name in ("llama", "qwen"):
        for key in ("loss", "reward_mean", "grad_norm", "own_ratio_mean", "foreign_clip_frac"):
            assert math.isfinite(records[-1][f"{name}/{key}"]), (name, key)
        saved = run / "checkpoints" / "step_000003" / "agents" / name
        weights = load_file(saved / "model.safetensors")
        assert {str(w.dtype) for w in weights.values()} == {f"torch.{dtype}"}
        assert all(w.device.type == "cpu" for w in weights.values())
        before = load_file(tiny_agents[name] / "model.safetensors")
        assert any(not torch.equal(before[k].to(weights[k].dtype), weights[k]) for k in weights)
        AutoModelForCausalLM.from_pretrained(saved)  # loads anywhere, with plain transformers


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
