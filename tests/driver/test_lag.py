"""The fixed-lag pipeline (`trainer.lag`, docs/design.md "The fixed-lag pipeline"): which weights sample which batch
depends on the step number only; the batches in flight are in every checkpoint, so kill -9 anywhere then `--resume`
ends with the uninterrupted run's numbers and weights; bad settings are refused naming the key."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch

from hacrl.tools.cli import main
from tests.conftest import fails_cleanly, records, same_numbers, same_weights, write_config
from tests.driver.test_faults import _hacrl, orphaned_workers

LAG = {"steps": 3, "lag": 1}
GRADED = {"function": "tests.reward_fixtures:digits"}  # graded rewards: every step learns


@pytest.fixture(scope="module")
def lag_reference(tiny_agents, tmp_path_factory):
    """An uninterrupted 3-step lag-1 HACPO run of llama + qwen, checkpointed every step."""
    root = tmp_path_factory.mktemp("lag")
    run = root / "run"
    cfg = write_config(root / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer=LAG, scoring=GRADED,
                       checkpoint={"every": 1, "keep_last": 3})  # fmt: skip
    assert main(["train", str(cfg)]) == 0
    return run


def test_each_batch_is_sampled_by_the_weights_after_update_s_minus_2(tiny_agents, lag_reference):
    """lag 1: batch 3 waits in step 2's checkpoint with the log-probs of the weights that sampled it, which are
    step 1's weights (not step 2's); step 1 trains batch 1 sampled by the weights it starts from (weight exactly 1)."""
    from transformers import AutoModelForCausalLM

    from hacrl.agent.logprobs import TokenBatch, token_logprobs
    from hacrl.inflight import read_pending

    (batch,) = read_pending(lag_reference / "checkpoints" / "step_000002", 2, 1, ["llama", "qwen"])
    assert batch.step == 3
    rollout = batch.sampled[1].rollout  # qwen's
    assert rollout.step == 3 and len(rollout.response_ids) == 2 * 4
    tb = TokenBatch.build(
        [rollout.prompt_ids[t.group] for t in rollout.trajectories], rollout.response_ids, 0, torch.device("cpu")
    )
    stored = torch.cat([torch.tensor(x) for x in rollout.behaviour_logp])

    def under(step: int) -> torch.Tensor:
        path = lag_reference / "checkpoints" / f"step_{step:06d}" / "agents" / "qwen"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        with torch.no_grad():
            logp = token_logprobs(model, tb, 1.0)
        return torch.cat([logp[i][tb.response_mask[i]] for i in range(len(rollout.response_ids))])

    assert torch.allclose(under(1), stored, atol=1e-5)
    assert not torch.allclose(under(2), stored, atol=1e-3)
    steps = records(lag_reference)
    # proximal = behaviour up to float rounding (the first mini-batch's from the training forward)
    assert steps[0]["qwen/behaviour_weight_mean"] == pytest.approx(1.0, abs=1e-6)
    assert all(r["llama/behaviour_weight_mean"] != 1.0 for r in steps[1:])


# (failpoint plan, where the process dies); each resumes from the newest checkpoint the one before left
LAG_KILLS = [
    ("sampling:3", "step 1: batch 2 half-sampled (batch 1 is the fill)"),
    ("scoring:3", "step 2: batch 3 scored while the learners learn on batch 2"),
    ("update.micro_batch:3", "step 2: half-way through the first learner's update, batch 3 sampled"),
    ("checkpoint.agent:2", "step 2 logged; its checkpoint half-written"),
]


@pytest.mark.slow
def test_kill_9_anywhere_at_lag_1_then_resume_gives_the_uninterrupted_run(tiny_agents, tmp_path, lag_reference):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer=LAG, scoring=GRADED)
    for i, (plan, where) in enumerate(LAG_KILLS):
        done = _hacrl(["train", str(cfg), *(["--resume"] if i else [])], plan)
        assert done.returncode == -signal.SIGKILL, (plan, where, done.stderr[-2000:])
    final = _hacrl(["train", str(cfg), "--resume"])
    assert final.returncode == 0, final.stderr[-2000:]
    same_numbers(records(run), records(lag_reference))
    same_weights(run, lag_reference, 3)


def test_a_resume_with_another_lag_is_refused_and_a_lag_run_needs_its_batches(tiny_agents, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 1, "lag": 1})
    assert main(["train", str(cfg)]) == 0
    fails_cleanly(capsys, ["train", str(cfg), "--resume", "trainer.steps=2", "trainer.lag=2"], "trainer.lag")
    (run / "checkpoints" / "step_000001" / "pending.pt").unlink()
    fails_cleanly(capsys, ["train", str(cfg), "--resume", "trainer.steps=2", "checkpoint.verify_digests=false"],
                  "pending.pt")  # fmt: skip


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.lag=-1", "trainer.lag must be an integer in [0, 16]"),
        ("trainer.lag=true", "trainer.lag"),
        ("algorithm.behaviour_cap=0.5", "behaviour_cap must be >= 1"),
    ],
)
def test_bad_lag_settings_are_refused(tiny_agents, tmp_path, capsys, override, expected):
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run")
    fails_cleanly(capsys, ["train", str(cfg), override], expected)


def test_grpo_with_lag_is_refused(tiny_agents, tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama"], tmp_path / "run", algorithm={"name": "grpo"})
    fails_cleanly(capsys, ["train", str(cfg), "trainer.lag=1"], "trainer.lag=1", "grpo", "no correction")


# -- a sampler of its own (agents.<i>.sampler_devices) -------------------------------------------------------------


def _with_samplers(cfg, agents: list[int]) -> None:
    import yaml

    data = yaml.safe_load(cfg.read_text())
    for i in agents:
        data["agents"][i]["sampler_devices"] = ["cpu"]
    cfg.write_text(yaml.safe_dump(data))


def test_the_shared_memory_link_hands_over_whole_weights_and_refuses_half_written_ones():
    from hacrl.agent.weightsync import SharedMemoryLink
    from hacrl.errors import WorkerError

    learner, sampler = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    link = SharedMemoryLink(learner, "qwen")
    with pytest.raises(WorkerError, match="needs the weights after update 1, and it holds no complete"):
        link.receive(sampler, 1)
    link.send(learner, 1)
    link.receive(sampler, 1)
    assert all(torch.equal(a, b) for a, b in zip(learner.parameters(), sampler.parameters(), strict=True))
    with pytest.raises(WorkerError, match="it holds those after update 1"):
        link.receive(sampler, 3)  # slot 1 holds update 1, not 3
    link.stamps[0] = -1  # a send of update 2 that died after clearing its stamp
    with pytest.raises(WorkerError, match="no complete weights .* does not sample with them"):
        link.receive(sampler, 2)


def test_a_sampler_refuses_to_sample_with_other_weights_than_its_batch_needs():
    """Over a link whose ends meet at the step's end (Ray's handed copy, a broadcast), a sampler holds the weights
    the last complete transfer brought: a batch that needs others (a transfer that failed halfway, or never came) is
    refused, never sampled with the wrong weights."""
    from types import SimpleNamespace

    from hacrl.agent.sampling import SamplingRole
    from hacrl.agent.weightsync import HandedLink
    from hacrl.errors import WorkerError

    class Agent:
        def __init__(self) -> None:
            self.module = torch.nn.Linear(3, 2)

        def handed_over(self):
            return self.module

        def weights_changed(self) -> None:
            pass

    learner, sampler = Agent(), SamplingRole.__new__(SamplingRole)
    sampler.agent, sampler.name, sampler.version, sampler._sync_s = Agent(), "qwen", 0, 0.0
    sampler.spec = SimpleNamespace(agent=SimpleNamespace(frozen=False))
    sampler.attach(HandedLink(None, "qwen"))
    sampler.take(0)  # the starting weights: held
    with pytest.raises(WorkerError, match="needs the weights after update 1, and it holds those after update 0"):
        sampler.take(1)
    sampler.receive(1, HandedLink(None, "qwen").send(learner.module, 1))
    sampler.take(1)
    assert torch.equal(sampler.agent.module.weight, learner.module.weight)
    with pytest.raises(RuntimeError, match="the weights after update 2 were not sent"):
        sampler.receive(2, (1, dict(learner.module.named_parameters())))
    with pytest.raises(WorkerError, match="needs the weights after update 2, and it holds no complete weights"):
        sampler.take(2)


@pytest.mark.slow
def test_a_sampler_of_its_own_gives_the_same_run_and_its_death_is_resumable(tiny_agents, tmp_path, lag_reference,
                                                                            capsys, monkeypatch):  # fmt: skip
    """qwen samples in a process of its own while it learns: the numbers and weights of the run without it. Killed
    mid-sampling (kill -9 of the sampler process), the run stops naming it; --resume ends with the same run."""
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer=LAG, scoring=GRADED)
    _with_samplers(cfg, [1])
    monkeypatch.setenv("HACRL_FAULTS", "sampling:3")  # the sampler's 3rd batch: batch 3, in step 2
    monkeypatch.setenv("HACRL_FAULTS_RANK", "sampler")
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "the sampler of agent 'qwen'" in err and "died while sampling at step 3" in err and "--resume" in err, err
    monkeypatch.delenv("HACRL_FAULTS")
    assert main(["train", str(cfg), "--resume"]) == 0
    same_numbers(records(run), records(lag_reference))
    same_weights(run, lag_reference, 3)
    assert all(r["qwen/time/weight_sync"] > 0 for r in records(run)[1:])


@pytest.mark.slow
def test_the_sampler_computes_its_learners_proximal_pass_and_its_death_there_is_resumable(
    tiny_agents, tmp_path, lag_reference, capsys, monkeypatch
):
    """With a sampler of its own, the learner runs no log-prob pass at all (its sampler computes the proximal
    log-probs of the rows after its first mini-batch while it trains that mini-batch): the numbers and weights of
    the run without a sampler. A sampler killed in that pass stops the run naming it; --resume ends the same."""
    from hacrl.agent.sampling import SamplingRole

    passes = []
    real = SamplingRole.old_logprobs
    monkeypatch.setattr(SamplingRole, "old_logprobs", lambda self, s: passes.append(self.name) or real(self, s))
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer=LAG, scoring=GRADED)
    _with_samplers(cfg, [0, 1])
    monkeypatch.setenv("HACRL_FAULTS", "proximal:2")  # the proximal pass of update 2
    monkeypatch.setenv("HACRL_FAULTS_RANK", "sampler")
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "the sampler of agent 'llama'" in err and "died while computing proximal log-probs for step 2" in err
    monkeypatch.delenv("HACRL_FAULTS")
    assert main(["train", str(cfg), "--resume"]) == 0
    assert passes == []  # in this process (the learners'): none; the samplers' processes ran them
    same_numbers(records(run), records(lag_reference))
    same_weights(run, lag_reference, 3)


@pytest.mark.slow
def test_a_learner_killed_mid_weight_sync_resumes_exactly(tiny_agents, tmp_path, lag_reference):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer=LAG, scoring=GRADED)
    _with_samplers(cfg, [0, 1])
    done = _hacrl(["train", str(cfg)], "weight_sync:3")  # step 2, the first learner's write of its new weights
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    deadline = time.monotonic() + 10  # the samplers and their fork server die with the killed learner
    while orphaned_workers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert orphaned_workers() == []
    final = _hacrl(["train", str(cfg), "--resume"])
    assert final.returncode == 0, final.stderr[-2000:]
    same_numbers(records(run), records(lag_reference))
    same_weights(run, lag_reference, 3)


@pytest.mark.slow
def test_weights_broadcast_at_the_end_of_each_step_give_the_same_run_and_a_death_mid_transfer_is_named(
    tiny_agents, tmp_path, lag_reference, capsys, monkeypatch
):
    """agents.<i>.weight_sync=broadcast (gloo here; NCCL between GPUs): each learner sends its weights to its
    sampler in a group of their own at the end of every step, and the run is the one without samplers. A sampler
    killed mid-transfer (after the first tensor) stops the run naming it; --resume ends with the same run."""
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer=LAG, scoring=GRADED)
    _with_samplers(cfg, [0, 1])
    broadcast = ["agents.0.weight_sync=broadcast", "agents.1.weight_sync=broadcast"]
    monkeypatch.setenv("HACRL_FAULTS", "weight_sync:2")  # each sampler's 2nd transfer: the weights after update 2
    monkeypatch.setenv("HACRL_FAULTS_RANK", "sampler")
    assert main(["train", str(cfg), *broadcast]) == 2
    err = capsys.readouterr().err
    assert "the sampler of agent 'llama'" in err and "died while handing over the weights after update 2" in err, err
    monkeypatch.delenv("HACRL_FAULTS")
    assert main(["train", str(cfg), "--resume", *broadcast]) == 0
    same_numbers(records(run), records(lag_reference))
    same_weights(run, lag_reference, 3)
    assert all(r["qwen/time/weight_sync"] > 0 for r in records(run)[2:])  # the transfer of update 1 on


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["agents.0.sampler_devices=[cpu]"], "needs trainer.lag >= 1"),
        (["agents.0.sampler_devices=[cpu, cpu]", "trainer.lag=1"], "must name one device"),
        (["agents.0.sampler_devices=[gpu]", "trainer.lag=1"], "agents.0.sampler_devices.0"),
        (["agents.0.weight_sync=broadcast"], "agents.0.weight_sync=broadcast chooses how a sampler of its own"),
        (
            ["agents.0.sampler_devices=[cuda:1]", "trainer.lag=1", "agents.0.devices=[cuda:0, cuda:1]"],
            "is one of the learner's own GPUs (agents.0.devices)",
        ),  # fmt: skip
    ],
)
def test_bad_sampler_settings_are_refused(tiny_agents, tmp_path, capsys, overrides, expected):
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run")
    fails_cleanly(capsys, ["train", str(cfg), *overrides], expected)


def test_a_machine_without_shared_memory_for_the_weights_is_told_what_to_do(monkeypatch):
    from hacrl.agent.weightsync import SharedMemoryLink
    from hacrl.errors import ConfigError

    def refuse(self):
        raise RuntimeError("unable to write to file </torch_1_2>: No space left on device (28)")

    monkeypatch.setattr(torch.Tensor, "share_memory_", refuse)
    with pytest.raises(ConfigError, match=r"needs 0.00 GiB of shared memory .* --shm-size"):
        SharedMemoryLink(torch.nn.Linear(3, 2), "qwen")


@pytest.mark.slow
@pytest.mark.longest(31)
def test_samplers_of_a_worker_group_and_a_frozen_agent_give_the_run_without_them_and_resume_exactly(
    tiny_agents, tmp_path
):
    """lag 1, qwen on two gloo ranks (FSDP2) and llama frozen, each with a sampler of its own: qwen's rank 0 hands
    over the compute copy the ranks gather after each update and the sampler draws each rank's share from that
    rank's stream; llama's sampler never takes weights. Stopped one step early and resumed (each rank saves its
    share's stream), the run's numbers and weights are those of the same agents sampling for themselves; the frozen
    agent's answers are shared and qwen's stale rows weighted."""
    import yaml

    def config(run, samplers=True):
        path = write_config(tmp_path / f"{run.name}.yaml", tiny_agents, ["llama", "qwen"], run,
                            trainer={"steps": 3, "lag": 1}, scoring=GRADED, checkpoint={"every": 1})  # fmt: skip
        data = yaml.safe_load(path.read_text())
        data["agents"][0].update(frozen=True, **({"sampler_devices": ["cpu"]} if samplers else {}))
        data["agents"][1].update(devices=["cpu", "cpu"], **({"sampler_devices": ["cpu"]} if samplers else {}))
        path.write_text(yaml.safe_dump(data))
        return path

    reference, cut = tmp_path / "alone", tmp_path / "cut"
    assert main(["train", str(config(reference, samplers=False))]) == 0
    assert main(["train", str(config(cut)), "trainer.steps=2"]) == 0
    assert main(["train", str(config(cut)), "--resume"]) == 0
    same_numbers(records(cut), records(reference))
    same_weights(cut, reference, 3, ["qwen"])
    last = records(cut)[-1]
    assert last["qwen/shared_offered"] == 8 and "qwen/behaviour_weight_mean" in last
    assert "llama/optimizer_steps" not in last
    assert all(r["qwen/time/weight_sync"] > 0 for r in records(cut)[1:])


# -- liveness: a sampler that stops answering (issue 71, 1) ---------------------------------------------------------

QUICK_DEADLINES = ["runtime.deadline.minimum=3", "runtime.deadline.factor=5"]


def _stopped_children(parent: int) -> list[int]:
    """The processes below `parent`, at any depth, that are stopped (state T): a sampler is a child of the fork
    server, the driver's child."""
    from pathlib import Path

    states, below = {}, {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if entry.name.isdigit():
            states[int(entry.name)] = fields[0]
            below.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], list(below.get(parent, []))
    while todo:
        pid = todo.pop()
        found += [pid] if states[pid] == "T" else []
        todo += below.get(pid, [])
    return found


@pytest.mark.slow
def test_a_stopped_sampler_is_named_and_killed_at_its_deadline_and_the_run_resumes_exactly(
    tiny_agents, tmp_path, lag_reference, capsys, monkeypatch
):
    """qwen's sampler stops (SIGSTOP, the stand-in for a stuck device call) in its 3rd batch: the run stopped
    forever. Now the driver names it within the call's deadline (runtime.deadline: here 5 x the slowest earlier
    sampling, at least 3 s), kills it, exits 2, and --resume (here without the sampler) ends with the uninterrupted
    run."""
    import os
    import time

    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer=LAG, scoring=GRADED)
    _with_samplers(cfg, [1])
    monkeypatch.setenv("HACRL_FAULTS", "sampling:3:STOP")
    monkeypatch.setenv("HACRL_FAULTS_RANK", "sampler")
    start = time.monotonic()
    assert main(["train", str(cfg), *QUICK_DEADLINES]) == 2
    assert time.monotonic() - start < 60
    err = capsys.readouterr().err
    assert "the sampler of agent 'qwen'" in err and "did not answer within" in err, err
    assert "while sampling at step 3; it is stopped (SIGSTOP" in err and "runtime.deadline.factor" in err, err
    assert "--resume" in err and "Traceback" not in err
    assert _stopped_children(os.getpid()) == []  # killed, not left behind
    monkeypatch.delenv("HACRL_FAULTS")
    # resumed without the sampler: a sampler of its own samples what the learner would, so dropping (or adding) one
    # on resume keeps the run, and nothing says otherwise (it said 'no longer bit-identical')
    assert main(["train", str(cfg), "--resume", "agents.1.sampler_devices=null"]) == 0
    assert "bit" not in capsys.readouterr().err
    same_numbers(records(run), records(lag_reference))
    same_weights(run, lag_reference, 3)


@pytest.mark.slow
def test_a_second_sigterm_stops_at_once_while_a_sampler_is_stopped(tiny_agents, tmp_path, capsys, monkeypatch):
    """A stopped sampler (default deadlines: it would be called stuck only after minutes): the first SIGTERM asks
    for a stop after the step, which cannot end; the second stops the run at once (it waited 30 s for the stopped
    sampler to exit, which it never does), killing the sampler."""
    import os
    import threading
    import time

    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer=LAG, scoring=GRADED)
    _with_samplers(cfg, [1])
    monkeypatch.setenv("HACRL_FAULTS", "sampling:3:STOP")
    monkeypatch.setenv("HACRL_FAULTS_RANK", "sampler")
    second: list[float] = []

    def signal_twice_once_it_stops() -> None:
        deadline = time.monotonic() + 120
        while not _stopped_children(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)
        second.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_twice_once_it_stops, daemon=True).start()
    assert main(["train", str(cfg)]) == 128 + signal.SIGTERM
    assert time.monotonic() - second[0] < 10
    err = capsys.readouterr().err
    assert "stopped at once by a second SIGTERM" in err and "Traceback" not in err, err
    assert _stopped_children(os.getpid()) == []


@pytest.mark.slow
def test_a_driver_killed_while_its_sampler_is_stopped_takes_the_sampler_with_it(tiny_agents, tmp_path):
    """kill -9 of the driver while qwen's sampler is stopped (SIGSTOP: it reads nothing, so only the kernel can
    end it): the sampler and the fork server it came from are gone within seconds (the driver's death ends the
    server, whose death ends what it forked: PR_SET_PDEATHSIG), not left behind holding their memory. Both ignore
    SIGINT and SIGTERM."""
    import os
    import threading

    from tests import forked
    from tests.driver.test_faults import MARK, ROOT

    def stat(pid: int) -> tuple[str, int]:
        text = open(f"/proc/{pid}/stat").read()  # noqa: SIM115, PTH123
        state, ppid = text[text.rfind(")") + 2 :].split()[:2]
        return state, int(ppid)

    def ignored(pid: int) -> set[int]:
        mask = next(line for line in open(f"/proc/{pid}/status") if line.startswith("SigIgn:"))  # noqa: SIM115, PTH123
        return {sig for sig in (signal.SIGINT, signal.SIGTERM) if int(mask.split()[1], 16) >> (sig - 1) & 1}

    dispositions: dict[str, set[int]] = {}

    def kill_the_driver_once_the_sampler_stops() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for pid in orphaned_workers():
                try:
                    state, server = stat(pid)
                    if state == "T":
                        dispositions.update(sampler=ignored(pid), server=ignored(server))
                        os.kill(stat(server)[1], signal.SIGKILL)  # the server's parent: the driver
                        return
                except (OSError, ValueError, StopIteration):
                    pass
            time.sleep(0.1)

    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer=LAG, scoring=GRADED)
    _with_samplers(cfg, [1])
    threading.Thread(target=kill_the_driver_once_the_sampler_stops, daemon=True).start()
    env = {"HACRL_FAULTS": "sampling:3:STOP", "HACRL_FAULTS_RANK": "sampler", "OMP_NUM_THREADS": "2", MARK[0]: MARK[1]}
    done = forked.hacrl(["train", str(cfg)], env, cwd=ROOT, timeout=180)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    deadline = time.monotonic() + 10
    while orphaned_workers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert orphaned_workers() == [], "the stopped sampler or its fork server outlived the killed driver"
    # a SIGTERM or Ctrl-C to the whole process group reaches neither (the driver stops them after its step): the
    # server too, whose death would end every process it forked
    both = {signal.SIGINT, signal.SIGTERM}
    assert dispositions == {"sampler": both, "server": both}


# -- pending.pt's values are checked, not only its digest (issue 71, 2) ----------------------------------------------


def _edit_pending(run, step: int, edit) -> None:
    """`edit(state)` on a copy's pending.pt at `step`, state.json re-digested (what a hand edit can do)."""
    from tests.driver.test_untrusted_files import redigest

    checkpoint = run / "checkpoints" / f"step_{step:06d}"
    state = torch.load(checkpoint / "pending.pt", weights_only=True)
    edit(state)
    torch.save(state, checkpoint / "pending.pt")
    redigest(checkpoint)


def _answers(state, agent=1):
    return state["batches"][0]["agents"][agent]


PENDING_DAMAGE = {
    "token id past the vocabulary": (
        lambda s: _answers(s)["rollout"]["response_ids"][2].__setitem__(0, 10**6),
        "agent 'qwen''s answers in batch 3: answer 2 holds token id 1000000, outside the agent's vocabulary (0 .. 79",
    ),
    "NaN reward": (lambda s: _answers(s)["rewards"].__setitem__(1, float("nan")), "reward 1 is nan, not a finite"),
    "huge reward": (
        lambda s: _answers(s, 0)["rewards"].__setitem__(0, 1e30),
        "reward 0 is 1e+30, not a finite number in [0, 1] (algorithm.r_max)",
    ),  # fmt: skip
    "an answer missing": (lambda s: _answers(s)["trajectories"].pop(), "7 answers, the run samples 2 prompts x 4 = 8"),
    "positive log-prob": (lambda s: _answers(s)["rollout"]["behaviour"].__setitem__(0, 5.0), "not a finite log-prob"),
    "another step": (
        lambda s: s["batches"][0].__setitem__("step", 4),
        "holds batches [4], a step-2 checkpoint at trainer.lag=1 holds [3]",
    ),  # fmt: skip
    # issue 87.6: a NaN sum passed ('nobody else reads it'); the other agent's update then died with a traceback
    "NaN log-prob sum": (
        lambda s: _answers(s)["trajectories"][3].__setitem__(4, float("nan")),
        "answer 3: its log-prob sum nan is not a finite log-probability (<= 0)",
    ),  # fmt: skip
    # issue 87.13: a 12,000-token prompt trained silently
    "a prompt past max_prompt_tokens": (
        lambda s: _answers(s)["rollout"]["prompt_ids"].__setitem__(0, [1] * 12_000),
        "prompt 0 has 12000 tokens, past max_prompt_tokens=",
    ),  # fmt: skip
    # issue 87.14: the message ended on torch's advice to load the file with weights_only=False
    "an object that is not data": (
        lambda s: s.__setitem__("planted", Path("/")),
        "pending.pt cannot be read (UnpicklingError: it holds objects other than tensors and plain values (Unsupported "
        "global: GLOBAL pathlib.PosixPath was not an allowed global by default), which hacrl never unpickles",
    ),  # fmt: skip
}


@pytest.mark.slow
def test_pending_values_past_what_the_run_allows_are_found_like_any_damage(lag_reference, tmp_path):
    """Each edit re-digested (so only the values tell): a token id of 10^6, a NaN or 1e30 reward, an answer missing,
    a positive log-prob, another step. Each was a traceback after 'resumed from step 2'; each is now a problem of
    the checkpoint, named, as a damaged file is."""
    import shutil

    from hacrl.checkpoint import checkpoint_problems

    for case, (edit, expected) in PENDING_DAMAGE.items():
        run = tmp_path / case.replace(" ", "-")
        shutil.copytree(lag_reference, run)
        _edit_pending(run, 2, edit)
        problems = checkpoint_problems(run / "checkpoints" / "step_000002")
        assert len(problems) == 1 and problems[0].startswith("pending.pt") and expected in problems[0], (
            case,
            problems,
        )
        assert "weights_only" not in problems[0] and "\x1b" not in problems[0]
    assert checkpoint_problems(lag_reference / "checkpoints" / "step_000002") == []


@pytest.mark.slow
def test_a_resume_moves_a_checkpoint_with_bad_pending_values_aside_and_falls_back(lag_reference, tmp_path, capsys):
    """A token id of 10^6 in step 2's pending.pt (re-digested): resume names it, keeps the checkpoint as
    step_000002.damaged and continues from step 1, ending with the uninterrupted run. The same with
    verify_digests=false and a pending.pt overwritten in place (it stopped the run, blaming runs without lag)."""
    import shutil

    edit, expected = PENDING_DAMAGE["token id past the vocabulary"]
    for case in ("values", "overwritten"):
        run = tmp_path / case.replace(" ", "-")
        shutil.copytree(lag_reference, run)
        shutil.rmtree(run / "checkpoints" / "step_000003")
        overrides = []
        if case == "values":
            _edit_pending(run, 2, edit)
        else:
            pending = run / "checkpoints" / "step_000002" / "pending.pt"
            data = pending.read_bytes()
            pending.write_bytes(data[:40] + bytes(200) + data[240:])  # the same size: only a digest would tell
            overrides = ["checkpoint.verify_digests=false"]
        capsys.readouterr()
        assert main(["train", str(run / "config.yaml"), f"trainer.output_dir={run}", "--resume", *overrides]) == 0
        err = capsys.readouterr().err
        assert "step_000002 is damaged: pending.pt" in err and "Moved to step_000002.damaged" in err, err
        assert expected in err if case == "values" else "pending.pt cannot be read" in err, err
        assert (run / "checkpoints" / "step_000002.damaged").is_dir()
        same_numbers(records(run), records(lag_reference))
        same_weights(run, lag_reference, 3)


@pytest.mark.slow
def test_a_sampler_that_dies_while_it_starts_says_nothing_was_written(tiny_agents, tmp_path, capsys, monkeypatch):
    """It said 'The latest checkpoint is intact' of a run that had none and no run directory."""
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer=LAG)
    _with_samplers(cfg, [1])
    monkeypatch.setenv("HACRL_FAULTS", "start:1")
    monkeypatch.setenv("HACRL_FAULTS_RANK", "sampler")
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "the sampler of agent 'qwen'" in err and "died while starting" in err, err
    assert "Nothing of the run was written: start it again with `hacrl train <config>`" in err, err
    assert "checkpoint is intact" not in err and not run.exists()


def test_a_lag_past_the_runs_steps_is_refused(tiny_agents, tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run")
    fails_cleanly(capsys, ["train", str(cfg), "trainer.lag=16", "trainer.steps=2"], "trainer.lag=16 samples 16 "
                  "batches ahead of a 2-step run: 18 batches sampled, 2 trained on")  # fmt: skip


@pytest.mark.slow
def test_a_non_strict_resume_at_another_lag_says_which_batches_in_flight_it_drops_or_samples(lag_reference, tmp_path,
                                                                                           capsys):  # fmt: skip
    """checkpoint.strict_resume=false lets the lag change (no longer bit-exact): lag 1 -> 0 drops the batch in flight
    (it was silently ignored), 1 -> 2 samples the missing one at the first step (it was refused, blaming
    state.json)."""
    import shutil

    for lag, said in ((0, "the ones for steps [3] are dropped (their prompts are never trained on) and each step "
                          "samples its own batch"),
                      (2, "at trainer.lag=2 the first step samples those for steps [4] with the checkpoint's "
                          "weights")):  # fmt: skip
        run = tmp_path / f"lag{lag}"
        shutil.copytree(lag_reference, run)
        shutil.rmtree(run / "checkpoints" / "step_000003")
        capsys.readouterr()
        argv = ["train", str(run / "config.yaml"), f"trainer.output_dir={run}", "--resume", f"trainer.lag={lag}",
                "checkpoint.strict_resume=false", "trainer.steps=3"]  # fmt: skip
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert said in err and "state.json" not in err, err
        assert [r["step"] for r in records(run)] == [1, 2, 3]


@pytest.mark.slow
def test_a_non_strict_resume_at_a_larger_lag_hands_its_sampler_the_checkpoints_weights(tiny_agents, tmp_path, capsys):
    """Issue 87.12: `--resume trainer.lag=2 checkpoint.strict_resume=false` with a sampler of its own stopped,
    blaming 'a weight sync that failed halfway?': the missing batch is sampled with the checkpoint's weights, which
    the resumed sampler holds, but it asked for update 1's (step 4 - 1 - lag 2). It samples with them now, as the
    run without a sampler does."""
    runs = {}
    for kind in ("sampler", "none"):
        run = runs[kind] = tmp_path / kind
        cfg = write_config(tmp_path / f"{kind}.yaml", tiny_agents, ["llama", "qwen"], run,
                           trainer={"steps": 2, "lag": 1}, scoring=GRADED, checkpoint={"every": 1})  # fmt: skip
        if kind == "sampler":
            _with_samplers(cfg, [1])
        assert main(["train", str(cfg)]) == 0
        capsys.readouterr()
        assert main(["train", str(cfg), "--resume", "trainer.lag=2", "checkpoint.strict_resume=false",
                     "trainer.steps=4"]) == 0  # fmt: skip
        err = capsys.readouterr().err
        assert "at trainer.lag=2 the first step samples those for steps [4] with the checkpoint's weights" in err
    assert [r["step"] for r in records(runs["sampler"])] == [1, 2, 3, 4]
    assert all(r["qwen/time/weight_sync"] > 0 for r in records(runs["sampler"])[3:])
    same_numbers(records(runs["sampler"]), records(runs["none"]))  # the weights the run without a sampler samples with


def test_an_agent_with_its_optimizer_offloaded_may_have_a_sampler_of_its_own(tiny_agents, tmp_path):
    """`offload: optimizer` with `sampler_devices` passed validation, then failed as the sampler started, calling the
    agent frozen (the sampler's copy of the agent kept the offload, which needs an optimizer)."""
    from dataclasses import replace

    from hacrl.agent.worker import AgentWorker
    from hacrl.config import load_config
    from hacrl.messages import WorkerSpec

    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run", trainer=LAG)
    _with_samplers(cfg, [1])
    config = load_config(cfg, ["agents.1.dtype=bfloat16", "agents.1.offload=optimizer"])
    agent = config.agents[1]
    spec = WorkerSpec(index=1, agent=agent, rollout=config.rollout, trainer=config.trainer,
                      algorithm=config.algorithm, num_agents=2, sharing=config.sharing)  # fmt: skip
    sampler = AgentWorker(spec, role="sampler")
    assert sampler.agent.frozen and sampler.agent.optimizer is None
    assert replace(agent).offload == "optimizer"  # the config itself is the user's, unchanged
