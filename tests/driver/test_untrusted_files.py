"""No file of a checkpoint, model directory or config can run code or ask to (docs/reliability.md, "Files hacrl did
not write"): each file type of a checkpoint gets a planted payload that would touch a marker file if any of it ran;
the checkpoint's manifest is digested again, as an attacker who edits a checkpoint would do. Every case is refused
with one message naming the file, and the marker stays absent."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from hacrl.errors import CheckpointError
from hacrl.files import sha256_of
from tests.conftest import fails_cleanly, pair_config


class _Payload:
    """Unpickling this runs `touch <marker>`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def pickled_payload(marker: Path) -> bytes:
    """A torch.save archive whose unpickling touches `marker`."""
    buffer = io.BytesIO()
    torch.save(_Payload(marker), buffer)
    return buffer.getvalue()


def plant_code_module(directory: Path, marker: Path, file: str) -> None:
    """`auto_map` in `directory/file` naming a module beside it whose import touches `marker`."""
    (directory / "planted_code.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    data = json.loads((directory / file).read_text())
    data["auto_map"] = (
        {"AutoConfig": "planted_code.Config", "AutoModelForCausalLM": "planted_code.Model"}
        if file == "config.json"
        else {"AutoTokenizer": ["planted_code.Tokenizer", None]}
    )
    (directory / file).write_text(json.dumps(data))


def redigest(checkpoint: Path) -> None:
    """state.json's manifest made to match the files again (what someone who edits a checkpoint can do)."""
    state = json.loads((checkpoint / "state.json").read_text())
    state["files"] = {
        p.relative_to(checkpoint).as_posix(): {"size": p.stat().st_size, "sha256": sha256_of(p)}
        for p in sorted(checkpoint.rglob("*"))
        if p.is_file() and p.name != "state.json"
    }
    (checkpoint / "state.json").write_text(json.dumps(state))


def sharded_optimizer(directory: Path, marker: Path, attack: str) -> None:
    """A torch.distributed.checkpoint optimizer directory whose `.metadata` was edited: a bytes record whose payload
    unpickles into `touch marker` ("bytes record"), a tensor record stored outside the directory ("path outside"),
    or an attribute planted on a record ("planted attribute")."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex, TensorProperties

    from hacrl.checkpoint import read_sharded_metadata

    dcp.save({"w/exp_avg": torch.ones(3)}, checkpoint_id=str(directory))
    metadata = read_sharded_metadata(directory)
    payload = pickled_payload(marker)
    outside = directory.parent / "elsewhere.bin"
    outside.write_bytes(payload)
    if attack == "bytes record":
        record = BytesStorageMetadata()
        record.size, record.properties = torch.Size([3]), TensorProperties(dtype=torch.float32)  # what the loader reads
        metadata.state_dict_metadata["w/exp_avg"] = record
        (directory / "__0_0.distcp").write_bytes(payload)
        metadata.storage_data = {MetadataIndex("w/exp_avg"): _StorageInfo("__0_0.distcp", 0, len(payload))}
    elif attack == "path outside":
        index = next(iter(metadata.storage_data))
        metadata.storage_data = {index: _StorageInfo("../elsewhere.bin", 0, len(payload))}
    else:
        metadata.state_dict_metadata["w/exp_avg"].load_bytes = True
    (directory / ".metadata").write_bytes(pickle.dumps(metadata))


@pytest.mark.parametrize("attack", ["bytes record", "path outside", "planted attribute"])
def test_a_sharded_optimizers_metadata_describes_tensors_in_its_own_shards_only(tmp_path, attack):
    """Issue 61, 1: a bytes record made torch's load planner call torch.load(weights_only=False) on its payload,
    and a record's relative_path could point outside the checkpoint. Both are refused when the file is read; a
    planted attribute is dropped (the metadata is rebuilt from checked fields)."""
    from hacrl.agent.distributed import load_optimizer_tensors
    from hacrl.checkpoint import _sharded_problem, read_sharded_metadata

    marker = tmp_path / "ran"
    directory = tmp_path / "optimizer" / "w"
    directory.parent.mkdir()
    sharded_optimizer(directory, marker, attack)
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.AdamW([param])
    if attack == "planted attribute":
        assert _sharded_problem(directory) is None
        assert not hasattr(read_sharded_metadata(directory).state_dict_metadata["w/exp_avg"], "load_bytes")
        load_optimizer_tensors(optimizer, [param], ["w"], directory)
        assert torch.equal(optimizer.state[param]["exp_avg"], torch.ones(3))
    else:
        expect = "BytesStorageMetadata" if attack == "bytes record" else "not a shard file of this directory"
        assert expect in _sharded_problem(directory)
        with pytest.raises(CheckpointError, match=expect):
            load_optimizer_tensors(optimizer, [param], ["w"], directory)
    assert not marker.exists()


def test_the_load_planner_refuses_bytes_even_past_the_metadata_check(tmp_path, monkeypatch):
    """The second lock: with the metadata check bypassed, the planner still never unpickles a bytes record."""
    import hacrl.checkpoint
    from hacrl.agent.distributed import load_optimizer_tensors

    marker = tmp_path / "ran"
    directory = tmp_path / "w"
    sharded_optimizer(directory, marker, "bytes record")
    monkeypatch.setattr(hacrl.checkpoint, "_plain_sharded_metadata", lambda loaded: loaded)
    param = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(CheckpointError, match="stored as bytes"):
        load_optimizer_tensors(torch.optim.AdamW([param]), [param], ["w"], directory)
    assert not marker.exists()


def test_a_damaged_shard_is_found_without_digests_and_named_when_loaded(tmp_path):
    """Issue 61, 10: a cut-off or overwritten `.distcp` shard is a checkpoint problem (found by its records' bounds
    and archive markers, without reading the tensors), and a load of it is a CheckpointError, not torch's
    CheckpointException (a BaseException)."""
    import torch.distributed.checkpoint as dcp

    from hacrl.agent.distributed import load_optimizer_tensors
    from hacrl.checkpoint import _sharded_problem

    directory = tmp_path / "w"
    dcp.save({"w/exp_avg": torch.ones(3), "w/exp_avg_sq": torch.ones(3)}, checkpoint_id=str(directory))
    shard = directory / "__0_0.distcp"
    good = shard.read_bytes()
    shard.write_bytes(good[:-10])
    assert "cut off" in _sharded_problem(directory)
    shard.write_bytes(b"\0" * len(good))
    assert "are not a saved tensor" in _sharded_problem(directory)
    param = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_optimizer_tensors(torch.optim.AdamW([param]), [param], ["w"], directory)


PLANTS = {
    "config.json auto_map": "asks to run Python shipped with the model",
    "tokenizer_config.json auto_map": "asks to run Python shipped with the model",
    "optimizer pickle": "optimizer/qwen.pt: cannot be read",
    "sharded optimizer bytes record": "BytesStorageMetadata",
    "sharded optimizer path outside": "not a shard file of this directory",
    "rng pickle": "rng/qwen.pt: cannot be read",
    "weights as a pickle": "model.safetensors: missing",
    "config.yaml python tag": "could not determine a constructor for the tag",
    "chat template escaping its sandbox": "cannot render a prompt with roles ['user'] (SecurityError",
}


def plant(checkpoint: Path, what: str, marker: Path) -> None:
    agent = checkpoint / "agents" / "qwen"
    if what.endswith("auto_map"):
        plant_code_module(agent, marker, what.split()[0])
    elif what == "optimizer pickle":
        (checkpoint / "optimizer" / "qwen.pt").write_bytes(pickled_payload(marker))
    elif what.startswith("sharded optimizer"):
        (checkpoint / "optimizer" / "qwen.pt").unlink()
        sharded_optimizer(checkpoint / "optimizer" / "qwen", marker, what.removeprefix("sharded optimizer "))
        (checkpoint / "optimizer" / "elsewhere.bin").unlink()
        (checkpoint / "elsewhere.bin").write_bytes(pickled_payload(marker))  # what "../elsewhere.bin" would read
    elif what == "rng pickle":
        (checkpoint / "rng" / "qwen.pt").write_bytes(pickled_payload(marker))
    elif what == "chat template escaping its sandbox":  # the classic template injection: reach os through globals
        (agent / "chat_template.jinja").write_text(
            f"{{{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}}}{{{{ messages[0]['content'] }}}}"
        )
    elif what == "weights as a pickle":
        (agent / "model.safetensors").unlink()
        (agent / "pytorch_model.bin").write_bytes(pickled_payload(marker))
    else:
        text = (checkpoint / "config.yaml").read_text()
        (checkpoint / "config.yaml").write_text(f"{text}planted: !!python/object/apply:os.system ['touch {marker}']\n")
    redigest(checkpoint)


@pytest.mark.slow
@pytest.mark.parametrize("what", list(PLANTS))
def test_no_file_of_a_checkpoint_runs_code_on_resume_eval_or_export(what, tiny_agents, reference_run, tmp_path,
                                                                     capsys):  # fmt: skip
    """Each file type of a checkpoint, planted with a payload and digested again: `--resume` from it, `hacrl eval`
    and `hacrl export` of it refuse with one message naming the file; nothing of the payload runs."""
    marker = tmp_path / "ran"
    checkpoint = tmp_path / "planted" / "step_000003"
    shutil.copytree(reference_run / "checkpoints" / "step_000003", checkpoint)
    plant(checkpoint, what, marker)
    cfg = pair_config(tiny_agents, tmp_path)
    fails_cleanly(capsys, ["train", str(cfg), "trainer.steps=4", f"checkpoint.resume={checkpoint}"], PLANTS[what])
    if what.endswith("auto_map") or what in ("weights as a pickle", "chat template escaping its sandbox"):
        fails_cleanly(capsys, ["eval", str(checkpoint), "--config", str(cfg)], PLANTS[what])
    if what.endswith("auto_map") or what == "weights as a pickle":  # (export renders no template: it copies it)
        fails_cleanly(capsys, ["export", str(checkpoint), "--agent", "qwen", str(tmp_path / "out")], PLANTS[what])
        assert not (tmp_path / "out").exists()
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json"])
def test_a_model_directory_that_ships_code_is_refused_before_anything_runs(file, tiny_agents, tmp_path, capsys):
    """Issue 61, 2: `from_pretrained` asked "run the custom code? [y/N]" (a "y" ran it) for a model directory whose
    config names `auto_map`. Now train and plan refuse it, naming the file and, for a model transformers knows,
    the fix; nothing of the directory runs and no run directory is made."""
    marker = tmp_path / "ran"
    model = tmp_path / "model"
    shutil.copytree(tiny_agents["qwen"], model)
    plant_code_module(model, marker, file)
    cfg = pair_config({**tiny_agents, "qwen": model}, tmp_path)
    expect = [f"{model / file} asks to run Python shipped with the model", "never runs code"]
    if file == "config.json":
        expect.append("If transformers' own 'qwen2' class is the architecture, delete the auto_map entry")
    fails_cleanly(capsys, ["train", str(cfg)], *expect)
    if file == "config.json":
        fails_cleanly(capsys, ["plan", str(cfg)], *expect)
    assert not marker.exists() and not (tmp_path / "run").exists()
