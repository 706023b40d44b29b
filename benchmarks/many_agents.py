"""The cost of a step as the number of agents grows (issue 64, 1): N = 2, 4, 8, 16 tiny heterogeneous agents,
per-step sampling / scoring / update seconds under `sharing.policy: all` and with a sharing budget
(`sharing.budget_per_prompt`), the fitted exponent of the update's cost in N, and the driver's peak memory.

    python benchmarks/many_agents.py                       # N = 2 4 8 16, all and budget 8, 4 steps per run
    python benchmarks/many_agents.py --agents 2 4 8 16 32 --budgets 8 16

The agents: random weights (timing needs no training), a character tokenizer, widths cycling through hidden
32 / 48 / 64 agent by agent (so that every N holds about the same mix of sizes and the cost per agent does not
grow with N) and families through llama / qwen2 / qwen3 every three agents (two layers), built into
.cache/many-agents. HACPO, 8 prompts x 8
answers of up to 16 characters per agent, mini-batches of 64, the local backend with one torch thread (the
workers run one after another in the driver's process, so each phase's seconds are the sum over agents: the
total work). Each run is `hacrl train` in its own process under /usr/bin/time (its peak resident memory); steps 2
on, medians. Writes benchmarks/results/many_agents.md and many_agents.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
AGENTS = ROOT / ".cache" / "many-agents"
FAMILIES = ("llama", "qwen2", "qwen3")
WIDTHS = (32, 48, 64)
ALPHABET = "0123456789+-*=() .,:?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\n"


def build_agents(n: int) -> list[Path]:
    from hacrl.tools.testbed.models import char_tokenizer, save_agent, tiny_model

    out = []
    for i in range(n):
        family, hidden = FAMILIES[(i // 3) % 3], WIDTHS[i % 3]  # sizes cycle fastest: every N has the same mix
        path = AGENTS / f"agent{i:02d}-{family}-{hidden}"
        if not (path / "config.json").is_file():
            tokenizer = char_tokenizer(ALPHABET)
            save_agent(tiny_model(family, tokenizer, hidden=hidden, layers=2, heads=4, kv_heads=2, seed=i),
                       tokenizer, path)  # fmt: skip
        out.append(path)
    return out


def write_config(path: Path, agents: list[Path], budget: int | None, steps: int) -> Path:
    cfg = {
        "agents": [{"name": p.name.split("-")[0], "model": str(p), "lr": 1e-4} for p in agents],
        "algorithm": {"name": "hacpo"},
        "rollout": {"group_size": 8, "max_new_tokens": 16, "max_prompt_tokens": 96},
        "data": {"task": "chain_sum", "task_options": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                       "max_digits": 2}, "train_size": 256, "eval_size": 8},
        "trainer": {"steps": steps, "prompts_per_step": 8, "mini_batch_size": 64, "micro_batch_size": 64},
        "eval": {"at_start": False, "every": 0, "max_prompts": 1, "save_completions": False},
        "checkpoint": {"every": 0},
        "logging": {"console": False, "tensorboard": False},
        "runtime": {"backend": "local", "torch_threads": 1},
    }  # fmt: skip
    if budget is not None:
        cfg["sharing"] = {"budget_per_prompt": budget}
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_once(config: Path, out: Path) -> dict:
    run_dir = out / f"run-{time.time_ns()}"
    report = out / f"time-{time.time_ns()}.txt"
    command = ["/usr/bin/time", "-f", "%M %U %S", "-o", str(report), sys.executable, "-m", "hacrl", "train",
               str(config), f"trainer.output_dir={run_dir}"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    peak_kib, user, system = report.read_text().split()[-3:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in records if r["step"] > 1]
    out = {k: statistics.median(r[f"time/{k}"] for r in rows) for k in ("sampling", "scoring", "update", "step")}
    names = [a for a in {k.split("/")[0] for k in rows[0] if k.endswith("/trained_sequences")}]
    out["trained_rows_per_learner"] = statistics.median(r[f"{a}/trained_sequences"] for r in rows for a in names)
    out["peak_mib"] = int(peak_kib) / 1024
    out["cpu_s"] = float(user) + float(system)
    return out


def exponent(values: dict[int, float], low: int, high: int) -> float | None:
    """The slope of log(cost) over log(N) between N = low and high (None when either is missing)."""
    if low not in values or high not in values or values[low] <= 0:
        return None
    return math.log(values[high] / values[low]) / math.log(high / low)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--budgets", type=int, nargs="*", default=[8], help="sharing.budget_per_prompt values")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    scratch = RESULTS / ".runs" / "many-agents"
    scratch.mkdir(parents=True, exist_ok=True)
    agents = build_agents(max(args.agents))
    variants = {"all": None, **{f"budget {b}": b for b in args.budgets}}
    table: dict[str, dict[int, dict]] = {v: {} for v in variants}
    for n in args.agents:
        for label, budget in variants.items():
            row = run_once(write_config(scratch / f"n{n}.yaml", agents[:n], budget, args.steps), scratch)
            table[label][n] = row
            rows = row["trained_rows_per_learner"]
            print(f"N = {n:2d} {label:>9}: update {row['update']:.2f} s, sampling {row['sampling']:.2f} s, "
                  f"{rows:.0f} rows per learner, peak {row['peak_mib']:.0f} MiB", flush=True)  # fmt: skip
    slopes = {v: exponent({n: r["update"] for n, r in table[v].items()}, 4, 16) for v in variants}
    import torch

    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    result = {"machine": machine, "args": vars(args), "table": table, "update_exponent_4_16": slopes}
    (RESULTS / "many_agents.json").write_text(json.dumps(result, indent=1) + "\n")
    text = render(result, argv if argv is not None else sys.argv[1:])
    (RESULTS / "many_agents.md").write_text(text)
    print(text)
    return 0


def render(result: dict, argv: list[str]) -> str:
    lines = ["# Many agents: a step's cost as N grows, with and without a sharing budget", "",
             f"Machine: {result['machine']}. Command: `python benchmarks/many_agents.py {' '.join(argv)}`. Tiny random "
             "agents (llama / qwen2 / qwen3, hidden 32-64), HACPO, 8 prompts x 8 answers each, the local backend with "
             "one torch thread: a phase's seconds are the sum over agents. Medians of steps 2 on.", "",
             "| sharing | N | sampling s | scoring s | update s | rows trained per learner | step s | CPU s (run) | "
             "peak MiB |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, rows in result["table"].items():
        for n, r in sorted(rows.items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {label} | {n} | {r['sampling']:.2f} | {r['scoring']:.2f} | {r['update']:.2f} | "
                         f"{r['trained_rows_per_learner']:.0f} | {r['step']:.2f} | {r['cpu_s']:.0f} | "
                         f"{r['peak_mib']:.0f} |")  # fmt: skip
    lines.append("")
    for label, slope in result["update_exponent_4_16"].items():
        if slope is not None:
            lines.append(f"Update seconds ~ N^{slope:.2f} between N = 4 and 16 with `{label}`.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
