"""Out of memory in any phase is a clear stop that resumes smaller; non-finite numbers never reach a checkpoint."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from hacrl.checkpoint import checkpoint_problems, latest_checkpoint
from hacrl.tools.cli import main
from tests.conftest import pair_config, records

# -- out of memory and non-finite numbers ----------------------------------------------------------------------------


def _poison_weights(source, target):
    """A copy of agent directory `source` with one NaN in its weights."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    weights = load_file(target / "model.safetensors")
    name = sorted(weights)[0]
    weights[name].view(-1)[3] = float("nan")
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    return name


@pytest.mark.slow
def test_weights_holding_nan_are_refused_at_load(tiny_agents, tmp_path, capsys):
    """Used to give a raw torch.multinomial traceback at the first sampling call."""
    name = _poison_weights(tiny_agents["llama"], tmp_path / "nan-llama")
    cfg = pair_config({**tiny_agents, "llama": tmp_path / "nan-llama"}, tmp_path)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"agents.0.model: the weights in {str(tmp_path / 'nan-llama')!r} hold NaN or inf (first: {name})" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_an_injected_nan_loss_skips_the_optimizer_step_and_the_checkpoint_is_finite(tiny_agents, tmp_path, monkeypatch):
    from hacrl.agent.learning import LearningRole as Worker

    real = Worker._micro_batch_loss

    def nan_loss(self, *args, **kwargs):
        from dataclasses import replace

        out = real(self, *args, **kwargs)
        return replace(out, loss=out.loss * float("nan")) if self.name == "qwen" else out

    monkeypatch.setattr(Worker, "_micro_batch_loss", nan_loss)
    cfg = pair_config(tiny_agents, tmp_path, trainer={"steps": 1})
    assert main(["train", str(cfg)]) == 0
    last = records(tmp_path / "run")[-1]
    # every mini-batch whose loss reaches the weights is skipped (one without a gradient path takes no step anyway)
    assert last["qwen/skipped_steps"] >= 2 and last["llama/skipped_steps"] == 0
    saved = load_file(tmp_path / "run" / "checkpoints" / "step_000001" / "agents" / "qwen" / "model.safetensors")
    before = load_file(tiny_agents["qwen"] / "model.safetensors")
    assert all(torch.equal(saved[k], before[k]) for k in before)  # no step taken, nothing non-finite written


@pytest.mark.slow
def test_weights_that_turn_nan_are_never_checkpointed(tiny_agents, tmp_path, monkeypatch, capsys):
    """An update that leaves NaN in the weights (here injected after step 2's optimizer steps): the run stops at
    the checkpoint with one message; the newest checkpoint is step 1's, finite, and the run resumes from it."""
    from hacrl.agent.learning import LearningRole as Worker

    real = Worker._update

    def poisoning(self, *args, **kwargs):
        metrics = real(self, *args, **kwargs)
        if self.optimizer_steps >= 8 and self.name == "llama":
            with torch.no_grad():
                next(self.agent.model.parameters()).view(-1)[0] = float("nan")
        return metrics

    monkeypatch.setattr(Worker, "_update", poisoning)
    cfg = pair_config(tiny_agents, tmp_path)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "agent 'llama': its weights hold NaN or inf after 8 optimizer steps" in err and "Traceback" not in err
    run = tmp_path / "run"
    assert latest_checkpoint(run).name == "step_000001" and checkpoint_problems(latest_checkpoint(run)) == []
    monkeypatch.setattr(Worker, "_update", real)
    assert main(["train", str(cfg), "--resume"]) == 0
    assert latest_checkpoint(run).name == "step_000003"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "phase", "knob", "host"),
    [
        ("hacrl.agent.sampling.generate", "sampling", "rollout.batch_size", False),
        ("hacrl.agent.sampling.SamplingRole.old_logprobs", "old log-probs", "trainer.logprob_batch_size", False),
        ("hacrl.agent.learning.LearningRole._update", "the update",
         "trainer.micro_batch_size, agents.1.gradient_checkpointing", False),
        ("hacrl.agent.sampling.generate_completions", "evaluation", "eval.batch_size", False),
        ("hacrl.agent.learning.LearningRole._update", "the update", "runtime.host_memory=release", True),
    ],
)  # fmt: skip
def test_out_of_memory_in_any_phase_is_a_clear_stop_and_resumes_smaller(
    target, phase, knob, host, tiny_agents, tmp_path, monkeypatch, capsys
):
    """torch.OutOfMemoryError injected at the second call of a phase (step 2, or the final evaluation) for the
    second agent: exit 2, one message with the agent, the phase and the knob; the step-1 checkpoint is intact and
    the run resumes with a smaller setting. `host`: a real allocation the CPU allocator refuses (its error is a
    plain RuntimeError; issue 42 met it as a traceback and exit 1)."""
    import importlib

    module_name, _, attr = target.rpartition(".")
    try:
        owner = importlib.import_module(module_name)
    except ModuleNotFoundError:  # a class's method
        module_name, _, cls = module_name.rpartition(".")
        owner = getattr(importlib.import_module(module_name), cls)
    real = getattr(owner, attr)
    calls = {"n": 0}

    def failing(*args, **kwargs):
        worker_or_agent = args[0]
        name = getattr(worker_or_agent, "name", None)
        if name == "qwen":
            calls["n"] += 1
            if calls["n"] == 2 and host:
                torch.empty(2**50, dtype=torch.uint8)  # a petabyte: DefaultCPUAllocator: can't allocate memory
            if calls["n"] == 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, failing)
    sections = {"eval": {"at_start": True}} if phase == "evaluation" else {}
    cfg = pair_config(tiny_agents, tmp_path, trainer={"steps": 2}, **sections)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"agent 'qwen' ran out of memory on cpu during {phase}" in err and knob in err, err
    assert "--resume KEY=VALUE" in err and "Traceback" not in err
    run = tmp_path / "run"
    assert latest_checkpoint(run) is not None and checkpoint_problems(latest_checkpoint(run)) == []
    monkeypatch.setattr(owner, attr, real)
    assert main(["train", str(cfg), "--resume", "trainer.micro_batch_size=1", "trainer.logprob_batch_size=2"]) == 0
    assert latest_checkpoint(run).name == "step_000002"
