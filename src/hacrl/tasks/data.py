"""Prompts and answers: reasoning-gym tasks by name, or local JSONL/parquet files; a seeded, resumable stream.

Choices:
1. reasoning-gym data are generated from `data.seed` (the same for every training seed, so every method is
   evaluated on the same held-out prompts). A held-out pool of `data.heldout_size` questions is generated first;
   the eval split is its first `data.eval_size`, and every training question that occurs anywhere in the pool is
   removed, so the splits never overlap and the training data do not depend on `eval_size`.
2. A prompt given as a string becomes `[system?, user]` chat messages; a list of messages is used as it is.
3. The training stream walks the training rows in a fresh seeded permutation per epoch; its position is part
   of every checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hacrl import seeds
from hacrl.config import DataConfig, ScoringConfig
from hacrl.errors import DataError, clip, warn
from hacrl.tasks.rewards import RewardFn, math_reward, numeric_golds, reasoning_gym_reward


@dataclass(frozen=True)
class Example:
    """One prompt with its reference data."""

    messages: list[dict[str, str]]
    """Chat messages each agent renders with its own template."""
    prompt: Any
    """The prompt as the data gives it (string or messages), passed to reward functions."""
    columns: dict[str, Any] = field(default_factory=dict)
    """Every other column (`answer`, reasoning-gym's `entry`, ...), passed to reward functions by name."""


@dataclass
class TaskData:
    train: list[Example]
    eval: list[Example]
    reward: RewardFn | None
    """A built-in scorer, callable in this process; None for a user's `scoring.function`, whose module is imported
    only in the scoring processes (it is code from elsewhere: a hang, a crash or an exit at import is bounded and
    reported there)."""
    reward_source: RewardFn | str
    """What a scoring process loads: the built-in scorer (picklable) or the user's `package.module:function`."""
    builtin: bool
    """True for hacrl's own scorers (per-completion scoring; an error on some text scores 0)."""


def load_task(cfg: DataConfig, scoring: ScoringConfig | None = None) -> TaskData:
    """Build the train/eval splits described by `cfg` and the reward function `scoring` names (default: the task's
    built-in scorer)."""
    scoring = scoring or ScoringConfig()
    if cfg.source == "reasoning_gym":
        train, eval_, dataset = _reasoning_gym(cfg)
        # auto: the task's own scorer; on a numeric task, an answer without tags is read as its last number
        golds_are_numbers = numeric_golds([ex.columns["entry"] for ex in [*train, *eval_]])
        numeric = scoring.builtin == "auto" and golds_are_numbers
        builtin = reasoning_gym_reward(dataset, scoring.max_answer_chars, numeric)
        if scoring.builtin == "math" and golds_are_numbers and not scoring.function:
            warn(
                f"scoring.builtin=math on {cfg.task!r}, whose answers are numbers: the math verifier evaluates what it "
                "reads, so an answer that restates the question ('... the result of 81 + 42.', '\\boxed{81 + 42}') "
                "scores right whatever it computed. scoring.builtin=auto reads the final answer's last number instead"
            )
    elif cfg.source == "datasets":  # scored by the math verifier against each row's gold answer
        train = _dataset_rows(cfg, cfg.train, "data.train")
        eval_ = _dataset_rows(cfg, cfg.eval, "data.eval") if cfg.eval is not None else []
        builtin = None
    else:
        train = _read_rows(cfg, cfg.train_file)
        eval_ = _read_rows(cfg, cfg.eval_file)[: cfg.eval_size] if cfg.eval_file else []
        _warn_about_overlap(cfg, train, eval_)
        builtin = None
    if scoring.function:
        return TaskData(train=train, eval=eval_, reward=None, reward_source=scoring.function, builtin=False)
    if scoring.builtin == "math" or (scoring.builtin == "auto" and builtin is None):
        reward = math_reward(scoring.timeout, scoring.max_answer_chars)
    elif builtin is None:
        raise DataError("scoring.builtin=reasoning_gym needs data.source=reasoning_gym")
    else:
        reward = builtin
    return TaskData(train=train, eval=eval_, reward=reward, reward_source=reward, builtin=True)


def load_benchmark(cfg: DataConfig, name: str, max_rows: int | None = None) -> list[Example]:
    """A named set's evaluation rows (`eval.benchmarks`), from `cfg.datasets_dir` when prepared there."""
    from hacrl.config import DatasetSpec

    return _dataset_rows(cfg, DatasetSpec(set=name, max_rows=max_rows), f"eval.benchmarks ({name})")


def _dataset_rows(cfg: DataConfig, spec, role: str) -> list[Example]:
    """A `DatasetSpec`'s rows as examples: the question in its template, the gold answer as `answer`."""
    from hacrl.tasks.sources import MATH_TEMPLATE, read_rows

    rows = read_rows(spec, cfg.datasets_dir, role=role)
    if rows.skipped:
        warn(f"{role}: {rows.skipped} row(s) of {rows.where} skipped: their gold answer could not be read")
    template = spec.template or (MATH_TEMPLATE if spec.set else "{question}")
    system = _system(cfg)
    return [
        Example(
            messages=[*system, {"role": "user", "content": template.replace("{question}", question)}],
            prompt=question,
            columns={**columns, "answer": answer},
        )
        for question, answer, columns in zip(rows.questions, rows.answers, rows.columns, strict=True)
    ]


def _warn_about_overlap(cfg: DataConfig, train: list[Example], eval_: list[Example]) -> None:
    """Evaluating on training prompts measures memorisation, not learning: say so (it may be deliberate)."""
    if not eval_:
        return
    if Path(cfg.eval_file).resolve() == Path(cfg.train_file).resolve():
        warn(
            f"data.eval_file is the training file ({cfg.train_file}): evaluation will measure the training prompts; "
            "point data.eval_file at held-out data"
        )
        return
    seen = {repr(ex.prompt) for ex in train}
    shared = sum(repr(ex.prompt) in seen for ex in eval_)
    if shared:
        warn(
            f"{shared} of the {len(eval_)} eval prompts in {cfg.eval_file} also occur in {cfg.train_file}: those "
            "measure memorisation rather than learning"
        )


def import_reasoning_gym():
    """`import reasoning_gym`, without the SyntaxWarnings some of its dependencies (cellpylib) print the first time
    Python compiles them."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        import reasoning_gym
    return reasoning_gym


def _reasoning_gym(cfg: DataConfig):
    reasoning_gym = import_reasoning_gym()

    options = dict(cfg.task_options)
    try:
        eval_ds = reasoning_gym.create_dataset(
            cfg.task, seed=cfg.seed * 2 + 1, size=max(cfg.heldout_size, cfg.eval_size), **options
        )
        train_ds = reasoning_gym.create_dataset(cfg.task, seed=cfg.seed * 2, size=cfg.train_size, **options)
    except (ValueError, TypeError, AssertionError, KeyError) as e:
        raise DataError(f"data.task={cfg.task!r} with data.task_options={options}: reasoning-gym says: {e}") from e
    pool = [_rg_example(cfg, entry) for entry in eval_ds]
    held_out = {ex.prompt for ex in pool}
    eval_rows = pool[: cfg.eval_size]
    train_rows = [ex for ex in (_rg_example(cfg, entry) for entry in train_ds) if ex.prompt not in held_out]
    if not train_rows:
        raise DataError(
            f"every training question of {cfg.task!r} also occurs in the eval split; widen the task "
            "(data.task_options) or lower data.eval_size"
        )
    return train_rows, eval_rows, eval_ds


def _rg_example(cfg: DataConfig, entry: dict) -> Example:
    question = entry["question"]
    return Example(
        messages=_messages(cfg, question),
        prompt=question,
        columns={"answer": entry["answer"], "entry": entry},
    )


def system_prompt_of(cfg: DataConfig) -> str | None:
    """The system message of `cfg`'s prompts (`data.system_prompt`; `auto`: reasoning-gym's own for its tasks)."""
    if cfg.system_prompt == "auto":
        if cfg.source != "reasoning_gym":
            return None
        from reasoning_gym.utils import SYSTEM_PROMPTS

        return SYSTEM_PROMPTS["default"]
    return cfg.system_prompt or None


def _system(cfg: DataConfig) -> list[dict[str, str]]:
    prompt = system_prompt_of(cfg)
    return [{"role": "system", "content": prompt}] if prompt else []


def _messages(cfg: DataConfig, prompt: Any) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"data.prompt_column={cfg.prompt_column!r} is empty: a prompt needs some text")
        return [*_system(cfg), {"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in prompt):
        if not any(str(m["content"]).strip() for m in prompt):
            raise DataError(
                f"data.prompt_column={cfg.prompt_column!r} holds {len(prompt)} chat messages and no text: a prompt "
                "needs at least one message with content"
            )
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    raise DataError(
        f"data.prompt_column={cfg.prompt_column!r} must hold a string or a list of "
        f"{{role, content}} messages, got {type(prompt).__name__}"
    )


def _read_rows(cfg: DataConfig, path: str | None) -> list[Example]:
    """Rows of a .jsonl (one JSON object per line) or .parquet file; every problem names the file and line."""
    assert path is not None
    file = Path(path)
    if not file.is_file():
        raise DataError(f"data file {path!r} does not exist")
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = [(f"row {n}", row) for n, row in enumerate(pq.read_table(file).to_pylist(), start=1)]
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a damaged file
            raise DataError(f"data file {path!r} is not a readable parquet file ({type(e).__name__}: {e})") from None
    elif file.suffix in (".jsonl", ".json"):
        rows = []
        with open(file, encoding="utf-8", errors="strict") as f:
            try:
                for n, line in enumerate(f, start=1):
                    if line.strip():
                        try:
                            rows.append((f"line {n}", json.loads(line)))
                        except json.JSONDecodeError as e:
                            raise DataError(f"{path}:{n} is not valid JSON ({e.msg})") from None
            except UnicodeDecodeError as e:
                raise DataError(f"data file {path!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    else:
        raise DataError(f"data file {path!r}: use .jsonl or .parquet")
    out = []
    for where, row in rows:
        if not isinstance(row, dict):
            raise DataError(
                f"{path}:{where.split()[-1]}: each row must be a JSON object with the columns "
                f"{cfg.prompt_column!r} and {cfg.answer_column!r}, got {type(row).__name__} {clip(repr(row))}"
            )
        for col in (cfg.prompt_column, cfg.answer_column):
            if col not in row:
                raise DataError(
                    f"{path}:{where.split()[-1]} ({where}) has no column {col!r} (columns: {sorted(row)}); set "
                    "data.prompt_column / data.answer_column"
                )
        try:
            messages = _messages(cfg, row[cfg.prompt_column])
        except DataError as e:
            raise DataError(f"{path}:{where.split()[-1]}: {e}") from None
        columns = {k: v for k, v in row.items() if k != cfg.prompt_column}
        columns["answer"] = row[cfg.answer_column]
        out.append(Example(messages=messages, prompt=row[cfg.prompt_column], columns=columns))
    if not out:
        raise DataError(f"data file {path!r} holds no rows")
    return out


class PromptStream:
    """Seeded epochs over the training rows; `state_dict` / `load_state_dict` make it resumable."""

    def __init__(self, examples: list[Example], seed: int) -> None:
        self.examples = examples
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(seeds.prompts(self.seed, self.epoch))
        return torch.randperm(len(self.examples), generator=g).tolist()

    def next_batch(self, size: int) -> list[Example]:
        batch = []
        while len(batch) < size:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation()
            batch.append(self.examples[self._order[self.position]])
            self.position += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "size": len(self.examples)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["size"] != len(self.examples) or state["seed"] != self.seed:
            raise DataError(
                "the checkpoint's data position was saved for other training data (size or seed "
                "differ); resume with the same data.* and trainer.seed settings"
            )
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation()
