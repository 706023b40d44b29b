"""Does sharing reach the gradient on the real pair (issue 84, part 3)? One HACPO step of `configs/real_pair.yaml`
(SmolLM2-135M-Instruct beside Qwen2.5-Coder-0.5B-Instruct) and, for every foreign row a learner trains on, its
sequence ratio under all three foreign-ratio normalisations at once (`source_mean`, the paper's; `learner_length`;
`bytes`: spec 3.4b, `hacrl.core.ratios.foreign_terms`), on the same rows at the same weights, with the share of
rows inside the window [lo_m, 1] of the mini-batch they are in.

    hacrl bootstrap --recipe real-pair                 # the two models (once)
    python benchmarks/real_pair_ratios.py              # seed 0, the paper's settings; ~8 min alone on 2 cores
    python benchmarks/real_pair_ratios.py --seed 1 --set trainer.mini_batch_layout=mixed

The step is the one `hacrl train configs/real_pair.yaml trainer.steps=1` takes (the run's own foreign ratio,
`source_mean` unless --set changes it, is the one its update uses), run in this process on the local backend with
`runtime.host_memory: release` instead of the config's mimalloc, which restarts the process it runs in (the numbers
are the same with every setting: tests/agent/test_host_memory.py). Each learner's loss is wrapped to read its inputs
before it computes, so the ratios are the loss's own: the learner's log-probs at the weights of that mini-batch
(under `blocks` the own rows come first, so the foreign rows meet lo_1 after one update on the own rows; the ratio
under every mode is a function of the same inputs). Nothing of the run is changed. Writes real-pair-ratios.json and
.md in --out (one file per seed and layout).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def recording(loss, rows: list[dict]):
    """`loss` that first records, for each foreign row of its inputs, the ratio under every mode and the window."""
    from hacrl.core.losses import sequence_log_ratios
    from hacrl.core.ratios import FOREIGN_RATIO_MODES, LOG_RATIO_CLAMP, foreign_lower_bound

    def wrapped(inputs, *, params, step_index):
        foreign = (~inputs.is_own).nonzero().flatten().tolist()
        if foreign:
            lower = foreign_lower_bound(step_index, delta=params.delta, delta_step=params.delta_step)
            ratios = {
                mode: sequence_log_ratios(inputs, mode).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp().tolist()
                for mode in FOREIGN_RATIO_MODES
            }
            for i in foreign:
                row = {"learner": inputs.learner, "source": int(inputs.source[i]), "m": step_index, "lower": lower}
                rows.append({**row, **{mode: ratios[mode][i] for mode in FOREIGN_RATIO_MODES}})
        return loss(inputs, params=params, step_index=step_index)

    return wrapped


def summarize(rows: list[dict], names: list[str]) -> list[dict]:
    """Per direction (learner reading source) and mode: p10 / p50 / p90 of the ratio and the share of rows inside
    [lo_m, 1] (below: under lo_m; above: over 1)."""
    from hacrl.core.ratios import FOREIGN_RATIO_MODES

    out = []
    for learner in sorted({r["learner"] for r in rows}):
        for source in sorted({r["source"] for r in rows if r["learner"] == learner}):
            chosen = [r for r in rows if r["learner"] == learner and r["source"] == source]
            for mode in FOREIGN_RATIO_MODES:
                values = [r[mode] for r in chosen]
                deciles = statistics.quantiles(values * (2 if len(values) == 1 else 1), n=10, method="inclusive")
                inside = sum(r["lower"] <= r[mode] <= 1.0 for r in chosen)
                below = sum(r[mode] < r["lower"] for r in chosen)
                out.append({"learner": names[learner], "source": names[source], "mode": mode, "rows": len(chosen),
                            "p10": deciles[0], "p50": deciles[4], "p90": deciles[8],
                            "inside": inside / len(chosen), "below": below / len(chosen),
                            "above": (len(chosen) - inside - below) / len(chosen),
                            "lower": sorted({r["lower"] for r in chosen})})  # fmt: skip
    return out


def markdown(result: dict) -> str:
    lines = [
        f"# The real pair's foreign ratios, one step (seed {result['seed']}, {result['layout']})",
        "",
        f"`{result['command']}` at {result['commit']}, {result['cpu']}; the update's own mode: "
        f"`{result['foreign_ratio']}`; step {result['seconds']:.0f} s.",
        "",
        "| learner | reads | mode | rows | p10 | p50 | p90 | inside [lo_m, 1] | below lo_m | above 1 | lo_m |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in result["summary"]:
        lower = ", ".join(f"{x:.3f}" for x in s["lower"])
        lines.append(
            f"| {s['learner']} | {s['source']} | {s['mode']} | {s['rows']} | {s['p10']:.3f} | {s['p50']:.3f} | "
            f"{s['p90']:.3f} | {100 * s['inside']:.0f} % | {100 * s['below']:.0f} % | {100 * s['above']:.0f} % | "
            f"{lower} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "real_pair.yaml"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], help="further key=value overrides of the config")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args(argv)

    import subprocess

    import hacrl.core.algorithms as algorithms
    from hacrl.config import load_config
    from hacrl.driver.trainer import Trainer

    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        overrides = ["trainer.steps=1", "eval.at_start=false", "eval.every=0", "checkpoint.every=0",
                     f"trainer.seed={args.seed}", f"trainer.output_dir={tmp}/run", "runtime.host_memory=release",
                     "runtime.backend=local", *args.set]  # fmt: skip
        cfg = load_config(args.config, overrides)
        if cfg.algorithm.foreign_center != "none":  # its shift is computed for the run's mode only
            print("algorithm.foreign_center shifts only the run's own mode: run the probe without it", file=sys.stderr)
            return 2
        names = [a.name for a in cfg.agents]
        hacpo = algorithms.ALGORITHMS["hacpo"]
        algorithms.ALGORITHMS["hacpo"] = dataclasses.replace(hacpo, loss=recording(hacpo.loss, rows))
        try:  # the learners take the loss from the registry as they are built
            trainer = Trainer(cfg)
            try:
                started = time.perf_counter()
                metrics = trainer.train_step()
                seconds = time.perf_counter() - started
            finally:
                trainer.close()
        finally:
            algorithms.ALGORITHMS["hacpo"] = hacpo
    if not rows:
        print("no foreign row reached a learner's loss (is algorithm.name hacpo?)", file=sys.stderr)
        return 2
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), platform.machine())
    result = {
        "command": "python benchmarks/real_pair_ratios.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": commit.stdout.strip(),
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "seed": args.seed,
        "layout": cfg.trainer.mini_batch_layout,
        "foreign_ratio": cfg.algorithm.foreign_ratio,
        "seconds": seconds,
        "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))},
        "summary": summarize(rows, names),
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"real-pair-ratios-seed{args.seed}-{result['layout']}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))
    mean = statistics.mean(r["source_mean"] for r in rows)
    print(f"{len(rows)} foreign rows read; mean source_mean ratio {mean:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
