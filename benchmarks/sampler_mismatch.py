"""The sampler-learner mismatch on the real model (issue 74, part 3): how far the log-probs vLLM reports for the
tokens it drew are from the learner's own pass over the same tokens with the same weights, in float32 and bfloat16,
and what that does to the weights `trainer.old_logprobs: corrected` gives each own row and to the sums other
learners divide by.

    make setup-vllm && .venv-vllm/bin/python benchmarks/sampler_mismatch.py

SmolLM2-135M-Instruct (from the package registry), `--prompts` arithmetic prompts x 8 answers of up to
`--tokens` tokens at temperature 1, top-p 1, sampled by vLLM through hacrl's sampling role (the agent's dtype in
vLLM and in the learner), then the learner's teacher-forced pass (`SamplingRole.old_logprobs`, what
`recompute` computes). Per token: |vLLM - learner|; per answer: the sequence weight `corrected` gives it,
w = min(exp(mean_t learner - mean_t vLLM), 2), and the difference of the answer's log-prob sum (the denominator
another learner's foreign ratio takes: vLLM's under `corrected`, the learner pass's under `recompute`).
Writes benchmarks/results/sampler_mismatch.md and .json (`--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from vllm_sampling import model_dir, worker, write_results  # noqa: E402 - shared with the sampling benchmark


def measure(directory: Path, tmp: Path, dtype: str, prompts: int, tokens: int) -> dict:
    import torch

    from hacrl.messages import SampleCall

    w = worker(directory, tmp, "vllm", prompts * 8, tokens, dtype)
    questions = [[{"role": "user", "content": f"What is {i} + {3 * i + 11}? Put the answer in \\boxed{{}}."}]
                 for i in range(prompts)]  # fmt: skip
    w.sample(SampleCall(1, questions, 8))
    samples = [s for s in w._rollout.samples if s.response_ids]
    learner = w.sampling.old_logprobs(samples)
    gaps, weights, sums = [], [], []
    for s, mine in zip(samples, learner, strict=True):
        vllm = torch.tensor(s.logprobs, dtype=torch.float32)
        gaps.append((mine - vllm).abs())
        weights.append(min(float(torch.exp(mine.mean() - vllm.mean())), 2.0))
        sums.append(float(mine.sum() - vllm.sum()))
    tokens_gap = torch.cat(gaps)
    return {
        "dtype": dtype, "answers": len(samples), "tokens": int(tokens_gap.numel()),
        "token_gap_mean": float(tokens_gap.mean()), "token_gap_p99": float(tokens_gap.quantile(0.99)),
        "token_gap_max": float(tokens_gap.max()),
        "weight_mean": statistics.fmean(weights), "weight_min": min(weights), "weight_max": max(weights),
        "weight_off_5pct": sum(abs(x - 1) > 0.05 for x in weights) / len(weights),
        "sum_gap_mean_abs": statistics.fmean(abs(x) for x in sums), "sum_gap_max_abs": max(abs(x) for x in sums),
    }  # fmt: skip


def render(rows: list[dict], info: dict) -> str:
    lines = ["# The sampler-learner mismatch on the real model (vLLM, CPU)", "",
             f"`{info['command']}` on {info['machine']} ({info['cpus']} CPUs), vLLM {info['vllm']}, torch "
             f"{info['torch']}: SmolLM2-135M-Instruct, {info['prompts']} prompts x 8 answers of up to "
             f"{info['tokens']} tokens, temperature 1, top-p 1. vLLM's log-prob of each token it drew against the "
             "learner's teacher-forced pass with the same weights (`recompute`'s); w: the weight `corrected` gives "
             "the answer, min(exp(mean learner - mean vLLM), 2); sum gap: the difference of the answer's log-prob "
             "sum, the denominator of another learner's foreign ratio.", "",
             "| dtype | answers | tokens | mean token gap | p99 | max | w mean | w min | w max | w off by > 5 % "
             "| mean abs sum gap | max |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['answers']} | {r['tokens']} | {r['token_gap_mean']:.2e} | {r['token_gap_p99']:.2e} "
            f"| {r['token_gap_max']:.2e} | {r['weight_mean']:.4f} | {r['weight_min']:.4f} | {r['weight_max']:.4f} "
            f"| {100 * r['weight_off_5pct']:.1f} % | {r['sum_gap_mean_abs']:.3f} | {r['sum_gap_max_abs']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "sampler_mismatch.json")
    args = parser.parse_args(argv)
    import torch
    import vllm

    cache = Path(os.environ.get("HACRL_CACHE", HERE.parent / ".cache"))
    directory = model_dir(cache)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtypes:
            results.append(measure(directory, Path(tmp), dtype, args.prompts, args.tokens))
            print(json.dumps(results[-1]), flush=True)
    info = {"command": "python benchmarks/sampler_mismatch.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "vllm": vllm.__version__,
            "torch": torch.__version__, "prompts": args.prompts, "tokens": args.tokens}  # fmt: skip
    write_results(args.out, info, results, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
