"""Per-step wall time of the demo's 2-agent HACPO run on `runtime.backend=local` vs `ray`, and Ray's overhead.

    python benchmarks/backends.py                 # 2 alternated rounds x (local, ray), 10 steps each, 2 warm-up
    python benchmarks/backends.py --rounds 3 --steps 12
    python benchmarks/backends.py --gpu           # both agents as Ray actors on one GPU (num_gpus 0.5 each), 2 steps

Each run is `hacrl train configs/demo.yaml` in its own process (the demo's agents, bootstrapped if missing), with
evaluation cut to 64 prompts at the end so that it does not count. From each run's metrics.jsonl, steady state
(warm-up steps dropped): seconds per step and per phase, and Ray's overhead per phase: the driver's wall time of
the phase minus the slowest worker's own time in it (what is left is moving prompts and trajectories and the actor
calls). Local runs call the workers one after the other, so their phase time is the sum of the workers' times.
Writes benchmarks/results/backends.md and backends.json.
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

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NAMES = ("llama-char", "qwen-bpe")


def run_once(backend: str, steps: int, out: Path, extra: list[str]) -> dict:
    run_dir = out / f"{backend}-{time.time_ns()}"
    command = [
        sys.executable, "-m", "hacrl", "train", "configs/demo.yaml",
        f"trainer.steps={steps}", f"trainer.output_dir={run_dir}", f"runtime.backend={backend}",
        "eval.at_start=false", "eval.every=0", "eval.max_prompts=64", "checkpoint.every=0",
        "logging.console=false", "logging.tensorboard=false", *extra,
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"backend": backend, "wall": wall, "records": [r for r in records if r["step"] > 0]}


def steady(run: dict, warmup: int) -> dict:
    rows = [r for r in run["records"] if r["step"] > warmup]
    out = {"steps": len(rows), "process_wall_s": run["wall"]}
    for key in ("time/step", "time/sampling", "time/scoring", "time/update"):
        out[key] = statistics.median(r[key] for r in rows)
    from hacrl.driver.metrics import agent_key

    def sampling(r, n):
        return r[agent_key(n, "time/generate")] + r[agent_key(n, "time/logprobs")]

    sampling_workers = [max(sampling(r, n) for n in NAMES) for r in rows]
    update_workers = [max(r[agent_key(n, "time/update")] for n in NAMES) for r in rows]
    sampling_sum = [sum(sampling(r, n) for n in NAMES) for r in rows]
    update_sum = [sum(r[agent_key(n, "time/update")] for n in NAMES) for r in rows]
    # Ray: the workers run at the same time, so the slowest one is the phase's work; local: one after the other
    work_s, work_u = (sampling_workers, update_workers) if run["backend"] == "ray" else (sampling_sum, update_sum)
    over = [r["time/sampling"] - w + r["time/update"] - u for r, w, u in zip(rows, work_s, work_u, strict=True)]
    out["overhead_s"] = statistics.median(over)
    out["overhead_share"] = out["overhead_s"] / out["time/step"]
    out["workers_sampling_sum_s"] = statistics.median(sampling_sum)
    out["workers_update_sum_s"] = statistics.median(update_sum)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--gpu", action="store_true", help="both agents on one GPU as Ray actors (0.5 GPU each)")
    parser.add_argument("--set", dest="overrides", nargs="*", default=[])
    args = parser.parse_args(argv)
    if not (ROOT / ".cache/demo-agents/llama-char/config.json").is_file():
        subprocess.run([sys.executable, "-m", "hacrl", "bootstrap"], cwd=ROOT, check=True)
    scratch = ROOT / "benchmarks" / "results" / ".runs" / "backends"
    scratch.mkdir(parents=True, exist_ok=True)
    if args.gpu:
        gpu = [f"agents.{i}.{k}" for i in range(2) for k in ("device=cuda", "num_gpus=0.5", "dtype=bfloat16")]
        runs = [run_once("ray", 2, scratch, gpu + args.overrides)]
        print(json.dumps([steady(r, 0) for r in runs], indent=1))
        return 0
    runs = []
    for round_ in range(args.rounds):
        for backend in ("local", "ray") if round_ % 2 == 0 else ("ray", "local"):
            run = run_once(backend, args.steps, scratch, args.overrides)
            summary = steady(run, args.warmup)
            runs.append({**summary, "backend": backend, "round": round_})
            print(f"round {round_} {backend:5s}: {summary['time/step']:.2f} s/step, overhead "
                  f"{summary['overhead_s']:.3f} s ({100 * summary['overhead_share']:.1f} %)", flush=True)  # fmt: skip
    table = {}
    for backend in ("local", "ray"):
        mine = [r for r in runs if r["backend"] == backend]
        table[backend] = {
            key: statistics.median(r[key] for r in mine)
            for key in (
                "time/step", "time/sampling", "time/scoring", "time/update", "overhead_s", "overhead_share",
                "process_wall_s",
            )
        }  # fmt: skip
    ratio = table["ray"]["time/step"] / table["local"]["time/step"]
    import torch

    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    result = {"machine": machine, "args": vars(args), "runs": runs, "median": table, "ray_over_local": ratio}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "backends.json").write_text(json.dumps(result, indent=1))
    lines = [
        "# Backends: the demo's 2-agent HACPO step, local vs Ray",
        "",
        f"Machine: {machine}. Command: `python benchmarks/backends.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`. {args.rounds} alternated rounds, {args.steps} "
        f"steps per run, the first {args.warmup} dropped; medians of the per-step values, then of the rounds.",
        "",
        "| backend | s/step | sampling | scoring | update | overhead | overhead share | whole run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backend in ("local", "ray"):
        t = table[backend]
        lines.append(
            f"| {backend} | {t['time/step']:.2f} | {t['time/sampling']:.2f} | {t['time/scoring']:.3f} | "
            f"{t['time/update']:.2f} | {t['overhead_s']:.3f} | {100 * t['overhead_share']:.1f} % | "
            f"{t['process_wall_s']:.0f} s |"
        )
    lines += [
        "",
        f"Ray / local: {ratio:.2f}. Phases in seconds per step. Overhead = the phase's wall time minus the slowest "
        "worker's own time in it (Ray), or minus the sum of the workers' times (local: they run one after the "
        "other). Whole run: the `hacrl train` process from start to exit (imports, start-up of Ray and its actors, "
        f"{args.steps} steps, a 64-prompt evaluation).",
    ]
    (RESULTS / "backends.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
