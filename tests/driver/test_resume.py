"""Every failure is resumable or restartable: a run that died restarts or resumes and gives the uninterrupted
run's numbers; damaged checkpoints and metrics are found and named; a resume that would change the numbers is
refused."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hacrl import seeds
from hacrl.checkpoint import checkpoint_problems, latest_checkpoint
from hacrl.config import load_config
from hacrl.errors import HacrlWarning
from hacrl.tools.cli import main
from tests.conftest import pair_config, records, same_numbers, same_weights, write_config

# -- restartable and resumable ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_that_died_before_its_first_checkpoint_restarts_in_place(tiny_agents, tmp_path, reference, capsys):
    cfg = pair_config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=2", "checkpoint.every=0"]) == 0
    shutil.rmtree(run / "checkpoints")  # as if it had died before writing one
    capsys.readouterr()
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "already holds a run (metrics up to step 2)" in err and "--resume starts it again from step 0" in err
    assert main(["train", str(cfg), "--resume"]) == 0
    assert "has no checkpoint: the earlier attempt stopped before its first one" in capsys.readouterr().err
    same_numbers(records(run), records(reference))
    same_weights(run, reference, 3)


@pytest.mark.slow
def test_a_cut_off_last_metrics_line_is_dropped_on_resume(tiny_agents, tmp_path, reference, capsys):
    cfg = pair_config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=2"]) == 0
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "llama/reward_mea')  # what a kill in the middle of a write leaves
    assert main(["train", str(cfg), "--resume"]) == 0
    out = capsys.readouterr()
    assert "dropped its last line, cut off when the run stopped mid-write" in out.out + out.err
    same_numbers(records(run), records(reference))


@pytest.mark.slow
def test_a_damaged_line_inside_metrics_stops_resume_naming_file_and_line(tiny_agents, tmp_path, capsys):
    cfg = pair_config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=2"]) == 0
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(["{garbage", *lines[1:]]) + "\n")
    assert main(["train", str(cfg), "--resume"]) == 2
    assert "metrics.jsonl:1 is damaged" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated weights", "garbled state.json", "garbled optimizer", "missing rng"])
def test_a_damaged_newest_checkpoint_is_reported_and_resume_falls_back(
    damage, tiny_agents, tmp_path, reference, capsys
):
    cfg = pair_config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=2"]) == 0
    newest = run / "checkpoints" / "step_000002"
    if damage == "truncated weights":
        weights = newest / "agents" / "qwen" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-100])
        expect = "agents/qwen/model.safetensors has"
    elif damage == "garbled state.json":
        (newest / "state.json").write_text('{"step": 2, "agen')
        expect = "state.json is not valid JSON"
    elif damage == "garbled optimizer":
        opt = newest / "optimizer" / "llama.pt"
        data = bytearray(opt.read_bytes())
        data[len(data) // 2] ^= 0xFF
        opt.write_bytes(bytes(data))
        expect = "optimizer/llama.pt does not match its SHA-256"
    else:
        (newest / "rng" / "llama.pt").unlink()
        expect = "rng/llama.pt is missing"
    capsys.readouterr()
    assert main(["train", str(cfg), "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"checkpoint {newest} is damaged: " in err and expect in err
    assert "Moved to step_000002.damaged" in err and "resuming from the newest good checkpoint instead" in err
    assert (run / "checkpoints" / "step_000002.damaged").is_dir()  # kept for inspection, never used
    same_numbers(records(run), records(reference))
    same_weights(run, reference, 3)


@pytest.mark.slow
def test_a_garbled_optimizer_without_digests_is_named_and_never_unpickled(tiny_agents, tmp_path, capsys):
    cfg = pair_config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=1"]) == 0
    opt = run / "checkpoints" / "step_000001" / "optimizer" / "qwen.pt"
    opt.write_bytes(b"\x80\x04garbage" * 10)
    capsys.readouterr()
    assert main(["train", str(cfg), f"checkpoint.resume={run / 'checkpoints' / 'step_000001'}"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint error:" in err and "optimizer/qwen.pt: cannot be read" in err
    assert "weights_only=False" not in err and "Traceback" not in err


@pytest.mark.slow
def test_checkpoint_problems_of_a_good_checkpoint_are_none(reference):
    assert checkpoint_problems(latest_checkpoint(reference)) == []
    state = json.loads((latest_checkpoint(reference) / "state.json").read_text())
    assert state["files"]["agents/llama/model.safetensors"]["size"] > 0


@pytest.mark.slow
def test_resume_refuses_a_changed_algorithm_naming_the_key_and_both_values(tiny_agents, tmp_path, capsys):
    cfg = pair_config(tiny_agents, tmp_path, algorithm={"name": "gspo"})
    assert main(["train", str(cfg), "trainer.steps=1"]) == 0
    capsys.readouterr()
    assert main(["train", str(cfg), "--resume", "algorithm.name=hacpo", "agents.0.lr=0.01"]) == 2
    err = capsys.readouterr().err
    assert "algorithm.name: 'gspo' in the checkpoint, 'hacpo' now" in err
    assert "agents.0.lr: 0.003 in the checkpoint, 0.01 now" in err
    safe = err.split("Safe to change on resume:")[1].split("allowed but no longer bit-exact")[0]
    assert "trainer.steps" in safe and "eval.*" in safe and "checkpoint.strict_resume=false" in err
    # safe and not-exact changes are allowed; the latter is announced
    assert main(["train", str(cfg), "--resume", "trainer.steps=2", "eval.every=1", "trainer.micro_batch_size=4"]) == 0
    assert "trainer.micro_batch_size: 2 in the checkpoint, 4 now: allowed, but no longer bit-identical" in (
        capsys.readouterr().err
    )
    with pytest.warns(HacrlWarning, match="resuming with a changed setting .*algorithm.name: 'gspo'"):
        assert main(["train", str(cfg), "--resume", "trainer.steps=3", "algorithm.name=naive",
                     "checkpoint.strict_resume=false"]) == 0  # fmt: skip


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_of_other_agents(tiny_agents, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 1})
    assert main(["train", str(cfg)]) == 0
    other = write_config(tmp_path / "o.yaml", tiny_agents, ["llama", "tiny"], run, trainer={"steps": 2})
    capsys.readouterr()
    assert main(["train", str(other), "--resume"]) == 2
    assert "holds agents ['llama', 'qwen'] but the config has ['llama', 'tiny']" in capsys.readouterr().err


@pytest.mark.slow
def test_evaluation_never_changes_training(tiny_agents, tmp_path, reference, monkeypatch):
    """Sampled evaluation draws from its own stream: adding it (or changing eval.* on resume) keeps the numbers.
    Every torch.manual_seed of the run (local backend: the workers are in this process) is one of the run's named
    streams (`hacrl.seeds`), none seeded twice."""
    seeded: list[int] = []
    real = torch.manual_seed
    monkeypatch.setattr(torch, "manual_seed", lambda s: (seeded.append(int(s)), real(s))[1])
    cfg = pair_config(tiny_agents, tmp_path, eval={"at_start": True, "every": 1, "num_samples": 2})
    run = tmp_path / "run"
    assert main(["train", str(cfg)]) == 0
    seed = load_config(cfg).trainer.seed
    assert seeded == [seeds.training(seed, a) for a in range(2)] + [
        seeds.evaluation(seed, step, "", a) for step in range(4) for a in range(2)
    ]
    training = [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in records(run)[1:]]
    same_numbers(training, [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in records(reference)])


STATE_EDITS = {
    "step of another checkpoint": ({"step": 2}, "state.json says step 2 but the directory is step_000003"),
    "step as text": ({"step": "3"}, "state.json's 'step' is '3', not a step number"),
    "agents not a list": ({"agents": "llama"}, "state.json's 'agents' is 'llama', not a list of agent names"),
    "agent name a path": ({"agents": ["llama", "../../qwen"]}, "agents[1]='../../qwen' (10 characters) is not a "
                          "folder-safe name"),
    "frozen unknown": ({"frozen": ["nobody"]}, "state.json's 'frozen' is ['nobody'], not a list of its agents"),
    "capability a list": ({"capability": []}, "state.json's 'capability' is a list, not the saved state"),
    "capability incomplete": ({"capability": {"num_agents": 2}}, "its state.json's capability history and data "
                              "position cannot be restored (ValueError: capability state is missing"),
    "data incomplete": ({"data": {"epoch": 0}}, "capability history and data position cannot be restored (KeyError"),
    "file outside": ({"files": {"/etc/hostname": {"size": 1, "sha256": "0"}}}, "lists '/etc/hostname', a path "
                     "outside the checkpoint"),
    "file entry": ({"files": {"config.yaml": 12}}, "state.json's entry for config.yaml is not a size and a digest"),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("edit", list(STATE_EDITS))
def test_state_json_values_of_the_wrong_type_or_checkpoint_are_named(edit, tiny_agents, reference_run, tmp_path,
                                                                      capsys):  # fmt: skip
    """Issue 61, 20: wrong types in state.json gave tracebacks, and `"step": 2` in step_000003 resumed silently into
    a different run. Each is refused with one message naming state.json and the value."""
    from tests.conftest import fails_cleanly

    checkpoint = tmp_path / "elsewhere" / "step_000003"
    shutil.copytree(reference_run / "checkpoints" / "step_000003", checkpoint)
    state = json.loads((checkpoint / "state.json").read_text())
    change, message = STATE_EDITS[edit]
    (checkpoint / "state.json").write_text(json.dumps({**state, **change}))
    cfg = pair_config(tiny_agents, tmp_path)
    fails_cleanly(capsys, ["train", str(cfg), "trainer.steps=4", f"checkpoint.resume={checkpoint}"], message)


@pytest.mark.slow
def test_tensorboard_shows_a_redone_step_once(tiny_agents, tmp_path):
    """docs/reliability.md: TensorBoard hides the events of the steps a resumed run redoes. A run whose newest
    checkpoint is step 2 of 3 (its step-3 checkpoint lost) redoes step 3 on resume: TensorBoard's own reader shows
    one value per step (without the writer's purge_step it shows step 3 twice)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    cfg = pair_config(tiny_agents, tmp_path, checkpoint={"every": 2, "keep_last": 3})
    assert main(["train", str(cfg)]) == 0
    shutil.rmtree(run / "checkpoints" / "step_000003")
    assert main(["train", str(cfg), "--resume"]) == 0
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    steps = [e.step for e in events.Scalars("llama/reward_mean")]
    assert steps == [1, 2, 3]
