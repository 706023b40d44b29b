"""One process per run directory, and hacrl never touches files it did not write."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hacrl.checkpoint import latest_checkpoint
from hacrl.driver.rundir import LOCK_NAME, RunLock
from hacrl.tools.cli import main
from tests.conftest import pair_config, records

# -- one process per run directory -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_process_on_a_run_directory_refuses_at_once(tiny_agents, tmp_path, capsys):
    cfg = pair_config(tiny_agents, tmp_path)
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
    cfg = pair_config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_text(json.dumps({"pid": 999_999_999, "host": "elsewhere", "started": "x", "command": "y"}))
    assert main(["train", str(cfg), "trainer.steps=1"]) == 0
    assert "taking over a stale lock left by pid 999999999 on elsewhere" in capsys.readouterr().err


@pytest.mark.slow
def test_leftover_checkpoint_temporaries_are_removed_and_never_used(tiny_agents, tmp_path, capsys):
    cfg = pair_config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=1"]) == 0
    partial = run / "checkpoints" / "step_000002.tmp-12345-abcd"
    shutil.copytree(run / "checkpoints" / "step_000001", partial)
    assert latest_checkpoint(run).name == "step_000001"
    assert main(["train", str(cfg), "--resume", "trainer.steps=2"]) == 0
    assert f"removing {partial}" in capsys.readouterr().err
    assert not partial.exists() and latest_checkpoint(run).name == "step_000002"


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
    cfg = pair_config(tiny_agents, tmp_path)
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
    cfg = pair_config(tiny_agents, tmp_path, trainer={"steps": 1}, checkpoint={"every": 0})
    assert main(["train", str(cfg)]) == 0
    assert (run / RUN_MARKER).is_file() and (run / "metrics.jsonl").is_file()
    assert main(["train", str(cfg), "trainer.steps=2", "--resume"]) == 0  # its own run: resumed
    (run / RUN_MARKER).unlink()  # without the mark it is not a run of hacrl's: refused, untouched
    assert main(["train", str(cfg), "trainer.steps=3", "--resume"]) == 2
    assert "already holds files that hacrl did not write" in " ".join(capsys.readouterr().err.split())
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
    cfg = pair_config(tiny_agents, tmp_path, trainer={"steps": 1})
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
    cfg = pair_config(tiny_agents, tmp_path, data=data)
    assert main(["train", str(cfg)]) == 2
    assert "missing.jsonl" in capsys.readouterr().err and not run.exists()
    run.mkdir()
    assert main(["train", str(cfg)]) == 2 and list(run.iterdir()) == []  # an empty directory stays empty


@pytest.mark.slow
def test_output_dir_naming_a_file_is_a_clear_error(tiny_agents, tmp_path, capsys):
    (tmp_path / "run").write_text("not a directory")
    assert main(["train", str(pair_config(tiny_agents, tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a directory" in err and "Traceback" not in err
    assert (tmp_path / "run").read_text() == "not a directory"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["x" * 300, "a/b", ".hidden", "has space", ""])
def test_agent_names_that_cannot_be_folders_fail_at_validation(tiny_agents, tmp_path, capsys, name):
    """A 300-character name used to pass validation and fail with ENAMETOOLONG at the first checkpoint, after the
    training it would have saved."""
    cfg = pair_config(tiny_agents, tmp_path)
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
    cfg = pair_config(tiny_agents, tmp_path, scoring={"function": fixture, "timeout": 0.5})
    start = time.perf_counter()
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"reward function {fixture} is hung" in err and "scoring.timeout=0.5s" in err, err
    assert "scoring.on_hung=continue" in err and "Traceback" not in err
    assert time.perf_counter() - start < 60
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing trained on made-up rewards
