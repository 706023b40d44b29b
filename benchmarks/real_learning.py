"""The real bed's learning round (issue 69, part 6; pre-registered in benchmarks/results/analysis.md, "Real-bed round
1"): HACPO against GSPO for each agent of `configs/real.yaml` (SmolLM2-135M-Instruct and its 4M partner).

    hacrl bootstrap --recipe real                        # the two agents (once)
    python benchmarks/real_learning.py --pilot 2         # seconds per step of each arm (no evaluation looked at)
    python benchmarks/real_learning.py --seeds 0 1 2     # the round; each finished run is logged, so seeds can run
                                                         # in separate processes and a stop loses none
    python benchmarks/real_learning.py --seeds           # render the runs logged so far
    python benchmarks/real_learning.py --steps RUN_DIR.. # the runs' per-step paths (real-learning-steps.json)
    python benchmarks/real_learning.py --probe-momentum  # after the round: arm C with and without one extra
                                                         # zero-gradient optimizer step an update (analysis.md)

The log, benchmarks/results/real-learning-runs.jsonl, is committed: a seed takes ~2 hours alone on 2 cores, so the
round runs in parts, in different sessions and possibly on different machines. Every row names the commit it ran
from, the machine's CPU and the partner's warm-start accuracy (`hacrl bootstrap --recipe real` rebuilds the partner
bit for bit on one machine, but float sums differ between CPUs: the warm-start can differ by a few points between
machines; the comparisons are paired by seed, and a seed's arms run on one machine).

Arms, each from `configs/real.yaml` with evaluation at the end only (256 held-out prompts, greedy pass@1):
    A  HACPO, both agents together
    B  GSPO, SmolLM2 alone
    C  GSPO, the partner alone
Every arm runs the same number of steps (the paper's comparison: equal steps, each agent sampling G answers a
prompt; a HACPO learner also trains on the other's answers). Writes benchmarks/results/real-learning.md / .json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
AGENTS = ROOT / ".cache" / "real-agents"
LOG = RESULTS / "real-learning-runs.jsonl"
"""Every finished run of the round (committed: see the module docstring)."""
STEPS = 40
"""Steps of every arm (from the pilot: analysis.md)."""
SEEDS = (0, 1, 2)
"""The pre-registered seeds (`trainer.seed`): the rule is applied once all have run."""
ARMS = {"A": ("hacpo", [0, 1]), "B": ("gspo", [0]), "C": ("gspo", [1])}
"""arm -> (algorithm, the agents of configs/real.yaml it trains)."""


def arm_config(arm: str, scratch: Path, steps: int, seed: int, at_start: bool) -> Path:
    algorithm, which = ARMS[arm]
    cfg = yaml.safe_load((ROOT / "configs" / "real.yaml").read_text())
    agents = [dict(cfg["agents"][i], model=str(AGENTS / Path(cfg["agents"][i]["model"]).name)) for i in which]
    cfg.update(agents=agents, algorithm={"name": algorithm})
    cfg["trainer"].update(steps=steps, seed=seed, output_dir=str(scratch / f"run-{arm}-{seed}-{time.time_ns()}"))
    # the round's settings as pre-registered (a24f6ef): configs/real.yaml took micro_batch_order length (float sums
    # in another order) and mimalloc (the same numbers) later; the round's seeds must run as seed 0 did
    cfg["trainer"]["micro_batch_order"] = "pool"
    cfg["runtime"] = {**cfg.get("runtime", {}), "host_memory": "keep"}
    cfg["eval"] = {"every": 0, "at_start": at_start}
    cfg["checkpoint"] = {"every": 0}
    cfg["logging"] = {"console": False, "tensorboard": False}
    path = scratch / f"{arm}-{seed}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(config: Path, command: list[str] | None = None) -> dict:
    """`hacrl train CONFIG` (or `command`) in a process of its own; the run's seconds and evaluations."""
    command = command or [sys.executable, "-m", "hacrl", "train", str(config)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"hacrl train {config} failed:\n{done.stderr[-3000:]}")
    run_dir = Path(yaml.safe_load(config.read_text())["trainer"]["output_dir"])
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "time/step" in r]
    names = [a["name"] for a in yaml.safe_load(config.read_text())["agents"]]
    row = {"train_s": sum(r["time/step"] for r in steps),
           "step_s": statistics.median(r["time/step"] for r in steps[1:] or steps)}  # fmt: skip
    for name in names:
        if f"eval/{name}/pass@1" in records[-1]:
            row[f"{name}/pass@1"] = records[-1][f"eval/{name}/pass@1"]
        if records[0].get("step") == 0 and f"eval/{name}/pass@1" in records[0]:
            row[f"{name}/start"] = records[0][f"eval/{name}/pass@1"]
    return row


def pilot(steps: int) -> dict:
    scratch = RESULTS / ".runs" / "real-learning-pilot"
    scratch.mkdir(parents=True, exist_ok=True)
    timing = {}
    for arm in ARMS:
        config = arm_config(arm, scratch, steps, 0, at_start=False)
        cfg = yaml.safe_load(config.read_text())
        cfg["eval"]["max_prompts"] = 1  # the last step evaluates: on one prompt (not looked at)
        config.write_text(yaml.safe_dump(cfg))
        timing[arm] = {k: v for k, v in run(config).items() if not k.endswith("pass@1")}
        print(arm, json.dumps(timing[arm]), flush=True)
    return {"steps": steps, "timing": timing}


def provenance() -> dict:
    """What a logged run ran from: the commit (with `+` where the work tree differed), the CPU and the partner's
    warm-start accuracy (`bootstrap.json`)."""
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), platform.processor())
    warm = json.loads((AGENTS / "bootstrap.json").read_text())["agents"]
    return {"commit": commit + ("+" if dirty.stdout.strip() else ""), "cpu": cpu,
            "warm_start": {name: a["eval_pass@1"] for name, a in warm.items()}}  # fmt: skip


def learning(seeds: list[int]) -> dict:
    scratch = RESULTS / ".runs" / "real-learning"
    scratch.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        for arm in ["A", "B", "C"][seed % 3 :] + ["A", "B", "C"][: seed % 3]:
            row = {"seed": seed, "arm": arm, "steps": STEPS,
                   **run(arm_config(arm, scratch, STEPS, seed, at_start=arm == "A")), **provenance()}  # fmt: skip
            with LOG.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    runs = [json.loads(line) for line in LOG.read_text().splitlines()] if LOG.is_file() else []
    return {"runs": runs, "agents": [a["name"] for a in yaml.safe_load((ROOT / "configs" / "real.yaml").read_text())
                                     ["agents"]]}  # fmt: skip


def paired(runs: list[dict], agent: str, arm: str, base: str) -> str | None:
    """`arm - base` on `agent`'s final pass@1, paired by seed, with the pre-registered rule."""
    value = {(r["seed"], r["arm"]): r[f"{agent}/pass@1"] for r in runs if f"{agent}/pass@1" in r}
    seeds = sorted({s for s, _ in value})
    diffs = [value[(s, arm)] - value[(s, base)] for s in seeds if (s, arm) in value and (s, base) in value]
    if not diffs:
        return None
    if len(diffs) < len(SEEDS):
        each = ", ".join(f"{100 * d:+.1f}" for d in diffs)
        return (f"{agent}: {arm} - {base} = {each} points ({len(diffs)} of the {len(SEEDS)} seeds: no verdict before "
                "the round is run)")  # fmt: skip
    mean, se = statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5
    low, high = mean - 2 * se, mean + 2 * se
    verdict = ("equivalent within +-3 points" if low > -0.03 and high < 0.03 else
               "better" if low > 0 else "worse" if high < 0 else "inconclusive")  # fmt: skip
    return (f"{agent}: {arm} - {base} = {100 * mean:+.1f} points (standard error {100 * se:.1f}, {len(diffs)} seeds; "
            f"mean +- 2 SE [{100 * low:+.1f}, {100 * high:+.1f}]): {verdict}")  # fmt: skip


def render(result: dict) -> str:
    names, runs = result["agents"], result["runs"]
    lines = ["# Real-bed round 1: HACPO against GSPO for SmolLM2-135M-Instruct and its partner", "",
             "Pre-registered in `benchmarks/results/analysis.md` (Real-bed round 1); `python "
             f"benchmarks/real_learning.py --seeds ...`. Every arm {STEPS} steps of `configs/real.yaml`: (A) HACPO, "
             "both agents; (B) GSPO, SmolLM2 alone; (C) GSPO, the partner alone. Final greedy pass@1 on 256 held-out "
             "prompts (start: A's step-0 evaluation).", "",
             "| seed | arm | commit | CPU | partner warm-start | training s | "
             + " | ".join(f"{a} start | {a} final" for a in names) + " |",
             "|---" * (6 + 2 * len(names)) + "|"]  # fmt: skip
    for r in sorted(runs, key=lambda r: (r["seed"], r["arm"])):
        cells = []
        for a in names:
            cells += [f"{100 * r[k]:.1f} %" if k in r else "" for k in (f"{a}/start", f"{a}/pass@1")]
        warm = ", ".join(f"{100 * v:.1f} %" for v in r.get("warm_start", {}).values())
        lines.append(f"| {r['seed']} | {r['arm']} | {r.get('commit', '')} | {r.get('cpu', '')} | {warm} | "
                     f"{r['train_s']:.0f} | " + " | ".join(cells) + " |")  # fmt: skip
    missing = sorted(set(SEEDS) - {r["seed"] for r in runs if sum(x["seed"] == r["seed"] for x in runs) == 3})
    lines += ["", f"Seeds still to run (the pre-registered 0-2): {', '.join(map(str, missing))}." if missing else
              "All three pre-registered seeds have run."]  # fmt: skip
    for agent, base in zip(names, ("B", "C"), strict=False):
        line = paired(runs, agent, "A", base)
        if line:
            lines.append(f"- {line}")
    return "\n".join(lines) + "\n"


def with_momentum_step(update):
    """`hacrl.learner.update` with one more mini-batch at the end whose gradient is exactly zero: the step a
    HACPO learner takes on a mini-batch of foreign rows that are all clipped (analysis.md, Real-bed round 1)."""
    import torch

    def patched(optimizer, mini_batches, backward, clip_grad_norm, on_step=lambda: None):
        batches = list(mini_batches)

        def accumulate(m, batch, reducer):
            if batch is None:
                for p in optimizer.params:
                    p.grad = torch.zeros_like(p)
            else:
                backward(m, batch, reducer)

        return update(optimizer, [*batches, (batches[-1][0] + 1, None)] if batches else [], accumulate,
                      clip_grad_norm, on_step)  # fmt: skip

    return patched


STEP_KEYS = ("reward_mean", "response_length_mean", "foreign_clip_frac", "foreign_ratio_p90", "optimizer_steps")
"""What `step_paths` keeps of each agent's step records."""


def step_paths(run_dirs: list[Path]) -> dict:
    """Each run's per-step path, per agent (`STEP_KEYS`), from its metrics.jsonl: the evidence behind the analysis's
    reading of the round (which rows entered a gradient), small enough to commit where whole logs are not."""
    paths = {}
    for run_dir in run_dirs:
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        records = [r for r in records if "time/step" in r]
        keys = {k for r in records for k in r if k.count("/") == 1}  # `<agent>/<metric>`, not `eval/<agent>/...`
        names = sorted(k.split("/")[0] for k in keys if k.endswith("/reward_mean"))
        paths[run_dir.name] = {n: {key: [r.get(f"{n}/{key}") for r in records] for key in STEP_KEYS} for n in names}
    return paths


def probe_momentum() -> dict:
    """Arm C (the partner alone, GSPO) for each seed as the round ran it, and the same with `with_momentum_step`:
    does that step alone cost the partner what HACPO did?"""
    scratch = RESULTS / ".runs" / "real-learning-probe"
    scratch.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in SEEDS:
        for extra in (False, True):
            config = arm_config("C", scratch, STEPS, seed, at_start=False)
            row = run(config, [sys.executable, __file__, "--train-with-momentum-step", str(config)] if extra else None)
            run_dir = Path(yaml.safe_load(config.read_text())["trainer"]["output_dir"])
            taken = {n: set(path["optimizer_steps"]) for n, path in step_paths([run_dir])[run_dir.name].items()}
            if any(counts != {1 + extra} for counts in taken.values()):  # a patch that missed the learner: refused
                raise SystemExit(f"{run_dir}: optimizer steps an update {taken}, expected {1 + extra}")
            rows.append({"seed": seed, "momentum_step": extra, **row})
            print(json.dumps(rows[-1]), flush=True)
    return {**provenance(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pilot", type=int, metavar="STEPS", help="time STEPS steps of each arm")
    parser.add_argument("--seeds", type=int, nargs="*", default=None, help="the round's seeds (none: render)")
    parser.add_argument("--probe-momentum", action="store_true", help="arm C with and without a zero-gradient step")
    parser.add_argument("--train-with-momentum-step", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=Path, nargs="+", metavar="RUN_DIR", help="write the runs' per-step paths")
    args = parser.parse_args(argv)
    if args.steps:
        (RESULTS / "real-learning-steps.json").write_text(json.dumps(step_paths(args.steps)) + "\n")
        return 0
    if args.train_with_momentum_step:
        from hacrl.agent import learning as agent_learning
        from hacrl.tools.cli import main as hacrl_main

        agent_learning.update = with_momentum_step(agent_learning.update)  # the local backend's learners: this process
        return hacrl_main(["train", args.train_with_momentum_step])
    if args.probe_momentum:
        result = probe_momentum()
        (RESULTS / "real-learning-probe.json").write_text(json.dumps(result, indent=2) + "\n")
        return 0
    if args.pilot:
        result = pilot(args.pilot)
        (RESULTS / "real-learning-pilot.json").write_text(json.dumps(result, indent=2) + "\n")
        return 0
    result = learning(args.seeds or [])
    (RESULTS / "real-learning.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "real-learning.md").write_text(render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
