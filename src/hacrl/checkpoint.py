"""Checkpoints that a crash can never break, that are checked before use, and resume.

Layout of `<output_dir>/checkpoints/step_000010/` (each worker writes its agent's three parts, the driver the rest):
    agents/<name>/        a plain Hugging Face model directory (safetensors, config, tokenizer, chat template)
    optimizer/<name>.pt   the agent's AdamW state (tensors and numbers only; loaded with weights_only=True)
    rng/<name>.pt         the agent's random stream (CPU / CUDA generator states; tensors only)
  an agent on K >= 2 devices (`agents.<i>.devices`, a worker group; rank 0 writes the model directory, gathered):
    optimizer/<name>/     its AdamW state sharded with torch.distributed.checkpoint (each rank writes its part:
                          `__<rank>_0.distcp`, and `.metadata`), instead of optimizer/<name>.pt
    rng/<name>.rank<r>.pt the random stream of rank r >= 1 (rank 0's is rng/<name>.pt)
    pending.pt            trainer.lag = k > 0: the k batches in flight (sampled and scored, not yet trained on), with
                          every agent's answers, rewards, token ids and behaviour log-probs (`hacrl.inflight`)
    config.yaml           the run's resolved config
    state.json            step, agent names (and which are frozen: their part is rng/<name>.pt only), capability
                          history, data position, and the size and SHA-256 of every other file of the checkpoint

Rules:
1. A checkpoint is written into a directory private to its writer (`step_000010.tmp-<pid>-<random>`), `state.json`
   last, then renamed; a directory named `step_*` without a suffix is always whole. Older ones are pruned only
   after that. Leftover temporary directories of a crashed writer are removed when the next run takes the lock.
2. Before a checkpoint is resumed from it is checked: `state.json` readable, every listed file present with its
   size (and its SHA-256 when `checkpoint.verify_digests`), each safetensors header and optimizer archive
   readable, and pending.pt's values within what its run allows (`hacrl.inflight.pending_problems`). A damaged
   newest checkpoint is renamed `step_N.damaged` (kept for inspection) and resume falls back to the newest good
   one, saying so; an explicitly named checkpoint is never replaced by another.
3. Loading never runs code from a file (the rule and every loader: docs/reliability.md, "Files hacrl did not
   write"): safetensors, `torch.load(weights_only=True)`, and a sharded optimizer's `.metadata` (a pickle written by
   torch.distributed.checkpoint) through an unpickler that admits only its own record classes, rebuilt as tensor
   records stored in the directory's own shards (`read_sharded_metadata`), read with a planner that refuses bytes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hacrl import faults
from hacrl.errors import CheckpointError, clip, first_line
from hacrl.files import sha256_of
from hacrl.inflight import PENDING_FILE, pending_problems

_STEP_DIR = re.compile(r"^step_(\d{6,})$")
_TMP_DIR = re.compile(r"^step_(\d{6,})\.tmp(-.*)?$")
_REQUIRED_STATE = ("step", "agents", "capability", "data", "files")


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Every complete checkpoint (a `step_N` directory with a state.json), oldest first."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / "state.json").is_file()]
    return sorted(done, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under `output_dir`, or None (not checked for damage: see `resume_point`)."""
    done = complete_checkpoints(output_dir)
    return done[-1] if done else None


def remove_stale_temporaries(output_dir: str | Path, notice: Callable[[str], None]) -> None:
    """Delete what crashed writers left (`step_N.tmp*`); call only while holding the run directory's lock."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return
    for path in sorted(root.iterdir()):
        if _TMP_DIR.match(path.name):
            notice(f"removing {path}, an unfinished checkpoint left by an interrupted run")
            shutil.rmtree(path, ignore_errors=True)


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    write_parts: Callable[[Path], None],
    state: dict[str, Any],
    *,
    keep_last: int,
    config_yaml: str = "",
) -> Path:
    """Write checkpoint `step`: `write_parts(tmp)` has every worker write its part into the writer-private
    temporary directory; then config.yaml, then state.json with the manifest, synced; then the rename; then the
    pruning of older checkpoints beyond `keep_last`."""
    root = checkpoint_root(output_dir)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp-{os.getpid()}-{secrets.token_hex(4)}"  # private to this writer
    try:
        tmp.mkdir(parents=True)
        write_parts(tmp)
        if config_yaml:
            (tmp / "config.yaml").write_text(config_yaml)
        state = {**state, "files": _manifest(tmp)}
        _write_durably(tmp / "state.json", json.dumps(state, indent=1))  # last: its presence marks "complete"
        _fsync_dir(tmp)
        faults.hit("checkpoint.before_rename")
        if final.exists():  # the same step saved twice (e.g. a resumed run): replace only once the new one is whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    faults.hit("checkpoint.after_rename")
    complete = [p for p in root.iterdir() if _STEP_DIR.match(p.name)]
    complete.sort(key=lambda p: int(_STEP_DIR.match(p.name).group(1)))
    for old in complete[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _manifest(directory: Path) -> dict[str, dict[str, Any]]:
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        files[path.relative_to(directory).as_posix()] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
    return files


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- checking and choosing a checkpoint --------------------------------------------------------------------------------


def checkpoint_problems(path: str | Path, *, verify_digests: bool = True) -> list[str]:
    """What is wrong with a checkpoint directory, as messages that name the file; [] when it is usable."""
    path = Path(path)
    try:
        state = json.loads((path / "state.json").read_text())
    except FileNotFoundError:
        return ["state.json is missing (the checkpoint was never completed)"]
    except (ValueError, UnicodeDecodeError) as e:
        return [f"state.json is not valid JSON ({e})"]
    if not isinstance(state, dict):
        return ["state.json does not hold an object"]
    problems = [f"state.json has no {key!r}" for key in _REQUIRED_STATE if key not in state]
    if problems:
        return problems
    problems = _state_problems(path, state)
    if problems:
        return problems
    listed = state["files"]
    for name, info in listed.items():
        file = path / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif file.stat().st_size != info.get("size"):
            problems.append(f"{name} has {file.stat().st_size} bytes, {info.get('size')} were written (cut off?)")
        elif verify_digests and sha256_of(file) != info.get("sha256"):
            problems.append(f"{name} does not match its SHA-256 (the bytes changed after it was written)")
    frozen = set(state.get("frozen") or [])
    for name in state["agents"]:
        part = agent_part(path, name)
        rng = part.rng_file
        problem = _torch_file_problem(rng)
        if problem:
            problems.append(f"{rng.relative_to(path)}: {problem}")
        if name in frozen:  # a frozen agent's part is its random stream only
            continue
        agent_dir = part.weights_dir
        for weights in sorted(agent_dir.glob("*.safetensors")) or [agent_dir / "model.safetensors"]:
            problem = _safetensors_problem(weights)
            if problem:
                problems.append(f"{weights.relative_to(path)}: {problem}")
        optimizer = part.optimizer_file
        if not optimizer.exists() and part.optimizer_dir.is_dir():  # sharded (an agent on K devices)
            optimizer, problem = part.optimizer_dir, _sharded_problem(part.optimizer_dir)
        else:
            problem = _torch_file_problem(optimizer)
        if problem:
            problems.append(f"{optimizer.relative_to(path)}: {problem}")
    if not any(p.startswith(PENDING_FILE) for p in problems):
        problems += pending_problems(path, state)  # the values of the batches in flight, not only their bytes
    return sorted(set(problems), key=problems.index)


def _state_problems(path: Path, state: dict[str, Any]) -> list[str]:
    """What in state.json has the wrong type or contradicts the checkpoint it is in (its step and the directory's
    name, agent names that are not folder names, file names outside the checkpoint)."""
    from hacrl.config.agent import check_name
    from hacrl.errors import ConfigError

    step, agents, frozen, files = state["step"], state["agents"], state.get("frozen") or [], state["files"]
    if type(step) is not int or step < 0:
        return [f"state.json's 'step' is {clip(repr(step))}, not a step number"]
    named = _STEP_DIR.match(path.name)
    if named and int(named.group(1)) != step:
        return [f"state.json says step {step} but the directory is {path.name}: it belongs to another checkpoint"]
    if not isinstance(agents, list) or not agents:
        return [f"state.json's 'agents' is {clip(repr(agents))}, not a list of agent names"]
    for i, name in enumerate(agents):
        try:
            check_name(name, f"state.json's agents[{i}]", "agent")
        except ConfigError as e:
            return [str(e)]
    if not isinstance(frozen, list) or not set(map(str, frozen)) <= set(agents):
        return [f"state.json's 'frozen' is {clip(repr(frozen))}, not a list of its agents"]
    for key in ("capability", "data"):
        if not isinstance(state[key], dict):
            return [f"state.json's {key!r} is a {type(state[key]).__name__}, not the saved state (a mapping)"]
    if not isinstance(files, dict):
        return ["state.json's 'files' is not a mapping of file names to sizes and digests"]
    for name, info in files.items():
        parts = Path(name).parts
        if Path(name).is_absolute() or ".." in parts or not parts:
            return [f"state.json lists {clip(repr(name))}, a path outside the checkpoint"]
        if not isinstance(info, dict) or type(info.get("size")) is not int or not isinstance(info.get("sha256"), str):
            return [f"state.json's entry for {name} is not a size and a digest"]
    return []


_SHARDED_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "ChunkStorageMetadata", "MetadataIndex", "StorageMeta", "TensorProperties",
        "TensorStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
}  # fmt: skip


_SHARD_FILE = re.compile(r"^__\d{1,6}_\d{1,6}\.distcp$")
"""The only files a sharded optimizer's records may point at: the shards torch.distributed.checkpoint writes."""


def read_sharded_metadata(directory: str | Path):
    """The `.metadata` of a torch.distributed.checkpoint directory, as plain data that can only describe tensors.

    It is unpickled with only its own record classes (and torch.Size / dtypes) admitted: a file that names anything
    else is refused, never run. Then a new `Metadata` is built from what the file holds, field by field, with every
    type checked: a record that is not a tensor's (a bytes record, which torch's load planner would hand to
    `torch.load(weights_only=False)`), a shard path that is not a plain `__<rank>_<n>.distcp` file of this directory,
    a transform (compression, an extension) or an attribute planted on a record (pickle can set any) are refused
    with a CheckpointError, or dropped: nothing of the file but numbers, dtypes, names and shard file names
    reaches torch."""
    import pickle

    class _Records(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
                return getattr(torch, name)
            if name in _SHARDED_METADATA_CLASSES.get(module, ()):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")

    with open(Path(directory) / ".metadata", "rb") as f:
        return _plain_sharded_metadata(_Records(f).load())


def _plain_sharded_metadata(loaded: Any):
    """A new Metadata holding only the tensor records of `loaded` (an unpickled `.metadata`), each field
    type-checked; CheckpointError naming the first record that is anything else."""
    from torch.distributed.checkpoint.metadata import Metadata

    if type(loaded) is not Metadata or type(loaded.state_dict_metadata) is not dict:
        raise _not_ours(f"holds a {type(loaded).__name__}, not a checkpoint's Metadata")
    tensors = {fqn: _tensor_record(fqn, record) for fqn, record in loaded.state_dict_metadata.items()}
    if type(loaded.storage_data) is not dict:
        raise _not_ours("has no table of where each tensor is stored")
    storage = dict(_storage_entry(index, info, tensors) for index, info in loaded.storage_data.items())
    return Metadata(state_dict_metadata=tensors, planner_data=None, storage_data=storage)


def _not_ours(what: str) -> CheckpointError:
    return CheckpointError(f"its .metadata {what}; it was not written by hacrl (or was changed since)")


def _shape(value: Any, what: str) -> torch.Size:
    if type(value) is not torch.Size or len(value) > 64 or any(type(n) is not int or n < 0 for n in value):
        raise _not_ours(f"gives {what} as {type(value).__name__}, not a shape")
    return torch.Size(value)


def _count(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise _not_ours(f"gives {what} as {clip(repr(value))}, not a count")
    return value


def _tensor_record(fqn: Any, record: Any):
    """A fresh TensorStorageMetadata from a loaded record's checked fields (dtype, size, chunks); nothing else."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorProperties, TensorStorageMetadata

    if type(fqn) is not str:
        raise _not_ours(f"names a record {clip(repr(fqn))}, not a string")
    if type(record) is not TensorStorageMetadata:
        raise _not_ours(f"describes {fqn!r} as a {type(record).__name__}: an optimizer checkpoint holds tensors only")
    dtype = getattr(record.properties, "dtype", None)
    if type(record.properties) is not TensorProperties or not isinstance(dtype, torch.dtype):
        raise _not_ours(f"gives {fqn!r} no dtype")
    if type(record.chunks) is not list or any(type(c) is not ChunkStorageMetadata for c in record.chunks):
        raise _not_ours(f"gives {fqn!r} no list of chunk records")
    chunks = [ChunkStorageMetadata(offsets=_shape(c.offsets, f"{fqn!r}'s chunk offsets"),
                                   sizes=_shape(c.sizes, f"{fqn!r}'s chunk sizes")) for c in record.chunks]  # fmt: skip
    return TensorStorageMetadata(TensorProperties(dtype=dtype), _shape(record.size, f"{fqn!r}'s size"), chunks)


def _storage_entry(index: Any, info: Any, tensors: dict[str, Any]):
    """(a fresh MetadataIndex, a fresh _StorageInfo) for a loaded storage entry of a described tensor, stored in a
    plain shard file of this directory, with no transform."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    if type(index) is not MetadataIndex or type(index.fqn) is not str or index.fqn not in tensors:
        raise _not_ours(f"stores data for {clip(repr(getattr(index, 'fqn', index)))}, which it describes as no tensor")
    offset = None if index.offset is None else _shape(index.offset, f"{index.fqn!r}'s offset")
    number = None if index.index is None else _count(index.index, f"{index.fqn!r}'s index")
    if type(info) is not _StorageInfo:
        raise _not_ours(f"stores {index.fqn!r} in a {type(info).__name__}, not a shard's record")
    path = info.relative_path
    if type(path) is not str or not _SHARD_FILE.match(path):
        raise _not_ours(f"stores {index.fqn!r} in {clip(repr(path))}, not a shard file of this directory "
                        "(__<rank>_<n>.distcp)")  # fmt: skip
    if getattr(info, "transform_descriptors", None):
        raise _not_ours(f"asks for transforms {clip(repr(info.transform_descriptors))} of {index.fqn!r}'s bytes "
                        "(hacrl writes none)")  # fmt: skip
    return (MetadataIndex(fqn=index.fqn, offset=offset, index=number),
            _StorageInfo(path, _count(info.offset, "an offset"), _count(info.length, "a length")))  # fmt: skip


def _sharded_problem(directory: Path) -> str | None:
    try:
        metadata = read_sharded_metadata(directory)
    except CheckpointError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - any failure to read it is the problem we report
        return f"its .metadata cannot be read ({type(e).__name__}: {first_line(e, 160)})"
    files: dict[str, int] = {}
    for info in metadata.storage_data.values():
        files[info.relative_path] = max(files.get(info.relative_path, 0), info.offset + info.length)
    missing = sorted(f for f in files if not (directory / f).is_file())
    if missing:
        return f"{', '.join(missing)} missing"
    for name, end in sorted(files.items()):
        problem = _shard_problem(directory / name, end, metadata)
        if problem:
            return f"{name}: {problem}"
    return None


def _shard_problem(path: Path, end: int, metadata) -> str | None:
    """A shard file shorter than its records say, or a record whose bytes are not a torch archive (checked at both
    ends of each record, without reading the tensors: a cut-off or overwritten shard, found with digests off)."""
    size = path.stat().st_size
    if size < end:
        return f"{size} bytes where its records reach byte {end} (cut off?)"
    with open(path, "rb") as f:
        for index, info in metadata.storage_data.items():
            if info.relative_path != path.name:
                continue
            f.seek(info.offset)
            head = f.read(4)
            f.seek(info.offset + max(info.length - 22, 0))
            tail = f.read(22)
            if head != b"PK\x03\x04" or b"PK\x05\x06" not in tail:  # a zip archive: torch.save's format
                return f"the bytes of {index.fqn!r} are not a saved tensor (damaged?)"
    return None


def _safetensors_problem(path: Path) -> str | None:
    if not path.is_file():
        return "missing"
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header_size = int.from_bytes(f.read(8), "little")
            if size < 8 or header_size > size - 8:
                return f"{size} bytes, too short for its header (cut off?)"
            header = json.loads(f.read(header_size))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if size != 8 + header_size + end:
            return f"{size} bytes where its header describes {8 + header_size + end} (cut off?)"
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        return f"not a readable safetensors file ({type(e).__name__})"
    return None


def _torch_file_problem(path: Path) -> str | None:
    if not path.is_file():
        return "missing"
    try:
        torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except Exception as e:  # noqa: BLE001 - any failure to read it is the problem we report
        return f"cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    return None


def resume_point(
    output_dir: str | Path, *, verify_digests: bool, notice: Callable[[str], None]
) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that passes `checkpoint_problems`, and what was found damaged on the way.

    Each damaged checkpoint newer than the chosen one is renamed `step_N.damaged` (kept, never used again) and
    reported through `notice`, so a fallback is never silent."""
    damaged: list[str] = []
    for path in reversed(complete_checkpoints(output_dir)):
        problems = checkpoint_problems(path, verify_digests=verify_digests)
        if not problems:
            if damaged:
                notice(f"resuming from the newest good checkpoint instead: {path}")
            return path, damaged
        target = path.with_name(path.name + ".damaged")
        if target.exists():
            shutil.rmtree(target)
        os.replace(path, target)
        report = f"checkpoint {path} is damaged: {'; '.join(problems)}. Moved to {target.name} (kept for inspection)"
        notice(report)
        damaged.append(report)
    return None, damaged


def checkpoint_to_read(path: str | Path, *, notice: Callable[[str], None]) -> Path | None:
    """For reading only (`hacrl eval`, `hacrl export`): `path` when it is a checkpoint, refused when damaged; else
    the newest undamaged checkpoint of the run directory `path` (None when it has no complete one), with a notice for
    each damaged one passed over. Nothing is renamed or changed (unlike `resume_point`)."""
    path = Path(path)
    if (path / AGENTS_DIR).is_dir():
        problems = checkpoint_problems(path)
        if problems:
            raise CheckpointError(f"checkpoint {path} is damaged: {'; '.join(problems)}; use another checkpoint")
        return path
    for candidate in reversed(complete_checkpoints(path)):
        problems = checkpoint_problems(candidate)
        if not problems:
            return candidate
        notice(f"skipping damaged checkpoint {candidate}: {'; '.join(problems)}")
    return None


def read_checkpoint_state(path: str | Path, agent_names: list[str]) -> dict[str, Any]:
    """state.json of a checkpoint, checked against the run's agents (before any model loads)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist (checkpoint.resume names a directory)")
    problems = checkpoint_problems(path, verify_digests=False)
    if problems:
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be used: {'; '.join(problems)}")
    state = json.loads((path / "state.json").read_text())
    if state.get("agents") != agent_names:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds agents {state.get('agents')} but the config has "
            f"{agent_names}; resume with the same agents in the same order"
        )
    return state


AGENTS_DIR = "agents"
"""A checkpoint's folder of agent model directories (`hacrl eval CHECKPOINT` evaluates each)."""


@dataclass(frozen=True)
class AgentPart:
    """Where one agent's part of a checkpoint lives (the layout above: written by its worker, checked here)."""

    checkpoint: Path
    name: str

    @property
    def weights_dir(self) -> Path:
        """Its plain Hugging Face model directory."""
        return self.checkpoint / AGENTS_DIR / self.name

    @property
    def optimizer_file(self) -> Path:
        return self.checkpoint / "optimizer" / f"{self.name}.pt"

    @property
    def optimizer_dir(self) -> Path:
        """A worker group's sharded optimizer state (torch.distributed.checkpoint)."""
        return self.checkpoint / "optimizer" / self.name

    @property
    def rng_file(self) -> Path:
        return self.checkpoint / "rng" / f"{self.name}.pt"

    def rank_rng_file(self, rank: int) -> Path:
        """Rank `rank`'s random stream in a worker group (rank 0's is `rng_file`)."""
        return self.rng_file if rank == 0 else self.checkpoint / "rng" / f"{self.name}.rank{rank}.pt"


def agent_part(path: str | Path, name: str) -> AgentPart:
    """Agent `name`'s part of the checkpoint at `path`."""
    return AgentPart(Path(path), name)


_OS_ERROR = re.compile(r"\(os error (\d+)\)")
"""How Rust's I/O errors end their message (safetensors' `SafetensorError: ... I/O error: No space left on device
(os error 28)`)."""


@contextmanager
def writing_part(who: str, root: str | Path, command: str):
    """Writing `who`'s part (`agent 'qwen'`, `rank 1 of agent 'qwen'`, `policy 'arm2'`) of the checkpoint being
    made in `root`: an OSError goes on as it is (the one error path names its errno, file and fix:
    `cli._os_error_message`), and so does one that another library raised under a type of its own with the errno in
    its message (safetensors' writer: a full disk there ended `hacrl control` in a traceback, exit 1); any other
    failure is a CheckpointError that says the previous checkpoint is intact and how to go on (`command`)."""
    try:
        yield
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - disk full, quota, I/O: torch and safetensors raise their own types
        found = _OS_ERROR.search(str(e))
        if found:
            code = int(found.group(1))
            raise OSError(code, os.strerror(code), str(root)) from e
        raise CheckpointError(
            f"could not write {who}'s part of a checkpoint into {str(root)!r}: {type(e).__name__}: "
            f"{first_line(e, 300)}. The previous checkpoint is intact (a checkpoint is only moved into place once "
            f"whole); free disk space or fix the directory's permissions, then continue with `{command}`."
        ) from e


# -- the payloads: one writer and one reader each, for every trainer (agent workers, ranks, control policies) --------


def driver_state(
    *, step: int, agents: list[str], capability: dict, data: dict, algorithm: str, frozen: list[str] | None = None
) -> dict[str, Any]:
    """The driver's record in state.json (the manifest `files` is added by `save_checkpoint`): the step, the agents
    in order (those frozen: their part is their random stream only), the capability tracker's and the data stream's
    states (`state_dict()`), and the algorithm's name. What `_state_problems` checks when it is read back."""
    return {"step": step, "agents": list(agents), "capability": capability, "data": data, "algorithm": algorithm,
            "frozen": list(frozen or [])}  # fmt: skip


def write_rng(file: Path, rng: dict[str, torch.Tensor], optimizer_steps: int) -> None:
    """An agent's (or a rank's) random stream and its optimizer-step count (`rng/<name>[.rank<r>].pt`)."""
    file.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**rng, "optimizer_steps": optimizer_steps}, file)


def read_rng(file: Path, who: str) -> tuple[dict[str, torch.Tensor], int]:
    """(the generator states, the optimizer-step count) that `write_rng` wrote, read as tensors only; a CheckpointError
    naming the file and `who` (e.g. "agent 'qwen'") when it is missing, damaged or not a random stream."""
    try:
        rng = torch.load(file, weights_only=True)
        steps = int(rng.pop("optimizer_steps", 0))
        torch.Generator().set_state(rng["cpu"])  # a readable file with the wrong content is damaged too
    except Exception as e:  # noqa: BLE001 - a damaged or missing random-stream file: named, with what to do
        raise CheckpointError(
            f"{file}: cannot load the random stream of {who} ({type(e).__name__}: {first_line(e)}); the checkpoint is "
            "damaged (checkpoint.verify_digests=true finds such files before resuming and falls back to an earlier "
            "checkpoint): resume from an earlier one (checkpoint.resume=<its directory>)"
        ) from e
    return rng, steps


def write_optimizer(file: Path, state: dict[str, Any]) -> None:
    """An optimizer's `state_dict()` (`optimizer/<name>.pt`: tensors and numbers)."""
    file.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, file)


def read_optimizer(file: Path, who: str, map_location: Any = "cpu", settings: dict | None = None) -> dict[str, Any]:
    """The `state_dict()` that `write_optimizer` wrote, read as tensors only (never unpickled as code) onto
    `map_location`; a CheckpointError naming the file and `who` otherwise. `settings` (the run's lr, betas,
    weight_decay) replace the saved ones in every parameter group: torch's `load_state_dict` restores a group's
    hyper-parameters from the file, so a resume whose lr was changed (`checkpoint.strict_resume=false`, which
    announces the change) kept training at the checkpoint's lr."""
    try:
        state = torch.load(file, weights_only=True, map_location=map_location)
    except Exception as e:  # noqa: BLE001 - named, with what to do; never retried with weights_only=False
        raise CheckpointError(
            f"{file}: cannot load the optimizer state of {who} ({type(e).__name__}: {first_line(e)}); resume from an "
            "earlier checkpoint (checkpoint.resume=<its directory>)"
        ) from e
    if settings:
        for group in state.get("param_groups", []) if isinstance(state, dict) else []:
            if isinstance(group, dict):
                group.update(settings)
    return state


def adapter_base(directory: str | Path) -> str | None:
    """The base model directory a LoRA agent's adapters were trained on, or None when `directory` holds no
    adapters (a full model directory)."""
    config = Path(directory) / "adapter_config.json"
    if not config.is_file():
        return None
    return json.loads(config.read_text())["base_model_name_or_path"]


def agent_weights_dir(path: str | Path, name: str) -> Path:
    """The Hugging Face model directory of agent `name` inside a checkpoint."""
    return agent_part(path, name).weights_dir
