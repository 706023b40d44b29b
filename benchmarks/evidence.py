"""Learning benchmark, round 2: two test beds, three foreign-ratio modes, seeds that vary the warm-start.

The design, methods, seeds, steps and primary metric are pre-registered in `benchmarks/results/analysis.md`
("Round 2") and were written before any grid run; this script runs exactly that.

- Beds (`benchmarks/configs/<bed>_bed.yaml`): `demo` (both agents warm-started on additions) and `complement`
  (additions and subtractions; the Llama warm-started mostly on additions, the Qwen2 mostly on subtractions).
- Seed i bootstraps its own agents (`hacrl.tools.testbed.demo.with_seed`: each agent's initialisation and warm-start
  order move with i, the task data do not) AND seeds RL sampling and prompt order (`trainer.seed = i`).
- Methods: `hacpo_<mode>` for each `algorithm.foreign_ratio` mode, `gspo`, `gspo_x2` (twice G: as many sequences
  per step as a HACPO learner, twice the rollouts), `naive`; on `complement` also the five HACPO ablations under
  the pre-registered mode. Each HACPO mode runs with the delta its ratio distribution gives (`--calibrate`).

Every (bed, method, seed) run leaves `benchmarks/results/round2/summaries/<bed>/<method>-s<seed>.json` (committed,
with the machine it ran on); a run whose summary exists is skipped, so the grid runs in parts and on several
machines (one seed's whole row on one machine: differences are only taken within a seed).

    python benchmarks/evidence.py --calibrate                 # the deltas, from 10-step ratio distributions (once)
    python benchmarks/evidence.py --beds complement --seeds 0 # one seed of one bed (~1 h on 2 cores)
    python benchmarks/evidence.py                             # everything that is missing (about 9 h on 2 cores)
    python benchmarks/evidence.py --aggregate-only            # rebuild evidence.md / .json / .png
    python benchmarks/evidence.py --smoke --out /tmp/e        # seconds: tiny agents, 2 steps (the tests run it)
    python benchmarks/evidence.py --beds gap --replay 3       # does this machine reproduce seed 3? (~8 min)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEDS = {"demo": "demo", "complement": "complement", "gap": "gap"}  # bed -> bootstrap recipe
SMOKE_RECIPES = {"demo": "tiny", "complement": "tiny_complement", "gap": "tiny_gap"}
ROUND3_BEDS = ("gap",)
"""Round 3's beds (results in benchmarks/results/round3): one ratio mode (ABLATION_MODE), the five ablations, and
the frozen-teacher arm."""
STRONG = {"gap": "llama-char"}
"""The stronger agent of a round-3 bed (its warm-start budget made it 2-3x as accurate; analysis.md, round 3): the
frozen-teacher arm freezes it and trains the other with HACPO."""
MODES = ["source_mean", "learner_length", "bytes"]
ABLATION_MODE = "learner_length"  # pre-registered: the paper's gradient, without the tokenizers' granularity
ABLATIONS = {
    "no_capability_baseline": ["algorithm.capability_baseline=false"],
    "no_rho": ["algorithm.capability_coef=false"],
    "alpha0": ["algorithm.alpha=0"],
    "static_clip": ["algorithm.delta_step=0"],
    "no_foreign_clip": ["algorithm.foreign_clip=false"],
}
SEEDS = [0, 1, 2, 3, 4]
PRIMARY = ("complement", f"hacpo_{ABLATION_MODE}", "gspo_x2")
"""The pre-registered primary comparison: (bed, method, baseline), final accuracy, paired over the seeds."""
GOAL_POINTS = 3.0
"""The project's goal on the primary comparison: at least this many points for every agent, interval above zero."""
SPECIALTY = {"complement": {"llama-char": "+", "qwen-bpe": "-"}}
"""Each agent's own sub-skill on a bed (its warm-start's majority); the other one is its partner's."""
CALIBRATION_STEPS = 10
DIAGNOSTICS = [
    "capability",
    "own_clip_frac",
    "foreign_clip_frac",
    "foreign_below_frac",
    "foreign_above_frac",
    "foreign_ratio_mean",
    "foreign_ratio_p10",
    "foreign_ratio_p50",
    "foreign_ratio_p90",
    "foreign_lower_bound",
]
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
"""Two-sided 95 % quantiles of Student's t by degrees of freedom."""


def methods(bed: str) -> dict[str, list[str]]:
    """Method name -> config overrides (`@delta:<mode>` and `@double_group` are resolved per run)."""
    modes = [ABLATION_MODE] if bed in ROUND3_BEDS else MODES
    out = {f"hacpo_{mode}": [f"algorithm.foreign_ratio={mode}", f"@delta:{mode}"] for mode in modes}
    out |= {"gspo": ["algorithm.name=gspo"], "gspo_x2": ["algorithm.name=gspo", "@double_group"]}
    out["naive"] = ["algorithm.name=naive"]
    if bed in ROUND3_BEDS:
        out["frozen_teacher"] = [*out[f"hacpo_{ABLATION_MODE}"], f"@frozen:{STRONG[bed]}"]
    if bed in ("complement", *ROUND3_BEDS):
        for name, overrides in ABLATIONS.items():
            out[f"hacpo_{ABLATION_MODE}_{name}"] = [
                f"algorithm.foreign_ratio={ABLATION_MODE}",
                f"@delta:{ABLATION_MODE}",
                *overrides,
            ]
    return out


# Differences added after a grid had run, labelled "not pre-registered" wherever they are shown: the paper's claim 3
# (naive sharing is worse than plain GSPO), which rounds 2 and 3 had listed only as means.
POST_HOC_PAIRS = [("naive", "gspo")]


def comparison_pairs(bed: str) -> list[tuple[str, str]]:
    """The pre-registered differences (a - b): each HACPO mode against GSPO, GSPOx2 and naive sharing; the
    tokenizer-neutral modes against the paper's; the full method against each ablation (the mechanism's effect)."""
    if bed in ROUND3_BEDS:
        method = f"hacpo_{ABLATION_MODE}"
        pairs = [(method, base) for base in ("gspo", "gspo_x2", "naive", "frozen_teacher")]
        pairs += [("frozen_teacher", base) for base in ("gspo", "gspo_x2")]
        return pairs + [(method, f"{method}_{name}") for name in ABLATIONS]
    pairs = [(f"hacpo_{mode}", base) for mode in MODES for base in ("gspo", "gspo_x2", "naive")]
    pairs += [(f"hacpo_{mode}", "hacpo_source_mean") for mode in MODES if mode != "source_mean"]
    if bed == "complement":
        pairs += [(f"hacpo_{ABLATION_MODE}", f"hacpo_{ABLATION_MODE}_{name}") for name in ABLATIONS]
    return pairs


def delta_rule(p10_by_learner: dict[str, float]) -> float:
    """The pre-registered rule: the foreign lower bound 1 - delta at or below every learner's 10th percentile of the
    foreign ratio (so at least 90 % of foreign rows start inside or above the window), delta rounded up to 0.05 and
    kept within [0.2 (the paper's), 0.9].

    >>> delta_rule({"a": 0.93, "b": 0.71})
    0.3
    >>> delta_rule({"a": 0.99})
    0.2
    >>> delta_rule({"a": 0.02})
    0.9
    """
    raw = 1.0 - min(p10_by_learner.values())
    return round(min(0.9, max(0.2, math.ceil(round(raw / 0.05, 9)) * 0.05)), 2)


def machine() -> dict:
    """Where a run ran: differences are only ever taken within a seed, and a seed's row runs on one machine (or, when
    that machine is gone, on one that `Grid.replay` found to reproduce it bit for bit). The library versions are
    recorded because a warm-start's 600-odd optimizer steps amplify any change in their arithmetic: round 4 found
    round 2's demo warm-starts not reproduced by the same code (analysis.md, round 4's status), and round 2 had
    recorded only torch's version."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    libraries = {}
    for name in ("transformers", "tokenizers", "numpy", "safetensors", "reasoning-gym"):
        try:
            libraries[name] = version(name)
        except PackageNotFoundError:
            libraries[name] = None

    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return {
        "node": platform.node(),
        "cpu": fields.get("model name") or platform.processor(),
        # "AMD EPYC" names several generations: the family / model / stepping and the SIMD level torch dispatches
        # its CPU kernels to tell them apart (an AVX2 and an AVX-512 machine round differently)
        "cpu_id": "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping")),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "libraries": libraries,
        "boot_id": _boot_id(),  # node and CPU name are the same on every machine of this kind; the boot is not
    }


QUIET_SHARE = 0.05
"""A run was quiet when the rest of the machine used less than this share of its cores during it (other processes'
CPU time over wall time x cores): only quiet runs' wall times are reported (round 3's rule; accuracies and rollouts
do not depend on load)."""


def machine_busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: all but idle, iowait and steal); None
    where there is no /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in (fields[1:9] + ["0"] * 8)[:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds of a process and all its live descendants (the trainer's scoring worker is a process of its
    own), each with its waited-for children's (/proc/<pid>/stat: utime, stime, cutime, cstime); this process's
    own process time where there is no /proc."""
    pid = os.getpid() if pid is None else pid
    tick = os.sysconf("SC_CLK_TCK")
    times, parents = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except (OSError, IndexError):
            continue  # a process that ended meanwhile
        parents[int(stat.parent.name)] = int(fields[1])
        times[int(stat.parent.name)] = sum(int(v) for v in fields[11:15]) / tick
    if pid not in times:
        return time.process_time()
    tree, grown = {pid}, True
    while grown:
        grown = False
        for child, parent in parents.items():
            if parent in tree and child not in tree:
                tree.add(child)
                grown = True
    return sum(times[member] for member in tree)


class Load:
    """The CPU time one run used and the time the rest of the machine used meanwhile: `machine_seconds` (the run's
    process tree, all threads, its scoring worker included: what the run costs whatever else runs) and `quiet`
    (QUIET_SHARE)."""

    def __init__(self):
        self.wall, self.process, self.busy = time.perf_counter(), tree_cpu_seconds(), machine_busy_seconds()

    def result(self) -> dict:
        wall = time.perf_counter() - self.wall
        process = tree_cpu_seconds() - self.process
        busy = machine_busy_seconds()
        if busy is None or self.busy is None:
            return {"machine_seconds": process, "others_cpu_seconds": None, "quiet": None}
        others = max(0.0, busy - self.busy - process)
        share = others / (wall * (os.cpu_count() or 1)) if wall > 0 else 0.0
        return {"machine_seconds": process, "others_cpu_seconds": others, "quiet": share < QUIET_SHARE}


class Grid:
    def __init__(self, out: Path, smoke: bool = False, extra: list[str] = (), table=None, diagnostics=None):
        """`table`: bed -> {method: overrides} (default `methods`, rounds 2 and 3; round 4 passes its own);
        `diagnostics`: the per-step metrics each summary keeps (default `DIAGNOSTICS`)."""
        self.out, self.smoke, self.extra = out, smoke, list(extra)
        self.methods = table or methods
        self.diagnostics = diagnostics or DIAGNOSTICS
        self.agents_root = out / ".agents" if smoke else ROOT / ".cache" / "bench-agents"

    # -- set-up --------------------------------------------------------------------------------------------------
    def agents(self, bed: str, seed: int) -> Path:
        from hacrl.tools.testbed.demo import bootstrap, with_seed

        recipe = _round1().beds().recipes()[(SMOKE_RECIPES if self.smoke else BEDS)[bed]]
        directory = self.agents_root / f"{bed}-s{seed}"
        bootstrap(directory, with_seed(recipe, seed), parallel=1 if self.smoke else None)
        return directory

    def overrides(self, bed: str, seed: int) -> list[str]:
        agents = self.agents(bed, seed)
        base = [f"agents.0.model={agents / 'llama-char'}", f"agents.1.model={agents / 'qwen-bpe'}"]
        if (agents / "data" / "train.jsonl").is_file():  # a generated task (complement): the seed's copy of it
            base += [
                f"data.train_file={agents / 'data' / 'train.jsonl'}",
                f"data.eval_file={agents / 'data' / 'eval.jsonl'}",
            ]
        if self.smoke:
            base += [
                "trainer.steps=2",
                "trainer.prompts_per_step=4",
                "trainer.mini_batch_size=8",
                "trainer.micro_batch_size=8",
                "trainer.logprob_batch_size=16",
                "rollout.group_size=4",
                "data.train_size=500",
                "data.eval_size=32",
                "eval.every=1",
                "logging.tensorboard=false",
            ]
        return [*base, *self.extra]

    def config_path(self, bed: str) -> Path:
        return ROOT / "benchmarks" / "configs" / f"{bed}_bed.yaml"

    # -- deltas --------------------------------------------------------------------------------------------------
    def deltas_path(self) -> Path:
        return self.out / "deltas.json"

    def calibrate(self, beds: list[str]) -> dict:
        """For each bed and ratio mode: a short HACPO run on seed 0's agents (accuracy is never looked at), the
        learners' 10th percentiles of the foreign ratio over its steps (median over steps), and the delta the
        pre-registered rule gives."""
        from hacrl.config import load_config
        from hacrl.driver.metrics import agent_values
        from hacrl.driver.trainer import Trainer

        path = self.deltas_path()
        table = json.loads(path.read_text()) if path.is_file() else {}
        for bed in beds:
            for mode in MODES:
                if mode in table.get(bed, {}):
                    print(f"== calibration {bed} {mode}: cached in {path}", flush=True)
                    continue
                work = self.out / ".runs" / "calibration" / f"{bed}-{mode}"
                shutil.rmtree(work, ignore_errors=True)
                steps = 2 if self.smoke else CALIBRATION_STEPS
                config = load_config(
                    self.config_path(bed),
                    [
                        *self.overrides(bed, 0),
                        f"algorithm.foreign_ratio={mode}",
                        f"trainer.steps={steps}",
                        "trainer.seed=0",
                        f"trainer.output_dir={work}",
                        "eval.every=0",
                        "eval.at_start=false",
                        "eval.max_prompts=8",
                    ],
                )
                print(f"== calibration {bed} {mode}: {steps} HACPO steps", flush=True)
                Trainer(config).train()
                records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
                p10 = {
                    a.name: statistics.median(v for _, v in agent_values(records, a.name, "foreign_ratio_p10"))
                    for a in config.agents
                }
                table.setdefault(bed, {})[mode] = {"p10": p10, "delta": delta_rule(p10), "steps": steps}
                _write_json(path, table)
        return table

    def delta(self, bed: str, mode: str) -> float:
        table = json.loads(self.deltas_path().read_text()) if self.deltas_path().is_file() else {}
        if mode not in table.get(bed, {}):
            raise SystemExit(f"no delta for bed {bed!r}, mode {mode!r}: run `benchmarks/evidence.py --calibrate` first")
        return table[bed][mode]["delta"]

    # -- runs ----------------------------------------------------------------------------------------------------
    def summary_path(self, bed: str, method: str, seed: int) -> Path:
        return self.out / "summaries" / bed / f"{method}-s{seed}.json"

    def run(self, bed: str, method: str, seed: int, work: Path | None = None, extra: tuple[str, ...] = ()) -> dict:
        """Train one (bed, method, seed) through the real trainer; its summary. `work`: the run directory (default
        `<out>/.runs/<bed>/<method>-s<seed>`); `extra`: overrides applied last (the replay's shorter run)."""
        from hacrl.config import load_config
        from hacrl.driver.trainer import Trainer

        work = work or self.out / ".runs" / bed / f"{method}-s{seed}"
        shutil.rmtree(work, ignore_errors=True)  # an interrupted run restarts: its summary was never written
        common = self.overrides(bed, seed)  # bootstraps the seed's agents (cached after the first run)
        base = load_config(self.config_path(bed), common)
        overrides = []
        for item in self.methods(bed)[method]:
            if item.startswith("@delta:"):
                overrides.append(f"algorithm.delta={self.delta(bed, item.split(':', 1)[1])}")
            elif item == "@double_group":
                overrides.append(f"rollout.group_size={2 * base.rollout.group_size}")
            elif item.startswith("@frozen:"):
                name = item.split(":", 1)[1]
                index = next(i for i, a in enumerate(base.agents) if a.name == name)
                overrides.append(f"agents.{index}.frozen=true")
            else:
                overrides.append(item)
        config = load_config(
            self.config_path(bed),
            [*common, *overrides, f"trainer.seed={seed}", f"trainer.output_dir={work}", *extra],
        )
        wait_while_held(self.out)  # again: building a seed's warm-starts takes minutes, and a hold may come meanwhile
        print(f"== {bed} {method} seed {seed}: {config.trainer.steps} steps", flush=True)
        start, load = time.perf_counter(), Load()
        Trainer(config).train()
        seconds = time.perf_counter() - start
        summary = {
            "bed": bed,
            "method": method,
            "seed": seed,
            "steps": config.trainer.steps,
            "seconds": seconds,
            **load.result(),
            "overrides": overrides,
            "machine": machine(),
            "agents": summarize(work, config, self.diagnostics),
        }
        shutil.rmtree(work / "checkpoints", ignore_errors=True)
        return summary

    def replay(self, bed: str, seed: int, method: str | None = None, steps: int = 3) -> dict:
        """Whether this machine reproduces a committed run bit for bit: rebuild (or reuse) the seed's warm-starts,
        train `method` (default: the bed's HACPO) for `steps` steps, and compare with its committed summary every
        agent's step-0 accuracy, overall and per sub-skill, and every per-step diagnostic of those steps (the
        capability, clip fractions, foreign-ratio quantiles). A seed's row is meant to run on one machine; when
        the machine that ran part of it is gone (a new session gets a new one), the rest may run elsewhere only
        after this says `identical`. Each check is appended to `<out>/replays/<bed>-s<seed>.json`."""
        method = method or f"hacpo_{ABLATION_MODE if bed in ROUND3_BEDS else MODES[0]}"
        path = self.summary_path(bed, method, seed)
        if not path.is_file():
            raise SystemExit(f"no committed run to replay: {path} is missing (run that seed's {method} first)")
        reference = json.loads(path.read_text())
        if steps < 1 or steps > reference["steps"]:
            raise SystemExit(f"--replay-steps must be between 1 and the run's {reference['steps']} steps, not {steps}")
        work = self.out / ".runs" / "replay" / f"{bed}-{method}-s{seed}"
        print(f"== replay {bed} {method} seed {seed}: {steps} steps against {path}", flush=True)
        mine = self.run(bed, method, seed, work=work, extra=(f"trainer.steps={steps}", "eval.every=0"))
        shutil.rmtree(work, ignore_errors=True)
        differences, compared = replay_differences(reference, mine, steps)
        record = {
            "bed": bed,
            "method": method,
            "seed": seed,
            "steps": steps,
            "identical": not differences,
            "differences": differences,
            "compared": compared,
            "machine": machine(),
            "reference_machine": reference["machine"],
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        history = self.out / "replays" / f"{bed}-s{seed}.json"
        _write_json(history, [*(json.loads(history.read_text()) if history.is_file() else []), record])
        return record


def replay_differences(reference: dict, mine: dict, steps: int) -> tuple[list[str], int]:
    """What a replay of `steps` steps (`mine`, a summary) computed differently from the committed run
    (`reference`), and how many committed values it compared: exact comparisons of floats, since the claim
    is bit for bit.

    >>> ref = {"agents": {"a": {"initial_accuracy": 0.5, "skill_curves": {"+": [[0, 0.4], [25, 0.6]]},
    ...        "diagnostic_curves": {"capability": [[1, 0.25], [2, 0.5], [3, 0.75]]}}}}
    >>> replay_differences(ref, ref, 2)
    ([], 4)
    >>> other = json.loads(json.dumps(ref)); other["agents"]["a"]["diagnostic_curves"]["capability"][1][1] = 0.5000001
    >>> replay_differences(ref, other, 2)
    (['a capability at step 2: 0.5 committed, 0.5000001 here'], 4)
    >>> replay_differences(ref, other, 1)
    ([], 3)
    >>> replay_differences(ref, {"agents": {}}, 1)
    (['a step-0 accuracy: 0.5 committed, None here', "a step-0 accuracy on '+': 0.4 committed, None here", \
'a capability at step 1: 0.25 committed, None here'], 3)
    """
    committed, here = _replay_values(reference, steps), _replay_values(mine, steps)
    differences = [f"{k}: {v} committed, {here.get(k)} here" for k, v in committed.items() if here.get(k) != v]
    return differences, len(committed)


def _replay_values(summary: dict, steps: int) -> dict[str, float]:
    """The values a replay compares, by label: each agent's step-0 accuracy, overall and per sub-skill, and each of
    its per-step diagnostics up to `steps`."""
    values = {}
    for name, agent in summary["agents"].items():
        values[f"{name} step-0 accuracy"] = agent["initial_accuracy"]
        for skill, curve in agent.get("skill_curves", {}).items():
            values.update({f"{name} step-0 accuracy on {skill!r}": value for step, value in curve if step == 0})
        for key, curve in agent.get("diagnostic_curves", {}).items():
            values.update({f"{name} {key} at step {step}": value for step, value in curve if step <= steps})
    return values


def _boot_id() -> str | None:
    """This boot of this machine (the node name `vm` is the same on every machine of this kind)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def wait_while_held(out: Path, poll: float = 5.0) -> None:
    """Between runs, wait as long as `<out>/HOLD` exists: `touch` it to have the machine quiet for other work
    (a benchmark, the tests) without spoiling a run's wall time, remove it to go on. Checked before each run and
    again after a seed's warm-starts are built (untimed, minutes), just before the timed training starts. A run in
    progress finishes first; a pause inside a run (SIGSTOP) would count in its seconds."""
    hold = out / "HOLD"
    if hold.exists():
        print(f"== held: {hold} exists; the grid goes on when it is removed", flush=True)
        while hold.exists():
            time.sleep(poll)


def timed(method: str) -> bool:
    """Whether a method's wall time is compared (time-to-accuracy: the full methods and baselines), so its run needs
    a quiet machine; the ablations are compared in accuracy only and may share it."""
    return not any(method.endswith(f"_{name}") for name in ABLATIONS)


def machine_is_quiet(window: float = 20.0) -> bool:
    """Whether the rest of the machine stays under QUIET_SHARE of its cores for `window` seconds (called between
    runs, while the grid itself is idle: all the busy time measured is others'). True where /proc/stat is absent."""
    before = machine_busy_seconds()
    time.sleep(window)
    after = machine_busy_seconds()
    if before is None or after is None:
        return True
    return (after - before) / (window * (os.cpu_count() or 1)) < QUIET_SHARE


def next_run(pending: list[str], quiet, poll: float = 60.0) -> str:
    """The next of a seed's pending methods: the first, when the machine is quiet; while it is busy, the first
    accuracy-only one (an ablation) instead, and with none left, wait until it is quiet. So the timed runs of a
    seed start on a quiet machine and the ablations use the busy time. `quiet()`: `machine_is_quiet`."""
    announced = False
    while True:
        if quiet():
            return pending[0]
        untimed = [m for m in pending if not timed(m)]
        if untimed:
            return untimed[0]
        if not announced:
            print(f"== the machine is busy: {pending[0]} (timed) waits until it is quiet", flush=True)
            announced = True
        time.sleep(poll)


def run_seed(grid: Grid, bed: str, seed: int, names: list[str] | None = None, quiet=None) -> None:
    """Run a seed's methods on a bed that have no summary yet (a cached one is kept), writing each summary at its
    run's end. `quiet`: None keeps the bed's order; round 3 passes `machine_is_quiet`,
    so that `next_run` starts the timed methods on a quiet machine and the ablations while it is busy. Before each
    run, waits while `<out>/HOLD` exists."""
    pending = []
    for method in names or grid.methods(bed):
        if method not in grid.methods(bed):
            continue
        target = grid.summary_path(bed, method, seed)
        if target.exists():
            print(f"== {bed} {method} seed {seed}: cached in {target}", flush=True)
        else:
            pending.append(method)
    while pending:
        wait_while_held(grid.out)
        method = next_run(pending, quiet) if quiet is not None else pending[0]
        pending.remove(method)
        _write_json(grid.summary_path(bed, method, seed), grid.run(bed, method, seed))


def summarize(work: Path, config, diagnostics: list[str] = DIAGNOSTICS) -> dict:
    """Round 1's per-agent summary (`learning.summarize_agents`: curves, rollouts, sequences, diagnostics) plus the
    accuracy curve per sub-skill and the cumulative training seconds at each evaluation."""
    from hacrl.driver.evaluation import read_eval_records
    from hacrl.driver.metrics import scope
    from hacrl.tools.testbed.demo import sub_skill

    out = _round1().summarize_agents(work, config, diagnostics)
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    eval_steps = [r["step"] for r in records if any(scope(k) == "eval" for k in r)]
    elapsed, clock = {}, 0.0
    for r in records:
        clock += r.get("time/step", 0.0)
        elapsed[r["step"]] = clock
    per_prompt = {s: read_eval_records(work, s) for s in eval_steps}
    r_max = config.algorithm.r_max
    for name, summary in out.items():
        skills: dict[str, list] = {}
        for s in eval_steps:
            by_skill: dict[str, list[float]] = {}
            for row in per_prompt[s]:
                by_skill.setdefault(sub_skill(row["prompt"]), []).append(float(row["agents"][name]["reward"] >= r_max))
            for skill, hits in by_skill.items():
                skills.setdefault(skill, []).append([s, sum(hits) / len(hits)])
        summary["skill_curves"] = skills
        summary["train_seconds"] = [[s, elapsed[s]] for s in eval_steps]
        summary["step_seconds"] = [round(r["time/step"], 4) for r in records if "time/step" in r]  # steps 1..N
    return out


def _round1():
    """`benchmarks/learning.py` as a module (the benchmarks are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("learning_benchmark", Path(__file__).with_name("learning.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- statistics -------------------------------------------------------------------------------------------------
def paired_ci(diffs: list[float]) -> dict:
    """Mean of per-seed differences with its two-sided 95 % t interval over seeds (None below two seeds)."""
    n = len(diffs)
    if n == 0:
        return {"n": 0, "mean": None, "lo": None, "hi": None}
    mean = statistics.mean(diffs)
    if n < 2:
        return {"n": n, "mean": mean, "lo": None, "hi": None, "diffs": diffs}
    half = T975.get(n - 1, 1.96) * statistics.stdev(diffs) / math.sqrt(n)
    return {"n": n, "mean": mean, "lo": mean - half, "hi": mean + half, "diffs": diffs}


PAUSE_FACTOR = 5.0
"""A step that took more than this many times the run's median step was interrupted (the process paused, the
machine lent to other work); `robust_seconds` caps it at this many times the median."""


def robust_seconds(run: dict) -> list[list[float]]:
    """Cumulative training seconds at each evaluated step, each step's time capped at PAUSE_FACTOR x the run's
    median step (an interruption is not training time); the raw clock where per-step times were not recorded."""
    if not run.get("step_seconds"):
        return run["train_seconds"]
    steps = run["step_seconds"]
    cap = PAUSE_FACTOR * statistics.median(steps)
    clock = list(itertools.accumulate(min(t, cap) for t in steps))
    return [[s, clock[s - 1] if s >= 1 else 0.0] for s, _ in run["train_seconds"]]


def time_to_accuracy(run: dict, target: float) -> float | None:
    """Training seconds (`robust_seconds`) until the run's evaluated accuracy first reaches `target` (None: never)."""
    seconds = dict((s, t) for s, t in robust_seconds(run))
    for step, accuracy in run["curve"]:
        if accuracy >= target - 1e-12:
            return seconds.get(step, 0.0)
    return None


def load_runs(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "summaries").glob("*/*.json"))]


def aggregate(out: Path, command: str, earlier: Path | None = None) -> dict:
    """Every summary under `out` into evidence.json / .md / .png. `earlier`: an earlier round's evidence.json, whose
    per-mechanism verdicts join this round's in one table across beds (round 3 reads round 2's)."""
    runs = load_runs(out)
    cells: dict = {}  # bed -> agent -> method -> seed -> per-agent summary (+ seconds)
    for run in runs:
        for agent, res in run["agents"].items():
            cell = cells.setdefault(run["bed"], {}).setdefault(agent, {}).setdefault(run["method"], {})
            load = {k: run.get(k) for k in ("seconds", "quiet", "machine_seconds")}
            cell[run["seed"]] = {**res, **load}
    result: dict = {"command": command, "runs": len(runs), "beds": {}}
    for bed, agents in cells.items():
        bed_out = result["beds"].setdefault(bed, {})
        for agent, by_method in agents.items():
            rows = {}
            # an agent frozen in a method (agents.<i>.frozen: it samples and shares, never trains) has no result of
            # that method to compare: its accuracy is its warm-start's at every evaluation
            frozen = {m for m, seeds in by_method.items() if all(seeds[s]["sequences_trained"] == 0 for s in seeds)}
            trained = {m: seeds for m, seeds in by_method.items() if m not in frozen}
            for method, seeds in by_method.items():
                finals = [100 * seeds[s]["final_accuracy"] for s in sorted(seeds)]
                initial = [100 * seeds[s]["initial_accuracy"] for s in sorted(seeds)]
                skills = {}
                for skill in sorted({k for s in seeds.values() for k in s["skill_curves"]}):
                    skills[skill] = {
                        "initial": statistics.mean(100 * seeds[s]["skill_curves"][skill][0][1] for s in seeds),
                        "final": statistics.mean(100 * seeds[s]["skill_curves"][skill][-1][1] for s in seeds),
                    }
                rows[method] = {
                    "seeds": sorted(seeds),
                    "frozen": method in frozen,
                    "accuracy_mean": statistics.mean(finals),
                    "accuracy_sd": statistics.stdev(finals) if len(finals) > 1 else None,
                    "initial_mean": statistics.mean(initial),
                    "initial_sd": statistics.stdev(initial) if len(initial) > 1 else None,
                    "skills": skills,
                    # wall time from quiet runs only (a run without the record, round 2's, counts as quiet)
                    "seconds": _mean([seeds[s]["seconds"] for s in seeds if seeds[s].get("quiet") is not False]),
                    "quiet_seeds": sum(seeds[s].get("quiet") is not False for s in seeds),
                    "machine_seconds": _mean([seeds[s].get("machine_seconds") for s in seeds]),
                    "rollouts_generated": statistics.mean(seeds[s]["rollouts_generated"] for s in seeds),
                    "sequences_trained": statistics.mean(seeds[s]["sequences_trained"] for s in seeds),
                    "diagnostics": {k: _mean([seeds[s]["diagnostics"].get(k) for s in seeds]) for k in DIAGNOSTICS},
                }
            comparisons = {}
            for a, b in [*comparison_pairs(bed), *POST_HOC_PAIRS]:
                if a in trained and b in trained:
                    comparisons[f"{a} - {b}"] = {
                        **_compare(trained[a], trained[b]),
                        "time_to_accuracy": _time_to_accuracy(trained[a], trained[b]),
                        "pre_registered": (a, b) not in POST_HOC_PAIRS,
                    }
            tta = {}
            if "gspo_x2" in trained:
                against_x2 = [f"hacpo_{mode}" for mode in MODES]
                against_x2 += ["naive", "frozen_teacher"] if bed in ROUND3_BEDS else []
                for method in (m for m in against_x2 if m in trained):
                    tta[method] = _time_to_accuracy(trained[method], trained["gspo_x2"])
            bed_out[agent] = {
                "methods": rows,
                "comparisons": comparisons,
                "time_to_accuracy": tta,
                "late_fall": _late_fall(trained),
            }
    result["primary"] = _primary(cells)
    result["primary_round3"] = _primary_round3(cells)
    result["partner_skill"] = _partner_skill(cells)
    result["warm_start"] = _warm_start(cells)
    result["mechanisms"] = mechanisms(result)
    result["mechanism_inputs"] = mechanism_inputs(runs)
    if earlier is not None and earlier.is_file():
        before = json.loads(earlier.read_text())
        result["mechanisms_across_beds"] = across_beds({**before.get("mechanisms", {}), **result["mechanisms"]})
        result["mechanism_inputs_across_beds"] = {**before.get("mechanism_inputs", {}), **result["mechanism_inputs"]}
    _write_json(out / "evidence.json", result)
    (out / "evidence.md").write_text(_markdown(result))
    if runs:
        _plot(cells, out / "evidence.png")
    return result


def _primary(cells: dict) -> dict:
    """The pre-registered primary comparison per agent, and whether the goal is met: every agent's difference at
    least GOAL_POINTS with its interval above zero, over all of SEEDS (fewer seeds: no verdict yet)."""
    bed, method, baseline = PRIMARY
    agents = {}
    for agent, by_method in cells.get(bed, {}).items():
        if method in by_method and baseline in by_method:
            agents[agent] = _compare(by_method[method], by_method[baseline])["overall"]
    complete = bool(agents) and all(c["n"] == len(SEEDS) for c in agents.values())
    met = complete and all(c["mean"] >= GOAL_POINTS and c["lo"] > 0 for c in agents.values())
    verdict = ("met" if met else "not met") if complete else "no verdict yet"
    return {"bed": bed, "comparison": f"{method} - {baseline}", "agents": agents, "verdict": verdict}


PRIMARY3 = {
    "bed": "gap",
    "agent": "qwen-bpe",
    "comparisons": [("hacpo_learner_length", "naive", 2.0), ("hacpo_learner_length", "gspo_x2", 3.0)],
}
"""Round 3's pre-registered primary comparisons: the weaker agent's final accuracy, (method, baseline, goal in
points with the interval above zero)."""


LATE_EVALUATIONS = 3
"""The sensitivity check of round 3's primary: the mean of each run's last this many evaluations (steps 350-400 of
400) instead of the last one alone (`late_mean`)."""


def late_mean(run: dict, k: int = LATE_EVALUATIONS) -> float:
    """Mean greedy accuracy over a run's last `k` evaluations (fewer if it has fewer).

    >>> late_mean({"curve": [[0, 0.1], [25, 0.3], [50, 0.2], [75, 0.4]]})
    0.3
    """
    return statistics.mean(a for _, a in run["curve"][-k:])


def _primary_round3(cells: dict) -> dict:
    """Each of PRIMARY3's comparisons with its verdict (none before all of SEEDS have run), and a sensitivity check
    added while the grid ran (not pre-registered, no verdict): the same paired difference of each run's mean over
    its last LATE_EVALUATIONS evaluations, since a single final evaluation moves by 1-3 points between neighbours."""
    by_method = cells.get(PRIMARY3["bed"], {}).get(PRIMARY3["agent"], {})
    out = []
    for method, baseline, goal in PRIMARY3["comparisons"]:
        if method in by_method and baseline in by_method:
            mine, theirs = by_method[method], by_method[baseline]
            c = _compare(mine, theirs)["overall"]
            met = c["mean"] >= goal and c["lo"] is not None and c["lo"] > 0
            verdict = ("met" if met else "not met") if c["n"] == len(SEEDS) else "no verdict yet"
            common = sorted(mine.keys() & theirs.keys())
            late = paired_ci([100 * (late_mean(mine[s]) - late_mean(theirs[s])) for s in common])
            out.append({"comparison": f"{method} - {baseline}", "goal": goal, **c, "verdict": verdict, "late": late})
    return {"bed": PRIMARY3["bed"], "agent": PRIMARY3["agent"], "comparisons": out}


MECHANISMS = [
    ("sharing", "gspo", "the partner's verified rollouts (HACPO) over training alone on the same rollouts per agent"),
    ("corrections", "naive", "HACPO's corrections together, over naive sharing (foreign rows as if one's own)"),
    ("learning peer", "frozen_teacher", "a partner that learns, over the stronger agent frozen (the weaker learns)"),
    ("capability baseline", "{full}_no_capability_baseline", "foreign rewards capability-weighted in the baseline"),
    ("rho", "{full}_no_rho", "foreign advantages scaled by source / learner capability"),
    ("alpha = 1", "{full}_alpha0", "the foreign ratio's detached factor sg(s)^alpha (its weight ~ s^2)"),
    ("stepwise clip", "{full}_static_clip", "the foreign lower bound rising with the mini-batch index"),
    ("foreign clip", "{full}_no_foreign_clip", "no gradient from foreign rows outside [lower bound, 1]"),
]
"""Each mechanism as (name, the method without it, what it is): its effect is the full method's final accuracy
minus that method's, paired per seed (`mechanisms`)."""


def mechanism_verdict(cis: dict[str, dict]) -> str:
    """One mechanism's reading over the agents, from each agent's paired 95 % interval (full method - without it),
    a rule fixed while round 3's grid had one seed of five: no verdict before every seed has run; `pays` if some
    agent's interval is above 0 and none is below; `costs` if some is below and none above; `mixed` if both;
    otherwise `not separable` (every interval includes 0). No correction for multiplicity: with 8 mechanisms x 2
    agents about one interval in 20 excludes 0 by chance.

    >>> up, down, zero = ({"n": 5, "lo": lo, "hi": hi} for lo, hi in ((0.2, 2.0), (-2.0, -0.1), (-1.0, 1.0)))
    >>> [mechanism_verdict(c) for c in ({"a": up, "b": zero}, {"a": down}, {"a": up, "b": down}, {"a": zero})]
    ['pays (a)', 'costs (a)', 'mixed: pays (a), costs (b)', 'not separable']
    >>> mechanism_verdict({"a": {"n": 1, "lo": None, "hi": None}})
    'no verdict yet'
    """
    if not cis or any(c["n"] < len(SEEDS) for c in cis.values()):
        return "no verdict yet"
    above = [a for a, c in cis.items() if c["lo"] > 0]
    below = [a for a, c in cis.items() if c["hi"] < 0]
    if above and below:
        return f"mixed: pays ({', '.join(above)}), costs ({', '.join(below)})"
    if above:
        return f"pays ({', '.join(above)})"
    if below:
        return f"costs ({', '.join(below)})"
    return "not separable"


def mechanisms(result: dict) -> dict:
    """Per bed, each mechanism of MECHANISMS whose method ran: every agent's paired difference (the full method,
    `hacpo_<ABLATION_MODE>`, minus the method without the mechanism; agents frozen in it are left out) and the
    verdict of `mechanism_verdict`."""
    full = f"hacpo_{ABLATION_MODE}"
    out = {}
    for bed, agents in result["beds"].items():
        rows = []
        for name, without, what in MECHANISMS:
            key = f"{full} - {without.format(full=full)}"
            cis = {a: d["comparisons"][key]["overall"] for a, d in agents.items() if key in d["comparisons"]}
            if cis:
                rows.append({"mechanism": name, "what": what, "comparison": key, "agents": cis,
                             "verdict": mechanism_verdict(cis)})  # fmt: skip
        if rows:
            out[bed] = rows
    return out


def across_beds(by_bed: dict[str, list[dict]]) -> dict[str, dict[str, str]]:
    """Mechanism -> bed -> one cell: its verdict and each agent's mean difference (`mechanisms`' rows, per bed)."""
    out: dict[str, dict[str, str]] = {name: {} for name, _, _ in MECHANISMS}
    for bed, rows in by_bed.items():
        for r in rows:
            means = ", ".join(
                f"{agent.split('-')[0]} " + ("-" if c["mean"] is None else f"{c['mean']:+.1f}")
                for agent, c in r["agents"].items()
            )
            out[r["mechanism"]][bed] = f"{r['verdict']} ({means})"
    return {name: cells for name, cells in out.items() if cells}


def _partner_skill(cells: dict) -> dict:
    """Per agent with a specialty: per seed, (gain over GSPOx2 on the partner's sub-skill) - (gain on its own), for
    the primary method; above zero means sharing helps most where the partner is strong."""
    bed, method, baseline = PRIMARY
    out = {}
    for agent, own in SPECIALTY.get(bed, {}).items():
        by_method = cells.get(bed, {}).get(agent, {})
        if method not in by_method or baseline not in by_method:
            continue
        mine, theirs = by_method[method], by_method[baseline]
        diffs, per_seed = [], {}
        for s in sorted(mine.keys() & theirs.keys()):
            gain = {
                k: 100 * (mine[s]["skill_curves"][k][-1][1] - theirs[s]["skill_curves"][k][-1][1])
                for k in mine[s]["skill_curves"]
            }
            partner = [k for k in gain if k != own]
            if own in gain and len(partner) == 1:
                diffs.append(gain[partner[0]] - gain[own])
                per_seed[s] = {
                    "partner_skill_before": 100 * mine[s]["skill_curves"][partner[0]][0][1],
                    "partner_skill_gain": gain[partner[0]],
                    "own_skill_gain": gain[own],
                }
        out[agent] = {"own": own, **paired_ci(diffs), "per_seed": per_seed}
    return out


def _warm_start(cells: dict) -> dict:
    """Per bed and agent: the warm-start accuracy (step 0, before RL) of each seed, overall and per sub-skill, with
    mean, sd, min and max over seeds (the spread the warm-start's chaos causes). Every method of a seed starts from
    the same agents; a seed whose methods disagree at step 0 is a bug and stops the aggregation."""
    out = {}
    for bed, agents in cells.items():
        for agent, by_method in agents.items():
            per_seed: dict[int, dict[str, float]] = {}
            for method, seeds in by_method.items():
                for s, r in seeds.items():
                    values = {"all": 100 * r["initial_accuracy"]}
                    values |= {k: 100 * c[0][1] for k, c in r["skill_curves"].items()}
                    if per_seed.setdefault(s, values) != values:
                        raise SystemExit(
                            f"{bed} {agent} seed {s}: {method} starts from other accuracies than the "
                            "seed's other methods (the seed's agents changed between runs?)"
                        )
            keys = sorted({k for v in per_seed.values() for k in v}, key=lambda k: (k != "all", k))
            if len(keys) == 2:  # one sub-skill (the demo bed): the same numbers as "all"
                keys = ["all"]
            stats = {}
            for key in keys:
                values = [per_seed[s][key] for s in sorted(per_seed)]
                stats[key] = {
                    "per_seed": values,
                    "mean": statistics.mean(values),
                    "sd": statistics.stdev(values) if len(values) > 1 else None,
                    "min": min(values),
                    "max": max(values),
                }
            out.setdefault(bed, {})[agent] = {"seeds": sorted(per_seed), "accuracy": stats}
    return out


INPUTS = [
    ("capability", "capability"),
    ("rho", "rho (partner / own capability)"),
    ("foreign_ratio_p10", "foreign ratio p10"),
    ("foreign_ratio_p50", "foreign ratio p50"),
    ("foreign_clip_frac", "foreign rows clipped"),
    ("foreign_below_frac", "below the lower bound"),
]
"""What HACPO's mechanisms act on, per learner (`mechanism_inputs`): the capability (the baseline's weights and rho
come from it), rho on the partner's rows, and how far the partner's rows are from the learner's policy."""


def mechanism_inputs(runs: list[dict], method: str = f"hacpo_{ABLATION_MODE}", share: float = 0.1) -> dict:
    """Per bed and agent, for `method`'s runs: the mean over the first and over the last `share` of the steps (at
    least one step each) of each of INPUTS, then the mean over seeds. Read as: do the capabilities differ enough
    for the capability baseline and rho to act (rho far from 1), and do the policies drift apart over the run (the
    partner's rows less likely under the learner's policy late than early: a falling ratio, more rows clipped)?
    rho is the trainer's own (`hacrl.core.capability.loss_coefficients`: clamp(partner's capability / the learner's,
    0.1, 10)), step by step, with exactly one partner (left out with more). Added while round 3's grid ran (not
    pre-registered), from the summaries' curves.

    >>> run = {"bed": "b", "method": "m", "seed": 0, "agents": {
    ...     "x": {"diagnostic_curves": {"capability": [[1, 0.2], [2, 0.2], [3, 0.4], [4, 0.5]],
    ...                                 "foreign_ratio_p50": [[1, 0.8], [2, 0.6], [3, 0.5], [4, 0.4]]}},
    ...     "y": {"diagnostic_curves": {"capability": [[1, 0.4], [2, 0.6], [3, 0.5], [4, 0.5]]}}}}
    >>> x = mechanism_inputs([run], "m", share=0.5)["b"]["x"]
    >>> x["steps"], x["window"], x["early"]["capability"], x["late"]["capability"], x["early"]["rho"], x["late"]["rho"]
    (4, 2, 0.2, 0.45, 2.5, 1.125)
    >>> round(x["early"]["foreign_ratio_p50"], 6), x["late"]["foreign_ratio_p50"], x["late"]["foreign_clip_frac"]
    (0.7, 0.45, None)
    """
    import torch

    from hacrl.core.capability import CAPABILITY_FLOOR, loss_coefficients

    per: dict = {}  # bed -> agent -> phase -> key -> per-seed values
    sizes: dict = {}
    for run in (r for r in runs if r["method"] == method):
        curves = {a: res.get("diagnostic_curves", {}) for a, res in run["agents"].items()}
        caps = {a: dict((int(s), v) for s, v in c.get("capability", [])) for a, c in curves.items()}
        for agent, c in curves.items():
            steps = sorted(caps[agent])
            if not steps:
                continue
            window = max(1, round(share * len(steps)))
            phases = {"early": set(steps[:window]), "late": set(steps[-window:])}
            partners = [a for a in caps if a != agent]
            series = {k: {int(s): v for s, v in c.get(k, [])} for k, _ in INPUTS if k != "rho"}
            if len(partners) == 1:  # the trainer's own rho: its loss coefficient on the partner's rows
                mine, theirs = caps[agent], caps[partners[0]]
                rho = series["rho"] = {}
                for s in mine.keys() & theirs.keys():
                    pair = torch.tensor([mine[s], theirs[s]], dtype=torch.float64).clamp(min=CAPABILITY_FLOOR)
                    rho[s] = float(loss_coefficients(pair, 0)[1])
            sizes.setdefault(run["bed"], {})[agent] = (len(steps), window)
            for phase, chosen in phases.items():
                for key, _ in INPUTS:
                    values = [v for s, v in series.get(key, {}).items() if s in chosen and v is not None]
                    if values:
                        cell = per.setdefault(run["bed"], {}).setdefault(agent, {}).setdefault(phase, {})
                        cell.setdefault(key, []).append(statistics.mean(values))
    out: dict = {}
    for bed, agents in per.items():
        for agent, phases in agents.items():
            steps, window = sizes[bed][agent]
            out.setdefault(bed, {})[agent] = {
                "method": method,
                "steps": steps,
                "window": window,
                "seeds": max((len(v) for p in phases.values() for v in p.values()), default=0),
                **{
                    phase: {k: _mean(phases.get(phase, {}).get(k, [])) for k, _ in INPUTS}
                    for phase in ("early", "late")
                },
            }
    return out


CLIP_ABLATIONS = ("static_clip", "no_foreign_clip")
"""The ablations the paper says destabilise training (its stronger agent's accuracy falls late): `_late_fall`."""


def _late_fall(by_method: dict) -> dict:
    """How far each run's accuracy ends below its best evaluation (points; 0 if the last is the best), per method,
    and for each clipping ablation the paired difference (ablation's fall - the full method's fall: above zero
    means the ablation falls further). Added while round 2's grid ran, not pre-registered there (round 3 pre-registers
    it as a secondary): it tests the paper's claim that static or no clipping lets accuracy fall late in training,
    from the same evaluation curves."""
    falls = {
        method: {s: 100 * (max(a for _, a in r["curve"]) - r["curve"][-1][1]) for s, r in seeds.items()}
        for method, seeds in by_method.items()
    }
    methods_out = {
        m: {"per_seed": [f[s] for s in sorted(f)], "mean": statistics.mean(f.values()), "max": max(f.values())}
        for m, f in falls.items()
    }
    full = f"hacpo_{ABLATION_MODE}"
    comparisons = {}
    for name in CLIP_ABLATIONS:
        ablation = f"{full}_{name}"
        if ablation in falls and full in falls:
            common = sorted(falls[ablation].keys() & falls[full].keys())
            comparisons[f"{ablation} - {full}"] = paired_ci([falls[ablation][s] - falls[full][s] for s in common])
    return {"methods": methods_out, "comparisons": comparisons}


def _compare(mine: dict, theirs: dict) -> dict:
    common = sorted(mine.keys() & theirs.keys())
    overall = paired_ci([100 * (mine[s]["final_accuracy"] - theirs[s]["final_accuracy"]) for s in common])
    skills = {}
    for skill in sorted({k for s in common for k in mine[s]["skill_curves"]}):
        skills[skill] = paired_ci(
            [100 * (mine[s]["skill_curves"][skill][-1][1] - theirs[s]["skill_curves"][skill][-1][1]) for s in common]
        )
    return {"overall": overall, "skills": skills}


def _time_to_accuracy(mine: dict, base: dict) -> dict:
    """Per seed: training seconds for a method to first reach its baseline's final accuracy (None: never), and the
    baseline's own training seconds; the time ratio only over seeds whose two runs were both quiet (a run without
    the record, round 2's, counts). The same question in rollouts generated (deterministic per machine, unlike wall
    time): the method's rollouts until its first evaluation at or above the target, over all of the baseline's."""
    per_seed = {}
    for s in sorted(mine.keys() & base.keys()):
        target = base[s]["final_accuracy"]
        per_seed[s] = {
            "seconds": time_to_accuracy(mine[s], target),
            "baseline_seconds": robust_seconds(base[s])[-1][1],
            "quiet": mine[s].get("quiet") is not False and base[s].get("quiet") is not False,
        }
        step = next((st for st, acc in mine[s]["curve"] if acc >= target - 1e-12), None)
        per_seed[s]["step"] = step
        if step is not None:
            per_step = mine[s]["rollouts_generated"] / mine[s]["curve"][-1][0]
            per_seed[s]["rollout_ratio"] = step * per_step / base[s]["rollouts_generated"]
    reached = [v for v in per_seed.values() if v["seconds"] is not None]
    ratios = [v["seconds"] / v["baseline_seconds"] for v in reached if v["baseline_seconds"] > 0 and v["quiet"]]
    rollouts = [v["rollout_ratio"] for v in per_seed.values() if "rollout_ratio" in v]
    return {
        "per_seed": per_seed,
        "reached": len(reached),
        "timed": len(ratios),
        "ratio_median": statistics.median(ratios) if ratios else None,
        "rollout_ratio_median": statistics.median(rollouts) if rollouts else None,
    }


def _fmt_tta(t: dict) -> str:
    """A time-to-accuracy result in a table cell: seeds reaching the target, median rollout ratio, median time
    ratio (quiet seeds)."""
    if not t["per_seed"]:
        return "-"
    text = f"{t['reached']} / {len(t['per_seed'])}"
    if t["rollout_ratio_median"] is not None:
        text += f", rollouts x{t['rollout_ratio_median']:.2f}"
    if t["ratio_median"] is not None:
        text += f", time x{t['ratio_median']:.2f} ({t['timed']})"
    return text


def _fmt_ci(c: dict) -> str:
    if c["mean"] is None:
        return "-"
    if c["lo"] is None:
        return f"{c['mean']:+.1f} (1 seed)"
    mark = " *" if c["lo"] > 0 or c["hi"] < 0 else ""
    return f"{c['mean']:+.1f} [{c['lo']:+.1f}, {c['hi']:+.1f}]{mark}"


def _markdown(result: dict) -> str:
    lines = [
        "# Learning benchmark, round 3: where HACPO's machinery pays (a capability gap, long runs, a frozen peer)"
        if set(result["beds"]) <= set(ROUND3_BEDS) and result["beds"]
        else "# Learning benchmark, round 2: HACPO vs baselines on two test beds, seeds that vary the warm-start",
        "",
        f"Reproduce: `{result['command']}` (each (bed, method, seed) run is cached in `summaries/`).",
        "Pre-registration and analysis: `benchmarks/results/analysis.md`, section Round 2 (round 3 for `gap`). "
        "Accuracies are greedy",
        "pass@1 (%) on the same 1,280 held-out prompts for every run; intervals are 95 % t intervals over seeds of",
        "per-seed paired differences (same seed: same warm-start, same prompt order); * marks an interval that",
        "excludes 0. Curves: `evidence.png`.",
        "",
    ]
    round3 = result.get("primary_round3") or {}
    if round3.get("comparisons"):
        lines += [
            f"## Round 3, pre-registered primary comparisons: the weaker agent (`{round3['agent']}`) on "
            f"`{round3['bed']}`",
            "",
            "| comparison | goal | seeds | Δ final accuracy [95 % CI] | per seed | verdict |",
            "|---|---|---|---|---|---|",
        ]
        for c in round3["comparisons"]:
            per = ", ".join(f"{d:+.1f}" for d in c.get("diffs", []))
            lines.append(f"| `{c['comparison']}` | >= {c['goal']:g}, interval above 0 | {c['n']} | {_fmt_ci(c)} | "
                         f"{per} | **{c['verdict']}** |")  # fmt: skip
        lines += [
            "",
            f"Sensitivity (not pre-registered, no verdict): each run's mean over its last {LATE_EVALUATIONS} "
            "evaluations instead of the last one alone, paired per seed.",
            "",
            "| comparison | seeds | Δ late mean [95 % CI] | per seed |",
            "|---|---|---|---|",
        ]
        for c in round3["comparisons"]:
            late = c.get("late") or {"n": 0, "mean": None}
            per = ", ".join(f"{d:+.1f}" for d in late.get("diffs", []))
            lines.append(f"| `{c['comparison']}` | {late['n']} | {_fmt_ci(late)} | {per} |")
        lines.append("")
    primary = result.get("primary")
    if primary and primary["agents"]:
        lines += [
            f"## Pre-registered primary comparison: `{primary['comparison']}` on `{primary['bed']}`",
            "",
            f"Goal: >= {GOAL_POINTS:g} points for every agent with the 95 % interval above zero, over seeds "
            f"{SEEDS[0]}-{SEEDS[-1]}. **Verdict: {primary['verdict']}.**",
            "",
            "| agent | seeds | Δ final accuracy [95 % CI] | per seed |",
            "|---|---|---|---|",
        ]
        for agent, c in primary["agents"].items():
            per = ", ".join(f"{d:+.1f}" for d in c.get("diffs", [c["mean"]] if c["mean"] is not None else []))
            lines.append(f"| {agent} | {c['n']} | {_fmt_ci(c)} | {per} |")
        if result.get("partner_skill"):
            lines += [
                "",
                "Does an agent gain most on the sub-skill its partner is good at? Per seed, (gain over "
                f"`{PRIMARY[2]}` on the partner's sub-skill) - (gain on its own sub-skill):",
                "",
                "| agent | own sub-skill | partner's minus own [95 % CI] |",
                "|---|---|---|",
            ]
            for agent, c in result["partner_skill"].items():
                lines.append(f"| {agent} | `{c['own']}` | {_fmt_ci(c)} |")
            lines += [
                "",
                "Per seed (not pre-registered: does the gain on the partner's sub-skill depend on how much of it the "
                "agent knew before RL?):",
                "",
                "| agent | seed | partner's sub-skill before RL | gain over "
                f"`{PRIMARY[2]}` on it | gain on its own sub-skill |",
                "|---|---|---|---|---|",
            ]
            for agent, c in result["partner_skill"].items():
                for s, v in c["per_seed"].items():
                    lines.append(
                        f"| {agent} | {s} | {v['partner_skill_before']:.1f} | {v['partner_skill_gain']:+.1f} "
                        f"| {v['own_skill_gain']:+.1f} |"
                    )
        lines.append("")
    for bed, rows in (result.get("mechanisms") or {}).items():
        agents = sorted({a for r in rows for a in r["agents"]})
        lines += [
            f"## Per mechanism on `{bed}`: does it pay? (`hacpo_{ABLATION_MODE}` minus the method without it)",
            "",
            "Final accuracy, paired per seed. Verdict (rule in `mechanism_verdict`, fixed before the seeds that "
            "decide): `pays` if an agent's interval is above 0 and none below, `costs` the reverse, `mixed` both, `not "
            "separable` if every interval includes 0; none before all seeds have run. No multiplicity correction.",
            "",
            "| mechanism | what it is | " + " | ".join(agents) + " | verdict |",
            "|---|---|" + "---|" * len(agents) + "---|",
        ]
        for r in rows:
            cells = " | ".join(_fmt_ci(r["agents"][a]) if a in r["agents"] else "-" for a in agents)
            lines.append(f"| {r['mechanism']} | {r['what']} | {cells} | **{r['verdict']}** |")
        lines.append("")
    across = result.get("mechanisms_across_beds")
    if across:
        beds = sorted({b for cells in across.values() for b in cells}, key=list(BEDS).index)
        lines += [
            "## Per mechanism across the beds of rounds 2 and 3 (verdict, then each agent's mean difference)",
            "",
            "| mechanism | " + " | ".join(f"`{b}`" for b in beds) + " |",
            "|---|" + "---|" * len(beds),
        ]
        for name, cells in across.items():
            lines.append(f"| {name} | " + " | ".join(cells.get(b, "not run") for b in beds) + " |")
        lines.append("")
    inputs = result.get("mechanism_inputs_across_beds") or result.get("mechanism_inputs")
    if inputs:
        lines += [
            f"## What the mechanisms act on: early -> late in training (`hacpo_{ABLATION_MODE}`, mean over seeds)",
            "",
            "Each learner's mean over the first and the last 10 % of the steps (`mechanism_inputs`; not "
            "pre-registered). rho far from 1 is what rho and the capability baseline need to act on; a falling foreign "
            "ratio and more rows clipped late mean the policies drift apart.",
            "",
            "| bed | learner | steps (window) | seeds | " + " | ".join(label for _, label in INPUTS) + " |",
            "|---|---|---|---|" + "---|" * len(INPUTS),
        ]
        for bed, agents in inputs.items():
            for agent, d in agents.items():
                cells = []
                for key, _ in INPUTS:
                    early, late = d["early"].get(key), d["late"].get(key)
                    cells.append("-" if early is None or late is None else f"{early:.2f} -> {late:.2f}")
                lines.append(
                    f"| `{bed}` | {agent} | {d['steps']} ({d['window']}) | {d['seeds']} | " + " | ".join(cells) + " |"
                )
        lines.append("")
    if result.get("warm_start"):
        lines += [
            "## Warm-start accuracy over seeds (before RL; the spread the warm-start itself causes)",
            "",
            "| bed | agent | sub-skill | seeds | mean ± sd | min - max | per seed |",
            "|---|---|---|---|---|---|---|",
        ]
        for bed, agents in result["warm_start"].items():
            for agent, w in agents.items():
                for key, st in w["accuracy"].items():
                    sd = "" if st["sd"] is None else f" ± {st['sd']:.1f}"
                    per = ", ".join(f"{v:.1f}" for v in st["per_seed"])
                    name = "all" if key == "all" else f"`{key}`"
                    lines.append(
                        f"| {bed} | {agent} | {name} | {len(w['seeds'])} | {st['mean']:.1f}{sd} "
                        f"| {st['min']:.1f} - {st['max']:.1f} | {per} |"
                    )
        lines.append("")
    for bed, agents in result["beds"].items():
        lines += [f"## Bed `{bed}`", ""]
        for agent, data in agents.items():
            rows = data["methods"]
            skills = sorted({k for r in rows.values() for k in r["skills"]})
            lines += [
                f"### {agent}",
                "",
                "| method | seeds | before | after (mean ± sd) | "
                + " | ".join(f"`{k}` before -> after" for k in skills)
                + " | rollouts | sequences | time (s; quiet runs) | machine (CPU s) |",
                "|---|---|---|---|" + "---|" * len(skills) + "---|---|---|---|",
            ]
            for method, r in rows.items():
                sd = "-" if r["accuracy_sd"] is None else f"{r['accuracy_sd']:.1f}"
                isd = "" if r["initial_sd"] is None else f" ± {r['initial_sd']:.1f}"
                sk = " | ".join(
                    f"{r['skills'][k]['initial']:.1f} -> {r['skills'][k]['final']:.1f}" if k in r["skills"] else "-"
                    for k in skills
                )
                wall = "-" if r["seconds"] is None else f"{r['seconds']:.0f}"
                if r["seconds"] is not None and r["quiet_seeds"] < len(r["seeds"]):
                    wall += f" ({r['quiet_seeds']} of {len(r['seeds'])})"
                cpu = "-" if r["machine_seconds"] is None else f"{r['machine_seconds']:.0f}"
                label = f"{method} (frozen here: never trained)" if r.get("frozen") else method
                lines.append(
                    f"| {label} | {len(r['seeds'])} | {r['initial_mean']:.1f}{isd} | {r['accuracy_mean']:.1f} ± {sd} "
                    f"| {sk} | {r['rollouts_generated']:.0f} | {r['sequences_trained']:.0f} | {wall} | {cpu} |"
                )
            lines += [
                "",
                "| comparison a - b | overall Δ [95 % CI] | "
                + " | ".join(f"`{k}` Δ" for k in skills)
                + " | a reaches b's final accuracy: seeds, median rollouts and time (quiet seeds) as a share of b's |",
                "|---|---|" + "---|" * len(skills) + "---|",
            ]
            for name, c in data["comparisons"].items():
                sk = " | ".join(_fmt_ci(c["skills"][k]) if k in c["skills"] else "-" for k in skills)
                tta = _fmt_tta(c["time_to_accuracy"]) if "time_to_accuracy" in c else "-"
                label = name if c.get("pre_registered", True) else f"{name} (not pre-registered)"
                lines.append(f"| {label} | {_fmt_ci(c['overall'])} | {sk} | {tta} |")
            if data["time_to_accuracy"]:
                lines += [
                    "",
                    "| time to GSPOx2's final accuracy | seeds reaching it | median time ratio vs GSPOx2 (quiet seeds) "
                    "| median rollout ratio vs GSPOx2 | step reached, per seed |",
                    "|---|---|---|---|---|",
                ]
                for method, t in data["time_to_accuracy"].items():
                    ratio = "-" if t["ratio_median"] is None else f"{t['ratio_median']:.2f} ({t['timed']})"
                    rollouts = "-" if t["rollout_ratio_median"] is None else f"{t['rollout_ratio_median']:.2f}"
                    steps = ", ".join("-" if v["step"] is None else str(v["step"]) for v in t["per_seed"].values())
                    lines.append(
                        f"| {method} | {t['reached']} / {len(t['per_seed'])} | {ratio} | {rollouts} | {steps} |"
                    )
            fall = data["late_fall"]
            if fall["methods"]:
                status = "pre-registered as secondary" if bed in ROUND3_BEDS else "not pre-registered"
                lines += [
                    "",
                    f"| fall from the best evaluation to the final one (points; {status}) | mean | max | per seed |",
                    "|---|---|---|---|",
                ]
                for method, f in fall["methods"].items():
                    per = ", ".join(f"{v:.1f}" for v in f["per_seed"])
                    lines.append(f"| {method} | {f['mean']:.1f} | {f['max']:.1f} | {per} |")
                for name, c in fall["comparisons"].items():
                    lines.append(f"| {name} (paired, ablation falls further if > 0) | {_fmt_ci(c)} | | |")
            diag = ["foreign_ratio_p10", "foreign_ratio_p50", "foreign_ratio_p90", "foreign_clip_frac", "capability"]
            lines += ["", "| method | " + " | ".join(diag) + " |", "|---|" + "---|" * len(diag)]
            for method, r in rows.items():
                d = r["diagnostics"]
                lines.append(f"| {method} | " + " | ".join("-" if d[k] is None else f"{d[k]:.3f}" for k in diag) + " |")
            lines.append("")
    return "\n".join(lines) + "\n"


def _plot(cells: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(bed, agent) for bed, agents in cells.items() for agent in agents]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (bed, agent) in zip(axes[0], panels, strict=True):
        for method, seeds in cells[bed][agent].items():
            if method.startswith(f"hacpo_{ABLATION_MODE}_"):  # ablations: in the tables
                continue
            curves = [seeds[s]["curve"] for s in sorted(seeds)]
            n = min(len(c) for c in curves)
            ax.plot(
                [c[0] for c in curves[0][:n]],
                [100 * statistics.mean(c[i][1] for c in curves) for i in range(n)],
                marker="o",
                markersize=3,
                label=method,
            )
        ax.set(title=f"{bed}: {agent} (mean over seeds)", xlabel="step", ylabel="greedy accuracy %")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mean(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.mean(values) if values else None


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beds", nargs="+", default=["demo", "complement"], choices=list(BEDS),
                        help="round 2: demo complement (the default); round 3: gap")  # fmt: skip
    parser.add_argument("--methods", nargs="+", default=None, help="a subset of each bed's methods")
    parser.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    parser.add_argument("--set", dest="overrides", nargs="*", default=[], help="extra dotted overrides (not for grid)")
    parser.add_argument("--out", help="results directory (default: benchmarks/results/round2, round3 for its beds)")
    parser.add_argument("--calibrate", action="store_true", help="measure the ratio distributions, set the deltas")
    parser.add_argument("--aggregate-only", action="store_true")
    parser.add_argument(
        "--resummarize",
        action="store_true",
        help="rebuild every summary's per-agent part from its "
        "run directory (still on this machine), keeping its machine and seconds, then aggregate",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny agents, 2 steps: checks the script end to end")
    parser.add_argument(
        "--replay",
        type=int,
        metavar="SEED",
        help="check that this machine reproduces a committed run of SEED bit for bit (its warm-starts and first "
        "steps; method: the first of --methods, default HACPO) before running the rest of that seed's row here; "
        "exit status 1 when it does not",
    )
    parser.add_argument("--replay-steps", type=int, default=3, help="how many steps --replay trains (default 3)")
    args = parser.parse_args(argv)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    round3 = set(args.beds) <= set(ROUND3_BEDS)
    out = Path(args.out or ROOT / "benchmarks" / "results" / ("round3" if round3 else "round2"))
    grid = Grid(out, smoke=args.smoke, extra=args.overrides)
    command = "python benchmarks/evidence.py" + (" --beds gap" if round3 else "") + (" --smoke" if args.smoke else "")
    if args.replay is not None:
        records = [grid.replay(bed, args.replay, (args.methods or [None])[0], args.replay_steps) for bed in args.beds]
        for record in records:
            print(f"== replay {record['bed']} {record['method']} seed {record['seed']}, {record['steps']} steps, "
                  f"{record['compared']} values: {'IDENTICAL' if record['identical'] else 'DIFFERENT'}")  # fmt: skip
            for line in record["differences"][:20]:
                print(f"   {line}")
        return 0 if all(r["identical"] for r in records) else 1
    if args.calibrate:
        table = grid.calibrate(args.beds)
        print(json.dumps(table, indent=1))
        return 0
    if args.resummarize:
        from hacrl.config import load_config

        for path in sorted((out / "summaries").glob("*/*.json")):
            summary = json.loads(path.read_text())
            work = out / ".runs" / summary["bed"] / path.stem
            if not (work / "metrics.jsonl").is_file():
                print(f"== {path}: no run directory here, kept as it is")
                continue
            summary["agents"] = summarize(work, load_config(work / "config.yaml"))
            _write_json(path, summary)
    elif not args.aggregate_only:
        for seed in args.seeds:  # seed-major: one seed's whole row (its warm-starts and every method) at a time
            for bed in args.beds:
                ordered = bed in ROUND3_BEDS and not args.smoke  # the smoke keeps the fixed order (no 20 s checks)
                run_seed(grid, bed, seed, args.methods, machine_is_quiet if ordered else None)
    earlier = ROOT / "benchmarks" / "results" / "round2" / "evidence.json" if round3 and not args.smoke else None
    result = aggregate(out, command, earlier)
    print(f"{result['runs']} runs aggregated into {out / 'evidence.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
