"""The paper's named sets and `data.source: datasets` (issue 26), on small files with each real dataset's schema:
no network. Rows are hand-written in the shape the Hub's copies have, awkward cases included."""

from __future__ import annotations

import json
import os
import re

import pytest

from hacrl.config import DatasetSpec, load_config
from hacrl.errors import DataError, HacrlWarning
from hacrl.tasks.sources import MATH_TEMPLATE, NAMED_SETS, gold_answer, prepare, read_rows

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
    "olympiadbench": (["\\sqrt{2}, -\\sqrt{2}", "\\frac{1}{2}"], 1),
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
    # issue 61, 26: mkstemp's 0600 made the files unreadable to others in a shared data directory
    umask = os.umask(0)
    os.umask(umask)
    for file in (out / "math" / "manifest.json", out / "gsm8k" / "test.jsonl"):
        assert file.stat().st_mode & 0o777 == 0o666 & ~umask, file
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the prepared files are found first: no Hub lookup at all
    rows = read_rows(DatasetSpec(set="gsm8k"), out)
    assert rows.answers == ["72", "1024"] and rows.where == str(out / "gsm8k" / "test.jsonl")


@pytest.mark.slow
def test_a_run_trains_on_a_named_set_through_the_trainer(tiny_agents, tmp_path):
    """data.source=datasets end to end: MATH-shaped training rows and MATH-500-shaped eval rows, prompts in the
    paper's template, scored by the math verifier against the gold answers."""
    from hacrl.tasks.data import load_task
    from hacrl.tasks.rewards import math_reward
    from hacrl.tools.cli import main
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
    with pytest.raises(DataError, match=r"data.train.set: \['math5000'\] are not named sets; choose one of"):
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
    from hacrl.tools.cli import main

    assert main(["data", "list"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in NAMED_SETS) and "openai/gsm8k (main)" in listing
    _write(tmp_path / "src", "aime25")
    assert main(["data", "prepare", "aime25", "--out", str(tmp_path / "out"), "--from", str(tmp_path / "src")]) == 0
    out = capsys.readouterr().out
    assert "aime25: 1 rows" in out and "the Hub's split has 30" in out and "data.datasets_dir=" in out


@pytest.mark.slow
def test_benchmarks_are_evaluated_during_training_and_after_it(tiny_agents, tmp_path, capsys):
    """eval.benchmarks: each agent alone on named sets read from prepared files; per benchmark greedy pass@1,
    avg@k and pass@k in the metrics, a table (markdown + JSON), per-prompt records and curves; then `hacrl eval
    RUN_DIR --benchmarks` on the checkpoint."""
    from hacrl.driver.metrics import unknown_keys
    from hacrl.tools.cli import main
    from tests.conftest import fails_cleanly, write_config

    source = tmp_path / "downloads"
    for name in ("math500", "gsm8k"):
        _write(source, name)
    prepare(["math500", "gsm8k"], tmp_path / "data", source=source)
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run,
                       data={"datasets_dir": str(tmp_path / "data")}, trainer={"steps": 1},
                       eval={"at_start": True, "benchmarks": ["math500", "gsm8k"], "num_samples": 2})  # fmt: skip
    assert main(["train", str(cfg)]) == 0
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [key for r in records for key in unknown_keys(r)] == []
    for record in records:  # step 0 and step 1
        for key in ("pass@1", "avg@2", "pass@2", "length_mean"):
            assert 0 <= record[f"eval/qwen/gsm8k/{key}"] and f"eval/llama/math500/{key}" in record
        assert "eval/qwen/pass@1" in record  # the eval split is still evaluated beside them
    assert len((run / "eval" / "gsm8k" / "step_000001.jsonl").read_text().splitlines()) == 2
    table = (run / "eval" / "benchmarks" / "benchmarks_step_000001.md").read_text()
    assert "| agent | math500 pass@1 | math500 avg@2 | math500 pass@2 | gsm8k pass@1 |" in table
    saved = json.loads((run / "eval" / "benchmarks" / "benchmarks_step_000001.json").read_text())
    assert saved["results"]["qwen"]["gsm8k"]["pass@1"] == records[-1]["eval/qwen/gsm8k/pass@1"]
    assert main(["plot", str(run)]) == 0 and (run / "benchmarks.png").read_bytes()[:4] == b"\x89PNG"
    # issue 61, 5: --out DIR/x.png also wrote DIR/benchmarks.png; now the file named holds both rows of panels
    mine = tmp_path / "figures"
    mine.mkdir()
    (mine / "benchmarks.png").write_text("the user's")
    assert main(["plot", str(run), "--out", str(mine / "x.png")]) == 0
    assert (mine / "x.png").read_bytes()[:4] == b"\x89PNG" and (mine / "benchmarks.png").read_text() == "the user's"
    capsys.readouterr()
    out = tmp_path / "table"
    # issue 61, 24: every table was named step 0, and a second evaluation replaced the first; --out FILE: traceback
    for number in ("", "_2"):
        assert main(["eval", str(run), "--config", str(cfg), "--benchmarks", "gsm8k", "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        assert "| llama (step_000001) |" in printed and "gsm8k pass@1" in printed
        assert f"written: {out / f'benchmarks_step_000001{number}'}.md and .json" in printed
    assert json.loads((out / "benchmarks_step_000001.json").read_text())["step"] == 1
    assert (out / "benchmarks_step_000001_2.json").is_file()
    fails_cleanly(capsys, ["eval", str(run), "--config", str(cfg), "--benchmarks", "gsm8k", "--out",
                           str(mine / "x.png")], "is a file: name a directory")  # fmt: skip
    assert main(["eval", str(run), "--config", str(cfg), "--benchmarks", "gsm9k"]) == 2


def test_pass_at_k_avg_at_k_and_the_table_hand_computed():
    """Two prompts, k = 2 samples each: right / wrong and wrong / wrong -> avg@2 = 1/4, pass@2 = 1/2."""
    from hacrl.driver.evaluation import benchmark_table, completion_metrics
    from hacrl.driver.scoring import ScoreResult
    from hacrl.messages import Completion
    from hacrl.tasks.data import Example

    class Exact:
        r_max = 1.0

        def score(self, prompts, completions, columns):
            return ScoreResult([float(c == a) for c, a in zip(completions, columns["answer"], strict=True)])

    examples = [Example(messages=[], prompt=f"q{i}", columns={"answer": str(i)}) for i in range(2)]
    greedy = [Completion("0", 1, True), Completion("5", 1, False)]
    sampled = [Completion(t, 1, True) for t in ("0", "9", "7", "8")]
    m = completion_metrics(examples, greedy, sampled, Exact(), num_samples=2)
    assert (m["pass@1"], m["avg@2"], m["pass@2"], m["finished"]) == (0.5, 0.25, 0.5, 0.5)
    table = benchmark_table({"a": {"gsm8k": m, "aime25": {**m, "pass@1": 0.0}}}, step=3)
    assert "| a | 50.0 | 25.0 | 50.0 | 0.0 | 25.0 | 50.0 | 25.0 | 25.0 | 50.0 |" in table  # means: 25, 25, 50


def test_an_unknown_benchmark_is_a_config_error():
    with pytest.raises(Exception, match=r"eval.benchmarks: \['gsm9k'\] are not named sets"):
        load_config("configs/demo.yaml", ["eval.benchmarks=[gsm9k]"])


def test_arrow_files_and_saved_datasets_are_read_too(tmp_path):
    """The other local forms `datasets` writes: an Arrow stream file and a `save_to_disk` directory."""
    import datasets
    import pyarrow as pa

    split, rows = REAL["aime25"]
    table = pa.Table.from_pylist(rows)
    with pa.ipc.new_stream(tmp_path / f"{split}.arrow", table.schema) as writer:
        writer.write_table(table)
    assert read_rows(DatasetSpec(set="aime25", path=str(tmp_path / f"{split}.arrow"))).answers == ["70"]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    assert read_rows(DatasetSpec(set="aime25", path=str(tmp_path / "saved"))).answers == ["70"]


# A right and a near-miss response per row of each set, in the forms models write (the gold read from the real schema).
RESPONSES = {
    "math": [("so the fraction is $\\boxed{0.75}$.", "so the fraction is $\\boxed{\\frac{4}{3}}$."),
             ("$\\sin 60^\\circ = \\boxed{\\dfrac{\\sqrt3}{2}}$", "$\\sin 60^\\circ = \\boxed{\\frac{\\sqrt{2}}{2}}$"),
             ("The side is $\\boxed{5}$ cm.", "The side is $\\boxed{2\\text{ cm}}$.")],
    "math500": [("the point is $\\boxed{(3, \\frac{\\pi}{2})}$", "the radius is $\\boxed{3}$"),
                ("$0.5 + 0.25 = \\boxed{0.75}$", "$\\boxed{\\frac{3}{5}}$")],
    "gsm8k": [("48 + 24 = 72\n#### 72", "48 + 48 = 96\n#### 96"), ("2^10 = \\boxed{1,024}", "\\boxed{1,042}")],
    "aime25": [("The sum is $\\boxed{070}$.", "The sum is $\\boxed{7}$.")],
    "amc23": [("\\boxed{27}", "\\boxed{28}"), ("The ratio is $\\boxed{\\frac{1}{2}}$", "The ratio is $\\boxed{2}$")],
    "minerva": [("Final Answer: The final answer is 11.2. I hope it is correct.", "So $v=\\boxed{11.3}$ km/s.")],
    "olympiadbench": [("$x = \\boxed{\\pm\\sqrt{2}}$", "$x = \\boxed{\\sqrt{2}}$"),
                      ("The answer is $\\boxed{\\frac12}$.", "The answer is $\\boxed{\\frac13}$.")],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REAL))
def test_each_named_sets_golds_score_right_and_near_miss_answers(name, tmp_path):
    """The gold as read from the set's real schema, through the math verifier: each right form 1, each near miss 0."""
    from hacrl.tasks.rewards import math_reward

    rows = read_rows(DatasetSpec(set=name, path=str(_write(tmp_path, name))))
    pairs = RESPONSES[name]
    assert len(pairs) == len(rows.answers)
    right, wrong = zip(*pairs, strict=True)
    reward = math_reward()
    assert reward(["q"] * len(right), list(right), rows.answers) == [1.0] * len(right)
    assert reward(["q"] * len(wrong), list(wrong), rows.answers) == [0.0] * len(wrong)


def test_prepare_never_replaces_files_it_did_not_write(tmp_path, capsys):
    """Issue 42: `data prepare --out DIR` silently replaced a user's <set>/<split>.jsonl and manifest.json."""
    from hacrl.tools.cli import main

    source = tmp_path / "downloads"
    for name in ("math", "gsm8k"):
        _write(source, name)
    out = tmp_path / "out"
    (out / "gsm8k").mkdir(parents=True)
    mine = out / "gsm8k" / "test.jsonl"
    mine.write_text('{"question": "my own", "answer": "1"}\n')
    args = ["data", "prepare", "math", "gsm8k", "--out", str(out), "--from", str(source)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{mine} already exist and were not written by hacrl data prepare" in err and "Traceback" not in err
    assert mine.read_text() == '{"question": "my own", "answer": "1"}\n'
    assert not (out / "math").exists()  # every target is checked before anything is written
    mine.unlink()
    assert main(args) == 0 and (out / "gsm8k" / "manifest.json").is_file()
    assert main(args) == 0  # its own files: written again
    assert sorted(p.name for p in (out / "gsm8k").iterdir()) == ["manifest.json", "test.jsonl"]  # no temporaries
    with open(out / "math" / "train.jsonl", "a") as f:
        f.write('{"question": "added by hand", "answer": "2"}\n')
    assert main(args) == 2 and "were changed since" in capsys.readouterr().err


def test_prepare_reads_a_local_copy_of_a_hub_repository_with_configs(tmp_path, capsys):
    """GSM8K's repository has two configs (`main`, `socratic`); a local copy of it failed with "Config name is
    missing": the named set's config is used when the directory declares configs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hacrl.tools.cli import main

    def hub_copy(root, main_answer):
        repo = root / "gsm8k"
        configs = ""
        for config, answer in (("main", main_answer), ("socratic", "#### 99")):
            (repo / config).mkdir(parents=True)
            rows = [{"question": f"{config} question", "answer": f"work\n{answer}"}]
            for split in ("train", "test"):
                pq.write_table(pa.Table.from_pylist(rows), repo / config / f"{split}-00000-of-00001.parquet")
            configs += (f"- config_name: {config}\n  data_files:\n  - split: train\n    path: {config}/train-*\n"
                        f"  - split: test\n    path: {config}/test-*\n")  # fmt: skip
        (repo / "README.md").write_text(f"---\nconfigs:\n{configs}---\n# gsm8k\n")
        return repo

    repo = hub_copy(tmp_path / "hub", "#### 72")
    assert main(["data", "prepare", "gsm8k", "--out", str(tmp_path / "out"), "--from", str(tmp_path / "hub")]) == 0
    line = json.loads((tmp_path / "out" / "gsm8k" / "test.jsonl").read_text())
    assert line["question"] == "main question" and line["answer"] == "72"
    # a second copy with the same name and layout gets its own rows (`datasets` would serve the first from its cache)
    hub_copy(tmp_path / "hub2", "#### 73")
    assert main(["data", "prepare", "gsm8k", "--out", str(tmp_path / "out2"), "--from", str(tmp_path / "hub2")]) == 0
    assert json.loads((tmp_path / "out2" / "gsm8k" / "test.jsonl").read_text())["answer"] == "73"
    rows = read_rows(DatasetSpec(path=str(repo), split="test", name="socratic", gold="after_hash"))
    assert rows.answers == ["99"]
    with pytest.raises(DataError, match=r"holds several configs \(main, socratic\): name the one to read with"):
        read_rows(DatasetSpec(path=str(repo), split="test"))


def test_unreadable_data_files_name_the_line_or_row(tmp_path):
    """Issue 42: bytes that are not UTF-8 in a row were a UnicodeDecodeError traceback; an empty parquet file and a
    line that is not JSON gave `datasets`' generic message without the line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cases = {}
    cases["empty.parquet"] = (b"", "the file is empty (0 bytes)")
    bad_text = pa.array([b"What is 1+1?", b"What is 2+2?\xff"], type=pa.binary()).view(pa.string())
    pq.write_table(pa.table({"problem": bad_text, "answer": ["2", "4"]}), tmp_path / "latin.parquet")
    pq.write_table(pa.table({"problem": pa.array([], pa.string()), "answer": pa.array([], pa.string())}),
                   tmp_path / "zero.parquet")  # fmt: skip
    cases["lines.jsonl"] = (b'{"problem": "a", "answer": "1"}\n\nnot json\n', "line 3 is not JSON")
    cases["list.jsonl"] = (b'{"problem": "a", "answer": "1"}\n[1, 2]\n', "line 2 is a JSON list, not an object")
    cases["cut.json"] = (b'[{"problem": "a", "answer": "1"}, {"problem":', "it is not valid JSON (Expecting")
    cases["bytes.jsonl"] = (b'{"problem": "a", "answer": "1"}\n{"problem": "b\xff", "answer": "2"}\n',
                            "row 2, column 'problem' holds bytes that are not UTF-8 text")  # fmt: skip
    for name, (data, _) in cases.items():
        (tmp_path / name).write_bytes(data)
    cases["latin.parquet"] = (None, "row 2, column 'problem' holds bytes that are not UTF-8 text")
    cases["zero.parquet"] = (None, "the parquet file holds no rows")
    for name, (_, message) in cases.items():
        with pytest.raises(DataError, match=re.escape(message)):
            read_rows(DatasetSpec(path=str(tmp_path / name), question_column="problem"))


@pytest.mark.slow
def test_a_row_that_is_not_utf8_stops_hacrl_train_with_one_paragraph(tiny_agents, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hacrl.tools.cli import main
    from tests.conftest import write_config

    text = pa.array([b"What is 1+1?", b"\xff\xfe"], type=pa.binary()).view(pa.string())
    pq.write_table(pa.table({"problem": text, "solution": ["\\boxed{2}", "\\boxed{4}"]}), tmp_path / "train.parquet")
    data = {"source": "datasets", "train": {"set": "math", "path": str(tmp_path / "train.parquet")}}
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama"], tmp_path / "run", data=data)
    assert main(["train", str(cfg), "algorithm.name=gspo"]) == 2
    err = capsys.readouterr().err
    assert "row 2, column 'problem' holds bytes that are not UTF-8 text" in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "test.jsonl: the file is empty (0 bytes)"), (b'{"question": "a", "answer": "#### 1"}\nnot json\n',
                                                        "test.jsonl: line 2 is not JSON")],
)  # fmt: skip
def test_a_bad_file_inside_a_directory_given_to_prepare_is_named(content, message, tmp_path):
    """Issue 61, 25: an empty or non-JSON file inside a directory (`data prepare --from DIR`) still got `datasets`'
    generic error; the directory's files are now diagnosed like a file given directly."""
    _write(tmp_path / "downloads", "gsm8k").write_bytes(content)
    with pytest.raises(DataError, match=re.escape(message)):
        prepare(["gsm8k"], tmp_path / "out", source=tmp_path / "downloads")
    assert not (tmp_path / "out" / "gsm8k" / "test.jsonl").exists()


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux reads the umask from /proc")
def test_the_mode_of_a_new_file_is_read_without_changing_the_umask(monkeypatch):
    """Setting the umask to read it would, for an instant, unmask the files other threads of the trainer create."""
    from hacrl.files import default_mode

    mask = os.umask(0o027)
    try:
        monkeypatch.setattr(os, "umask", lambda *_: pytest.fail("os.umask was called"))
        assert default_mode(0o666) == 0o640 and default_mode(0o777) == 0o750
    finally:
        monkeypatch.undo()
        os.umask(mask)
