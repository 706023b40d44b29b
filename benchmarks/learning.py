"""Learning benchmark: HACPO against GSPO, GSPOx2, naive sharing and every ablation, over seeds, on the demo test bed.

Every method runs the same number of steps and prompts per step from the same bootstrapped agents
(`configs/demo.yaml`); seeds change sampling and prompt order only. Each (method, seed) run leaves a summary in
`benchmarks/results/summaries/<method>-s<seed>.json` (committed); a run whose summary exists is skipped, so the grid
can be run in parts. After the runs the script aggregates every summary it finds into `learning.md`,
`learning.json` and `learning.png` under `benchmarks/results/`.

    python benchmarks/learning.py                          # the full grid (hours on 2 cores; resumable)
    python benchmarks/learning.py --methods hacpo gspo --seeds 0
    python benchmarks/learning.py --aggregate-only         # rebuild the tables from the stored summaries
    python benchmarks/learning.py --resummarize            # rebuild the summaries from the runs kept in .runs/
    python benchmarks/learning.py --smoke --out /tmp/b     # seconds: tiny agents, 2 steps (the test suite runs it)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Overrides on top of configs/demo.yaml. GSPOx2 doubles G and keeps the mini-batch, so it trains on as many sequences
# per step, in as many optimizer steps, as a HACPO learner of two agents (own + foreign), with twice the rollouts.
METHODS: dict[str, list[str]] = {
    "hacpo": [],
    "gspo": ["algorithm.name=gspo"],
    "gspo_x2": ["algorithm.name=gspo", "@double_group"],
    "naive": ["algorithm.name=naive"],
    "hacpo_no_capability_baseline": ["algorithm.capability_baseline=false"],
    "hacpo_no_rho": ["algorithm.capability_coef=false"],
    "hacpo_alpha0": ["algorithm.alpha=0"],
    "hacpo_static_clip": ["algorithm.delta_step=0"],
    "hacpo_no_foreign_clip": ["algorithm.foreign_clip=false"],
    "hacpo_3_agents": ["@three_agents"],
    "gspo_3_agents": ["algorithm.name=gspo", "@three_agents"],  # the third agent's own GSPO baseline
}
DIAGNOSTICS = [
    "capability",
    "own_clip_frac",
    "foreign_clip_frac",
    "foreign_below_frac",
    "foreign_above_frac",
    "foreign_ratio_mean",
    "own_ratio_mean",
    "informative_group_frac",
    "rho_foreign_mean",
]


def beds():
    """`benchmarks/beds.py` as a module: the bootstrap recipes of the beds (the benchmarks are scripts, not a
    package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_beds", Path(__file__).with_name("beds.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_one(
    method: str, seed: int, *, out: Path, base: Path, extra: list[str], recipe_name: str, smoke: bool = False
) -> dict:
    """Train one (method, seed) through the real trainer and return its summary."""
    from hacrl.config import load_config
    from hacrl.driver.trainer import Trainer
    from hacrl.tools.testbed.demo import bootstrap

    recipes = beds().recipes()

    work = out / ".runs" / f"{method}-s{seed}"
    if work.exists():
        shutil.rmtree(work)  # an interrupted run restarts from scratch: its summary was never written
    overrides = [o for o in METHODS[method] if not o.startswith("@")]
    recipe = recipes[recipe_name]
    base_config = load_config(base, extra)
    agents_dir = Path(base_config.agents[0].model).parent
    if "@double_group" in METHODS[method]:
        overrides.append(f"rollout.group_size={2 * base_config.rollout.group_size}")
    if "@three_agents" in METHODS[method]:  # the recipe's agents plus a third, bootstrapped into their own folder
        recipe = recipes[recipe_name + "3"]
        agents_dir = agents_dir.with_name(agents_dir.name + "-3")
        lr = base_config.agents[0].lr
        entries = ", ".join(f"{{name: {a.name}, model: {agents_dir / a.name}, lr: {lr}}}" for a in recipe.agents)
        overrides.append(f"agents=[{entries}]")
    config = load_config(
        base,
        [
            *extra,
            *overrides,
            f"trainer.seed={seed}",
            f"trainer.output_dir={work}",
            "checkpoint.every=0",
            "checkpoint.keep_last=1",
        ],
    )
    bootstrap(agents_dir, recipe, parallel=1 if smoke else None)  # smoke: in-process (a spawn costs an import)
    print(f"== {method} seed {seed}: {config.trainer.steps} steps", flush=True)
    start = time.perf_counter()
    Trainer(config).train()
    seconds = time.perf_counter() - start
    summary = {
        "method": method,
        "seed": seed,
        "steps": config.trainer.steps,
        "seconds": seconds,
        "overrides": overrides,
        "agents": summarize_agents(work, config),
    }
    shutil.rmtree(work / "checkpoints", ignore_errors=True)  # keep metrics.jsonl, drop the weights
    return summary


def summarize_agents(work: Path, config, diagnostics: list[str] = DIAGNOSTICS) -> dict:
    """Per agent: accuracy curve and final value, rollouts, sequences, and every diagnostic per step and averaged."""
    from hacrl.driver.metrics import agent_key, agent_values, eval_values

    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    agents = {}
    for agent in config.agents:
        name = agent.name
        curve = [list(point) for point in eval_values(records, name, "pass@1")]
        train = [r for r in records if agent_key(name, "reward_mean") in r]
        agents[name] = {
            "final_accuracy": curve[-1][1],
            "initial_accuracy": curve[0][1],
            "curve": curve,
            "rollouts_generated": len(train) * config.trainer.prompts_per_step * config.rollout.group_size,
            "sequences_trained": sum(r.get(agent_key(name, "trained_sequences"), 0) for r in train),  # 0: frozen
            "diagnostics": {k: _mean([r.get(agent_key(name, k)) for r in train]) for k in diagnostics},
            "diagnostic_curves": {k: [list(point) for point in agent_values(train, name, k)] for k in diagnostics},
        }
    return agents


def resummarize(results_dir: Path) -> int:
    """Rebuild the per-agent part of every summary whose run directory (`.runs/<method>-s<seed>`) is still here."""
    from hacrl.config import load_config

    done = 0
    for path in sorted((results_dir / "summaries").glob("*.json")):
        work = results_dir / ".runs" / path.stem
        if not (work / "metrics.jsonl").is_file():
            print(f"== {path.stem}: no run directory in {work}, summary kept as it is", flush=True)
            continue
        summary = json.loads(path.read_text())
        summary["agents"] = summarize_agents(work, load_config(work / "config.yaml"))
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=1))
        tmp.replace(path)
        done += 1
    return done


def aggregate(results_dir: Path, command: str) -> dict:
    """Read every run summary and write learning.json, learning.md and learning.png."""
    runs = [json.loads(p.read_text()) for p in sorted((results_dir / "summaries").glob("*.json"))]
    table: dict[str, dict[str, dict]] = {}
    for run in runs:
        for agent, res in run["agents"].items():
            cell = table.setdefault(agent, {}).setdefault(run["method"], {"runs": []})
            cell["runs"].append({"seed": run["seed"], "seconds": run["seconds"], **res})
    for methods in table.values():
        for cell in methods.values():
            finals = [100 * r["final_accuracy"] for r in cell["runs"]]
            cell["accuracy_mean"] = statistics.mean(finals)
            cell["accuracy_std"] = statistics.stdev(finals) if len(finals) > 1 else None  # undefined for one seed
            cell["seeds"] = sorted(r["seed"] for r in cell["runs"])
            cell["initial_accuracy"] = 100 * cell["runs"][0]["initial_accuracy"]
            for key in ("rollouts_generated", "sequences_trained", "seconds"):
                cell[key] = statistics.mean(r[key] for r in cell["runs"])
            cell["diagnostics"] = {k: _mean([r["diagnostics"].get(k) for r in cell["runs"]]) for k in DIAGNOSTICS}
        base = methods.get("gspo") or methods.get("gspo_3_agents")  # the third agent only has the latter
        for cell in methods.values():
            cell["delta_vs_gspo"] = cell["accuracy_mean"] - base["accuracy_mean"] if base else None
            # same seed = same prompt order: per-seed differences remove that part of the run-to-run noise
            cell["paired_delta_vs_gspo"] = _paired(cell, base)
            cell["paired_delta_vs_gspo_x2"] = _paired(cell, methods.get("gspo_x2"))
    results = {"command": command, "runs": len(runs), "table": table}
    slim = {**results, "table": _without_curves(table)}  # per-step diagnostics stay in the summaries (size)
    (results_dir / "learning.json").write_text(json.dumps(slim, indent=1))
    (results_dir / "learning.md").write_text(_markdown(results, results_dir))
    if runs:
        _plot(table, results_dir / "learning.png")
        _plot_diagnostics(table, results_dir / "learning_diagnostics.png")
    return results


def _without_curves(table: dict) -> dict:
    return {
        agent: {
            method: {**cell, "runs": [{k: v for k, v in r.items() if k != "diagnostic_curves"} for r in cell["runs"]]}
            for method, cell in methods.items()
        }
        for agent, methods in table.items()
    }


def _paired(cell: dict, base: dict | None) -> list[float] | None:
    """Final accuracy minus the baseline's, seed by seed, over the seeds both have (points)."""
    if base is None:
        return None
    mine = {r["seed"]: 100 * r["final_accuracy"] for r in cell["runs"]}
    theirs = {r["seed"]: 100 * r["final_accuracy"] for r in base["runs"]}
    return [mine[s] - theirs[s] for s in sorted(mine.keys() & theirs.keys())]


def _format_paired(diffs: list[float] | None) -> str:
    if not diffs:
        return "-"
    if len(diffs) == 1:
        return f"{diffs[0]:+.1f} (1 seed)"
    return f"{statistics.mean(diffs):+.1f} ± {statistics.stdev(diffs):.1f}"


def _markdown(results: dict, results_dir: Path) -> str:
    lines = [
        "# Learning benchmark: HACPO vs baselines and ablations on the demo test bed",
        "",
        f"Reproduce: `{results['command']}` (each (method, seed) run is cached in `summaries/`).",
        "",
        "Curves (means over seeds): `learning.png` (greedy accuracy), `learning_diagnostics.png` (capability,",
        "foreign sequence ratios against the clip window [lo_m, 1], fraction of informative groups, per step).",
        "",
    ]
    order = list(METHODS)
    for agent, methods in results["table"].items():
        start = next(iter(methods.values()))["initial_accuracy"]
        lines += [
            f"## {agent} (greedy accuracy before training: {start:.1f} %)",
            "",
            "Δ columns: final accuracy minus the baseline's, seed by seed (same seed, same prompt order), mean ± sd.",
            "",
            "| method | accuracy % (mean ± sd) | seeds | Δ vs GSPO | Δ vs GSPOx2 | rollouts | sequences trained "
            "| time (s) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for method in sorted(methods, key=lambda m: order.index(m) if m in order else len(order)):
            c = methods[method]
            std = "-" if c["accuracy_std"] is None else f"{c['accuracy_std']:.1f}"
            lines.append(
                f"| {method} | {c['accuracy_mean']:.1f} ± {std} | {len(c['seeds'])} | "
                f"{_format_paired(c['paired_delta_vs_gspo'])} | {_format_paired(c['paired_delta_vs_gspo_x2'])} | "
                f"{c['rollouts_generated']:.0f} | {c['sequences_trained']:.0f} | {c['seconds']:.0f} |"
            )
        lines += [
            "",
            f"Diagnostics for {agent} (means over steps and seeds):",
            "",
            "| method | " + " | ".join(DIAGNOSTICS) + " |",
            "|---|" + "---|" * len(DIAGNOSTICS),
        ]
        for method in sorted(methods, key=lambda m: order.index(m) if m in order else len(order)):
            d = methods[method]["diagnostics"]
            lines.append(
                f"| {method} | " + " | ".join("-" if d[k] is None else f"{d[k]:.3f}" for k in DIAGNOSTICS) + " |"
            )
        lines.append("")
    analysis = results_dir / "analysis.md"
    if analysis.is_file():
        lines += [analysis.read_text().strip(), ""]
    return "\n".join(lines)


def _plot(table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = list(table)
    fig, axes = plt.subplots(1, len(agents), figsize=(6 * len(agents), 4), squeeze=False)
    for ax, agent in zip(axes[0], agents, strict=True):
        for method, cell in table[agent].items():
            steps = [s for s, _ in cell["runs"][0]["curve"]]
            mean = [100 * statistics.mean(r["curve"][i][1] for r in cell["runs"]) for i in range(len(steps))]
            ax.plot(steps, mean, marker="o", markersize=3, label=method)
        ax.set(title=f"{agent}: greedy eval accuracy (mean over seeds)", xlabel="step", ylabel="%")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _mean_curve(cell: dict, key: str | None = None) -> tuple[list[int], list[float]]:
    """Step -> mean over seeds of the accuracy curve (key None) or of a diagnostic's per-step curve."""
    curves = [r["curve"] if key is None else r.get("diagnostic_curves", {}).get(key, []) for r in cell["runs"]]
    curves = [c for c in curves if c]
    if not curves:
        return [], []
    steps = [s for s, _ in curves[0]]
    n = min(len(c) for c in curves)
    return steps[:n], [statistics.mean(c[i][1] for c in curves) for i in range(n)]


def _plot_diagnostics(table: dict, path: Path) -> None:
    """Per agent, over steps (means over seeds): capability under HACPO and GSPO, the foreign sequence ratios'
    position relative to the clip window [lo_m, 1], and the fraction of informative groups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = list(table)
    panels = ["capability", "foreign ratio vs clip window", "informative_group_frac"]
    fig, axes = plt.subplots(len(agents), len(panels), figsize=(5 * len(panels), 3.2 * len(agents)), squeeze=False)
    for row, agent in zip(axes, agents, strict=True):
        cells = table[agent]
        for method in ("hacpo", "gspo", "naive", "hacpo_3_agents", "gspo_3_agents"):
            if method in cells:
                row[0].plot(*_mean_curve(cells[method], "capability"), label=method)
                row[2].plot(*_mean_curve(cells[method], "informative_group_frac"), label=method)
        for method, style in (("hacpo", "-"), ("hacpo_3_agents", ":")):
            if method in cells:
                for key, color in (("foreign_below_frac", "tab:blue"), ("foreign_above_frac", "tab:red")):
                    row[1].plot(*_mean_curve(cells[method], key), style, color=color, label=f"{method} {key}")
                row[1].plot(
                    *_mean_curve(cells[method], "foreign_ratio_mean"),
                    style,
                    color="k",
                    label=f"{method} foreign_ratio_mean",
                )
        for ax, title in zip(row, panels, strict=True):
            ax.set(title=f"{agent}: {title}", xlabel="step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    parser.add_argument("--set", dest="overrides", nargs="*", default=[], help="extra dotted overrides for every run")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="results directory")
    parser.add_argument("--aggregate-only", action="store_true")
    parser.add_argument(
        "--resummarize",
        action="store_true",
        help="rebuild the stored summaries from their run directories in .runs/ (after a change of what is kept)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny agents, 2 steps: checks the script end to end")
    args = parser.parse_args(argv)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = Path(args.out)
    (out / "summaries").mkdir(parents=True, exist_ok=True)
    recipe, extra = "demo", list(args.overrides)
    if args.smoke:
        recipe = "tiny"
        agents = out / ".agents"
        extra = [
            f"agents.0.model={agents / 'llama-char'}",
            f"agents.1.model={agents / 'qwen-bpe'}",
            "trainer.steps=2",
            "trainer.prompts_per_step=4",
            "trainer.mini_batch_size=8",
            "trainer.micro_batch_size=8",
            "rollout.group_size=4",
            "data.train_size=500",
            "data.eval_size=32",
            "eval.every=1",
            "logging.console=false",
            "logging.tensorboard=false",
            *extra,
        ]
    # the command that reproduces the whole grid these summaries belong to (runs may have been made in parts)
    command = "python benchmarks/learning.py" + (f" --set {' '.join(args.overrides)}" if args.overrides else "")
    if args.smoke:
        command += " --smoke"
    if args.resummarize:
        print(f"{resummarize(out)} summaries rebuilt from their run directories", flush=True)
    if not args.aggregate_only and not args.resummarize:
        for seed in args.seeds:
            for method in args.methods:
                target = out / "summaries" / f"{method}-s{seed}.json"
                if target.exists():
                    print(f"== {method} seed {seed}: cached in {target}", flush=True)
                    continue
                summary = run_one(
                    method, seed, out=out, base=Path(args.config), extra=extra, recipe_name=recipe, smoke=args.smoke
                )
                tmp = target.with_suffix(".tmp")
                tmp.write_text(json.dumps(summary, indent=1))
                tmp.replace(target)  # a summary exists only for a finished run
    results = aggregate(out, command.strip())
    print(f"{results['runs']} runs aggregated into {out / 'learning.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
