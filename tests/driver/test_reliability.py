"""Every failure is resumable or restartable, one process per run directory, and every user error takes the one
error path: a one-paragraph message naming the file or key, exit status 2, no traceback."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from hacrl import seeds
from hacrl.checkpoint import checkpoint_problems, latest_checkpoint
from hacrl.config import load_config
from hacrl.driver.rundir import LOCK_NAME, RunLock
from hacrl.errors import HacrlWarning
from hacrl.tools.cli import main
from tests.conftest import records, same_numbers, same_weights, write_config


@pytest.fixture()
def reference(reference_run):
    return reference_run


def _config(tiny_agents, tmp_path, **sections):
    sections.setdefault("trainer", {"steps": 3})
    return write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run", **sections)


# -- restartable and resumable ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_that_died_before_its_first_checkpoint_restarts_in_place(tiny_agents, tmp_path, reference, capsys):
    cfg = _config(tiny_agents, tmp_path)
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
    cfg = _config(tiny_agents, tmp_path)
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
    cfg = _config(tiny_agents, tmp_path)
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
    cfg = _config(tiny_agents, tmp_path)
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
    cfg = _config(tiny_agents, tmp_path)
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
    cfg = _config(tiny_agents, tmp_path, algorithm={"name": "gspo"})
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
    cfg = _config(tiny_agents, tmp_path, eval={"at_start": True, "every": 1, "num_samples": 2})
    run = tmp_path / "run"
    assert main(["train", str(cfg)]) == 0
    seed = load_config(cfg).trainer.seed
    assert seeded == [seeds.training(seed, a) for a in range(2)] + [
        seeds.evaluation(seed, step, "", a) for step in range(4) for a in range(2)
    ]
    training = [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in records(run)[1:]]
    same_numbers(training, [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in records(reference)])


# -- one process per run directory -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_process_on_a_run_directory_refuses_at_once(tiny_agents, tmp_path, capsys):
    cfg = _config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    with RunLock(run):  # another trainer holds the directory
        assert main(["train", str(cfg), "--resume"]) == 2
        err = capsys.readouterr().err
        assert f"run directory {str(run)!r} is in use by pid {os.getpid()} on host" in err
    assert not (run / LOCK_NAME).exists()
    assert main(["train", str(cfg), "trainer.steps=1"]) == 0
    assert not (run / LOCK_NAME).exists()  # released at the end


@pytest.mark.slow
def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_notice(tiny_agents, tmp_path, capsys):
    cfg = _config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_text(json.dumps({"pid": 999_999_999, "host": "elsewhere", "started": "x", "command": "y"}))
    assert main(["train", str(cfg), "trainer.steps=1"]) == 0
    assert "taking over a stale lock left by pid 999999999 on elsewhere" in capsys.readouterr().err


@pytest.mark.slow
def test_leftover_checkpoint_temporaries_are_removed_and_never_used(tiny_agents, tmp_path, capsys):
    cfg = _config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=1"]) == 0
    partial = run / "checkpoints" / "step_000002.tmp-12345-abcd"
    shutil.copytree(run / "checkpoints" / "step_000001", partial)
    assert latest_checkpoint(run).name == "step_000001"
    assert main(["train", str(cfg), "--resume", "trainer.steps=2"]) == 0
    assert f"removing {partial}" in capsys.readouterr().err
    assert not partial.exists() and latest_checkpoint(run).name == "step_000002"


# -- the one error path ----------------------------------------------------------------------------------------------


def _fails_cleanly(capsys, argv, *expected):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") <= 2, err
    for text in expected:
        assert text in err, err
    return err


def test_malformed_yaml_names_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("agents:\n  - {name: a, model: [x\ntrainer: {steps: 1}\n")
    _fails_cleanly(capsys, ["train", str(bad)], f"config file {str(bad)!r} is not valid YAML: line 3")
    _fails_cleanly(capsys, ["train", str(bad), "trainer.steps=[1"], "is not valid YAML")


def test_data_rows_that_are_not_objects_name_file_and_line(tiny_agents, tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n"just a string"\n')
    cfg = _config(tiny_agents, tmp_path, data={"source": "file", "train_file": str(data)})
    _fails_cleanly(capsys, ["train", str(cfg)], "data error:", f"{data}:2: each row must be a JSON object", "got str")
    data.write_text('{"prompt": "1+1", "answer": "2"}\n\n42\n')
    _fails_cleanly(capsys, ["train", str(cfg)], f"{data}:3: each row must be a JSON object", "got int")
    data.write_text('{"prompt": "1+1", "answer": "2"}\n{"question": "x", "answer": "1"}\n')
    _fails_cleanly(capsys, ["train", str(cfg)], f"{data}:2 (line 2) has no column 'prompt'")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_model_directory_without_tokenizer_files_says_so(tiny_agents, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (tiny_agents["llama"] / name).exists():
            shutil.copy(tiny_agents["llama"] / name, bare / name)
    cfg = write_config(tmp_path / "c.yaml", {"llama": bare, "qwen": tiny_agents["qwen"]}, ["llama", "qwen"],
                       tmp_path / "run")  # fmt: skip
    _fails_cleanly(capsys, ["train", str(cfg)], "model error: agents.0.model:", "holds no tokenizer files")
    _fails_cleanly(capsys, ["eval", str(bare), "--config", str(cfg)], "holds no tokenizer files")


@pytest.mark.slow
def test_hacrl_eval_takes_a_run_directory(tiny_agents, tmp_path, capsys):
    cfg = _config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=1"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "evaluating its newest checkpoint, step_000001" in out and "pass@1" in out
    _fails_cleanly(capsys, ["eval", str(tmp_path), "--config", str(cfg)], "is not a model directory")


@pytest.mark.slow
def test_eval_and_export_never_read_a_damaged_checkpoint(tiny_agents, tmp_path, capsys):
    """Issue 42: `hacrl eval RUN_DIR` evaluated a checkpoint whose SHA-256 did not match (resume refused it)."""
    cfg = _config(tiny_agents, tmp_path, trainer={"steps": 2}, checkpoint={"every": 1, "keep_last": 3})
    run = tmp_path / "run"
    assert main(["train", str(cfg)]) == 0
    weights = run / "checkpoints" / "step_000002" / "agents" / "llama" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only the digest tells
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["eval", str(run), "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "skipping damaged checkpoint" in out and "does not match its SHA-256" in out
    assert "evaluating its newest checkpoint, step_000001" in out
    _fails_cleanly(capsys, ["eval", str(run / "checkpoints" / "step_000002"), "--config", str(cfg)],
                   "step_000002 is damaged", "model.safetensors does not match its SHA-256")  # fmt: skip
    _fails_cleanly(capsys, ["export", str(run / "checkpoints" / "step_000002"), "--agent", "llama",
                            str(tmp_path / "out")], "is damaged")  # fmt: skip
    assert not (tmp_path / "out").exists()
    assert main(["export", str(run), "--agent", "llama", str(tmp_path / "out")]) == 0
    assert "skipping damaged checkpoint" in capsys.readouterr().out
    assert (run / "checkpoints" / "step_000002").is_dir()  # reading never renames anything


@pytest.mark.slow
def test_reward_and_checkpoint_errors_take_the_error_path_and_debug_shows_the_traceback(
    tiny_agents, tmp_path, capsys, monkeypatch
):
    cfg = _config(tiny_agents, tmp_path, scoring={"function": "tests.reward_fixtures:raises_on_x"})
    err = _fails_cleanly(capsys, ["train", str(cfg), "trainer.steps=1"], "reward error: reward function")
    assert "KeyError: 'oops'" in err
    _fails_cleanly(capsys, ["train", str(cfg), "checkpoint.resume=/no/such/checkpoint"], "/no/such/checkpoint")
    monkeypatch.setenv("HACRL_DEBUG", "1")
    with pytest.raises(Exception, match="does not exist"):
        main(["train", str(cfg), "checkpoint.resume=/no/such/checkpoint"])


@pytest.mark.slow
def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint_and_says_what_to_do(
    tiny_agents, tmp_path, capsys, monkeypatch
):
    import errno

    import hacrl.checkpoint

    cfg = _config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=1"]) == 0
    real_save = torch.save

    def full_disk(obj, path, *args, **kwargs):
        if "optimizer" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(hacrl.checkpoint.torch, "save", full_disk)
    _fails_cleanly(capsys, ["train", str(cfg), "--resume", "trainer.steps=2"], "No space left on device",
                   "its newest complete checkpoint", "step_000001) is intact, so `hacrl train CONFIG --resume` "
                   "continues from it")  # fmt: skip
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]  # no half-written leftovers
    monkeypatch.undo()
    assert main(["train", str(cfg), "--resume", "trainer.steps=2"]) == 0


# -- small defects -------------------------------------------------------------------------------------------------


def test_eval_max_prompts_must_be_positive(tiny_agents, tmp_path, capsys):
    cfg = _config(tiny_agents, tmp_path)
    _fails_cleanly(capsys, ["train", str(cfg), "eval.max_prompts=-1"], "eval.max_prompts must be >= 1 or null")


def test_a_dict_override_replaces_the_dict_and_empty_clears_it(tiny_agents, tmp_path):
    cfg = _config(tiny_agents, tmp_path)
    assert load_config(cfg).data.task_options["max_digits"] == 1
    assert load_config(cfg, ["data.task_options={}"]).data.task_options == {}
    assert load_config(cfg, ["data.task_options={max_terms: 3}"]).data.task_options == {"max_terms": 3}
    assert load_config(cfg, ["data.task_options.max_terms=3"]).data.task_options["min_digits"] == 1  # one key
    assert load_config(cfg, ["agents.0.chat_template_kwargs={a: 1}"]).agents[0].chat_template_kwargs == {"a": 1}


def test_eval_data_that_is_the_training_data_is_warned_about(tmp_path):
    from hacrl.config import DataConfig
    from hacrl.tasks.data import load_task

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(5)))
    with pytest.warns(HacrlWarning, match="data.eval_file is the training file"):
        load_task(DataConfig(source="file", train_file=str(rows), eval_file=str(rows)))
    other = tmp_path / "eval.jsonl"
    other.write_text(rows.read_text().splitlines()[0] + "\n" + json.dumps({"prompt": "new", "answer": "0"}) + "\n")
    with pytest.warns(HacrlWarning, match="1 of the 2 eval prompts .* also occur in"):
        load_task(DataConfig(source="file", train_file=str(rows), eval_file=str(other)))


def test_the_config_reference_says_that_a_reward_function_is_code_that_runs():
    from hacrl.config import describe

    assert "runs that module's code with your permissions" in " ".join(describe().split())


# -- never touch files hacrl did not write ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_directory_hacrl_did_not_write_is_refused_untouched(tiny_agents, tmp_path, capsys):
    """A user's own files in trainer.output_dir (a commented config.yaml, eval records, a folder that looks like a
    crashed checkpoint) are neither overwritten nor deleted: the run is refused before it writes anything."""
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "checkpoints" / "step_000001.tmp-1-ab").mkdir(parents=True)
    files = {run / "config.yaml": "# my notes\nlr: 1\n", run / "eval" / "step_000000.jsonl": '{"mine": 1}\n',
             run / "checkpoints" / "step_000001.tmp-1-ab" / "w.bin": "weights"}  # fmt: skip
    for path, text in files.items():
        path.write_text(text)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    cfg = _config(tiny_agents, tmp_path)
    for args in ([], ["--resume"]):
        assert main(["train", str(cfg), *args]) == 2
        err = capsys.readouterr().err
        assert "already holds files that hacrl did not write (checkpoints, config.yaml, eval)" in err, err
        assert "Traceback" not in err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing created, nothing deleted
    assert all(path.read_text() == text for path, text in files.items())


@pytest.mark.slow
def test_an_empty_directory_or_a_new_path_is_claimed_and_marked(tiny_agents, tmp_path, capsys):
    from hacrl.driver.rundir import RUN_MARKER

    run = tmp_path / "run"
    run.mkdir()
    cfg = _config(tiny_agents, tmp_path, trainer={"steps": 1}, checkpoint={"every": 0})
    assert main(["train", str(cfg)]) == 0
    assert (run / RUN_MARKER).is_file() and (run / "metrics.jsonl").is_file()
    assert main(["train", str(cfg), "trainer.steps=2", "--resume"]) == 0  # its own run: resumed
    (run / RUN_MARKER).unlink()  # a run written before the mark existed: refused, with how to claim it
    assert main(["train", str(cfg), "trainer.steps=3", "--resume"]) == 2
    assert f"claim it with `touch {run / RUN_MARKER}`" in " ".join(capsys.readouterr().err.split())
    (run / RUN_MARKER).touch()
    assert main(["train", str(cfg), "trainer.steps=3", "--resume"]) == 0
    assert records(run)[-1]["step"] == 3


@pytest.mark.slow
def test_a_users_config_and_metrics_files_do_not_make_a_run(tiny_agents, tmp_path, capsys):
    """Issue 42: a directory holding the user's own config.yaml and metrics.jsonl was taken for a run of an earlier
    hacrl, and `--resume` then replaced both. A directory is a run only when hacrl marked it."""
    run = tmp_path / "run"
    run.mkdir()
    mine = {run / "config.yaml": "# my own config\nlr: 1\n", run / "metrics.jsonl": '{"step": 7, "mine": 1}\n'}
    for path, text in mine.items():
        path.write_text(text)
    cfg = _config(tiny_agents, tmp_path, trainer={"steps": 1})
    for args in ([], ["--resume"], ["--resume"]):
        assert main(["train", str(cfg), *args]) == 2
        err = capsys.readouterr().err
        assert "already holds files that hacrl did not write (config.yaml, metrics.jsonl)" in err, err
        assert "touch" not in err  # no checkpoints: nothing suggests an unmarked run of hacrl
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "metrics.jsonl"]  # no mark, no lock
    assert all(path.read_text() == text for path, text in mine.items())


@pytest.mark.slow
def test_a_refused_start_writes_nothing(tiny_agents, tmp_path, capsys):
    """A start that fails after claiming the directory (here: its data file is missing) takes the claim back."""
    run = tmp_path / "run"
    data = {"source": "file", "train_file": str(tmp_path / "missing.jsonl")}
    cfg = _config(tiny_agents, tmp_path, data=data)
    assert main(["train", str(cfg)]) == 2
    assert "missing.jsonl" in capsys.readouterr().err and not run.exists()
    run.mkdir()
    assert main(["train", str(cfg)]) == 2 and list(run.iterdir()) == []  # an empty directory stays empty


@pytest.mark.slow
def test_output_dir_naming_a_file_is_a_clear_error(tiny_agents, tmp_path, capsys):
    (tmp_path / "run").write_text("not a directory")
    assert main(["train", str(_config(tiny_agents, tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a directory" in err and "Traceback" not in err
    assert (tmp_path / "run").read_text() == "not a directory"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["x" * 300, "a/b", ".hidden", "has space", ""])
def test_agent_names_that_cannot_be_folders_fail_at_validation(tiny_agents, tmp_path, capsys, name):
    """A 300-character name used to pass validation and fail with ENAMETOOLONG at the first checkpoint, after the
    training it would have saved."""
    cfg = _config(tiny_agents, tmp_path)
    text = cfg.read_text().replace("name: llama", f"name: '{name}'", 1)
    cfg.write_text(text)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "agents.0.name=" in err and "folder-safe name" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_hung_reward_function_stops_the_run_with_one_message(tiny_agents, tmp_path, capsys):
    """Through the CLI: a reward function that never returns stops the run (exit 2, the function, its timeout and
    the knobs named) instead of training on timeout rewards; with the default 5 s timeout this takes ~45 s (the
    slice's call capped at 30 s, then 3 completions x 5 s), here 0.5 s per completion."""
    import time

    fixture = "tests.reward_fixtures:sleeps_forever"
    cfg = _config(tiny_agents, tmp_path, scoring={"function": fixture, "timeout": 0.5})
    start = time.perf_counter()
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"reward function {fixture} is hung" in err and "scoring.timeout=0.5s" in err, err
    assert "scoring.on_hung=continue" in err and "Traceback" not in err
    assert time.perf_counter() - start < 60
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing trained on made-up rewards


# -- out of memory and non-finite numbers ----------------------------------------------------------------------------


def _poison_weights(source, target):
    """A copy of agent directory `source` with one NaN in its weights."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    weights = load_file(target / "model.safetensors")
    name = sorted(weights)[0]
    weights[name].view(-1)[3] = float("nan")
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    return name


@pytest.mark.slow
def test_weights_holding_nan_are_refused_at_load(tiny_agents, tmp_path, capsys):
    """Used to give a raw torch.multinomial traceback at the first sampling call."""
    name = _poison_weights(tiny_agents["llama"], tmp_path / "nan-llama")
    cfg = _config({**tiny_agents, "llama": tmp_path / "nan-llama"}, tmp_path)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"agents.0.model: the weights in {str(tmp_path / 'nan-llama')!r} hold NaN or inf (first: {name})" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_an_injected_nan_loss_skips_the_optimizer_step_and_the_checkpoint_is_finite(tiny_agents, tmp_path, monkeypatch):
    from hacrl.agent.worker import AgentWorker as Worker

    real = Worker._micro_batch_loss

    def nan_loss(self, *args, **kwargs):
        from dataclasses import replace

        out = real(self, *args, **kwargs)
        return replace(out, loss=out.loss * float("nan")) if self.name == "qwen" else out

    monkeypatch.setattr(Worker, "_micro_batch_loss", nan_loss)
    cfg = _config(tiny_agents, tmp_path, trainer={"steps": 1})
    assert main(["train", str(cfg)]) == 0
    last = records(tmp_path / "run")[-1]
    # every mini-batch whose loss reaches the weights is skipped (one without a gradient path takes no step anyway)
    assert last["qwen/skipped_steps"] >= 2 and last["llama/skipped_steps"] == 0
    saved = load_file(tmp_path / "run" / "checkpoints" / "step_000001" / "agents" / "qwen" / "model.safetensors")
    before = load_file(tiny_agents["qwen"] / "model.safetensors")
    assert all(torch.equal(saved[k], before[k]) for k in before)  # no step taken, nothing non-finite written


@pytest.mark.slow
def test_weights_that_turn_nan_are_never_checkpointed(tiny_agents, tmp_path, monkeypatch, capsys):
    """An update that leaves NaN in the weights (here injected after step 2's optimizer steps): the run stops at
    the checkpoint with one message; the newest checkpoint is step 1's, finite, and the run resumes from it."""
    from hacrl.agent.worker import AgentWorker as Worker

    real = Worker._update

    def poisoning(self, rows, capabilities):
        metrics = real(self, rows, capabilities)
        if self.optimizer_steps >= 8 and self.name == "llama":
            with torch.no_grad():
                next(self.agent.model.parameters()).view(-1)[0] = float("nan")
        return metrics

    monkeypatch.setattr(Worker, "_update", poisoning)
    cfg = _config(tiny_agents, tmp_path)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "agent 'llama': its weights hold NaN or inf after 8 optimizer steps" in err and "Traceback" not in err
    run = tmp_path / "run"
    assert latest_checkpoint(run).name == "step_000001" and checkpoint_problems(latest_checkpoint(run)) == []
    monkeypatch.setattr(Worker, "_update", real)
    assert main(["train", str(cfg), "--resume"]) == 0
    assert latest_checkpoint(run).name == "step_000003"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "phase", "knob", "host"),
    [
        ("hacrl.agent.worker.generate", "sampling", "rollout.batch_size", False),
        ("hacrl.agent.worker.AgentWorker._old_logprobs", "old log-probs", "trainer.logprob_batch_size", False),
        ("hacrl.agent.worker.AgentWorker._update", "the update",
         "trainer.micro_batch_size, agents.1.gradient_checkpointing", False),
        ("hacrl.agent.worker.generate_completions", "evaluation", "eval.batch_size", False),
        ("hacrl.agent.worker.AgentWorker._update", "the update", "trainer.micro_batch_size", True),
    ],
)  # fmt: skip
def test_out_of_memory_in_any_phase_is_a_clear_stop_and_resumes_smaller(
    target, phase, knob, host, tiny_agents, tmp_path, monkeypatch, capsys
):
    """torch.OutOfMemoryError injected at the second call of a phase (step 2, or the final evaluation) for the
    second agent: exit 2, one message with the agent, the phase and the knob; the step-1 checkpoint is intact and
    the run resumes with a smaller setting. `host`: a real allocation the CPU allocator refuses (its error is a
    plain RuntimeError; issue 42 met it as a traceback and exit 1)."""
    import importlib

    module_name, _, attr = target.rpartition(".")
    owner = importlib.import_module(module_name) if module_name == "hacrl.agent.worker" else None
    if owner is None:
        owner = getattr(importlib.import_module("hacrl.agent.worker"), module_name.rsplit(".", 1)[1])
    real = getattr(owner, attr)
    calls = {"n": 0}

    def failing(*args, **kwargs):
        worker_or_agent = args[0]
        name = getattr(worker_or_agent, "name", None)
        if name == "qwen":
            calls["n"] += 1
            if calls["n"] == 2 and host:
                torch.empty(2**50, dtype=torch.uint8)  # a petabyte: DefaultCPUAllocator: can't allocate memory
            if calls["n"] == 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, failing)
    sections = {"eval": {"at_start": True}} if phase == "evaluation" else {}
    cfg = _config(tiny_agents, tmp_path, trainer={"steps": 2}, **sections)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"agent 'qwen' ran out of memory on cpu during {phase}" in err and knob in err, err
    assert "--resume KEY=VALUE" in err and "Traceback" not in err
    run = tmp_path / "run"
    assert latest_checkpoint(run) is not None and checkpoint_problems(latest_checkpoint(run)) == []
    monkeypatch.setattr(owner, attr, real)
    assert main(["train", str(cfg), "--resume", "trainer.micro_batch_size=1", "trainer.logprob_batch_size=2"]) == 0
    assert latest_checkpoint(run).name == "step_000002"


# -- inputs checked before anything runs -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agents.0.lr=.inf", "agents.0.lr=inf must be a finite number"),
        ("scoring.timeout=.inf", "scoring.timeout=inf must be a finite number"),
        ("algorithm.r_max=.nan", "algorithm.r_max"),
        ("rollout.group_size=1000000", "2 x 1000000 = 2,000,000 responses per agent and step is past hacrl's limits"),
        ("trainer.output_dir=${oc.env:HOME}/run", "is an interpolation"),
    ],
)
def test_values_that_would_fail_late_are_refused_at_validation(override, message, tiny_agents, tmp_path, capsys):
    assert main(["train", str(_config(tiny_agents, tmp_path)), override]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("trainer: &a\n  steps: *a\n", "a YAML alias refers to itself"),
        ("".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else '1'] * 9)}]\n" for i in range(8)),
         "aliases expand to more than 100,000 values"),
        ("logging:\n  tensorboard_dir: ${oc.env:SECRET_TOKEN}\n",
         "key logging.tensorboard_dir: '${oc.env:SECRET_TOKEN}' is an interpolation"),
    ],
)  # fmt: skip
def test_yaml_that_would_hang_or_leak_a_secret_is_refused(yaml_text, message, tmp_path, capsys):
    """A self-referencing alias (RecursionError), a 400-byte "billion laughs" file (minutes of OmegaConf), an
    environment interpolation (the resolved secret written into config.yaml and every checkpoint)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    start = __import__("time").perf_counter()
    assert main(["train", str(cfg)]) == 2
    assert __import__("time").perf_counter() - start < 10
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize(("row", "what"), [('{"prompt": [], "answer": "1"}', "holds 0 chat messages and no text"),
                                           ('{"prompt": "  ", "answer": "1"}', "is empty")])  # fmt: skip
def test_an_empty_prompt_is_refused_at_load_with_file_and_line(row, what, tiny_agents, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n' + row + "\n")
    cfg = _config(tiny_agents, tmp_path, data={"source": "file", "train_file": str(data), "eval_file": str(data)})
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{data}:2: data.prompt_column='prompt' {what}" in err and "Traceback" not in err, err


def test_a_huge_prompt_is_cut_by_characters_before_tokenizing(tiny_agents):
    """A 20 MB prompt row: cut to max_prompt_tokens x (longest token + 1) characters before the tokenizer sees it,
    with the same ids as cutting the full tokenization (the prompt's end, where the generation prompt is)."""
    import time

    from hacrl.agent.model import Agent
    from hacrl.config import AgentConfig, RolloutConfig

    agent = Agent(0, AgentConfig(name="q", model=str(tiny_agents["qwen"])), RolloutConfig(max_prompt_tokens=64))
    text = "1 + 2 = 3. " * 2_000_000
    start = time.perf_counter()
    ids, cut = agent.render_prompt([{"role": "user", "content": text}])
    assert cut and len(ids) == 64 and time.perf_counter() - start < 5
    small = "1 + 2 = 3. " * 2_000
    full = agent.tokenizer(agent.tokenizer.apply_chat_template([{"role": "user", "content": small}],
                           add_generation_prompt=True, tokenize=False), add_special_tokens=False).input_ids  # fmt: skip
    assert agent.render_prompt([{"role": "user", "content": small}])[0] == full[-64:]


@pytest.mark.slow
def test_a_full_disk_while_writing_a_checkpoint_is_one_message_and_the_old_one_stays(
    tiny_agents, tmp_path, monkeypatch, capsys
):
    """safetensors / torch raise their own error types on a full disk (a traceback, exit 1, before): now the one
    error path, exit 2; the step-1 checkpoint is intact and no temporary is left."""
    from transformers import PreTrainedModel

    real = PreTrainedModel.save_pretrained
    calls = {"n": 0}

    def disk_full(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 2:  # both agents' step-1 parts written, then the disk is full
            raise RuntimeError("[enforce fail at inline_container.cc:659] . unexpected pos 64 vs 0: No space left")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", disk_full)
    cfg = _config(tiny_agents, tmp_path)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "could not write agent 'llama''s part of a checkpoint" in err and "No space left" in err
    assert "The previous checkpoint is intact" in err and "Traceback" not in err
    run = tmp_path / "run"
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]
    assert checkpoint_problems(run / "checkpoints" / "step_000001") == []


@pytest.mark.slow
def test_a_damaged_rng_file_without_digest_checks_is_a_checkpoint_error(tiny_agents, tmp_path, capsys):
    cfg = _config(tiny_agents, tmp_path, trainer={"steps": 1})
    assert main(["train", str(cfg)]) == 0
    rng = tmp_path / "run" / "checkpoints" / "step_000001" / "rng" / "qwen.pt"
    # readable, the wrong content, and a manifest that agrees on its size: only the (disabled) digest check sees it
    torch.save({"cpu": torch.zeros(7, dtype=torch.uint8), "optimizer_steps": 4}, rng)
    state_file = rng.parents[1] / "state.json"
    state = json.loads(state_file.read_text())
    state["files"]["rng/qwen.pt"]["size"] = rng.stat().st_size
    state_file.write_text(json.dumps(state))
    capsys.readouterr()
    assert main(["train", str(cfg), "--resume", "trainer.steps=2", "checkpoint.verify_digests=false"]) == 2
    err = capsys.readouterr().err
    assert f"{rng}: cannot load the random stream of agent 'qwen'" in err and "Traceback" not in err, err
    # with digests checked (the default) it is set aside as damaged: no other checkpoint, so a clear stop too
    assert main(["train", str(cfg), "--resume", "trainer.steps=2"]) == 2
    assert "does not match its SHA-256" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_needs_only_the_checkpoint_not_the_original_model_directory(tiny_agents, tmp_path):
    """The tokenizer was read from the config's model path on resume: a run whose original model directory was
    moved away could not continue. It now comes from the checkpoint, beside the weights."""
    agents = {name: tmp_path / "models" / name for name in ("llama", "qwen")}
    for name, path in agents.items():
        shutil.copytree(tiny_agents[name], path)
    cfg = _config(agents, tmp_path, trainer={"steps": 1})
    assert main(["train", str(cfg)]) == 0
    shutil.rmtree(tmp_path / "models")
    assert main(["train", str(cfg), "--resume", "trainer.steps=2"]) == 0
    assert records(tmp_path / "run")[-1]["step"] == 2


@pytest.mark.slow
def test_non_finite_logits_while_sampling_are_one_message_for_either_sampler(tiny_agents, tmp_path, monkeypatch,
                                                                              capsys):  # fmt: skip
    """hf: torch.multinomial's raw error becomes a message naming the agent; static: its sync points check the
    logits (no extra host sync) and stop instead of drawing arbitrary tokens."""
    from hacrl.agent.model import Agent
    from hacrl.config import AgentConfig, RolloutConfig
    from hacrl.errors import NonFiniteError

    def nan_probabilities(*args, **kwargs):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")

    monkeypatch.setattr("hacrl.agent.worker.generate", nan_probabilities)
    assert main(["train", str(_config(tiny_agents, tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "agent 'llama': its model produced NaN or inf during sampling at step 1" in err and "Traceback" not in err
    agent = Agent(0, AgentConfig(name="q", model=str(tiny_agents["qwen"]), rollout_backend="static"),
                  RolloutConfig(max_new_tokens=16))  # fmt: skip
    with torch.no_grad():
        agent.model.get_output_embeddings().weight[5, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="agent 'q': the model's next-token logits hold NaN or inf"):
        agent.sampler.sample([[3, 4, 5]], 4, batch_size=4)


def test_a_missing_model_directory_is_named_before_any_data_loads(tiny_agents, tmp_path, capsys, monkeypatch):
    """A preset's placeholder model path fails at once with its key and the fix, before the data (a Hub set can take
    a minute of retries to fail offline) and before any worker starts."""
    import hacrl.driver.trainer

    def no_data(*args, **kwargs):
        raise AssertionError("the data were loaded before the model directories were checked")

    monkeypatch.setattr(hacrl.driver.trainer, "load_task", no_data)
    cfg = write_config(tmp_path / "c.yaml", {"llama": tiny_agents["llama"], "qwen": tmp_path / "nowhere"},
                       ["llama", "qwen"], tmp_path / "run")  # fmt: skip
    _fails_cleanly(
        capsys, ["train", str(cfg)], f"model error: agents.1.model: {str(tmp_path / 'nowhere')!r} is not a Hugging",
        "(does not exist); hacrl loads local directories only", "`agents.1.model=/models/<name>` on the command line"
    )  # fmt: skip
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# -- issue 42: messages instead of tracebacks --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint_every", [1, 0])
def test_a_full_disk_under_tensorboards_writer_thread_is_one_message(
    checkpoint_every, tiny_agents, tmp_path, monkeypatch, capsys
):
    """Issue 42: ENOSPC in TensorBoard's writer thread printed that thread's traceback; and the message said "the
    newest checkpoint is intact" when the run had none."""
    import errno

    from tensorboard.summary.writer.record_writer import RecordWriter

    real, calls = RecordWriter.write, {"n": 0}
    first = tmp_path / "run" / "checkpoints" / "step_000001"

    def write(self, data):
        calls["n"] += 1
        if first.exists() if checkpoint_every else calls["n"] > 40:  # then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(RecordWriter, "write", write)
    cfg = _config(tiny_agents, tmp_path, trainer={"steps": 4}, checkpoint={"every": checkpoint_every})
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "Traceback" not in err and "Exception in thread" not in err, err
    if checkpoint_every:
        assert "its newest complete checkpoint" in err and "step_00000" in err and "continues from it" in err
    else:
        assert "this run has no complete checkpoint yet, so `hacrl train CONFIG --resume` starts it from step 0" in err


@pytest.mark.slow
def test_wandb_online_without_credentials_is_refused_before_the_run_directory_exists(
    tiny_agents, tmp_path, monkeypatch, capsys
):
    pytest.importorskip("wandb")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(key, raising=False)
    cfg = _config(tiny_agents, tmp_path, logging={"wandb": {"mode": "online"}})
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "logging.wandb.mode=online needs W&B credentials" in err and "wandb login" in err, err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_ctrl_c_during_start_up_is_one_line_and_leaves_nothing(tiny_agents, tmp_path, monkeypatch, capsys):
    import hacrl.driver.trainer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hacrl.driver.trainer, "load_task", interrupted)
    assert main(["train", str(_config(tiny_agents, tmp_path))]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "hacrl: interrupted (Ctrl-C)" and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_tracker_that_cannot_start_is_one_message(tiny_agents, tmp_path, monkeypatch, capsys):
    """W&B's own errors at init (no network, a bad key) are named with the setting to change."""
    wandb = pytest.importorskip("wandb")

    def refuses(**kwargs):
        raise wandb.errors.CommError("could not reach api.wandb.ai")

    monkeypatch.setattr(wandb, "init", refuses)
    cfg = _config(tiny_agents, tmp_path, logging={"wandb": {"mode": "offline"}})
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "logging.wandb could not start (CommError: could not reach api.wandb.ai)" in err, err
    assert "logging.wandb.mode=offline" in err and "Traceback" not in err
