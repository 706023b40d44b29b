"""The built-in test bed through the same code path as `make demo`, at a size that runs in seconds."""

from __future__ import annotations

import json

import pytest

from hacrl.cli import main
from hacrl.testbed.demo import worked_solution


@pytest.mark.parametrize(
    ("expression", "target"),
    [("347 + 85", "12,13,4\n432"), ("0 + 0", "0\n0"), ("999 + 1", "10,10,10,1\n1000"), ("12 + 345", "7,5,3\n357")],
)
def test_worked_solution(expression, target):
    assert worked_solution(expression) == target


def test_bootstrap_then_demo_one_hacpo_step(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    agents = tmp_path / "agents"
    assert main(["bootstrap", "--recipe", "tiny", "--out", str(agents)]) == 0
    report = json.loads((agents / "bootstrap.json").read_text())
    assert set(report["agents"]) == {"llama-char", "qwen-bpe"}
    for name in ("llama-char", "qwen-bpe"):  # plain transformers loads and generates
        model = AutoModelForCausalLM.from_pretrained(agents / name)
        tok = PreTrainedTokenizerFast.from_pretrained(agents / name)
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "Calculate 2 + 3."}], add_generation_prompt=True, tokenize=False
        )
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
        out = model.generate(**ids, max_new_tokens=4, do_sample=False)
        assert out.shape[1] > ids.input_ids.shape[1]
    assert report["agents"]["qwen-bpe"]["parameters"] > report["agents"]["llama-char"]["parameters"]

    capsys.readouterr()
    assert main(["bootstrap", "--recipe", "tiny", "--out", str(agents)]) == 0
    assert "reusing the agents cached" in capsys.readouterr().out

    overrides = [
        f"agents.0.model={agents / 'llama-char'}",
        f"agents.1.model={agents / 'qwen-bpe'}",
        "trainer.steps=1",
        "trainer.prompts_per_step=4",
        "trainer.mini_batch_size=8",
        "trainer.micro_batch_size=8",
        "data.train_size=500",
        "data.eval_size=32",
        "rollout.group_size=4",
        f"trainer.output_dir={tmp_path / 'run'}",
        "logging.console=false",
        "checkpoint.every=0",
    ]
    assert main(["demo", "configs/demo.yaml", *overrides, "--recipe", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "llama-char" in out and "qwen-bpe" in out and "rollouts generated" in out
    assert (tmp_path / "run" / "curves.png").is_file()
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["llama-char/optimizer_steps"] == 4  # 2 own + 2 foreign mini-batches
