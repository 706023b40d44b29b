"""No redundant work in a step: the old-log-prob pass runs only over rows that need it (issue: throughput).

Rows trained in a learner's first optimizer step of the update are trained before any update, so their old
log-probs are the training forward's own (their ratio is exactly 1); only later mini-batches need the pre-update
pass, unless another learner reads this agent's log-prob sums (sharing), which must come from the pre-update
policy: then every row gets it, exactly as before."""

from __future__ import annotations

import json

import pytest
import torch

from hacrl.agent.logprobs import TokenBatch, token_logprobs
from hacrl.tools.cli import main
from tests.conftest import records, write_config


def _count_pass_rows(monkeypatch) -> list[int]:
    from hacrl.agent.sampling import SamplingRole

    counted: list[int] = []
    real = SamplingRole.old_logprobs

    def counting(self, samples):
        counted.append(len(samples))
        return real(self, samples)

    monkeypatch.setattr(SamplingRole, "old_logprobs", counting)
    return counted


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "mini_batch", "rows_per_agent"),
    [("gspo", 8, 0), ("gspo", 4, 4), ("grpo", 8, 0), ("hacpo", 4, 8), ("naive", 8, 8)],
)
def test_the_old_logprob_pass_covers_only_the_rows_that_need_it(
    algorithm, mini_batch, rows_per_agent, tiny_agents, tmp_path, monkeypatch
):
    counted = _count_pass_rows(monkeypatch)
    run = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, algorithm={"name": algorithm},
        trainer={"steps": 1, "mini_batch_size": mini_batch, "micro_batch_size": mini_batch // 2},
        scoring={"function": "tests.reward_fixtures:digits"}, checkpoint={"every": 0},
    )  # fmt: skip
    assert main(["train", str(cfg)]) == 0
    assert counted == [rows_per_agent, rows_per_agent]  # 2 prompts x G = 4: 8 rows per agent
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    if rows_per_agent == 0:  # one optimizer step on the sampling policy: every own ratio is exactly 1
        for name in ("llama", "qwen"):
            assert record[f"{name}/own_ratio_mean"] == 1.0 and record[f"{name}/own_clip_frac"] == 0.0


@pytest.mark.slow
def test_shared_log_prob_sums_come_from_the_pre_update_policy(tiny_agents, tmp_path, monkeypatch):
    """What other learners read (a response's log-prob sum) is the sampling policy's, though the source trains in
    the same step: the sums qwen's learner received equal a recomputation with llama's weights from before the step,
    not with its weights after it."""
    import hacrl.agent.worker
    from hacrl.config import load_config
    from hacrl.core.sharing import foreign_of
    from hacrl.driver.trainer import Trainer

    cfg = write_config(
        tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run", trainer={"steps": 1},
        scoring={"function": "tests.reward_fixtures:digits"},
    )  # fmt: skip
    received, sampled = {}, {}
    real_learn, real_sample = hacrl.agent.worker.AgentWorker.learn, hacrl.agent.worker.AgentWorker.sample

    def recording_learn(self, call, pool=None):
        received[self.index] = call.foreign if pool is None else foreign_of(pool, self.index)
        return real_learn(self, call, pool)

    def recording_sample(self, *args):
        out = real_sample(self, *args)
        sampled[self.index] = self._rollout.samples
        return out

    monkeypatch.setattr(hacrl.agent.worker.AgentWorker, "learn", recording_learn)
    monkeypatch.setattr(hacrl.agent.worker.AgentWorker, "sample", recording_sample)
    trainer = Trainer(load_config(cfg))
    try:
        llama = trainer.schedule.transport.learners[0]
        before = {k: v.clone() for k, v in llama.agent.model.state_dict().items()}
        trainer.train_step()
        samples = sampled[0]
        shared = [t.source_logp_sum for t in received[1] if t.source == 0]

        def sums():
            batch = TokenBatch.build(
                [s.prompt_ids for s in samples], [s.response_ids for s in samples], llama.agent.pad_id, "cpu"
            )
            with torch.no_grad():
                logp = token_logprobs(llama.agent.model, batch, llama.agent.settings.temperature)
            return [float(logp[i][batch.response_mask[i]].sum()) for i in range(len(samples))]

        after = sums()
        llama.agent.model.load_state_dict(before)
        assert shared == pytest.approx(sums(), abs=1e-5)
        assert shared != pytest.approx(after, abs=1e-5)  # llama did train in the step
    finally:
        trainer.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", "static"])
def test_sampler_logprobs_replace_the_pass_within_float_rounding(backend, tiny_agents, tmp_path, monkeypatch):
    """`trainer.old_logprobs: sampler`: no pre-update pass at all, not even for the sums other learners read or the
    rows after the first optimizer step; the same responses are drawn (recording log-probs changes no score and
    no random draw), so rewards are identical, and every loss-side metric equals the recomputing run's up to float
    rounding."""
    counted = _count_pass_rows(monkeypatch)
    runs = {}
    for mode in ("recompute", "sampler"):
        runs[mode] = tmp_path / mode
        cfg = write_config(
            tmp_path / f"{mode}.yaml", tiny_agents, ["llama", "qwen"], runs[mode], algorithm={"name": "hacpo"},
            rollout={"backend": backend},
            trainer={"steps": 1, "mini_batch_size": 4, "micro_batch_size": 2, "old_logprobs": mode},
            scoring={"function": "tests.reward_fixtures:digits"}, checkpoint={"every": 0},
        )  # fmt: skip
        assert main(["train", str(cfg)]) == 0
    assert counted == [8, 8]  # the recomputing run's two agents; the sampler run adds none
    exact, close = records(runs["recompute"])[-1], records(runs["sampler"])[-1]
    compared = 0
    for key, value in exact.items():
        if any(w in key for w in ("time", "second", "rss", "memory")) or not isinstance(value, float):
            continue
        if "reward" in key or "capabilit" in key:
            assert close[key] == value, key
        else:
            assert close[key] == pytest.approx(value, rel=1e-3, abs=1e-4), key
        compared += 1
    assert compared > 20


def test_sampler_logprobs_refuse_top_p(tiny_agents, tmp_path):
    """The sampler draws from the top-p-truncated distribution while the loss uses the full one: refused, with
    the fix named."""
    from hacrl.config import load_config
    from hacrl.errors import ConfigError

    cfg = write_config(
        tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run", rollout={"top_p": 0.9},
        trainer={"old_logprobs": "sampler"}, scoring={"function": "tests.reward_fixtures:digits"},
    )  # fmt: skip
    with pytest.raises(ConfigError, match="old_logprobs=recompute"):
        load_config(cfg)


@pytest.mark.slow
@pytest.mark.parametrize(("shift", "weight", "capped"), [(0.0, 1.0, 0.0), (-0.1, 1.1051709, 0.0), (-1.0, 2.0, 1.0)])
def test_corrected_weights_each_own_row_by_the_samplers_gap_to_the_learner(
    shift, weight, capped, tiny_agents, tmp_path, monkeypatch
):
    """`trainer.old_logprobs: corrected`: the sampler's log-probs are the behaviour policy's and the learner's pass
    the proximal ones. A sampler that reports every token `shift` too high or low (as a vLLM engine in bfloat16
    does, by less) gives every own row w = min(exp(l_prox - l_behav), cap 2) = min(exp(-shift), 2): logged as
    behaviour_weight_mean and behaviour_capped_frac, with the gap `sampler_logp_gap` = |shift|; the pass covers only
    the rows after the first mini-batch (the sums other learners read are the sampler's), and the foreign rows'
    denominators are the sampler's sums."""
    import hacrl.agent.sampling as sampling

    real = sampling.generate

    def shifted(agent, prompt_ids, group_size, *, logprobs=False):
        samples = real(agent, prompt_ids, group_size, logprobs=logprobs)
        assert logprobs  # corrected asks the sampler for its log-probs
        for s in samples:
            s.logprobs = [x + shift for x in s.logprobs]
        return samples

    monkeypatch.setattr(sampling, "generate", shifted)
    counted = _count_pass_rows(monkeypatch)
    pools = []
    from hacrl.agent.learning import LearningRole

    learn = LearningRole.learn

    def keep(self, call, rollout, proximal_pass):
        pools.append((self.index, call.foreign, rollout))
        return learn(self, call, rollout, proximal_pass)

    monkeypatch.setattr(LearningRole, "learn", keep)
    run = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, algorithm={"name": "hacpo"},
        trainer={"steps": 1, "mini_batch_size": 4, "micro_batch_size": 2, "old_logprobs": "corrected"},
        scoring={"function": "tests.reward_fixtures:digits"}, checkpoint={"every": 0},
    )  # fmt: skip
    assert main(["train", str(cfg)]) == 0
    assert counted == [4, 4]  # 8 rows each, the first mini-batch of 4 takes the training forward's
    record = records(run)[-1]
    for name in ("llama", "qwen"):
        assert record[f"{name}/behaviour_weight_mean"] == pytest.approx(weight, rel=1e-4), name
        assert record[f"{name}/behaviour_capped_frac"] == capped, name
        assert record[f"{name}/sampler_logp_gap"] == pytest.approx(abs(shift), abs=1e-5), name
    for learner, foreign, _ in pools:  # each foreign row divides by its source's reported (shifted) sum
        source = {i: rollout for i, _, rollout in pools}
        for t in foreign:
            rows = [x for x in source[t.source].trajectories if x.text == t.text and x.group == t.group]
            assert rows and all(r.source_logp_sum == t.source_logp_sum for r in rows), learner
    for _, _, rollout in pools:
        for s, behaviour in zip(rollout.samples, rollout.behaviour_logp, strict=True):
            assert behaviour.tolist() == pytest.approx(s.logprobs, abs=1e-6)


def test_corrected_is_refused_where_it_cannot_hold(tiny_agents, tmp_path):
    """grpo has no sequence-level behaviour weight; `hf` reports the full distribution's log-probs, not the
    top-p-truncated one it draws from. `auto` is `recompute` for every non-vLLM agent, so it never refuses."""
    from hacrl.config import load_config
    from hacrl.errors import ConfigError

    def config(name, **kw):
        return write_config(tmp_path / f"{name}.yaml", tiny_agents, ["llama"], tmp_path / name,
                            scoring={"function": "tests.reward_fixtures:digits"}, **kw)  # fmt: skip

    with pytest.raises(ConfigError, match="token-level"):
        load_config(config("grpo", algorithm={"name": "grpo"}, trainer={"old_logprobs": "corrected"}))
    with pytest.raises(ConfigError, match="'hf' sampler reports the full one's"):
        load_config(config("top", algorithm={"name": "gspo"}, rollout={"top_p": 0.9},
                           trainer={"old_logprobs": "corrected"}))  # fmt: skip
    for algorithm in ("grpo", "gspo"):
        load_config(config(f"auto-{algorithm}", algorithm={"name": algorithm}, rollout={"top_p": 0.9}))


def test_a_groups_shares_join_their_proximal_log_probs_and_gaps_in_rank_order():
    """A worker group's ranks each sample a share (`OwnSamples.joined`): under `corrected` at lag 0 each share's
    proximal log-probs follow its rows, a rank with no rows (more ranks than prompts) adds none, and the gap
    statistics add up (sums and counts) or take the larger (the largest difference)."""
    from hacrl.agent.samplers.base import Sample
    from hacrl.agent.sampling import OwnSamples

    def part(rows: int, gap, proximal: bool) -> OwnSamples:
        samples = [Sample([1], [2, 3], "x", True, [-0.5, -0.25]) for _ in range(rows)]
        values = [torch.tensor([-0.5, -0.25]) for _ in range(rows)]
        return OwnSamples(1, [[1]] * rows, samples, values, [None] * rows,
                          [torch.tensor([float(rows), 0.0])] * rows if proximal else None, gap)  # fmt: skip

    joined = OwnSamples.joined(1, [part(2, (0.5, 4, 0.25), True), part(0, (0.0, 0, 0.0), False),
                                   part(1, (0.1, 2, 0.5), True)])  # fmt: skip
    assert [float(p[0]) for p in joined.proximal_logp] == [2.0, 2.0, 1.0] and len(joined.samples) == 3
    assert joined.gap == (0.6, 6, 0.5)
    assert joined.gap_metrics() == {"sampler_logp_gap": pytest.approx(0.1), "sampler_logp_gap_max": 0.5}
    assert OwnSamples.joined(1, [part(1, (0.0, 0, 0.0), False)]).proximal_logp is None
    assert OwnSamples.joined(1, [part(1, (0.0, 0, 0.0), False)]).gap_metrics() == {}


def test_length_ordered_micro_batches_group_rows_of_like_length():
    """`trainer.micro_batch_order: length`: a mini-batch of more than one micro-batch is taken longest first (ties
    in pool order); one that fits in a single micro-batch, and `pool`, keep the pool order."""
    from types import SimpleNamespace

    from hacrl.agent.learning import micro_batches

    lengths = [(3, 2), (3, 9), (4, 1), (3, 9), (2, 6), (3, 3)]  # prompt, response tokens: 5 12 5 12 8 6
    rows = [SimpleNamespace(prompt_ids=[0] * p, response_ids=[1] * r) for p, r in lengths]
    assert micro_batches(rows, [0, 1, 2, 3, 4, 5], 2, "pool") == [[0, 1], [2, 3], [4, 5]]
    assert micro_batches(rows, [0, 1, 2, 3, 4, 5], 2, "length") == [[1, 3], [4, 5], [0, 2]]
    assert micro_batches(rows, [5, 1, 0], 3, "length") == [[5, 1, 0]]  # one micro-batch: as it came
    assert micro_batches(rows, [], 2, "length") == []


@pytest.mark.slow
def test_length_ordered_micro_batches_pad_less_for_the_same_gradient(tiny_agents, tmp_path, monkeypatch):
    """Through `hacrl train` (GSPO, one optimizer step an update: every row in one mini-batch, before any update):
    `length` trains the same rows as `pool`, with the same loss and gradient norm up to float rounding, in fewer
    padded positions, each micro-batch no longer than the one before."""
    import hacrl.agent.sampling as sampling
    from hacrl.agent.learning import LearningRole

    sample = sampling.generate

    def varied(agent, prompt_ids, group_size, *, logprobs=False):  # tiny agents run to the limit: cut them
        samples = sample(agent, prompt_ids, group_size, logprobs=logprobs)
        for i, s in enumerate(samples):
            s.response_ids = s.response_ids[: 1 + (5 * i) % len(s.response_ids)]
            s.text, s.finished = agent.decode(s.response_ids), False
            s.logprobs = s.logprobs[: len(s.response_ids)] if s.logprobs is not None else None
        return samples

    monkeypatch.setattr(sampling, "generate", varied)
    widths: dict[str, list[list[int]]] = {}
    real = LearningRole._micro_batch_loss

    def record(self, rows, *args, **kwargs):
        widths[order].append([len(r.prompt_ids) + len(r.response_ids) for r in rows])
        return real(self, rows, *args, **kwargs)

    monkeypatch.setattr(LearningRole, "_micro_batch_loss", record)
    runs = {}
    for order in ("pool", "length"):
        widths[order], runs[order] = [], tmp_path / order
        cfg = write_config(
            tmp_path / f"{order}.yaml", tiny_agents, ["llama", "qwen"], runs[order], algorithm={"name": "gspo"},
            rollout={"group_size": 4, "max_new_tokens": 12},
            trainer={"steps": 1, "prompts_per_step": 4, "mini_batch_size": 16, "micro_batch_size": 4,
                     "micro_batch_order": order},
            scoring={"function": "tests.reward_fixtures:digits"}, checkpoint={"every": 0},
        )  # fmt: skip
        assert main(["train", str(cfg)]) == 0
    pool, length = records(runs["pool"])[-1], records(runs["length"])[-1]
    for name in ("llama", "qwen"):
        assert length[f"{name}/trained_sequences"] == pool[f"{name}/trained_sequences"] == 16
        for key in ("loss", "grad_norm", "own_ratio_mean"):
            assert length[f"{name}/{key}"] == pytest.approx(pool[f"{name}/{key}"], rel=1e-5, abs=1e-7), key
    assert sorted(map(sorted, widths["pool"])) != sorted(map(sorted, widths["length"]))  # other micro-batches
    assert sorted(x for m in widths["pool"] for x in m) == sorted(x for m in widths["length"] for x in m)

    def padded(micros):
        return sum(len(m) * max(m) for m in micros)

    assert padded(widths["length"]) < padded(widths["pool"])
    for agent_micros in (widths["length"][:4], widths["length"][4:]):  # each learner: 4 micro-batches of 4
        tops = [max(m) for m in agent_micros]
        assert tops == sorted(tops, reverse=True)
