"""A chaos soak (issue 71, part 4): one run, a seeded schedule of faults, resumed after each as a user would, until
it finishes; then every logged number and every final weight against the same run left alone.

    python benchmarks/chaos.py                   # seed 0: 50 faults over a 1,000-step run (~40 min on 2 cores)
    python benchmarks/chaos.py --seed 7 --faults 20
    python benchmarks/chaos.py --faults 3 --steps 6   # a smoke run
    python benchmarks/chaos.py --trainer control --faults 20 --name chaos-control   # the control trainer

The run: the tests' two tiny agents (Llama on characters, Qwen2 on a BPE), HACPO at `trainer.lag=1`, `llama` with
a sampler process of its own, `qwen` a worker group of two gloo ranks, a checkpoint every step, `runtime.deadline`
with a `minimum` of 10 s (the defaults' 300 s would make a deadline fault cost five minutes; the soak checks that no
fault needs anything but `--resume`). The faults, drawn from the seed, each at a random moment: one in five 1-8 s
after the attempt started (in its start-up, or wherever it is by then), the others 0-1.5 s (a few steps) after the
attempt's first step:

    kill-driver     kill -9 of the trainer
    kill-rank       kill -9 of one of qwen's two rank processes
    kill-sampler    kill -9 of llama's sampler process
    kill-scorer     kill -9 of a scoring process (the process running the reward function, never its keeper): the run
                    replaces it and goes on when it was idle, and stops naming it when it was scoring
    term            SIGTERM to the trainer (it finishes the step, checkpoints and stops)
    stop-cont       SIGSTOP to one of the run's processes for 1-4 s, then SIGCONT (the run goes on)
    stop-deadline   SIGSTOP to a rank or the sampler until the run names it at its call's deadline, kills it and
                    stops (the deadline: at least 10 s, 10 x the slowest earlier answer of the call's kind; a worker
                    still stopped and unnamed after 120 s is a HANG)
    disk-full       the run directory's file system filled for 1-3 s (a tmpfs of its own; root only, else skipped)

`--trainer control`: `hacrl control` on the robot arms (configs/reach.yaml at a small size), HACPO across the two arms
through a learned mapping, with experience buffers (`sharing.replay`), a checkpoint every step: one process, so its
faults are kill-driver, term, stop-cont (of the trainer) and disk-full.

After each fault the trainer either goes on (an idle scorer, stop-cont, a disk that cleared before anything was
written), which it must show by a new step within 120 s, or exits within 120 s; either way past that is a HANG, a
failure (the attempt is killed and the run resumed). Then `hacrl train CONFIG --resume` starts it again (timed: its
start to its first new step). The table prints each fault, the process it hit, where it landed (the step the run
was in), how that attempt ended (exit status and its one-line message) and the resume's seconds; the verdict
compares the run's metrics (every value but the timings: `time/...` and throughput keys) and final weights with an
uninterrupted run of the same config, and looks for any process of the soak left behind. The run directory is kept
(`benchmarks/results/.runs/chaos/<name>/run`: its metrics, config and final checkpoint) and the JSON carries each
step's values' digest for both runs, so the comparison can be checked again.
Writes benchmarks/results/<name>.md and <name>.json (`--name`, default chaos).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRATCH = HERE / "results" / ".runs" / "chaos"
MARK = "HACRL_CHAOS_SOAK"
KINDS = ("kill-driver", "kill-rank", "kill-sampler", "kill-scorer", "term", "stop-cont", "stop-deadline", "disk-full")
CONTROL_KINDS = ("kill-driver", "term", "stop-cont", "disk-full")
DEADLINE = {"first_call": 300.0, "factor": 10.0, "minimum": 10.0}
"""The soak's `runtime.deadline`: a later call's deadline is at least 10 s (the defaults' 300 s would make each
stop-deadline fault cost five minutes), more than any stop-cont (1-4 s)."""
ENDING = ("kill-driver", "kill-rank", "kill-sampler", "term", "stop-deadline")
"""Faults after which the attempt must exit (the others: it must go on, or exit, within `PATIENCE`)."""
PATIENCE = 120.0
"""Seconds an attempt has, after a fault, to exit (or, where it may go on, to make a new step): past it, a hang."""


def build(work: Path, steps: int) -> Path:
    """The agents (as tests/conftest.py builds them) and the soak's config."""
    import yaml

    sys.path.insert(0, str(ROOT))
    from tests.conftest import ALPHABET, TASK, sum_corpus

    from hacrl.tools.testbed.models import bpe_tokenizer, char_tokenizer, save_agent, tiny_model

    agents = work / "agents"
    if not (agents / "qwen" / "config.json").is_file():
        char, bpe = char_tokenizer(ALPHABET), bpe_tokenizer(sum_corpus(), 80)
        save_agent(tiny_model("llama", char, hidden=32, layers=2, heads=2, kv_heads=1, seed=1), char, agents / "llama")
        save_agent(tiny_model("qwen2", bpe, hidden=48, layers=2, heads=4, kv_heads=2, seed=2), bpe, agents / "qwen")
    config = {
        "agents": [{"name": "llama", "model": str(agents / "llama"), "lr": 3e-3, "sampler_devices": ["cpu"]},
                   {"name": "qwen", "model": str(agents / "qwen"), "lr": 3e-3, "devices": ["cpu", "cpu"]}],
        "algorithm": {"name": "hacpo"},
        "rollout": {"group_size": 4, "max_new_tokens": 6, "max_prompt_tokens": 96},
        "data": {**TASK, "train_size": 256, "eval_size": 8, "heldout_size": 8},
        "scoring": {"function": "tests.reward_fixtures:digits"},
        "trainer": {"steps": steps, "lag": 1, "prompts_per_step": 2, "mini_batch_size": 4, "micro_batch_size": 2},
        "eval": {"at_start": False, "every": 0},
        "logging": {"console": False, "tensorboard": False},
        "checkpoint": {"every": 1, "keep_last": 2},
        "runtime": {"torch_threads": 1, "deadline": DEADLINE},
    }  # fmt: skip
    path = work / "chaos.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def build_control(work: Path, steps: int) -> Path:
    """The control soak's config: configs/reach.yaml, small, HACPO through a learned mapping, with buffers."""
    import yaml

    config = yaml.safe_load((ROOT / "configs" / "reach.yaml").read_text())
    config["algorithm"] = {"name": "hacpo", "delta": 0.65}
    config["mapping"] = {"default": "learned", "fit_steps": 5, "batch": 64}
    config["sharing"] = {"replay": {"steps": 2, "groups": 2}}
    config["env"]["max_cycles"] = 10
    config["trainer"].update(steps=steps, initial_states_per_step=4, group_size=4, mini_batch_size=16)
    config["eval"] = {"every": 0, "initial_states": 8, "at_start": False}
    config["checkpoint"] = {"every": 1, "keep_last": 2}
    config["logging"] = {"console": False, "tensorboard": False}
    path = work / "chaos.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


COMMAND = {"llm": "train", "control": "control"}
"""`--trainer` -> the hacrl command that runs it."""


def hacrl(config: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    """`hacrl train` (or `hacrl control`, by the config) in a session of its own (a signal to it reaches no one
    else), stderr kept in a file beside."""
    env = {**os.environ, MARK: "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    log = open(config.with_name(f"attempt-{time.time_ns()}.err"), "w")  # noqa: SIM115 - closed by _ended
    command = COMMAND["control" if "policies" in config.read_text() else "llm"]
    process = subprocess.Popen([sys.executable, "-m", "hacrl", command, str(config), f"trainer.output_dir={run_dir}",
                                *extra], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log,
                               start_new_session=True)  # fmt: skip
    process.log = log
    return process


def steps_logged(run_dir: Path) -> int:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = []
    for line in lines:
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass
    return max(steps, default=0)


def soak_processes() -> dict[int, tuple[str, int]]:
    """pid -> (name, parent) of every process carrying the soak's mark."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{MARK}=1".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
            comm = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat[stat.rfind(")") + 2 :].split()[1])
        found[int(entry.name)] = ("scoring" if b"_worker_main" in cmdline else comm, parent)
    # a scoring process is forked by its keeper, which the trainer started: both carry `_worker_main`
    return {pid: ("scorer" if found.get(parent, ("",))[0] == "scoring" else "keeper", parent) if name == "scoring"
            else (name, parent) for pid, (name, parent) in found.items()}  # fmt: skip


def target(kind: str, driver: int, rng: random.Random) -> int | None:
    """The process a fault of `kind` hits (None: none of that kind alive now)."""
    procs = soak_processes()
    if kind == "disk-full":  # the run directory's file system, not a process
        return None
    if kind in ("kill-driver", "term"):
        return driver
    if kind == "stop-deadline":  # a worker the driver calls with a deadline
        pool = [p for p, (n, _) in procs.items() if n.startswith("hacrl:qwen:") or n == "hacrl:llama:s"]
    elif kind == "kill-rank":
        pool = [p for p, (n, _) in procs.items() if n.startswith("hacrl:qwen:")]
    elif kind == "kill-sampler":
        pool = [p for p, (n, _) in procs.items() if n == "hacrl:llama:s"]
    elif kind == "kill-scorer":
        pool = [p for p, (n, _) in procs.items() if n == "scorer"]
    else:  # stop-cont: any process of the run
        pool = [p for p, (n, _) in procs.items() if n.startswith("hacrl") or p == driver]
    return rng.choice(sorted(pool)) if pool else None


class Disk:
    """The run directory on a tmpfs of its own (root only), to fill and empty."""

    def __init__(self, where: Path) -> None:
        self.where = where
        where.mkdir(parents=True, exist_ok=True)
        self.mounted = os.geteuid() == 0 and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True
        ).returncode == 0  # fmt: skip

    def fill(self, seconds: float) -> None:
        filler = self.where / "filler"
        try:
            with open(filler, "wb") as f:
                while True:
                    f.write(b"\0" * (1 << 20))
        except OSError:  # full (also when the open itself finds no room)
            pass
        time.sleep(seconds)
        filler.unlink(missing_ok=True)

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.where)], capture_output=True)


def kill_leftovers() -> list[str]:
    """Kill every process of a soak still running (an earlier soak stopped midway); what it found."""
    found = soak_processes()
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return [f"{pid} {name}" for pid, (name, _) in found.items()]


def reference(config: Path, work: Path) -> Path:
    run_dir = work / "reference"
    if not (run_dir / "metrics.jsonl").is_file() or steps_logged(run_dir) < _steps(config):
        shutil.rmtree(run_dir, ignore_errors=True)
        done = hacrl(config, run_dir)
        if done.wait() != 0:
            raise SystemExit(f"the reference run failed: {_ended(done.returncode, done)}")
    return run_dir


def _steps(config: Path) -> int:
    import yaml

    return yaml.safe_load(config.read_text())["trainer"]["steps"]


def wait_exit(process: subprocess.Popen, timeout: float) -> int | None:
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


class Attempt:
    """One `hacrl train` process of the soak: when it started, the step it started from, the table row whose fault
    it resumes after (its resume seconds are filled in at its first new step)."""

    def __init__(self, config: Path, run_dir: Path, resume: bool, after: dict | None) -> None:
        self.run_dir, self.after = run_dir, after
        self.process = hacrl(config, run_dir, *(["--resume"] if resume else []))
        self.started, self.from_step = time.monotonic(), steps_logged(run_dir)

    def stepped(self) -> bool:
        """Whether it has made a step (then its resume time is noted on the row it resumes after)."""
        if steps_logged(self.run_dir) <= self.from_step:
            return False
        if self.after is not None and self.after.get("resume_s") is None:
            self.after["resume_s"] = round(time.monotonic() - self.started, 1)
        return True

    def settle(self, ending: bool, step: int) -> int | str:
        """After a fault: its exit status once it exits; "went on" once it makes a step past `step` (where the fault
        need not end it); `HANG` when it does neither within `PATIENCE` (then its whole session is killed)."""
        end = time.monotonic() + PATIENCE
        while time.monotonic() < end:
            if self.process.poll() is not None:
                return self.process.returncode
            if not ending and steps_logged(self.run_dir) > step:
                return "went on"
            self.stepped()
            time.sleep(0.05)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.process.log.close()
        return HANG

    def wait(self, seconds: float, *, until_step: bool = False) -> int | None:
        """Its exit status if it ends within `seconds` (with `until_step`: first until it has made a step)."""
        while until_step and not self.stepped():
            if self.process.poll() is not None:
                return self.process.returncode
            time.sleep(0.1)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.process.poll() is not None:
                return self.process.returncode
            self.stepped()
            time.sleep(0.05)
        return self.process.poll()


def soak(config: Path, run_dir: Path, faults: int, seed: int, disk: Disk, kinds: tuple[str, ...] = KINDS) -> list[dict]:
    rng = random.Random(seed)
    kinds = [k for k in kinds if k != "disk-full" or disk.mounted]
    steps = _steps(config)
    table: list[dict] = []
    attempt, stuck, sent = Attempt(config, run_dir, False, None), 0, 0
    while True:
        if stuck >= 3:  # three attempts in a row that ended without a step: more than --resume is needed
            table.append({"fault": "-", "landed": f"step {steps_logged(run_dir) + 1}", "ended": "STUCK: three "
                          "resumes in a row made no step", "resume_s": None})  # fmt: skip
            break
        kind = rng.choice(kinds) if sent < faults else None
        in_start_up = kind is not None and rng.random() < 0.2
        if kind is None:  # every fault sent: the rest of the run
            code = attempt.wait(float("inf"))
        elif in_start_up:  # 1-8 s after the attempt started: in its start-up, or wherever it is by then
            code = attempt.wait(rng.uniform(1, 8))
        else:  # 0-1.5 s (a few steps) after its first step
            code = attempt.wait(rng.uniform(0, 1.5), until_step=True)
        now = steps_logged(run_dir)
        if code is not None:  # it ended before a fault was sent (finished, or stopped on its own)
            if code == 0 and now >= steps:
                if kind is not None:
                    table.append({"fault": f"{kind} (not sent: the run had finished)", "landed": f"step {steps}",
                                  "ended": "0", "resume_s": None})  # fmt: skip
                break
            row = {"fault": "(none: the attempt ended by itself)", "landed": f"step {now + 1}",
                   "ended": _ended(code, attempt.process), "resume_s": None}  # fmt: skip
            table.append(row)
            stuck = stuck + 1 if now == attempt.from_step else 0
            attempt = Attempt(config, run_dir, True, row)
            continue
        landed = f"step {now + 1}" if now > attempt.from_step else f"start-up (before step {now + 1})"
        pid = target(kind, attempt.process.pid, rng)
        hit = "trainer" if pid == attempt.process.pid else soak_processes().get(pid, ("?",))[0] if pid else ""
        hit = "its disk" if kind == "disk-full" else hit
        row = {"fault": kind, "landed": landed, "target": pid, "hit": hit, "resume_s": None}
        delivered = True
        if pid is None and kind != "disk-full":  # not counted: drawn again at the next moment
            row["fault"], delivered = f"{kind} (none of its processes now: not sent)", False
        elif kind in ("stop-cont", "stop-deadline"):
            os.kill(pid, signal.SIGSTOP)
            if kind == "stop-deadline":  # stopped until the driver names it at its call's deadline (max(10 s, 10 x
                # the slowest answer of that call's kind: after a stop-cont, tens of seconds), kills it and exits
                attempt.wait(PATIENCE)
            else:
                time.sleep(rng.uniform(1, 4))
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        elif kind == "disk-full":
            disk.fill(rng.uniform(1, 3))
        else:
            try:
                os.kill(pid, signal.SIGTERM if kind == "term" else signal.SIGKILL)
            except ProcessLookupError:
                row["fault"], delivered = f"{kind} (the process had just ended: not sent)", False
        sent += delivered
        ending = delivered and kind in ENDING
        code = attempt.settle(ending, now)
        table.append(row)
        if code == "went on":
            row["ended"] = "went on"
        else:
            row["ended"] = code if code == HANG else _ended(code, attempt.process)
            stuck = stuck + 1 if steps_logged(run_dir) == attempt.from_step and not ending else 0
            attempt = Attempt(config, run_dir, True, row)
        print(json.dumps(row), flush=True)
    return table


HANG = "HANG: neither exited nor made a step within 120 s of the fault (killed; a failure)"


def _ended(code: int, process: subprocess.Popen) -> str:
    """The attempt's exit status and its last line of ours ("hacrl: ...")."""
    process.log.close()
    lines = [x for x in Path(process.log.name).read_text(errors="replace").splitlines() if x.startswith("hacrl:")]
    message = lines[-1][:160] if lines and code > 0 else ""  # killed by a signal: it said nothing at its end
    return f"{code} {message}".strip()


def compare(run_dir: Path, reference_dir: Path) -> dict:
    """Every non-time logged value and every final weight, against the reference."""
    import torch
    from safetensors.torch import load_file

    from hacrl.files import sha256_of

    def numbers(d: Path) -> list[dict]:
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not timing(k)} for r in rows]

    a, b = numbers(run_dir), numbers(reference_dir)
    differing = [r["step"] for r, s in zip(a, b, strict=False) if r != s] + ([] if len(a) == len(b) else ["count"])
    final = sorted((run_dir / "checkpoints").glob("step_*"))[-1].name
    weights, digests = {}, {}
    for name in sorted(p.name for p in (run_dir / "checkpoints" / final / "agents").iterdir()):
        x = load_file(run_dir / "checkpoints" / final / "agents" / name / "model.safetensors")
        y = load_file(reference_dir / "checkpoints" / final / "agents" / name / "model.safetensors")
        weights[name] = x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
        digests[name] = sha256_of(run_dir / "checkpoints" / final / "agents" / name / "model.safetensors")
    return {"steps_differing": differing, "weights_equal": weights, "checkpoint": final, "compared_keys": len(a[-1]),
            "step_digests": {"run": [digest(r) for r in a], "reference": [digest(r) for r in b]},
            "weights_sha256": digests}  # fmt: skip


def timing(key: str) -> bool:
    """A key that measures time (it differs between two runs of the same numbers): as tests/conftest.py's
    `without_timings` (`reward_timeouts` is a count, compared)."""
    return key.startswith(("time/", "tokens_per_second")) or "/time/" in key


def digest(row: dict) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(row, sort_keys=True).encode()).hexdigest()[:16]


def markdown(result: dict) -> str:
    v = result["verdict"]
    metrics = "differ at steps " + str(v["steps_differing"]) if v["steps_differing"] else "every non-time value equal"
    weights = ", ".join(f"{k} {'equal' if same else 'DIFFER'}" for k, same in v["weights_equal"].items())
    disk = "on a tmpfs of its own" if result["disk"] else "skipped (needs root to mount a tmpfs)"
    sent = [r["fault"] for r in result["table"] if r["fault"] != "-" and "not sent" not in r["fault"]
            and not r["fault"].startswith("(none")]  # fmt: skip
    kinds = ", ".join(f"{k} {sent.count(k)}" for k in KINDS if k in sent)
    places = [r["landed"].split()[0] for r in result["table"] if r["fault"] in sent]
    lines = [
        f"# Chaos soak, seed {result['seed']}: {result['faults']} faults", "",
        f"`{result['command']}`; the run and the faults: benchmarks/chaos.py's docstring. Wall clock "
        f"{result['seconds'] / 60:.0f} min. Faults delivered: {len(sent)} ({kinds}); {places.count('start-up')} in "
        f"an attempt's start-up, {places.count('step')} in its steps.", "",
        "| # | fault | process hit | landed | that attempt ended | resume s (to its first new step) |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for i, row in enumerate(result["table"], 1):
        resume = "" if row.get("resume_s") is None else f"{row['resume_s']}"
        ended = row["ended"].replace("|", "/")
        if ended.startswith("-"):  # killed by a signal (exit -N): what the log said last was its start's notice
            ended = ended.split()[0] + f" (killed by {signal.Signals(-int(ended.split()[0])).name})"
        lines.append(f"| {i} | {row['fault']} | {row.get('hit', '')} | {row['landed']} | {ended} | {resume} |")
    hangs = sum(r["ended"].startswith("HANG") for r in result["table"])
    lines += [
        "", f"- verdict: {'PASSED' if passed(v) else 'FAILED'}",
        f"- metrics against the uninterrupted run ({v.get('compared_keys', '?')} values a step, every one but the "
        f"timings): {metrics}",
        f"- hangs (no exit and no step within {PATIENCE:.0f} s of a fault): {hangs}",
        f"- final weights ({v['checkpoint']}) against it: {weights}",
        f"- processes left behind: {v['left_behind'] or 'none'}",
        f"- faults that needed more than `--resume`: {v['needed_more'] or 'none'}",
        f"- disk-full faults: {disk}",
        "", "Rerun with another seed: `python benchmarks/chaos.py --seed N --name chaos-seedN`.",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--faults", type=int, default=50)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--name", default="chaos")
    parser.add_argument(
        "--trainer",
        choices=("llm", "control"),
        default="llm",
        help="llm: hacrl train at lag 1 (sampler, worker group); control: hacrl control (arms)",
    )
    parser.add_argument("--kinds", help="comma-separated fault kinds to draw from (default: every one)")
    parser.add_argument("--render", action="store_true", help="write the .md again from the .json")
    args = parser.parse_args(argv)
    if args.render:
        result = json.loads((HERE / "results" / f"{args.name}.json").read_text())
        (HERE / "results" / f"{args.name}.md").write_text(markdown(result))
        return 0
    work = SCRATCH / args.name / f"seed{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    if kill_leftovers():
        time.sleep(2)
    config = (build_control if args.trainer == "control" else build)(work, args.steps)
    ref = reference(config, work)
    disk = Disk(work / "disk")
    run_dir = disk.where / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.monotonic()
    try:
        kinds = CONTROL_KINDS if args.trainer == "control" else KINDS
        kinds = tuple(k for k in kinds if not args.kinds or k in args.kinds.split(","))
        table = soak(config, run_dir, args.faults, args.seed, disk, kinds)
        time.sleep(2)
        left = soak_processes()
        verdict = compare(run_dir, ref)
        verdict["left_behind"] = [f"{pid} {name}" for pid, (name, _) in left.items()]
        verdict["needed_more"] = [r["fault"] for r in table if r["ended"].startswith(("STUCK", "HANG"))]
        shown = " ".join(["python benchmarks/chaos.py", *(sys.argv[1:] if argv is None else argv)])
        result = {"seed": args.seed, "faults": args.faults, "trainer": args.trainer, "command": shown, "table": table,
                  "verdict": verdict, "disk": disk.mounted, "seconds": time.monotonic() - start}  # fmt: skip
        keep(run_dir, work / "run")
    finally:
        kill_leftovers()  # a soak stopped by an error leaves nothing running
        disk.close()
    out = HERE / "results"
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if passed(verdict) else 1


def passed(verdict: dict) -> bool:
    return (not verdict["steps_differing"] and all(verdict["weights_equal"].values()) and not verdict["left_behind"]
            and not verdict["needed_more"])  # fmt: skip


def keep(run_dir: Path, where: Path) -> None:
    """The soaked run's metrics, config and final checkpoint, off the tmpfs that is unmounted at the end."""
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    for name in ("metrics.jsonl", "config.yaml"):
        if (run_dir / name).is_file():
            shutil.copy2(run_dir / name, where / name)
    final = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    shutil.copytree(final, where / "checkpoints" / final.name)


if __name__ == "__main__":
    raise SystemExit(main())
