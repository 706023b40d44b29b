"""Control round 1 (issue 47): HACPO vs GSPO, GSPOx2 and naive sharing with heterogeneous control policies.

Pre-registered in `benchmarks/results/analysis.md` ("Control round 1"), written before any grid run; this script runs
exactly that on `benchmarks/configs/control_bed.yaml`. Every (method, seed) run leaves
`benchmarks/results/control/summaries/<method>-s<seed>.json`; a run whose summary exists is skipped.

    python benchmarks/control.py --calibrate          # HACPO's delta from a 10-step ratio distribution (once)
    python benchmarks/control.py                      # every missing run (~1.2 h on 2 cores), then the aggregate
    python benchmarks/control.py --aggregate-only     # rebuild control/evidence.md / .json
    python benchmarks/control.py --smoke --out /tmp/c # tiny: 2 steps per run, 1 seed
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BED = ROOT / "benchmarks" / "configs" / "control_bed.yaml"
METHODS = {
    "gspo": ["algorithm.name=gspo"],
    "gspo_x2": ["algorithm.name=gspo", "trainer.group_size=16"],
    "naive": ["algorithm.name=naive"],
    "hacpo": ["algorithm.name=hacpo", "@delta"],
}
SEEDS = [0, 1, 2, 3, 4]
WEAKER, STRONGER = "gru-polar", "mlp-full"
PAIRS = [("hacpo", "gspo"), ("hacpo", "gspo_x2"), ("hacpo", "naive")]
SMOKE = ["trainer.steps=2", "trainer.initial_states_per_step=2", "trainer.group_size=4", "trainer.mini_batch_size=4",
         "eval.every=1", "eval.initial_states=4"]  # fmt: skip


def _evidence():
    spec = importlib.util.spec_from_file_location("evidence_benchmark", Path(__file__).with_name("evidence.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(bed: Path, overrides: list[str], work: Path):
    """One `hacrl control` run of `bed` with `overrides` in `work` (emptied first): (its config, its records)."""
    from hacrl.control.config import load_control_config
    from hacrl.control.trainer import ControlTrainer

    shutil.rmtree(work, ignore_errors=True)
    config = load_control_config(bed, [*overrides, f"trainer.output_dir={work}"])
    ControlTrainer(config).train()
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    return config, records


def calibrate(out: Path, smoke: bool) -> float:
    """The pre-registered delta: a 10-step HACPO run on seed 0 (`calibrate_delta`)."""
    return calibrate_delta(out, smoke, BED, [], (STRONGER, WEAKER), SMOKE)


def calibrate_delta(out: Path, smoke: bool, bed: Path, overrides: list[str], learners, smoke_overrides) -> float:
    """`out/deltas.json`'s delta, computed once: a 10-step run of `bed` with `overrides` on seed 0, each learner's
    median over steps of its 10th percentile of foreign ratios, `evidence.delta_rule`."""
    path = out / "deltas.json"
    if path.is_file():
        return json.loads(path.read_text())["delta"]
    steps = 2 if smoke else 10
    extra = smoke_overrides if smoke else []
    _, records = train(bed, [*extra, *overrides, f"trainer.steps={steps}", "eval.at_start=false", "eval.every=0",
                             "eval.initial_states=4", "trainer.seed=0"], out / ".runs" / "calibration")  # fmt: skip
    p10 = {
        name: statistics.median(r[f"{name}/foreign_ratio_p10"] for r in records if f"{name}/foreign_ratio_p10" in r)
        for name in learners
    }
    delta = _evidence().delta_rule(p10)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"p10": p10, "delta": delta, "steps": steps}, indent=1) + "\n")
    return delta


def run(out: Path, method: str, seed: int, smoke: bool) -> dict:
    config, records, summary = train_method(out, BED, METHODS, method, seed, SMOKE if smoke else [], "control")
    per_step = config.trainer.initial_states_per_step * config.trainer.group_size * config.env.max_cycles
    for p in config.policies:
        curve = [[r["step"], r[f"eval/{p.name}/success"]] for r in records if f"eval/{p.name}/success" in r]
        clip = [r.get(f"{p.name}/foreign_clip_frac") for r in records if f"{p.name}/reward_mean" in r]
        summary["agents"][p.name] = {
            "curve": curve,
            "final_success": curve[-1][1],
            "env_steps_per_step": per_step,
            "foreign_clip_frac": clip,
            "reward_curve": [[r["step"], r[f"{p.name}/reward_mean"]] for r in records if f"{p.name}/reward_mean" in r],
        }
    return summary


def train_method(out: Path, bed: Path, methods: dict, method: str, seed: int, smoke: list[str], label: str):
    """One (method, seed) run of a grid: `methods[method]`'s overrides (`@delta`: the calibrated delta), the seed,
    timed under `evidence.Load`; (config, records, its summary without `agents`' entries). The run's checkpoints
    are removed (its metrics stay in `out/.runs`)."""
    ev = _evidence()
    delta = json.loads((out / "deltas.json").read_text())["delta"]
    overrides = [f"algorithm.delta={delta}" if o == "@delta" else o for o in methods[method]]
    overrides += [f"trainer.seed={seed}", *smoke]
    work = out / ".runs" / f"{method}-s{seed}"
    print(f"== {label} {method} seed {seed}", flush=True)
    start, load = time.perf_counter(), ev.Load()
    config, records = train(bed, overrides, work)
    seconds = time.perf_counter() - start
    summary = {"method": method, "seed": seed, "steps": config.trainer.steps, "seconds": seconds, **load.result(),
               "overrides": overrides, "machine": ev.machine(), "agents": {}}  # fmt: skip
    shutil.rmtree(work / "checkpoints", ignore_errors=True)
    return config, records, summary


def success_at(agent: dict, env_steps: int) -> float | None:
    """Greedy success at the evaluation where the policy had used `env_steps` environment steps."""
    step = env_steps // agent["env_steps_per_step"]
    return next((v for s, v in agent["curve"] if s == step), None)


def env_steps_to(agent: dict, target: float) -> int | None:
    return next((s * agent["env_steps_per_step"] for s, v in agent["curve"] if v >= target - 1e-12), None)


def cells_of(out: Path) -> tuple[int, dict, int | None]:
    """The grid's summaries in `out/summaries`: (how many, {method: {seed: summary}}, the budget in environment
    steps per policy: `gspo`'s steps x its environment steps per step, None before a `gspo` run)."""
    runs = [json.loads(p.read_text()) for p in sorted((out / "summaries").glob("*.json"))]
    cells: dict = {}
    for r in runs:
        cells.setdefault(r["method"], {})[r["seed"]] = r
    budget = None
    if "gspo" in cells:
        any_run = next(iter(cells["gspo"].values()))
        budget = any_run["steps"] * next(iter(any_run["agents"].values()))["env_steps_per_step"]
    return len(runs), cells, budget


def aggregate(out: Path) -> dict:
    count, cells, budget = cells_of(out)
    result: dict = {"runs": count, "pairs": paired(cells, PAIRS, (WEAKER, STRONGER), budget), "final": {},
                    "efficiency": {}, "clip": {}}  # fmt: skip
    for method, by_seed in cells.items():
        for name in (WEAKER, STRONGER):
            result["final"][f"{method} / {name}"] = {
                s: [success_at(r["agents"][name], budget), r["agents"][name]["final_success"]]
                for s, r in by_seed.items()
            }
            clips = {}
            for s, r in by_seed.items():
                values = [v for v in r["agents"][name]["foreign_clip_frac"] if v is not None]
                n = max(1, len(values) // 10)
                clips[s] = [statistics.mean(values[:n]), statistics.mean(values[-n:])] if values else None
            result["clip"][f"{method} / {name}"] = clips
            if "gspo_x2" in cells:
                result["efficiency"][f"{method} / {name}"] = {
                    s: env_steps_to(r["agents"][name], cells["gspo_x2"][s]["agents"][name]["final_success"])
                    for s, r in by_seed.items()
                    if s in cells["gspo_x2"]
                }
    out.mkdir(parents=True, exist_ok=True)
    (out / "evidence.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "evidence.md").write_text(markdown(result, budget))
    return result


def pair_row(pair: str, name: str, ci: dict, verdict: str) -> str:
    """A markdown row of a paired difference: mean [95 % CI] (n), the per-seed differences, the verdict."""
    mean = "-" if ci.get("mean") is None else f"{ci['mean']:+.1f}"
    interval = "" if ci.get("lo") is None else f" [{ci['lo']:+.1f}, {ci['hi']:+.1f}]"
    seeds = ", ".join(f"{d:+.1f}" for d in ci.get("diffs", []))
    return f"| {pair} | {name} | {mean}{interval} (n={ci.get('n', 0)}) | {seeds} | {verdict} |"


def final_lines(final: dict) -> list[str]:
    """`- method / policy: s0: at the budget / at the end, ...` (points) for every cell."""
    lines = []
    for key, by_seed in final.items():
        cells = ", ".join(
            f"s{s}: {100 * a:.0f} / {100 * b:.0f}" if a is not None else f"s{s}: - / {100 * b:.0f}"
            for s, (a, b) in sorted(by_seed.items(), key=lambda x: int(x[0]))
        )
        lines.append(f"- {key}: {cells}")
    return lines


def paired(cells: dict, pairs: list, names, budget: int | None) -> dict:
    """Per (a, b) pair and policy: the paired differences of greedy success at `budget` environment steps over the
    seeds both ran (points), `evidence.paired_ci`, and the verdict (pays / costs / level by the interval)."""
    ev, out = _evidence(), {}
    for a, b in pairs:
        seeds = sorted(set(cells.get(a, {})) & set(cells.get(b, {})))
        for name in names:
            diffs = []
            for s in seeds:
                mine = success_at(cells[a][s]["agents"][name], budget)
                theirs = success_at(cells[b][s]["agents"][name], budget)
                if mine is not None and theirs is not None:
                    diffs.append(100 * (mine - theirs))
            ci = ev.paired_ci(diffs)
            verdict = None
            if ci.get("lo") is not None:
                verdict = "pays" if ci["lo"] > 0 else "costs" if ci["hi"] < 0 else "level"
            out[f"{a} - {b} / {name}"] = {**ci, "verdict": verdict}
    return out


def markdown(result: dict, budget: int | None) -> str:
    lines = [
        "# Control round 1: HACPO with heterogeneous control policies (mpe2 simple_v3)",
        "",
        f"Pre-registration: `benchmarks/results/analysis.md`, control round 1. Runs: {result['runs']}. Greedy success "
        f"on 200 held-out initial states, in points, at {budget or 0:,} environment steps per policy; paired "
        "differences per seed: mean [95 % t interval] (n). Verdicts for the pre-registered primary (gru-polar) only.",
        "",
        "| difference | policy | mean [95 % CI] | per seed | verdict |",
        "|---|---|---|---|---|",
    ]
    for key, ci in result["pairs"].items():
        pair, name = key.split(" / ")
        lines.append(pair_row(pair, name, ci, (ci.get("verdict") or "-") if name == WEAKER else "(secondary)"))
    lines += [
        "",
        "Success at the budget and at the run's end (step 150; GSPOx2 has then used twice the steps), by seed:",
        "",
    ]
    lines += final_lines(result["final"])
    if result["efficiency"]:
        lines += ["", "Environment steps until greedy success first reaches GSPOx2's final success (None: never):", ""]
        for key, by_seed in result["efficiency"].items():
            lines.append(
                f"- {key}: " + ", ".join(f"s{s}: {v}" for s, v in sorted(by_seed.items(), key=lambda x: int(x[0])))
            )
    lines += ["", "Foreign clip fraction, first and last 10 % of steps (sharing methods):", ""]
    for key, by_seed in result["clip"].items():
        if any(v is not None for v in by_seed.values()):
            lines.append(f"- {key}: " + ", ".join(
                f"s{s}: {v[0]:.2f}->{v[1]:.2f}" for s, v in sorted(by_seed.items(), key=lambda x: int(x[0])) if v
            ))  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = grid_arguments(__doc__, METHODS, SEEDS, "control").parse_args(argv)
    return run_grid(args, Path(args.out or ROOT / "benchmarks" / "results" / "control"), calibrate, run, aggregate)


def grid_arguments(doc: str, methods: dict, seeds: list[int], results: str) -> argparse.ArgumentParser:
    """The command line of a grid script (control.py, reach.py)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(methods), choices=list(methods))
    parser.add_argument("--seeds", nargs="+", type=int, default=seeds)
    parser.add_argument("--out", help=f"results directory (default benchmarks/results/{results})")
    parser.add_argument("--calibrate", action="store_true", help="only HACPO's delta (written to deltas.json)")
    parser.add_argument("--aggregate-only", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    return parser


def run_grid(args: argparse.Namespace, out: Path, calibrate, run, aggregate) -> int:
    """The delta (once), every (seed, method) run whose summary is missing (`out/summaries/<method>-s<seed>.json`),
    then the aggregate."""
    if not args.aggregate_only:
        print(f"== delta {calibrate(out, args.smoke)}", flush=True)
        if args.calibrate:
            return 0
        for seed in args.seeds:
            for method in args.methods:
                path = out / "summaries" / f"{method}-s{seed}.json"
                if path.exists():
                    continue
                summary = run(out, method, seed, args.smoke)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(summary, indent=1) + "\n")
    result = aggregate(out)
    print(f"{result['runs']} runs aggregated into {out / 'evidence.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
