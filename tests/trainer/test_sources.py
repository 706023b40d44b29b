"""The paper's named sets and `data.source: datasets` (issue 26), on small files with each real dataset's schema:
no network. Rows are hand-written in the shape the Hub's copies have, awkward cases included."""

from __future__ import annotations

import json

import pytest

from hacrl.config import DatasetSpec, load_config
from hacrl.errors import DataError, HacrlWarning
from hacrl.sources import MATH_TEMPLATE, NAMED_SETS, gold_answer, prepare, read_rows

# Each set's split in its real columns (what `datasets.load_dataset(hub_id, config, split)` gives).
REAL = {
    "math": ("train", [
        {"problem": "What is $\\frac{3}{4}$ of 1?", "level": "Level 1", "type": "Prealgebra",
         "solution": "It is $\\frac{3}{4} \\cdot 1 = \\boxed{\\frac{3}{4}}$."},
        {"problem": "Find $\\sin 60^\\circ$.", "level": "Level 2", "type": "Precalculus",
         "solution": "By the triangle, $\\boxed{\\frac{\\sqrt{3}}{2}}$ (nested braces)."},
        {"problem": "How long is the side?", "level": "Level 5", "type": "Geometry",
         "solution": "First \\boxed{2}, corrected: the side is $\\boxed{5\\text{ cm}}$."},
        {"problem": "A solution without a boxed answer.", "level": "Level 3", "type": "Algebra",
         "solution": "The answer is 7."},
    ]),
    "math500": ("test", [
        {"problem": "Convert $(0,3)$ to polar coordinates.", "solution": "... $\\boxed{\\left( 3, \\frac{\\pi}{2} "
         "\\right)}$", "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
         "unique_id": "test/precalculus/807.json"},
        {"problem": "Compute $0.5 + 0.25$.", "solution": "$\\boxed{0.75}$", "answer": "\\frac{3}{4}",
         "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json"},
    ]),
    "gsm8k": ("test", [
        {"question": "Natalia sold clips to 48 friends, then half as many. How many in all?",
         "answer": "In May she sold 48/2 = <<48/2=24>>24.\nIn all 48+24 = <<48+24=72>>72.\n#### 72"},
        {"question": "A thousand and twenty-four?", "answer": "2^10 = 1024\n#### 1,024"},
        {"question": "No final marker", "answer": "The answer is 3."},
    ]),
    "aime25": ("test", [{"problem": "Find the sum of all integer bases $b>9$ ...", "answer": "70", "id": "0"}]),
    "amc23": ("test", [{"question": "How many ... ?", "answer": 27.0, "url": "https://..."},
                       {"question": "What is the ratio?", "answer": 0.5, "url": "https://..."}]),
    "minerva": ("test", [{"question": "Compute the escape velocity in km/s.", "answer": "11.2",
                          "solution": "... so $v = \\boxed{11.2}$ km/s."}]),
    "olympiadbench": ("test", [
        {"question": "Find all $x$ with $x^2 = 2$.", "final_answer": ["$\\sqrt{2}$, $-\\sqrt{2}$"],
         "solution": ["..."], "id": 1606, "answer_type": "Numerical", "is_multiple_answer": True},
        {"question": "Compute $1/2$.", "final_answer": ["$\\frac{1}{2}$"], "solution": ["..."], "id": 1607,
         "answer_type": "Numerical", "is_multiple_answer": False},
        {"question": "An empty list of answers", "final_answer": [], "solution": [], "id": 1608,
         "answer_type": "Numerical", "is_multiple_answer": False},
    ]),
}  # fmt: skip
EXPECTED = {
    "math": (["\\frac{3}{4}", "\\frac{\\sqrt{3}}{2}", "5\\text{ cm}"], 1),
    "math500": (["\\left( 3, \\frac{\\pi}{2} \\right)", "\\frac{3}{4}"], 0),
    "gsm8k": (["72", "1024"], 1),
    "aime25": (["70"], 0),
    "amc23": (["27", "0.5"], 0),
    "minerva": (["11.2"], 0),
    "olympiadbench": (["\\sqrt{2}$, $-\\sqrt{2}", "\\frac{1}{2}"], 1),
}


def _write(root, name, fmt="jsonl"):
    """`root/<name>/<split>.<fmt>`: the set's rows in their real schema, as a local copy would hold them."""
    split, rows = REAL.get(name, REAL["math"])
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    file = directory / f"{split}.{fmt}"
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), file)
    else:
        file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return file


@pytest.mark.parametrize("name", sorted(REAL))
def test_each_named_set_reads_its_real_schema(name, tmp_path):
    file = _write(tmp_path, name, "parquet" if name in ("math", "olympiadbench") else "jsonl")
    rows = read_rows(DatasetSpec(set=name, path=str(file)))
    answers, skipped = EXPECTED[name]
    assert rows.answers == answers and rows.skipped == skipped
    named = NAMED_SETS[name]
    assert rows.questions[0] == next(r for r in REAL[name][1])[named.question]
    assert named.answer not in rows.columns[0] and named.question not in rows.columns[0]  # the rest is kept


@pytest.mark.parametrize(
    ("value", "rule", "expected"),
    [
        ("\\boxed{\\frac{a}{b}} then \\boxed{\\dfrac{1}{\\sqrt{2}}}", "boxed", "\\dfrac{1}{\\sqrt{2}}"),
        ("\\boxed{\\text{(C)}}", "boxed", "\\text{(C)}"),
        ("\\boxed{3", "boxed", None),  # unbalanced: unreadable
        ("#### -3,000,000", "after_hash", "-3000000"),
        ("12 #### 1,5", "after_hash", "1,5"),  # a comma that is not a thousands separator stays
        (["$(2, 3)$", "$(3, 2)$"], "first", "(2, 3)"),
        (7, "plain", "7"),
        (2.5, "plain", "2.5"),
        (None, "plain", None),
        ("   ", "plain", None),
    ],
)
def test_gold_answers_hand_checked(value, rule, expected):
    assert gold_answer(value, rule) == expected


def test_prepare_writes_local_files_that_a_config_reads_without_the_network(tmp_path, monkeypatch):
    source = tmp_path / "downloads"
    for name in ("math", "gsm8k"):
        _write(source, name)
    out = tmp_path / "prepared"
    report = prepare(["math", "gsm8k"], out, source=source)
    assert [(e["set"], e["rows"], e["skipped"]) for e in report] == [("math", 3, 1), ("gsm8k", 2, 1)]
    manifest = json.loads((out / "math" / "manifest.json").read_text())
    assert manifest["rows"] == 3 and len(manifest["sha256"]) == 64
    lines = [json.loads(x) for x in (out / "gsm8k" / "test.jsonl").read_text().splitlines()]
    assert lines[1]["answer"] == "1024" and lines[1]["question"].startswith("A thousand")
    assert prepare(["math"], tmp_path / "again", source=source)[0]["sha256"] == manifest["sha256"]  # repeatable
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the prepared files are found first: no Hub lookup at all
    rows = read_rows(DatasetSpec(set="gsm8k"), out)
    assert rows.answers == ["72", "1024"] and rows.where == str(out / "gsm8k" / "test.jsonl")


def test_a_run_trains_on_a_named_set_through_the_trainer(tiny_agents, tmp_path):
    """data.source=datasets end to end: MATH-shaped training rows and MATH-500-shaped eval rows, prompts in the
    paper's template, scored by the math verifier against the gold answers."""
    from hacrl.cli import main
    from hacrl.data import load_task
    from hacrl.rewards import math_reward
    from tests.conftest import write_config

    train, held_out = _write(tmp_path, "math", "parquet"), _write(tmp_path, "math500")
    data = {"source": "datasets", "train": {"set": "math", "path": str(train)},
            "eval": {"set": "math500", "path": str(held_out)}}  # fmt: skip
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run", data=data,
                       trainer={"steps": 1, "prompts_per_step": 2}, eval={"at_start": True})  # fmt: skip
    config = load_config(cfg)
    with pytest.warns(HacrlWarning, match="1 row\\(s\\) of .*train.parquet skipped: their gold answer could not be"):
        task = load_task(config.data, config.scoring)
    assert len(task.train) == 3 and len(task.eval) == 2
    first = task.train[0]
    assert first.messages == [{"role": "user", "content": MATH_TEMPLATE.replace("{question}", first.prompt)}]
    assert first.columns["answer"] == "\\frac{3}{4}" and first.columns["level"] == "Level 1"
    assert math_reward()(["p"] * 2, ["so \\boxed{0.75}", "\\boxed{3/5}"], ["\\frac{3}{4}"] * 2) == [1.0, 0.0]
    with pytest.warns(HacrlWarning, match="skipped"):
        assert main(["train", str(cfg)]) == 0
    last = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert 0 <= last["eval/qwen/pass@1"] <= 1 and "qwen/reward_mean" in last


def test_bad_data_gets_a_clear_error(tmp_path, monkeypatch):
    file = _write(tmp_path, "gsm8k")
    with pytest.raises(DataError, match=r"has no column 'problem' \(its columns: \['question', 'answer'\]\)"):
        read_rows(DatasetSpec(path=str(file), question_column="problem"))
    with pytest.raises(DataError, match="not a named set; choose one of"):
        read_rows(DatasetSpec(set="math5000"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="empty.jsonl"):
        read_rows(DatasetSpec(path=str(empty)))
    with pytest.raises(DataError, match=r"no usable row .*\(1 with a gold answer that `after_hash` cannot read\)"):
        read_rows(DatasetSpec(set="gsm8k", path=str(file), filter={"answer": ["The answer is 3."]}))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="the Hub is off .*hacrl data prepare gsm8k --out DIR"):
        read_rows(DatasetSpec(set="gsm8k"), tmp_path / "nothing-prepared")
    with pytest.raises(DataError, match="save_to_disk"):
        read_rows(DatasetSpec(path="someone/private-set"))


def test_filters_and_row_caps(tmp_path):
    file = _write(tmp_path, "math")
    hard = read_rows(DatasetSpec(set="math", path=str(file), filter={"level": ["Level 2", "Level 5"]}))
    assert hard.answers == ["\\frac{\\sqrt{3}}{2}", "5\\text{ cm}"]
    assert read_rows(DatasetSpec(set="math", path=str(file), max_rows=1)).answers == ["\\frac{3}{4}"]


def test_the_data_commands(tmp_path, capsys):
    from hacrl.cli import main

    assert main(["data", "list"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in NAMED_SETS) and "openai/gsm8k (main)" in listing
    _write(tmp_path / "src", "aime25")
    assert main(["data", "prepare", "aime25", "--out", str(tmp_path / "out"), "--from", str(tmp_path / "src")]) == 0
    out = capsys.readouterr().out
    assert "aime25: 1 rows" in out and "the Hub's split has 30" in out and "data.datasets_dir=" in out
