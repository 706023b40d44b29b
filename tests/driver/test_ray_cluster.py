"""The cluster rehearsal of `benchmarks/ray_cluster.py` on loopback: two Ray nodes, a run that joins them with one
agent on each, and both nodes stopped afterwards."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from tests.conftest import write_config

pytest.importorskip("ray")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ray_cluster.py"


@pytest.mark.slow
@pytest.mark.longest(35)
def test_a_run_joins_a_two_node_ray_cluster_and_the_nodes_are_stopped(tiny_agents, tmp_path):
    spec = importlib.util.spec_from_file_location("ray_cluster", SCRIPT)
    rehearsal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rehearsal)
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 2})
    lines: list[str] = []
    assert rehearsal.rehearse(str(cfg), [], log=lines.append) == 0, "\n".join(lines)
    output = "\n".join(lines)
    placed = dict(re.findall(r"(llama|qwen) on node (\w+)", output))
    assert set(placed) == {"llama", "qwen"} and placed["llama"] != placed["qwen"], output  # one agent per node
    assert "stopped both Ray nodes (all processes gone)" in output
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
