"""Sampling beside learning (issue 59, 5): the fixed-lag pipeline with a sampler of its own against the lockstep loop.

    python benchmarks/overlap.py                      # both setups, 2 alternated rounds, 20 steps per run
    python benchmarks/overlap.py --setups one --rounds 3 --steps 20
    python benchmarks/overlap.py --learning           # lag round 1 (benchmarks/results/analysis.md): 5 seeds x 3 arms
    python benchmarks/overlap.py --learning --bed gap # lag round 2: the same on round 3's capability-gap bed

Setups (CPU, local backend, nothing else running):
    one   the demo's 2.4M Qwen2 on BPE alone (gspo), answers of up to `--new-tokens` tokens (default 48, so that
          sampling and update take similar time)
    big   a 10M Qwen2 on the demo's BPE alone (gspo; random weights, built by benchmarks/pace.py: every answer runs
          to `--new-tokens`, so sampling is long)
    demo  the demo's two agents (HACPO), configs/demo.yaml's sizes
Variants, in alternated order within each round, each a `hacrl train` process of its own:
    lag0          the lockstep loop, one torch thread (one core)
    lag0-2thr     the lockstep loop with two torch threads (both cores for one process: the fair baseline)
    lag1          trainer.lag=1, one worker per agent (it samples, then learns)
    lag1-sampler  trainer.lag=1 and agents.<i>.sampler_devices=[cpu]: learner and sampler each one thread
    lag2-sampler  trainer.lag=2, the same
    lag1-sampler-lp  lag1-sampler with trainer.old_logprobs=sampler (no behaviour pass after sampling)
From each run's metrics.jsonl, steps 3..last: the median seconds per step and the weight sync's seconds per step.
Writes benchmarks/results/overlap.md and overlap.json (a setup run again replaces its own rows, the others stay).
"""

from __future__ import annotations

import argparse
import json
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
DEMO = ROOT / ".cache" / "demo-agents"

VARIANTS = {
    "lag0": ["trainer.lag=0", "runtime.torch_threads=1"],
    "lag0-2thr": ["trainer.lag=0", "runtime.torch_threads=2"],
    "lag1": ["trainer.lag=1", "runtime.torch_threads=1"],
    "lag1-sampler": ["trainer.lag=1", "runtime.torch_threads=1", "SAMPLERS"],
    "lag2-sampler": ["trainer.lag=2", "runtime.torch_threads=1", "SAMPLERS"],
    "lag1-sampler-lp": ["trainer.lag=1", "runtime.torch_threads=1", "SAMPLERS", "trainer.old_logprobs=sampler"],
}


def write_config(path: Path, setup: str, steps: int, new_tokens: int) -> tuple[Path, list[str]]:
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["agents"] = [{**a, "model": str(ROOT / a["model"])} for a in cfg["agents"]]
    if setup in ("one", "big"):
        cfg["agents"] = [a for a in cfg["agents"] if a["name"] == "qwen-bpe"]
        cfg["algorithm"] = {"name": "gspo"}
        cfg["rollout"]["max_new_tokens"] = new_tokens
    if setup == "big":
        from pace import BIG, build_big_agent

        build_big_agent()
        cfg["agents"] = [{"name": "qwen2-10m", "model": str(BIG), "tokenizer": str(DEMO / "qwen-bpe"), "lr": 3e-5}]
    cfg["trainer"].update(steps=steps)
    cfg["data"]["eval_size"] = 32
    cfg["eval"] = {"every": 0, "at_start": False}
    cfg["checkpoint"] = {"every": 0}
    cfg["logging"] = {"console": False}
    path.write_text(yaml.safe_dump(cfg))
    return path, [a["name"] for a in cfg["agents"]]


def run_once(config: Path, overrides: list[str], names: list[str], out: Path) -> dict:
    run_dir = out / f"run-{time.time_ns()}"
    settings = [s for s in overrides if s != "SAMPLERS"]
    if "SAMPLERS" in overrides:
        settings += [f"agents.{i}.sampler_devices=[cpu]" for i in range(len(names))]
    command = [sys.executable, "-m", "hacrl", "train", str(config), f"trainer.output_dir={run_dir}", *settings]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()][2:]
    return {
        "step_s": statistics.median(r["time/step"] for r in rows),
        "weight_sync_s": statistics.median(sum(r.get(f"{n}/time/weight_sync", 0.0) for n in names) for r in rows),
        "update_s": statistics.median(sum(r[f"{n}/time/update"] for n in names) for r in rows),
        "sampling_s": statistics.median(sum(r[f"{n}/time/busy_sampling"] for n in names) for r in rows)
        if f"{names[0]}/time/busy_sampling" in rows[0]
        else statistics.median(r["time/sampling"] for r in rows),
        "final_reward": rows[-1][f"{names[-1]}/reward_mean"],
    }


LEARNING_BEDS = {  # lag rounds 1 (demo) and 2 (gap), pre-registered in analysis.md: config, A/B steps, C steps
    "demo": (ROOT / "configs" / "demo.yaml", 40, 49, []),
    "gap": (ROOT / "benchmarks" / "configs" / "gap_bed.yaml", 80, 97, ["algorithm.delta=0.85"]),
}
"""Arm C's steps: equal wall-clock with a sampler of its own, from overlap.md's demo setup (lag0 2.171 s per step,
lag1-sampler 1.784 s: x 1.217); the gap bed has the same agents and answer lengths, so the same ratio."""
LEARNING_ARMS = {"A": ["trainer.lag=0"], "B": ["trainer.lag=1"], "C": ["trainer.lag=1"]}
LEARNING_BASE = ["data.eval_size=1280", "eval.every=0", "checkpoint.every=0", "logging.console=false"]


def gap_agents() -> Path:
    """The gap bed's agents (recipe `gap` of benchmarks/beds.py, warm-start seed 0), built once into .cache."""
    from beds import GAP

    from hacrl.tools.testbed.demo import bootstrap

    out = ROOT / ".cache" / "bench-agents" / "gap-s0"
    bootstrap(out, GAP)
    return out


def learning(seeds: range, bed: str = "demo") -> dict:
    """Lag rounds 1 (demo) and 2 (gap): each seed's three arms (rotated), their final greedy pass@1. The lag-1 arms
    run without a sampler of its own: a sampler changes no number (tests), only the wall-clock, which arm C's step
    count stands for. The gap bed: one warm-start (seed 0) for every training seed."""
    config, steps_ab, steps_c, bed_overrides = LEARNING_BEDS[bed]
    if bed == "demo" and not (DEMO / "llama-char" / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "hacrl", "bootstrap"], cwd=ROOT, check=True)
    if bed == "gap":
        agents = gap_agents()
        bed_overrides = [*bed_overrides, f"agents.0.model={agents / 'llama-char'}",
                         f"agents.1.model={agents / 'qwen-bpe'}", f"data.train_file={agents / 'data' / 'train.jsonl'}",
                         f"data.eval_file={agents / 'data' / 'eval.jsonl'}"]  # fmt: skip
    scratch = RESULTS / ".runs" / f"lag-learning-{bed}"
    scratch.mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in seeds:
        order = ["A", "B", "C"][seed % 3 :] + ["A", "B", "C"][: seed % 3]
        for arm in order:
            steps = steps_c if arm == "C" else steps_ab
            settings = [*LEARNING_BASE, *bed_overrides, f"trainer.steps={steps}", f"trainer.seed={seed}",
                        *LEARNING_ARMS[arm]]  # fmt: skip
            run_dir = scratch / f"run-{time.time_ns()}"
            command = [sys.executable, "-m", "hacrl", "train", str(config), f"trainer.output_dir={run_dir}",
                       *settings]  # fmt: skip
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
            records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
            row = {"seed": seed, "arm": arm, "steps": steps, "train_s": sum(r.get("time/step", 0.0) for r in records),
                   **{f"{a}/pass@1": records[-1][f"eval/{a}/pass@1"] for a in ("llama-char", "qwen-bpe")}}  # fmt: skip
            runs.append(row)
            print(json.dumps(row), flush=True)
    return {"runs": runs, "bed": bed, "steps": steps_ab, "c_steps": steps_c}


def render_learning(result: dict) -> str:
    runs = result["runs"]
    seeds = sorted({r["seed"] for r in runs})
    bed, steps = result.get("bed", "demo"), result.get("steps", 40)
    number = {"demo": 1, "gap": 2}.get(bed, "?")
    lines = [
        f"# Lag round {number}: trainer.lag=1 against the lockstep loop, on the {bed} bed",
        "",
        f"Pre-registered in `benchmarks/results/analysis.md` (Lag round {number}). `python benchmarks/overlap.py "
        f"--learning --bed {bed}`. (A) lag 0, {steps} steps; (B) lag 1, {steps} steps; (C) lag 1, "
        f"{result['c_steps']} steps (equal wall-clock with a sampler of its own, from overlap.md).",
        "",
        "| seed | arm | steps | training s | llama-char pass@1 | qwen-bpe pass@1 |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r["seed"], r["arm"])):
        lines.append(f"| {r['seed']} | {r['arm']} | {r['steps']} | {r['train_s']:.1f} | "
                     f"{100 * r['llama-char/pass@1']:.1f} % | {100 * r['qwen-bpe/pass@1']:.1f} % |")  # fmt: skip
    lines.append("")
    for agent in ("qwen-bpe", "llama-char"):
        value = {(r["seed"], r["arm"]): r[f"{agent}/pass@1"] for r in runs}
        for arm in ("B", "C"):
            diffs = [value[(s, arm)] - value[(s, "A")] for s in seeds if (s, arm) in value and (s, "A") in value]
            if len(diffs) < 2:
                continue
            mean, se = statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5
            low, high = mean - 2 * se, mean + 2 * se
            verdict = ("equivalent within +-2 points" if low > -0.02 and high < 0.02 else
                       "better" if low > 0 else "worse" if high < 0 else "inconclusive")  # fmt: skip
            interval = f"[{100 * low:+.1f}, {100 * high:+.1f}]"
            lines.append(f"{agent}: {arm} - A = {100 * mean:+.1f} points (standard error {100 * se:.1f}, "
                         f"{len(diffs)} seeds; mean +- 2 SE {interval}): {verdict}")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", nargs="+", default=["one", "demo"], choices=["one", "big", "demo"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=48, help="max_new_tokens of `one` and `big`")
    parser.add_argument("--learning", action="store_true", help="lag round 1 (pre-registered in analysis.md)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--bed", default="demo", choices=sorted(LEARNING_BEDS), help="the learning round's bed")
    parser.add_argument("--runs-from", nargs="+", metavar="JSONL",
                        help="with --learning: take the runs from these files (one JSON row per run, as the "
                             "learning round prints them) instead of running them")  # fmt: skip
    args = parser.parse_args(argv)
    if args.learning:
        if args.runs_from:
            _, steps_ab, steps_c, _ = LEARNING_BEDS[args.bed]
            rows = [
                json.loads(x) for f in args.runs_from for x in Path(f).read_text().splitlines() if x.startswith("{")
            ]
            result = {"runs": rows, "bed": args.bed, "steps": steps_ab, "c_steps": steps_c}
        else:
            result = learning(range(args.seeds), args.bed)
        stem = "lag-learning" if args.bed == "demo" else f"lag-learning-{args.bed}"
        (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
        text = render_learning(result)
        (RESULTS / f"{stem}.md").write_text(text)
        print(text)
        return 0
    if not (DEMO / "llama-char" / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "hacrl", "bootstrap"], cwd=ROOT, check=True)
    scratch = RESULTS / ".runs" / "overlap"
    scratch.mkdir(parents=True, exist_ok=True)
    previous = RESULTS / "overlap.json"
    result: dict = json.loads(previous.read_text()) if previous.is_file() else {"setups": {}}
    for setup in args.setups:
        config, names = write_config(scratch / f"{setup}.yaml", setup, args.steps, args.new_tokens)
        runs: dict[str, list[dict]] = {v: [] for v in args.variants}
        for round_ in range(args.rounds):
            order = args.variants if round_ % 2 == 0 else args.variants[::-1]
            for v in order:
                summary = run_once(config, VARIANTS[v], names, scratch)
                runs[v].append(summary)
                print(f"{setup} round {round_} {v}: {summary['step_s']:.3f} s/step", flush=True)
        median = {v: {k: statistics.median(r[k] for r in runs[v]) for k in runs[v][0]} for v in runs}
        result["setups"][setup] = {"agents": names, "runs": runs, "median": median, "args": vars(args)}
    import torch

    result.update(machine=f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    (RESULTS / "overlap.json").write_text(json.dumps(result, indent=1) + "\n")
    text = render(result, argv if argv is not None else sys.argv[1:])
    (RESULTS / "overlap.md").write_text(text)
    print(text)
    return 0


def render(result: dict, argv: list[str]) -> str:
    runs = "; ".join(
        f"{setup}: `python benchmarks/overlap.py --setups {setup} --rounds {a['rounds']} --steps {a['steps']}"
        f"{' --new-tokens ' + str(a['new_tokens']) if setup != 'demo' else ''}`"
        for setup, a in ((s, r["args"]) for s, r in result["setups"].items())
    )
    lines = [
        "# Sampling beside learning: trainer.lag with a sampler of its own vs the lockstep loop",
        "",
        f"Machine: {result['machine']}. Local backend, alternated rounds, steps 3 on, medians over the rounds ({runs})."
        " Times are per step; `sampling` and `update` are the agents' busy seconds summed (they overlap in the "
        "pipelined variants).",
        "",
        "| setup | variant | s/step | vs lag0 | vs lag0-2thr | sampling s | update s | weight sync s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for setup, r in result["setups"].items():
        base, fair = r["median"].get("lag0"), r["median"].get("lag0-2thr")
        for v, m in r["median"].items():
            rel = f"{m['step_s'] / base['step_s']:.2f}x" if base else "-"
            rel2 = f"{m['step_s'] / fair['step_s']:.2f}x" if fair else "-"
            lines.append(f"| {setup} ({', '.join(r['agents'])}) | {v} | {m['step_s']:.3f} | {rel} | {rel2} | "
                         f"{m['sampling_s']:.3f} | {m['update_s']:.3f} | {m['weight_sync_s']:.4f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
