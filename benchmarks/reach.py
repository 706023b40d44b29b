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

import importlib.util
import json
import statistics
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


def calibrate(out: Path, smoke: bool) -> float:
    """The pre-registered delta (control round 1's rule): a 10-step HACPO run with the defined mapping on seed 0,
    each learner's median over steps of its 10th percentile of foreign ratios, `evidence.delta_rule`."""
    overrides = ["algorithm.name=hacpo", "mapping.default=defined"]
    return _control().calibrate_delta(out, smoke, BED, overrides, (STRONGER, WEAKER), SMOKE)


def _series(records: list[dict], key: str) -> list:
    return [[r["step"], r[key]] for r in records if key in r]


def run(out: Path, method: str, seed: int, smoke: bool) -> dict:
    config, records, summary = _control().train_method(out, BED, METHODS, method, seed, SMOKE if smoke else [],
                                                       "reach")  # fmt: skip
    per_step = config.trainer.initial_states_per_step * config.trainer.group_size * config.env.max_cycles
    for p in config.policies:
        other = next(q.name for q in config.policies if q.name != p.name)
        curve = _series(records, f"eval/{p.name}/success")
        summary["agents"][p.name] = {
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
            "replay_below": [v for _, v in _series(records, f"{p.name}/replay/below_frac")],
            "fresh_below": [v for _, v in _series(records, f"{p.name}/replay/fresh/below_frac")],
        }
    return summary


def aggregate(out: Path) -> dict:
    control = _control()
    count, cells, budget = control.cells_of(out)
    result = {"runs": count, "pairs": control.paired(cells, PAIRS, (WEAKER, STRONGER), budget), "final": {},
              "mapping": {}}  # fmt: skip
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
            below = [b for r in by_seed.values() for b in r["agents"][name].get("replay_below", [])]
            if below:  # summaries written before these diagnostics existed have none (seeds 0 and 1)
                fresh = [b for r in by_seed.values() for b in r["agents"][name].get("fresh_below", [])]
                replayed = [k for r in by_seed.values() for k in r["agents"][name]["replay_kept"]]
                result.setdefault("replay", {})[f"{method} / {name}"] = {
                    "kept_mean": statistics.mean(replayed),
                    "below_frac": statistics.mean(below),
                    "fresh_below_frac": statistics.mean(fresh) if fresh else None,
                    "seeds": sorted(s for s, r in by_seed.items() if r["agents"][name].get("replay_below")),
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
    control = _control()
    for key, ci in result["pairs"].items():
        pair, name = key.split(" / ")
        primary = (pair, name) == (f"{PRIMARY[0]} - {PRIMARY[1]}", PRIMARY[2])
        verdict = (ci.get("verdict") or "-") if primary else f"({ci.get('verdict') or '-'}, secondary)"
        lines.append(control.pair_row(pair, name, ci, verdict))
    lines += ["", "Success at the budget and at the run's end, by seed:", "", *control.final_lines(result["final"])]
    lines += ["", "Mappings (over every step and seed): replays kept, mean mapping error, the learned model's held-out "
              "error, foreign clip fraction:", ""]  # fmt: skip
    for key, m in result["mapping"].items():
        err = "-" if m["error_mean"] is None else f"{100 * m['error_mean']:.1f} cm"
        inv = "" if m["inverse_error_mean"] is None else f", inverse model {m['inverse_error_mean']:.4f}"
        clip = "-" if m["foreign_clip_frac"] is None else f"{m['foreign_clip_frac']:.2f}"
        lines.append(f"- {key}: kept {100 * m['kept_frac']:.0f} %, error {err}{inv}, clip {clip}")
    if result.get("replay"):
        lines += ["", "Experience buffers: buffered foreign rows kept per step, and the share of buffered against "
                  "fresh foreign rows below 1 - delta when an update starts:", ""]  # fmt: skip
        for key, r in result["replay"].items():
            fresh = "-" if r["fresh_below_frac"] is None else f"{r['fresh_below_frac']:.2f}"
            lines.append(f"- {key}: {r['kept_mean']:.1f} kept, below {r['below_frac']:.2f} (fresh {fresh}), "
                         f"seeds {r['seeds']}")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    control = _control()
    args = control.grid_arguments(__doc__, METHODS, SEEDS, "reach").parse_args(argv)
    return control.run_grid(
        args, Path(args.out or ROOT / "benchmarks" / "results" / "reach"), calibrate, run, aggregate
    )


if __name__ == "__main__":
    raise SystemExit(main())
