"""The learning benchmark's smoke version: the real trainer path, a few seconds, so the script cannot rot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("learning_benchmark", ROOT / "benchmarks" / "learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_learning_benchmark_smoke(tmp_path, capsys):
    bench = _load()
    methods = ["hacpo", "gspo", "gspo_x2", "hacpo_3_agents", "gspo_3_agents"]
    assert bench.main(["--smoke", "--out", str(tmp_path), "--seeds", "0", "--methods", *methods]) == 0
    runs = {p.stem for p in (tmp_path / "summaries").glob("*.json")}
    assert runs == {f"{m}-s0" for m in methods}
    gspo = json.loads((tmp_path / "summaries" / "gspo-s0.json").read_text())["agents"]["qwen-bpe"]
    x2 = json.loads((tmp_path / "summaries" / "gspo_x2-s0.json").read_text())["agents"]["qwen-bpe"]
    hacpo = json.loads((tmp_path / "summaries" / "hacpo-s0.json").read_text())["agents"]["qwen-bpe"]
    # the paper's fair comparison: GSPOx2 trains on as many sequences as a HACPO learner, with twice the rollouts
    assert x2["sequences_trained"] == hacpo["sequences_trained"] == 2 * gspo["sequences_trained"]
    assert x2["rollouts_generated"] == 2 * hacpo["rollouts_generated"]
    three = json.loads((tmp_path / "summaries" / "hacpo_3_agents-s0.json").read_text())
    assert set(three["agents"]) == {"llama-char", "qwen-bpe", "llama-bpe"}
    results = json.loads((tmp_path / "learning.json").read_text())
    assert results["table"]["qwen-bpe"]["gspo"]["delta_vs_gspo"] == 0
    hacpo_cell = results["table"]["qwen-bpe"]["hacpo"]
    assert hacpo_cell["paired_delta_vs_gspo_x2"] == [
        pytest.approx(100 * (hacpo["final_accuracy"] - x2["final_accuracy"]))
    ]
    third = results["table"]["llama-bpe"]  # its baseline is its own GSPO run among three agents
    assert third["gspo_3_agents"]["delta_vs_gspo"] == 0
    assert third["hacpo_3_agents"]["delta_vs_gspo"] == pytest.approx(
        third["hacpo_3_agents"]["accuracy_mean"] - third["gspo_3_agents"]["accuracy_mean"]
    )
    md = (tmp_path / "learning.md").read_text()
    assert "| gspo_x2 |" in md and "Reproduce:" in md
    assert (tmp_path / "learning.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "learning_diagnostics.png").read_bytes()[:4] == b"\x89PNG"
    curves = hacpo["diagnostic_curves"]
    assert [s for s, _ in curves["capability"]] == [1, 2] and len(curves["foreign_below_frac"]) == 2
    assert gspo["diagnostic_curves"]["foreign_below_frac"] == []  # nothing foreign without sharing

    stored = {p.name: p.read_text() for p in (tmp_path / "summaries").glob("*.json")}
    assert bench.main(["--smoke", "--out", str(tmp_path), "--resummarize"]) == 0  # rebuilt from .runs/: the same
    assert {p.name: p.read_text() for p in (tmp_path / "summaries").glob("*.json")} == stored

    capsys.readouterr()  # a second call finds every run cached and only aggregates
    assert bench.main(["--smoke", "--out", str(tmp_path), "--seeds", "0", "--methods", *methods]) == 0
    assert capsys.readouterr().out.count("cached in") == len(methods)


def test_gpu_throughput_script_runs_end_to_end_on_the_cpu(tmp_path):
    """`benchmarks/gpu_throughput.py --tiny`: the GPU check's code path (model shapes with the paper's
    vocabularies, every sampler, parity, log-prob memory, a HACPO step per sampler) with tiny layers on the CPU."""
    spec = importlib.util.spec_from_file_location("gpu_throughput", ROOT / "benchmarks" / "gpu_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--tiny", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu-cpu-dry-run.json").read_text())
    for model in ("qwen3-0.6b", "llama-3.2-1b"):
        backends = [b["backend"] for b in result["sampling"][model]["backends"]]
        assert backends == ["hf", "static"]
        assert all(b["tokens_per_second"] > 0 for b in result["sampling"][model]["backends"])
        parity = result["parity"][model]
        assert parity["identical"] + parity["differ_at_near_tie"] == parity["rows"]  # float32: equal or near-tie
    assert [r["ok"] for r in result["logprobs"]["runs"]] == [True, True]
    assert result["step"]["static"]["time/step"] > 0 and result["step"]["hf"]["time/step"] > 0
    assert "## One 2-agent HACPO step" in (tmp_path / "gpu-cpu-dry-run.md").read_text()


def test_throughput_benchmark_smoke(tmp_path):
    """`benchmarks/throughput.py --smoke`: hacrl's GSPO and 2-agent HACPO processes, 2 steps each, through the same
    code that measures them against TRL (TRL itself is an optional extra and not needed here)."""
    spec = importlib.util.spec_from_file_location("throughput", ROOT / "benchmarks" / "throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "throughput.json").read_text())
    table = result["summary"]["table"]
    assert set(table) == {"hacrl gspo", "hacrl hacpo x2"}
    assert table["hacrl gspo"]["work"]["completions"] == 256 and table["hacrl gspo"]["work"]["optimizer_steps"] == 1
    assert table["hacrl hacpo x2"]["work"]["completions"] == 512
    assert all(s > 0 for r in result["runs"] for s in r["seconds"])
