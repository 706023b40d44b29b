"""Is `hacrl plan --measure`'s advice stable, and does the run it proposes idle as predicted (issue 70, part 5)?

    python benchmarks/advice_check.py                  # 2 measurements, the first proposal run for 6 steps
    python benchmarks/advice_check.py --measurements 3 --steps 8 --budget 0
    python benchmarks/advice_check.py --large 256x4 --name advice_check_3m   # a ~3M large agent: a proposal

The pair: a ~0.13M Llama on characters and a ~0.75M Qwen2 on the tests' BPE tokenizer (random weights, built here),
each a Ray actor with one CPU and one torch thread (2 cores, nothing else running), HACPO with
`sharing.budget_per_prompt: 8` (`--budget 0`: none), G = 8 each, 16 prompts a step: the pair the issue's outside
check used. `hacrl plan CONFIG --measure` runs `--measurements` times (how much its proposal varies), then
`hacrl train` with the first proposal for `--steps` steps; from steps 3 on, the measured idle fraction (mean) and
answers per second (median step) against what the proposal predicted. The issue's bar: a prediction more than 5
points from the measured idle fraction is a defect. Writes benchmarks/results/advice_check.md and .json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PROMPTS = 16


def build_agents(root: Path, large: tuple[int, int] = (128, 3)) -> dict[str, Path]:
    sys.path.insert(0, str(ROOT))
    from tests.conftest import ALPHABET, sum_corpus

    from hacrl.tools.testbed.models import bpe_tokenizer, char_tokenizer, save_agent, tiny_model

    char, bpe = char_tokenizer(ALPHABET), bpe_tokenizer(sum_corpus(), 80)
    small = tiny_model("llama", char, hidden=64, layers=2, heads=4, kv_heads=2, seed=1)
    big = tiny_model("qwen2", bpe, hidden=large[0], layers=large[1], heads=4, kv_heads=2, seed=2)
    return {"small": save_agent(small, char, root / "small"), "large": save_agent(big, bpe, root / "large")}


def write_config(path: Path, agents: dict[str, Path], budget: int, steps: int) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.conftest import TASK

    config = {
        "agents": [{"name": n, "model": str(p), "lr": 1e-3, "num_cpus": 1} for n, p in agents.items()],
        "algorithm": {"name": "hacpo"},
        **({"sharing": {"budget_per_prompt": budget}} if budget else {}),
        "rollout": {"group_size": 8, "max_new_tokens": 24, "max_prompt_tokens": 96},
        "data": {**TASK, "train_size": 512, "eval_size": 8, "heldout_size": 8},
        "trainer": {"steps": steps, "prompts_per_step": PROMPTS, "mini_batch_size": 64, "micro_batch_size": 32},
        "eval": {"every": 0, "at_start": False, "max_prompts": 8, "save_completions": False},
        "checkpoint": {"every": 0},
        "logging": {"console": False, "tensorboard": False},
        "runtime": {"backend": "ray", "torch_threads": 1},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def measure(config: Path) -> dict:
    """One `hacrl plan --measure`: its settings, predictions and whole output."""
    done = subprocess.run([sys.executable, "-m", "hacrl", "plan", str(config), "--measure"], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"hacrl plan --measure failed:\n{done.stderr[-3000:]}")
    out = done.stdout
    line = next((x for x in out.splitlines() if x.startswith("set: ")), "")
    settings = re.findall(r"(?:agents\.\d+\.group_size|sharing\.budget_per_prompt)=\d+", line)
    idle = re.search(r"idle fraction\s+([\d.]+)\s+([\d.]+)", out)
    rate = re.search(r"answers per second\s+([\d.]+)\s+([\d.]+)", out)
    return {"settings": settings, "predicted_idle_now": float(idle[1]), "predicted_idle": float(idle[2]),
            "predicted_answers_per_s": float(rate[2]), "output": out}  # fmt: skip


def train(config: Path, overrides: list[str], out: Path) -> dict:
    """`hacrl train` with `overrides`; from step 3 on: idle fraction (mean), seconds a step and answers a second
    (median step)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from pace import run_once  # `hacrl train` in a process of its own, its records

    records = run_once(config, overrides, out)
    steady = [r for r in records if r["step"] > 2]
    sizes = [8, 8]
    for setting in overrides:
        found = re.fullmatch(r"agents\.(\d+)\.group_size=(\d+)", setting)
        if found:
            sizes[int(found[1])] = int(found[2])
    step = statistics.median(r["time/step"] for r in steady)
    return {"idle": statistics.mean(r["time/idle_frac"] for r in steady), "step_s": step,
            "idle_by_step": [round(r["time/idle_frac"], 4) for r in steady],
            "answers_per_s": PROMPTS * sum(sizes) / step}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measurements", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--budget", type=int, default=8, help="sharing.budget_per_prompt (0: none)")
    parser.add_argument("--large", default="128x3", help="the large agent's hidden size x layers (128x3: ~0.75M)")
    parser.add_argument("--name", default="advice_check")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    with tempfile.TemporaryDirectory(prefix="hacrl-advice-") as tmp:
        work = Path(tmp)
        hidden, layers = map(int, args.large.split("x"))
        agents = build_agents(work / "agents", (hidden, layers))
        config = write_config(work / "pair.yaml", agents, args.budget, args.steps)
        measurements = [measure(config) for _ in range(args.measurements)]
        first = measurements[0]
        run = train(config, first["settings"], work)
    gap = 100 * (first["predicted_idle"] - run["idle"])
    result = {"budget": args.budget, "steps": args.steps, "large": args.large, "measurements": measurements, "run": run,
              "gap_points": gap, "within_5_points": abs(gap) <= 5}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    header = "| measurement | proposed | predicted idle now | predicted idle | predicted answers/s |"
    lines = [f"# `hacrl plan --measure`: its advice, twice, and the run it proposes (sharing budget {args.budget}, "
             f"large agent {args.large})", "",
             header, "|---|---|---|---|---|"]  # fmt: skip
    for i, m in enumerate(measurements, 1):
        lines.append(f"| {i} | {' '.join(m['settings']) or '(none)'} | {100 * m['predicted_idle_now']:.1f} % | "
                     f"{100 * m['predicted_idle']:.1f} % | {m['predicted_answers_per_s']:.1f} |")  # fmt: skip
    rate = f"{run['answers_per_s']:.1f}"
    lines += ["", f"The first proposal run for {args.steps} steps (steps 3 on): idle {100 * run['idle']:.1f} % "
              f"(by step: {', '.join(f'{100 * x:.1f}' for x in run['idle_by_step'])}), {run['step_s']:.2f} s a step, "
              f"{rate} answers/s; predicted idle {100 * first['predicted_idle']:.1f} %: {gap:+.1f} points "
              f"({'within' if abs(gap) <= 5 else 'OUTSIDE'} the 5-point bar).", "",
              f"Reproduce: `python benchmarks/advice_check.py{' ' + ' '.join(argv) if argv else ''}`", ""]  # fmt: skip
    text = "\n".join(lines)
    (RESULTS / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
