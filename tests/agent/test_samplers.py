"""Samplers and lean log-probs, checked on the CPU: the `static` sampler's greedy outputs equal `hf` generate's token
for token, its samples follow the model's distribution (chi-square against transformers' own warpers), stops and
length limits behave the same; chunked log-probs equal the full computation in value and gradient, and their
memory no longer grows with vocabulary x positions."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from hacrl.agent.logprobs import TokenBatch, token_logprobs
from hacrl.agent.model import Agent
from hacrl.agent.rollout import generate
from hacrl.agent.samplers.static import StaticSampler
from hacrl.config import AgentConfig, RolloutConfig
from tests.conftest import write_config

QUESTIONS = ("1 + 2 =", "What is 13 + 7?", "9+9", "x", "Sum 4 and 5.", "2+2?", "17 + 25 =", "a b c", "0", "99+1")
PROMPTS = [[{"role": "user", "content": q}] for q in QUESTIONS]


@pytest.fixture(scope="module")
def lively(tmp_path_factory):
    """Tiny agents initialised with std 0.3 instead of 0.02: their outputs depend on the prompt (at 0.02 every
    greedy row repeats one token), so parity and distribution tests have something to compare."""
    from hacrl.tools.testbed.models import bpe_tokenizer, char_tokenizer, save_agent, tiny_model
    from tests.conftest import ALPHABET, sum_corpus

    root = tmp_path_factory.mktemp("lively")
    char, bpe = char_tokenizer(ALPHABET), bpe_tokenizer(sum_corpus(), 80)
    return {
        "llama": save_agent(tiny_model("llama", char, hidden=32, heads=2, kv_heads=1, seed=1, init_std=0.3), char,
                            root / "llama"),
        "qwen": save_agent(tiny_model("qwen2", bpe, hidden=48, heads=4, kv_heads=2, seed=2, init_std=0.3), bpe,
                           root / "qwen"),
        "qwen3": save_agent(tiny_model("qwen3", bpe, hidden=64, heads=4, kv_heads=2, seed=3, init_std=0.3), bpe,
                            root / "qwen3"),
    }  # fmt: skip


def _agent(path, *, max_new_tokens=12, temperature=1.0, top_p=1.0, backend="hf") -> Agent:
    cfg = AgentConfig(name="a", model=str(path), rollout_backend=backend)
    return Agent(0, cfg, RolloutConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p))


@pytest.mark.parametrize("name", ["llama", "qwen", "qwen3"])  # char + Llama, BPE + Qwen2, BPE + Qwen3 (q/k norms)
@pytest.mark.parametrize("sync_every", [1, 3, 8])
def test_static_greedy_equals_hf_generate_token_for_token(name, sync_every, lively):
    agent = _agent(lively[name])
    prompts = [agent.render_prompt(m)[0] for m in PROMPTS] * 2
    reference = _stopping_at_different_steps(agent, prompts)
    static = StaticSampler(agent, sync_every=sync_every).sample(prompts, 1, greedy=True, batch_size=20)
    assert [(s.response_ids, s.finished, s.text) for s in static] == [
        (s.response_ids, s.finished, s.text) for s in reference
    ]
    lengths = {len(s.response_ids) for s in reference}
    assert len(lengths) > 2 and any(s.finished for s in reference) and any(not s.finished for s in reference)


@pytest.mark.parametrize(("name", "sync_every"), [("llama", 1), ("qwen", 3), ("qwen3", 2)])
def test_waiting_rows_take_the_slots_that_ended_rows_free(name, sync_every, lively):
    """Continuous batching: 20 rows that stop at different steps in 4 slots. Greedy outputs equal `hf`'s token
    for token (a row decodes the same whichever slot it lands in, whatever ran there before); waiting rows were
    prefilled into freed slots; and the slots computed fewer steps than the same rows in consecutive calls of 4,
    where a call runs until its longest row ends."""
    from hacrl.agent.samplers.base import Sampler

    agent = _agent(lively[name])
    prompts = [agent.render_prompt(m)[0] for m in PROMPTS] * 2
    reference = _stopping_at_different_steps(agent, prompts)
    assert len({len(s.response_ids) for s in reference}) >= 3
    refill = StaticSampler(agent, sync_every=sync_every)
    out = refill.sample(prompts, 1, greedy=True, batch_size=4)
    assert [(s.response_ids, s.finished) for s in out] == [(s.response_ids, s.finished) for s in reference]
    chunked = StaticSampler(agent, sync_every=sync_every)
    model = agent.model
    model.eval()
    with torch.no_grad():
        calls = Sampler.sample_rows(chunked, prompts, 4, True, 1.0)  # the consecutive calls of 4 rows
    assert [s.response_ids for s in calls] == [s.response_ids for s in reference]
    assert refill.stats["refills"] >= 4 and chunked.stats["refills"] == 0
    assert refill.stats["tokens"] == chunked.stats["tokens"] == sum(len(s.response_ids) for s in reference)
    assert refill.stats["slot_steps"] < chunked.stats["slot_steps"]
    assert refill.pool.rows == 4  # the slots, not the rows


def test_rows_of_one_token_and_a_first_token_that_stops_end_in_their_slot(lively):
    """Edge cases of a start in a freed slot: with max_new_tokens 1 every row ends at its first token (no decode
    step is wasted waiting for a sync), and a row whose first token is a stop token ends there with length 1."""
    agent = _agent(lively["qwen"], max_new_tokens=1)
    prompts = [agent.render_prompt(m)[0] for m in PROMPTS]
    reference = agent.sampler.sample(prompts, 1, greedy=True, batch_size=len(prompts))
    sampler = StaticSampler(agent, sync_every=8)
    out = sampler.sample(prompts, 1, greedy=True, batch_size=3)
    assert [s.response_ids for s in out] == [s.response_ids for s in reference]
    assert sampler.stats["decode_steps"] == 0 and sampler.stats["refills"] >= 3
    agent = _agent(lively["qwen"], max_new_tokens=6)
    firsts = [s.response_ids[0] for s in agent.sampler.sample(prompts, 1, greedy=True, batch_size=10)]
    agent.stop_ids = sorted({agent.eos_id, firsts[5]})  # row 5 (and any row that starts like it) stops at once
    reference = agent.sampler.sample(prompts, 1, greedy=True, batch_size=len(prompts))
    out = StaticSampler(agent, sync_every=2).sample(prompts, 1, greedy=True, batch_size=2)
    assert [(s.response_ids, s.finished) for s in out] == [(s.response_ids, s.finished) for s in reference]
    assert out[5].response_ids == [firsts[5]] and out[5].finished


def _stopping_at_different_steps(agent, prompts, *, rows: int = 2):
    """Extra stop tokens taken from the greedy outputs of the first `rows` rows, so rows stop at different steps
    (and the static sampler compacts its batch) while others run to the limit; the `hf` reference outputs under
    those stops."""
    plain = agent.sampler.sample(prompts, 1, greedy=True, batch_size=len(prompts))
    extra = [plain[0].response_ids[5]] + [plain[i].response_ids[2 + i % 3] for i in range(1, rows)]
    agent.stop_ids = sorted({agent.eos_id, *extra})
    return agent.sampler.sample(prompts, 1, greedy=True, batch_size=len(prompts))


def _compile_counts():
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0)), sum(counters["graph_break"].values())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "backend"), [("llama", "eager"), ("qwen", "eager"), ("qwen3", "eager"), ("qwen", "inductor")]
)
def test_the_compiled_decode_step_compiles_once_whatever_rows_stop_when(name, backend, lively, monkeypatch):
    """The decode step compiled as the GPU compiles it (`inductor`; `eager` traces the same graph without code
    generation): calls whose rows stop at different steps, with different row counts, greedy and sampled, and
    with more rows than slots (waiting rows prefilled into freed slots), run on ONE compilation (torch's own
    counters: one graph, no recompile, no graph break), the batch really compacts (the step sees several row
    counts), and the greedy outputs equal `hf`'s token for token. (torch counts no recompilations as such: each
    one is another unique graph.)"""
    agent = _agent(lively[name], max_new_tokens=24)
    prompts = [agent.render_prompt(m)[0] for m in PROMPTS] * 2
    reference = _stopping_at_different_steps(agent, prompts, rows=6)
    assert len({len(s.response_ids) for s in reference}) >= 3
    sampler = StaticSampler(agent, sync_every=2, compile_backend=backend)
    row_counts = []
    step = sampler._run_step
    monkeypatch.setattr(sampler, "_run_step", lambda pool, token, pos, args: row_counts.append(len(token)) or step(
        pool, token, pos, args))  # fmt: skip
    graphs, breaks = _compile_counts()
    for rows in (20, 17, 9, 20):
        out = sampler.sample(prompts[:rows], 1, greedy=True, batch_size=20)
        assert [s.response_ids for s in out] == [s.response_ids for s in reference[:rows]]
    torch.manual_seed(0)
    sampled = sampler.sample(prompts, 2, batch_size=20, temperature=0.8)
    assert len({len(s.response_ids) for s in sampled}) > 3
    with_logp = sampler.sample(prompts, 1, batch_size=20, temperature=1.3, logprobs=True)  # another temperature
    assert all(len(s.logprobs) == len(s.response_ids) for s in with_logp)
    refills = sampler.stats["refills"]
    slots = sampler.sample(prompts, 1, greedy=True, batch_size=8)  # 20 rows in 8 slots: waiting rows start later
    assert [s.response_ids for s in slots] == [s.response_ids for s in reference] and sampler.stats["refills"] > refills
    assert _compile_counts() == (graphs + 1, breaks)  # a recompilation would be a second graph
    assert {20, 17, 9} < set(row_counts)  # the call sizes, and compacted power-of-two buckets below them
    assert {c for c in row_counts if c < 9} <= {8, 4, 2}
    assert sampler.pool.rows == 32  # one pool, sized once for the largest call (rounded up to a power of two)


@pytest.mark.slow
def test_warm_up_compiles_before_the_first_call_and_allocates_its_pool(lively):
    """`StaticSampler.warm_up` does the first call's compilation and pool allocation on a few dummy tokens: the
    real call after it compiles nothing more, keeps the pool (same tensors), and samples as a fresh sampler does."""
    agent = _agent(lively["qwen3"], max_new_tokens=10)
    prompts = [agent.render_prompt(m)[0] for m in PROMPTS]
    reference = StaticSampler(agent).sample(prompts, 1, greedy=True, batch_size=8)
    sampler = StaticSampler(agent, compile_backend="eager")
    graphs, breaks = _compile_counts()
    assert sampler.warm_up(rows=8) > 0
    assert _compile_counts() == (graphs + 1, breaks)
    pool = sampler.pool
    assert (pool.rows, pool.length) == (8, agent.settings.max_prompt_tokens + 10)
    out = sampler.sample(prompts, 1, greedy=True, batch_size=8)
    assert [s.response_ids for s in out] == [s.response_ids for s in reference]
    assert sampler.pool is pool and _compile_counts() == (graphs + 1, breaks)
    assert agent.model.training  # left in the mode it found it in


def test_gradient_checkpointing_leaves_the_decode_step_one_graph_and_the_gradients_as_they_were(lively):
    """`agents.<i>.gradient_checkpointing` (the paper presets set it): no forward hook on the input embeddings (the
    one transformers adds for the reentrant checkpoint broke the compiled decode step on a GPU), the compiled step
    still samples in one graph in training mode, and the gradients equal those without checkpointing."""
    from hacrl.agent.logprobs import TokenBatch, token_logprobs

    grads = []
    for checkpointing in (False, True):
        cfg = AgentConfig(name="a", model=str(lively["qwen3"]), gradient_checkpointing=checkpointing)
        agent = Agent(0, cfg, RolloutConfig(max_new_tokens=8))
        assert not agent.model.get_input_embeddings()._forward_hooks
        prompts = [agent.render_prompt(m)[0] for m in PROMPTS]
        agent.model.train()
        if checkpointing:
            graphs, breaks = _compile_counts()
            StaticSampler(agent, compile_backend="eager").sample(prompts, 1, greedy=True, batch_size=8)
            assert _compile_counts() == (graphs + 1, breaks)
        batch = TokenBatch.build(prompts, [[5, 6, 7]] * len(prompts), agent.pad_id, agent.device)
        token_logprobs(agent.model, batch, 1.0)[batch.response_mask].sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in agent.model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.slow
def test_agents_in_one_process_never_share_a_compile_cache(lively):
    """torch keeps compilations per code object, with a limit (8 by default) past which it silently runs eagerly.
    Each sampler compiles its own copy of the step: with the limit at 1, three samplers (two of them for one model
    class) each still get their own compilation."""
    graphs, _ = _compile_counts()
    with torch._dynamo.config.patch(recompile_limit=1):  # (monkeypatch's undo hides the option for later tests)
        for name in ("llama", "qwen", "llama"):
            agent = _agent(lively[name], max_new_tokens=6)
            prompts = [agent.render_prompt(m)[0] for m in PROMPTS]
            reference = agent.sampler.sample(prompts, 1, greedy=True, batch_size=10)
            out = StaticSampler(agent, compile_backend="eager").sample(prompts, 1, greedy=True, batch_size=10)
            assert [s.response_ids for s in out] == [s.response_ids for s in reference]
    assert _compile_counts()[0] == graphs + 3  # shared, the third would exceed the limit and run uncompiled


def test_decode_attention_reads_each_rows_filled_positions_only():
    """The decode attention (the reference that runs on the CPU; tests/gpu checks the Triton kernel against it):
    each row attends to its own first `length` positions, whatever lies past them (here huge values), with query
    head h reading key/value head h // groups."""
    from hacrl.agent.samplers.attention import decode_attention

    torch.manual_seed(0)
    batch, heads, kv_heads, length, dim = 5, 6, 2, 40, 8
    query = torch.randn(batch, heads, dim)
    key, value = torch.randn(batch, kv_heads, length, dim), torch.randn(batch, kv_heads, length, dim)
    lengths = torch.tensor([1, 7, 40, 23, 2])
    for b, n in enumerate(lengths.tolist()):
        key[b, :, n:], value[b, :, n:] = 1e4, -1e4  # never read
    out = decode_attention(query, key, value, lengths, 0.5)
    for b, n in enumerate(lengths.tolist()):
        for h in range(heads):
            k, v = key[b, h // 3, :n], value[b, h // 3, :n]
            expected = torch.softmax(query[b, h] @ k.T * 0.5, dim=-1) @ v
            torch.testing.assert_close(out[b, h], expected, rtol=1e-5, atol=1e-5)


_INTERPRETED_KERNEL_CHECK = """
import torch
import hacrl.agent.samplers.attention as attention
attention._KERNEL = attention._build_kernel()
torch.manual_seed(0)
for batch, heads, kv_heads, length, dim in [(3, 4, 2, 300, 16), (2, 6, 2, 700, 32), (9, 4, 4, 70, 12)]:
    query = torch.randn(batch, heads, dim)
    key, value = torch.randn(batch + 2, kv_heads, length, dim)[:batch], torch.randn(batch, kv_heads, length, dim)
    lengths = torch.randint(1, length + 1, (batch,))
    lengths[0], lengths[-1] = 1, length
    expected = attention.reference_decode_attention(query, key, value, lengths, 0.3)
    torch.testing.assert_close(attention._triton_decode(query, key, value, lengths, 0.3), expected)
assert attention.split_plan(2, 2, 700)[0] == 3  # several splits per row were exercised
print("kernel ok")
"""


@pytest.mark.slow
def test_the_triton_kernel_equals_the_reference_in_the_interpreter():
    """The CUDA kernel's logic, run by Triton's interpreter on the CPU where Triton is installed (CI has no Triton:
    skipped there; tests/gpu runs the compiled kernel): splits past a row's length, a length of 1, a full row,
    grouped heads, several splits per row, a head dim that is no power of two. A subprocess: Triton reads
    TRITON_INTERPRET when it is imported."""
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (CPU builds of torch do not bring it)")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", _INTERPRETED_KERNEL_CHECK], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "kernel ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("name", ["llama", "qwen"])
def test_the_static_attention_switch_never_reaches_a_saved_model(name, lively, tmp_path):
    """The static sampler routes the model's attention through its own function (prefill and training keep the
    original one, with its masks: the training log-probs do not move); a saved agent still loads without hacrl."""
    from transformers import AutoModelForCausalLM

    from hacrl.agent.samplers.attention import NAME

    agent = _agent(lively[name], max_new_tokens=6)
    prompts = [agent.render_prompt(m)[0] for m in PROMPTS]
    batch = TokenBatch.build(prompts, [p[:3] for p in prompts], agent.pad_id, "cpu")
    with torch.no_grad():
        before = token_logprobs(agent.model, batch, 1.0)
    StaticSampler(agent)
    assert agent.model.config._attn_implementation == f"{NAME}_sdpa"
    with torch.no_grad():
        assert torch.equal(token_logprobs(agent.model, batch, 1.0), before)
    StaticSampler(agent)  # a second sampler keeps the same switch
    assert agent.model.config._attn_implementation == f"{NAME}_sdpa"
    agent.model.save_pretrained(tmp_path)
    assert NAME not in (tmp_path / "config.json").read_text()
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config._attn_implementation == "sdpa"


@pytest.mark.parametrize("backend", ["hf", "static"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_equal_the_teacher_forced_ones(backend, temperature, lively):
    """`sample(..., logprobs=True)` (what `trainer.old_logprobs: sampler` uses): each drawn token's log-prob at the
    sampling temperature equals the teacher-forced pass's to float rounding, and asking for them changes no draw."""
    agent = _agent(lively["qwen"], temperature=temperature, backend=backend)
    prompts = [agent.render_prompt(m)[0] for m in PROMPTS]
    torch.manual_seed(3)
    plain = agent.sampler.sample(prompts, 3, batch_size=16)
    torch.manual_seed(3)
    recorded = agent.sampler.sample(prompts, 3, batch_size=16, logprobs=True)
    assert [s.response_ids for s in recorded] == [s.response_ids for s in plain]
    assert all(s.logprobs is None for s in plain)
    batch = TokenBatch.build([s.prompt_ids for s in recorded], [s.response_ids for s in recorded], agent.pad_id, "cpu")
    with torch.no_grad():
        teacher = token_logprobs(agent.model, batch, temperature)
    gaps = []
    for i, s in enumerate(recorded):
        assert len(s.logprobs) == len(s.response_ids)
        gaps.append((torch.tensor(s.logprobs) - teacher[i][batch.response_mask[i]]).abs().max())
    assert sum(len(s.response_ids) for s in recorded) > 100
    assert float(max(gaps)) < 1e-4


@pytest.mark.parametrize("name", ["llama", "qwen", "qwen3"])
@pytest.mark.parametrize("capacity", [None, 3])  # None: the call's own size; 3: smaller than the prompts (it grows)
def test_hf_reserved_kv_cache_samples_what_transformers_own_cache_samples(name, capacity, lively, monkeypatch):
    """The `hf` sampler's cache writes each token in place (`reserved_cache`) instead of concatenating: the same
    tokens, stops and log-probs bit for bit as transformers' own `DynamicCache`, sampled and greedy, with rows that
    stop at different steps, and when the reserved room runs out mid-call."""
    import hacrl.agent.samplers.hf as hf

    agent = _agent(lively[name], temperature=0.8)
    prompts = [agent.render_prompt(m)[0] for m in PROMPTS]
    _stopping_at_different_steps(agent, prompts)
    reserve = hf.reserved_cache
    used = []

    def tracked(model, room):
        cache = reserve(model, capacity or room)
        used.append(cache)
        return cache

    def draw(kind):
        monkeypatch.setattr(hf, "reserved_cache", tracked if kind == "reserved" else lambda model, room: None)
        torch.manual_seed(5)
        sampled = agent.sampler.sample(prompts, 3, batch_size=16, logprobs=True)
        greedy = agent.sampler.sample(prompts, 1, greedy=True, batch_size=16)
        return [(s.response_ids, s.finished, s.logprobs) for s in sampled + greedy]

    assert draw("reserved") == draw("transformers")
    assert used and all(c is not None for c in used)
    assert len({len(s[0]) for s in draw("transformers")}) > 2


def test_reserved_cache_layers_crop_select_and_repeat_as_transformers_layers_do():
    """The generate paths hacrl does not take (assisted decoding's crop, beam search's reorder, batch expansion)
    still give what transformers' `DynamicLayer` gives; and a model whose cache layers are not all plain
    full-attention layers gets transformers' own cache."""
    from transformers import AutoConfig
    from transformers.cache_utils import DynamicLayer

    from hacrl.agent.samplers.hf import _ReservedLayer, reserved_cache

    g = torch.Generator().manual_seed(0)
    steps = [(torch.randn(3, 2, n, 4, generator=g), torch.randn(3, 2, n, 4, generator=g)) for n in (5, 1, 1, 2)]
    operations = (
        lambda x: x.crop(-2),
        lambda x: x.batch_select_indices(torch.tensor([2, 0])),
        lambda x: x.batch_repeat_interleave(2),
        lambda x: x.reorder_cache(torch.tensor([1, 1, 0])),
    )
    for operation in operations:
        mine, theirs = _ReservedLayer(4), DynamicLayer()
        for k, v in steps[:2]:
            assert all(torch.equal(a, b) for a, b in zip(mine.update(k, v), theirs.update(k, v), strict=True))
        operation(mine), operation(theirs)
        assert mine.get_seq_length() == theirs.get_seq_length()
        for k, v in steps[2:]:
            k, v = k[: mine.keys.shape[0]], v[: mine.keys.shape[0]]
            k, v = (
                (x.repeat(2, 1, 1, 1)[: mine.keys.shape[0]] for x in (k, v))
                if k.shape[0] < mine.keys.shape[0]
                else (k, v)
            )
            assert all(torch.equal(a, b) for a, b in zip(mine.update(k, v), theirs.update(k, v), strict=True))
        mine.reset()
        assert mine.get_seq_length() == 0 and not mine.is_initialized
    sizes = {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2, "intermediate_size": 64}
    sliding = AutoConfig.for_model("mistral", num_key_value_heads=1, vocab_size=50, sliding_window=8, **sizes)

    class Model:
        config = sliding

    assert reserved_cache(Model(), 16) is None
    Model.config = AutoConfig.for_model("llama", vocab_size=50, **sizes)
    cache = reserved_cache(Model(), 16)
    assert [type(layer) for layer in cache.layers] == [_ReservedLayer, _ReservedLayer]


def test_static_sampler_honours_the_length_limit_and_batches(lively):
    agent = _agent(lively["qwen"], max_new_tokens=5)
    prompts = [agent.render_prompt(m)[0] for m in PROMPTS]
    torch.manual_seed(0)
    samples = StaticSampler(agent).sample(prompts, 3, batch_size=4)
    assert len(samples) == 30 and [s.prompt_ids for s in samples] == [p for p in prompts for _ in range(3)]
    for s in samples:
        assert 1 <= len(s.response_ids) <= 5
        assert s.finished == (s.response_ids[-1] in agent.stop_ids)
        assert not any(t in agent.stop_ids for t in s.response_ids[:-1])
        assert s.text == agent.decode(s.response_ids)


def _wilson_hilferty_z(observed: list[int], expected: list[float]) -> float:
    """z-score of Pearson's chi-square statistic (cells with expected count < 5 pooled)."""
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for o, e in zip(observed, expected, strict=True):
        if e < 5:
            pool_o, pool_e = pool_o + o, pool_e + e
        else:
            obs.append(o)
            exp.append(e)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    df = len(obs) - 1
    return ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))


def _reference_probs(agent, prefix: list[int], temperature: float, top_p: float) -> torch.Tensor:
    """The next-token distribution after transformers' own temperature and top-p warpers (the reference)."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    with torch.no_grad():
        logits = agent.model(input_ids=torch.tensor([prefix])).logits[:, -1].float()
    scores = TemperatureLogitsWarper(temperature)(None, logits)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1)[0].double()


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_static_samples_follow_the_models_distribution(temperature, top_p, lively):
    agent = _agent(lively["llama"], max_new_tokens=2, temperature=temperature, top_p=top_p)
    agent.stop_ids = [agent.eos_id]
    prompt = agent.render_prompt(PROMPTS[0])[0]
    n = 4000
    torch.manual_seed(1234)
    samples = StaticSampler(agent).sample([prompt], n, batch_size=1000)
    vocab = len(agent.tokenizer)
    first = torch.bincount(torch.tensor([s.response_ids[0] for s in samples]), minlength=vocab)
    p1 = _reference_probs(agent, prompt, temperature, top_p)
    assert _wilson_hilferty_z(first.tolist(), (p1 * n).tolist()) < 3.5  # p > 0.0002
    # the second token, over the runs that did not stop at the first: sum_t1 p(t1) p(t2 | t1)
    joint = torch.zeros(vocab, dtype=torch.float64)
    for t1 in range(vocab):
        if p1[t1] > 0 and t1 not in agent.stop_ids:
            joint += p1[t1] * _reference_probs(agent, prompt + [t1], temperature, top_p)
    second = [s.response_ids[1] for s in samples if len(s.response_ids) == 2]
    observed = torch.bincount(torch.tensor(second), minlength=vocab)
    expected = joint / joint.sum() * len(second)
    assert _wilson_hilferty_z(observed.tolist(), expected.tolist()) < 3.5
    # the test has power: the same draws against a distribution at another temperature fail it
    wrong = _reference_probs(agent, prompt, temperature * 1.5, top_p)
    assert _wilson_hilferty_z(first.tolist(), (wrong * n).tolist()) > 5


@pytest.mark.slow
def test_a_run_with_the_static_sampler_trains(tiny_agents, tmp_path):
    from hacrl.tools.cli import main

    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], run, trainer={"steps": 2})
    assert main(["train", str(cfg), "rollout.backend=static", "rollout.batch_size=4"]) == 0
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["llama/optimizer_steps"] == 4 and math.isfinite(last["qwen/loss"])


@pytest.mark.slow
def test_the_generation_batch_is_its_own_knob(tiny_agents, tmp_path, monkeypatch):
    from hacrl.agent.samplers.hf import HFSampler
    from hacrl.tools.cli import main

    seen = []
    real = HFSampler.sample

    def recording(self, prompts, num_samples, **kwargs):
        seen.append(kwargs["batch_size"])
        return real(self, prompts, num_samples, **kwargs)

    monkeypatch.setattr(HFSampler, "sample", recording)
    cfg = write_config(tmp_path / "c.yaml", tiny_agents, ["llama", "qwen"], tmp_path / "run", trainer={"steps": 1})
    assert main(["train", str(cfg), "rollout.batch_size=3", "trainer.logprob_batch_size=5"]) == 0
    assert seen[:2] == [3, 3]


# -- lean log-probs --------------------------------------------------------------------------------------------------


def _batch(agent, rows: int, seed: int, left: bool) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    vocab = len(agent.tokenizer)
    prompts = [torch.randint(3, vocab, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
               for _ in range(rows)]  # fmt: skip
    responses = [torch.randint(3, vocab, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
                 for _ in range(rows)]  # fmt: skip
    return TokenBatch.build(prompts, responses, agent.pad_id, agent.device, left=left)


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("name", ["llama", "qwen"])
def test_chunked_logprobs_equal_the_full_computation_in_value_and_gradient(name, left, tiny_agents):
    agent = _agent(tiny_agents[name])
    model = agent.model.double()
    batch = _batch(agent, 6, seed=3, left=left)
    weights = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    results = []
    for chunk in (None, 1, 4, 1000):
        model.zero_grad()
        logp = token_logprobs(model, batch, 0.7, chunk_size=chunk).double()
        loss = (logp * weights)[batch.response_mask].sum()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        results.append((logp[batch.response_mask].detach(), grads))
    full_values, full_grads = results[0]
    for values, grads in results[1:]:
        torch.testing.assert_close(values, full_values, rtol=0, atol=1e-12)
        for a, b in zip(grads, full_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
def test_the_fused_chunk_gradient_is_autograds_bit_for_bit(temperature, bias, dtype):
    """`_SelectedLogprobs` (the gradient formed in the recomputed logits' buffer) against autograd through a
    checkpoint of the same chunk: equal values and equal gradients of the hidden states, the weight and the bias,
    bit for bit, with float32 and bfloat16 weights (the same operations in the same order)."""
    from hacrl.agent.logprobs import _selected_logprobs, _SelectedLogprobs

    g = torch.Generator().manual_seed(11)
    head = torch.nn.Linear(16, 1000, bias=bias).to(dtype)
    hidden = torch.randn(37, 16, generator=g).to(dtype).requires_grad_()
    targets, weights = torch.randint(0, 1000, (37,), generator=g), torch.randn(37, generator=g)
    results = []
    for fused in (True, False):
        hidden.grad = None
        head.zero_grad(set_to_none=True)
        if fused:
            out = _SelectedLogprobs.apply(hidden, head.weight, head.bias, targets, temperature)
        else:
            out = checkpoint(_selected_logprobs, hidden, targets, head, temperature, use_reentrant=False)
        (out * weights).sum().backward()
        results.append([out.detach(), hidden.grad, *(p.grad for p in head.parameters())])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_an_output_layer_that_is_not_a_plain_linear_takes_autograds_path(monkeypatch):
    """A wrapped output layer (a LoRA adapter on it computes more than its weight's product) is called as a module,
    and so is a sharded model's (`fused=False`): the fused chunk reads the weight only of a plain `nn.Linear`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import hacrl.agent.logprobs as logprobs

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))  # fmt: skip
    batch = TokenBatch.build([[5, 6, 7]] * 2, [[8, 9], [10]], 0, torch.device("cpu"))
    fused_calls = []
    real = logprobs._SelectedLogprobs.apply
    monkeypatch.setattr(logprobs._SelectedLogprobs, "apply", lambda *a: fused_calls.append(1) or real(*a))
    plain = token_logprobs(model, batch, 1.0, chunk_size=1)
    assert len(fused_calls) == 3  # one per response position
    assert torch.equal(token_logprobs(model, batch, 1.0, chunk_size=1, fused=False), plain)

    class Wrapped(torch.nn.Module):  # what a LoRA layer looks like to the chunked path
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x) + 1.0

    model.lm_head = Wrapped(model.lm_head)
    model.get_output_embeddings = lambda: model.lm_head
    fused_calls.clear()
    shifted = token_logprobs(model, batch, 1.0, chunk_size=1)
    assert not fused_calls
    torch.testing.assert_close(shifted, plain)  # +1 on every logit leaves the log-softmax as it was


MEMORY_PROBE = """
import json, os, resource, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
from hacrl.agent.logprobs import TokenBatch, token_logprobs

def peak_kib(positions, chunk):  # in a forked child: its own address space, its peak from the parent's RSS up
    torch.manual_seed(0); torch.set_num_threads(2)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=150_000, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         tie_word_embeddings=True))
    rows = 4
    batch = TokenBatch.build([[5] * 4] * rows, [[7] * (positions - 4)] * rows, 0, torch.device("cpu"))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    logp = token_logprobs(model, batch, 1.0, chunk_size=chunk)
    logp[batch.response_mask].sum().backward()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before

peaks = []
for arg in sys.argv[1:]:  # one interpreter start (transformers takes ~10 s to import), one fork per measurement
    positions, chunk = arg.split(":")
    chunk = None if chunk == "full" else chunk if chunk == "auto" else int(chunk)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into this loop, whatever happens in it
        status = 1
        try:
            os.close(read)
            os.write(write, json.dumps(peak_kib(int(positions), chunk)).encode())
            status = 0
        except BaseException:
            import traceback; traceback.print_exc()
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as pipe:
        reply = pipe.read()
    if os.waitpid(pid, 0)[1] != 0:
        sys.exit(f"the probe {arg} failed (its traceback is above)")
    peaks.append(json.loads(reply) / 1024)
print(json.dumps(peaks))
"""


@pytest.mark.slow
def test_chunked_logprobs_memory_does_not_grow_with_vocabulary_times_positions():
    """A 150k vocabulary: the full path's peak grows by rows x positions x vocabulary x 4 bytes (and as much again
    for the gradient); the chunked path's stays within a few chunks' logits. Peaks in MiB, each measured in a fresh
    fork of one probe process (the parent only imports: no allocator or thread pool carries over). The chunked
    path's peak has varied from fork to fork (measured once: 211-320 MiB at 32 positions, 286-358 at 320; a chunk's
    logits are 37 MiB; today 248 and 326 MiB within 0.1), so each chunked probe is the least of two forks and is
    compared over 32 -> 640 positions, where keeping the logits would add 1.4 GiB."""
    probes = ["32:full", "320:full", *["32:64"] * 2, *["640:64"] * 2, "640:auto"]
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, *probes], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    peaks = json.loads(out.stdout.strip().splitlines()[-1])
    full_small, full_large, auto_larger = peaks[0], peaks[1], peaks[6]
    lean_small, lean_large = min(peaks[2:4]), min(peaks[4:6])

    def logits_mib(positions):  # float32 logits of 4 rows over `positions` positions
        return 4 * positions * 150_000 * 4 / 2**20

    assert full_large - full_small > 2 * logits_mib(320 - 32), (full_small, full_large)  # logits, their grad: ~4x
    assert lean_large - lean_small < 0.15 * logits_mib(640 - 32), peaks  # flat, up to allocator noise
    assert lean_large < full_large / 5, peaks  # twice the positions, a fifth of the full path's peak
    # the default, `auto`: chunked at this size, so twice the positions (1.4 GiB of float32 logits on the full path)
    # stay below half of the full path's peak at 320
    assert auto_larger < full_large / 2, (auto_larger, full_large)


def test_auto_log_prob_chunks_only_where_the_full_logits_are_large():
    """`trainer.logprob_chunk_size: auto` (the default): the full path for small vocabularies (the demo's numbers
    do not move), chunks once rows x positions x vocabulary float32 logits pass 256 MiB on an accelerator, 64 MiB
    on the CPU (its resident memory is what a run runs out of)."""
    from hacrl.agent.logprobs import auto_chunk_size
    from hacrl.config import TrainConfig

    assert TrainConfig().trainer.logprob_chunk_size == "auto"
    for cpu in (False, True):
        assert auto_chunk_size(64, 300, 80, cpu=cpu) is None  # a demo-sized batch: 5.9 MiB
        assert auto_chunk_size(64, 5120, 10**7, cpu=cpu) == 16  # at least 16 positions per chunk
    assert auto_chunk_size(1, 400, 151_936, cpu=False) is None  # 232 MiB
    assert auto_chunk_size(4, 2048, 151_936, cpu=False) == 441  # 4.6 GiB of logits: chunks of 441 positions (256 MiB)
    assert auto_chunk_size(1, 400, 151_936, cpu=True) == 110  # 232 MiB: chunks of 110 positions (64 MiB)
    assert auto_chunk_size(16, 128, 49_152, cpu=True) == 341  # SmolLM2's micro-batch: 341 positions, not 1,365
    for vocab in (32_000, 49_152, 128_256, 151_936, 262_144):  # a CPU chunk's logits: above glibc's largest mmap
        assert auto_chunk_size(16, 4096, vocab, cpu=True) * vocab * 4 > 32 * 2**20  # threshold, never in its heap


def test_auto_rows_fit_the_pool_beside_the_update():
    """`rollout.batch_size: auto` on a GPU (the arithmetic, by hand): 80 GiB free of 80, 3 GiB the update will
    still allocate, a 0.35 margin (28 GiB) leave 49 GiB; at 0.5 GiB per row 98 rows fit: 64 (a power of two).
    Too little room for 2 rows is an error that names the knobs."""
    from hacrl.agent.samplers.static import auto_rows
    from hacrl.errors import ConfigError

    gib = 2**30
    assert auto_rows(free=80 * gib, total=80 * gib, pending=3 * gib, margin=0.35, bytes_per_row=gib // 2) == 64
    assert auto_rows(free=80 * gib, total=80 * gib, pending=3 * gib, margin=0.0, bytes_per_row=gib // 2) == 128
    with pytest.raises(ConfigError, match="rollout.max_new_tokens .* rollout.kv_cache_margin"):
        auto_rows(free=30 * gib, total=80 * gib, pending=3 * gib, margin=0.35, bytes_per_row=gib // 2)


def test_pending_update_bytes_count_gradients_and_adam_state_not_yet_allocated(lively):
    agent = _agent(lively["qwen"])
    size = sum(p.numel() * p.element_size() for p in agent.model.parameters())
    assert agent.optimizer.pending_bytes() == 3 * size  # gradients + two AdamW moments
    batch = TokenBatch.build([[3, 4, 5]], [[6, 7]], agent.pad_id, "cpu")
    token_logprobs(agent.model, batch, 1.0)[batch.response_mask].sum().backward()
    agent.optimizer.step()
    assert agent.optimizer.pending_bytes() == 0
    agent.optimizer.zero_grad(set_to_none=True)
    assert agent.optimizer.pending_bytes() == size


def test_auto_batch_size_on_the_cpu_is_64_rows_per_call(lively, monkeypatch):
    """64 slots on the CPU: 100 rows decode in one call, 64 at a time (waiting rows take freed slots)."""
    agent = _agent(lively["qwen"], max_new_tokens=2, backend="static")
    calls = []
    real = type(agent.sampler)._decode
    monkeypatch.setattr(type(agent.sampler), "_decode", lambda self, rows, *a, slots=None, **k: calls.append(
        (len(rows), slots)) or real(self, rows, *a, slots=slots, **k))  # fmt: skip
    prompts = [agent.render_prompt(m)[0] for m in PROMPTS]
    assert len(agent.sampler.sample(prompts, 10, batch_size="auto")) == 100
    assert calls == [(100, 64)] and agent.sampler.pool.rows == 64


def test_hf_auto_decodes_the_whole_step_in_one_call_within_its_memory_rule(lively, monkeypatch):
    """`rollout.batch_size` unset (`auto`) with `hf`: the step's rows in one generate call (TRL's generation batch;
    64-row calls made sampling 1.7x slower on 2 cores), bounded by AUTO_BYTES of cache and logits at the length
    limits, never below 64 rows; the rule reads the config and the model only."""
    import hacrl.agent.samplers.hf as hf
    from hacrl.agent.samplers.static import KVPool, row_bytes

    agent = _agent(lively["qwen"], max_new_tokens=3)
    assert agent.settings.rows_per_call == "auto"
    calls = []
    real = type(agent.sampler).sample_batch
    monkeypatch.setattr(type(agent.sampler), "sample_batch", lambda self, rows, *a, **k: calls.append(len(rows))
                        or real(self, rows, *a, **k))  # fmt: skip
    prompts = [agent.render_prompt(m)[0] for m in PROMPTS]
    assert len(generate(agent, prompts, 20)) == 200 and calls == [200]
    per_row = row_bytes(KVPool.bytes_per_token(agent.model.config, torch.float32), agent.settings.max_tokens,
                        agent.model.get_output_embeddings().weight.shape[0])  # fmt: skip
    monkeypatch.setattr(hf, "AUTO_BYTES", 90 * per_row)  # room for 90 rows: 200 go in calls of 90
    calls.clear()
    generate(agent, prompts, 20)
    assert calls == [90, 90, 20]
    monkeypatch.setattr(hf, "AUTO_BYTES", 10 * per_row)  # room for 10: never below 64 rows per call
    calls.clear()
    generate(agent, prompts, 20)
    assert calls == [64, 64, 64, 8]


def test_auto_rows_on_a_gpu_use_the_free_memory_the_model_config_and_the_margin(lively, monkeypatch):
    """The sampler's own `auto` path as it runs on a GPU (the device and CUDA's memory query faked on the CPU):
    per row, the pool's positions x 2 x layers x kv heads x head dim x dtype + the sampling step's floats; the
    answer is fixed once, and every call (evaluation's int batch sizes too) is capped by it."""
    from hacrl.agent.samplers.static import KVPool

    agent = _agent(lively["qwen3"], max_new_tokens=64, backend="static")  # rollout.batch_size unset: auto
    sampler = StaticSampler(agent)
    config = agent.model.config
    per_row = KVPool.bytes_per_token(config, torch.float32) * (agent.settings.max_prompt_tokens + 64)
    per_row += 16 * config.vocab_size
    size = sum(p.numel() * p.element_size() for p in agent.model.parameters())
    total, free = 1000 * per_row, 900 * per_row
    monkeypatch.setattr(agent, "device", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    expected = (free - 3 * size - int(0.35 * total)) // per_row  # ~550 rows fit: 512, a power of two
    assert sampler.rows_per_call([[1]] * 10_000) == 1 << (expected.bit_length() - 1) == 512
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (0, total))  # decided once: unchanged
    assert sampler.rows_per_call([[1]] * 10_000) == 512 and sampler.rows_per_call([[1]] * 3) == 3
    assert sampler.cap_rows(4096) == 512 and sampler.cap_rows(64) == 64


def test_models_the_static_sampler_cannot_decode_are_refused_with_the_way_out(lively, tmp_path):
    """Sliding-window layers would need a windowed decode attention: the sampler refuses at construction, naming
    the reason and `hf`, instead of sampling from the wrong distribution."""
    from transformers import AutoModelForCausalLM

    from hacrl.errors import ConfigError

    model = AutoModelForCausalLM.from_pretrained(lively["qwen"])
    model.config.use_sliding_window, model.config.sliding_window = True, 8
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (lively["qwen"] / name).is_file():
            (tmp_path / name).write_bytes((lively["qwen"] / name).read_bytes())
    with pytest.raises(
        ConfigError, match="cannot decode this model: its layers mix attention types.*rollout.backend=hf"
    ):
        _agent(tmp_path, backend="static")


def test_eager_attention_models_and_a_single_row_decode_like_hf(lively):
    """The decode attention hands prefill to the model's own implementation (here `eager`, not sdpa), and a call of
    one row (padded to the smallest bucket of 2 internally) returns that one row, equal to `hf`'s."""
    agent = _agent(lively["llama"])
    agent.model.set_attn_implementation("eager")
    prompts = [agent.render_prompt(m)[0] for m in PROMPTS]
    reference = agent.sampler.sample(prompts, 1, greedy=True, batch_size=10)
    sampler = StaticSampler(agent)
    assert agent.model.config._attn_implementation == "hacrl_static_eager"
    assert [s.response_ids for s in sampler.sample(prompts, 1, greedy=True, batch_size=10)] == [
        s.response_ids for s in reference
    ]
    (one,) = sampler.sample(prompts[3:4], 1, greedy=True, batch_size=10)
    assert one.response_ids == reference[3].response_ids and one.prompt_ids == prompts[3]
