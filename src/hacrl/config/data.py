"""The `data:` and `scoring:` groups of the config: where prompts and gold answers come from (`DataConfig`, with
`DatasetSpec` for a mixture), and how answers are scored (`ScoringConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from hacrl.config.marks import SAFE
from hacrl.errors import ConfigError


@dataclass
class DatasetSpec:
    """Rows through the `datasets` library (`data.source: datasets`; `hacrl.tasks.sources`): one of the paper's named
    sets, or any Hub id, local directory or data file, with how to read its question and gold answer."""

    set: str | None = None
    """A named set: math (training), math_test, math500, gsm8k, aime25, amc23, minerva, olympiadbench (`hacrl data
    prepare --list`). Read from `data.datasets_dir/<set>/<split>.jsonl` when prepared there, else from the Hub."""
    path: str | None = None
    """A Hub id (`openai/gsm8k`), a local directory, or a .parquet / .json / .jsonl / .arrow file; with `set`, a
    local copy of that set in its original columns."""
    name: str | None = None
    """The Hub dataset's config (`main` for gsm8k); None: the set's, or the default."""
    split: str | None = None
    """Split to read; None: the set's (train for math, test for the benchmarks), else `train`."""
    question_column: str | None = None
    """Column of the question; None: the set's, else `question`."""
    answer_column: str | None = None
    """Column that holds the gold answer; None: the set's, else `answer`."""
    gold: Literal["plain", "boxed", "after_hash", "first"] | None = None
    """How the gold answer is written in that column: `plain`, `boxed` (the last \\boxed{} of a worked solution),
    `after_hash` (after `####`), `first` (first entry of a list); None: the set's rule, else `plain`. A row whose
    gold answer cannot be read is skipped and counted."""
    template: str | None = None
    """The user message, with `{question}` where the question goes; None: with a named set the paper's math prompt
    (the question, then "Please reason step by step, and put your final answer within \\boxed{}."), else the
    question alone."""
    filter: dict[str, Any] = field(default_factory=dict)
    """Keep only rows whose column holds one of the listed values, e.g. `{level: [Level 4, Level 5]}`."""
    max_rows: int | None = None
    """Read at most this many usable rows (None: all)."""

    def check(self, where: str) -> None:
        if self.set is None and self.path is None:
            raise ConfigError(f"{where} names no data: set {where}.set (a named set) or {where}.path")
        if self.template is not None and "{question}" not in self.template:
            raise ConfigError(f"{where}.template must contain {{question}} where the question goes")
        if any(not isinstance(v, list) for v in self.filter.values()):
            raise ConfigError(f"{where}.filter maps a column to a list of allowed values, got {dict(self.filter)}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"{where}.max_rows must be >= 1 or null, got {self.max_rows}")


@dataclass
class DataConfig:
    """Prompts and answers (how responses are scored: `scoring`)."""

    source: Literal["reasoning_gym", "file", "datasets"] = "reasoning_gym"
    """`reasoning_gym`: a procedural task by name; `file`: local JSONL/parquet files; `datasets`: `train` and
    `eval` through the `datasets` library (the paper's named sets, a Hub id, a local directory or file)."""
    task: str = "chain_sum"
    """reasoning-gym task name (source: reasoning_gym)."""
    task_options: dict[str, Any] = field(default_factory=dict)
    """Options passed to `reasoning_gym.create_dataset` (e.g. `{min_digits: 1, max_digits: 2}`)."""
    seed: int = 0
    """Seeds the generated task data (reasoning_gym); the same for every training seed, so eval sets agree."""
    train_size: int = 10000
    """Training prompts generated (reasoning_gym); eval questions are removed from them."""
    eval_size: int = field(default=256, metadata=SAFE)
    """Held-out eval prompts (reasoning_gym), or the most taken from `eval_file`."""
    heldout_size: int = 2048
    """reasoning_gym: held-out questions generated for the eval split (its first `eval_size` are evaluated) and
    removed from the training split, so the training data do not change with `eval_size` (up to this size)."""
    train_file: str | None = None
    """JSONL or parquet file of training rows (source: file)."""
    eval_file: str | None = field(default=None, metadata=SAFE)
    """JSONL or parquet file of eval rows (source: file)."""
    prompt_column: str = "prompt"
    """Column with the prompt: a string, or a list of chat messages `{role, content}`."""
    answer_column: str = "answer"
    """Column with the reference answer."""
    system_prompt: str | None = "auto"
    """System message put before every prompt given as a plain string; null: none. `auto`: the source's own, which
    is reasoning-gym's (its `default` prompt, asking for the answer in `<answer>` tags, which its scorer reads) for
    `source: reasoning_gym` and none for files and datasets. Without it an instruct model answers in prose that
    reasoning-gym's scorer reads as its last line ("3 + 4 equals 7." against 7), so training starts on noise."""

    train: DatasetSpec | None = None
    """source: datasets: the training rows, e.g. `{set: math}` (see `DatasetSpec`)."""
    eval: DatasetSpec | None = field(default=None, metadata=SAFE)
    """source: datasets: the evaluation rows, e.g. `{set: math500}`; None: no evaluation split."""
    datasets_dir: str = "data"
    """Where `hacrl data prepare --out` wrote the named sets (`<dir>/<set>/<split>.jsonl`); a set found there is
    read from there, never from the Hub."""

    def check(self, where: str = "data") -> None:
        if self.source == "datasets":
            if self.train is None:
                raise ConfigError(f"{where}.source=datasets needs {where}.train, e.g. {{set: math}}")
            self.train.check(f"{where}.train")
            if self.eval is not None:
                self.eval.check(f"{where}.eval")
        if self.source == "file" and not self.train_file:
            raise ConfigError(f"{where}.source=file needs {where}.train_file (a .jsonl or .parquet file)")
        if self.source == "reasoning_gym" and (self.train_size < 1 or self.eval_size < 1):
            raise ConfigError(f"{where}.train_size and {where}.eval_size must be >= 1")
        if self.source == "reasoning_gym" and self.eval_size > self.heldout_size:
            raise ConfigError(
                f"{where}.eval_size={self.eval_size} exceeds {where}.heldout_size={self.heldout_size}; raise "
                f"{where}.heldout_size (this changes the training split) or lower {where}.eval_size"
            )


@dataclass
class ScoringConfig:
    """How responses are scored: which reward, and the limits that no reward function and no text can get past
    (`hacrl.driver.scoring`)."""

    builtin: Literal["auto", "reasoning_gym", "math"] = "auto"
    """Built-in scorer: `reasoning_gym` (the task's own scorer, on what the last `<answer>` tags hold, else on the
    last box, "answer:" or the last line), `math` (answer extraction + math-verify); `auto` picks by `data.source`:
    the math verifier for files and datasets; for a reasoning-gym task its own scorer, which on a task whose gold
    answers are all numbers reads an answer without tags as the last number of its final answer (not the whole last
    line: "3 + 4 equals 7." against 7). Ignored when `function` is set."""
    function: str | None = None
    """Your reward as `package.module:function` with the TRL signature f(prompts, completions, **columns),
    importable from PYTHONPATH or the working directory. Naming it in a config runs that module's code with your
    permissions: treat configs like code."""
    timeout: float = field(default=5.0, metadata=SAFE)
    """Seconds the scoring of one completion may take, for the built-in scorers and `function` alike; a completion
    past it gets `on_timeout` and its scoring process is replaced (no text can hang a run)."""
    on_timeout: float = field(default=0.0, metadata=SAFE)
    """Reward of a completion whose scoring ran past `timeout` (counted in `<agent>/reward_timeouts`)."""
    stop_on_timeout: bool = field(default=False, metadata=SAFE)
    """Stop the run with an error at the first scoring timeout instead of scoring it `on_timeout`."""
    on_hung: Literal["stop", "continue"] = field(default="stop", metadata=SAFE)
    """A `function` that is hung (past its limit on a whole slice, then on each of the first 3 completions retried
    alone, never returning): `stop` the run with a message (within about a minute at the defaults), or `continue`,
    scoring each such completion `on_timeout` (each costs its timeout). Built-in scorers always go on: a text that
    hangs them scores 0."""
    workers: int = field(default=1, metadata=SAFE)
    """Scoring processes; each scores a contiguous slice of a step's completions (the rewards do not depend on it)."""
    isolation: Literal["process", "inline"] = field(default="process", metadata=SAFE)
    """`process`: scoring runs in separate, time-limited processes; `inline`: in the training process with no
    hard time limit (for debugging a reward function with pdb)."""
    memory_mb: int | None = field(default=4096, metadata=SAFE)
    """Address-space limit of each scoring process in MiB (a hostile text cannot exhaust the machine's memory);
    null: no limit (needed when a reward function uses a GPU)."""
    max_answer_chars: int = 4096
    """Built-in scorers: an extracted answer longer than this scores 0 without being parsed."""
    start_timeout: float = field(default=300.0, metadata=SAFE)
    """Seconds a scoring process may take to import `function` (a reward model that loads at import counts here):
    the run waits for it before step 1 and stops, naming the module, when the import hangs, raises or exits."""

    def check(self, where: str = "scoring") -> None:
        if self.function is not None and ":" not in self.function:
            raise ConfigError(f"{where}.function={self.function!r} must look like 'package.module:function'")
        if not self.timeout > 0:
            raise ConfigError(f"{where}.timeout must be positive, got {self.timeout}")
        if not self.on_timeout >= 0:
            raise ConfigError(f"{where}.on_timeout must be >= 0, got {self.on_timeout}")
        if self.workers < 1:
            raise ConfigError(f"{where}.workers must be >= 1, got {self.workers}")
        if self.memory_mb is not None and self.memory_mb < 256:
            raise ConfigError(f"{where}.memory_mb must be >= 256 or null (no limit), got {self.memory_mb}")
        if self.max_answer_chars < 1:
            raise ConfigError(f"{where}.max_answer_chars must be >= 1, got {self.max_answer_chars}")
        if not self.start_timeout > 0:
            raise ConfigError(f"{where}.start_timeout must be positive, got {self.start_timeout}")
