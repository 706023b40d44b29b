"""The paper's datasets by name: where each lives on the Hub and how its rows read (plain data; `hacrl.tasks.sources`
loads them, the config checks names against them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NamedSet:
    """One of the paper's datasets: where it lives and how its rows read."""

    name: str
    hub: str
    config: str | None
    split: str
    """The split the paper trains or evaluates on."""
    question: str
    answer: str
    gold: str
    rows: int
    """Rows of that split on the Hub (what `hacrl data prepare` expects to write)."""
    about: str


NAMED_SETS = {
    s.name: s
    for s in (
        NamedSet(
            "math",
            "DigitalLearningGmbH/MATH-lighteval",
            "default",
            "train",
            "problem",
            "solution",
            "boxed",
            7500,
            "MATH, the training set: 7,500 competition problems with worked solutions",
        ),
        NamedSet(
            "math_test",
            "DigitalLearningGmbH/MATH-lighteval",
            "default",
            "test",
            "problem",
            "solution",
            "boxed",
            5000,
            "MATH's 5,000 test problems (the paper's `MATH` column)",
        ),
        NamedSet(
            "math500",
            "HuggingFaceH4/MATH-500",
            None,
            "test",
            "problem",
            "answer",
            "plain",
            500,
            "MATH-500: 500 of MATH's test problems (Lightman et al.)",
        ),
        NamedSet(
            "gsm8k",
            "openai/gsm8k",
            "main",
            "test",
            "question",
            "answer",
            "after_hash",
            1319,
            "GSM8K's test set: grade-school word problems, the answer after ####",
        ),
        NamedSet(
            "aime25",
            "math-ai/aime25",
            None,
            "test",
            "problem",
            "answer",
            "plain",
            30,
            "AIME 2025 I and II: 30 problems with integer answers",
        ),
        NamedSet("amc23", "math-ai/amc23", None, "test", "question", "answer", "plain", 40, "AMC 2023: 40 problems"),
        NamedSet(
            "minerva",
            "math-ai/minervamath",
            None,
            "test",
            "question",
            "answer",
            "plain",
            272,
            "Minerva Math: 272 undergraduate science and math problems",
        ),
        NamedSet(
            "olympiadbench",
            "math-ai/olympiadbench",
            None,
            "test",
            "question",
            "final_answer",
            "first",
            675,
            "OlympiadBench, English open-ended math: 675 problems, the answer first of a list",
        ),
    )  # fmt: skip
}


def not_named(names) -> str | None:
    """What of `names` is not a named set, with the choices (for the caller's error); None when all are."""
    bad = [n for n in names if n not in NAMED_SETS]
    return f"{bad} are not named sets; choose one of {sorted(NAMED_SETS)}" if bad else None
