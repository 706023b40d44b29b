"""Sampling throughput per sampler backend, log-prob memory, and a 2-agent HACPO step, on the paper's model shapes.

    python benchmarks/gpu_throughput.py                  # on a GPU: the checks below, ~5 minutes on an H200
    python benchmarks/gpu_throughput.py --tiny           # the same code path on CPU with tiny shapes (make test)
    python benchmarks/gpu_throughput.py --tiny --paper-vocab  # ... at the paper's vocabularies, real tokenizers
    python benchmarks/gpu_throughput.py --only sampling  # some parts: kernel sampling parity logprobs step long paper

Models are built from the configs below (the public shapes of Qwen3 and Llama-3.2) with random weights; the real
tokenizers come from `../shared/data/tokenizers/` when present (on the CPU only with `--paper-vocab`: by default the
dry run uses 4,096-id vocabularies and a character tokenizer, the same code in half the time). Random weights
never emit EOS, so every response runs to the length limit: the worst case for sampling. Parts (in this order):

- kernel: the decode-attention kernel alone at the sampler's shapes, for each launch setting of a small sweep
  (checked against the reference, then timed): GB/s of keys and values read; the fastest overall is used for the
  rest of the run and named in the result.
- sampling: tokens per second of each sampler backend (`hf`; `static`; `static` with CUDA graphs on a GPU) at
  ROWS x NEW tokens, against the HBM roofline of the GPU (weights plus the mean KV cache read once per step).
- parity: greedy `static` vs `hf` in the benchmark's dtype: rows equal token for token, and where they differ,
  whether the first difference is a near-tie (top-2 logit gap < 0.1 under `hf`'s logits).
- logprobs: peak memory of teacher-forced log-probs + backward at 16 x 4096 tokens, full logits vs chunked.
- step: per-phase times of one 2-agent HACPO step with both agents on the device (32 prompts x 8, 512 new tokens)
  with each sampler backend.
- long: 256 x 4,096 new tokens on the first shape, rows per call chosen by `rollout.batch_size: auto`, after
  `StaticSampler.warm_up`: tokens per second, the peak memory against the card's, the roofline at that length.
- paper: one Qwen3-4B-shape agent through the real trainer at the paper's structure scaled down (8 prompts x 8 x
  4,096 new tokens, gradient checkpointing, chunked log-probs): per-phase seconds, peak memory against `hacrl
  plan`'s prediction, the update's tokens per second and model FLOPs utilisation.
- precision: the paper step (--precision-new tokens) five ways: pure bf16 (`master_weights: none`), bf16 with
  float32 masters on the device, and with `offload: optimizer` (masters and AdamW state in pinned host memory), and
  as an FSDP2 worker group of one rank (`devices: [cuda:0]`) without and with CPU offload: step time, the offload
  seconds, peak device memory, and `hacrl plan`'s device peak and host bytes for each.

Writes benchmarks/results/gpu.md and gpu.json (or --out DIR), stamped with the device, driver, torch and
transformers versions and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("HACRL_TOKENIZERS", ROOT.parent / "shared" / "data" / "tokenizers"))
"""The real tokenizers (`../shared/data/tokenizers/`; on a device machine, a carried copy named by HACRL_TOKENIZERS)."""

SHAPES = {  # public configs (hidden, layers, heads, kv heads, head dim, intermediate, vocab, family)
    "qwen3-0.6b": dict(family="qwen3", hidden=1024, layers=28, heads=16, kv=8, head_dim=128, ffn=3072, vocab=151_936),
    "qwen3-1.7b": dict(family="qwen3", hidden=2048, layers=28, heads=16, kv=8, head_dim=128, ffn=6144, vocab=151_936),
    "qwen3-4b": dict(family="qwen3", hidden=2560, layers=36, heads=32, kv=8, head_dim=128, ffn=9728, vocab=151_936),
    "llama-3.2-1b": dict(family="llama", hidden=2048, layers=16, heads=32, kv=8, head_dim=64, ffn=8192, vocab=128_256),
    "llama-3.2-3b": dict(family="llama", hidden=3072, layers=28, heads=24, kv=8, head_dim=128, ffn=8192, vocab=128_256),
}
TINY = {
    "qwen3-0.6b": dict(family="qwen3", hidden=64, layers=2, heads=4, kv=2, head_dim=16, ffn=128, vocab=151_936),
    "llama-3.2-1b": dict(family="llama", hidden=64, layers=2, heads=4, kv=2, head_dim=16, ffn=128, vocab=128_256),
    "qwen3-4b": dict(family="qwen3", hidden=96, layers=3, heads=8, kv=2, head_dim=16, ffn=160, vocab=151_936),
    # the precision part's dry run: three bf16 steps, which the CPU computes slowly at a real vocabulary
    "qwen3-4b-char": dict(family="qwen3", hidden=96, layers=3, heads=8, kv=2, head_dim=16, ffn=160, vocab=128, char=1),
}
TINY_VOCAB = 4096
"""The CPU dry run's vocabulary unless `--paper-vocab`: the code paths are the same, the decode steps ~5x faster."""
BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.0, "A10": 125.0}
"""Dense bf16 tensor-core peak in TFLOP/s by GPU name fragment (vendor figures, SXM parts), for model FLOPs
utilisation."""
HBM_TBS = {"H200": 4.8, "H100": 3.35, "A100": 2.0, "L40S": 0.864, "A10": 0.6}
"""Peak HBM bandwidth in TB/s by GPU name fragment (vendor figures)."""


def build_agent(name: str, shape: dict, directory: Path, dtype: torch.dtype, device: str) -> Path:
    """A model directory with the shape's random weights and the real tokenizer (a byte tokenizer without it);
    one built earlier into `directory` is reused."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    out = directory / name
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        if json.loads((out / "config.json").read_text()).get("vocab_size") == shape["vocab"]:
            return out
        shutil.rmtree(out)  # built with the other vocabulary (--paper-vocab or not)

    tokenizer = _tokenizer(shape["family"], shape["vocab"], char=bool(shape.get("char")))
    common = dict(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv"],
        head_dim=shape["head_dim"],
        intermediate_size=shape["ffn"],
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = (Qwen3Config if shape["family"] == "qwen3" else LlamaConfig)(**common)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()  # free memory as the sampler's `batch_size: auto` reads it excludes a cached block
    return out


def _tokenizer(family: str, vocab: int, *, char: bool = False):
    from transformers import PreTrainedTokenizerFast

    folder = SHARED / ("qwen3" if family == "qwen3" else "llama-3.2-instruct")
    if folder.is_dir() and not char:
        tok = PreTrainedTokenizerFast.from_pretrained(folder)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        if not tok.chat_template and (folder / "chat_template.jinja").is_file():
            tok.chat_template = (folder / "chat_template.jinja").read_text()
        return tok
    from hacrl.tools.testbed.models import char_tokenizer

    return char_tokenizer("".join(chr(c) for c in range(32, 127)))


def _agent(directory: Path, device: str, dtype: str, new_tokens: int, backend: str, cuda_graphs: bool):
    from hacrl.agent.model import Agent
    from hacrl.config import AgentConfig, RolloutConfig

    cfg = AgentConfig(name=directory.name, model=str(directory), device=device, dtype=dtype, rollout_backend=backend)
    rollout = RolloutConfig(max_new_tokens=new_tokens, max_prompt_tokens=256, cuda_graphs=cuda_graphs)
    return Agent(0, cfg, rollout)


def _prompts(agent, rows: int) -> list[list[int]]:
    questions = [f"What is {a} + {b}? Think step by step." for a in range(7) for b in range(7)]
    return [agent.render_prompt([{"role": "user", "content": questions[i % len(questions)]}])[0] for i in range(rows)]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


PARTS = ("kernel", "sampling", "parity", "logprobs", "step", "long", "paper", "precision", "lag")
"""The parts of the check, in the order they run."""
MODES = ("no-stop", "varied")
"""Sampling modes. `no-stop`: no stop token, every row decodes `new` tokens (random weights never emit EOS).
`varied`: rows end at different lengths with a long tail, as real answers do: a fixed random set of vocabulary ids
(`VARIED_MEAN_FRACTION`) acts as stop tokens, so with the near-uniform next-token distribution of random weights a
row stops at each step with probability ~ |stops| / vocabulary: lengths are ~geometric with mean ~new / 4 (most
short, ~2 % at the limit). Each row's measured length distribution is reported, and tokens/s counts real tokens."""
VARIED_MEAN_FRACTION = 0.25


def stop_set(vocab: int, new: int) -> list[int]:
    """The varied mode's stop tokens: vocab / (new * VARIED_MEAN_FRACTION) ids drawn with a fixed seed."""
    count = max(1, round(vocab / (new * VARIED_MEAN_FRACTION)))
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[:count].sort().values.tolist()


def sampling(
    directory: Path,
    device: str,
    dtype: str,
    rows: int,
    new: int,
    backends: list[tuple[str, bool]],
    profile: bool,
    modes: tuple[str, ...] = MODES,
    on_result=None,
):
    """Tokens per second of each backend in each of `modes` (MODES), one agent per backend for all modes. Per
    mode: a warm-up call (with CUDA graphs the same rows as the timed one: the first mode's compiles, and each
    captures the graphs its row counts need), then the timed call; for each call, seconds, graphs compiled and
    CUDA-graph skips (torch's counters: a compilation after the warm-up is a recompilation), the peak device memory
    and the lengths. With `profile`, one more call per backend and mode under torch.profiler."""
    results = []
    for (backend, graphs), mode in ((b, m) for b in backends for m in modes):
        if mode == modes[0]:
            agent = _agent(directory, device, dtype, new, backend, graphs)
        vocab = agent.model.config.vocab_size
        agent.stop_ids = [-1] if mode == "no-stop" else stop_set(vocab, new)
        prompts = _prompts(agent, rows)
        calls = {}
        for call in ("warm_up", "timed"):
            torch.manual_seed(1)
            before = _compile_stats()
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            batch = prompts if graphs or call == "timed" else prompts[: min(rows, 8)]
            samples = agent.sampler.sample(batch, 1, batch_size=rows)
            _sync(device)
            seconds = time.perf_counter() - start
            lengths = sorted(len(s.response_ids) for s in samples)
            calls[call] = {
                "seconds": seconds,
                "tokens": sum(lengths),
                **{k: v - before.get(k, 0) for k, v in _compile_stats().items()},
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None,
                "lengths": {
                    "mean": sum(lengths) / len(lengths),
                    "p10": lengths[len(lengths) // 10],
                    "p50": lengths[len(lengths) // 2],
                    "p90": lengths[(9 * len(lengths)) // 10],
                    "max": lengths[-1],
                    "at_limit": sum(n == new for n in lengths) / len(lengths),
                },
            }
        timed = calls["timed"]
        results.append(
            {
                "backend": backend + (" + CUDA graphs" if graphs else ""),
                "mode": mode,
                "tokens_per_second": timed["tokens"] / timed["seconds"],
                "ms_per_step": 1000 * timed["seconds"] / max(timed["lengths"]["max"], 1),  # the steps the batch ran
                "first_call_s": calls["warm_up"]["seconds"],
                "compiled_graphs": calls["warm_up"].get("compiled_graphs", 0),
                "cudagraph_skips": calls["warm_up"].get("cudagraph_skips", 0),
                "recompiles_after_warm_up": timed.get("compiled_graphs", 0),
                "cudagraph_skips_after_warm_up": timed.get("cudagraph_skips", 0),
                "calls": calls,
            }
        )
        if on_result is not None:  # e.g. save: a run cut by its time limit keeps what it measured
            on_result(results[-1])
        if profile:  # after the save: profiling a call of CUDA graphs can take long
            results[-1]["profile"] = _profile_call(agent, prompts, rows, new, device)
            if on_result is not None:
                on_result(None)
        if mode == modes[-1]:
            del agent
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return results


def _profile_call(agent, prompts, rows: int, new: int, device: str) -> dict:
    """One sampling call under torch.profiler: per decode step, the wall time and the device's busy time, and the
    operators that take the most time (self time: device time on a GPU, CPU time on the CPU)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        agent.sampler.sample(prompts, 1, batch_size=rows)
        _sync(device)
    wall = time.perf_counter() - start
    events = prof.key_averages()
    key = "self_device_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    busy = sum(getattr(e, key, 0.0) for e in events) / 1000  # microseconds -> ms
    top = sorted(events, key=lambda e: getattr(e, key, 0.0), reverse=True)[:15]
    return {
        "wall_ms_per_step": 1000 * wall / new,
        "busy_ms_per_step": busy / new,
        "top": [
            {"op": e.key[:60], "calls_per_step": e.count / new, "ms_per_step": getattr(e, key, 0.0) / 1000 / new}
            for e in top
        ],
    }


def _compile_stats() -> dict:
    """What torch.compile did so far in this process: graphs compiled (a compilation after the warm-up is a
    recompilation), CUDA graphs skipped."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    return {
        "compiled_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "cudagraph_skips": sum(counters["inductor"].get(k, 0) for k in counters["inductor"] if "cudagraph_skip" in k),
    }


def roofline(directory: Path, device: str, dtype: str, rows: int, new: int, prompt: int) -> dict | None:
    """Milliseconds per decode step to read the weights and the mean KV cache once from HBM."""
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name()
    tbs = next((v for k, v in HBM_TBS.items() if k in name), None)
    if tbs is None:
        return None
    config = json.loads((directory / "config.json").read_text())
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    params = sum(p.numel() for p in _agent(directory, device, dtype, 1, "hf", False).model.parameters())
    kv_per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * itemsize
    mean_len = prompt + new / 2
    bytes_per_step = params * itemsize + rows * mean_len * kv_per_token
    ms = 1000 * bytes_per_step / (tbs * 1e12)
    return {"gpu": name, "hbm_tb_per_s": tbs, "ms_per_step": ms, "tokens_per_second": rows / (ms / 1000)}


def parity(directory: Path, device: str, dtype: str, rows: int, new: int) -> dict:
    hf = _agent(directory, device, dtype, new, "hf", False)
    static = _agent(directory, device, dtype, new, "static", False)
    prompts = _prompts(hf, rows)
    a = hf.sampler.sample(prompts, 1, greedy=True, batch_size=rows)
    b = static.sampler.sample(prompts, 1, greedy=True, batch_size=rows)
    equal, near_ties, other = 0, 0, 0
    for x, y, prompt in zip(a, b, prompts, strict=True):
        if x.response_ids == y.response_ids:
            equal += 1
            continue
        first = next(i for i, (u, v) in enumerate(zip(x.response_ids, y.response_ids, strict=False)) if u != v)
        with torch.no_grad():
            ids = torch.tensor([prompt + x.response_ids[:first]], device=hf.device)
            top = hf.model(input_ids=ids).logits[0, -1].float().topk(2).values
        if float(top[0] - top[1]) < 0.1:
            near_ties += 1
        else:
            other += 1
    return {"rows": rows, "identical": equal, "differ_at_near_tie": near_ties, "differ_otherwise": other}


def logprob_memory(directory: Path, device: str, dtype: str, rows: int, length: int) -> list[dict]:
    from hacrl.agent.logprobs import TokenBatch, token_logprobs

    agent = _agent(directory, device, dtype, 1, "hf", False)
    agent.model.train()
    vocab = agent.model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (64,), generator=g).tolist() for _ in range(rows)]
    responses = [torch.randint(0, vocab, (length - 64,), generator=g).tolist() for _ in range(rows)]
    batch = TokenBatch.build(prompts, responses, agent.pad_id, agent.device)
    out = []
    for chunk, checkpointing in ((None, False), (1024, False), (1024, True)):
        if checkpointing:
            agent.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        agent.model.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        try:
            logp = token_logprobs(agent.model, batch, 1.0, chunk_size=chunk)
            logp[batch.response_mask].mean().backward()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if device.startswith("cuda") else None
            out.append({"chunk_size": chunk, "checkpointing": checkpointing, "extra_peak_gib": peak, "ok": True})
        except torch.OutOfMemoryError:
            out.append({"chunk_size": chunk, "checkpointing": checkpointing, "extra_peak_gib": None, "ok": False,
                        "error": "out of memory"})  # fmt: skip
        logp = None
        agent.model.zero_grad(set_to_none=True)
    return out


def hacpo_step(dirs: list[Path], device: str, dtype: str, new: int, prompts: int, backend: str, work: Path) -> dict:
    """Two agents, both on `device`, one training step through the real trainer; per-phase seconds."""
    import yaml

    from hacrl.config import load_config
    from hacrl.driver.trainer import Trainer

    rows = [json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b)}) for a in range(20) for b in range(20)]
    data = work / "data.jsonl"
    data.write_text("\n".join(rows) + "\n")
    config = {
        "agents": [
            {"name": d.name, "model": str(d), "lr": 1e-6, "device": device, "dtype": dtype, "rollout_backend": backend}
            for d in dirs
        ],
        "algorithm": {"name": "hacpo"},
        "rollout": {"group_size": 8, "max_new_tokens": new, "cuda_graphs": backend == "static" and device != "cpu"},
        "data": {"source": "file", "train_file": str(data), "prompt_column": "problem"},
        "trainer": {
            "steps": 2, "prompts_per_step": prompts, "mini_batch_size": prompts * 8, "micro_batch_size": 8,
            "logprob_batch_size": 64, "logprob_chunk_size": 1024, "output_dir": str(work / f"run-{backend}"),
        },
        "eval": {"at_start": False, "max_prompts": 1},
        "logging": {"console": False, "tensorboard": False},
        "checkpoint": {"every": 1000},
    }  # fmt: skip
    path = work / f"{backend}.yaml"
    path.write_text(yaml.safe_dump(config))
    trainer = Trainer(load_config(path))
    warm_up = None
    try:
        if backend != "hf":  # compiles and captures the decode graphs; `hf` has nothing to compile
            warm_up = trainer.train_step()["time/step"]
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        metrics = trainer.train_step()
    finally:
        trainer.close()
    out = {k: metrics[k] for k in ("time/step", "time/sampling", "time/scoring", "time/update")}
    out["warm_up_step_s"] = warm_up
    out["sampling_share"] = metrics["time/sampling"] / metrics["time/step"]
    if device.startswith("cuda"):
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


KERNEL_CASES = (  # (what, rows, query heads, key/value heads, head dim, pool positions, mean filled fraction)
    ("qwen3-0.6b, 256 x 512", 256, 16, 8, 128, 256 + 512, 0.5),
    ("qwen3-0.6b, 8 rows (a compacted bucket)", 8, 16, 8, 128, 256 + 512, 0.5),
    ("qwen3-0.6b, 64 x 4096", 64, 16, 8, 128, 256 + 4096, 0.5),
    ("qwen3-4b, 16 x 4096", 16, 32, 8, 128, 1024 + 4096, 0.5),
)
KERNEL_SWEEP = [
    {"block_n": n, "num_warps": w, "num_stages": st, "target_programs": tp}
    for n in (32, 64, 128) for w, st in ((4, 2), (4, 3), (8, 3)) for tp in (1024, 4096)
]  # fmt: skip


def kernel_sweep(device: str, dtype: str, on_result=None) -> dict:
    """The decode-attention kernel alone at the sampler's shapes, for each launch setting in KERNEL_SWEEP: checked
    against the plain-torch reference first (a setting that disagrees is dropped), then timed (`_time_ms`: 20 calls
    in one CUDA graph, as the sampler runs them), as bytes of keys and values read per second. The fastest setting
    over all cases (the least sum of time relative to each case's best) becomes `attention.KERNEL_CONFIG` for the
    rest of this process: the result names it. On the CPU: the reference only (no Triton)."""
    import hacrl.agent.samplers.attention as attention

    torch_dtype = getattr(torch, dtype)
    default = dict(attention.KERNEL_CONFIG)
    configs = KERNEL_SWEEP if device == "cuda" and attention._triton_kernel() is not None else [default]
    g = torch.Generator(device=device).manual_seed(0)
    cases = []
    for what, rows, heads, kv, dim, length, fill in KERNEL_CASES:
        if device != "cuda":
            rows, length = min(rows, 4), min(length, 96)
        query = torch.randn(rows, heads, dim, device=device, dtype=torch_dtype, generator=g)
        key = torch.randn(rows, kv, length, dim, device=device, dtype=torch_dtype, generator=g)
        value = torch.randn(rows, kv, length, dim, device=device, dtype=torch_dtype, generator=g)
        lengths = torch.randint(1, int(2 * fill * length) + 1, (rows,), device=device, generator=g).clamp(max=length)
        expected = attention.reference_decode_attention(query.float(), key.float(), value.float(), lengths, 0.088)
        read = int(lengths.sum()) * kv * dim * 2 * key.element_size()
        case = {"case": what, "rows": rows, "positions": length, "mean_filled": float(lengths.float().mean()),
                "bytes_read": read, "runs": []}  # fmt: skip
        for config in configs:
            attention.KERNEL_CONFIG = dict(config)
            run = {"config": config}
            try:
                out = attention.decode_attention(query, key, value, lengths, 0.088)
                err = float((out.float() - expected).abs().max())
                if err > 5e-2:
                    run["error"] = f"max abs difference {err:.3g} from the reference"
                else:
                    call = (query, key, value, lengths, 0.088)
                    run["ms"] = _time_ms(lambda call=call: attention.decode_attention(*call), device)
                    run["gb_per_s"] = read / run["ms"] / 1e6
            except Exception as e:  # noqa: BLE001 - e.g. a setting that needs more shared memory than the SM has
                run["error"] = f"{type(e).__name__}: {str(e)[:120]}"
            case["runs"].append(run)
        cases.append(case)
        if on_result is not None:
            on_result({"cases": cases})
    scores = []
    for i in range(len(configs)):
        times = [c["runs"][i].get("ms") for c in cases]
        if None in times:
            continue
        best = [min(r["ms"] for r in c["runs"] if "ms" in r) for c in cases]
        scores.append((sum(t / b for t, b in zip(times, best, strict=True)), i))
    chosen = configs[min(scores)[1]] if scores else default
    attention.KERNEL_CONFIG = dict(chosen)
    timing = "20 calls replayed in a CUDA graph" if device == "cuda" else "wall time of eager calls"
    return {"cases": cases, "default": default, "chosen": chosen, "timing": timing}


def _time_ms(fn, device: str, warm: int = 3, timed: int = 20) -> float:
    """Milliseconds per call of `fn`: on a GPU, `timed` calls captured in one CUDA graph and replayed (as the
    sampler's captured step runs them: no Python or launch time between kernels); elsewhere wall time."""
    for _ in range(warm):
        fn()
    if device != "cuda":
        start = time.perf_counter()
        for _ in range(timed):
            fn()
        return 1000 * (time.perf_counter() - start) / timed
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # capture wants the calls' first run off the default stream
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(timed):
            fn()
    graph.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / timed


LONG_MODES = ("no-stop", "varied", "varied-calls")
"""The long part's modes: `no-stop` and `varied` as in MODES, every row in one `sample` call (the slots that
`batch_size: auto` chose stay busy: a row that ends frees its slot for a waiting one); `varied-calls` the same
varied rows in consecutive calls of that many rows (each call runs until its longest row ends: how the static
sampler worked before continuous batching, and what a sampler without it does)."""


def long_rollout(
    directory: Path,
    device: str,
    dtype: str,
    rows: int,
    new: int,
    modes: tuple[str, ...] = LONG_MODES,
    slots: int | None = None,
    on_result=None,
) -> dict:
    """`rows` responses of up to `new` tokens with `rollout.batch_size: auto` (or `slots` rows at a time): the
    static sampler (CUDA graphs on a GPU) decides the rows decoded together from the free memory; `warm_up`
    compiles and captures first (timed apart). Per mode (LONG_MODES): tokens per second, how busy the slots were
    (tokens from decode steps / slot-steps computed; each row's first token comes from its prefill), compilations
    and CUDA-graph skips, the peak memory against the card's; `on_result` after each mode (a run cut by its time
    limit keeps the modes it finished)."""
    graphs = device == "cuda"
    agent = _agent(directory, device, dtype, new, "static", graphs)
    sampler = agent.sampler
    prompts = _prompts(agent, rows)
    per_call = slots or sampler.rows_per_call(prompts)
    before = _compile_stats()
    warm_up = sampler.warm_up(per_call)
    out = {
        "rows": rows, "new_tokens": new, "rows_per_call": per_call, "pool_rows": sampler.pool.rows,
        "pool_gib": sampler.pool.bytes / 2**30, "warm_up_s": warm_up,
        "warm_up_compiled_graphs": _compile_stats().get("compiled_graphs", 0) - before.get("compiled_graphs", 0),
        "roofline": roofline(directory, device, dtype, per_call, new, 64),
    }  # fmt: skip
    if device == "cuda":
        out["card_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    for mode in modes:
        agent.stop_ids = [-1] if mode == "no-stop" else stop_set(agent.model.config.vocab_size, new)
        calls = [prompts] if mode != "varied-calls" else [prompts[i : i + per_call] for i in range(0, rows, per_call)]
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        before, stats = _compile_stats(), dict(sampler.stats)
        torch.manual_seed(1)
        start = time.perf_counter()
        lengths = []
        for batch in calls:
            lengths += [len(s.response_ids) for s in sampler.sample(batch, 1, batch_size=per_call)]
        _sync(device)
        seconds = time.perf_counter() - start
        after = _compile_stats()
        done = {k: sampler.stats[k] - stats[k] for k in stats}
        lengths.sort()
        out[mode] = {
            "calls": len(calls), "seconds": seconds, "tokens": sum(lengths),
            "tokens_per_second": sum(lengths) / seconds, "decode_steps": done["decode_steps"],
            "slot_use": (done["tokens"] - rows) / max(done["slot_steps"], 1), "refills": done["refills"],
            "lengths": {"mean": sum(lengths) / len(lengths), "p50": lengths[len(lengths) // 2],
                        "p90": lengths[(9 * len(lengths)) // 10], "max": lengths[-1]},
            "compiled_graphs": after.get("compiled_graphs", 0) - before.get("compiled_graphs", 0),
            "cudagraph_skips": after.get("cudagraph_skips", 0) - before.get("cudagraph_skips", 0),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
        }  # fmt: skip
        if on_result is not None:
            on_result(out)
    return out


def paper_step(
    directory: Path,
    device: str,
    dtype: str,
    prompts: int,
    new: int,
    work: Path,
    margin: float | None = None,
    agent_extra: dict | None = None,
) -> dict:
    """One agent of the paper's larger shape through the real trainer at the paper's structure, scaled down:
    `prompts` prompts x 8 samples x `new` new tokens, prompts up to 1,024 tokens, `static` sampler with CUDA graphs
    and `batch_size: auto`, gradient checkpointing, chunked log-probs (`logprob_chunk_size: auto`), micro-batches
    of 8, one optimizer step (mini-batch = the step). The sampler is warmed up first (compiled and captured, timed
    apart); then one step: per-phase seconds, peak memory, the update's tokens per second and model FLOPs
    utilisation (6 x parameters x the update's tokens / update seconds / the card's bf16 peak), and what
    `hacrl plan` predicted for the same config."""
    import yaml

    from hacrl.config import load_config
    from hacrl.tools.plan import plan

    config = _paper_config(directory, device, dtype, prompts, new, work, agent_extra)
    if margin is not None:
        config["rollout"]["kv_cache_margin"] = margin
    path = work / "paper.yaml"
    path.write_text(yaml.safe_dump(config))
    cfg = load_config(path)
    predicted = plan(cfg)[0]
    out = {"config": config, "plan": {"rows_per_call": predicted.rows, "peak_gib": predicted.peak / 2**30,
                                      "parts_gib": {k: v / 2**30 for k, v in predicted.parts.items()},
                                      "host_gib": sum(predicted.host.values()) / 2**30}}  # fmt: skip
    return _paper_run(cfg, out, predicted, device)


def _paper_config(directory: Path, device: str, dtype: str, prompts: int, new: int, work: Path,
                  agent_extra: dict | None = None) -> dict:  # fmt: skip
    """The paper step's config (see `paper_step`), its data file written into `work`."""
    ask = "Please reason step by step, and put your final answer within \\boxed{}."
    rows = [
        json.dumps({"problem": f"What is {a} + {b}? {ask}", "answer": str(a + b)}) for a in range(20) for b in range(20)
    ]
    data = work / "paper-data.jsonl"
    data.write_text("\n".join(rows) + "\n")
    extra = dict(agent_extra or {})
    if "devices" in extra:
        extra["devices"] = [device if d == "<device>" else d for d in extra["devices"]]
    config = {
        "agents": [{"name": directory.name, "model": str(directory), "lr": 1e-6, "device": device, "dtype": dtype,
                    "gradient_checkpointing": True, **extra}],
        "algorithm": {"name": "gspo"},  # one agent: HACPO with nobody to share with is GSPO
        "rollout": {"group_size": 8, "max_new_tokens": new, "max_prompt_tokens": 1024, "backend": "static",
                    "cuda_graphs": device == "cuda", "batch_size": "auto"},
        "data": {"source": "file", "train_file": str(data), "prompt_column": "problem"},
        "trainer": {"steps": 1, "prompts_per_step": prompts, "mini_batch_size": prompts * 8, "micro_batch_size": 8,
                    "logprob_batch_size": 32, "logprob_chunk_size": "auto", "output_dir": str(work / "run-paper")},
        "eval": {"at_start": False, "max_prompts": 1},
        "logging": {"console": False, "tensorboard": False},
        "checkpoint": {"every": 1000},
    }  # fmt: skip
    return config


def _paper_run(cfg, out: dict, predicted, device: str) -> dict:
    """One step of the paper config `cfg` (see `paper_step`), measured into `out`."""
    from hacrl.driver.trainer import Trainer

    trainer = Trainer(cfg)
    if cfg.agents[0].devices:  # a worker group: its rank samples and learns in its own process
        return _group_step(trainer, out, predicted)
    try:
        worker = trainer.schedule.transport.learners[0]
        sampler = worker.agent.sampler
        out["warm_up_s"] = sampler.warm_up()
        samples = []
        sample = sampler.sample
        sampler.sample = lambda *a, **k: samples.extend(drawn := sample(*a, **k)) or drawn  # the step's rows
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        metrics = trainer.train_step()
        params = sum(p.numel() for p in worker.agent.model.parameters())
    finally:
        trainer.close()
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    out.update({k: v for k, v in metrics.items() if "time/" in k})  # the driver's phases and the worker's
    out.update({
        "rows_per_call": sampler.pool.rows, "rows": len(samples), "params": params, "update_tokens": tokens,
        "response_tokens": sum(len(s.response_ids) for s in samples),
        "update_tokens_per_second": tokens / metrics["time/update"],
    })  # fmt: skip
    if device == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["card_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in BF16_TFLOPS.items() if k in name), None)
        if peak is not None:
            out["mfu"] = 6 * params * tokens / metrics["time/update"] / (peak * 1e12)
            out["bf16_peak_tflops"] = peak
    return out


def lag_steps(directory: Path, device: str, dtype: str, prompts: int, new: int, work: Path, steps: int = 3) -> dict:
    """Issue 59, 6: the paper-shape agent at `trainer.lag` 0 and at 1 with a sampler of its own on a second device
    (`cuda:1`; the CPU dry run: `cpu`), `steps` steps each through the trainer: each step's seconds and phases, the
    median of the steps after the first (the first fills the pipeline and compiles), and the weight sync's seconds
    (a broadcast: NCCL between the two GPUs). With one GPU: not run (the `sync` part measures the weight sync on
    one GPU), said in the result."""
    import yaml

    from hacrl.config import load_config
    from hacrl.driver.trainer import Trainer

    second = "cpu" if device == "cpu" else "cuda:1"
    if device == "cuda" and torch.cuda.device_count() < 2:
        return {"skipped": f"needs two GPUs, this machine has {torch.cuda.device_count()}"}
    out: dict = {"steps": steps, "sampler_device": second, "prompts": prompts, "new_tokens": new}
    for lag in (0, 1):
        config = _paper_config(directory, device, dtype, prompts, new, work)
        mini = prompts * 4  # two optimizer steps: the second mini-batch's proximal pass runs on the sampler
        config["trainer"].update(steps=steps, lag=lag, mini_batch_size=mini, micro_batch_size=min(8, mini))
        if lag:
            config["agents"][0]["sampler_devices"] = [second]
        config["rollout"]["cuda_graphs"] = False  # two processes capture alike; the lockstep step is the baseline
        path = work / f"lag{lag}.yaml"
        path.write_text(yaml.safe_dump(config))
        trainer = Trainer(load_config(path))
        records = []
        try:
            for step in range(1, steps + 1):
                records.append(trainer.train_step())
                trainer.step = step  # as the run loop counts them
        finally:
            trainer.close()
        name = directory.name
        out[f"lag{lag}"] = {
            "time/step": [r["time/step"] for r in records],
            "median_step_s": statistics.median(r["time/step"] for r in records[1:]),
            "weight_sync_s": [r.get(f"{name}/time/weight_sync", 0.0) for r in records],
            **{k: statistics.median(r[k] for r in records[1:]) for k in ("time/sampling", "time/update")},
        }
    out["ratio"] = out["lag1"]["median_step_s"] / out["lag0"]["median_step_s"]
    return out


PRECISIONS = {
    "pure bf16": {"master_weights": "none"},
    "fp32 masters": {},
    "fp32 masters, offloaded": {"offload": "optimizer"},
    "FSDP2 on 1 device": {"devices": ["<device>"]},
    "FSDP2 on 1 device, CPU offload": {"devices": ["<device>"], "offload": "optimizer"},
}
"""The precision part's variants of the paper step's agent (issue 41; the FSDP2 worker group of one rank, issue 43:
its rank runs in a process of its own, so its peak is read from the worker)."""


def _group_step(trainer, out: dict, predicted) -> dict:
    """`paper_step` for an agent run as a worker group: one step, its phases' seconds, and the peak device memory
    its rank 0 reports (`AgentWorker.memory`); the sampler is not warmed apart, so its compilation is in the step."""
    try:
        group = trainer.schedule.transport.learners[0]
        group.call("memory", (), "resetting the peak")
        metrics = trainer.train_step()
        memory = group.call("memory", (), "reading the peak")
    finally:
        trainer.close()
    out.update({k: v for k, v in metrics.items() if "time/" in k})
    out["params"] = predicted.shape.params
    if memory["total"]:
        out["peak_gib"], out["card_gib"] = memory["peak"] / 2**30, memory["total"] / 2**30
    return out


def _stamp(device: str) -> dict:
    import transformers

    stamp = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}
    if device.startswith("cuda"):
        stamp["gpu"] = torch.cuda.get_device_name()
        try:
            stamp["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
            ).stdout.strip()
        except OSError:
            stamp["driver"] = "unknown"
    else:
        stamp["cpu"] = f"{platform.machine()}, {torch.get_num_threads()} threads"
    return stamp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (checks the script end to end)")
    parser.add_argument("--paper-vocab", action="store_true", help="on the CPU: keep the paper's vocabularies and "
                        "the real tokenizers where present (slower; default: 4,096 ids, characters)")  # fmt: skip
    parser.add_argument("--only", nargs="*", default=list(PARTS), choices=PARTS, help="which parts, in this order")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--new", type=int, default=512)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--models", help="build the random-weight models here once, reuse them (default: a temp dir)")
    parser.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "llama-3.2-1b"], help="which model shapes")
    parser.add_argument(
        "--backends",
        nargs="+",
        default=["hf", "static", "static+graphs"],
        help="samplers to time (static+graphs: on a GPU only)",
    )
    parser.add_argument("--profile", action="store_true", help="sampling: one more call per sampler, profiled")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="sampling modes")
    parser.add_argument("--step-new", type=int, default=512, help="new tokens per response in the HACPO step")
    parser.add_argument("--step-backends", nargs="+", default=["static", "hf"], help="the HACPO step's samplers")
    parser.add_argument("--long", nargs=2, type=int, default=[256, 4096], metavar=("ROWS", "NEW"),
                        help="long: rows and new tokens (rows per call: auto)")  # fmt: skip
    parser.add_argument("--long-modes", nargs="+", choices=LONG_MODES, default=list(LONG_MODES),
                        help="long: which modes (LONG_MODES)")  # fmt: skip
    parser.add_argument("--paper", nargs=2, type=int, default=[8, 4096], metavar=("PROMPTS", "NEW"),
                        help="paper: prompts (x 8 samples) and new tokens of the Qwen3-4B-shape step")  # fmt: skip
    parser.add_argument("--paper-margin", type=float, help="paper: rollout.kv_cache_margin (default: the config's)")
    parser.add_argument("--precision-new", type=int, default=1024, help="precision: new tokens of each paper step")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        help="merge the results of parts run separately (their --out directories) into --out, instead of measuring",
    )
    parser.add_argument("--kernel-config", help="the decode-attention kernel's launch (JSON, as the kernel part "
                        "names it): gpu_check.sh passes the kernel part's choice to the parts after it")  # fmt: skip
    args = parser.parse_args(argv)
    if args.kernel_config:
        import hacrl.agent.samplers.attention as attention

        attention.KERNEL_CONFIG = {**attention.KERNEL_CONFIG, **json.loads(args.kernel_config)}
    if args.merge:
        return merge([Path(d) for d in args.merge], Path(args.out))
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    dtype = "float32" if device == "cpu" else "bfloat16"
    shapes = TINY if args.tiny or device == "cpu" else SHAPES
    if device == "cpu" and not args.paper_vocab:  # a 152k-id softmax and sort per decode step: ~80 % of the dry run
        shapes = {n: {**shape, "vocab": min(shape["vocab"], TINY_VOCAB), "char": 1} for n, shape in shapes.items()}
    rows, new = (8, 16) if device == "cpu" else (args.rows, args.new)
    logprob_rows, logprob_len = (2, 128) if device == "cpu" else (16, 4096)
    backends = [(b.split("+")[0], b.endswith("+graphs")) for b in args.backends]
    backends = [(b, graphs) for b, graphs in backends if device == "cuda" or not graphs]
    command = "python benchmarks/gpu_throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result: dict = {"command": command.strip(), "device": device, "dtype": dtype, **_stamp(device)}
    if args.kernel_config:
        result["kernel_config"] = json.loads(args.kernel_config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "gpu" if device == "cuda" else "gpu-cpu-dry-run"

    def save() -> None:  # after every part: a run stopped by a time limit keeps what it measured
        (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
        (out / f"{stem}.md").write_text(markdown(result))

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = Path(args.models) if args.models else work
        names = args.shapes
        build_device = device if device == "cuda" else "cpu"
        dirs = {n: build_agent(n, shapes[n], models, getattr(torch, dtype), build_device) for n in names}
        if "kernel" in args.only:
            result["kernel"] = {}
            result["kernel"] = kernel_sweep(device, dtype, lambda partial: (result["kernel"].update(partial), save()))
            save()
        if "sampling" in args.only:
            result["sampling"] = {}
            for n in names:
                key = n if (rows, new) == (256, 512) or device == "cpu" else f"{n} ({rows} x {new})"
                entry = result["sampling"][key] = {"rows": rows, "new_tokens": new, "backends": [], "roofline": None}
                entry["roofline"] = roofline(dirs[n], device, dtype, rows, new, 64)

                def keep(measured: dict | None, entry=entry, n=n) -> None:  # saved one by one (None: again)
                    if measured is None:
                        save()
                        return
                    entry["backends"].append(measured)
                    save()
                    print(json.dumps({n: {k: v for k, v in measured.items() if k != "profile"}}), flush=True)

                sampling(dirs[n], device, dtype, rows, new, backends, args.profile, tuple(args.modes), keep)
        if "parity" in args.only:
            result["parity"] = {}
            for n in names:
                result["parity"][n] = parity(dirs[n], device, dtype, rows, min(new, 128))
                save()
        if "logprobs" in args.only:
            result["logprobs"] = {
                "rows": logprob_rows,
                "tokens": logprob_len,
                "shape": names[0],
                "runs": logprob_memory(dirs[names[0]], device, dtype, logprob_rows, logprob_len),
            }
            save()
        if "step" in args.only:
            step_new, step_prompts = (8, 2) if device == "cpu" else (args.step_new, 32)
            result["step"] = {"new_tokens": step_new, "prompts": step_prompts}
            for b in args.step_backends:
                result["step"][b] = hacpo_step(list(dirs.values()), device, dtype, step_new, step_prompts, b, work)
                save()
        if "long" in args.only:
            long_rows, long_new, slots = (12, 96, 4) if device == "cpu" else (*args.long, None)

            def keep(partial: dict) -> None:
                result["long"] = partial
                save()

            long_rollout(dirs[names[0]], device, dtype, long_rows, long_new, tuple(args.long_modes), slots, keep)
        if "paper" in args.only:
            paper_prompts, paper_new = (2, 16) if device == "cpu" else args.paper
            paper_dir = build_agent("qwen3-4b", shapes["qwen3-4b"], models, getattr(torch, dtype), build_device)
            result["paper"] = paper_step(paper_dir, device, dtype, paper_prompts, paper_new, work, args.paper_margin)
            save()
        if "precision" in args.only:
            prompts, new = (1, 4) if device == "cpu" else (args.paper[0], args.precision_new)
            shape = "qwen3-4b-char" if device == "cpu" else "qwen3-4b"
            paper_dir = build_agent(shape, shapes[shape], models, torch.bfloat16, build_device)
            result["precision"] = {}
            for label, extra in PRECISIONS.items():
                try:
                    measured = paper_step(paper_dir, device, "bfloat16", prompts, new, work, args.paper_margin, extra)
                except Exception as e:  # noqa: BLE001 - out of memory is a result too (pure bf16 fits, masters may not)
                    measured = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
                    if device == "cuda":
                        torch.cuda.empty_cache()
                result["precision"][label] = measured
                save()
        if "lag" in args.only:
            prompts, new = (1, 4) if device == "cpu" else (args.paper[0], args.precision_new)
            shape = "qwen3-4b-char" if device == "cpu" else "qwen3-4b"
            paper_dir = build_agent(shape, shapes[shape], models, getattr(torch, dtype), build_device)
            result["lag"] = lag_steps(paper_dir, device, dtype, prompts, new, work)
            save()
    save()
    print(markdown(result))
    return 0


def merge(parts: list[Path], out: Path) -> int:
    """One gpu.json + gpu.md from the parts that got as far as writing their results."""
    result: dict = {}
    for part in parts:
        file = next((f for f in (part / "gpu.json", part / "gpu-cpu-dry-run.json") if f.is_file()), None)
        if file is None:
            continue
        data = json.loads(file.read_text())
        commands = result.get("command", "")
        for key, value in data.items():  # parts may measure different models of one section
            if key == "sampling" and isinstance(result.get(key), dict):
                for model, entry in value.items():  # parts may measure other samplers of one model
                    if model in result[key]:
                        result[key][model]["backends"] += entry["backends"]
                        result[key][model]["roofline"] = result[key][model]["roofline"] or entry["roofline"]
                    else:
                        result[key][model] = entry
            elif isinstance(value, dict) and isinstance(result.get(key), dict):
                result[key] = {**result[key], **value}
            else:
                result[key] = value
        result["command"] = "; ".join(c for c in (commands, data["command"]) if c)
    if not result:
        print("no part wrote results")
        return 1
    out.mkdir(parents=True, exist_ok=True)
    stem = "gpu" if result["device"] == "cuda" else "gpu-cpu-dry-run"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}.md").write_text(markdown(result))
    return 0


def markdown(r: dict) -> str:
    lines = ["# GPU check: samplers, the decode kernel, log-prob memory, training steps", ""]
    machine = r.get("gpu") or r.get("cpu")
    lines.append(f"Device: {machine} ({r['device']}, {r['dtype']}); torch {r['torch']}, transformers "
                 f"{r['transformers']}" + (f", driver {r['driver']}" if "driver" in r else "") + ".")  # fmt: skip
    lines += [f"Command: `{r['command']}`.", ""]
    for note in r.get("notes", []):
        lines += [note, ""]
    if "sampling" in r:
        lines += ["## Sampling", "",
                  "Random weights. `no-stop`: every row runs to the length limit. `varied`: a fixed random set of "
                  f"vocabulary ids stops rows (~geometric lengths, mean ~{VARIED_MEAN_FRACTION:g} x new tokens): "
                  "tokens/s counts real tokens. Warm-up: the first call (compiles, captures); recompiles and skips "
                  "after it: in the timed call.", "",
                  "| model | rows x new | mode | backend | tokens/s | ms per step | warm-up s | graphs compiled "
                  "| recompiles after warm-up | CUDA-graph skips (warm-up / after) | peak GiB "
                  "| length mean / p50 / p90 / at limit |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for model, s in r["sampling"].items():
            for b in s["backends"]:
                timed = b.get("calls", {}).get("timed", {})
                n = timed.get("lengths")
                lengths = f"{n['mean']:.0f} / {n['p50']} / {n['p90']} / {100 * n['at_limit']:.0f} %" if n else "-"
                peak = timed.get("peak_gib")
                lines.append(f"| {model} | {s['rows']} x {s['new_tokens']} | {b.get('mode', 'no-stop')} | "
                             f"{b['backend']} | {b['tokens_per_second']:,.0f} | {b['ms_per_step']:.1f} | "
                             f"{b.get('first_call_s', float('nan')):.1f} | {b.get('compiled_graphs', '-')} | "
                             f"{b.get('recompiles_after_warm_up', '-')} | {b.get('cudagraph_skips', '-')} / "
                             f"{b.get('cudagraph_skips_after_warm_up', '-')} | "
                             f"{'-' if peak is None else f'{peak:.1f}'} | {lengths} |")  # fmt: skip
            if s["roofline"]:
                f = s["roofline"]
                lines.append(f"| {model} | | no-stop | HBM roofline ({f['hbm_tb_per_s']} TB/s) | "
                             f"{f['tokens_per_second']:,.0f} | {f['ms_per_step']:.2f} | | | | | | |")  # fmt: skip
        lines.append("")
    for model, s in r.get("sampling", {}).items():
        for b in s["backends"]:
            if "profile" not in b:
                continue
            pr = b["profile"]
            lines += [f"### Profile: {model}, {b['backend']}: {pr['wall_ms_per_step']:.2f} ms per decode step, "
                      f"the device busy {pr['busy_ms_per_step']:.2f} ms of it", "",
                      "| operator | calls per step | ms per step |", "|---|---|---|"]  # fmt: skip
            lines += [f"| `{t['op']}` | {t['calls_per_step']:.1f} | {t['ms_per_step']:.3f} |" for t in pr["top"]]
            lines.append("")
    if "parity" in r:
        lines += ["## Greedy parity, static vs hf", "", "| model | rows | identical | differ at a near-tie | differ |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for model, p in r["parity"].items():
            lines.append(f"| {model} | {p['rows']} | {p['identical']} | {p['differ_at_near_tie']} | "
                         f"{p['differ_otherwise']} |")  # fmt: skip
        lines.append("")
    if "logprobs" in r:
        lp = r["logprobs"]
        shape = lp.get("shape", "qwen3-0.6b")
        lines += [f"## Log-probs + backward, {lp['rows']} x {lp['tokens']} tokens ({shape} shape)", "",
                  "| logits | extra peak |", "|---|---|"]  # fmt: skip
        for run in lp["runs"]:
            what = "full" if run["chunk_size"] is None else f"chunks of {run['chunk_size']}"
            if run.get("checkpointing"):
                what += " + gradient checkpointing"
            peak = (
                "out of memory"
                if not run["ok"]
                else ("n/a (CPU)" if run["extra_peak_gib"] is None else f"{run['extra_peak_gib']:.1f} GiB")
            )
            lines.append(f"| {what} | {peak} |")
        lines.append("")
    if "step" in r:
        st = r["step"]
        lines += [f"## One 2-agent HACPO step ({st['prompts']} prompts x 8, {st['new_tokens']} new tokens)", "",
                  "| sampler | step s | sampling s | scoring s | update s | sampling share | peak GiB "
                  "| warm-up step s |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for backend in ("hf", "static"):
            if backend not in st:
                continue
            t = st[backend]
            peak = f"{t['peak_gib']:.1f}" if "peak_gib" in t else "-"
            warm = "-" if t.get("warm_up_step_s") is None else f"{t['warm_up_step_s']:.2f}"
            lines.append(f"| {backend} | {t['time/step']:.2f} | {t['time/sampling']:.2f} | {t['time/scoring']:.2f} | "
                         f"{t['time/update']:.2f} | {100 * t['sampling_share']:.0f} % | {peak} | {warm} |")  # fmt: skip
        lines.append("")
    lines += _markdown_kernel(r.get("kernel")) + _markdown_long(r.get("long")) + _markdown_paper(r.get("paper"))
    lines += _markdown_precision(r.get("precision")) + _markdown_lag(r.get("lag"))
    return "\n".join(lines) + "\n"


def _markdown_lag(lag: dict | None) -> list[str]:
    if not lag:
        return []
    lines = ["## The paper step beside a sampler of its own (issue 59: trainer.lag 0 and 1)", ""]
    if "skipped" in lag:
        return [*lines, f"Not run: {lag['skipped']}.", ""]
    lines += [f"{lag['prompts']} prompts x 8 x {lag['new_tokens']} new tokens, {lag['steps']} steps each, the sampler "
              f"on {lag['sampler_device']}; medians of the steps after the first.", "",
              "| lag | step s | sampling s | update s | weight sync s (each step) |",
              "|---|---|---|---|---|"]  # fmt: skip
    for k in (0, 1):
        run = lag[f"lag{k}"]
        sync = ", ".join(f"{x:.3f}" for x in run["weight_sync_s"])
        lines.append(f"| {k} | {run['median_step_s']:.2f} | {run['time/sampling']:.2f} | {run['time/update']:.2f} | "
                     f"{sync} |")  # fmt: skip
    return [*lines, "", f"lag 1 / lag 0: {lag['ratio']:.2f}x the step.", ""]


def _config_name(c: dict) -> str:
    return f"block {c['block_n']}, {c['num_warps']} warps, {c['num_stages']} stages, {c['target_programs']} programs"


def _markdown_kernel(k: dict | None) -> list[str]:
    if not k or "chosen" not in k:
        return []
    lines = ["## Decode-attention kernel alone", "",
             f"Default launch: {_config_name(k['default'])}; the fastest over all cases, used for the parts after "
             f"this one: **{_config_name(k['chosen'])}**. GB/s: keys and values of the filled positions read per "
             f"second; timing: {k.get('timing', 'eager calls (host time included)')}.", "",
             "| case | mean filled positions | default ms | default GB/s | chosen ms | chosen GB/s "
             "| best for this case | its ms |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in k["cases"]:
        by = {json.dumps(r["config"], sort_keys=True): r for r in c["runs"]}
        default = by.get(json.dumps(k["default"], sort_keys=True), {})
        chosen = by.get(json.dumps(k["chosen"], sort_keys=True), {})
        timed = [r for r in c["runs"] if "ms" in r]
        best = min(timed, key=lambda r: r["ms"]) if timed else {}
        cell = lambda r, key, f: f.format(r[key]) if key in r else "-"  # noqa: E731
        lines.append(f"| {c['case']} | {c['mean_filled']:.0f} | {cell(default, 'ms', '{:.3f}')} | "
                     f"{cell(default, 'gb_per_s', '{:,.0f}')} | {cell(chosen, 'ms', '{:.3f}')} | "
                     f"{cell(chosen, 'gb_per_s', '{:,.0f}')} | {_config_name(best['config']) if best else '-'} | "
                     f"{cell(best, 'ms', '{:.3f}')} |")  # fmt: skip
    failed = sorted(
        {_config_name(r["config"]) + ": " + r["error"] for c in k["cases"] for r in c["runs"] if "error" in r}
    )
    if failed:
        lines += ["", "Settings that failed: " + "; ".join(failed[:6])]
    return lines + [""]


def _markdown_long(g: dict | None) -> list[str]:
    if not g:
        return []
    roof = g.get("roofline")
    roof = "-" if not roof else format(roof["tokens_per_second"], ",.0f")
    lines = [f"## Long responses: {g['rows']} x up to {g['new_tokens']} new tokens, `batch_size: auto`", "",
             f"{g['rows_per_call']} rows decoded together (auto), pool {g['pool_gib']:.1f} GiB, warm-up "
             f"{g['warm_up_s']:.1f} s ({g.get('warm_up_compiled_graphs', '-')} compiled), HBM roofline at that many "
             f"rows with every row at the limit: {roof} tokens/s. `varied-calls`: the same varied rows in "
             "consecutive calls (each runs to its longest row: no continuous batching).", "",
             "| mode | calls | tokens | mean / p90 / max length | seconds | tokens/s | slot use | refills "
             "| compiled / CUDA-graph skips | peak |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for mode in LONG_MODES:
        m = g.get(mode)
        if not m:
            continue
        n = m["lengths"]
        peak = f"{m['peak_gib']:.1f} of {g['card_gib']:.1f} GiB" if m.get("peak_gib") is not None else "-"
        lines.append(f"| {mode} | {m['calls']} | {m['tokens']:,} | {n['mean']:.0f} / {n['p90']} / {n['max']} | "
                     f"{m['seconds']:.1f} | {m['tokens_per_second']:,.0f} | {100 * m['slot_use']:.0f} % | "
                     f"{m['refills']} | {m['compiled_graphs']} / {m['cudagraph_skips']} | {peak} |")  # fmt: skip
    return lines + [""]


def _markdown_paper(p: dict | None) -> list[str]:
    if not p or "time/step" not in p:
        return []
    t, c = p["config"]["trainer"], p["config"]["rollout"]
    plan = p["plan"]
    peak = f"{p['peak_gib']:.1f} of {p['card_gib']:.1f} GiB" if "peak_gib" in p else "-"
    mfu = f"{100 * p['mfu']:.1f} %" if "mfu" in p else "-"
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in p.items() if "time/" in k)
    return [f"## One paper-shape step: Qwen3-4B shape, {t['prompts_per_step']} prompts x {c['group_size']} x "
            f"{c['max_new_tokens']} new tokens, one agent (GSPO)", "",
            "| warm-up s | step s | sampling s | update s | rows per call | update tokens | update tokens/s | MFU "
            "| peak | `hacrl plan` peak | plan's rows per call |", "|---|---|---|---|---|---|---|---|---|---|---|",
            f"| {p['warm_up_s']:.1f} | {p['time/step']:.1f} | {p['time/sampling']:.1f} | {p['time/update']:.1f} | "
            f"{p['rows_per_call']} | {p['update_tokens']:,} | {p['update_tokens_per_second']:,.0f} | {mfu} | {peak} | "
            f"{plan['peak_gib']:.1f} GiB | {plan['rows_per_call']} |", "", f"Phases: {phases}.", ""]  # fmt: skip


def _markdown_precision(variants: dict | None) -> list[str]:
    if not variants:
        return []
    lines = ["## Precision: the paper step as each kind of agent (issues 41, 43)", "",
             "| agent | step s | update s | offload s | peak device | `hacrl plan` device peak | plan's host memory |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, p in variants.items():
        if "error" in p:
            lines.append(f"| {label} | {p['error']} | | | | | |")
            continue
        peak = f"{p['peak_gib']:.1f} of {p['card_gib']:.1f} GiB" if "peak_gib" in p else "-"
        offload = p.get("time/offload")
        lines.append(f"| {label} | {p['time/step']:.1f} | {p['time/update']:.1f} | "
                     f"{'-' if offload is None else f'{offload:.2f}'} | {peak} | {p['plan']['peak_gib']:.1f} GiB | "
                     f"{p['plan']['host_gib']:.1f} GiB |")  # fmt: skip
    return lines + [""]


if __name__ == "__main__":
    raise SystemExit(main())
