"""Every user error takes the one error path: a one-paragraph message naming the file or key, exit status 2, no
traceback (`--debug` shows it)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hacrl.config import load_config
from hacrl.errors import HacrlWarning
from hacrl.tools.cli import main
from tests.conftest import fails_cleanly, pair_config, write_config

# -- the one error path ----------------------------------------------------------------------------------------------


def test_malformed_yaml_names_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("agents:\n  - {name: a, model: [x\ntrainer: {steps: 1}\n")
    fails_cleanly(capsys, ["train", str(bad)], f"config file {str(bad)!r} is not valid YAML: line 3")
    fails_cleanly(capsys, ["train", str(bad), "trainer.steps=[1"], "is not valid YAML")


def test_data_rows_that_are_not_objects_name_file_and_line(tiny_agents, tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n"just a string"\n')
    cfg = pair_config(tiny_agents, tmp_path, data={"source": "file", "train_file": str(data)})
    fails_cleanly(capsys, ["train", str(cfg)], "data error:", f"{data}:2: each row must be a JSON object", "got str")
    data.write_text('{"prompt": "1+1", "answer": "2"}\n\n42\n')
    fails_cleanly(capsys, ["train", str(cfg)], f"{data}:3: each row must be a JSON object", "got int")
    data.write_text('{"prompt": "1+1", "answer": "2"}\n{"question": "x", "answer": "1"}\n')
    fails_cleanly(capsys, ["train", str(cfg)], f"{data}:2 (line 2) has no column 'prompt'")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_model_directory_without_tokenizer_files_says_so(tiny_agents, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (tiny_agents["llama"] / name).exists():
            shutil.copy(tiny_agents["llama"] / name, bare / name)
    cfg = write_config(tmp_path / "c.yaml", {"llama": bare, "qwen": tiny_agents["qwen"]}, ["llama", "qwen"],
                       tmp_path / "run")  # fmt: skip
    fails_cleanly(capsys, ["train", str(cfg)], "model error: agents.0.model:", "holds no tokenizer files")
    fails_cleanly(capsys, ["eval", str(bare), "--config", str(cfg)], "holds no tokenizer files")


@pytest.mark.slow
def test_hacrl_eval_takes_a_run_directory(tiny_agents, tmp_path, capsys):
    cfg = pair_config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=1"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "evaluating its newest checkpoint, step_000001" in out and "pass@1" in out
    fails_cleanly(capsys, ["eval", str(tmp_path), "--config", str(cfg)], "is not a model directory")


@pytest.mark.slow
def test_eval_and_export_never_read_a_damaged_checkpoint(tiny_agents, tmp_path, capsys):
    """Issue 42: `hacrl eval RUN_DIR` evaluated a checkpoint whose SHA-256 did not match (resume refused it)."""
    cfg = pair_config(tiny_agents, tmp_path, trainer={"steps": 2}, checkpoint={"every": 1, "keep_last": 3})
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
    fails_cleanly(capsys, ["eval", str(run / "checkpoints" / "step_000002"), "--config", str(cfg)],
                   "step_000002 is damaged", "model.safetensors does not match its SHA-256")  # fmt: skip
    fails_cleanly(capsys, ["export", str(run / "checkpoints" / "step_000002"), "--agent", "llama",
                            str(tmp_path / "out")], "is damaged")  # fmt: skip
    assert not (tmp_path / "out").exists()
    assert main(["export", str(run), "--agent", "llama", str(tmp_path / "out")]) == 0
    assert "skipping damaged checkpoint" in capsys.readouterr().out
    assert (run / "checkpoints" / "step_000002").is_dir()  # reading never renames anything


@pytest.mark.slow
def test_reward_and_checkpoint_errors_take_the_error_path_and_debug_shows_the_traceback(
    tiny_agents, tmp_path, capsys, monkeypatch
):
    cfg = pair_config(tiny_agents, tmp_path, scoring={"function": "tests.reward_fixtures:raises_on_x"})
    err = fails_cleanly(capsys, ["train", str(cfg), "trainer.steps=1"], "reward error: reward function")
    assert "KeyError: 'oops'" in err
    fails_cleanly(capsys, ["train", str(cfg), "checkpoint.resume=/no/such/checkpoint"], "/no/such/checkpoint")
    monkeypatch.setenv("HACRL_DEBUG", "1")
    with pytest.raises(Exception, match="does not exist"):
        main(["train", str(cfg), "checkpoint.resume=/no/such/checkpoint"])


@pytest.mark.slow
def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint_and_says_what_to_do(
    tiny_agents, tmp_path, capsys, monkeypatch
):
    import errno

    import hacrl.checkpoint

    cfg = pair_config(tiny_agents, tmp_path)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "trainer.steps=1"]) == 0
    real_save = torch.save

    def full_disk(obj, path, *args, **kwargs):
        if "optimizer" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(hacrl.checkpoint.torch, "save", full_disk)
    fails_cleanly(capsys, ["train", str(cfg), "--resume", "trainer.steps=2"], "No space left on device",
                   "its newest complete checkpoint", "step_000001) is intact, so `hacrl train CONFIG --resume` "
                   "continues from it")  # fmt: skip
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]  # no half-written leftovers
    monkeypatch.undo()
    assert main(["train", str(cfg), "--resume", "trainer.steps=2"]) == 0


# -- small defects -------------------------------------------------------------------------------------------------


def test_eval_max_prompts_must_be_positive(tiny_agents, tmp_path, capsys):
    cfg = pair_config(tiny_agents, tmp_path)
    fails_cleanly(capsys, ["train", str(cfg), "eval.max_prompts=-1"], "eval.max_prompts must be >= 1 or null")


def test_a_dict_override_replaces_the_dict_and_empty_clears_it(tiny_agents, tmp_path):
    cfg = pair_config(tiny_agents, tmp_path)
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
    cfg = pair_config(tiny_agents, tmp_path, trainer={"steps": 4}, checkpoint={"every": checkpoint_every})
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
    cfg = pair_config(tiny_agents, tmp_path, logging={"wandb": {"mode": "online"}})
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
    assert main(["train", str(pair_config(tiny_agents, tmp_path))]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "hacrl: interrupted (Ctrl-C)" and not (tmp_path / "run").exists()


def test_sigterm_during_start_up_is_one_line_and_leaves_nothing(tiny_agents, tmp_path, monkeypatch, capsys):
    """SIGTERM while the run starts killed the process silently (exit -15, found by the chaos soak); now it stops
    as Ctrl-C does then: one line, exit 143, nothing left behind."""
    import os
    import signal

    import hacrl.driver.trainer

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the start")

    monkeypatch.setattr(hacrl.driver.trainer, "load_task", terminated)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["train", str(pair_config(tiny_agents, tmp_path))]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stopped by SIGTERM while the run was starting" in err, err
    assert not (tmp_path / "run").exists()
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the start's only
    # issue 87.16's soak: the same in the seconds before, while the trainer's modules (torch) were imported
    import hacrl.tools.cli

    monkeypatch.setattr(hacrl.tools.cli, "_quiet_transformers", terminated)
    assert main(["train", str(pair_config(tiny_agents, tmp_path))]) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM while the run was starting" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.slow
def test_a_tracker_that_cannot_start_is_one_message(tiny_agents, tmp_path, monkeypatch, capsys):
    """W&B's own errors at init (no network, a bad key) are named with the setting to change."""
    wandb = pytest.importorskip("wandb")

    def refuses(**kwargs):
        raise wandb.errors.CommError("could not reach api.wandb.ai")

    monkeypatch.setattr(wandb, "init", refuses)
    cfg = pair_config(tiny_agents, tmp_path, logging={"wandb": {"mode": "offline"}})
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "logging.wandb could not start (CommError: could not reach api.wandb.ai)" in err, err
    assert "logging.wandb.mode=offline" in err and "Traceback" not in err


@pytest.mark.slow
def test_export_writes_beside_out_privately_and_a_failure_leaves_nothing(tiny_agents, tmp_path, capsys, monkeypatch):
    """Issue 61, 4 and 15: `hacrl export` removed `<OUT>.tmp-export` even when the user owned a directory of that
    name; a full disk gave shutil.Error and left 0-byte files under OUT; `export ... .` gave a ValueError. Now the
    export is written into a private directory beside OUT (mode as a new directory's) and renamed once whole."""
    import errno
    import shutil

    cfg = pair_config(tiny_agents, tmp_path, trainer={"steps": 1})
    run, out = tmp_path / "run", tmp_path / "exported"
    assert main(["train", str(cfg)]) == 0
    mine = tmp_path / "exported.tmp-export"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    real_copy = shutil.copy2

    def full_disk(src, dst, *args, **kwargs):
        if str(dst).endswith("model.safetensors"):
            open(dst, "wb").close()  # what a full disk leaves: an empty file
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real_copy(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copy2", full_disk)
    capsys.readouterr()
    err = fails_cleanly(capsys, ["export", str(run), "--agent", "llama", str(out)], "No space left on device",
                        f"to {str(out)!r}", "Free space on that disk")  # fmt: skip
    assert "trainer.output_dir" not in err and ".tmp-" not in err  # it named a temporary file and the run's key
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if "exported" in p.name) == ["exported.tmp-export"]
    monkeypatch.setattr(shutil, "copy2", real_copy)
    assert main(["export", str(run), "--agent", "llama", str(out)]) == 0
    assert (mine / "notes.txt").read_text() == "the user's"
    assert (out / "config.json").is_file() and oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())
    empty = tmp_path / "here"
    empty.mkdir()
    monkeypatch.chdir(empty)
    fails_cleanly(capsys, ["export", str(run), "--agent", "llama", "."], "is the working directory")


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.slow
@pytest.mark.parametrize(
    ("template", "message"),
    [("{% for m in messages %}{{ m.content }}", "(TemplateSyntaxError: Unexpected end of template"),
     ("{{ raise_exception('only system prompts') }}", "(TemplateError: only system prompts)")],
)  # fmt: skip
def test_a_chat_template_that_cannot_render_is_a_model_directory_error_before_training(
    template, message, tiny_agents, tmp_path, capsys
):
    """Issue 61, 14: a template that fails to render was a traceback at step 1; now the agent renders a probe
    prompt when it loads, and the error names the directory and the fix before any step."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_agents["qwen"], model)
    (model / "chat_template.jinja").write_text(template)
    cfg = pair_config({**tiny_agents, "qwen": model}, tmp_path)
    fails_cleanly(capsys, ["train", str(cfg)], f"agents.1: the chat template of agents.1.model ({model}) cannot "
                  "render a prompt with roles ['user']", message, "fix chat_template.jinja")  # fmt: skip
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
