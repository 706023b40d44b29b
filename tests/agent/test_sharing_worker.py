"""Sharing policies inside a learner's update: a row the policy leaves out changes nothing, the metrics count what
was offered and kept, and `top_k`'s relevance is the row's weight in HACPO's gradient."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.conftest import write_config

PROMPTS = [[{"role": "user", "content": f"{a} + {b} ="}] for a, b in ((1, 2), (3, 4), (5, 1))]
OWN = [1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0]  # qwen's own means per prompt: 0.5, 0, 0.75
FOREIGN = [1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0]  # llama's: 0.25, 0.5, 0.5
DROPPED = 1  # llama's row 1 (prompt 0, reward 0): left out by correct, learner_fails (0.5) and adaptive


def _pair(tiny_agents, tmp_path, sharing=None, algorithm=None):
    from hacrl.agent.worker import AgentWorker
    from hacrl.config import load_config
    from hacrl.messages import SampleCall, WorkerSpec

    cfg = load_config(
        write_config(
            tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run",
            trainer={"prompts_per_step": 3, "mini_batch_size": 6, "micro_batch_size": 3},
            sharing=sharing or {}, algorithm={"name": "hacpo", **(algorithm or {})},
        )
    )  # fmt: skip
    specs = [
        WorkerSpec(i, a, cfg.rollout, cfg.trainer, cfg.algorithm, torch_threads=1, num_agents=2,
                   sharing=cfg.sharing, agent_names=("llama", "qwen"))
        for i, a in enumerate(cfg.agents)
    ]  # fmt: skip
    llama, qwen = AgentWorker(specs[0]), AgentWorker(specs[1])
    call = SampleCall(1, PROMPTS, 4)
    foreign = [replace(t, reward=float(r)) for t, r in zip(llama.sample(call).trajectories, FOREIGN, strict=True)]
    qwen.sample(call)
    return specs[1], qwen, foreign


def _learn(spec, rollout, foreign):
    from hacrl.agent.worker import AgentWorker
    from hacrl.messages import LearnCall

    worker = AgentWorker(spec)
    worker._rollout = rollout
    learned = worker.learn(LearnCall(1, [float(r) for r in OWN], foreign, [0.4, 0.6]))
    return {n: p.detach().clone() for n, p in worker.agent.model.named_parameters()}, learned.metrics


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["all", "correct", "learner_fails", "adaptive"])
def test_a_row_the_policy_leaves_out_changes_nothing(policy, tiny_agents, tmp_path):
    """The same update with one foreign row's text replaced: bit-identical weights when the policy leaves that row
    out (it only counted in the advantages, through its reward, which is unchanged), different under `all`. The
    foreign clip is off: these random models' foreign ratios fall outside [lo_m, 1], where a row has no gradient."""
    spec, qwen, foreign = _pair(tiny_agents, tmp_path, sharing={"policy": policy}, algorithm={"foreign_clip": False})
    rollout = qwen._rollout
    before, metrics = _learn(spec, rollout, foreign)
    changed = list(foreign)
    changed[DROPPED] = replace(foreign[DROPPED], text="4 + 4 = 8, so 8", num_bytes=len("4 + 4 = 8, so 8"))
    after, _ = _learn(spec, rollout, changed)
    same = all(torch.equal(before[n], after[n]) for n in before)
    assert same == (policy != "all")
    if policy != "all":
        assert metrics["shared/llama/kept"] < metrics["shared/llama/offered"] == 12


@pytest.mark.slow
def test_the_update_reports_what_was_offered_kept_and_saved(tiny_agents, tmp_path):
    from hacrl.agent.exchange import learner_rows

    spec, qwen, foreign = _pair(tiny_agents, tmp_path, sharing={"policy": "correct"})
    rollout = qwen._rollout
    own = [replace(t, reward=float(r)) for t, r in zip(rollout.trajectories, OWN, strict=True)]
    rows = learner_rows(qwen.agent, own, foreign, rollout.prompt_ids, [s.response_ids for s in rollout.samples],
                        rollout.behaviour_logp)  # fmt: skip
    _, metrics = _learn(spec, rollout, foreign)
    assert metrics["shared/llama/offered"] == metrics["shared_offered"] == 12
    assert metrics["shared/llama/kept"] == metrics["shared_kept"] == sum(FOREIGN) == 5
    assert metrics["shared/llama/kept_reward_mean"] == 1.0
    # dropped rows are never re-tokenized: the prompt in qwen's tokens + the response in llama's (its source's)
    saved = sum(len(rollout.prompt_ids[t.group]) + t.source_num_tokens for t in foreign if t.reward < 1)
    assert metrics["shared/llama/tokens_saved"] == metrics["shared_tokens_saved"] == saved > 0
    kept = [r for r in rows if (r.source == 1 or r.reward >= 1) and r.response_ids]
    assert metrics["trained_sequences"] == len(kept)
    assert metrics["trained_tokens"] == sum(len(r.prompt_ids) + len(r.response_ids) for r in kept)
    assert metrics["time/update_saved_est"] > 0


@pytest.mark.slow
def test_top_k_relevance_is_each_foreign_rows_weight_in_hacpos_gradient(tiny_agents, tmp_path):
    """relevance = rho * |A| * s**(1 + alpha) inside [lo_m, 1], 0 outside (spec 3.5), with m the row's mini-batch
    under `all`: computed here by hand from the learner's own log-probs of each row."""
    from hacrl.agent.exchange import learner_rows
    from hacrl.agent.logprobs import TokenBatch, token_logprobs
    from hacrl.core import foreign_lower_bound, loss_coefficients

    spec, qwen, foreign = _pair(tiny_agents, tmp_path, sharing={"policy": "top_k", "k": 2},
                                algorithm={"delta": 0.4, "alpha": 0.5})  # fmt: skip
    rollout = qwen._rollout
    own = [replace(t, reward=float(r)) for t, r in zip(rollout.trajectories, OWN, strict=True)]
    rows = learner_rows(qwen.agent, own, foreign, rollout.prompt_ids, [s.response_ids for s in rollout.samples],
                        rollout.behaviour_logp)  # fmt: skip
    caps = torch.tensor([0.4, 0.6], dtype=torch.float64)
    adv = qwen.learning.algorithm.advantages(
        torch.tensor([r.reward for r in rows], dtype=torch.float64), torch.tensor([r.group for r in rows]),
        torch.tensor([r.source for r in rows]), learner=1, capabilities=caps, params=qwen.learning.params,
    ).tolist()  # fmt: skip
    relevance = qwen.learning._relevance(rows, adv, caps)

    rho = float(loss_coefficients(caps, 1)[0])
    expected, inside = [], 0
    for i, r in enumerate(rows):
        if r.source == 1:
            expected.append(0.0)
            continue
        tb = TokenBatch.build([r.prompt_ids], [r.response_ids], qwen.agent.pad_id, qwen.agent.device)
        with torch.no_grad():
            logp = token_logprobs(qwen.agent.model, tb, 1.0)[0][tb.response_mask[0]].double()
        s = float(torch.exp(logp.mean() - r.source_logp_sum / r.source_num_tokens))  # source_mean, the default
        lower = foreign_lower_bound(i // 6, delta=0.4, delta_step=0.025)
        weight = rho * abs(adv[i]) * s**1.5 if lower <= s <= 1 else 0.0
        inside += weight > 0
        expected.append(weight)
    assert inside >= 2 and any(e == 0 for e in expected[12:])  # both cases occur in this pool
    torch.testing.assert_close(relevance, torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-9)
