"""`hacrl export RUN_DIR --agent NAME OUT`: one trained agent as a plain Hugging Face model directory.

A fully trained agent's checkpoint part already is one: it is copied when it holds the dtype asked for, else
loaded and written in that dtype (`--dtype`; default: the agent's compute dtype, which its config.json names: a
bfloat16 agent's checkpoint holds its float32 master weights, and exports in bfloat16 unless `--dtype float32`). A
LoRA agent's part holds its adapters in peft's format, with the path of its base model: `export` loads the base,
merges the adapters into its weights and writes a directory that `AutoModelForCausalLM.from_pretrained` loads with
nothing of hacrl or peft installed; `--adapters-only` copies the adapters instead (for `PeftModel.from_pretrained`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

from hacrl.checkpoint import adapter_base
from hacrl.errors import CheckpointError, ModelError
from hacrl.model_dirs import refuse_model_code, require_model_dir

EXPORT_DTYPES = ("auto", "float32", "bfloat16", "float16")


def saved_dtype(directory: str | Path) -> str:
    """The dtype a model directory's config.json names (its compute dtype), float32 when it names none."""
    config = json.loads((Path(directory) / "config.json").read_text())
    value = config.get("dtype") or config.get("torch_dtype") or "float32"
    return str(value).removeprefix("torch.")


_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def _weights_dtype(directory: Path) -> str | None:
    """The dtype of the first tensor stored in a model directory's safetensors (None: cannot tell)."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    with safe_open(str(files[0]), "pt") as f:
        keys = list(f.keys())
        return _SAFETENSORS_DTYPES.get(f.get_slice(keys[0]).get_dtype()) if keys else None


def merged_model(directory: str | Path, dtype: str = "auto"):
    """The base model of a LoRA agent's checkpoint part with its adapters merged into the weights (a plain
    `PreTrainedModel`: no peft layers left), in `dtype` ("auto": the base's)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = adapter_base(directory)
    if base is None or not (Path(base) / "config.json").is_file():
        raise ModelError(
            f"{directory}: the adapters' base model {base!r} is not a local model directory; the base a LoRA "
            "agent trained on must stay where the run found it (agents.<i>.model)"
        )
    require_model_dir(base, "the adapters' base model")
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True, dtype=_torch_dtype(dtype),
                                                 trust_remote_code=False)  # fmt: skip
    return PeftModel.from_pretrained(model, str(directory)).merge_and_unload()


def _torch_dtype(dtype: str):
    import torch

    return "auto" if dtype == "auto" else getattr(torch, dtype)


def export_agent(
    path: str | Path, agent: str, out: str | Path, *, adapters_only: bool = False, dtype: str = "auto"
) -> Path:
    """Write agent `agent` of a run directory's newest checkpoint (or of the checkpoint `path`) to `out`, its
    weights in `dtype` ("auto": the agent's compute dtype). Written into a private directory beside `out` and
    renamed to `out` once whole: a failure (a full disk) leaves nothing under `out` and no temporary behind."""
    from hacrl.checkpoint import AGENTS_DIR, agent_weights_dir, checkpoint_to_read
    from hacrl.files import private_dir_beside

    path, out = Path(path), Path(out).absolute()
    if out == Path.cwd() or out in Path.cwd().parents:
        raise CheckpointError(f"{str(out)!r} is the working directory (or holds it): name a new directory for the "
                              "export (e.g. ./exported)")  # fmt: skip
    checkpoint = checkpoint_to_read(path, notice=lambda message: print(f"hacrl export: {message}"))
    if checkpoint is None:
        raise CheckpointError(
            f"{str(path)!r} is neither a checkpoint nor a run directory with a complete, undamaged one"
        )
    source = agent_weights_dir(checkpoint, agent)
    if not source.is_dir():
        names = sorted(p.name for p in (checkpoint / AGENTS_DIR).iterdir() if p.is_dir())
        raise CheckpointError(f"{checkpoint} has no agent {agent!r} (it holds {names}; a frozen agent has none)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{str(out)!r} exists and is not an empty directory: choose a new directory")
    lora = adapter_base(source) is not None
    refuse_model_code(source, f"agent {agent!r} of {checkpoint}")
    if adapters_only and not lora:
        raise CheckpointError(f"agent {agent!r} was fully fine-tuned: it has no adapters; export it without "
                              "--adapters-only")  # fmt: skip
    if dtype not in EXPORT_DTYPES:
        raise CheckpointError(f"--dtype {dtype!r}: choose one of {', '.join(EXPORT_DTYPES)}")
    target = _compute_dtype(checkpoint, agent, source, lora) if dtype == "auto" else dtype
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = private_dir_beside(out)  # never a directory of the user's, whatever its name
    try:
        _write(source, tmp, target, adapters_only=adapters_only, lora=lora)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)  # a half-written export never stands under the name asked for
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS):
            raise CheckpointError(
                f"could not write the export of agent {agent!r} to {str(out)!r} ({e.strerror}); nothing was left "
                f"there. Free space on that disk or fix its permissions, or export into another directory"
            ) from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write(source: Path, tmp: Path, target: str, *, adapters_only: bool, lora: bool) -> None:
    """The export's files into `tmp`: the adapters as they are, or the weights in `target` (LoRA merged)."""
    from hacrl.agent.model import load_tokenizer

    if adapters_only:
        _copy_files(source, tmp)
    elif not lora and _weights_dtype(source) == target:
        _copy_files(source, tmp)
        _name_dtype(tmp, target)
    else:
        if lora:
            model = merged_model(source, "float32").to(_torch_dtype(target))  # merged in float32, then cast
        else:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype=_torch_dtype(target),
                                                         trust_remote_code=False)  # fmt: skip
        model.save_pretrained(tmp, safe_serialization=True)
        load_tokenizer(source).save_pretrained(tmp)
        _name_dtype(tmp, target)


def _compute_dtype(checkpoint: Path, agent: str, source: Path, lora: bool) -> str:
    """The agent's compute dtype: what a full agent's config.json names; for a LoRA agent (its part holds adapters
    only), the `dtype` the checkpoint's config.yaml gives the agent (else its base model's)."""
    if not lora:
        return saved_dtype(source)
    from hacrl.driver.resume import saved_config

    try:
        entries = saved_config(checkpoint).get("agents") or []
        named = [a.get("dtype") for a in entries if isinstance(a, dict) and a.get("name") == agent]
    except CheckpointError:
        named = []
    if named and named[0] in EXPORT_DTYPES[1:]:
        return named[0]
    return saved_dtype(adapter_base(source))


def _name_dtype(directory: Path, dtype: str) -> None:
    """config.json names `dtype`, the dtype of the weights written (`from_pretrained(dtype="auto")` reads it)."""
    from hacrl.files import write_atomically

    config = json.loads((directory / "config.json").read_text())
    config["dtype"] = dtype
    if "torch_dtype" in config:
        config["torch_dtype"] = dtype
    write_atomically(directory / "config.json", json.dumps(config, indent=2) + "\n")


def _copy_files(source: Path, target: Path) -> None:
    """Every file under `source` into `target`, one at a time (an OSError, e.g. a full disk, names its file)."""
    for file in sorted(source.rglob("*")):
        destination = target / file.relative_to(source)
        if file.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
        else:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, destination)
