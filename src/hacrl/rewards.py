"""Verifiable rewards: answer extraction, the math verifier, reasoning-gym scorers and user functions.

Every reward function has TRL's signature ``f(prompts, completions, **columns) -> list[float]``: `prompts` are the
prompts as the data gives them (a string or a list of chat messages), `completions` the decoded response texts,
and each dataset column (`answer`, ...) arrives as a list aligned with them. `score` calls one and checks what it
returns, so a broken reward stops the run with a message naming the function and the sample.
"""

from __future__ import annotations

import importlib
import logging
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

RewardFn = Callable[..., list[float]]

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"####\s*(.+)")
_ANSWER_IS = re.compile(r"answer\s*(?:is)?\s*[:=]\s*(.+)", re.IGNORECASE)


class RewardError(RuntimeError):
    """A reward function failed or returned something unusable; the run stops (no silent zero)."""


def extract_answer(text: str) -> str:
    """The final answer of a response: the last `\\boxed{...}`, else what follows the last `####`, else what
    follows the last "answer:" (or "answer is:"), else the last non-empty line. Linear time, no backtracking.

    >>> extract_answer("so 2+2 = \\\\boxed{4}.")
    '4'
    >>> extract_answer("12,13,4\\n#### 432")
    '432'
    >>> extract_answer("The answer is: -7")
    '-7'
    """
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    for pattern in (_HASHES, _ANSWER_IS):
        matches = pattern.findall(text)
        if matches:
            return matches[-1].strip()
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _last_boxed(text: str) -> str | None:
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None  # unbalanced: no answer


def math_reward(timeout: float = 5.0) -> RewardFn:
    """1.0 when the extracted answer is mathematically equivalent to `answer` (via `math-verify`), else 0.0.

    Each parse/verify call is time-limited by math-verify itself (`timeout` seconds), so a hostile output
    cannot hang the run; a timeout scores 0.
    """
    from math_verify import parse, verify

    seconds = max(1, math.ceil(timeout))
    # math-verify logs every timeout with the whole (possibly hostile, huge) text; a timeout already scores 0
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)

    def math_answer(prompts: Sequence[Any], completions: Sequence[str], answer: Sequence[Any], **_: Any) -> list[float]:
        rewards = []
        for completion, gold in zip(completions, answer, strict=True):
            predicted = extract_answer(completion)
            if not predicted:
                rewards.append(0.0)
                continue
            gold_parsed = parse(_as_math(str(gold)), parsing_timeout=seconds)
            pred_parsed = parse(_as_math(predicted), parsing_timeout=seconds)
            ok = verify(gold_parsed, pred_parsed, timeout_seconds=seconds) if gold_parsed and pred_parsed else False
            rewards.append(1.0 if ok else 0.0)
        return rewards

    return math_answer


def _as_math(text: str) -> str:
    """Wrap a bare answer in `$...$` so that math-verify's LaTeX extractor reads it (a plain number is fine too)."""
    return text if "$" in text or "\\" in text else f"${text}$"


def reasoning_gym_reward(dataset: Any) -> RewardFn:
    """The task's own scorer: `dataset.score_answer(extract_answer(completion), entry)`, entry from the data."""

    def reasoning_gym_score(prompts: Sequence[Any], completions: Sequence[str], entry: Sequence[dict], **_: Any):
        return [
            float(dataset.score_answer(extract_answer(c), entry=e)) for c, e in zip(completions, entry, strict=True)
        ]

    return reasoning_gym_score


def import_reward_function(path: str) -> RewardFn:
    """Load `package.module:function` (the module must be importable, e.g. on PYTHONPATH)."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RewardError(f"data.reward_function={path!r}: cannot import module {module_name!r} ({e})") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"data.reward_function={path!r}: {module_name} has no callable {attr!r}")
    return fn


def score(
    fn: RewardFn,
    prompts: Sequence[Any],
    completions: Sequence[str],
    columns: dict[str, Sequence[Any]],
    *,
    r_max: float,
) -> list[float]:
    """Call a reward function and check its output: one finite float in [0, r_max] per completion."""
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        rewards = fn(prompts=list(prompts), completions=list(completions), **{k: list(v) for k, v in columns.items()})
    except Exception as e:  # noqa: BLE001 - re-raised with the function's name and what it was scoring
        raise RewardError(
            f"reward function {name} raised {type(e).__name__}: {e} (while scoring {len(completions)} completions, "
            f"the first: {_short(completions[0]) if completions else ''!r})"
        ) from e
    if not isinstance(rewards, (list, tuple)) or len(rewards) != len(completions):
        got = len(rewards) if isinstance(rewards, (list, tuple)) else type(rewards).__name__
        raise RewardError(f"reward function {name} must return a list of {len(completions)} floats, got {got}")
    out = []
    for i, value in enumerate(rewards):
        try:
            value = float(value)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or not 0.0 <= value <= r_max:
            raise RewardError(
                f"reward function {name} returned {rewards[i]!r} for sample {i} (completion "
                f"{_short(completions[i])!r}); rewards must be finite and in [0, algorithm.r_max={r_max}]"
            )
        out.append(value)
    return out


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
