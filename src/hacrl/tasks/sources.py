"""Rows through the `datasets` library, and the paper's named sets (`data.source: datasets`, `hacrl data prepare`).

A `DatasetSpec` (the config's `data.train` and `data.eval`) says where rows come from and how to read them:

- `set`: one of the paper's named sets (`NAMED_SETS`: MATH for training; MATH-500, MATH, GSM8K, AIME 2025, AMC 2023,
  Minerva Math and OlympiadBench for evaluation). A named set knows its Hub id, config and split, which columns
  hold the question and the gold answer, and how the gold answer is written (a plain value, the last `\\boxed{}`
  of a worked solution, the text after `####`, the first entry of a list). Its rows come from the files that
  `hacrl data prepare` wrote under `data.datasets_dir` when they are there, else from the Hub.
- `path`: anything `datasets` loads: a Hub id (with `name` = its config and `split`), a local directory, or a
  .parquet / .json / .jsonl / .arrow file. Column names, `gold` and `template` then say how to read it (a named
  `set` given with a `path` reads that path with the set's columns and gold rule: local copies of a set).

Every row becomes a prompt (the question in `template`, a user message; the scorer is the math verifier, which
compares the response's last `\\boxed{}` with the gold answer) and an `answer` column. A gold answer that cannot be
read (no `\\boxed{}` in a solution, no `####`, an empty list) skips its row; the count is reported, never a
crash. No network is touched unless a Hub id is loaded; with HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set, or
without a connection, the error says how to bring the files.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hacrl.errors import DataError, first_line
from hacrl.named_sets import NAMED_SETS, not_named
from hacrl.tasks.answers import boxed_answer, strip_math_delimiters, value_text

MATH_TEMPLATE = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
"""The prompt of the paper's math sets (Qwen2.5-Math's instruction): the question, then where the answer goes."""

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
"""With either set, a Hub id is refused at once with how to bring the files (no network is tried)."""

GOLD_RULES = ("plain", "boxed", "after_hash", "first")
"""How a gold answer is written: `plain` the value itself; `boxed` the last `\\boxed{}` of a worked solution;
`after_hash` the text after the last `####` (GSM8K); `first` the first entry of a list (OlympiadBench)."""


def gold_answer(value: Any, rule: str) -> str | None:
    """The gold answer in `value` under `rule` (`GOLD_RULES`), or None when it cannot be read.

    >>> gold_answer("so $x = \\\\frac{1}{2}$, giving \\\\boxed{\\\\frac{1}{2}}.", "boxed")
    '\\\\frac{1}{2}'
    >>> gold_answer("48/2 = 24 clips\\n#### 1,024", "after_hash")
    '1024'
    >>> gold_answer(["$\\\\sqrt{2}$", "2"], "first"), gold_answer(27.0, "plain"), gold_answer("", "plain")
    ('\\\\sqrt{2}', '27', None)
    """
    if rule == "first":
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        rule = "plain"
    text = value_text(value)
    if text is None:
        return None
    if rule == "boxed":
        found = boxed_answer(text)
        text = found if found is not None else ""
    elif rule == "after_hash":
        head, sep, tail = text.rpartition("####")
        text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", tail) if sep else ""
    elif rule != "plain":
        raise ValueError(f"gold rule must be one of {GOLD_RULES}, got {rule!r}")
    text = strip_math_delimiters(text)  # OlympiadBench writes answers as inline math: `$\\sqrt{2}$, $-\\sqrt{2}$`
    return text or None


@dataclass(frozen=True)
class Rows:
    """What a spec read: prompts with their gold answers, and what was skipped."""

    questions: list[str]
    answers: list[str]
    columns: list[dict[str, Any]]
    """Every other column of each row (reward functions receive them by name)."""
    skipped: int
    """Rows whose gold answer could not be read."""
    where: str
    """Where they came from (a file, a directory, or `hub:<id>[/<config>]:<split>`)."""


def read_rows(spec, datasets_dir: str | Path = "data", *, role: str = "data.train") -> Rows:
    """The rows of a `DatasetSpec` (see the module docstring); `role` names the spec in messages."""
    named = NAMED_SETS.get(spec.set) if spec.set else None
    if spec.set and named is None:
        raise DataError(f"{role}.set: {not_named([spec.set])}")
    question_col = spec.question_column or (named.question if named else "question")
    answer_col = spec.answer_column or (named.answer if named else "answer")
    rule = spec.gold or (named.gold if named else "plain")
    split = spec.split or (named.split if named else "train")
    path, config = spec.path, spec.name
    if path is None and named is not None:
        prepared = Path(datasets_dir) / named.name / f"{split}.jsonl"
        if prepared.is_file():  # `hacrl data prepare` wrote it: question / answer, the gold answer already read
            path, question_col, answer_col, rule, config = str(prepared), "question", "answer", "plain", None
        else:
            path, config = named.hub, spec.name or named.config
    if path is None:
        raise DataError(f"{role} names no data: set {role}.set (one of {sorted(NAMED_SETS)}) or {role}.path")
    table, where = _load(path, config, split, role, named)
    if len(table) == 0:
        raise DataError(f"{role}: {where} holds no rows (split {split!r}); check {role}.split and {role}.path")
    names = list(table.column_names)
    for col, key in ((question_col, "question_column"), (answer_col, "answer_column")):
        if col not in names:
            raise DataError(
                f"{role}: {where} has no column {col!r} (its columns: {names}); set {role}.{key} to the one that "
                "holds it"
            )
    for col in spec.filter:
        if col not in names:
            raise DataError(f"{role}.filter: {where} has no column {col!r} (its columns: {names})")
    questions, answers, others, skipped = [], [], [], 0
    for row in _rows(table, where, role, names):
        if any(row[col] not in allowed for col, allowed in spec.filter.items()):
            continue
        gold = gold_answer(row[answer_col], rule)
        question = row[question_col]
        if gold is None or not isinstance(question, str) or not question.strip():
            skipped += 1
            continue
        questions.append(question)
        answers.append(gold)
        others.append({k: v for k, v in row.items() if k not in (question_col, answer_col)})
        if spec.max_rows is not None and len(questions) >= spec.max_rows:
            break
    if not questions:
        raise DataError(
            f"{role}: no usable row in {where}"
            + (f" ({skipped} with a gold answer that `{rule}` cannot read)" if skipped else "")
            + (f" after {role}.filter={dict(spec.filter)}" if spec.filter else "")
        )
    return Rows(questions, answers, others, skipped, where)


def _rows(table, where: str, role: str, names: list[str]):
    """The table's rows; text that is not UTF-8 (a parquet string column can hold any bytes) names its row and
    column instead of a UnicodeDecodeError from deep inside `datasets`."""
    read = 0
    try:
        for row in table:
            yield row
            read += 1
    except UnicodeDecodeError as e:
        at = _undecodable(table, read, names)
        place = f"row {at[0] + 1}, column {at[1]!r}" if at else f"a row after row {read}"
        raise DataError(
            f"{role}: {where}: {place} holds bytes that are not UTF-8 text ({e.reason} at byte {e.start}); re-encode "
            f"that column as UTF-8 or remove the row"
        ) from None


def _load(path: str, config: str | None, split: str, role: str, named):
    """`datasets` rows of a local directory or file, or of a Hub dataset."""
    local = Path(path)
    try:
        import datasets
    except ImportError:
        raise DataError('data.source=datasets needs the `datasets` library: pip install "datasets>=3"') from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    if local.exists():
        kind = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".arrow": "arrow"}.get(local.suffix)
        try:
            if local.is_dir() and (local / "dataset_info.json").is_file():  # written by Dataset.save_to_disk
                return datasets.load_from_disk(str(local)), str(local)
            if not local.is_dir() and kind is None:
                raise DataError(f"{role}.path={path!r}: use a .parquet, .json, .jsonl or .arrow file, or a directory")
            # a private cache, read into memory: `datasets` caches a local directory under its name and layout, so
            # a second copy named alike (an updated gsm8k/) would be served the first one's rows
            with tempfile.TemporaryDirectory(prefix="hacrl-datasets-") as cache:
                if local.is_dir():
                    loaded = datasets.load_dataset(str(local), _local_config(datasets, local, config, named),
                                                   split=split, cache_dir=cache, keep_in_memory=True)  # fmt: skip
                else:
                    loaded = datasets.load_dataset(kind, data_files=str(local), split="train", cache_dir=cache,
                                                   keep_in_memory=True)  # fmt: skip
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001 - datasets raises many types for a file it cannot read
            if "Config name is missing" in str(e):
                raise DataError(
                    f"{role}.path={path!r} holds several configs ({_configs(datasets, local)}): name the one to "
                    f"read with {role}.name"
                ) from None
            found = _diagnose(local, kind) if local.is_file() else _diagnose_dir(local)
            raise DataError(
                f"{role}.path={path!r}: "
                + (found or f"`datasets` cannot read it ({type(e).__name__}: {first_line(e)})")
            ) from None
        return loaded, str(local)
    where = f"hub:{path}{f'/{config}' if config else ''}:{split}"
    offline = any(
        os.environ.get(k, "").lower() in ("1", "true", "yes") for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )
    how = (
        f"run `hacrl data prepare {named.name} --out DIR` on a machine with internet and copy DIR to data.datasets_dir"
        if named
        else f"download it where you have internet (datasets.load_dataset({path!r}).save_to_disk(DIR)) and set "
        f"{role}.path to that directory"
    )
    if offline:
        raise DataError(f"{role}: {path!r} is not a local path and the Hub is off (HF_HUB_OFFLINE / "
                        f"HF_DATASETS_OFFLINE is set): {how}")  # fmt: skip
    try:
        return datasets.load_dataset(path, config, split=split), where
    except Exception as e:  # noqa: BLE001 - offline, unknown id, gated: one message with what to do
        raise DataError(
            f"{role}: cannot load {path!r} from the Hugging Face Hub ({type(e).__name__}: {first_line(e)}); if this "
            f"machine is offline, {how}"
        ) from None


def _local_config(datasets, directory: Path, config: str | None, named) -> str | None:
    """The config to read a local directory with: the one asked for; else, when the directory declares configs (a
    local copy of the Hub repository: GSM8K's `main` and `socratic`), the named set's; else none."""
    if config is not None or named is None or named.config is None:
        return config
    try:
        declared = datasets.get_dataset_config_names(str(directory))
    except Exception:  # noqa: BLE001 - unreadable here: load_dataset will say what is wrong
        return None
    return named.config if named.config in declared else None


_KINDS = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}


def _diagnose_dir(directory: Path) -> str | None:
    """`_diagnose` of each data file in a directory (at most 1,000 files), naming the first bad one."""
    files = sorted(p for p in directory.rglob("*") if p.suffix in _KINDS and not p.name.startswith("."))
    for file in files[:1000]:
        found = _diagnose(file, _KINDS[file.suffix])
        if found:
            return f"{file.relative_to(directory)}: {found}"
    return None


def _diagnose(file: Path, kind: str) -> str | None:
    """What is wrong with a local file `datasets` could not read, with its line or row: empty, no rows, bytes that
    are not UTF-8, a line that is not a JSON object. None when none of these (the caller says what `datasets` said).
    One pass over the file, a line at a time."""
    try:
        if file.stat().st_size == 0:
            return "the file is empty (0 bytes)"
        if kind == "parquet":
            import pyarrow.parquet as pq

            rows = pq.read_metadata(file).num_rows
            return "the parquet file holds no rows" if rows == 0 else None
        if kind != "json":
            return None
        with open(file, "rb") as f:
            head = f.read(1 << 16).lstrip()
        if head[:1] == b"[" or (head[:1] == b"{" and file.suffix == ".json"):  # one JSON document, not lines
            try:
                json.loads(file.read_bytes())
            except UnicodeDecodeError as e:
                return f"it holds bytes that are not UTF-8 text (at byte {e.start}); save it as UTF-8"
            except ValueError as e:
                return f"it is not valid JSON ({e})"
            return None
        with open(file, "rb") as f:
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    return (
                        f"line {number} holds bytes that are not UTF-8 text (at byte {e.start}); save the file as UTF-8"
                    )
                try:
                    value = json.loads(line)
                except ValueError as e:
                    return f"line {number} is not JSON ({e}): {line.strip()[:60]!r}; every line must be one JSON object"
                if not isinstance(value, dict):
                    return f"line {number} is a JSON {type(value).__name__}, not an object ({{column: value, ...}})"
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    return None


def _undecodable(table, start: int, names: list[str]) -> tuple[int, str] | None:
    """The first (row, column) from `start` whose text is not UTF-8 (rows are decoded when read, one batch at a
    time: the error does not say where)."""
    columns = {name: table.select_columns([name]) for name in names}
    for i in range(start, len(table)):
        for name, column in columns.items():
            try:
                column[i]
            except UnicodeDecodeError:
                return i, name
    return None


def _configs(datasets, directory: Path) -> str:
    try:
        return ", ".join(datasets.get_dataset_config_names(str(directory)))
    except Exception:  # noqa: BLE001 - only for a message
        return "see its README.md"


def prepare(names: list[str], out: str | Path, *, source: str | None = None) -> list[dict[str, Any]]:
    """`hacrl data prepare`: each named set's split as `<out>/<name>/<split>.jsonl` (question, answer: the gold
    answer already read; the other columns kept) with a `manifest.json` of row counts and SHA-256. `source`: read
    the sets from this local directory (`<source>/<name>` as `datasets` reads it) instead of the Hub.

    Nothing a user wrote is replaced: every target is checked before anything is read or written, and a file there
    that an earlier `prepare` did not write (its manifest does not name it with its SHA-256) stops the command. Each
    file is written whole (a temporary file renamed over it)."""
    from hacrl.config import DatasetSpec
    from hacrl.files import write_atomically

    problem = not_named(names)
    if problem:
        raise DataError(f"hacrl data prepare: {problem}")
    targets = {name: Path(out) / name / f"{NAMED_SETS[name].split}.jsonl" for name in dict.fromkeys(names)}
    for name, target in targets.items():
        _check_prepare_target(name, target)
    report = []
    for name, target in targets.items():
        named = NAMED_SETS[name]
        path = str(Path(source) / name) if source else named.hub
        rows = read_rows(DatasetSpec(set=name, path=path), role=f"hacrl data prepare {name}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            lines = (
                json.dumps({"question": q, "answer": a, **_plain(extra)}, ensure_ascii=False) + "\n"
                for q, a, extra in zip(rows.questions, rows.answers, rows.columns, strict=True)
            )
            digest = write_atomically(target, lines)
            entry = {"set": name, "file": str(target), "rows": len(rows.questions), "skipped": rows.skipped,
                     "expected_rows": named.rows, "sha256": digest, "from": rows.where}  # fmt: skip
            write_atomically(target.parent / "manifest.json", json.dumps(entry, indent=2) + "\n")
        except OSError as e:
            raise DataError(f"hacrl data prepare {name}: cannot write {target.parent}: {e.strerror or e}") from None
        report.append(entry)
    return report


def _check_prepare_target(name: str, target: Path) -> None:
    """Refuse to write `target` (and its manifest) over files that an earlier `hacrl data prepare` did not write."""
    from hacrl.files import sha256_of

    manifest = target.parent / "manifest.json"
    fix = "choose another --out, or move those files away"
    if target.parent.exists() and not target.parent.is_dir():
        raise DataError(f"hacrl data prepare {name}: {target.parent} is a file, not a directory; {fix}")
    if not target.exists() and not manifest.exists():
        return
    try:
        entry = json.loads(manifest.read_text(encoding="utf-8"))
        ours = (
            isinstance(entry, dict)
            and entry.get("set") == name
            and Path(str(entry.get("file"))).name == target.name
            and (not target.exists() or entry.get("sha256") == sha256_of(target))
        )
    except (OSError, ValueError):
        ours = False
    if not ours:
        present = [str(p) for p in (target, manifest) if p.exists()]
        raise DataError(
            f"hacrl data prepare {name}: {' and '.join(present)} already exist and were not written by hacrl data "
            f"prepare (or were changed since: their manifest does not match), so they are left as they are; {fix}"
        )


def _plain(columns: dict[str, Any]) -> dict[str, Any]:
    """Columns as JSON can hold them (a value it cannot is written as its text)."""
    out = {}
    for key, value in columns.items():
        try:
            json.dumps(value)
            out[key] = value
        except (TypeError, ValueError):
            out[key] = str(value)
    return out
