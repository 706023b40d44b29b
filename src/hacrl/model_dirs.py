"""An agent's model on disk: a local Hugging Face directory, or a GGUF file (or a directory holding one) that
`hacrl.gguf` converts once into a plain directory. This module is the one place that asks which of the two a path
names; the config, the agent's loader, `hacrl plan` and `hacrl export` call it. hacrl loads local files only, never
downloads, and never runs code shipped with a model (`refuse_model_code`).
"""

from __future__ import annotations

import json
from pathlib import Path

from hacrl.errors import ModelError, clip


def require_model_dir(model: str | Path, key: str, *, convert: bool = True) -> Path:
    """`model` as a local Hugging Face model directory (one with config.json) that ships no code to run, or a
    ModelError that names the config key and the fix: hacrl loads local directories only and never downloads. A GGUF
    file (or a directory holding one) is converted once into a plain directory (`hacrl.gguf`), which is returned;
    `convert=False`: the GGUF file itself (`hacrl plan` reads its metadata only)."""
    from hacrl.gguf import gguf_file, plain_directory

    path = Path(model).expanduser()
    gguf = gguf_file(path)
    if gguf is not None:
        if not gguf.is_file():
            raise ModelError(f"{key}: the GGUF file {str(gguf)!r} does not exist (hacrl never downloads: point {key} "
                             "at a local copy, e.g. the one `hacrl bootstrap --recipe smollm2` fetches)")  # fmt: skip
        return plain_directory(gguf, key) if convert else gguf
    if not (path / "config.json").is_file():
        what = "holds no config.json" if path.is_dir() else "does not exist"
        raise ModelError(
            f"{key}: {str(model)!r} is not a Hugging Face model directory ({what}); hacrl loads local directories "
            f"only and never downloads: point {key} at a local copy (the paper presets ship placeholder paths: "
            f"`{key}=/models/<name>` on the command line)"
        )
    refuse_model_code(path, key)
    return path


CODE_FILES = ("config.json", "tokenizer_config.json")
"""The files of a model directory whose `auto_map` would make transformers import Python shipped beside them."""


def refuse_model_code(directory: str | Path, key: str) -> None:
    """ModelError when a model or tokenizer directory asks to run its own Python (`auto_map` in config.json or
    tokenizer_config.json: transformers would import the module it names, or ask "run the custom code? [y/N]").

    hacrl never runs code from a model, tokenizer or checkpoint directory, and every load also passes
    `trust_remote_code=False`; there is no opt-in. A model whose architecture transformers has (its `model_type`)
    loads with transformers' own class once `auto_map` is deleted from the file."""
    for name in CODE_FILES:
        file = Path(directory) / name
        if not file.is_file():
            continue
        try:
            data = json.loads(file.read_bytes()[: 1 << 24])
        except (OSError, ValueError):
            continue  # unreadable: the load itself names the problem, and runs nothing
        if isinstance(data, dict) and data.get("auto_map"):
            native = data.get("model_type") if name == "config.json" else None
            if native is not None:
                from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

                native = native if native in CONFIG_MAPPING_NAMES else None
            fix = (
                f"If transformers' own {native!r} class is the architecture, delete the auto_map entry from {name} "
                "and it loads with that class. "
                if native
                else ""
            )
            raise ModelError(
                f"{key}: {file} asks to run Python shipped with the model (auto_map: "
                f"{clip(json.dumps(data['auto_map']), 120)}); hacrl never runs code from a model, tokenizer or "
                f"checkpoint directory. {fix}A model that needs its own code cannot be trained with hacrl."
            )


def tokenizer_dir(path: str | Path, key: str) -> Path:
    """The directory an agent's tokenizer loads from: `path` itself, or a GGUF agent's converted directory (whose
    tokenizer and chat template came from the file's metadata)."""
    from hacrl.gguf import gguf_file, plain_directory

    path = Path(path)
    return plain_directory(path, key) if gguf_file(path) is not None else path


def model_config(source: str | Path, key: str):
    """The transformers config of `source` (`require_model_dir(..., convert=False)`) without reading its weights: a
    directory's config.json, or a GGUF file's metadata."""
    from transformers import AutoConfig

    from hacrl.gguf import gguf_config, gguf_file

    if gguf_file(source) is not None:
        return gguf_config(source, key)
    return AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False)
