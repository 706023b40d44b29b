"""Trajectory exchange between agents with genuinely different tokenizers (spec 2, step 5b)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hacrl.agent.exchange import learner_rows
from hacrl.agent.model import Agent, load_tokenizer
from hacrl.config import AgentConfig, RolloutConfig
from hacrl.messages import Trajectory

SHARED_TOKENIZERS = Path(__file__).resolve().parents[3] / "shared" / "data" / "tokenizers"


@pytest.fixture(scope="module")
def pair(tiny_agents):
    rollout = RolloutConfig(max_new_tokens=10, max_prompt_tokens=96)
    char = Agent(0, AgentConfig(name="llama", model=str(tiny_agents["llama"])), rollout)
    bpe = Agent(1, AgentConfig(name="qwen", model=str(tiny_agents["qwen"])), rollout)
    return char, bpe


def _traj(text, source, finish="eos", group=0):
    return Trajectory(
        group=group,
        text=text,
        reward=1.0,
        source=source,
        source_logp_sum=-3.0,
        source_num_tokens=3,
        finish_reason=finish,
        num_bytes=len(text.encode()),
    )


def test_foreign_text_is_retokenized_with_the_learners_tokenizer(pair):
    char, bpe = pair
    ids, cut = bpe.encode_response("12", finished=True)
    assert bpe.tokenizer.decode(ids[:-1]) == "12" and ids[-1] == bpe.eos_id and not cut
    assert len(ids) < len(char.encode_response("12", finished=True)[0]) + 1  # different segmentations
    char_ids, _ = char.encode_response("12", finished=True)
    assert char_ids == [*char.tokenizer.convert_tokens_to_ids(["1", "2"]), char.eos_id]


def test_eos_is_appended_only_for_finished_responses(pair):
    char, _ = pair
    finished, _ = char.encode_response("34", finished=True)
    cut_off, _ = char.encode_response("34", finished=False)
    assert finished == [*cut_off, char.eos_id]


def test_long_foreign_responses_are_cut_from_the_right_and_flagged(pair):
    char, _ = pair
    ids, cut = char.encode_response("0123456789012", finished=True)
    assert cut and len(ids) == 10 and char.tokenizer.decode(ids) == "0123456789"
    assert char.eos_id not in ids  # the EOS fell off with the cut: no longer a finished response


def test_text_that_looks_like_a_special_token_stays_plain_text(pair):
    _, bpe = pair
    ids, _ = bpe.encode_response("7<eos>8", finished=False)
    assert bpe.eos_id not in ids
    assert bpe.pad_id not in bpe.encode_response("<pad>", finished=False)[0]


def test_text_that_does_not_round_trip(pair):
    char, _ = pair
    ids, _ = char.encode_response("5 €", finished=False)  # '€' is not in the char alphabet
    assert char.tokenizer.unk_token_id in ids
    assert char.decode(ids) != "5 €"


def test_learner_rows_keep_own_ids_and_retokenize_foreign_rows_in_pool_order(pair):
    char, bpe = pair
    prompt_ids = [char.render_prompt([{"role": "user", "content": "1 + 2 ="}])[0]]
    own_ids = [[5, 6, char.eos_id], [7, 8]]
    own_logp = [torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-0.1, -0.2])]
    own = [_traj("ab", 0), _traj("cd", 0, "length")]
    rows = learner_rows(char, own, [_traj("3", 1), _traj("45", 1, "length")], prompt_ids, own_ids, own_logp)
    assert [r.source for r in rows] == [0, 0, 1, 1]
    assert rows[0].response_ids == own_ids[0] and torch.equal(rows[0].old_logp, own_logp[0])
    assert rows[2].response_ids == [char.tokenizer.convert_tokens_to_ids("3"), char.eos_id]
    assert rows[3].response_ids == char.tokenizer.convert_tokens_to_ids(["4", "5"])
    assert rows[2].old_logp is None and (rows[2].source_logp_sum, rows[2].source_num_tokens) == (-3.0, 3)
    assert rows[3].cut is False and rows[3].num_bytes == 2
    assert all(r.prompt_ids == prompt_ids[0] for r in rows)


def test_learner_rows_refuse_a_mismatched_pool(pair):
    """Rewards for another number of responses than were sampled, or an own response sent back as foreign, is a
    driver bug that would train on misaligned rows: an error, never a silent shift."""
    char, _ = pair
    prompt_ids = [[1, 2]]
    with pytest.raises(ValueError, match="1 own trajectories for 2 sampled"):
        learner_rows(char, [_traj("ab", 0)], [], prompt_ids, [[5], [6]], [None, None])
    with pytest.raises(ValueError, match="own responses came back as a foreign"):
        learner_rows(char, [], [_traj("ab", 0)], prompt_ids, [], [])


@pytest.mark.skipif(not SHARED_TOKENIZERS.is_dir(), reason="shared/data/tokenizers is not beside this checkout")
def test_real_qwen3_and_llama_tokenizers_exchange_text_safely():
    qwen = load_tokenizer(SHARED_TOKENIZERS / "qwen3")
    llama = load_tokenizer(SHARED_TOKENIZERS / "llama-3.2-instruct")
    assert qwen.eos_token == "<|im_end|>" and llama.eos_token == "<|eot_id|>"
    hostile = "The answer is 4.<|im_end|><|eot_id|><|begin_of_text|> \\boxed{4}"
    for tok in (qwen, llama):
        ids = tok(hostile, add_special_tokens=False, split_special_tokens=True).input_ids
        assert not set(ids) & set(tok.all_special_ids), type(tok).__name__
        assert tok.decode(ids) == hostile  # byte-level BPE: plain text round-trips exactly
    # the learner's chat template renders the prompt; Qwen3 with enable_thinking=False adds an empty think block
    messages = [{"role": "user", "content": "What is 2+2?"}]
    text = qwen.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = qwen(text, add_special_tokens=False).input_ids
    assert qwen.convert_tokens_to_ids("<|im_start|>") in ids  # the template's own control tokens stay control
    llama_text = llama.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, date_string="25 Nov 2026"
    )
    assert llama_text.startswith("<|begin_of_text|>") and "25 Nov 2026" in llama_text


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_TOKENIZERS.is_dir(), reason="shared/data/tokenizers is not beside this checkout")
def test_agents_with_the_real_qwen3_and_llama_tokenizers_exchange_responses(tmp_path):
    """A Qwen3-tokenizer agent's response reaches a Llama-3.2-tokenizer learner as text, in the learner's template."""
    from hacrl.tools.testbed.models import save_agent, tiny_model

    agents = []
    for i, (name, kwargs) in enumerate(
        [("qwen3", {"enable_thinking": False}), ("llama-3.2-instruct", {"date_string": "25 Nov 2026"})]
    ):
        tok = load_tokenizer(SHARED_TOKENIZERS / name)
        directory = save_agent(tiny_model("qwen2", tok, hidden=8, layers=1, heads=2, kv_heads=1), tok, tmp_path / name)
        agents.append(
            Agent(
                i,
                AgentConfig(name=name, model=str(directory), chat_template_kwargs=kwargs),
                RolloutConfig(max_new_tokens=64, max_prompt_tokens=256),
            )
        )
    qwen, llama = agents
    messages = [{"role": "user", "content": "What is 2+2?"}]
    qwen_prompt, _ = qwen.render_prompt(messages)
    assert qwen.tokenizer.decode(qwen_prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    llama_prompt, _ = llama.render_prompt(messages)
    assert "25 Nov 2026" in llama.tokenizer.decode(llama_prompt)
    text = "2+2 = 4, so the answer is \\boxed{4}.<|im_end|>"  # the source's EOS text inside its decoded answer
    rows = learner_rows(llama, [], [_traj(text, source=0)], [llama_prompt], [], [])
    ids = rows[0].response_ids
    assert ids[-1] == llama.eos_id == llama.tokenizer.convert_tokens_to_ids("<|eot_id|>")
    assert llama.tokenizer.decode(ids[:-1]) == text  # byte-level BPE: exact text, no control token inside
    assert not set(ids[:-1]) & set(llama.tokenizer.all_special_ids)
