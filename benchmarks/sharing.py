"""Learning benchmark, round 4 (issue 45): HACPO with each sharing policy against `all`, on two beds, 5 seeds.

Pre-registered in `benchmarks/results/analysis.md` ("Round 4"), written before any run; this script runs exactly
that, with round 3's machinery (`benchmarks/evidence.py`: seed-shifted warm-starts, summaries per run, replays,
`HOLD`). Every run is HACPO with `algorithm.foreign_ratio=learner_length` and the bed's committed delta (round 2's
for `demo`, round 3's for `gap`), and one policy with its parameter pinned here (a later change of a default never
changes the benchmark). `all` is rerun next to the policies, so a seed's row (and its update seconds) comes from one
machine; the aggregate says whether each `all` run reproduced the committed round-2 / round-3 run.

    python benchmarks/sharing.py                          # everything missing, seed-major (~8.5 h on 2 cores)
    python benchmarks/sharing.py --seeds 0 --beds demo    # one seed's row of one bed
    python benchmarks/sharing.py --aggregate-only         # rebuild round4/evidence.md / .json
    python benchmarks/sharing.py --rerun-busy             # rerun the runs that shared the machine (must repeat)
    python benchmarks/sharing.py --smoke --out /tmp/r4    # tiny agents, 2 steps: the script end to end
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEDS = ("demo", "gap")
POLICIES = {
    "all": [],
    "correct": ["sharing.min_reward=1.0"],
    "learner_fails": ["sharing.fail_below=0.5"],
    "top_k": ["sharing.k=4"],
    "adaptive": ["sharing.margin=0.0"],
}
WEAKER = {"gap": "qwen-bpe", "demo": "llama-char"}
"""The primary's agent per bed (pre-registered): the Qwen2 by construction on `gap`; the Llama on `demo` (lower
final accuracy than the Qwen2 in every round-2 run)."""
EARLIER = {"demo": "round2", "gap": "round3"}
"""Where each bed's committed HACPO run (`hacpo_learner_length`) is, and its delta."""
MODE = "learner_length"
SHARING_METRICS = ["shared_offered", "shared_kept", "shared_tokens_saved", "trained_tokens", "time/update"]


def _evidence():
    spec = importlib.util.spec_from_file_location("evidence_benchmark", Path(__file__).with_name("evidence.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def methods(bed: str) -> dict[str, list[str]]:
    """Policy -> config overrides (`@delta:` resolved by the grid from round4/deltas.json)."""
    base = [f"algorithm.foreign_ratio={MODE}", f"@delta:{MODE}"]
    return {policy: [*base, f"sharing.policy={policy}", *extra] for policy, extra in POLICIES.items()}


def write_deltas(out: Path) -> dict:
    """round4/deltas.json: each bed's committed delta for `MODE`, copied from the round that calibrated it."""
    table = {}
    for bed, earlier in EARLIER.items():
        source = ROOT / "benchmarks" / "results" / earlier / "deltas.json"
        table[bed] = {MODE: {**json.loads(source.read_text())[bed][MODE], "from": str(source.relative_to(ROOT))}}
    path = out / "deltas.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    return table


# -- the aggregate ---------------------------------------------------------------------------------------------------
def _median_curve(agent: dict, metric: str) -> float | None:
    values = [v for _, v in agent.get("diagnostic_curves", {}).get(metric, []) if v is not None]
    return statistics.median(values) if values else None


def _kept_share(agent: dict, part: float, last: bool) -> float | None:
    """The learner's kept share of foreign rows over the first (or last) `part` of its steps."""
    curves = agent.get("diagnostic_curves", {})
    offered, kept = curves.get("shared_offered", []), curves.get("shared_kept", [])
    if not offered:
        return None
    n = max(1, round(len(offered) * part))
    window = slice(len(offered) - n, None) if last else slice(0, n)
    total = sum(v for _, v in offered[window])
    return sum(v for _, v in kept[window]) / total if total else None


def _steps_to(agent: dict, target: float) -> int | None:
    return next((step for step, accuracy in agent["curve"] if accuracy >= target - 1e-12), None)


def _rollouts_to(run: dict, agent: str, target: float) -> int | None:
    """Rollouts the agent had generated when its evaluated accuracy first reached `target` (None: never). A policy
    changes what a learner trains on, never what it samples, so the rollouts per step are the run's total over its
    steps."""
    step = _steps_to(run["agents"][agent], target)
    per_step = run["agents"][agent].get("rollouts_generated", 0) / max(1, run.get("steps") or 1)
    return None if step is None else round(step * per_step)


def aggregate(out: Path, ev) -> dict:
    """Every round-4 summary under `out` into evidence.json / evidence.md: the primary and secondaries as
    pre-registered."""
    runs = [json.loads(p.read_text()) for p in sorted((out / "summaries").glob("*/*.json"))]
    cells: dict = {}  # bed -> method -> seed -> run
    for run in runs:
        cells.setdefault(run["bed"], {}).setdefault(run["method"], {})[run["seed"]] = run
    result: dict = {"runs": len(runs), "beds": {}}
    for bed, by_method in cells.items():
        base = by_method.get("all", {})
        agents = sorted({a for m in by_method.values() for r in m.values() for a in r["agents"]})
        bed_out: dict = {"weaker": WEAKER.get(bed), "policies": {}, "all_reproduces": {}}
        earlier = ROOT / "benchmarks" / "results" / EARLIER.get(bed, "") / "summaries" / bed
        for seed, run in sorted(base.items()):
            committed = earlier / f"hacpo_{MODE}-s{seed}.json"
            if committed.is_file():
                theirs = json.loads(committed.read_text())["agents"]
                bed_out["all_reproduces"][seed] = all(
                    run["agents"][a]["curve"] == theirs[a]["curve"] for a in run["agents"] if a in theirs
                )
        for policy, by_seed in by_method.items():
            if policy == "all":
                continue
            seeds = sorted(set(by_seed) & set(base))
            entry: dict = {"seeds": seeds}
            for agent in agents:
                final = {s: (by_seed[s]["agents"][agent], base[s]["agents"][agent]) for s in seeds}
                diffs = [100 * (mine["final_accuracy"] - theirs["final_accuracy"]) for mine, theirs in final.values()]
                ci = ev.paired_ci(diffs) if seeds else {}
                verdict = _reading(ci) if len(seeds) >= 2 else None
                ratios = []
                for s in seeds:
                    mine = _median_curve(by_seed[s]["agents"][agent], "time/update")
                    theirs = _median_curve(base[s]["agents"][agent], "time/update")
                    quiet = by_seed[s].get("quiet") is not False and base[s].get("quiet") is not False
                    if mine and theirs and quiet:
                        ratios.append(mine / theirs)
                target = {s: base[s]["agents"][agent]["final_accuracy"] for s in seeds}
                entry[agent] = {
                    "diff": ci,
                    "per_seed": [round(d, 2) for d in diffs],
                    "verdict": verdict,
                    "update_seconds_ratio": ev.paired_ci([r - 1 for r in ratios]) if ratios else {},
                    "steps_to_all_final": {s: _steps_to(by_seed[s]["agents"][agent], target[s]) for s in seeds},
                    "rollouts_to_all_final": {  # pre-registered secondary; `all`'s own first reach beside it
                        s: [_rollouts_to(by_seed[s], agent, target[s]), _rollouts_to(base[s], agent, target[s])]
                        for s in seeds
                    },
                    "kept_share_first_last": {
                        s: [
                            _kept_share(by_seed[s]["agents"][agent], 0.1, False),
                            _kept_share(by_seed[s]["agents"][agent], 0.1, True),
                        ]
                        for s in seeds
                    },  # fmt: skip
                    "late_mean_diff": ev.paired_ci(
                        [
                            100 * (ev.late_mean(by_seed[s]["agents"][agent]) - ev.late_mean(base[s]["agents"][agent]))
                            for s in seeds
                        ]
                    )
                    if seeds
                    else {},  # fmt: skip
                }
            bed_out["policies"][policy] = entry
        result["beds"][bed] = bed_out
    result["answer"] = readme_answer(result)
    (out / "evidence.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "evidence.md").write_text(markdown(result))
    return result


SEEDS = 5
"""Seeds per policy and bed that the pre-registered rule needs before it gives an answer."""
SAVING = -0.20
"""The pre-registered saving for a cheaper equal: update seconds per step at least 20 % below `all`'s."""


def _reading(ci: dict) -> str | None:
    """A paired interval as the pre-registration reads it: above 0 beats, below 0 loses, else level."""
    if not ci or ci.get("lo") is None or ci.get("hi") is None:
        return None
    return "beats" if ci["lo"] > 0 else "loses" if ci["hi"] < 0 else "level"


def readme_answer(result: dict) -> dict:
    """The README's answer to "what should my agents share?" by the rule pre-registered in analysis.md (round 4):
    recommend a policy over `all` only if it beats `all` on one bed (the primary: the bed's weaker agent) and loses
    on neither bed for neither agent; else, if a policy is level with `all` for both agents on both beds and saves at
    least 20 % of update seconds (the mean of `policy / all - 1`) for both agents on both beds, recommend it as the
    cheaper equal; else keep `all`. No answer until every policy has `SEEDS` seeds on both beds."""
    beds = result.get("beds", {})
    policies = sorted(p for p in POLICIES if p != "all")
    seeds = {
        (bed, p): len(beds.get(bed, {}).get("policies", {}).get(p, {}).get("seeds", []))
        for bed in BEDS
        for p in policies
    }
    missing = [f"{bed}/{p} ({n} seeds)" for (bed, p), n in seeds.items() if n < SEEDS]
    if missing:
        return {"status": "incomplete", "missing": missing, "better": [], "cheaper_equal": [], "per_policy": {}}
    per_policy: dict = {}
    for policy in policies:
        readings, savings = {}, {}
        for bed, entry in beds.items():
            p = entry["policies"][policy]
            for agent in (a for a in p if a != "seeds"):
                readings[f"{bed}/{agent}"] = _reading(p[agent]["diff"])
                savings[f"{bed}/{agent}"] = p[agent]["update_seconds_ratio"].get("mean")
        beats = [bed for bed, entry in beds.items() if readings[f"{bed}/{entry['weaker']}"] == "beats"]
        loses = [key for key, r in readings.items() if r == "loses"]
        level_everywhere = all(r == "level" for r in readings.values())
        saves = all(v is not None and v <= SAVING for v in savings.values())
        per_policy[policy] = {"readings": readings, "update_seconds_ratio": savings, "beats_on": beats,
                              "loses_on": loses, "better": bool(beats) and not loses,
                              "cheaper_equal": level_everywhere and saves}  # fmt: skip
    better = [p for p, v in per_policy.items() if v["better"]]
    cheaper = sorted(
        (p for p, v in per_policy.items() if v["cheaper_equal"]),
        key=lambda p: statistics.mean(per_policy[p]["update_seconds_ratio"].values()),
    )
    status = "better" if better else "cheaper_equal" if cheaper else "keep_all"
    primary = [f"{bed}/{entry['weaker']}" for bed, entry in beds.items()]
    return {"status": status, "missing": [], "better": better, "cheaper_equal": cheaper, "primary": primary,
            "per_policy": per_policy}  # fmt: skip


def answer_lines(answer: dict) -> list[str]:
    """The rule's outcome as evidence.md says it."""
    lines = ["", "## The README's answer, by the pre-registered rule", ""]
    if answer["status"] == "incomplete":
        return lines + [f"Not yet: the rule needs {SEEDS} seeds of every policy on both beds; short: "
                        + ", ".join(answer["missing"]) + "."]  # fmt: skip
    if answer["better"]:
        lines.append("Recommended over `all`: " + ", ".join(f"`{p}`" for p in answer["better"])
                     + " (beats `all` on a bed for its weaker agent, loses nowhere).")  # fmt: skip
    elif answer["cheaper_equal"]:
        lines.append("No policy beats `all`. Level with `all` for both agents on both beds and at least 20 % fewer "
                     "update seconds on both, the cheaper equals (largest saving first): "
                     + ", ".join(f"`{p}`" for p in answer["cheaper_equal"]) + ".")  # fmt: skip
    else:
        lines.append("Keep `all`: no policy beats it, and none is a level, 20 %-cheaper equal on both beds.")
    columns = list(next(iter(answer["per_policy"].values()))["readings"])
    header = " | ".join(c + (" *" if c in answer["primary"] else "") for c in columns)
    lines += ["", "Per bed and agent (primary: the bed's weaker agent, marked *): the interval's reading and the "
              "update seconds against `all`:", "",
              f"| policy | {header} | outcome |", "|---" * (2 + len(columns)) + "|"]  # fmt: skip
    for policy, v in answer["per_policy"].items():
        cells = [f"{r or '-'}, {100 * s:+.1f} % s" if s is not None else f"{r or '-'}"
                 for r, s in zip(v["readings"].values(), v["update_seconds_ratio"].values(), strict=True)]  # fmt: skip
        outcome = "better" if v["better"] else "cheaper equal" if v["cheaper_equal"] else "-"
        lines.append(f"| `{policy}` | " + " | ".join(cells) + f" | {outcome} |")
    for policy, v in answer["per_policy"].items():
        secondary = [c for c, r in v["readings"].items() if r == "beats" and c not in answer["primary"]]
        if secondary and not v["better"]:
            lines.append(
                f"\n`{policy}` beats `all` for the stronger agent ({', '.join(secondary)}): a secondary, "
                "which the rule does not read as a win (and, not level there, not as an equal either)."
            )
    return lines


def _fmt(ci: dict, scale: float = 1.0, unit: str = "") -> str:
    if not ci or ci.get("mean") is None:
        return "-"
    if ci.get("lo") is None:
        return f"{scale * ci['mean']:+.1f}{unit} (n={ci.get('n', 1)})"
    return f"{scale * ci['mean']:+.1f}{unit} [{scale * ci['lo']:+.1f}, {scale * ci['hi']:+.1f}] (n={ci['n']})"


def markdown(result: dict) -> str:
    lines = [
        "# Round 4: sharing policies against `all` (HACPO, learner_length)",
        "",
        "Pre-registration: `benchmarks/results/analysis.md`, round 4. Final greedy accuracy, policy - `all`, points, "
        "paired per seed: mean [95 % t interval] (n seeds). Verdicts only for the pre-registered primary (the weaker "
        "agent). Update seconds: median `time/update` per step, policy / `all` - 1, in %, quiet runs only.",
        f"Runs: {result['runs']}.",
    ]
    for bed, entry in result["beds"].items():
        weaker = entry["weaker"]
        lines += ["", f"## Bed `{bed}` (weaker agent: {weaker})", ""]
        repro = entry["all_reproduces"]
        if repro:
            same = [s for s, ok in repro.items() if ok]
            why = (
                ' (why not: analysis.md, "Round 4: analysis", on `all` and the verifier)'
                if len(same) < len(repro)
                else ""
            )
            lines.append(f"`all` reproduces the committed {EARLIER[bed]} run's every evaluation in seeds {same} of "
                         f"{sorted(repro)}{why}.")  # fmt: skip
            lines.append("")
        agents = sorted(a for a in next(iter(entry["policies"].values()), {}) if a not in ("seeds",))
        lines.append("| policy | " + " | ".join(f"{a} (final)" for a in agents) + " | primary verdict | "
                     + " | ".join(f"{a} update s" for a in agents) + " |")  # fmt: skip
        lines.append("|---" * (2 + 2 * len(agents)) + "|")
        for policy, p in entry["policies"].items():
            cells = [_fmt(p[a]["diff"]) for a in agents]
            timing = [_fmt(p[a]["update_seconds_ratio"], 100, " %") for a in agents]
            lines.append(f"| `{policy}` | " + " | ".join(cells) + f" | {p[weaker]['verdict'] or '-'} | "
                         + " | ".join(timing) + " |")  # fmt: skip
        lines += ["", "Kept share of foreign rows, first and last 10 % of steps, per seed:", ""]
        for policy, p in entry["policies"].items():
            for a in agents:
                shares = ", ".join(
                    f"s{s}: {f:.2f}->{last:.2f}" if f is not None and last is not None else f"s{s}: -"
                    for s, (f, last) in p[a]["kept_share_first_last"].items()
                )
                lines.append(f"- `{policy}` {a}: {shares}")
        if "adaptive" in entry["policies"]:
            shares = entry["policies"]["adaptive"][weaker]["kept_share_first_last"].values()
            known = [(f, last) for f, last in shares if f is not None and last is not None]
            fell = sum(last < f for f, last in known)
            lines += ["", f"`adaptive`'s prediction (c), pre-registered: the weaker agent's kept share falls from the "
                          f"first to the last 10 % of steps in at least 4 of 5 seeds: it fell in {fell} of "
                          f"{len(known)}."]  # fmt: skip
        lines += [
            "",
            "Rollouts to `all`'s final accuracy (the agent's rollouts generated until its evaluated accuracy "
            "first reaches that seed's `all` final; `all`'s own first reach in brackets; - never), per seed:",
            "",
        ]
        for policy, p in entry["policies"].items():
            for a in agents:
                reach = ", ".join(
                    f"s{s}: {'-' if mine is None else f'{mine:,}'} ({'-' if theirs is None else f'{theirs:,}'})"
                    for s, (mine, theirs) in p[a]["rollouts_to_all_final"].items()
                )
                lines.append(f"- `{policy}` {a}: {reach}")
        lines += ["", "Sensitivity (mean of the last three evaluations), policy - `all`:", ""]
        for policy, p in entry["policies"].items():
            lines.append(f"- `{policy}`: " + "; ".join(f"{a} {_fmt(p[a]['late_mean_diff'])}" for a in agents))
    if "answer" in result:
        lines += answer_lines(result["answer"])
    return "\n".join(lines) + "\n"


def rerun_busy(grid, ev, beds, seeds, policies) -> list[dict]:
    """Rerun every run whose machine was not quiet (its wall and update seconds are not reported), as round 3 did:
    the rerun must repeat every evaluation bit for bit (same warm-starts, same machine), and only then replaces the
    summary, so that its seconds count. A rerun that does not repeat keeps the first summary and is reported.
    Each rerun is appended to `<out>/reruns.json`."""
    done = []
    for seed in seeds:
        for bed in beds:
            for policy in policies:
                path = grid.summary_path(bed, policy, seed)
                if not path.is_file():
                    continue
                busy = json.loads(path.read_text())
                if busy.get("quiet") is not False:
                    continue
                ev.wait_while_held(grid.out)
                again = grid.run(bed, policy, seed)
                identical = all(
                    again["agents"][a]["curve"] == busy["agents"][a]["curve"]
                    and again["agents"][a].get("final_accuracy") == busy["agents"][a].get("final_accuracy")
                    for a in busy["agents"]
                )
                if identical:
                    ev._write_json(path, again)
                else:
                    print(f"== {bed} {policy} seed {seed}: the rerun did NOT repeat the first run's evaluations; "
                          f"the first summary stays in {path}", flush=True)  # fmt: skip
                record = {
                    "bed": bed, "method": policy, "seed": seed, "identical": identical,
                    "first": {"seconds": busy["seconds"], "others_cpu_seconds": busy.get("others_cpu_seconds")},
                    "rerun": {"seconds": again["seconds"], "quiet": again.get("quiet"),
                              "others_cpu_seconds": again.get("others_cpu_seconds")},
                    "machine": again.get("machine"),
                }  # fmt: skip
                history = grid.out / "reruns.json"
                ev._write_json(history, [*(json.loads(history.read_text()) if history.is_file() else []), record])
                done.append(record)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beds", nargs="+", default=list(BEDS), choices=BEDS)
    parser.add_argument("--methods", nargs="+", default=None, choices=list(POLICIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", help="results directory (default: benchmarks/results/round4)")
    parser.add_argument("--aggregate-only", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny agents, 2 steps: checks the script end to end")
    parser.add_argument("--replay", type=int, metavar="SEED", help="does this machine reproduce SEED's `all` run?")
    parser.add_argument(
        "--rerun-busy", action="store_true", help="rerun the runs whose machine was not quiet (they must repeat)"
    )
    args = parser.parse_args(argv)
    ev = _evidence()
    out = Path(args.out or ROOT / "benchmarks" / "results" / "round4")
    diagnostics = [*ev.DIAGNOSTICS, *SHARING_METRICS]
    grid = ev.Grid(out, smoke=args.smoke, table=methods, diagnostics=diagnostics)
    if not (out / "deltas.json").is_file():
        write_deltas(out)
    if args.replay is not None:
        records = [grid.replay(bed, args.replay, (args.methods or ["all"])[0]) for bed in args.beds]
        return 0 if all(r["identical"] for r in records) else 1
    if args.rerun_busy:
        rerun_busy(grid, ev, args.beds, args.seeds, args.methods or list(POLICIES))
    elif not args.aggregate_only:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        for seed in args.seeds:  # seed-major: a seed's row on one machine
            for bed in args.beds:
                ev.run_seed(grid, bed, seed, args.methods)
    result = aggregate(out, ev)
    print(f"{result['runs']} runs aggregated into {out / 'evidence.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
