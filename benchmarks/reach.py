"""Reach round 1 (issue 72, part 4): robot arms that differ in their actuators, HACPO through a defined and a learned
mapping against GSPO alone, naive sharing and GSPOx2; then experience buffers against none.

Pre-registered in `benchmarks/results/analysis.md` ("Reach round 1"), written before any grid run; this script runs
exactly that on `benchmarks/configs/reach_bed.yaml`. Every (method, seed) run leaves
`benchmarks/results/reach/summaries/<method>-s<seed>.json` (committed, with the machine it ran on); a run whose
summary exists is skipped, so the grid runs in parts (one seed's row on one machine).

    python benchmarks/reach.py --calibrate          # HACPO's delta from a 10-step ratio distribution (once)
    python benchmarks/reach.py --seeds 0            # one seed's every method (~25 min on 2 cores)
    python benchmarks/reach.py                      # every missing run, then the aggregate
    python benchmarks/reach.py --aggregate-only     # rebuild reach/evidence.md / .json
    python benchmarks/reach.py --smoke --out /tmp/r # tiny: 2 steps per run, 1 seed
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BED = ROOT / "benchmarks" / "configs" / "reach_bed.yaml"
SHARED = ["@delta"]
METHODS = {
    "gspo": ["algorithm.name=gspo"],
    "gspo_x2": ["algorithm.name=gspo", "trainer.group_size=16", "trainer.mini_batch_size=128"],
    "naive": ["algorithm.name=naive", "mapping.default=defined"],
    "hacpo_defined": ["algorithm.name=hacpo", "mapping.default=defined", *SHARED],
    "hacpo_learned": ["algorithm.name=hacpo", "mapping.default=learned", *SHARED],
    "hacpo_defined_replay": ["algorithm.name=hacpo", "mapping.default=defined", "sharing.replay.steps=4", *SHARED],
}
SEEDS = [0, 1, 2, 3, 4]
WEAKER, STRONGER = "arm3", "arm2"
PAIRS = [("hacpo_defined", "gspo"), ("hacpo_learned", "gspo"), ("hacpo_defined", "naive"),
         ("hacpo_defined", "gspo_x2"), ("hacpo_defined_replay", "hacpo_defined")]  # fmt: skip
PRIMARY = ("hacpo_defined", "gspo", WEAKER)
SMOKE = ["trainer.steps=2", "trainer.initial_states_per_step=2", "trainer.group_size=4", "trainer.mini_batch_size=4",
         "eval.every=1", "eval.initial_states=4"]  # fmt: skip


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _control():
    return _load("control_benchmark", "control.py")


def _evidence():
    return _load("evidence_benchmark", "evidence.py")


def _train(overrides: list[str], work: Path):
    import shutil

    from hacrl.control.config import load_control_config
    from hacrl.control.trainer import ControlTrainer

    shutil.rmtree(work, ignore_errors=True)
    config = load_control_config(BED, [*overrides, f"trainer.output_dir={work}"])
    ControlTrainer(config).train()
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    return config, records


def calibrate(out: Path, smoke: bool) -> float:
    """The pre-registered delta (control round 1's rule): a 10-step HACPO run with the defined mapping on seed 0,
    each learner's median over steps of its 10th percentile of foreign ratios, `evidence.delta_rule`."""
    path = out / "deltas.json"
    if path.is_file():
        return json.loads(path.read_text())["delta"]
    steps = 2 if smoke else 10
    _, records = _train([*(SMOKE if smoke else []), "algorithm.name=hacpo", "mapping.default=defined",
                         f"trainer.steps={steps}", "eval.at_start=false", "eval.every=0", "eval.initial_states=4",
                         "trainer.seed=0"], out / ".runs" / "calibration")  # fmt: skip
    p10 = {
        name: statistics.median(r[f"{name}/foreign_ratio_p10"] for r in records if f"{name}/foreign_ratio_p10" in r)
        for name in (STRONGER, WEAKER)
    }
    delta = _evidence().delta_rule(p10)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"p10": p10, "delta": delta, "steps": steps}, indent=1) + "\n")
    return delta


def _series(records: list[dict], key: str) -> list:
    return [[r["step"], r[key]] for r in records if key in r]


def run(out: Path, method: str, seed: int, smoke: bool) -> dict:
    ev = _evidence()
    delta = json.loads((out / "deltas.json").read_text())["delta"]
    overrides = [f"algorithm.delta={delta}" if o == "@delta" else o for o in METHODS[method]]
    overrides += [f"trainer.seed={seed}", *(SMOKE if smoke else [])]
    work = out / ".runs" / f"{method}-s{seed}"
    print(f"== reach {method} seed {seed}", flush=True)
    start, load = time.perf_counter(), ev.Load()
    config, records = _train(overrides, work)
    seconds = time.perf_counter() - start
    per_step = config.trainer.initial_states_per_step * config.trainer.group_size * config.env.max_cycles
    agents = {}
    for p in config.policies:
        other = next(q.name for q in config.policies if q.name != p.name)
        curve = _series(records, f"eval/{p.name}/success")
        agents[p.name] = {
            "curve": curve,
            "reward_eval": _series(records, f"eval/{p.name}/reward_mean"),
            "final_success": curve[-1][1],
            "env_steps_per_step": per_step,
            "reward_curve": _series(records, f"{p.name}/reward_mean"),
            "foreign_clip_frac": [v for _, v in _series(records, f"{p.name}/foreign_clip_frac")],
            "mapped_kept": [v for _, v in _series(records, f"{p.name}/mapped/{other}/kept")],
            "mapped_filtered": [v for _, v in _series(records, f"{p.name}/mapped/{other}/filtered")],
            "mapping_error": [v for _, v in _series(records, f"{p.name}/mapped/{other}/error_mean")],
            "inverse_error": [v for _, v in _series(records, f"{p.name}/mapping/inverse_error")],
            "replay_kept": [v for _, v in _series(records, f"{p.name}/replay/kept")],
        }
    summary = {"method": method, "seed": seed, "steps": config.trainer.steps, "seconds": seconds, **load.result(),
               "overrides": overrides, "machine": ev.machine(), "agents": agents}  # fmt: skip
    import shutil

    shutil.rmtree(work / "checkpoints", ignore_errors=True)
    return summary


def aggregate(out: Path) -> dict:
    ev, control = _evidence(), _control()
    runs = [json.loads(p.read_text()) for p in sorted((out / "summaries").glob("*.json"))]
    cells: dict = {}
    for r in runs:
        cells.setdefault(r["method"], {})[r["seed"]] = r
    result: dict = {"runs": len(runs), "pairs": {}, "final": {}, "mapping": {}}
    budget = None
    if "gspo" in cells:
        any_run = next(iter(cells["gspo"].values()))
        budget = any_run["steps"] * any_run["agents"][WEAKER]["env_steps_per_step"]
    for a, b in PAIRS:
        seeds = sorted(set(cells.get(a, {})) & set(cells.get(b, {})))
        for name in (WEAKER, STRONGER):
            diffs = []
            for s in seeds:
                mine = control.success_at(cells[a][s]["agents"][name], budget)
                theirs = control.success_at(cells[b][s]["agents"][name], budget)
                if mine is not None and theirs is not None:
                    diffs.append(100 * (mine - theirs))
            ci = ev.paired_ci(diffs)
            verdict = None
            if ci.get("lo") is not None:
                verdict = "pays" if ci["lo"] > 0 else "costs" if ci["hi"] < 0 else "level"
            result["pairs"][f"{a} - {b} / {name}"] = {**ci, "verdict": verdict}
    for method, by_seed in cells.items():
        for name in (WEAKER, STRONGER):
            result["final"][f"{method} / {name}"] = {
                s: [control.success_at(r["agents"][name], budget), r["agents"][name]["final_success"]]
                for s, r in by_seed.items()
            }
            kept = [k for r in by_seed.values() for k in r["agents"][name]["mapped_kept"]]
            filtered = [f for r in by_seed.values() for f in r["agents"][name]["mapped_filtered"]]
            if kept:
                errors = [e for r in by_seed.values() for e in r["agents"][name]["mapping_error"]]
                inverse = [e for r in by_seed.values() for e in r["agents"][name]["inverse_error"]]
                clip = [c for r in by_seed.values() for c in r["agents"][name]["foreign_clip_frac"] if c is not None]
                result["mapping"][f"{method} / {name}"] = {
                    "kept_frac": sum(kept) / max(1, sum(kept) + sum(filtered)),
                    "error_mean": statistics.mean(errors) if errors else None,
                    "inverse_error_mean": statistics.mean(inverse) if inverse else None,
                    "foreign_clip_frac": statistics.mean(clip) if clip else None,
                }
    out.mkdir(parents=True, exist_ok=True)
    (out / "evidence.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "evidence.md").write_text(markdown(result, budget))
    return result


def markdown(result: dict, budget: int | None) -> str:
    lines = [
        "# Reach round 1: arms that differ in their actuators, HACPO through mappings (MuJoCo)",
        "",
        f"Pre-registration: `benchmarks/results/analysis.md`, reach round 1. Runs: {result['runs']}. Greedy success "
        f"on the held-out goals, in points, at {budget or 0:,} environment steps per policy; paired differences per "
        f"seed: mean [95 % t interval] (n). The primary: {PRIMARY[0]} - {PRIMARY[1]} on {PRIMARY[2]}.",
        "",
        "| difference | policy | mean [95 % CI] | per seed | verdict |",
        "|---|---|---|---|---|",
    ]
    for key, ci in result["pairs"].items():
        pair, name = key.split(" / ")
        mean = "-" if ci.get("mean") is None else f"{ci['mean']:+.1f}"
        interval = "" if ci.get("lo") is None else f" [{ci['lo']:+.1f}, {ci['hi']:+.1f}]"
        seeds = ", ".join(f"{d:+.1f}" for d in ci.get("diffs", []))
        primary = (pair, name) == (f"{PRIMARY[0]} - {PRIMARY[1]}", PRIMARY[2])
        verdict = (ci.get("verdict") or "-") if primary else f"({ci.get('verdict') or '-'}, secondary)"
        lines.append(f"| {pair} | {name} | {mean}{interval} (n={ci.get('n', 0)}) | {seeds} | {verdict} |")
    lines += ["", "Success at the budget and at the run's end, by seed:", ""]
    for key, by_seed in result["final"].items():
        cells = ", ".join(
            f"s{s}: {100 * a:.0f} / {100 * b:.0f}" if a is not None else f"s{s}: - / {100 * b:.0f}"
            for s, (a, b) in sorted(by_seed.items(), key=lambda x: int(x[0]))
        )
        lines.append(f"- {key}: {cells}")
    lines += ["", "Mappings (over every step and seed): replays kept, mean mapping error, the learned model's held-out "
              "error, foreign clip fraction:", ""]  # fmt: skip
    for key, m in result["mapping"].items():
        err = "-" if m["error_mean"] is None else f"{100 * m['error_mean']:.1f} cm"
        inv = "" if m["inverse_error_mean"] is None else f", inverse model {m['inverse_error_mean']:.4f}"
        clip = "-" if m["foreign_clip_frac"] is None else f"{m['foreign_clip_frac']:.2f}"
        lines.append(f"- {key}: kept {100 * m['kept_frac']:.0f} %, error {err}{inv}, clip {clip}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    parser.add_argument("--out", help="results directory (default benchmarks/results/reach)")
    parser.add_argument("--calibrate", action="store_true", help="only HACPO's delta (written to deltas.json)")
    parser.add_argument("--aggregate-only", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out or ROOT / "benchmarks" / "results" / "reach")
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
