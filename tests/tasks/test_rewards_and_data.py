"""Rewards (extraction, math-verify, reasoning-gym, user functions) and data (splits, files, resumable stream)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from hacrl.config import DataConfig
from hacrl.tasks.data import PromptStream, load_task
from hacrl.tasks.rewards import RewardError, extract_answer, import_reward_function, math_reward, score
from tests.conftest import TASK


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("first \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("work\n#### 72", "72"),
        ("Answer: 5\nmore text\nthe answer is: 6", "6"),
        ("12,13,4\n432", "432"),
        ("\\boxed{unbalanced", "\\boxed{unbalanced"),
        ("", ""),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_math_reward_checks_equivalence():
    fn = math_reward(timeout=5)
    completions = ["so \\boxed{0.5}", "#### 1/2", "answer: 3", "no idea", "\\boxed{\\frac{2}{4}}"]
    assert fn(prompts=[""] * 5, completions=completions, answer=["\\frac{1}{2}", "0.5", "4", "1", "0.5"]) == [
        1.0,
        1.0,
        0.0,
        0.0,
        1.0,
    ]


def user_reward(prompts, completions, answer, **kwargs):
    return [float(c.strip() == str(a)) for c, a in zip(completions, answer, strict=True)]


def raising_reward(prompts, completions, **kwargs):
    raise KeyError("oops")


def test_user_reward_function_by_dotted_path():
    fn = import_reward_function("tests.tasks.test_rewards_and_data:user_reward")
    assert score(fn, ["p", "q"], ["3", "x"], {"answer": [3, 4]}, r_max=1.0) == [1.0, 0.0]
    with pytest.raises(RewardError, match="cannot import module 'no_such_module'"):
        import_reward_function("no_such_module:f")
    with pytest.raises(RewardError, match="has no callable 'nope'"):
        import_reward_function("tests.tasks.test_rewards_and_data:nope")


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (raising_reward, "reward function raising_reward raised KeyError: 'oops' .*first: 'a'"),
        (lambda prompts, completions, **kw: [1.0], "must return a list of 2 floats, got 1"),
        (lambda prompts, completions, **kw: [1.0, math.nan], "returned nan \\(float\\) for sample 1 \\(completion 'b"),
        (lambda prompts, completions, **kw: [1.0, 2.0], "returned 2.0 .*sample 1 .* in \\[0, algorithm.r_max=1.0\\]"),
        (lambda prompts, completions, **kw: [1.0, "x"], "returned 'x' \\(str\\) for sample 1"),
        (lambda prompts, completions, **kw: [1.0, "1.0"], "returned '1.0' \\(str\\) for sample 1"),
    ],
)
def test_bad_reward_functions_stop_with_a_message_naming_function_and_sample(fn, message):
    with pytest.raises(RewardError, match=message):
        score(fn, ["p", "q"], ["a", "b"], {}, r_max=1.0)


def test_reasoning_gym_splits_are_disjoint_and_scored_by_the_task():
    task = load_task(DataConfig(**TASK, train_size=300, eval_size=40, heldout_size=60))
    eval_questions = {ex.prompt for ex in task.eval}
    assert len(task.eval) == 40 and 0 < len(task.train) <= 300
    assert not eval_questions & {ex.prompt for ex in task.train}
    # the training split is fixed by the held-out pool, not by how much of it is evaluated
    smaller = load_task(DataConfig(**TASK, train_size=300, eval_size=10, heldout_size=60))
    assert [e.prompt for e in smaller.train] == [e.prompt for e in task.train]
    assert [e.prompt for e in smaller.eval] == [e.prompt for e in task.eval[:10]]
    ex = task.eval[0]
    # issue 87.19: by default reasoning-gym's own system prompt, which asks for the <answer> tags its scorer reads
    from reasoning_gym.utils import SYSTEM_PROMPTS

    assert ex.messages == [{"role": "system", "content": SYSTEM_PROMPTS["default"]},
                           {"role": "user", "content": ex.prompt}]  # fmt: skip
    assert "<answer>" in SYSTEM_PROMPTS["default"]
    bare = load_task(DataConfig(**TASK, train_size=300, eval_size=40, heldout_size=60, system_prompt=None))
    assert bare.eval[0].messages == [{"role": "user", "content": ex.prompt}]
    right, wrong = f"steps...\nanswer: {ex.columns['answer']}", "answer: 99999"
    assert task.reward(
        prompts=[ex.prompt] * 2, completions=[right, wrong], **{k: [v, v] for k, v in ex.columns.items()}
    ) == [1.0, 0.0]
    again = load_task(DataConfig(**TASK, train_size=300, eval_size=40, heldout_size=60))  # seeded: the same data
    assert [e.prompt for e in again.train] == [e.prompt for e in task.train]


def test_by_default_a_numeric_reasoning_gym_task_reads_an_untagged_answers_last_number():
    """Issue 87.19: SmolLM2 alone on 1-digit additions with the defaults trained on noise (step-1 reward 0.015 where
    its greedy accuracy is ~83 %): it answers in prose, without tags even under reasoning-gym's system prompt, and the
    task's scorer compared the whole last line with the bare number. By default (`scoring.builtin: auto`) an untagged
    answer of a numeric task is its final answer's last number, scored by the task's scorer; a restated question is
    no answer (the math verifier would evaluate "5 + 3"); a task whose golds are not numbers, and `builtin:
    reasoning_gym`, keep the last line."""
    from hacrl.config import ScoringConfig
    from hacrl.tasks.rewards import last_number, numeric_golds

    options = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]}
    data = DataConfig(task="basic_arithmetic", task_options=options, train_size=50, eval_size=8, heldout_size=8)
    by_default, own = load_task(data), load_task(data, ScoringConfig(builtin="reasoning_gym"))
    ex = by_default.eval[0]
    gold = ex.columns["answer"]
    smollm2 = [  # SmolLM2-135M-Instruct's greedy answers, as it writes them (with reasoning-gym's prompt too)
        f"To calculate it, we need to add the two numbers. This is a simple addition operation, and the result is "
        f"{gold}.",
        f"2 + 1 = 3\n\nSo, the answer is {gold}.",
        f"<answer>{gold}</answer>",
        f"<answer>{int(gold) + 1}</answer>",
        f"To calculate {ex.prompt.split(':')[-1].strip(' =')}, we simply add them together.",
        f"The sum is {int(gold) + 1}.",
    ]
    columns = {k: [v] * len(smollm2) for k, v in ex.columns.items()}
    scores = by_default.reward(prompts=[ex.prompt] * len(smollm2), completions=smollm2, **columns)
    assert scores[:3] == [1.0, 1.0, 1.0] and max(scores[3:]) < 0.1, scores
    task_own = own.reward(prompts=[ex.prompt] * len(smollm2), completions=smollm2, **columns)
    assert max(task_own[:2]) < 0.1 and task_own[2] == 1.0  # prose scored on its sentence: the defect
    words = load_task(DataConfig(task="spell_backward", train_size=20, eval_size=4, heldout_size=4))
    assert numeric_golds([{"answer": "7"}, {"answer": "-3/4"}, {"answer": "0.5"}]) and not numeric_golds(
        [{"answer": "7"}, {"answer": "seven"}]
    )
    assert not words.reward.numeric and by_default.reward.numeric and not own.reward.numeric
    assert last_number("x" * 100_000 + " 12") == "12" and last_number("1,5") == "5"


def test_file_data_with_chat_messages_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"question": "2+2?", "solution": "4", "level": 1},
        {
            "question": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "3+3?"}],
            "solution": "6",
            "level": 2,
        },
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    pq.write_table(pa.Table.from_pylist([{"question": "1+1?", "solution": "2"}]), tmp_path / "eval.parquet")
    cfg = DataConfig(
        source="file",
        train_file=str(tmp_path / "train.jsonl"),
        eval_file=str(tmp_path / "eval.parquet"),
        prompt_column="question",
        answer_column="solution",
        system_prompt="think",
    )
    task = load_task(cfg)
    assert task.train[0].messages == [{"role": "system", "content": "think"}, {"role": "user", "content": "2+2?"}]
    assert task.train[1].messages[0] == {"role": "system", "content": "be brief"}
    assert task.train[1].columns["answer"] == "6" and task.train[1].columns["level"] == 2
    assert task.eval[0].columns["answer"] == "2"
    assert task.reward(prompts=["x"], completions=["\\boxed{4}"], answer=["4"]) == [1.0]  # math verifier by default


def test_bad_data_files(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "answer": "1"}\n{not json}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2 is not valid JSON"):
        load_task(DataConfig(source="file", train_file=str(tmp_path / "bad.jsonl")))
    (tmp_path / "cols.jsonl").write_text('{"q": "a", "answer": "1"}\n')
    with pytest.raises(ValueError, match="cols.jsonl:1 \\(line 1\\) has no column 'prompt' \\(columns: \\['answer'"):
        load_task(DataConfig(source="file", train_file=str(tmp_path / "cols.jsonl")))
    with pytest.raises(ValueError, match="reasoning-gym says"):
        load_task(DataConfig(task="chain_sum", task_options={"no_such_option": 1}))


def test_prompt_stream_is_seeded_covers_each_epoch_and_resumes():
    items = list(range(10))
    stream = PromptStream(items, seed=3)
    first_epoch = stream.next_batch(10)
    assert sorted(first_epoch) == items and first_epoch != items
    stream.next_batch(4)
    state = stream.state_dict()
    expected = stream.next_batch(12)
    resumed = PromptStream(items, seed=3)
    resumed.load_state_dict(state)
    assert resumed.next_batch(12) == expected
    with pytest.raises(ValueError, match="saved for other training data"):
        PromptStream(items[:5], seed=3).load_state_dict(state)


def test_a_hostile_output_cannot_hang_the_math_verifier():
    """A power tower sympy would try to evaluate for ever: the per-call time limit scores it 0 and moves on."""
    import time

    fn = math_reward(timeout=1)
    start = time.perf_counter()
    assert fn(prompts=[""], completions=["\\boxed{9^{9^{9^{9^{9^{9}}}}}}"], answer=["3"]) == [0.0]
    assert time.perf_counter() - start < 30  # without the limit this does not return


# -- a real instruct model's prose (issue 69): right answers score 1, wrong ones 0 -----------------------------------

REAL_PROSE = [  # (gold, SmolLM2-135M-Instruct's kind of answer, reward)
    ("5", "To calculate 4 + 1, we simply add them together. 4 + 1 equals 5.", 1.0),
    ("71", "To add 23 and 48, we line up the digits: 3 + 8 = 11, carry 1; 2 + 4 + 1 = 7. So 23 + 48 = 71.", 1.0),
    ("71", "The sum of 23 and 48 is 71.", 1.0),
    ("12", "7 + 5 = 12\n\nSo the answer is 12.", 1.0),
    ("71", "So the final answer is \\boxed{71}.", 1.0),
    (
        "148",
        "To add 50 and 98, we need to find a common multiple of 50 and 98, which is 181. 181 is indeed 50 + 98 = 181.",
        0.0,
    ),
    ("100", "To add 34 and 66, we need to perform the arithmetic operation of 34 + 66 = 140.", 0.0),
    ("60", "Adding 54 and 6 gives us 11, which is the result of the operation.", 0.0),
    ("71", "23 + 48 = 71? No wait, it is 61.", 0.0),
    ("12", "7 + 5 = 13", 0.0),
]


RESTATED = [  # (gold, SmolLM2-135M-Instruct's greedy answer on configs/real.yaml's prompts): wrong, and restating
    (
        "123",
        "To calculate 81 + 42, we need to add 81 and 42, which is 222. This is the result of the operation of 81 + 42.",
    ),
    ("38", "To calculate 5 + 33, we need to add 5 and 33, which is 16.\n\nIn this case, 5 + 33 = "),
    ("38", "So the final answer is \\boxed{5 + 33}."),
]


def test_the_real_beds_scorer_reads_prose_right_and_wrong_and_a_restated_question_as_wrong():
    """The real bed's scoring (`configs/real.yaml`, `scoring.builtin: auto`: the task's scorer on the final answer's
    last number): SmolLM2's prose with the right sum scores 1, with a wrong one 0. The math verifier agrees on that
    prose but evaluates what it reads: a wrong answer whose last line restates the question scored 1 (5 of SmolLM2's
    64 greedy answers on the bed, a third of those it scored right), which the bed's scorer reads as wrong, and
    `builtin: math` on such a task is warned about."""
    from hacrl.config import ScoringConfig, load_config
    from hacrl.errors import HacrlWarning

    real = load_config(Path(__file__).resolve().parents[2] / "configs" / "real.yaml")
    data = replace(real.data, train_size=40, eval_size=4, heldout_size=4)
    task = load_task(data, real.scoring)
    entry = task.train[0].columns["entry"]
    golds, texts, expected = zip(*REAL_PROSE, *[(g, t, 0.0) for g, t in RESTATED], strict=True)
    entries = [{**entry, "answer": g} for g in golds]
    assert task.reward([""] * len(texts), list(texts), entry=entries) == list(expected)
    by_math = math_reward()([""] * len(texts), list(texts), answer=list(golds))
    assert by_math == [*expected[: len(REAL_PROSE)], 1.0, 1.0, 1.0]  # the restated questions: scored right
    with pytest.warns(HacrlWarning, match="restates the question"):
        load_task(data, ScoringConfig(builtin="math"))


def test_reasoning_gym_tasks_read_answer_tags_and_score_prose_only_through_them():
    """reasoning-gym's own scorer compares the last line with the bare answer: prose scored noise (0.06 for a right
    sum). Its recipe's `<answer>` tags are read first: a right answer in them scores 1 whatever prose surrounds it,
    a wrong one 0 (0.01 for gsm_symbolic's format credit); untagged prose stays what the task's scorer makes of it
    (why a numeric task's untagged answer is read as its last number)."""
    from hacrl.tasks.data import import_reasoning_gym
    from hacrl.tasks.rewards import ReasoningGymReward

    rg = import_reasoning_gym()
    options = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ("+",)}
    for task in ("basic_arithmetic", "chain_sum", "gsm_symbolic"):
        dataset = rg.create_dataset(task, seed=3, size=4, **(options if task == "basic_arithmetic" else {}))
        entry = dataset[0]
        gold, wrong = entry["answer"], str(int(entry["answer"]) + 1)
        texts = [
            f"Let me think. First I add the numbers step by step.\n<answer>{gold}</answer>",
            f"I computed it: <answer>{wrong}</answer> is my answer.",
            f"The answer is {gold}.",
        ]
        scores = ReasoningGymReward(dataset)([""] * 3, texts, entry=[entry] * 3)
        assert scores[0] == 1.0 and scores[1] <= 0.01, (task, scores)  # gsm_symbolic gives a wrong number 0.01
        assert scores[2] <= 1.0  # the task's own reading of prose (gsm_symbolic finds the number: 1.0)
