"""Model outputs are untrusted input: a catalog of hostile texts, each scored in bounded time with the expected
reward, and properties over any text up to 200k characters (issue: bounded verification for any text)."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hacrl.config import ScoringConfig
from hacrl.driver.scoring import Scorer
from hacrl.tasks.rewards import MathReward, ReasoningGymReward, extract_answer

TIMEOUT = 2.0

# (name, completion, gold answer, expected reward): gold "3" unless stated
CATALOG = [
    ("quadratic regex: 'answer' + 100k spaces", "answer" + " " * 100_000, "3", 0.0),
    ("quadratic regex, then the answer", "answer:" + " " * 100_000 + "3", "3", 1.0),
    ("'answer is ' x 20k, then the answer", "answer is " * 20_000 + "answer: 3", "3", 1.0),
    ("0.9 MB of answer lines", "answer: 1\n" * 90_000 + "answer: 3", "3", 1.0),
    ("'####' + 200k newlines", "####" + "\n" * 200_000, "3", 0.0),
    ("1e6 characters of digits", "9" * 1_000_000, "3", 0.0),
    ("1e6 characters of letters", "a" * 1_000_000, "3", 0.0),
    ("deeply nested LaTeX", "\\boxed{" + "\\frac{1}{" * 5_000 + "2" + "}" * 5_000 + "}", "3", 0.0),
    ("nested LaTeX under the answer cap", "\\boxed{" + "{(" * 1_000 + "3" + ")}" * 1_000 + "}", "3", 0.0),
    ("100k unclosed \\boxed{", "\\boxed{" * 100_000, "3", 0.0),
    ("unclosed \\boxed{ then text", "\\boxed{3" + "x" * 10_000, "3", 0.0),
    ("power tower", "\\boxed{9^{9^{9^{9^{9^{9}}}}}}", "3", 0.0),
    ("huge power", "\\boxed{10^{10^{10^{10}}}}", "3", 0.0),
    ("5000-digit number", "\\boxed{" + "7" * 5_000 + "}", "3", 0.0),
    ("NUL bytes before the answer", "\x00" * 100_000 + "\nanswer: 3", "3", 1.0),
    ("only NUL bytes", "\x00" * 100_000, "3", 0.0),
    ("invalid surrogates before the answer", "\ud800\udfff" * 1_000 + "\nanswer: 3", "3", 1.0),
    ("invalid surrogates in the answer", "answer: \udc80\ud800", "3", 0.0),
    ("special-token-looking text", "<|im_end|>\n<|eot_id|><|endoftext|>\nanswer: 3", "3", 1.0),
    ("special tokens as the answer", "\\boxed{<|im_end|>}", "3", 0.0),
    ("right answer, plain", "12,13,4\n3", "3", 1.0),
    ("wrong answer, plain", "12,13,4\n4", "3", 0.0),
]


@pytest.fixture(scope="module")
def math_scorer():
    scorer = Scorer(MathReward(TIMEOUT), ScoringConfig(timeout=TIMEOUT, workers=2), builtin=True).start()
    yield scorer
    scorer.close()


@pytest.mark.slow
def test_every_hostile_output_is_scored_by_math_verify_in_bounded_time(math_scorer):
    texts = [text for _, text, _, _ in CATALOG]
    start = time.perf_counter()
    result = math_scorer.score([""] * len(texts), texts, {"answer": [gold for _, _, gold, _ in CATALOG]})
    seconds = time.perf_counter() - start
    got = {name: reward for (name, *_), reward in zip(CATALOG, result.rewards, strict=True)}
    assert got == {name: expected for name, _, _, expected in CATALOG}
    # each completion is bounded by TIMEOUT (+ a restart when it runs past it): the whole catalog by their sum
    assert seconds < len(texts) * (TIMEOUT + 5)


@pytest.mark.slow
def test_every_hostile_output_is_scored_by_a_reasoning_gym_task_in_bounded_time():
    """reasoning-gym's scorer gives partial credit (len(oracle) / len(answer) when the oracle is inside the
    answer), so the expected values are its own, on the extracted answer; the anchors are the right answers."""
    import reasoning_gym

    from hacrl.tasks.rewards import MAX_ANSWER_CHARS

    dataset = reasoning_gym.create_dataset(
        "basic_arithmetic", seed=0, size=50, min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=["+"]
    )
    entry = next(dataset[i] for i in range(50) if dataset[i]["answer"] == "3")
    texts = [text for _, text, _, _ in CATALOG]
    expected = []
    for text in texts:
        answer = extract_answer(text)
        expected.append(0.0 if len(answer) > MAX_ANSWER_CHARS else dataset.score_answer(answer, entry))
    scorer = Scorer(ReasoningGymReward(dataset), ScoringConfig(timeout=TIMEOUT), builtin=True)
    try:
        start = time.perf_counter()
        result = scorer.score([""] * len(texts), texts, {"entry": [entry] * len(texts)})
        assert time.perf_counter() - start < len(texts) * (TIMEOUT + 5)
    finally:
        scorer.close()
    assert result.rewards == expected and not result.errors and not result.timeouts
    got = {name: reward for (name, *_), reward in zip(CATALOG, result.rewards, strict=True)}
    assert got["quadratic regex, then the answer"] == got["0.9 MB of answer lines"] == 1.0
    assert got["right answer, plain"] == got["NUL bytes before the answer"] == 1.0
    assert got["1e6 characters of digits"] == got["power tower"] == 0.0


# -- properties ------------------------------------------------------------------------------------------------------

_OLD_HASHES = re.compile(r"####\s*(.+)")
_OLD_ANSWER = re.compile(r"answer\s*(?:is)?\s*[:=]\s*(.+)", re.IGNORECASE)
_PIECES = ["answer", "ANSWER", "Answer", "is", "İs", "ſ", ":", "=", " ", "\t", "\n", "\r\n", "\x1c", "\u2028"]
_PIECES += ["\x85", "####", "#", "\\boxed{", "\\fbox {", "{", "}", "3", "x", "\x00", "\ud800"]


def _old_extract(text: str) -> str:
    """The extraction of commit 88a5284 (quadratic regexes): the reference the linear one must equal (its boxes are
    read by today's rule, which joins a run of boxes)."""
    from hacrl.tasks.answers import boxed_answer

    boxed = boxed_answer(text)
    if boxed is not None:
        return boxed
    for pattern in (_OLD_HASHES, _OLD_ANSWER):
        matches = pattern.findall(text)
        if matches:
            return matches[-1].strip()
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.mark.slow
@settings(max_examples=3000, derandomize=True, database=None, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=16).map("".join))
def test_linear_extraction_equals_the_old_regexes_on_short_texts(text):
    assert extract_answer(text) == _old_extract(text)


_big_text = st.lists(
    st.tuples(st.one_of(st.sampled_from(_PIECES), st.text(max_size=8)), st.integers(1, 40_000)),
    min_size=1,
    max_size=6,
).map(lambda parts: "".join(piece * count for piece, count in parts)[:200_000])


@settings(max_examples=40, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(_big_text)
def test_any_text_up_to_200k_characters_is_scored_within_the_limit(math_scorer, text):
    start = time.perf_counter()
    assert len(text) <= 200_000
    found = extract_answer(text)
    assert time.perf_counter() - start < 1.0  # linear: a few ms for 200k characters; quadratic took minutes
    assert all(piece in text for piece in found.split(", "))  # a run of boxes is joined by ", "
    result = math_scorer.score([""], [text], {"answer": ["3"]})
    assert result.rewards[0] in (0.0, 1.0)
    assert time.perf_counter() - start < TIMEOUT + 5  # one completion: its limit, plus a restart if it hit it
