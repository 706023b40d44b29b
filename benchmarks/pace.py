"""Agents of different speed, side by side on Ray with one CPU each: lockstep with equal rollout budgets against
the budgets `hacrl plan --measure` proposes (issue 58, 4).

    python benchmarks/pace.py                          # hacpo, hacpo with a sharing budget of 8 per prompt, gspo:
                                                       # 2 alternated rounds, 8 steps per run
    python benchmarks/pace.py --algorithms gspo --rounds 3 --steps 10
    python benchmarks/pace.py --paper-model        # the time model on 8 x 80 GB for the paper's two pairs (no run)
    python benchmarks/pace.py --learning           # pace round 1 (benchmarks/results/analysis.md): 5 seeds x 2 arms

The pair: the demo's 1.1M Llama on characters (warm-started, `hacrl bootstrap`) and a ~10M Qwen2 on the demo's BPE
tokenizer (random weights, built here into .cache/pace-agents; timing needs no training), each a Ray actor with
`num_cpus: 1` and one torch thread (2 cores, nothing else running). For each algorithm: `hacrl plan CONFIG --measure`
proposes budgets, then alternated rounds of (a) equal budgets (`rollout.group_size`) and (b) the proposal run
`hacrl train` for `--steps` steps each, in their own processes. From each run's metrics.jsonl, steps after the
first two: the median seconds per step, the mean idle fraction (`time/idle_frac`: idle worker-seconds /
worker-seconds of the sampling and update phases) and answers sampled per second of wall-clock (every agent's
answers over the step). Writes benchmarks/results/pace.md and pace.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DEMO = ROOT / ".cache" / "demo-agents"
BIG = ROOT / ".cache" / "pace-agents" / "qwen2-10m"


def build_big_agent() -> Path:
    """A Qwen2 of ~10M parameters (hidden 384, 6 layers) with the demo's BPE tokenizer, random weights (seed 0)."""
    if (BIG / "config.json").is_file():
        return BIG
    from hacrl.agent.model import load_tokenizer
    from hacrl.tools.testbed.models import save_agent, tiny_model

    tokenizer = load_tokenizer(DEMO / "qwen-bpe")
    model = tiny_model("qwen2", tokenizer, hidden=384, layers=6, heads=6, kv_heads=6, seed=0)
    return save_agent(model, tokenizer, BIG)


def write_config(path: Path, algorithm: str, steps: int) -> Path:
    demo = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    demo["agents"] = [
        {"name": "llama-1m", "model": str(DEMO / "llama-char"), "lr": 3e-5, "num_cpus": 1},
        {"name": "qwen2-10m", "model": str(BIG), "tokenizer": str(DEMO / "qwen-bpe"), "lr": 3e-5, "num_cpus": 1},
    ]
    name, _, budget = algorithm.partition("+budget")  # `hacpo+budget8`: sharing.budget_per_prompt=8
    demo["algorithm"] = {**demo.get("algorithm", {}), "name": name}
    if budget:
        demo["sharing"] = {"budget_per_prompt": int(budget)}
    demo["trainer"] = {**demo["trainer"], "steps": steps}
    demo["eval"] = {"every": 0, "at_start": False, "max_prompts": 16, "save_completions": False}
    demo["checkpoint"] = {"every": 0}
    demo["logging"] = {"console": False, "tensorboard": False}
    demo["runtime"] = {"backend": "ray", "torch_threads": 1}
    path.write_text(yaml.safe_dump(demo))
    return path


def proposal(config: Path) -> tuple[list[str], str]:
    """The settings `hacrl plan CONFIG --measure` proposes, and its whole output."""
    done = subprocess.run([sys.executable, "-m", "hacrl", "plan", str(config), "--measure"], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"hacrl plan --measure failed:\n{done.stderr[-3000:]}")
    line = next((x for x in done.stdout.splitlines() if x.startswith("set: ")), "")
    return re.findall(r"(?:agents\.\d+\.group_size|sharing\.budget_per_prompt)=\d+", line), done.stdout


def run_once(config: Path, overrides: list[str], out: Path) -> list[dict]:
    run_dir = out / f"run-{time.time_ns()}"
    command = [sys.executable, "-m", "hacrl", "train", str(config), f"trainer.output_dir={run_dir}", *overrides]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def steady(records: list[dict], group_sizes: list[int], prompts: int) -> dict:
    rows = [r for r in records if r["step"] > 2]
    step = statistics.median(r["time/step"] for r in rows)
    return {
        "step_s": step,
        "idle_frac": statistics.mean(r["time/idle_frac"] for r in rows),
        "answers_per_s": prompts * sum(group_sizes) / step,
        "sampling_s": statistics.median(r["time/sampling"] for r in rows),
        "update_s": statistics.median(r["time/update"] for r in rows),
    }


PAPER_SHAPES = {  # the public configs (benchmarks/gpu_throughput.py uses the same)
    "Qwen3-1.7B": dict(family="qwen3", hidden=2048, layers=28, heads=16, kv=8, head_dim=128, ffn=6144, vocab=151_936),
    "Qwen3-4B": dict(family="qwen3", hidden=2560, layers=36, heads=32, kv=8, head_dim=128, ffn=9728, vocab=151_936),
    "Llama-3.2-3B": dict(family="llama", hidden=3072, layers=28, heads=24, kv=8, head_dim=128, ffn=8192, vocab=128_256),
}
PAPER_PAIRS = {
    "qwen3-1.7b_qwen3-4b": ("Qwen3-1.7B", "Qwen3-4B"),
    "qwen3-4b_llama3.2-3b": ("Qwen3-4B", "Llama-3.2-3B"),
}


def paper_model(devices: int = 8, memory: float = 80.0) -> str:
    """`hacrl plan configs/paper/<pair>.yaml --devices 8 --device-memory 80` on config.json files of the public
    shapes (no weights: the time model and the memory plan read only the shapes): its output per pair."""
    from transformers import LlamaConfig, Qwen3Config

    shapes = ROOT / ".cache" / "pace-agents" / "shapes"
    for name, s in PAPER_SHAPES.items():
        if not (shapes / name / "config.json").is_file():
            (Qwen3Config if s["family"] == "qwen3" else LlamaConfig)(
                vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                num_attention_heads=s["heads"], num_key_value_heads=s["kv"], head_dim=s["head_dim"],
                intermediate_size=s["ffn"], tie_word_embeddings=True, max_position_embeddings=40960,
            ).save_pretrained(shapes / name)  # fmt: skip
    lines = [f"# The time model on {devices} x {memory:g} GB: the paper's two pairs (a model, not a measurement)", "",
             "`hacrl plan configs/paper/<pair>.yaml agents.0.model=... agents.1.model=... --devices "
             f"{devices} --device-memory {memory:g}` on config.json files of the public shapes. Each split of the "
             "devices the memory plan allows, the step the model predicts at the presets' equal budgets (128 prompts "
             "x 8 answers of up to 4,096 tokens), and the chosen split with the budgets it proposes. Constants and "
             "their sources: `hacrl/tools/placement.py`.", ""]  # fmt: skip
    for pair, (first, second) in PAPER_PAIRS.items():
        command = [sys.executable, "-m", "hacrl", "plan", f"configs/paper/{pair}.yaml",
                   f"agents.0.model={shapes / first}", f"agents.1.model={shapes / second}",
                   "--devices", str(devices), "--device-memory", str(memory)]  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        lines += [f"## {pair}", "", "```", (done.stdout or done.stderr).strip(), "```", ""]
    return "\n".join(lines)


LEARNING_ARMS = {"A": (40, []), "B": (34, ["agents.1.group_size=12"])}
"""Pace round 1 as pre-registered in benchmarks/results/analysis.md: (steps, overrides) of each arm."""
LEARNING_BASE = ["runtime.backend=ray", "agents.0.num_cpus=1", "agents.1.num_cpus=1", "runtime.torch_threads=1",
                 "eval.every=0", "eval.at_start=true", "checkpoint.every=0", "logging.console=false",
                 "logging.tensorboard=false"]  # fmt: skip


def learning(seeds: range) -> dict:
    """Pace round 1: each seed's two arms (alternated), their final greedy pass@1 and training seconds."""
    if not (DEMO / "llama-char" / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "hacrl", "bootstrap"], cwd=ROOT, check=True)
    scratch = RESULTS / ".runs" / "pace-learning"
    scratch.mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in seeds:
        for arm in ("A", "B") if seed % 2 == 0 else ("B", "A"):
            steps, overrides = LEARNING_ARMS[arm]
            settings = [*LEARNING_BASE, f"trainer.steps={steps}", f"trainer.seed={seed}", *overrides]
            records = run_once(ROOT / "configs" / "demo.yaml", settings, scratch)
            last = records[-1]
            row = {"seed": seed, "arm": arm, "steps": steps,
                   "train_s": sum(r.get("time/step", 0.0) for r in records),
                   "idle_frac": statistics.mean(r["time/idle_frac"] for r in records if "time/idle_frac" in r),
                   **{f"{a}/pass@1": last[f"eval/{a}/pass@1"] for a in ("llama-char", "qwen-bpe")},
                   **{f"{a}/pass@1_start": records[0][f"eval/{a}/pass@1"]
                      for a in ("llama-char", "qwen-bpe")}}  # fmt: skip
            runs.append(row)
            print(json.dumps(row), flush=True)
    return {"runs": runs}


def render_learning(result: dict) -> str:
    runs = result["runs"]
    seeds = sorted({r["seed"] for r in runs})
    lines = ["# Pace round 1: a larger rollout budget for the faster sampler, at equal wall-clock", "",
             "Pre-registered in `benchmarks/results/analysis.md` (Pace round 1). `python benchmarks/pace.py "
             "--learning`. (A) 8 / 8 answers per prompt, 40 steps; (B) qwen-bpe 12, llama-char 8, 34 steps.", "",
             "| seed | arm | steps | training s | idle | llama-char pass@1 | qwen-bpe pass@1 |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in sorted(runs, key=lambda r: (r["seed"], r["arm"])):
        lines.append(f"| {r['seed']} | {r['arm']} | {r['steps']} | {r['train_s']:.1f} | "
                     f"{100 * r['idle_frac']:.0f} % | {100 * r['llama-char/pass@1']:.1f} % | "
                     f"{100 * r['qwen-bpe/pass@1']:.1f} % |")  # fmt: skip
    lines.append("")
    for agent in ("qwen-bpe", "llama-char"):
        value = {(r["seed"], r["arm"]): r[f"{agent}/pass@1"] for r in runs}
        diffs = [value[(s, "B")] - value[(s, "A")] for s in seeds]
        mean = statistics.mean(diffs)
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        verdict = "B better" if mean > 2 * se else "B worse" if mean < -2 * se else "no difference detected"
        lines.append(f"{agent}: B - A = {100 * mean:+.1f} points (standard error {100 * se:.1f}, {len(diffs)} seeds): "
                     f"{verdict}")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=["hacpo", "hacpo+budget8", "gspo"],
                        help="algorithm names; `hacpo+budget8` adds sharing.budget_per_prompt=8")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--paper-model", action="store_true", help="only the time model for the paper's pairs")
    parser.add_argument("--learning", action="store_true", help="pace round 1 (pre-registered in analysis.md)")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.learning:
        result = learning(range(args.seeds))
        (RESULTS / "pace-learning.json").write_text(json.dumps(result, indent=1) + "\n")
        text = render_learning(result)
        (RESULTS / "pace-learning.md").write_text(text)
        print(text)
        return 0
    if args.paper_model:
        text = paper_model()
        (RESULTS / "pace-gpu-model.md").write_text(text)
        print(text)
        return 0
    if not (DEMO / "llama-char" / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "hacrl", "bootstrap"], cwd=ROOT, check=True)
    build_big_agent()
    scratch = RESULTS / ".runs" / "pace"
    scratch.mkdir(parents=True, exist_ok=True)
    demo = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    prompts, g = demo["trainer"]["prompts_per_step"], demo["rollout"]["group_size"]
    result: dict = {"algorithms": {}}
    for algorithm in args.algorithms:
        config = write_config(scratch / f"{algorithm}.yaml", algorithm, args.steps)
        settings, plan_output = proposal(config)
        sizes = {"a": [g, g], "b": [g, g]}
        for s in settings:  # the group sizes (a sharing budget proposed beside them goes into the run as it is)
            found = re.fullmatch(r"agents\.(\d+)\.group_size=(\d+)", s)
            if found:
                sizes["b"][int(found[1])] = int(found[2])
        variants = {"a": [], "b": settings}
        runs = {"a": [], "b": []}
        for round_ in range(args.rounds):
            for v in ("a", "b") if round_ % 2 == 0 else ("b", "a"):
                summary = steady(run_once(config, variants[v], scratch), sizes[v], prompts)
                runs[v].append(summary)
                idle, answers = 100 * summary["idle_frac"], summary["answers_per_s"]
                print(f"{algorithm} round {round_} ({v}): {summary['step_s']:.2f} s/step, idle {idle:.0f} %, "
                      f"{answers:.0f} answers/s", flush=True)  # fmt: skip
        median = {v: {k: statistics.median(r[k] for r in runs[v]) for k in runs[v][0]} for v in runs}
        result["algorithms"][algorithm] = {"proposal": settings, "group_sizes": sizes, "plan_output": plan_output,
                                           "runs": runs, "median": median}  # fmt: skip
    import torch

    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    result.update(machine=machine, args=vars(args))
    (RESULTS / "pace.json").write_text(json.dumps(result, indent=1) + "\n")
    text = render(result, argv if argv is not None else sys.argv[1:])
    (RESULTS / "pace.md").write_text(text)
    print(text)
    return 0


def render(result: dict, argv: list[str]) -> str:
    args = result["args"]
    lines = [
        "# Agents at their own pace: equal budgets vs the budgets `hacrl plan --measure` proposes",
        "",
        f"Machine: {result['machine']}. Command: `python benchmarks/pace.py {' '.join(argv)}`. The demo's 1.1M Llama "
        "and a 10M Qwen2 (random weights), Ray actors with one CPU and one torch thread each; "
        f"{args['rounds']} alternated rounds of {args['steps']} steps per run, steps 3 on; medians over the rounds.",
        "",
        "| algorithm | budgets (G per agent) | s/step | idle fraction | answers/s | step vs (a) | answers/s vs (a) |",
        "|---|---|---|---|---|---|---|",
    ]
    for algorithm, r in result["algorithms"].items():
        a = r["median"]["a"]
        for v, label in (("a", "(a) equal"), ("b", "(b) proposed")):
            m = r["median"][v]
            sizes = "/".join(map(str, r["group_sizes"][v]))
            lines.append(f"| {algorithm} | {label} {sizes} | {m['step_s']:.2f} | {100 * m['idle_frac']:.0f} % | "
                         f"{m['answers_per_s']:.0f} | {m['step_s'] / a['step_s']:.2f}x | "
                         f"{m['answers_per_s'] / a['answers_per_s']:.2f}x |")  # fmt: skip
    lines += ["", "What `hacrl plan --measure` printed, per algorithm:", ""]
    for algorithm, r in result["algorithms"].items():
        output = [x for x in r["plan_output"].strip().splitlines() if "(_Actor pid=" not in x]  # Ray actors' logs
        lines += [f"{algorithm}:", "", "```", *output, "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
