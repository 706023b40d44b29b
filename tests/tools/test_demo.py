"""The built-in test bed through the same code path as `make demo`, at a size that runs in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hacrl.tools.cli import main
from hacrl.tools.testbed.demo import worked_solution


@pytest.mark.parametrize(
    ("expression", "target"),
    [
        ("347 + 85", "12,13,4\n432"),
        ("0 + 0", "0\n0"),
        ("999 + 1", "10,10,10,1\n1000"),
        ("12 + 345", "7,5,3\n357"),
        ("432 - 85", "-3,-6,3\n347"),  # 2-5 = -3 (borrow), 3-8-1 = -6 (borrow), 4-0-1 = 3
        ("100 - 99", "-9,-10,0\n1"),  # 0-9 = -9, 0-9-1 = -10, 1-0-1 = 0
        ("7 - 7", "0\n0"),
        ("1000 - 1", "-1,-1,-1,0\n999"),
        ("58 - 23", "5,3\n35"),
    ],
)
def test_worked_solution(expression, target):
    assert worked_solution(expression) == target


def test_worked_solution_refuses_other_expressions():
    with pytest.raises(ValueError, match="'a \\+ b' or 'a - b'"):
        worked_solution("3 * 4")
    with pytest.raises(ValueError, match="non-negative result"):
        worked_solution("85 - 432")


def test_sub_skill_mix_and_seeded_recipes():
    from hacrl.tools.testbed.demo import DEMO, _mix, sub_skill, with_seed

    COMPLEMENT = _beds().COMPLEMENT
    assert sub_skill("Calculate 85 - 432.") == "-" and sub_skill("347 + 85") == "+"
    skills = ["+"] * 60 + ["-"] * 40
    pairs = list(range(100))
    mixed = _mix(pairs, skills, {"+": 0.85, "-": 0.15})
    assert mixed == sorted(mixed)  # the data's order
    # all 60 "+" items are kept; they must be 85 % of the mix: 60 / 0.85 = 70.6 items, so 10.6 -> 11 "-" items
    assert sum(skills[i] == "+" for i in mixed) == 60 and sum(skills[i] == "-" for i in mixed) == 11
    assert _mix(pairs, skills, None) is pairs
    # seed 0 is the recipe itself; other seeds move each agent's init and order, never the data
    assert with_seed(DEMO, 0) is DEMO
    seeded = with_seed(COMPLEMENT, 3)
    assert [a.seed for a in seeded.agents] == [a.seed + 3000 for a in COMPLEMENT.agents]
    assert seeded.data == COMPLEMENT.data and seeded.seed == COMPLEMENT.seed
    assert [a.sft_mix for a in seeded.agents] == [{"+": 0.85, "-": 0.15}, {"+": 0.15, "-": 0.85}]


@pytest.mark.slow
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
    # every evaluation wrote its per-prompt records, and they agree with the logged accuracy
    from hacrl.driver.evaluation import read_eval_records

    records = {s: read_eval_records(tmp_path / "run", s) for s in (0, 1)}
    assert len(records[1]) == 32 and [r["index"] for r in records[1]] == list(range(32))
    for name in ("llama-char", "qwen-bpe"):
        accuracy = sum(r["agents"][name]["reward"] >= 1.0 for r in records[1]) / 32
        assert accuracy == pytest.approx(last[f"eval/{name}/pass@1"])
    assert "±" in out  # the change carries its paired standard error


def test_paired_change_hand_computed():
    from hacrl.driver.evaluation import paired_change

    def recs(correct):
        return [{"prompt": f"p{i}", "agents": {"a": {"reward": float(c)}}} for i, c in enumerate(correct)]

    # differences +1, 0, 0, -1, +1: mean 0.2, sample variance (0.64 + 0.04 + 0.04 + 1.44 + 0.64) / 4 = 0.7
    change, se = paired_change(recs([0, 1, 0, 1, 0]), recs([1, 1, 0, 0, 1]), "a")
    assert change == pytest.approx(0.2) and se == pytest.approx((0.7 / 5) ** 0.5)
    with pytest.raises(ValueError, match="same prompts"):
        paired_change(recs([0, 1]), recs([0, 1, 1]), "a")


def test_generated_arithmetic_task(tmp_path):
    """The complementary bed's task: subtractions never negative, answers right, splits disjoint, files repeatable."""
    from hacrl.tasks.data import load_task
    from hacrl.tools.testbed.demo import data_config, sub_skill, write_task_files

    TINY_COMPLEMENT = _beds().TINY_COMPLEMENT

    write_task_files(TINY_COMPLEMENT, tmp_path / "a")
    write_task_files(TINY_COMPLEMENT, tmp_path / "b")
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / "a" / "data" / name).read_bytes() == (tmp_path / "b" / "data" / name).read_bytes()
    task = load_task(data_config(TINY_COMPLEMENT, tmp_path / "a"))
    assert len(task.eval) == TINY_COMPLEMENT.eval_size
    assert not {ex.prompt for ex in task.train} & {ex.prompt for ex in task.eval}
    skills = [sub_skill(ex.prompt) for ex in task.train]
    assert 0.4 < skills.count("-") / len(skills) < 0.6
    for ex in task.train + task.eval:
        a, op, b = ex.columns["expression"].split()
        assert ex.prompt == f"Calculate {a} {op} {b}." and int(ex.columns["answer"]) == eval(f"{a}{op}{b}") >= 0
    with pytest.raises(ValueError, match="bootstrap directory"):
        data_config(TINY_COMPLEMENT)


def test_demo_refuses_a_recipe_whose_task_is_not_the_configs(tmp_path):
    """The benchmarks' `complement` bed with the demo's config would warm-start the complementary agents and then
    train them on additions only: refused before anything is built, naming the task and where the bed runs."""
    from hacrl.errors import ConfigError
    from hacrl.tools.testbed.demo import run_demo

    out = tmp_path / "agents"
    overrides = [f"agents.0.model={out}/llama-char", f"agents.1.model={out}/qwen-bpe",
                 f"trainer.output_dir={tmp_path / 'run'}"]  # fmt: skip
    with pytest.raises(ConfigError) as error:
        run_demo("configs/demo.yaml", overrides, _beds().COMPLEMENT)
    assert "another task" in str(error.value) and "data/train.jsonl" in str(error.value)
    assert "evidence.py --beds complement" in str(error.value)
    assert not out.exists()


def test_the_cli_offers_the_demos_recipes():
    from hacrl.tools.cli import _parser
    from hacrl.tools.testbed.demo import RECIPES

    demo = _parser()._subparsers._group_actions[0].choices["demo"]
    recipe = next(a for a in demo._actions if a.dest == "recipe")
    assert recipe.choices == list(RECIPES)


def _beds():
    """The benchmarks' bootstrap recipes (`benchmarks/beds.py`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "benchmark_beds", Path(__file__).parents[2] / "benchmarks" / "beds.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
