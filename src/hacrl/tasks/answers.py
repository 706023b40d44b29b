"""Reading answers out of text: a response's final answer (`final_answer`), and the math verifier (`is_equivalent`:
is it the gold answer?). `hacrl.tasks.rewards.MathReward` is the two as a reward function; `hacrl.tasks.sources`
reads MATH's gold answers with `boxed_answer`.

**The final answer** of a response is the last `\\boxed{}` (with the boxes just before it when only commas, "and",
"or" or math delimiters stand between them: `$\\boxed{-2}$ and $\\boxed{1}$` is `-2, 1`), else what follows the
last `####`, else what follows the last "answer:" (or "answer is:", "answer ="), else the last non-empty line (the
display block it closes when that line is only `\\]` or `$$`). Model outputs are untrusted input: all of this is
linear in the text's length (no regex that can backtrack over unbounded text), and the caller bounds the answer's
length before anything parses it (`scoring.max_answer_chars`).

**The math verifier.** math-verify reads LaTeX only inside a math environment ("the latex must be placed in latex
environment to be parsable", its README): a bare `2\\sqrt{5}` handed to `parse` is read in part (`5`) or not at all,
which made both false positives (`2\\sqrt{7}` scored right for `2\\sqrt{5}`) and false negatives (`\\sqrt{3}`
wrong for itself). So every answer reaches it inside `\\boxed{}` with boxed matching first, the form it is built
for, the way verl passes ground truths (`"\\boxed{" + gold + "}"`):

- the **gold** (a plain answer as a dataset writes it: `\\frac{1}{2}`, `$\\frac{1}{2}$`, `\\text{(C)}`, `10,\\!000`,
  `(-\\infty, 2]`, ...) loses its outer `$...$` / `\\(...\\)` / `\\[...\\]` and is boxed; a gold that already
  holds a `\\boxed{}` keeps its boxed answer;
- the **response's final answer** is boxed when it came from a box; an answer from running text goes to math-verify
  as it is (its extractors find `$...$` and plain numbers in prose), inside `$...$` when it is bare LaTeX;
- `verify(gold, answer)` in that order (it is not symmetric).

Three things math-verify gets wrong on the paper's data are handled here, each with its reason next to it:
`normalize` rewrites forms it misreads (`10\\,000` read as 10 * 0, `3e8` read as 3 * Euler's e * 8,
`\\varnothing`), `_close_numbers` rejects numbers that only agree after rounding to 6 decimals (1.2e-7 and 1.3e-7
both round to 0; Minerva's answers are that small), and choice letters (`\\text{(C)}` against
`\\textbf{(C)}\\ 12`, or a last line "The answer is (C)." as multiple-choice prompts ask for it) and plain
words (`\\text{Evelyn}` against `Evelyn`, which LaTeX reads as the product E*v*e*l*y*n) are compared as text.

The verifier reads an answer that the caller bounded; its regexes are linear, and each math-verify call has its
time limit (`seconds`).
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

__all__ = [
    "answer_target",
    "boxed_answer",
    "extract_answer",
    "final_answer",
    "gold_target",
    "is_equivalent",
    "normalize",
    "parse_answer",
    "parse_gold",
    "strip_math_delimiters",
    "value_text",
]

# ---------------------------------------------------------------------------------------------------- extraction
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
    return final_answer(text)[0]


def final_answer(text: str) -> tuple[str, bool]:
    """`extract_answer(text)`, and whether it came from a `\\boxed{}` (the math verifier reads the two kinds
    differently: a box holds one expression, running text may hold words around it)."""
    boxed = boxed_answer(text)
    if boxed is not None:
        return boxed, True
    # r"####\s*(.+)", then r"answer\s*(?:is)?\s*[:=]\s*(.+)" (case-insensitive)
    for marker, capture in ((_HASHES, _rest_of_line), (_ANSWER, _answer_at)):
        found = _last_capture(text, marker, capture)
        if found is not None:
            return found.strip(), False
    return _display_block(text, _last_line(text)), False


MAX_JOINED_BOXES = 64
"""At most this many boxes make one answer (the last ones of a run); more cannot be a list of answers."""
_JOIN_GAP = 80
_JOINER = re.compile(
    r"(?:\s|[,;&$]|\\[()\[\]]|\\q?quad|\\[,;:! ]|\\text\s*\{\s*(?:and|or|,)?\s*\}|and|or"
    r"|[A-Za-z](?:_\{?\w{1,3}\}?)?\s*=)*",
    re.IGNORECASE,
)
"""What may stand between two boxes that together give one answer: spaces, commas, math delimiters, `\\quad`,
"and" / "or" (also as `\\text{and}`), a variable's `x =` or `x_2 =`: `$x = \\boxed{-2}$ or $x = \\boxed{1}$`,
`\\boxed{1},\\boxed{2}`. Any other word between them (`\\boxed{3}, no: \\boxed{5}`) leaves the last box alone."""


def boxed_answer(text: str) -> str | None:
    """The final boxed answer: the last `\\boxed{}`'s content, or, when the boxes before it are only joined by
    commas, "and", "or", spaces or math delimiters (`the roots are $\\boxed{-2}$ and $\\boxed{1}$`), their contents
    joined by ", " (`-2, 1`). None when there is no box or the last one is open.

    Linear in `len(text)`: each box's closing brace is looked for only up to the next box's start (a box that does
    not close before the next one starts holds it, or is open, and ends the run before it).

    >>> boxed_answer("so $x = \\\\boxed{-2}$ or $x = \\\\boxed{1}$")
    '-2, 1'
    >>> boxed_answer("\\\\boxed{-2} \\\\quad\\\\text{and}\\\\quad \\\\boxed{1}.")
    '-2, 1'
    >>> boxed_answer("first \\\\boxed{3}, no: \\\\boxed{5}"), boxed_answer("\\\\boxed{\\\\boxed{2}}")
    ('5', '2')
    >>> boxed_answer("\\\\boxed{2") is None
    True
    """
    from collections import deque

    run: deque[tuple[int, str]] = deque(maxlen=MAX_JOINED_BOXES)  # (end of the box, its content)
    matches = _BOXED.finditer(text)
    box = next(matches, None)
    while box is not None:
        following = next(matches, None)
        end = _closing_brace(text, box.end(), following.start() if following is not None else len(text))
        if end is None:
            if following is None:
                return None  # the last box is open: no boxed answer
            run.clear()  # holds the next box, or is open: no run goes through it
        else:
            if run and not _joins(text, run[-1][0] + 1, box.start()):
                run.clear()
            run.append((end, text[box.end() : end].strip()))
        box = following
    return ", ".join(content for _, content in run) if run else None


def _closing_brace(text: str, start: int, limit: int) -> int | None:
    """Where the brace opened just before `start` closes, looking no further than `limit`."""
    depth = 1
    for brace in _BRACES.finditer(text, start, limit):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return brace.start()
    return None


def _joins(text: str, start: int, end: int) -> bool:
    return end - start <= _JOIN_GAP and _JOINER.fullmatch(text, start, end) is not None


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


_DISPLAY_OPENERS = {"\\]": "\\[", "$$": "$$"}


def _display_block(text: str, line: str) -> str:
    """A last line that only closes display math (`\\]`, `$$`) stands for the block it closes: `\\[`, the lines
    inside, `\\]`."""
    opener = _DISPLAY_OPENERS.get(line)
    if opener is None:
        return line
    body = text.rstrip()
    start = body.rfind(opener, 0, len(body) - len(line))
    return body[start:].strip() if start >= 0 else line


# ---------------------------------------------------------------------------------------------------- rewriting
_SCIENTIFIC = re.compile(r"(?<![\w.\\^_])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")
"""`3e8`, `1.6E-19`, `2.5e+3`: a number in e-notation (LaTeX reads `e` as Euler's number)."""
_DIGIT_GROUP = re.compile(r"(?<=\d)(?:\\[,!;: ]|\{,\}|~|\\thinspace ?)(?=\d{3}(?!\d))")
"""A thin space or `{,}` between digit groups: `10\\,000`, `1{,}024` (math-verify reads `10\\,000` as 10 * 0)."""
_ALIASES = (("\\varnothing", "\\emptyset"),)


def normalize(text: str) -> str:
    """An answer in the forms math-verify reads correctly (see the module docstring).

    >>> normalize("3e8"), normalize("1.6E-19"), normalize("10\\\\,000"), normalize("1{,}024")
    ('3\\\\times 10^{8}', '1.6\\\\times 10^{-19}', '10000', '1024')
    >>> normalize("x^2e3")  # not a number in e-notation: left alone
    'x^2e3'
    """
    text = _SCIENTIFIC.sub(lambda m: f"{m.group(1)}\\times 10^{{{int(m.group(2))}}}", text)
    text = _DIGIT_GROUP.sub("", text)
    for alias, name in _ALIASES:
        text = text.replace(alias, name)
    return text


_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def strip_math_delimiters(text: str) -> str:
    """`$x$`, `$$x$$`, `\\(x\\)`, `\\[x\\]` -> `x`; an answer that is several inline pieces (`$\\sqrt{2}$,
    $-\\sqrt{2}$`, OlympiadBench's multiple answers) loses every unescaped `$`."""
    text = text.strip()
    for left, right in _DELIMITERS:
        if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right):
            inner = text[len(left) : -len(right)]
            if left.startswith("$") and _unescaped_dollars(inner):
                return re.sub(r"(?<!\\)\$", "", text).strip()
            return inner.strip()
    return text


def _unescaped_dollars(text: str) -> bool:
    return re.search(r"(?<!\\)\$", text) is not None


def value_text(value: Any) -> str | None:
    """A dataset's value as answer text: an integer-valued float without its `.0` (AMC's `27.0` is `27`); None for
    None or a bool (no answer).

    >>> value_text(27.0), value_text(2.5), value_text("x^2"), value_text(7), value_text(None), value_text(True)
    ('27', '2.5', 'x^2', '7', None, None)
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def gold_target(gold: str) -> str:
    """What math-verify parses for a gold answer: its content inside `\\boxed{}` (see the module docstring).

    >>> gold_target("$\\\\frac{1}{2}$"), gold_target("so \\\\boxed{2\\\\sqrt{5}}."), gold_target("1.5e3")
    ('\\\\boxed{\\\\frac{1}{2}}', '\\\\boxed{2\\\\sqrt{5}}', '\\\\boxed{1.5\\\\times 10^{3}}')
    """
    text = strip_math_delimiters(gold)
    boxed = boxed_answer(text)
    if boxed is not None:
        text = boxed
    return "\\boxed{" + normalize(text) + "}"


def answer_target(answer: str, boxed: bool) -> str:
    """What math-verify parses for a response's final answer: boxed when it came from a box; from running text
    as it is (inside `$...$` when it is bare LaTeX, which math-verify would not see otherwise)."""
    text = normalize(answer)
    if boxed:
        return "\\boxed{" + text + "}"
    if "\\" in text and not _has_math_environment(text):
        return f"${text}$"
    return text


def _has_math_environment(text: str) -> bool:
    return _unescaped_dollars(text) or "\\(" in text or "\\[" in text or "\\boxed" in text


# ---------------------------------------------------------------------------------------------------- math-verify
def _configs(boxed: bool):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    if boxed:  # the boxed answer first, whatever else the text holds
        return [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    return [LatexExtractionConfig(), ExprExtractionConfig()]


def _quiet() -> None:
    # math-verify logs every timeout with the whole (possibly hostile, huge) text; a timeout already scores 0
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)


def parse_gold(gold: str, seconds: int) -> list[Any]:
    """math-verify's parse of a gold answer (empty when it cannot read it)."""
    from math_verify import parse

    _quiet()
    return parse(gold_target(gold), _configs(boxed=True), parsing_timeout=seconds)


def parse_answer(answer: str, boxed: bool, seconds: int) -> list[Any]:
    """math-verify's parse of a response's final answer (`boxed`: it came from a `\\boxed{}`)."""
    from math_verify import parse

    _quiet()
    return parse(answer_target(answer, boxed), _configs(boxed), parsing_timeout=seconds)


def is_equivalent(gold: str, gold_parsed: list[Any], answer: str, answer_parsed: list[Any], seconds: int) -> bool:
    """Is the final answer right? math-verify's `verify(gold, answer)`, then the corrections of the module
    docstring: a choice letter or a plain word compared as text, numbers compared to 6 significant digits."""
    from math_verify import verify

    choice = _choice(gold)
    if choice is not None:  # `\text{(C)}`, `(C)`, `C`: the answer names the same choice, whatever follows it
        return (_stated_choice(answer) or _choice(answer, prefix=True)) == choice  # a statement first
    if gold_parsed and answer_parsed and verify(gold_parsed, answer_parsed, timeout_seconds=seconds):
        return _close_numbers(gold, gold_parsed, answer, answer_parsed, seconds)
    plain = _as_text(gold)
    return bool(plain) and plain == _as_text(answer)


_TEXT_COMMANDS = re.compile(r"\\(?:textbf|textit|textrm|textnormal|text|mathrm|mathbf|mbox|operatorname)\s*")
_SPACING = re.compile(r"\\(?:left|right|displaystyle|[,!;: ])|[\s{}$~]")


def _as_text(answer: str) -> str:
    """An answer as plain text: no text commands, braces, spacing, `$` or final full stop (for exact matches).

    >>> _as_text("\\\\text{ Evelyn }."), _as_text("$\\\\mathrm{Sunday}$")
    ('Evelyn', 'Sunday')
    """
    text = _SPACING.sub("", _TEXT_COMMANDS.sub("", strip_math_delimiters(answer)))
    return text.rstrip(".")


_CHOICE = re.compile(r"\(?([A-E])\)?")
_CHOICE_PREFIX = re.compile(r"\(([A-E])\)|([A-E])(?:$|[^A-Za-z0-9_^])")


def _choice(answer: str, *, prefix: bool = False) -> str | None:
    """The choice letter an answer names (`C`, `(C)`, `\\text{(C)}`, `\\textbf{(C)}`); with `prefix`, also when
    the choice's value follows it (`\\textbf{(C)}\\ 12`, `(C) 12`).

    >>> _choice("\\\\text{(C)}"), _choice("\\\\textbf{(C) }\\\\ 12", prefix=True), _choice("C = 12", prefix=True)
    ('C', 'C', 'C')
    >>> _choice("Cats", prefix=True), _choice("12"), _choice("(C) 12")
    (None, None, None)
    """
    text = _as_text(answer).replace("*", "")  # markdown emphasis: `**(C)**`, `**Answer:** C`
    if not prefix:
        m = _CHOICE.fullmatch(text)
        return m.group(1) if m else None
    m = _CHOICE_PREFIX.match(text)
    return (m.group(1) or m.group(2)) if m else None


_ANSWER_WORD = re.compile("answer", re.IGNORECASE)


def _stated_choice(answer: str) -> str | None:
    """The choice letter of the last "answer is (C)" (or "answer: C", "answer = $\\text{(C)}$") in an answer that
    is a whole sentence: a last line such as "The answer is (B)." (no colon, so `final_answer` keeps the line), the
    way multiple-choice prompts ask for it. Linear: each "answer" is followed by at most 64 characters.

    >>> _stated_choice("The answer is (B)."), _stated_choice("so the answer is $\\\\text{(D)}$"), _stated_choice("Bob")
    ('B', 'D', None)
    """
    found = None
    for m in _ANSWER_WORD.finditer(answer):
        pos = _SPACES.match(answer, m.end()).end()
        is_word = _IS.match(answer, pos)
        if is_word is not None:
            pos = _SPACES.match(answer, is_word.end()).end()
        if pos < len(answer) and answer[pos] in ":=":
            pos += 1
        letter = _choice(answer[pos : pos + 64], prefix=True)
        if letter is not None:
            found = letter
    return found


_PERCENT = re.compile(r"%|percent|pct", re.IGNORECASE)


def _close_numbers(gold: str, gold_parsed: list[Any], answer: str, answer_parsed: list[Any], seconds: int) -> bool:
    """False when both sides are real numbers that differ by more than one unit in the 6th significant digit of
    the larger: math-verify's 6 decimals, made relative.

    math-verify compares floats rounded to 6 decimals and chops differences below ~1e-15, so 1.2e-7 and 1.3e-7
    (or 1.6e-19 and 1.7e-19) come out equal; answers that small are common in Minerva Math. For numbers of 1 and
    more its rule is already the stricter one. Percentages are left to math-verify (`10\\%` against `10` is its
    deliberate match)."""
    if _PERCENT.search(gold) or _PERCENT.search(answer):
        return True
    g, a = _real_number(gold_parsed, seconds), _real_number(answer_parsed, seconds)
    if g is None or a is None:
        return True
    larger = max(abs(g), abs(a))
    return larger == 0 or abs(g - a) <= 10.0 ** (math.floor(math.log10(larger)) + 1 - 6)


def _real_number(parsed: list[Any], seconds: int) -> float | None:
    """The first parsed value as a float when it is a real number (not a symbol, set, tuple or matrix)."""
    import sympy
    from math_verify.errors import TimeoutException
    from math_verify.utils import timeout

    value = next((p for p in parsed if isinstance(p, sympy.Basic)), None)
    if not isinstance(value, sympy.Expr) or not value.is_number:
        return None

    @timeout(timeout_seconds=seconds)
    def evaluate() -> float | None:
        number = complex(value.evalf(30))
        return number.real if number.imag == 0 and math.isfinite(number.real) else None

    try:
        return evaluate()
    except (TimeoutException, TypeError, ValueError, ArithmeticError, AttributeError):
        return None
