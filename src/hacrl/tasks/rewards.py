"""Verifiable rewards: answer extraction, the math verifier, reasoning-gym scorers and user functions.

Every reward function has TRL's signature ``f(prompts, completions, **columns) -> list[float]``: `prompts` are the
prompts as the data gives them (a string or a list of chat messages), `completions` the decoded response texts,
and each dataset column (`answer`, ...) arrives as a list aligned with them. `score` calls one in this process and
checks what it returns; `hacrl.driver.scoring.Scorer` calls one in separate processes under a time limit, which is how
the trainer and evaluation use them.

Model outputs are untrusted input. Everything here that reads a completion is linear in its length (no regex
that can backtrack over unbounded text), and an extracted answer longer than `max_answer_chars` scores 0 without
reaching a parser. The built-in scorers are picklable classes so that they can run in a scoring process.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from hacrl.errors import RewardError, clip
from hacrl.tasks.answers import extract_answer, final_answer, value_text

__all__ = [
    "MathReward",
    "ReasoningGymReward",
    "RewardError",
    "RewardFn",
    "extract_answer",
    "import_reward_function",
    "math_reward",
    "numeric_golds",
    "reasoning_gym_reward",
    "reward_name",
    "score",
    "validate_rewards",
]

RewardFn = Callable[..., list[float]]

MAX_ANSWER_CHARS = 4096
"""Default cap on an extracted answer: longer ones score 0 without being parsed (`scoring.max_answer_chars`)."""


class MathReward:
    """1.0 when the response's final answer is mathematically equivalent to `answer` (`hacrl.tasks.answers`:
    math-verify, called with both answers inside a math environment, plus its corrections), else 0.0.

    Each math-verify parse / verify call has math-verify's own time limit (a third of `timeout`, at least 1 s,
    scoring 0 when it fires); the hard limit that no input can get past is the scoring process's (`Scorer`).
    Gold answers are parsed once and cached (a huge gold answer costs its parse once, not once per completion).
    """

    def __init__(self, timeout: float = 5.0, max_answer_chars: int = MAX_ANSWER_CHARS) -> None:
        self.timeout = timeout
        self.max_answer_chars = max_answer_chars
        self._gold: OrderedDict[str, Any] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {"timeout": self.timeout, "max_answer_chars": self.max_answer_chars}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], answer: Sequence[Any], **_: Any):
        from hacrl.tasks.answers import is_equivalent, parse_answer

        seconds = max(1, math.ceil(self.timeout / 3))
        rewards = []
        for completion, gold in zip(completions, answer, strict=True):
            predicted, boxed = final_answer(completion)
            if not predicted or len(predicted) > self.max_answer_chars:
                rewards.append(0.0)
                continue
            gold_text = _gold_text(gold)
            gold_parsed = self._gold_parsed(gold_text, seconds)
            pred_parsed = parse_answer(predicted, boxed, seconds)
            ok = is_equivalent(gold_text, gold_parsed, predicted, pred_parsed, seconds)
            rewards.append(1.0 if ok else 0.0)
        return rewards

    def _gold_parsed(self, gold: str, seconds: int):
        from hacrl.tasks.answers import parse_gold

        if gold in self._gold:
            self._gold.move_to_end(gold)
            return self._gold[gold]
        parsed = parse_gold(gold, seconds)
        self._gold[gold] = parsed
        if len(self._gold) > 4096:
            self._gold.popitem(last=False)
        return parsed


def _gold_text(gold: Any) -> str:
    """A gold answer as text (`value_text`; a list's first entry, OlympiadBench's `final_answer`); "" for none."""
    if isinstance(gold, (list, tuple)):
        gold = gold[0] if gold else None
    return value_text(gold) or ""


def math_reward(timeout: float = 5.0, max_answer_chars: int = MAX_ANSWER_CHARS) -> MathReward:
    """The math verifier as a reward function (see `MathReward`)."""
    return MathReward(timeout, max_answer_chars)


class ReasoningGymReward:
    """The task's own scorer: `dataset.score_answer(answer, entry)`, entry from the data, the answer being what the
    last `<answer>...</answer>` holds (reasoning-gym's own recipe: its system prompt asks for the tags, and its
    `extract_answer` takes them before scoring), else `extract_answer(completion)` (the last box, `####`,
    "answer:", else the last line).

    Most tasks compare the answer with the gold as text, so a model that answers in prose without tags or a box is
    scored on its whole last line ("4 + 1 equals 5." against "5": 0.06): hence reasoning-gym's system prompt by
    default (`data.system_prompt: auto`), and on a numeric task the last number of an untagged final answer
    (`numeric`, `scoring.builtin: auto`).
    An extracted answer longer than `max_answer_chars` scores 0 without reaching the task's scorer."""

    def __init__(self, dataset: Any, max_answer_chars: int = MAX_ANSWER_CHARS, numeric: bool = False) -> None:
        self.dataset = dataset
        self.max_answer_chars = max_answer_chars
        self.numeric = numeric
        """`scoring.builtin: auto` on a task whose every gold answer is a number: an answer without tags is the
        last number of its final answer (a box, `####`, "answer is", else its last line), where the whole last line
        was compared with the bare number ("3 + 4 equals 7." against 7). A number, never an expression: the math
        verifier would evaluate a restated question ("To calculate 5 + 3, we add them." reads as 8)."""

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], entry: Sequence[dict], **_: Any):
        out = []
        for completion, e in zip(completions, entry, strict=True):
            answer = tagged_answer(completion)
            if answer is None:
                answer = extract_answer(completion)
                if self.numeric:
                    answer = last_number(answer) or answer
            out.append(
                0.0 if len(answer) > self.max_answer_chars else float(self.dataset.score_answer(answer, entry=e))
            )
        return out


def tagged_answer(text: str) -> str | None:
    """What the last `<answer>...</answer>` of `text` holds, stripped (None: no complete pair). Linear in the text.

    >>> tagged_answer("so <answer>3</answer> no, <answer> 5 </answer>")
    '5'
    """
    end = text.rfind("</answer>")
    if end < 0:
        return None
    start = text.rfind("<answer>", 0, end)
    return None if start < 0 else text[start + len("<answer>") : end].strip()


def reasoning_gym_reward(
    dataset: Any, max_answer_chars: int = MAX_ANSWER_CHARS, numeric: bool = False
) -> ReasoningGymReward:
    return ReasoningGymReward(dataset, max_answer_chars, numeric)


NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")
"""A number as a gold answer or a final answer holds one: an integer, a decimal or a fraction, signed."""


def numeric_golds(entries: Sequence[dict]) -> bool:
    """Whether every gold answer of these reasoning-gym entries is a number."""
    return bool(entries) and all(NUMBER.fullmatch(str(e["answer"]).strip()) for e in entries)


def last_number(text: str) -> str | None:
    """The last number in `text` (None: none). Linear in the text.

    >>> last_number("So, 5 + 3 equals 8."), last_number("The result is -4.5 meters."), last_number("none")
    ('8', '-4.5', None)
    """
    found = None
    for found in NUMBER.finditer(text):  # noqa: B007 - the last one
        pass
    return None if found is None else found.group(0).rstrip(".")


def import_reward_function(path: str) -> RewardFn:
    """Load `package.module:function`. The module is looked up on `sys.path` and then in the working directory
    (as under `python -m hacrl`), so a `my_rewards.py` next to the config works with the `hacrl` command too.

    This runs the module's code: a config that names a reward function runs code with your permissions.
    """
    module_name, _, attr = path.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - ImportError, SyntaxError, or whatever the module raises on import
        raise RewardError(
            f"scoring.function={path!r}: cannot import module {module_name!r} ({type(e).__name__}: {e}); "
            "it must be importable from the working directory or PYTHONPATH"
        ) from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"scoring.function={path!r}: {module_name} has no callable {attr!r}")
    return fn


def reward_name(fn: Any) -> str:
    """How messages name a reward function: its qualified name, or its class name for callable objects."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def call_reward(
    fn: RewardFn,
    prompts: Sequence[Any],
    completions: Sequence[str],
    columns: dict[str, Sequence[Any]],
    *,
    name: str | None = None,
    offset: int = 0,
) -> Any:
    """`fn(prompts=..., completions=..., **columns)` in this process, as every in-process caller makes it: an
    exception comes back as a `RewardError` naming the function, the samples (from `offset`) and the first
    completion. The output is returned unchecked (`validate_rewards` checks it)."""
    try:
        return fn(prompts=list(prompts), completions=list(completions), **{k: list(v) for k, v in columns.items()})
    except Exception as e:  # noqa: BLE001 - re-raised with the function's name and what it was scoring
        raise RewardError(
            f"reward function {name or reward_name(fn)} raised {type(e).__name__}: {e} (while scoring "
            f"{len(completions)} completions from sample {offset}, the first: "
            f"{clip(completions[0], 77) if completions else ''!r})"
        ) from e


def score(
    fn: RewardFn,
    prompts: Sequence[Any],
    completions: Sequence[str],
    columns: dict[str, Sequence[Any]],
    *,
    r_max: float,
) -> list[float]:
    """Call a reward function in this process (no time limit) and check its output (see `validate_rewards`)."""
    rewards = call_reward(fn, prompts, completions, columns)
    return validate_rewards(reward_name(fn), rewards, completions, r_max=r_max)


def validate_rewards(name: str, rewards: Any, completions: Sequence[str], *, r_max: float, offset: int = 0):
    """One finite number in [0, r_max] per completion (a bool counts as 0 / 1; a string, even "1.0", does not).

    `offset` is added to sample numbers in messages (when `completions` is a slice of a larger batch)."""
    if not isinstance(rewards, (list, tuple)) or len(rewards) != len(completions):
        got = len(rewards) if isinstance(rewards, (list, tuple)) else type(rewards).__name__
        raise RewardError(f"reward function {name} must return a list of {len(completions)} floats, got {got}")
    out = []
    for i, value in enumerate(rewards):
        number = _as_number(value)
        if not math.isfinite(number) or not 0.0 <= number <= r_max:
            raise RewardError(
                f"reward function {name} returned {value!r} ({type(value).__name__}) for sample {offset + i} "
                f"(completion {clip(completions[i], 77)!r}); rewards must be finite numbers in "
                f"[0, algorithm.r_max={r_max}]"
            )
        out.append(number)
    return out


def _as_number(value: Any) -> float:
    if isinstance(value, (str, bytes)) or value is None:
        return math.nan
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        try:
            value = value.item()  # numpy / torch scalars
        except (TypeError, ValueError, RuntimeError):
            return math.nan
        if isinstance(value, (str, bytes)):
            return math.nan
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan
