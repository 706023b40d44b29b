"""Fault injection: a run killed (SIGKILL) at seeded points of sampling, scoring, the update, a checkpoint write
and a metrics write, resumed each time, ends with the weights and metrics of an uninterrupted run; SIGTERM and
Ctrl-C finish the step, checkpoint and exit. The kill points are failpoints (`hacrl.faults`), so each lands
exactly where it says."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hacrl import faults
from hacrl.tools.cli import main
from tests import forked
from tests.conftest import records, same_numbers, same_weights, write_config

ROOT = Path(__file__).resolve().parents[2]


MARK = ("HACRL_TEST_FAULTS", str(os.getpid()))
"""In the environment of every trainer these tests start, so inherited by its scoring processes: scorers of other
hacrl runs on the same machine (a benchmark beside the suite) are never taken for this test's orphans."""


def _hacrl(args: list[str], faults_plan: str = "") -> subprocess.CompletedProcess:
    """`python -m hacrl ARGS` in a process of its own (forked from one that imported torch once: `tests.forked`)."""
    return forked.hacrl(args, {"HACRL_FAULTS": faults_plan, "OMP_NUM_THREADS": "2", MARK[0]: MARK[1]}, cwd=ROOT)


def _orphaned_scorers() -> list[int]:
    """Scoring processes of this test's trainers (they carry MARK) that outlived them (they must die with their
    trainer, even on SIGKILL)."""
    return _marked(lambda cmdline, comm: b"_worker_main" in cmdline)


def orphaned_workers() -> list[int]:
    """Rank and sampler processes of this test's trainers (named `hacrl:<agent>:<rank>` / `hacrl:<agent>:s`), and
    the fork servers they came from, that outlived their trainer."""
    return _marked(lambda cmdline, comm: comm.startswith(b"hacrl:") or b"multiprocessing.forkserver" in cmdline)


def _marked(which) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline, comm = (entry / "cmdline").read_bytes(), (entry / "comm").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if which(cmdline, comm) and "=".join(MARK).encode() in environ:
            found.append(int(entry.name))
    return found


# (failpoint plan, where the process dies); each resumes from the newest checkpoint the one before left
KILL_CHAIN = [
    ("sampling:3", "step 2: after the first agent sampled"),
    ("scoring:1", "step 2: after both agents were scored (one call)"),
    ("update.micro_batch:5", "step 2: half-way through the first learner's update"),
    ("checkpoint.agent:2", "step 2 logged; its checkpoint half-written"),
    ("metrics.write:1", "step 2: half of its metrics line written"),
    ("checkpoint.after_rename:2", "step 3 saved, before older checkpoints are pruned"),
]


@pytest.mark.slow
@pytest.mark.longest(34)
def test_kill_9_anywhere_then_resume_gives_the_uninterrupted_run(tiny_agents, tmp_path, reference):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 3})
    # what the process after each kill must say it found
    cleanup = {"checkpoint.agent:2": "an unfinished checkpoint left by an interrupted run",
               "metrics.write:1": "dropped its last line, cut off when the run stopped mid-write"}  # fmt: skip
    for i, (plan, where) in enumerate(KILL_CHAIN):
        done = _hacrl(["train", str(cfg), *(["--resume"] if i else [])], plan)
        assert done.returncode == -signal.SIGKILL, (plan, where, done.stderr[-2000:])
        if i:
            assert "taking over a stale lock" in done.stderr, (plan, done.stderr[-2000:])
            previous = KILL_CHAIN[i - 1][0]
            assert cleanup.get(previous, "") in done.stderr, (previous, done.stderr[-2000:])
        deadline = time.monotonic() + 10
        while _orphaned_scorers() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _orphaned_scorers() == [], f"scoring processes outlived the trainer killed at {where}"
        if plan == "checkpoint.agent:2":
            assert [p.name for p in (run / "checkpoints").iterdir() if ".tmp-" in p.name]
        if plan == "metrics.write:1":
            assert not (run / "metrics.jsonl").read_text().endswith("\n")
    final = _hacrl(["train", str(cfg), "--resume"])
    assert final.returncode == 0, final.stderr[-2000:]
    assert "resumed from" in final.stdout and "step_000003 at step 3" in final.stdout
    same_numbers(records(run), records(reference))
    same_weights(run, reference, 3)
    assert not [p for p in (run / "checkpoints").iterdir() if ".tmp" in p.name or ".damaged" in p.name]
    assert not (run / ".hacrl.lock").exists()


@pytest.mark.slow
def test_a_forked_run_past_its_time_limit_is_killed_and_reported(tiny_agents, tmp_path):
    """`tests.forked.hacrl` (the fault tests' processes) behaves as subprocess.run does at its timeout: the run is
    killed, TimeoutExpired carries what it wrote, and the next run takes its run directory over."""
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 3})
    with pytest.raises(subprocess.TimeoutExpired) as stopped:
        forked.hacrl(["train", str(cfg)], {"HACRL_FAULTS": "", MARK[0]: MARK[1]}, cwd=ROOT, timeout=0.5)
    assert stopped.value.timeout == 0.5 and isinstance(stopped.value.stderr, str)
    deadline = time.monotonic() + 10
    while _orphaned_scorers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _orphaned_scorers() == []
    done = _hacrl(["train", str(cfg), "--resume"])
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_a_full_disk_at_the_runs_end_with_a_sampler_process_exits(tiny_agents, tmp_path):
    """The disk fills as the run closes its metrics (its last writes) while an agent has a sampler process: one
    paragraph and exit 2. The process used to print it and never exit: the sampler was left running, and at the
    interpreter's exit multiprocessing sent it SIGTERM, which it ignores, then joined it forever."""
    import yaml

    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 1, "lag": 1})
    data = yaml.safe_load(cfg.read_text())
    data["agents"][1]["sampler_devices"] = ["cpu"]
    cfg.write_text(yaml.safe_dump(data))
    env = {"HACRL_FAULTS": "logger.close:1:ENOSPC", "OMP_NUM_THREADS": "2", MARK[0]: MARK[1]}
    done = forked.hacrl(["train", str(cfg)], env, cwd=ROOT, timeout=120)  # TimeoutExpired: the hang
    assert done.returncode == 2, done.stderr[-2000:]
    assert "No space left on device" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "leaked semaphore" not in done.stderr  # a killed sampler's progress-bar lock (tqdm's) no longer leaks


@pytest.mark.slow
def test_sigterm_mid_step_finishes_the_step_checkpoints_and_resumes_exactly(tiny_agents, tmp_path, reference):
    run = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 3}, checkpoint={"every": 0}
    )
    stopped = _hacrl(["train", str(cfg)], "update.micro_batch:3:TERM")
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    assert "SIGTERM received: finishing step 1, then writing a checkpoint" in stopped.stdout + stopped.stderr
    assert "stopped by SIGTERM after step 1 of 3; wrote checkpoint" in stopped.stderr
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]  # though checkpoint.every=0
    resumed = _hacrl(["train", str(cfg), "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    same_numbers(records(run), records(reference))
    same_weights(run, reference, 3)


@pytest.mark.slow
def test_ctrl_c_mid_step_stops_after_the_step_with_a_checkpoint(tiny_agents, tmp_path, reference, monkeypatch, capsys):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 3})
    monkeypatch.setenv("HACRL_FAULTS", "update.optimizer:9:INT")  # in step 2 (8 optimizer steps per step)
    faults.reset()
    try:
        assert main(["train", str(cfg)]) == 128 + signal.SIGINT
    finally:
        monkeypatch.delenv("HACRL_FAULTS")
        faults.reset()
    assert "stopped by SIGINT after step 2 of 3" in capsys.readouterr().err
    assert main(["train", str(cfg), "--resume"]) == 0
    same_numbers(records(run), records(reference))
    same_weights(run, reference, 3)


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["TERM", "INT"])
def test_a_second_signal_stops_at_once_without_a_traceback(sig, tiny_agents, tmp_path):
    """The first SIGTERM / Ctrl-C asks for a checkpoint after the step; a second one, mid-step, stops at once (a
    run used to survive two SIGTERMs for minutes; a second Ctrl-C printed a KeyboardInterrupt traceback). The
    newest checkpoint stays intact and the run resumes."""
    run = tmp_path / "run"
    every = 1 if sig == "TERM" else 0  # INT: a run without a checkpoint yet (issue 61, 18: the message said "intact")
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 3},
                       checkpoint={"every": every})  # fmt: skip
    # step 2 of 3 (16 micro-batches and 8 optimizer steps a step): the first signal after its 3rd micro-batch, the
    # second after the optimizer step that follows
    stopped = _hacrl(["train", str(cfg)], f"update.micro_batch:19:{sig},update.optimizer:10:{sig}")
    signum = getattr(signal, f"SIG{sig}")
    assert stopped.returncode == 128 + signum, stopped.stderr[-2000:]
    assert f"stopped at once by a second SIG{sig} during step 2, without a checkpoint" in stopped.stderr
    assert "Traceback" not in stopped.stderr and "KeyboardInterrupt" not in stopped.stderr
    if sig == "INT":
        assert "the run has no checkpoint yet: `hacrl train <config> --resume` starts it again from step 0" in (
            stopped.stderr
        )
        assert not list(run.glob("checkpoints/step_*"))
        return
    assert "the newest checkpoint, step_000001, is intact" in stopped.stderr
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]
    resumed = _hacrl(["train", str(cfg), "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
