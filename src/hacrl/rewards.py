"""Verifiable rewards: answer extraction, the math verifier, reasoning-gym scorers and user functions.

Every reward function has TRL's signature ``f(prompts, completions, **columns) -> list[float]``: `prompts` are the
prompts as the data gives them (a string or a list of chat messages), `completions` the decoded response texts,
and each dataset column (`answer`, ...) arrives as a list aligned with them. `score` calls one in this process and
checks what it returns; `hacrl.scoring.Scorer` calls one in separate processes under a time limit, which is how
the trainer and evaluation use them.

Model outputs are untrusted input. Everything here that reads a completion is linear in its length (no regex
that can backtrack over unbounded text), and an extracted answer longer than `max_answer_chars` scores 0 without
reaching a parser. The built-in scorers are picklable classes so that they can run in a scoring process.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from hacrl.errors import RewardError

__all__ = [
    "MathReward",
    "ReasoningGymReward",
    "RewardError",
    "RewardFn",
    "extract_answer",
    "import_reward_function",
    "math_reward",
    "reasoning_gym_reward",
    "reward_name",
    "score",
    "validate_rewards",
]

RewardFn = Callable[..., list[float]]

MAX_ANSWER_CHARS = 4096
"""Default cap on an extracted answer: longer ones score 0 without being parsed (`scoring.max_answer_chars`)."""

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACES = re.compile(r"[{}]")
_HASHES = re.compile("####")
_ANSWER = re.compile("answer", re.IGNORECASE)
_IS = re.compile("is", re.IGNORECASE)
_SPACES = re.compile(r"\s*")
# the characters str.splitlines() splits on ("\r\n" ends in "\n")
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def extract_answer(text: str) -> str:
    """The final answer of a response: the last `\\boxed{...}`, else what follows the last `####`, else what
    follows the last "answer:" (or "answer is:", "answer ="), else the last non-empty line.

    Linear in `len(text)` for any text. The result is exactly what the regexes `####\\s*(.+)` and
    `answer\\s*(?:is)?\\s*[:=]\\s*(.+)` (case-insensitive, last of `findall`) would give; the second of them
    backtracks quadratically over long whitespace runs, so both are emulated here instead of run.

    >>> extract_answer("so 2+2 = \\\\boxed{4}.")
    '4'
    >>> extract_answer("12,13,4\\n#### 432")
    '432'
    >>> extract_answer("The answer is: -7")
    '-7'
    """
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    # r"####\s*(.+)", then r"answer\s*(?:is)?\s*[:=]\s*(.+)" (case-insensitive)
    for marker, capture in ((_HASHES, _rest_of_line), (_ANSWER, _answer_at)):
        found = _last_capture(text, marker, capture)
        if found is not None:
            return found.strip()
    return _last_line(text)


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{` / `\\fbox{` up to its matching brace; None when there is none or it is open."""
    last = None
    for m in _BOXED.finditer(text):
        last = m
    if last is None:
        return None
    depth, start = 1, last.end()
    for brace in _BRACES.finditer(text, start):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return text[start : brace.start()]
    return None  # unbalanced: no answer


def _rest_of_line(text: str, pos: int) -> tuple[str, int] | None:
    """What `\\s*(.+)` captures when matched at `pos` (with the regex engine's backtracking), and where it ends."""
    start = _SPACES.match(text, pos).end()
    if start < len(text):  # a non-space character: `.+` runs to the end of its line
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        return text[start:end], end
    # only whitespace up to the end: `\s*` gives back characters until `.` (anything but "\n") can match one
    last = len(text.rstrip("\n")) - 1
    if last >= pos:
        return text[last], last + 1
    return None


def _last_capture(text: str, marker: re.Pattern, capture) -> str | None:
    """The last capture of `re.findall(marker + tail, text)`, where `capture(text, pos)` emulates `tail` matched
    at `pos`: findall's scan (resume after a match; one position on after a failed start), without the regex."""
    found, pos = None, 0
    while (m := marker.search(text, pos)) is not None:
        rest = capture(text, m.end())
        if rest is None:
            pos = m.start() + 1
        else:
            found, pos = rest
    return found


def _answer_at(text: str, pos: int) -> tuple[str, int] | None:
    """`\\s*(?:is)?\\s*[:=]\\s*(.+)` at `pos`. Every way the regex could split the whitespace leads to the same
    separator character, so only two cases exist: the separator right after the spaces, or after "is"."""
    after_spaces = _SPACES.match(text, pos).end()
    if after_spaces < len(text) and text[after_spaces] in ":=":
        return _rest_of_line(text, after_spaces + 1)
    is_word = _IS.match(text, after_spaces)
    if is_word is not None:
        sep = _SPACES.match(text, is_word.end()).end()
        if sep < len(text) and text[sep] in ":=":
            return _rest_of_line(text, sep + 1)
    return None


def _last_line(text: str) -> str:
    """The last line of `text` that is not blank, stripped (as `[l.strip() for l in text.splitlines()]` would)."""
    body = text.rstrip()
    if not body:
        return ""
    cut = max(body.rfind(ch) for ch in _LINE_BREAKS)
    return body[cut + 1 :].strip()


class MathReward:
    """1.0 when the extracted answer is mathematically equivalent to `answer` (via `math-verify`), else 0.0.

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
        from math_verify import parse, verify

        # math-verify logs every timeout with the whole (possibly hostile, huge) text; a timeout already scores 0
        logging.getLogger("math_verify").setLevel(logging.CRITICAL)
        seconds = max(1, math.ceil(self.timeout / 3))
        rewards = []
        for completion, gold in zip(completions, answer, strict=True):
            predicted = extract_answer(completion)
            if not predicted or len(predicted) > self.max_answer_chars:
                rewards.append(0.0)
                continue
            gold_parsed = self._gold_parsed(str(gold), seconds)
            pred_parsed = parse(_as_math(predicted), parsing_timeout=seconds) if gold_parsed else None
            ok = verify(gold_parsed, pred_parsed, timeout_seconds=seconds) if gold_parsed and pred_parsed else False
            rewards.append(1.0 if ok else 0.0)
        return rewards

    def _gold_parsed(self, gold: str, seconds: int):
        from math_verify import parse

        if gold in self._gold:
            self._gold.move_to_end(gold)
            return self._gold[gold]
        parsed = parse(_as_math(gold), parsing_timeout=seconds)
        self._gold[gold] = parsed
        if len(self._gold) > 4096:
            self._gold.popitem(last=False)
        return parsed


def math_reward(timeout: float = 5.0, max_answer_chars: int = MAX_ANSWER_CHARS) -> MathReward:
    """The math verifier as a reward function (see `MathReward`)."""
    return MathReward(timeout, max_answer_chars)


def _as_math(text: str) -> str:
    """Wrap a bare answer in `$...$` so that math-verify's LaTeX extractor reads it (a plain number is fine too)."""
    return text if "$" in text or "\\" in text else f"${text}$"


class ReasoningGymReward:
    """The task's own scorer: `dataset.score_answer(extract_answer(completion), entry)`, entry from the data.

    An extracted answer longer than `max_answer_chars` scores 0 without reaching the task's scorer."""

    def __init__(self, dataset: Any, max_answer_chars: int = MAX_ANSWER_CHARS) -> None:
        self.dataset = dataset
        self.max_answer_chars = max_answer_chars

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], entry: Sequence[dict], **_: Any):
        out = []
        for completion, e in zip(completions, entry, strict=True):
            answer = extract_answer(completion)
            out.append(
                0.0 if len(answer) > self.max_answer_chars else float(self.dataset.score_answer(answer, entry=e))
            )
        return out


def reasoning_gym_reward(dataset: Any, max_answer_chars: int = MAX_ANSWER_CHARS) -> ReasoningGymReward:
    return ReasoningGymReward(dataset, max_answer_chars)


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
            f"{_short(completions[0]) if completions else ''!r})"
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
                f"(completion {_short(completions[i])!r}); rewards must be finite numbers in "
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


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
