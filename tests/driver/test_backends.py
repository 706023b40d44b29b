"""The two backends give the same run: local workers in this process and Ray actors produce identical metrics and
weights, checkpoints move between them, and a worker that dies stops the driver with a clear error (local Ray on
the CPU; Ray is part of the dev extra)."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from hacrl.checkpoint import checkpoint_problems, latest_checkpoint
from hacrl.tools.cli import main
from tests.conftest import THREADS, records, same_numbers, same_weights, write_config

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    """One local Ray instance for the module (a run that finds Ray running uses it and leaves it running)."""
    import logging

    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


# HACPO with three agents makes every call that two make (the 2-agent case was dropped as the same calls again); GSPO
# shares no pool, so its learners take the call alone (`Trainer._submit_learns`), a path of its own.
CASES = {
    "gspo": (["llama", "qwen"], {"name": "gspo"}),
    "hacpo-3-agents": (["llama", "qwen", "tiny"], {"name": "hacpo"}),
    "hacpo-lag-1": (["llama", "qwen"], {"name": "hacpo"}),  # sample and learn calls at once on each actor
    # each agent's sampler an actor / a process: llama's takes the weights through the object store (shared memory
    # on the local backend), qwen's (two ranks) by a broadcast from rank 0
    "hacpo-lag-1-group-sampler": (["llama", "qwen"], {"name": "hacpo"}),
}
OVERRIDES = {
    "hacpo-lag-1-group-sampler": [
        "agents.0.sampler_devices=[cpu]",
        "agents.1.devices=[cpu, cpu]",
        "agents.1.sampler_devices=[cpu]",
        "agents.1.weight_sync=broadcast",
        "agents.0.num_cpus=0.5",
        "agents.1.num_cpus=0.5",
    ],  # five actors in the 4 CPUs of this module's Ray
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_local_and_ray_give_identical_metrics_and_weights(case, tiny_agents, tmp_path):
    names, algorithm = CASES[case]
    runs = {}
    for backend in ("local", "ray"):
        run = tmp_path / backend
        cfg = write_config(
            tmp_path / f"{backend}.yaml",
            tiny_agents,
            names,
            run,
            algorithm=algorithm,
            trainer={"steps": 3, "lag": 1 if "lag-1" in case else 0},
            checkpoint={"every": 0},
            runtime={"backend": backend, "torch_threads": THREADS},
            scoring={"function": "tests.reward_fixtures:digits"},  # graded rewards: every step learns
        )
        assert main(["train", str(cfg), *OVERRIDES.get(case, [])]) == 0
        runs[backend] = run
    same_numbers(records(runs["ray"]), records(runs["local"]))
    same_weights(runs["ray"], runs["local"], 3, names)
    assert records(runs["ray"])[-1][f"{names[0]}/optimizer_steps"] > 0
    for r in records(runs["ray"]):  # concurrent workers: each phase's wall time, less the agent's busy time
        for a in names:
            if "lag-1" in case:  # no barrier between an agent's sampling and update: the step's wall time
                sampling, update = r[f"{a}/time/busy_sampling"], r[f"{a}/time/busy_update"]
                own_sampler = f"agents.{names.index(a)}.sampler_devices=[cpu]" in OVERRIDES.get(case, [])
                busy = max(sampling, update) if own_sampler else sampling + update
                assert busy + r[f"{a}/time/wait_step"] == pytest.approx(r["time/sampling"] + r["time/update"])
                continue
            for phase in ("sampling", "update"):
                assert r[f"{a}/time/busy_{phase}"] + r[f"{a}/time/wait_{phase}"] == pytest.approx(r[f"time/{phase}"])
        assert 0 <= r["time/idle_frac"] < 1


@pytest.mark.slow
def test_a_worker_that_dies_stops_the_driver_naming_agent_and_step(tiny_agents, tmp_path, reference_run, capsys):
    """kill -9 of one actor's process after the first checkpoint: the driver stops within seconds with a message
    naming the agent and the step, the checkpoint stays valid, and --resume on the local backend ends with the
    uninterrupted run (a checkpoint of one backend resumes on the other; Ray resuming its own after a death: the
    two-rank placement test below)."""
    import hacrl.driver.trainer

    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 3})
    real_save = hacrl.driver.trainer.Trainer.save
    killed_at: list[float] = []

    def save_then_kill_qwen(trainer):
        path = real_save(trainer)
        if trainer.step == 1:
            pid = trainer.schedule.pids()[1]
            os.kill(pid, signal.SIGKILL)
            killed_at.append(time.monotonic())
        return path

    hacrl.driver.trainer.Trainer.save = save_then_kill_qwen
    try:
        assert main(["train", str(cfg), "runtime.backend=ray"]) == 2
    finally:
        hacrl.driver.trainer.Trainer.save = real_save
    stopped = time.monotonic() - killed_at[0]
    err = capsys.readouterr().err
    assert "run directory error" not in err and "Traceback" not in err
    assert "the worker of agent 'qwen' died while sampling at step 2" in err, err
    assert "The latest checkpoint is intact" in err
    assert stopped < 15, f"the driver took {stopped:.1f}s to notice"
    assert latest_checkpoint(run).name == "step_000001" and checkpoint_problems(latest_checkpoint(run)) == []
    assert main(["train", str(cfg), "--resume", "runtime.backend=local"]) == 0
    assert "not bit-identical" not in capsys.readouterr().err  # the backend is free to change
    same_numbers(records(run), records(reference_run))
    same_weights(run, reference_run, 3)


def ended(pid: int, born: str, within: float) -> bool:
    """Whether process `pid` (started at clock tick `born`) has ended within `within` seconds: gone, a zombie, or its
    pid reused by a later process (Ray starts workers all the time). A killed process's exit (its memory freed)
    takes a moment, in which it still reads as running."""
    until = time.monotonic() + within
    while True:
        try:
            state, *fields = open(f"/proc/{pid}/stat").read().split(") ")[1].split()
        except FileNotFoundError:
            return True
        if state == "Z" or fields[18] != born:
            return True
        if time.monotonic() > until:
            return False
        time.sleep(0.1)


@pytest.mark.slow
def test_a_stopped_actor_is_named_and_killed_at_the_calls_deadline(tiny_agents, tmp_path, capsys):
    """SIGSTOP of qwen's actor after the first checkpoint (a stuck device call's stand-in): the run used to wait
    forever. The driver names it within the sampling call's deadline (here 5 x its slowest earlier sampling, at
    least 3 s), kills it and exits 2; the checkpoint stays valid."""
    import hacrl.driver.trainer

    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 3})
    real_save = hacrl.driver.trainer.Trainer.save
    stopped: list[tuple[int, str, float]] = []

    def save_then_stop_qwen(trainer):
        path = real_save(trainer)
        if trainer.step == 1:
            pid = trainer.schedule.pids()[1]
            born = open(f"/proc/{pid}/stat").read().split(") ")[1].split()[19]
            os.kill(pid, signal.SIGSTOP)
            stopped.append((pid, born, time.monotonic()))
        return path

    hacrl.driver.trainer.Trainer.save = save_then_stop_qwen
    try:
        deadlines = ["runtime.deadline.minimum=3", "runtime.deadline.factor=5"]
        assert main(["train", str(cfg), "runtime.backend=ray", *deadlines]) == 2
    finally:
        hacrl.driver.trainer.Trainer.save = real_save
    pid, born, at = stopped[0]
    assert time.monotonic() - at < 30
    err = capsys.readouterr().err
    assert "the worker of agent 'qwen'" in err and "did not answer within" in err, err
    assert "while sampling at step 2; it is stopped (SIGSTOP" in err and "Traceback" not in err, err
    assert ended(pid, born, within=10), f"the stopped actor {pid} still lives"
    assert latest_checkpoint(run).name == "step_000001" and checkpoint_problems(latest_checkpoint(run)) == []


@pytest.mark.slow
def test_an_error_inside_a_worker_reaches_the_user_as_itself(tiny_agents, tmp_path, capsys):
    """A model directory without tokenizer files fails inside its Ray actor: the user reads hacrl's own error, not a
    RayTaskError's traceback (one agent: each actor's process costs seconds of imports, and one shows it)."""
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((tiny_agents["llama"] / "config.json").read_text())
    cfg = write_config(tmp_path / "c.yaml", {"llama": bare}, ["llama"], tmp_path / "run", algorithm={"name": "gspo"},
                       runtime={"backend": "ray"})  # fmt: skip
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "model error: agents.0.model:" in err and "holds no tokenizer files" in err and "Traceback" not in err


@pytest.mark.slow
def test_ray_asked_for_more_than_the_cluster_has_fails_before_any_model_loads(tiny_agents, tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run")
    assert main(["train", str(cfg), "runtime.backend=ray", "agents.0.num_cpus=3", "agents.1.num_cpus=3"]) == 2
    assert "ask Ray for 6 CPUs and 0 GPUs in all, the cluster has 4 and 0" in capsys.readouterr().err


@pytest.mark.slow
def test_ray_without_ray_installed_fails_with_what_to_install(tiny_agents, tmp_path, capsys, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real_find_spec(name))
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run")
    assert main(["train", str(cfg), "runtime.backend=ray"]) == 2
    assert 'pip install "hacrl[ray]"' in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_local_backend_and_the_core_never_import_ray(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; import hacrl.core, hacrl.driver.backends.local, hacrl.driver.trainer, hacrl.agent.worker; "
        "print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_ray_workers_sample_at_the_same_time(tiny_agents, tmp_path):
    """Both actors are inside `sample` at once: each reports when it entered and left, and the spans overlap."""
    from hacrl.config import load_config
    from hacrl.driver.backends import start_transport
    from hacrl.driver.trainer import Schedule
    from hacrl.messages import SampleCall, WorkerSpec

    cfg = load_config(write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run"))
    specs = [
        WorkerSpec(i, a, cfg.rollout, cfg.trainer, cfg.algorithm, torch_threads=1) for i, a in enumerate(cfg.agents)
    ]
    cfg.runtime.backend = "ray"
    schedule = Schedule(start_transport(cfg.runtime, specs), specs)
    try:
        prompts = [[{"role": "user", "content": "1 + 2 ="}]] * 64
        results = schedule.sample([SampleCall(1, prompts, 8)] * 2)
    finally:
        schedule.close()
    (start_a, end_a), (start_b, end_b) = (r.span for r in results)
    assert max(start_a, start_b) < min(end_a, end_b), "the two agents sampled one after the other"
    assert [len(r.trajectories) for r in results] == [512, 512]


@pytest.mark.slow
def test_ray_places_a_two_rank_agent_beside_a_one_device_agent(tiny_agents, tmp_path, capsys):
    """qwen on `devices: [cpu, cpu]` (two actors of one placement group, gloo), llama on one device. kill -9 of
    qwen's rank-1 actor after step 1's checkpoint stops the driver naming the agent and the rank; `--resume` on Ray
    ends with the numbers and weights of the local backend's two rank processes, bit for bit."""
    import yaml

    import hacrl.driver.trainer

    runs = {}
    real_save = hacrl.driver.trainer.Trainer.save

    def save_then_kill_rank_1(trainer):
        path = real_save(trainer)
        if trainer.step == 1:
            os.kill(trainer.schedule.pids()[2], signal.SIGKILL)  # llama, qwen rank 0, qwen rank 1
        return path

    for backend in ("local", "ray"):
        run = runs[backend] = tmp_path / backend
        cfg = write_config(tmp_path / f"{backend}.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 2},
                           runtime={"backend": backend, "torch_threads": 1})  # fmt: skip
        data = yaml.safe_load(cfg.read_text())
        data["agents"][1]["devices"] = ["cpu", "cpu"]
        cfg.write_text(yaml.safe_dump(data))
        if backend == "local":
            assert main(["train", str(cfg)]) == 0
            continue
        hacrl.driver.trainer.Trainer.save = save_then_kill_rank_1
        try:
            assert main(["train", str(cfg)]) == 2
        finally:
            hacrl.driver.trainer.Trainer.save = real_save
        out, err = capsys.readouterr()
        assert "qwen on node" in out and "(rank 1 of 2)" in out, out
        assert "the worker of agent 'qwen' (rank 1) died while sampling at step 2" in err, err
        assert main(["train", str(cfg), "--resume"]) == 0
    same_numbers(records(runs["ray"]), records(runs["local"]))
    same_weights(runs["ray"], runs["local"], 2)
    assert records(runs["ray"])[-1]["qwen/optimizer_steps"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mimalloc is preloaded on Linux")
def test_ray_actors_start_on_mimalloc_where_the_run_asks_for_it(tiny_agents, tmp_path, capsys, monkeypatch):
    """`runtime.host_memory: mimalloc` on Ray: each actor's process starts with the allocator preloaded (its
    `runtime_env`), which its worker requires; the driver's process needs none. Without the preload the worker stops
    the run with the fix (so the run that passes did run on it)."""
    from hacrl.agent import host_memory as allocator

    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run", trainer={"steps": 1},
                       runtime={"backend": "ray", "host_memory": "mimalloc"}, checkpoint={"every": 0})  # fmt: skip
    assert main(["train", str(cfg)]) == 0
    monkeypatch.setattr(allocator, "ray_options", lambda host_memory: {})
    assert main(["train", str(cfg), "trainer.output_dir=" + str(tmp_path / "bare")]) == 2
    assert "does not run on mimalloc" in capsys.readouterr().err
