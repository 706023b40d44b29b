"""The cost of a step as the number of agents grows (issue 64, 1): N = 2, 4, 8, 16 tiny heterogeneous agents,
per-step sampling / scoring / update seconds under `sharing.policy: all` and with a sharing budget
(`sharing.budget_per_prompt`), the fitted exponent of the update's cost in N, and the driver's peak memory.

    python benchmarks/many_agents.py                       # N = 2 4 8 16, all and budget 8, 4 steps per run
    python benchmarks/many_agents.py --agents 2 4 8 16 32 --budgets 8 16
    python benchmarks/many_agents.py --policies correct learner_fails top_k adaptive   # the other policies too
    python benchmarks/many_agents.py --driver-pool 16 1024 4096   # the driver's memory for one step's pool
    python benchmarks/many_agents.py --cluster 8                  # N = 8 across a two-node local Ray cluster

The agents: random weights (timing needs no training), a character tokenizer, widths cycling through hidden
32 / 48 / 64 agent by agent (so that every N holds about the same mix of sizes and the cost per agent does not
grow with N) and families through llama / qwen2 / qwen3 every three agents (two layers), built into
.cache/many-agents. HACPO, 8 prompts x 8
answers of up to 16 characters per agent, mini-batches of 64, the local backend with one torch thread (the
workers run one after another in the driver's process, so each phase's seconds are the sum over agents: the
total work). Each run is `hacrl train` in its own process under /usr/bin/time (its peak resident memory); steps 2
on, medians. Writes benchmarks/results/many_agents.md and many_agents.json.

`--driver-pool N ANSWERS TOKENS` measures what the driver holds for one step's pool at a size no CPU run reaches
(issue 64, part 4: N = 16 agents x 1,024 answers of 4,096 tokens): N agents' `Sampled` answers of random text at
~4 bytes per token, then the driver's real code on them: `Trainer._learn_calls` (the scored pool and every
learner's call, as the driver computes them) and `Schedule._submit_learns` (the pool put once into an object
store, each learner's call with a reference), with the driver's Python heap measured by tracemalloc and each Ray
call's arguments by their pickled size. Writes benchmarks/results/driver_pool.md and driver_pool.json.

`--cluster N` runs the same agents on Ray across two nodes started on this machine (`benchmarks/ray_cluster.py`:
a head and a second node on loopback, N / 2 logical CPUs each, every agent asking for one, so Ray must use both),
sharing `all`, and reports where each agent ran, the step's phases and the driver's peak memory. Writes
benchmarks/results/many_agents_cluster.md.

`--learning` runs the pre-registered four-agent learning round (issue 64, part 5; analysis.md, "Many-agents round
1"): the `many4` bed of benchmarks/beds.py (the demo's task, four agents of four sizes), (A) `sharing.policy: all`,
(B) `sharing.budget_per_prompt: 8` and (C) GSPO, B and C with the steps that give them A's update seconds (from
`--pilot`, which times a few steps of each arm and proposes them). Writes benchmarks/results/many-learning.md / .json.
"""

from __future__ import annotations

import argparse
import json
import math
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
AGENTS = ROOT / ".cache" / "many-agents"
FAMILIES = ("llama", "qwen2", "qwen3")
WIDTHS = (32, 48, 64)
PROMPTS, GROUP = 8, 8
POOL_RECORD_BYTES = 120
"""What a pooled answer costs the driver besides its text (its record's numbers; `hacrl plan`'s estimate)."""
ALPHABET = "0123456789+-*=() .,:?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\n"


def build_agents(n: int) -> list[Path]:
    from hacrl.tools.testbed.models import char_tokenizer, save_agent, tiny_model

    out = []
    for i in range(n):
        family, hidden = FAMILIES[(i // 3) % 3], WIDTHS[i % 3]  # sizes cycle fastest: every N has the same mix
        path = AGENTS / f"agent{i:02d}-{family}-{hidden}"
        if not (path / "config.json").is_file():
            tokenizer = char_tokenizer(ALPHABET)
            save_agent(tiny_model(family, tokenizer, hidden=hidden, layers=2, heads=4, kv_heads=2, seed=i),
                       tokenizer, path)  # fmt: skip
        out.append(path)
    return out


def write_config(path: Path, agents: list[Path], sharing: dict | None, steps: int) -> Path:
    cfg = {
        "agents": [{"name": p.name.split("-")[0], "model": str(p), "lr": 1e-4} for p in agents],
        "algorithm": {"name": "hacpo"},
        "rollout": {"group_size": GROUP, "max_new_tokens": 16, "max_prompt_tokens": 96},
        "data": {"task": "chain_sum", "task_options": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                       "max_digits": 2}, "train_size": 256, "eval_size": 8},
        "trainer": {"steps": steps, "prompts_per_step": PROMPTS, "mini_batch_size": 64, "micro_batch_size": 64},
        "eval": {"at_start": False, "every": 0, "max_prompts": 1, "save_completions": False},
        "checkpoint": {"every": 0},
        "logging": {"console": False, "tensorboard": False},
        "runtime": {"backend": "local", "torch_threads": 1},
    }  # fmt: skip
    if sharing:
        cfg["sharing"] = sharing
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_once(config: Path, out: Path) -> dict:
    run_dir = out / f"run-{time.time_ns()}"
    report = out / f"time-{time.time_ns()}.txt"
    command = ["/usr/bin/time", "-f", "%M %U %S", "-o", str(report), sys.executable, "-m", "hacrl", "train",
               str(config), f"trainer.output_dir={run_dir}"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    peak_kib, user, system = report.read_text().split()[-3:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in records if r["step"] > 1]
    out = {k: statistics.median(r[f"time/{k}"] for r in rows) for k in ("sampling", "scoring", "update", "step")}
    names = [a for a in {k.split("/")[0] for k in rows[0] if k.endswith("/trained_sequences")}]
    out["trained_rows_per_learner"] = statistics.median(r[f"{a}/trained_sequences"] for r in rows for a in names)
    answers = PROMPTS * GROUP  # each agent's; its character tokenizer makes a token one byte of text
    out["pool_kib"] = statistics.median(sum(answers * r[f"{a}/response_length_mean"] for a in names) for r in rows)
    out["pool_kib"] = (out["pool_kib"] + POOL_RECORD_BYTES * answers * len(names)) / 1024
    out["peak_mib"] = int(peak_kib) / 1024
    out["cpu_s"] = float(user) + float(system)
    return out


def exponent(values: dict[int, float], low: int, high: int) -> float | None:
    """The slope of log(cost) over log(N) between N = low and high (None when either is missing)."""
    if low not in values or high not in values or values[low] <= 0:
        return None
    return math.log(values[high] / values[low]) / math.log(high / low)


class _Transport:
    """Ray's transport as the schedule uses it for the learns: `share` (its object store's `put`) counts the pickled
    bytes of the pool, `submit` those of each call's arguments (what Ray ships)."""

    concurrent, across_machines = True, True

    def __init__(self, n: int) -> None:
        self.names, self.bytes, self.sent = [f"agent{j}" for j in range(n)], 0, []

    def share(self, value):
        import pickle

        self.bytes += len(pickle.dumps(value, protocol=5))
        return "pool-ref"

    def submit(self, agent, role, method, args, what):
        import pickle

        self.sent.append(len(pickle.dumps(args, protocol=5)))


def driver_pool(n: int, answers: int, tokens: int, chars_per_token: int = 4) -> dict:
    """The driver's memory for one step's pool of n agents x `answers` answers of `tokens` tokens (module doc)."""
    import random
    import tracemalloc
    from dataclasses import replace
    from types import SimpleNamespace

    from hacrl.core import get_algorithm
    from hacrl.core.capability import CapabilityTracker
    from hacrl.core.sharing import foreign_of
    from hacrl.driver.scoring import ScoreResult
    from hacrl.driver.trainer import Schedule, Trainer
    from hacrl.inflight import Pending
    from hacrl.messages import Sampled, Trajectory

    tracemalloc.start()
    rng = random.Random(0)
    sampled = []
    for j in range(n):
        texts = [rng.randbytes(tokens * chars_per_token // 2).hex() for _ in range(answers)]  # ASCII, 1 byte/char
        trajectories = [Trajectory(i // 8, t, float("nan"), j, -1.0, tokens, "length", len(t)) for i, t in
                        enumerate(texts)]  # fmt: skip
        sampled.append(Sampled(trajectories, 0.0, 0.0, (0.0, 0.0)))
    scored = [ScoreResult([float(rng.random() < 0.5) for _ in range(answers)]) for _ in range(n)]
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    trainer = SimpleNamespace(names=[f"agent{j}" for j in range(n)], tracker=CapabilityTracker(n, window=5),
                              algorithm=get_algorithm("hacpo"), params=SimpleNamespace(share_rollouts=True),
                              frozen=[False] * n)  # fmt: skip
    pool, _, calls = Trainer._learn_calls(trainer, Pending(1, sampled, scored))
    after_calls, peak_calls = tracemalloc.get_traced_memory()
    store = _Transport(n)
    from hacrl.config import AgentConfig, AlgorithmConfig, RolloutConfig, TrainerConfig
    from hacrl.messages import WorkerSpec

    specs = [WorkerSpec(j, AgentConfig(name=f"agent{j}", model="m"), RolloutConfig(), TrainerConfig(),
                        AlgorithmConfig(name="hacpo"), num_agents=n) for j in range(n)]  # fmt: skip
    Schedule(store, specs)._submit_learns(calls, pool)
    sent = store.sent
    _, peak_ray = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    text = sum(len(t.text.encode()) for s in sampled for t in s.trajectories)
    naive = replace(calls[0], foreign=foreign_of(pool, 0))  # a call carrying the others' answers itself
    one_call = len(__import__("pickle").dumps(naive, protocol=5))
    import resource

    mib = 2**20
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"agents": n, "answers_per_agent": answers, "tokens": tokens, "text_mib": text / mib,
            "sampled_heap_mib": held / mib, "learn_calls_extra_mib": (after_calls - held) / mib,
            "learn_calls_peak_extra_mib": (peak_calls - held) / mib, "ray_peak_extra_mib": (peak_ray - held) / mib,
            "ray_store_mib": store.bytes / mib, "ray_call_args_mib": sum(sent) / mib,
            "naive_ray_mib": n * one_call / mib, "process_peak_rss_mib": peak_rss / mib}  # fmt: skip


def render_driver_pool(r: dict, argv: list[str]) -> str:
    n = r["agents"]
    return "\n".join([
        "# The driver's memory for one step's pool", "",
        f"`python benchmarks/many_agents.py {' '.join(argv)}`: {n} agents x {r['answers_per_agent']:,} answers of "
        f"{r['tokens']:,} tokens (random ASCII text, 4 bytes per token), through the driver's own code "
        "(`Trainer._learn_calls`, `Schedule._submit_learns`); Python heap by tracemalloc, Ray arguments by their "
        "pickled size.", "",
        "| what | MiB |", "|---|---|",
        f"| the answers' text | {r['text_mib']:,.1f} |",
        f"| every agent's `Sampled` (text + trajectory records): what the driver holds for the step | "
        f"{r['sampled_heap_mib']:,.1f} |",
        f"| + the scored pool and the {n} learn calls (local backend), kept | {r['learn_calls_extra_mib']:,.1f} |",
        f"| + the same, peak while building | {r['learn_calls_peak_extra_mib']:,.1f} |",
        f"| + Ray: the pool put into the object store once, driver heap peak | {r['ray_peak_extra_mib']:,.1f} |",
        f"| Ray: bytes put into the object store (one pool) | {r['ray_store_mib']:,.1f} |",
        f"| Ray: the {n} learn calls' own arguments (a reference each) | {r['ray_call_args_mib']:,.2f} |",
        f"| Ray without the shared pool: {n} calls each with the others' answers | {r['naive_ray_mib']:,.1f} |",
        f"| this process's peak resident memory (Python, torch and hacrl imported, all of the above) | "
        f"{r['process_peak_rss_mib']:,.0f} |",
        "",
        "The Ray row's heap peak holds the pool's pickled bytes on the way into the object store (the stub pickles "
        "it as Ray's serializer does before the copy into shared memory): transient, once per step, whatever N. "
        "What grows with N is only each learner's list of references into the pool (8 bytes per foreign answer).",
    ]) + "\n"  # fmt: skip


def cluster(n: int, steps: int) -> dict:
    """N agents across a two-node local Ray cluster (module doc): where each ran, the phases, the driver's peak."""
    import re

    from ray_cluster import rehearse

    scratch = RESULTS / ".runs" / "many-agents"
    scratch.mkdir(parents=True, exist_ok=True)
    config = write_config(scratch / f"cluster-n{n}.yaml", build_agents(n), None, steps)
    run_dir, report, lines = scratch / f"cluster-{time.time_ns()}", scratch / f"time-{time.time_ns()}.txt", []
    prefix = ["/usr/bin/time", "-f", "%M %U %S", "-o", str(report)]
    overrides = [f"trainer.output_dir={run_dir}"]
    code = rehearse(str(config), overrides, log=lines.append, cpus_per_node=n // 2, train_prefix=prefix)
    output = "\n".join(lines)
    if code != 0:
        raise SystemExit(f"the cluster run failed ({code}):\n{output[-4000:]}")
    placed = list(dict(re.findall(r"(agent\d+) on node (\w+)", output)).items())  # the line may show twice
    nodes = sorted({node for _, node in placed})
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in records if r["step"] > 1]
    phase = {k: statistics.median(r[f"time/{k}"] for r in rows) for k in ("sampling", "scoring", "update", "step")}
    peak_kib = int(report.read_text().split()[-3])
    if len(nodes) != 2 or len(placed) != n:
        raise SystemExit(f"expected {n} agents over 2 nodes, found {placed}:\n{output[-3000:]}")
    per_node = {node: [a for a, x in placed if x == node] for node in nodes}
    return {"agents": n, "steps": steps, "per_node": per_node, **phase, "driver_peak_mib": peak_kib / 1024}


def render_cluster(runs: list[dict], argv: list[str]) -> str:
    lines = ["# N agents across a two-node Ray cluster", "",
             f"`python benchmarks/many_agents.py {' '.join(argv)}`: two Ray nodes on this machine (loopback, N / 2 "
             "logical CPUs each, 2 real cores in all), N agents of `many_agents.py` asking one CPU each, HACPO with "
             "sharing `all`, 8 prompts x 8 answers per agent. Steps 2 on, medians; the driver's peak memory is the "
             "`hacrl train` process's (/usr/bin/time): the agents run in Ray's worker processes, the pool reaches "
             "them through the object store once per step.", "",
             "| N | agents per node | sampling s | scoring s | update s | step s | driver peak MiB |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        split = " / ".join(str(len(a)) for a in r["per_node"].values())
        lines.append(f"| {r['agents']} | {split} | {r['sampling']:.2f} | {r['scoring']:.2f} | {r['update']:.2f} | "
                     f"{r['step']:.2f} | {r['driver_peak_mib']:.0f} |")  # fmt: skip
    lines += ["", "Where each agent ran:", ""]
    for r in runs:
        lines += [
            f"- N = {r['agents']}: " + "; ".join(f"node {node}: {', '.join(a)}" for node, a in r["per_node"].items())
        ]
    return "\n".join(lines) + "\n"


LEARNING_ARMS = {"A": ["sharing.policy=all"], "B": ["sharing.budget_per_prompt=8"], "C": ["algorithm.name=gspo"]}
LEARNING_STEPS = {"A": 40, "B": 83, "C": 154}
"""From the pilot before the round ran (analysis.md, "Many-agents round 1"): B and C at A's update seconds (update
seconds per step on this machine, one torch thread: A 7.89, B 3.79, C 2.04; 40 x 7.89 / 3.79 = 83, / 2.04 = 154)."""
LEARNING_BASE = ["data.eval_size=1280", "eval.every=0", "eval.at_start=false", "checkpoint.every=0",
                 "logging.console=false", "logging.tensorboard=false", "runtime.torch_threads=1"]  # fmt: skip


def many4_config(scratch: Path) -> tuple[Path, list[str]]:
    """configs/demo.yaml with the many4 bed's four agents (built once into .cache/bench-agents/many4)."""
    from beds import MANY4

    from hacrl.tools.testbed.demo import bootstrap

    out = ROOT / ".cache" / "bench-agents" / "many4"
    bootstrap(out, MANY4)
    cfg = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    cfg["agents"] = [{"name": a.name, "model": str(out / a.name), "lr": 3.0e-5} for a in MANY4.agents]
    path = scratch / "many4.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, [a.name for a in MANY4.agents]


def learning_run(config: Path, settings: list[str], names: list[str], scratch: Path) -> dict:
    run_dir = scratch / f"run-{time.time_ns()}"
    command = [sys.executable, "-m", "hacrl", "train", str(config), f"trainer.output_dir={run_dir}", *settings]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "time/update" in r]
    row = {"update_s": sum(r["time/update"] for r in steps), "train_s": sum(r["time/step"] for r in steps),
           "update_s_per_step": statistics.median(r["time/update"] for r in steps[1:] or steps),
           "rows_per_learner": statistics.mean(r[f"{a}/trained_sequences"] for r in steps for a in names)}  # fmt: skip
    if "eval/" + names[0] + "/pass@1" in records[-1]:
        row.update({f"{a}/pass@1": records[-1][f"eval/{a}/pass@1"] for a in names})
    return row


def pilot(steps: int) -> dict:
    """A few steps of each arm without evaluation: update seconds per step (median of steps 2 on), and the steps of
    B and C that give them A's update seconds over A's 40."""
    scratch = RESULTS / ".runs" / "many-learning-pilot"
    scratch.mkdir(parents=True, exist_ok=True)
    config, names = many4_config(scratch)
    timing = {}
    for arm, overrides in LEARNING_ARMS.items():
        settings = [*LEARNING_BASE, "eval.max_prompts=1", f"trainer.steps={steps}", *overrides]
        timing[arm] = learning_run(config, settings, names, scratch)
        print(arm, json.dumps(timing[arm]), flush=True)
    per_step = {arm: t["update_s_per_step"] for arm, t in timing.items()}
    proposed = {arm: round(LEARNING_STEPS["A"] * per_step["A"] / per_step[arm]) for arm in LEARNING_ARMS}
    return {"steps": steps, "timing": timing, "proposed_steps": proposed}


def learning(seeds: range) -> dict:
    """The round: each seed's three arms (order rotated by seed), every agent's final greedy pass@1; with no seeds,
    the runs already in the log (`--seeds` with no value: two processes' seeds together)."""
    scratch = RESULTS / ".runs" / "many-learning"
    scratch.mkdir(parents=True, exist_ok=True)
    config, names = many4_config(scratch)
    log = scratch / "runs.jsonl"  # every finished run, so that seeds can run in two processes and a stop loses none
    for seed in seeds:
        order = ["A", "B", "C"][seed % 3 :] + ["A", "B", "C"][: seed % 3]
        for arm in order:
            settings = [*LEARNING_BASE, f"trainer.steps={LEARNING_STEPS[arm]}", f"trainer.seed={seed}",
                        *LEARNING_ARMS[arm]]  # fmt: skip
            row = {"seed": seed, "arm": arm, "steps": LEARNING_STEPS[arm],
                   **learning_run(config, settings, names, scratch)}  # fmt: skip
            with log.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    runs = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    start = json.loads((ROOT / ".cache" / "bench-agents" / "many4" / "bootstrap.json").read_text())
    warm = {a: report.get("eval_pass@1") for a, report in start["agents"].items()}
    return {"runs": runs, "agents": names, "warm_start": warm}


def paired(runs: list[dict], agent: str, arm: str, base: str) -> str | None:
    """`arm - base` on `agent`'s final pass@1, paired by seed, with the pre-registered rule."""
    value = {(r["seed"], r["arm"]): r[f"{agent}/pass@1"] for r in runs}
    seeds = sorted({s for s, _ in value})
    diffs = [value[(s, arm)] - value[(s, base)] for s in seeds if (s, arm) in value and (s, base) in value]
    if len(diffs) < 2:
        return None
    mean, se = statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5
    low, high = mean - 2 * se, mean + 2 * se
    verdict = ("equivalent within +-2 points" if low > -0.02 and high < 0.02 else
               "better" if low > 0 else "worse" if high < 0 else "inconclusive")  # fmt: skip
    return (f"{agent}: {arm} - {base} = {100 * mean:+.1f} points (standard error {100 * se:.1f}, {len(diffs)} seeds; "
            f"mean +- 2 SE [{100 * low:+.1f}, {100 * high:+.1f}]): {verdict}")  # fmt: skip


def render_learning(result: dict) -> str:
    names, runs = result["agents"], result["runs"]
    lines = ["# Many-agents round 1: four agents, a sharing budget against `all` and GSPO at equal update seconds", "",
             "Pre-registered in `benchmarks/results/analysis.md` (Many-agents round 1). "
             f"`python benchmarks/many_agents.py --learning`. (A) `all`, {LEARNING_STEPS['A']} steps; "
             f"(B) `budget_per_prompt: 8`, {LEARNING_STEPS['B']} steps; (C) GSPO, {LEARNING_STEPS['C']} steps (B and C "
             "at A's update seconds, from the pilot).", "",
             "Warm-start greedy pass@1 (bootstrap.json): "
             + ", ".join(f"{a} {100 * v:.1f} %" for a, v in result["warm_start"].items()), "",
             "| seed | arm | steps | update s | training s | rows per learner and step | "
             + " | ".join(f"{a} pass@1" for a in names) + " |", "|---" * (6 + len(names)) + "|"]  # fmt: skip
    for r in sorted(runs, key=lambda r: (r["seed"], r["arm"])):
        lines.append(f"| {r['seed']} | {r['arm']} | {r['steps']} | {r['update_s']:.0f} | {r['train_s']:.0f} | "
                     f"{r['rows_per_learner']:.0f} | " + " | ".join(f"{100 * r[f'{a}/pass@1']:.1f} %" for a in names)
                     + " |")  # fmt: skip
    lines.append("")
    for agent in names:
        for arm, base in (("B", "A"), ("B", "C"), ("A", "C")):
            line = paired(runs, agent, arm, base)
            if line:
                lines.append(f"- {line}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--budgets", type=int, nargs="*", default=[8], help="sharing.budget_per_prompt values")
    parser.add_argument("--name", default="many_agents", help="the cost curve's result files: NAME.md / NAME.json")
    parser.add_argument("--policies", nargs="*", default=[], choices=["correct", "learner_fails", "top_k", "adaptive"],
                        help="sharing policies to time besides `all` (with their default settings)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--driver-pool", type=int, nargs=3, metavar=("N", "ANSWERS", "TOKENS"),
                        help="measure the driver's memory for one step's pool of this size instead")  # fmt: skip
    parser.add_argument("--cluster", type=int, nargs="+", metavar="N",
                        help="N agents across a two-node local Ray cluster (each N in turn)")  # fmt: skip
    parser.add_argument("--learning", action="store_true", help="many-agents round 1 (pre-registered in analysis.md)")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4],
                        help="--learning's trainer seeds (none: render the runs logged so far)")  # fmt: skip
    parser.add_argument("--pilot", type=int, metavar="STEPS", help="time STEPS steps of each arm of --learning")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    if args.pilot:
        result = pilot(args.pilot)
        (RESULTS / "many-learning-pilot.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["proposed_steps"]))
        return 0
    if args.learning:
        result = learning(args.seeds)
        (RESULTS / "many-learning.json").write_text(json.dumps(result, indent=1) + "\n")
        text = render_learning(result)
        (RESULTS / "many-learning.md").write_text(text)
        print(text)
        return 0
    if args.cluster:
        runs = [cluster(n, args.steps) for n in args.cluster]
        (RESULTS / "many_agents_cluster.json").write_text(json.dumps(runs, indent=1) + "\n")
        text = render_cluster(runs, argv if argv is not None else sys.argv[1:])
        (RESULTS / "many_agents_cluster.md").write_text(text)
        print(text)
        return 0
    if args.driver_pool:
        result = driver_pool(*args.driver_pool)
        (RESULTS / "driver_pool.json").write_text(json.dumps(result, indent=1) + "\n")
        text = render_driver_pool(result, argv if argv is not None else sys.argv[1:])
        (RESULTS / "driver_pool.md").write_text(text)
        print(text)
        return 0
    scratch = RESULTS / ".runs" / "many-agents"
    scratch.mkdir(parents=True, exist_ok=True)
    agents = build_agents(max(args.agents))
    variants = {"all": None, **{f"budget {b}": {"budget_per_prompt": b} for b in args.budgets},
                **{p: {"policy": p} for p in args.policies}}  # fmt: skip
    table: dict[str, dict[int, dict]] = {v: {} for v in variants}
    for n in args.agents:
        for label, sharing in variants.items():
            row = run_once(write_config(scratch / f"n{n}.yaml", agents[:n], sharing, args.steps), scratch)
            table[label][n] = row
            rows = row["trained_rows_per_learner"]
            print(f"N = {n:2d} {label:>9}: update {row['update']:.2f} s, sampling {row['sampling']:.2f} s, "
                  f"{rows:.0f} rows per learner, peak {row['peak_mib']:.0f} MiB", flush=True)  # fmt: skip
    slopes = {v: exponent({n: r["update"] for n, r in table[v].items()}, 4, 16) for v in variants}
    import torch

    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    result = {"machine": machine, "args": vars(args), "table": table, "update_exponent_4_16": slopes}
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = render(result, argv if argv is not None else sys.argv[1:])
    (RESULTS / f"{args.name}.md").write_text(text)
    print(text)
    return 0


def render(result: dict, argv: list[str]) -> str:
    lines = ["# Many agents: a step's cost as N grows, with and without a sharing budget", "",
             f"Machine: {result['machine']}. Command: `python benchmarks/many_agents.py {' '.join(argv)}`. Tiny random "
             "agents (llama / qwen2 / qwen3, hidden 32-64), HACPO, 8 prompts x 8 answers each, the local backend with "
             "one torch thread: a phase's seconds are the sum over agents. Medians of steps 2 on. Pool: the step's "
             f"answers' text (character tokenizers: a byte a token) plus {POOL_RECORD_BYTES} bytes of record each. "
             "Random agents score 0 on every answer, so the policies that read rewards sit at their extremes here: "
             "`correct` and `adaptive` keep no foreign row (GSPO's cost), `learner_fails` keeps every one (`all`'s); "
             "`top_k` keeps k = 4 a prompt after a no-grad forward over every foreign row.", "",
             "| sharing | N | sampling s | scoring s | update s | rows trained per learner | step s | CPU s (run) | "
             "peak MiB | pool KiB |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, rows in result["table"].items():
        for n, r in sorted(rows.items(), key=lambda kv: int(kv[0])):
            pool = f"{r['pool_kib']:.0f}" if "pool_kib" in r else "-"
            lines.append(f"| {label} | {n} | {r['sampling']:.2f} | {r['scoring']:.2f} | {r['update']:.2f} | "
                         f"{r['trained_rows_per_learner']:.0f} | {r['step']:.2f} | {r['cpu_s']:.0f} | "
                         f"{r['peak_mib']:.0f} | {pool} |")  # fmt: skip
    lines.append("")
    for label, slope in result["update_exponent_4_16"].items():
        if slope is not None:
            lines.append(f"Update seconds ~ N^{slope:.2f} between N = 4 and 16 with `{label}`.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
