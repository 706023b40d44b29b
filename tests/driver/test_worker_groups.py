"""An agent on two CPU ranks (`agents.<i>.devices: [cpu, cpu]`, gloo, FSDP2) through the trainer and the CLI:
sampling order, kill -9 of one rank and exact resume, resume across K, damaged sharded checkpoints."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
import torch
import yaml

from hacrl import faults
from hacrl.checkpoint import checkpoint_problems, latest_checkpoint
from hacrl.tools.cli import main
from tests.conftest import records, without_timings, write_config

TWO = ["cpu", "cpu"]


def _config(tiny_agents, tmp_path, name: str, devices=TWO, **sections):
    """The llama + qwen HACPO pair, qwen on `devices`, one torch thread per process (as the ranks have)."""
    sections.setdefault("trainer", {"steps": 3})
    sections.setdefault("runtime", {"torch_threads": 1})
    path = write_config(tmp_path / f"{name}.yaml", tiny_agents, ["llama", "qwen"], tmp_path / name, **sections)
    cfg = yaml.safe_load(path.read_text())
    if devices:
        cfg["agents"][1]["devices"] = devices
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def two_rank_run(tiny_agents, tmp_path_factory):
    """An uninterrupted 3-step run with qwen on two ranks, checkpointed every step: what the interrupted and
    resumed runs below start from or must reproduce."""
    root = tmp_path_factory.mktemp("two-ranks")
    assert main(["train", str(_config(tiny_agents, root, "full"))]) == 0
    return root / "full"


def _copy_until(run, step: int, to):
    """A copy of `run` as if it had stopped after checkpoint `step` (later checkpoints removed)."""
    import shutil

    shutil.copytree(run, to)
    for later in (to / "checkpoints").glob("step_*"):
        if int(later.name.split("_")[1]) > step:
            shutil.rmtree(later)
    return to


@pytest.mark.slow
def test_sampling_on_two_ranks_returns_every_prompt_times_g_once_in_one_workers_order(tiny_agents, tmp_path):
    """5 prompts x G = 3 over 2 ranks (3 + 2 prompts): 15 trajectories, prompt by prompt, and each one's source
    log-prob sum is the one-device model's log-prob of that text *under its own prompt* (so no response was
    attached to another prompt on the way back; checked where the text re-encodes to its sampled length). Then one
    prompt on two ranks: rank 1 samples nothing, the group returns G trajectories and learns from them (rank 1 runs
    zero-weight passes); and an error raised inside a rank reaches the caller as itself and stops the group."""
    from hacrl.agent.logprobs import TokenBatch, token_logprobs
    from hacrl.agent.worker import AgentWorker
    from hacrl.config import load_config
    from hacrl.driver.backends.ranks import LocalProcesses
    from hacrl.messages import LearnCall, SampleCall, WorkerSpec

    cfg = load_config(_config(tiny_agents, tmp_path, "run", devices=None))
    spec = WorkerSpec(0, cfg.agents[0], cfg.rollout, cfg.trainer, cfg.algorithm, torch_threads=1, num_agents=2)
    one = AgentWorker(spec)
    prompts = [[{"role": "user", "content": f"{a} + {a + 1} ="}] for a in range(5)]
    group = LocalProcesses(replace(spec, agent=replace(cfg.agents[0], devices=TWO)))
    try:
        trajectories = group.call("sample", (SampleCall(1, prompts, 3),), "sampling").trajectories
        sampled = group.call("sample", (SampleCall(2, prompts[:1], 4),), "sampling")
        assert [t.group for t in sampled.trajectories] == [0] * 4
        learned = group.call("learn", (LearnCall(2, [1.0, 0.0, 1.0, 0.0], [], [0.5, 0.5]),), "learning")
        assert learned.metrics["optimizer_steps"] == 1
        with pytest.raises(RuntimeError, match="learn.step 3. without sample.step 3. first"):
            group.call("learn", (LearnCall(3, [], [], [0.5, 0.5]),), "learning")
        assert group.processes == []  # stopped
    finally:
        group.close()
    assert [t.group for t in trajectories] == [g for g in range(5) for _ in range(3)]
    assert {t.source for t in trajectories} == {0}
    agent, checked = one.agent, 0
    for t in trajectories:
        prompt = agent.render_prompt(prompts[t.group])[0]
        response = agent.encode_response(t.text, finished=t.finish_reason == "eos")[0]
        if len(response) != t.source_num_tokens:  # a sampled special token (pad, unk) that decoding dropped
            continue
        checked += 1
        batch = TokenBatch.build([prompt], [response], agent.pad_id, "cpu")
        with torch.no_grad():
            expected = token_logprobs(agent.model, batch, agent.settings.temperature)[0][batch.response_mask[0]]
        assert t.source_logp_sum == pytest.approx(float(expected.sum()), rel=1e-5, abs=1e-5)
    assert checked >= 8, f"only {checked} of 15 responses re-encode to their sampled tokens"


@pytest.mark.slow
def test_kill_9_of_one_rank_stops_the_run_naming_it_and_the_run_resumes_exactly(tiny_agents, tmp_path, monkeypatch,
                                                                                 capsys, two_rank_run):  # fmt: skip
    """Rank 1 of qwen is killed (SIGKILL) in its 10th micro-batch (step 3): the driver stops with one message that
    names the agent and the rank; `--resume` from step 2's checkpoint ends with the uninterrupted run's numbers
    and weights, bit for bit."""
    from safetensors.torch import load_file

    cut = _config(tiny_agents, tmp_path, "cut")
    monkeypatch.setenv("HACRL_FAULTS", "update.micro_batch:10")
    monkeypatch.setenv("HACRL_FAULTS_RANK", "1")
    faults.reset()
    capsys.readouterr()
    assert main(["train", str(cut)]) == 2
    err = capsys.readouterr().err
    assert "rank 1 of agent 'qwen'" in err and "killed by SIGKILL" in err and "--resume" in err, err
    assert latest_checkpoint(tmp_path / "cut").name == "step_000002"
    monkeypatch.delenv("HACRL_FAULTS")
    faults.reset()
    assert main(["train", str(cut), "--resume"]) == 0
    assert without_timings(records(tmp_path / "cut")[-1]) == without_timings(records(two_rank_run)[-1])
    for name in ("llama", "qwen"):
        a = load_file(latest_checkpoint(two_rank_run) / "agents" / name / "model.safetensors")
        b = load_file(latest_checkpoint(tmp_path / "cut") / "agents" / name / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


@pytest.mark.slow
def test_a_stopped_rank_is_named_and_its_group_killed_at_the_calls_deadline(tiny_agents, tmp_path, monkeypatch,
                                                                           capsys):  # fmt: skip
    """Rank 1 of qwen stops (SIGSTOP) in its 10th micro-batch: rank 0 waits for it inside a collective and the run
    stalled forever. The driver names the stopped rank (not rank 0, silent too) within the learn call's deadline,
    kills the group and exits 2; the checkpoint of step 2 stays the newest (the kill-9 test resumes from such a
    stop)."""
    import time

    cut = _config(tiny_agents, tmp_path, "cut")
    monkeypatch.setenv("HACRL_FAULTS", "update.micro_batch:10:STOP")
    monkeypatch.setenv("HACRL_FAULTS_RANK", "1")
    faults.reset()
    capsys.readouterr()
    start = time.monotonic()
    assert main(["train", str(cut), "runtime.deadline.minimum=3", "runtime.deadline.factor=5"]) == 2
    assert time.monotonic() - start < 90
    err = capsys.readouterr().err
    assert "rank 1 of agent 'qwen'" in err and "did not answer within" in err and "while learning at step 3" in err
    assert "it is stopped (SIGSTOP" in err and "--resume" in err and "Traceback" not in err, err
    assert latest_checkpoint(tmp_path / "cut").name == "step_000002"


@pytest.mark.slow
def test_a_checkpoint_resumes_on_another_number_of_ranks(tiny_agents, tmp_path, capsys, two_rank_run):
    """K = 2 -> 1 (step 3) -> 2 (step 4): each time the optimizer state loads resharded, the run says it is no
    longer bit-identical, and it trains on."""
    _copy_until(two_rank_run, 2, tmp_path / "run")
    capsys.readouterr()
    for devices, steps in ((None, 3), (TWO, 4)):
        cfg = _config(tiny_agents, tmp_path, "run", devices=devices, trainer={"steps": steps})
        assert main(["train", str(cfg), "--resume"]) == 0
        assert "no longer bit-identical" in capsys.readouterr().err
        assert [r["step"] for r in records(tmp_path / "run") if "qwen/grad_norm" in r][-1] == steps
        assert checkpoint_problems(latest_checkpoint(tmp_path / "run")) == []


@pytest.mark.slow
def test_optimizer_state_moves_between_two_ranks_and_one_device_unchanged(tiny_agents, tmp_path, two_rank_run):
    """A K = 2 checkpoint's AdamW moments, loaded on one device, are the gathered shards; saved there and loaded on
    two ranks again, they are the same numbers."""
    from hacrl.agent.worker import AgentWorker
    from hacrl.config import load_config
    from hacrl.driver.backends.ranks import LocalProcesses
    from hacrl.messages import WorkerSpec

    cfg_path = _config(tiny_agents, tmp_path, "run")
    k2 = latest_checkpoint(two_rank_run)  # step 3: 3 x 4 optimizer steps
    cfg = load_config(cfg_path)
    qwen = cfg.agents[1]
    one_spec = WorkerSpec(1, replace(qwen, devices=None), cfg.rollout, cfg.trainer, cfg.algorithm,
                          weights_from=str(k2 / "agents" / "qwen"), torch_threads=1, num_agents=2)  # fmt: skip
    one = AgentWorker(one_spec)
    one.load(str(k2))
    state = one.agent.optimizer.state_dict()["state"]
    assert len(state) == len(list(one.agent.model.parameters())) and all(float(s["step"]) == 12 for s in state.values())
    k1 = tmp_path / "k1"
    one.save(str(k1))
    two_spec = WorkerSpec(1, qwen, cfg.rollout, cfg.trainer, cfg.algorithm, weights_from=str(k1 / "agents" / "qwen"),
                          torch_threads=1, num_agents=2)  # fmt: skip
    group = LocalProcesses(two_spec)
    try:
        group.call("load", (str(k1),), "loading")
        back = tmp_path / "back"
        group.call("save", (str(back),), "saving")
    finally:
        group.close()
    again = AgentWorker(one_spec)
    again.load(str(back))
    for i, s in again.agent.optimizer.state_dict()["state"].items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(s[key], state[i][key]), (i, key)


def test_a_damaged_sharded_optimizer_is_found_and_a_metadata_that_names_code_is_never_run(tmp_path):
    """`checkpoint_problems` names a missing shard; a `.metadata` pickle that names anything but the checkpoint's
    own record classes is refused before anything of it runs."""
    import os

    from hacrl.checkpoint import _sharded_problem, read_sharded_metadata

    directory = tmp_path / "qwen"
    import torch.distributed.checkpoint as dcp

    dcp.save({"w/exp_avg": torch.ones(3)}, checkpoint_id=str(directory))
    assert _sharded_problem(directory) is None
    assert "w/exp_avg" in read_sharded_metadata(directory).state_dict_metadata
    (directory / "__0_0.distcp").unlink()
    assert _sharded_problem(directory) == "__0_0.distcp missing"

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    (directory / ".metadata").write_bytes(pickle.dumps(Boom()))
    assert "not part of a checkpoint's metadata" in _sharded_problem(directory)
    assert not (tmp_path / "ran").exists()


def _from_a_terminal(cfg):
    """`hacrl train CFG` in a session of its own, with SIGINT as a terminal's foreground job has it (default, not
    blocked): a test process started in the background by a shell without job control (`.ci/run ... &`) ignores
    SIGINT, a child inherits that through exec, and Python then installs no KeyboardInterrupt handler over it."""
    import signal
    import subprocess
    import sys

    def default_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    return subprocess.Popen([sys.executable, "-m", "hacrl", "train", str(cfg)], start_new_session=True,
                            preexec_fn=default_sigint, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


@pytest.mark.slow
def test_ctrl_c_to_the_whole_process_group_stops_after_the_step_and_resumes_exactly(tiny_agents, tmp_path,
                                                                                     two_rank_run):  # fmt: skip
    """Ctrl-C in a terminal reaches the driver and both ranks: the ranks ignore it, the driver finishes its step,
    writes a checkpoint with them and stops (128 + SIGINT); `--resume` ends with the uninterrupted run's numbers."""
    import os
    import signal
    import time

    cfg = _config(tiny_agents, tmp_path, "cut", checkpoint={"every": 0})
    proc = _from_a_terminal(cfg)
    metrics = tmp_path / "cut" / "metrics.jsonl"
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline and not (metrics.is_file() and metrics.read_text()):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: every process of the foreground group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
    assert "stopped by SIGINT after step" in err and "Traceback" not in err, err[-2000:]
    assert main(["train", str(cfg), "--resume"]) == 0
    assert without_timings(records(tmp_path / "cut")[-1]) == without_timings(records(two_rank_run)[-1])


@pytest.mark.slow
def test_a_rank_killed_between_calls_is_named_at_the_next_call(tiny_agents, tmp_path):
    """Issue 61, 8: a rank killed while the group was idle made the next call a BrokenPipeError traceback; now it
    is the WorkerError that names the agent, the rank and how it died."""
    import os
    import signal

    from hacrl.config import load_config
    from hacrl.driver.backends.ranks import LocalProcesses
    from hacrl.errors import WorkerError
    from hacrl.messages import SampleCall, WorkerSpec

    cfg = load_config(_config(tiny_agents, tmp_path, "run", devices=None))
    spec = WorkerSpec(0, replace(cfg.agents[0], devices=TWO), cfg.rollout, cfg.trainer, cfg.algorithm,
                      torch_threads=1, num_agents=2)  # fmt: skip
    group = LocalProcesses(spec)
    try:
        victim = group.processes[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=10)
        prompts = [[{"role": "user", "content": "1 + 2 ="}]]
        with pytest.raises(WorkerError, match=r"rank 1 of agent 'llama' \(pid \d+\) died while sampling \(killed by "
                                              "SIGKILL\\). The latest checkpoint is intact"):  # fmt: skip
            group.call("sample", (SampleCall(1, prompts, 2),), "sampling")
        assert group.processes == []  # the other rank is stopped too
    finally:
        group.close()


@pytest.mark.slow
def test_ctrl_c_while_a_worker_group_starts_is_one_line(tiny_agents, tmp_path):
    """Issue 61, 16: Ctrl-C to the terminal's process group while the ranks were importing printed each rank's
    KeyboardInterrupt traceback before hacrl's message; the ranks now start with SIGINT ignored (the driver's is
    only held back), and the driver stops them at once. The ranks are forked by the driver's fork server: the
    Ctrl-C comes while they build their model."""
    import os
    import signal
    import time
    from pathlib import Path

    cfg = _config(tiny_agents, tmp_path, "cut")
    proc = _from_a_terminal(cfg)

    def children(pid: int) -> list[tuple[int, bytes]]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
                if entry.name.isdigit() and int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
                    found.append((int(entry.name), (entry / "cmdline").read_bytes()))
            except (OSError, ValueError, IndexError):
                pass
        return found

    def ranks() -> list[int]:
        # the ranks only: the fork server's children (the resource tracker is the driver's child too, and
        # counting it sent the Ctrl-C while the second rank was still being started, under load)
        servers = [pid for pid, cmdline in children(proc.pid) if b"multiprocessing.forkserver" in cmdline]
        return [pid for server in servers for pid, _ in children(server)]

    deadline = time.time() + 120
    while proc.poll() is None and len(ranks()) < 2 and time.time() < deadline:
        time.sleep(0.02)
    assert len(ranks()) == 2, "the two ranks never started"
    time.sleep(0.1)  # they are building their model now
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal does
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "hacrl: interrupted (Ctrl-C)" in err


@pytest.mark.slow
def test_the_fork_server_imports_nothing_that_touches_cuda():
    """Ranks and samplers are forked from a server that imported `ranks.PRELOAD`: a CUDA driver initialised there
    would be unusable in every process it forks, so importing them must call nothing of `torch.cuda` (checked in a
    fresh interpreter, where those imports run first)."""
    import subprocess
    import sys

    code = (
        "import torch, traceback\n"
        "calls = []\n"
        "for name in ('is_available', 'device_count', 'init', '_lazy_init', 'current_device', 'get_device_properties',"
        " 'get_device_capability', 'is_bf16_supported', 'mem_get_info', 'set_device'):\n"
        "    real = getattr(torch.cuda, name)\n"
        "    def record(*a, _real=real, _name=name, **k):\n"
        "        calls.append(_name + ': ' + ''.join(traceback.format_stack(limit=4)[:-1]))\n"
        "        return _real(*a, **k)\n"
        "    setattr(torch.cuda, name, record)\n"
        "from hacrl.driver.backends.ranks import PRELOAD\n"
        "import importlib\n"
        "for module in PRELOAD:\n"
        "    importlib.import_module(module)\n"
        "print(len(calls)); print(''.join(calls)[:3000])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == "0", done.stdout
