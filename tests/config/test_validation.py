"""Inputs checked before anything runs: values that would fail late, YAML that would hang or leak a secret, data
that cannot be read, each refused with the key or file and line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hacrl.checkpoint import checkpoint_problems
from hacrl.tools.cli import main
from tests.conftest import fails_cleanly, pair_config, records, write_config

# -- inputs checked before anything runs -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agents.0.lr=.inf", "agents.0.lr=inf must be a finite number"),
        ("scoring.timeout=.inf", "scoring.timeout=inf must be a finite number"),
        ("algorithm.r_max=.nan", "algorithm.r_max"),
        ("rollout.group_size=1000000", "2 x 1000000 = 2,000,000 responses per agent and step is past hacrl's limits"),
        ("trainer.output_dir=${oc.env:HOME}/run", "is an interpolation"),
        # issue 61, 9: device names were not checked (tracebacks from inside torch)
        ("agents.0.device=banana", "agents.0.device='banana' is not a torch device name"),
        ("agents.1.devices=[cuda:x]", "agents.1.devices.0='cuda:x' is not a torch device name"),
        # issue 58: a rollout budget per agent
        ("agents.1.group_size=0", "agents.1.group_size must be >= 1 or null, got 0"),
        ("agents.0.group_size=3", "trainer.prompts_per_step x agents.0.group_size = 6; choose one of [1, 2, 3, 6]"),
        ("agents.0.group_size=100000", "2 x 100000 = 200,000 responses per agent and step is past hacrl's limits"),
    ],
)
def test_values_that_would_fail_late_are_refused_at_validation(override, message, tiny_agents, tmp_path, capsys):
    assert main(["train", str(pair_config(tiny_agents, tmp_path)), override]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA GPU")
@pytest.mark.parametrize("override", ["agents.0.device=cuda:0", "agents.0.device=cuda", "agents.1.devices=[cuda:0]"])
def test_a_gpu_this_machine_lacks_is_named_before_any_model_loads(override, tiny_agents, tmp_path, capsys):
    """Issue 61, 9: `hacrl plan` plans GPU runs on any machine, so the config accepts them; `train` and `eval`
    check that this machine has the device (local backend) and refuse with the key, leaving nothing behind."""
    key = override.split("=")[0].replace("devices", "devices.0")
    cfg = pair_config(tiny_agents, tmp_path)
    fails_cleanly(capsys, ["train", str(cfg), override], f"{key}=", "but torch sees no CUDA GPU on this machine")
    assert not (tmp_path / "run").exists()
    fails_cleanly(capsys, ["eval", str(tiny_agents["llama"]), "--config", str(cfg), override], "no CUDA GPU")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("trainer: &a\n  steps: *a\n", "a YAML alias refers to itself"),
        ("".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else '1'] * 9)}]\n" for i in range(8)),
         "aliases expand to more than 100,000 values"),
        ("logging:\n  tensorboard_dir: ${oc.env:SECRET_TOKEN}\n",
         "key logging.tensorboard_dir: '${oc.env:SECRET_TOKEN}' is an interpolation"),
    ],
)  # fmt: skip
def test_yaml_that_would_hang_or_leak_a_secret_is_refused(yaml_text, message, tmp_path, capsys):
    """A self-referencing alias (RecursionError), a 400-byte "billion laughs" file (minutes of OmegaConf), an
    environment interpolation (the resolved secret written into config.yaml and every checkpoint)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    start = __import__("time").perf_counter()
    assert main(["train", str(cfg)]) == 2
    assert __import__("time").perf_counter() - start < 10
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize(("row", "what"), [('{"prompt": [], "answer": "1"}', "holds 0 chat messages and no text"),
                                           ('{"prompt": "  ", "answer": "1"}', "is empty")])  # fmt: skip
def test_an_empty_prompt_is_refused_at_load_with_file_and_line(row, what, tiny_agents, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n' + row + "\n")
    cfg = pair_config(tiny_agents, tmp_path, data={"source": "file", "train_file": str(data), "eval_file": str(data)})
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{data}:2: data.prompt_column='prompt' {what}" in err and "Traceback" not in err, err


def test_a_huge_prompt_is_cut_by_characters_before_tokenizing(tiny_agents):
    """A 20 MB prompt row: cut to max_prompt_tokens x (longest token + 1) characters before the tokenizer sees it,
    with the same ids as cutting the full tokenization (the prompt's end, where the generation prompt is)."""
    import time

    from hacrl.agent.model import Agent
    from hacrl.config import AgentConfig, RolloutConfig

    agent = Agent(0, AgentConfig(name="q", model=str(tiny_agents["qwen"])), RolloutConfig(max_prompt_tokens=64))
    text = "1 + 2 = 3. " * 2_000_000
    start = time.perf_counter()
    ids, cut = agent.render_prompt([{"role": "user", "content": text}])
    assert cut and len(ids) == 64 and time.perf_counter() - start < 5
    small = "1 + 2 = 3. " * 2_000
    full = agent.tokenizer(agent.tokenizer.apply_chat_template([{"role": "user", "content": small}],
                           add_generation_prompt=True, tokenize=False), add_special_tokens=False).input_ids  # fmt: skip
    assert agent.render_prompt([{"role": "user", "content": small}])[0] == full[-64:]


@pytest.mark.slow
def test_a_full_disk_while_writing_a_checkpoint_is_one_message_and_the_old_one_stays(
    tiny_agents, tmp_path, monkeypatch, capsys
):
    """safetensors / torch raise their own error types on a full disk (a traceback, exit 1, before): now the one
    error path, exit 2; the step-1 checkpoint is intact and no temporary is left."""
    from transformers import PreTrainedModel

    real = PreTrainedModel.save_pretrained
    calls = {"n": 0}

    def disk_full(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 2:  # both agents' step-1 parts written, then the disk is full
            raise RuntimeError("[enforce fail at inline_container.cc:659] . unexpected pos 64 vs 0: No space left")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", disk_full)
    cfg = pair_config(tiny_agents, tmp_path)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "could not write agent 'llama''s part of a checkpoint" in err and "No space left" in err
    assert "The previous checkpoint is intact" in err and "Traceback" not in err
    run = tmp_path / "run"
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]
    assert checkpoint_problems(run / "checkpoints" / "step_000001") == []


@pytest.mark.slow
def test_a_damaged_rng_file_without_digest_checks_is_a_checkpoint_error(tiny_agents, tmp_path, capsys):
    cfg = pair_config(tiny_agents, tmp_path, trainer={"steps": 1})
    assert main(["train", str(cfg)]) == 0
    rng = tmp_path / "run" / "checkpoints" / "step_000001" / "rng" / "qwen.pt"
    # readable, the wrong content, and a manifest that agrees on its size: only the (disabled) digest check sees it
    torch.save({"cpu": torch.zeros(7, dtype=torch.uint8), "optimizer_steps": 4}, rng)
    state_file = rng.parents[1] / "state.json"
    state = json.loads(state_file.read_text())
    state["files"]["rng/qwen.pt"]["size"] = rng.stat().st_size
    state_file.write_text(json.dumps(state))
    capsys.readouterr()
    assert main(["train", str(cfg), "--resume", "trainer.steps=2", "checkpoint.verify_digests=false"]) == 2
    err = capsys.readouterr().err
    assert f"{rng}: cannot load the random stream of agent 'qwen'" in err and "Traceback" not in err, err
    # with digests checked (the default) it is set aside as damaged: no other checkpoint, so a clear stop too
    assert main(["train", str(cfg), "--resume", "trainer.steps=2"]) == 2
    assert "does not match its SHA-256" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_needs_only_the_checkpoint_not_the_original_model_directory(tiny_agents, tmp_path):
    """The tokenizer was read from the config's model path on resume: a run whose original model directory was
    moved away could not continue. It now comes from the checkpoint, beside the weights."""
    agents = {name: tmp_path / "models" / name for name in ("llama", "qwen")}
    for name, path in agents.items():
        shutil.copytree(tiny_agents[name], path)
    cfg = pair_config(agents, tmp_path, trainer={"steps": 1})
    assert main(["train", str(cfg)]) == 0
    shutil.rmtree(tmp_path / "models")
    assert main(["train", str(cfg), "--resume", "trainer.steps=2"]) == 0
    assert records(tmp_path / "run")[-1]["step"] == 2


def test_an_agent_on_vllm_without_vllm_installed_stops_before_any_model_loads(tiny_agents, tmp_path, capsys):
    """`rollout_backend: vllm` where vLLM is not installed: one paragraph naming the agent, the set-up that installs
    it and the fallback, before any model loads (the model directory here does not even exist)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run")
    fails_cleanly(capsys, ["train", str(cfg), "agents.1.rollout_backend=vllm", f"agents.1.model={tmp_path}/none"],
                  "agents.1 ('qwen') samples with vLLM, not installed here", "make setup-vllm",
                  "rollout.backend=hf")  # fmt: skip


def test_the_static_sampler_under_an_older_transformers_stops_before_any_model_loads(tiny_agents, tmp_path, capsys,
                                                                                     monkeypatch):  # fmt: skip
    """Issue 87.17: in .venv-vllm (transformers 5.19) `rollout.backend: static` was accepted, the model loaded, and
    the first sample died with `AttributeError: 'NoneType' object has no attribute 'shape'`. Refused before any model
    loads (the directory does not exist), naming the version; `make test-vllm` meets it with the real 5.19."""
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "5.19.0" if name == "transformers" else real(name))
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run")
    fails_cleanly(capsys, ["train", str(cfg), "agents.0.rollout_backend=static", f"agents.0.model={tmp_path}/none"],
                  "agents.0 ('llama') samples with the static sampler, which needs transformers >= 5.20",
                  "this environment has 5.19.0", "agents.0.rollout_backend=hf")  # fmt: skip
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_non_finite_logits_while_sampling_are_one_message_for_either_sampler(tiny_agents, tmp_path, monkeypatch,
                                                                              capsys):  # fmt: skip
    """hf: torch.multinomial's raw error becomes a message naming the agent; static: its sync points check the
    logits (no extra host sync) and stop instead of drawing arbitrary tokens."""
    from hacrl.agent.model import Agent
    from hacrl.config import AgentConfig, RolloutConfig
    from hacrl.errors import NonFiniteError

    def nan_probabilities(*args, **kwargs):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")

    monkeypatch.setattr("hacrl.agent.sampling.generate", nan_probabilities)
    assert main(["train", str(pair_config(tiny_agents, tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "agent 'llama': its model produced NaN or inf during sampling at step 1" in err and "Traceback" not in err
    agent = Agent(0, AgentConfig(name="q", model=str(tiny_agents["qwen"]), rollout_backend="static"),
                  RolloutConfig(max_new_tokens=16))  # fmt: skip
    with torch.no_grad():
        agent.model.get_output_embeddings().weight[5, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="agent 'q': the model's next-token logits hold NaN or inf"):
        agent.sampler.sample([[3, 4, 5]], 4, batch_size=4)


def test_a_missing_model_directory_is_named_before_any_data_loads(tiny_agents, tmp_path, capsys, monkeypatch):
    """A preset's placeholder model path fails at once with its key and the fix, before the data (a Hub set can take
    a minute of retries to fail offline) and before any worker starts."""
    import hacrl.driver.trainer

    def no_data(*args, **kwargs):
        raise AssertionError("the data were loaded before the model directories were checked")

    monkeypatch.setattr(hacrl.driver.trainer, "load_task", no_data)
    cfg = write_config(tmp_path / "c.yaml", {"llama": tiny_agents["llama"], "qwen": tmp_path / "nowhere"},
                       ["llama", "qwen"], tmp_path / "run")  # fmt: skip
    fails_cleanly(
        capsys, ["train", str(cfg)], f"model error: agents.1.model: {str(tmp_path / 'nowhere')!r} is not a Hugging",
        "(does not exist); hacrl loads local directories only", "`agents.1.model=/models/<name>` on the command line"
    )  # fmt: skip
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_lora_agent_on_vllm_is_asked_to_merge_its_adapters(tiny_agents, tmp_path):
    """vLLM is handed a plain model's weights: a LoRA agent on it without `lora.merge_for_sampling` is refused before
    anything loads, with the key to set."""
    import yaml

    from hacrl.config import load_config
    from hacrl.errors import ConfigError

    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run")
    written = yaml.safe_load(cfg.read_text())
    written["agents"][1].update(rollout_backend="vllm", lora={"r": 4})
    cfg.write_text(yaml.safe_dump(written))
    with pytest.raises(ConfigError, match=r"agents\.1\.lora\.merge_for_sampling=true"):
        load_config(cfg)
    load_config(cfg, ["agents.1.lora.merge_for_sampling=true"])
