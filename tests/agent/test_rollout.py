"""Sampling, stopping, and teacher-forced log-probs (issue: rollouts)."""

from __future__ import annotations

import pytest
import torch

from hacrl.agent.logprobs import TokenBatch, token_logprobs
from hacrl.agent.model import Agent
from hacrl.agent.rollout import generate
from hacrl.config import AgentConfig, RolloutConfig


@pytest.fixture(scope="module")
def agent(tiny_agents):
    return Agent(
        0, AgentConfig(name="llama", model=str(tiny_agents["llama"])), RolloutConfig(max_new_tokens=12, temperature=0.7)
    )


def _prompts(agent):
    return [agent.render_prompt([{"role": "user", "content": q}])[0] for q in ("1 + 2 =", "13 + 9 + 4 =", "7")]


def test_left_and_right_padding_give_identical_log_probs(agent):
    prompts = _prompts(agent)
    responses = [[5, 6, 7, agent.eos_id], [8, 9], [10, 11, 12, 13, 14]]
    right = TokenBatch.build(prompts, responses, agent.pad_id, agent.device)
    left = TokenBatch.build(prompts, responses, agent.pad_id, agent.device, left=True)
    with torch.no_grad():
        lp_right = token_logprobs(agent.model, right, 0.7)[right.response_mask]
        lp_left = token_logprobs(agent.model, left, 0.7)[left.response_mask]
    assert lp_right.shape == (11,)
    torch.testing.assert_close(lp_left, lp_right, rtol=1e-5, atol=1e-5)
    # and each row alone (no padding at all) agrees too
    for i in range(3):
        alone = TokenBatch.build([prompts[i]], [responses[i]], agent.pad_id, agent.device)
        with torch.no_grad():
            lp = token_logprobs(agent.model, alone, 0.7)[alone.response_mask]
        start = sum(len(r) for r in responses[:i])
        torch.testing.assert_close(lp, lp_right[start : start + len(responses[i])], rtol=1e-5, atol=1e-5)


def test_log_probs_are_taken_at_the_temperature(agent):
    tb = TokenBatch.build(_prompts(agent)[:1], [[5, 6]], agent.pad_id, agent.device)
    with torch.no_grad():
        logits = agent.model(input_ids=tb.input_ids).logits[0, :-1].float()
        expected = torch.log_softmax(logits / 0.5, -1).gather(-1, tb.input_ids[0, 1:, None]).squeeze(-1)
        got = token_logprobs(agent.model, tb, 0.5)[0]
    torch.testing.assert_close(got[tb.response_mask[0]], expected[tb.response_mask[0]], rtol=1e-5, atol=1e-5)


def test_generation_stops_at_eos_per_sequence_and_reports_why(agent):
    torch.manual_seed(0)
    samples = generate(agent, _prompts(agent), 8)
    assert len(samples) == 24
    for s in samples:
        assert 1 <= len(s.response_ids) <= 12
        if s.finished:
            assert s.response_ids[-1] == agent.eos_id and agent.eos_id not in s.response_ids[:-1]
            assert s.finish_reason == "eos"
        else:
            assert len(s.response_ids) == 12 and agent.eos_id not in s.response_ids
            assert s.finish_reason == "length"
        assert "<eos>" not in s.text and "<pad>" not in s.text


def test_an_untrained_model_that_always_says_eos_finishes_immediately(agent):
    with torch.no_grad():
        bias = torch.full((agent.model.config.vocab_size,), -1e4)
        bias[agent.eos_id] = 0
        head = agent.model.get_output_embeddings()
        saved = head.weight.clone()
        head.weight.mul_(0)  # logits = 0 everywhere, then only EOS is likely via a bias hook
    handle = head.register_forward_hook(lambda mod, inp, out: out + bias)
    try:
        samples = generate(agent, _prompts(agent), 2)
    finally:
        handle.remove()
        with torch.no_grad():
            head.weight.copy_(saved)
    assert all(s.response_ids == [agent.eos_id] and s.finished and s.text == "" for s in samples)


def test_sampling_ignores_the_model_directorys_generation_config(tiny_agents, tmp_path):
    """A model dir that says top_k=1 (greedy in disguise) must not change what hacrl samples."""
    import shutil

    model_dir = tmp_path / "m"
    shutil.copytree(tiny_agents["llama"], model_dir)
    (model_dir / "generation_config.json").write_text('{"top_k": 1, "do_sample": true, "repetition_penalty": 5.0}')
    agent = Agent(0, AgentConfig(name="m", model=str(model_dir)), RolloutConfig(max_new_tokens=6))
    torch.manual_seed(0)
    texts = {s.text for s in generate(agent, _prompts(agent)[:1], 16)}
    assert len(texts) > 4  # top_k=1 would give one text


def test_greedy_is_deterministic(agent):
    a = generate(agent, _prompts(agent), 1, greedy=True)
    b = generate(agent, _prompts(agent), 1, greedy=True)
    assert [s.response_ids for s in a] == [s.response_ids for s in b]
