"""GGUF agents: `agents.<i>.model` may name a `.gguf` file (or a directory holding one and no config.json).

A GGUF file holds quantized weights, the tokenizer and its chat template, and no code. transformers reads it
(`from_pretrained(dir, gguf_file=NAME)`, which needs the `gguf` and `accelerate` packages: `pip install
"hacrl[gguf]"`) and dequantizes it into a model that it marks as quantized, which `save_pretrained` refuses. So a
GGUF agent is converted once into a plain Hugging Face directory (float32 safetensors, tokenizer, chat template,
generation config) in hacrl's cache (`HACRL_CACHE`, else `$XDG_CACHE_HOME/hacrl`, else `~/.cache/hacrl`), keyed by
the file's SHA-256; every later load, in any process, reads that directory, in the agent's dtype. It trains,
checkpoints, resumes and exports like any other agent. **The weights are the GGUF's dequantized values** (for a 4-bit
file: 4-bit weights, not the original release's bfloat16), and the converted directory says so in `SOURCE.md`.

The conversion is written into a private directory and renamed into place once whole, under a lock (two workers
that start at once convert once); a file that cannot be converted (cut short, no tokenizer in its metadata, an
architecture transformers cannot dequantize) is one paragraph naming it, with nothing left behind. `hacrl plan`
reads a GGUF's shape from its metadata alone (`gguf_config`), without dequantizing.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from hacrl.errors import ModelError
from hacrl.files import sha256_of

SUFFIX = ".gguf"
FORMAT = 1
"""The converted directory's layout version (part of its cache key)."""
INSTALL = 'pip install "hacrl[gguf]" (the gguf and accelerate packages)'


def gguf_file(model: str | Path) -> Path | None:
    """The GGUF file `model` names: the file itself, or the one `.gguf` in a directory without config.json; None
    when `model` is no GGUF agent."""
    path = Path(model).expanduser()
    if path.suffix.lower() == SUFFIX and not path.is_dir():
        return path
    if path.is_dir() and not (path / "config.json").is_file():
        found = sorted(p for p in path.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ModelError(f"{str(path)!r} holds {len(found)} GGUF files ({', '.join(p.name for p in found)}): "
                             "name the one to train (agents.<i>.model=<dir>/<file>.gguf)")  # fmt: skip
    return None


def cache_root() -> Path:
    """Where hacrl keeps what it derives once (converted GGUF agents, fetched wheels)."""
    if os.environ.get("HACRL_CACHE"):
        return Path(os.environ["HACRL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hacrl"


def plain_directory(model: str | Path, key: str, *, out: Path | None = None, tie_embeddings: bool = False) -> Path:
    """The plain Hugging Face directory of the GGUF agent `model` (converted once, cached; `out`: there instead of
    the cache). `tie_embeddings`: the file stores the output matrix beside the embedding while its release ties them
    (Qwen2.5-0.5B: the same matrix up to quantization noise): the converted model ties them, the output's copy kept
    (a directory of its own in the cache)."""
    file = gguf_file(model)
    if file is None or not file.is_file():
        raise ModelError(f"{key}: {str(model)!r} is not a GGUF file (hacrl never downloads: point {key} at a local "
                         "copy)")  # fmt: skip
    digest = sha256_of(file)
    tied = "-tied" if tie_embeddings else ""
    target = out if out is not None else cache_root() / "gguf" / f"{file.stem}-{digest[:16]}{tied}-v{FORMAT}"
    if _complete(target, digest):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_name(target.name + ".lock")):
        if _complete(target, digest):  # another process converted it while this one waited
            return target
        _convert(file, digest, target, key, tie_embeddings)
    return target


def gguf_config(model: str | Path, key: str):
    """The transformers config of a GGUF agent, from the file's metadata only (no weights are read)."""
    file = gguf_file(model)
    _require_reader(key)
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        values = dict(load_gguf_checkpoint(str(file), return_tensors=False)["config"])
        values.pop("_model_name_or_path", None)
        return AutoConfig.for_model(**values)
    except Exception as e:  # noqa: BLE001 - cut short, not GGUF, an unknown architecture: named
        raise ModelError(_unreadable(file, key, e)) from None


def _complete(target: Path, digest: str) -> bool:
    try:
        return json.loads((target / "hacrl_source.json").read_text()).get("sha256") == digest
    except (OSError, ValueError, AttributeError):
        return False


def _convert(file: Path, digest: str, target: Path, key: str, tie_embeddings: bool = False) -> None:
    """Dequantize `file` into a plain directory at `target` (written privately, renamed once whole)."""
    _require_reader(key)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    size = file.stat().st_size
    print(f"hacrl: converting {file.name} ({size / 2**20:.0f} MiB GGUF) to a plain float32 directory, once: "
          f"{target}", file=sys.stderr, flush=True)  # fmt: skip
    start = time.monotonic()
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    for stale in target.parent.glob(f"{glob.escape(target.name)}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)  # a conversion killed mid-write (this one holds the lock)
    hf_logging.disable_progress_bar()
    try:
        try:
            with _read_once_quietly():
                tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
                loaded, report = AutoModelForCausalLM.from_pretrained(
                    str(file.parent), gguf_file=file.name, dtype=torch.float32, output_loading_info=True
                )
        except Exception as e:  # noqa: BLE001 - cut short, no tokenizer, an architecture it cannot dequantize
            raise ModelError(_unreadable(file, key, e)) from None
        _require_every_parameter(report, file, key)
        if not tokenizer.chat_template:
            raise ModelError(f"{key}: {str(file)!r} holds no chat template in its metadata "
                             "(tokenizer.chat_template); hacrl renders every prompt with the agent's template: use a "
                             "GGUF that has one")  # fmt: skip
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the values are plain float32 now
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict(), assign=True, strict=True)
        if tie_embeddings:  # one matrix for both: the output's (its quantization kept more bits)
            plain.config.tie_word_embeddings = True
            plain.get_input_embeddings().weight = plain.get_output_embeddings().weight
        plain.tie_weights()
        plain.generation_config = loaded.generation_config
        del loaded
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _describe(tmp, file, digest, size, tie_embeddings)
        if target.exists():
            shutil.rmtree(target)  # an incomplete or stale conversion of ours (no matching hacrl_source.json)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"hacrl: converted {file.name} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


def _require_every_parameter(report: dict, file: Path, key: str) -> None:
    """Every parameter of the model comes from the file: transformers initialises what the file lacks (or holds in
    another shape) at random and only reports it, so a GGUF missing tensors would otherwise train random weights
    under SOURCE.md's word that they are the file's."""
    missing = sorted(report.get("missing_keys") or ())
    mismatched = sorted(str(k[0] if isinstance(k, tuple) else k) for k in report.get("mismatched_keys") or ())
    if not missing and not mismatched:
        return
    parts = []
    for what, names in (("lacks", missing), ("holds in another shape", mismatched)):
        if names:
            shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
            parts.append(f"{what} {len(names)} of the model's tensors ({shown})")
    raise ModelError(
        f"{key}: the GGUF file {str(file)!r} {' and '.join(parts)}, which would be initialised at random: it is "
        "incomplete or not a whole model of its architecture. Nothing was converted; use a complete copy of the file"
    )


def _describe(directory: Path, file: Path, digest: str, size: int, tied: bool = False) -> None:
    """SOURCE.md (what these weights are, for anyone who finds the directory) and hacrl_source.json (its key)."""
    (directory / "SOURCE.md").write_text(
        f"# Converted from {file.name}\n\nThese weights are the dequantized values of the GGUF file `{file}` "
        f"({size:,} bytes, SHA-256 {digest}), converted by hacrl to float32 safetensors. A quantized GGUF (e.g. "
        "Q4_1: 4-bit) holds rounded weights: this is not the original release in its own precision, and measures "
        "taken on it describe the quantized model.\n"
        + (
            "\nThe file stores the output matrix beside the input embedding; the release ties them, and so does this "
            "conversion: both are the output matrix's values.\n"
            if tied
            else ""
        )
    )
    (directory / "hacrl_source.json").write_text(
        json.dumps({"gguf": str(file), "sha256": digest, "bytes": size, "format": FORMAT, "tied": tied}, indent=2)
        + "\n"
    )


def _require_reader(key: str) -> None:
    import importlib.util

    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelError(f"{key} names a GGUF file, which transformers reads with the {' and '.join(missing)} "
                         f"package{'s' if len(missing) > 1 else ''}: {INSTALL}")  # fmt: skip


def _unreadable(file: Path, key: str, error: Exception) -> str:
    text = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    return (
        f"{key}: cannot read the GGUF file {str(file)!r} ({type(error).__name__}: {text}). It may be cut short "
        "(compare its size with the source's), lack the tokenizer in its metadata, or hold an architecture "
        "transformers cannot dequantize (its GGUF support lists the ones it can); use another copy or another file"
    )


@contextmanager
def _read_once_quietly():
    """transformers' GGUF reader draws a tqdm bar of its own per file (not behind its progress-bar switch), and its
    loader prints a table of the tensors a file lacks: both silenced, our lines say what happens. And the file is
    parsed once: the tokenizer's, the config's and the model's loads each parse the whole file again (`GGUFReader`
    walks every metadata field: Qwen2.5's 151,936-token vocabulary and merges are ~1.4M of them, and the three
    parses took ~2/3 of its conversion), so here one reader per file is shared, and the metadata the tokenizer and
    the config ask for (`return_tensors=False`) is read once and handed out as copies."""
    import copy
    from functools import partial

    import gguf
    import transformers.modeling_gguf_pytorch_utils as reader
    from transformers.utils import logging as hf_logging

    bar, level = reader.tqdm, hf_logging.get_verbosity()
    load, parse = reader.load_gguf_checkpoint, gguf.GGUFReader
    readers: dict[str, object] = {}
    metadata: dict[str, dict] = {}

    def one_reader(path, *args, **kwargs):
        if args or kwargs:  # another mode ('r+'): not ours to share
            return parse(path, *args, **kwargs)
        if str(path) not in readers:
            readers[str(path)] = parse(path)
        return readers[str(path)]

    def read_once(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return load(path, return_tensors=return_tensors, **kwargs)
        if str(path) not in metadata:
            metadata[str(path)] = load(path, return_tensors=False)
        return copy.deepcopy(metadata[str(path)])  # callers pop and rename keys in what they are given

    reader.tqdm = partial(bar, disable=True)
    reader.load_gguf_checkpoint, gguf.GGUFReader = read_once, one_reader
    hf_logging.set_verbosity_error()  # its load report of missing tensors: _require_every_parameter names them
    try:
        yield
    finally:
        reader.tqdm = bar
        reader.load_gguf_checkpoint, gguf.GGUFReader = load, parse
        hf_logging.set_verbosity(level)


@contextmanager
def _locked(lock: Path):
    """An exclusive flock on `lock` while converting (the kernel drops it when the holder dies)."""
    import fcntl

    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
