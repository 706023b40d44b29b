"""The update of one agent on one device vs the same agent as a 2-rank worker group (FSDP2, gloo) on this CPU.

One learner's update of a fixed pool (its own sampled responses; GSPO), timed in the worker (`Learned.update_s`): K =
1 with 1 and 2 torch threads, and K = 2 with one thread per rank (2 cores: one each). The model is a randomly
initialised Qwen2-shape model large enough that the update is compute-bound (default ~25M parameters). The pool is
the same for every setting (sampled once on one device); each setting repeats the update `--repeats` times from the
same starting weights (after one warm-up update) and reports the median. Also the largest weight difference between
the K = 2 and the K = 1 update (float summation order only).

    python benchmarks/worker_groups.py [--hidden 512 --layers 6 --rows 64 --tokens 96 --repeats 3]

Writes benchmarks/results/worker-groups-cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _build(out: Path, hidden: int, layers: int) -> Path:
    from tests.conftest import sum_corpus

    from hacrl.tools.testbed.models import bpe_tokenizer, save_agent, tiny_model

    tokenizer = bpe_tokenizer(sum_corpus() * 4, 2000)
    model = tiny_model("qwen2", tokenizer, hidden=hidden, layers=layers, heads=8, kv_heads=4, seed=0)
    return save_agent(model, tokenizer, out / "agent")


def _specs(model: Path, out: Path, args):
    from hacrl.config import load_config
    from hacrl.messages import WorkerSpec

    prompts = args.rows // 8
    cfg = {
        "agents": [{"name": "a", "model": str(model), "lr": 1e-4}],
        "algorithm": {"name": "gspo"},
        "rollout": {"group_size": 8, "max_new_tokens": args.tokens, "max_prompt_tokens": 64},
        "data": {"task": "chain_sum", "train_size": 16, "eval_size": 8},
        "trainer": {"steps": 1, "prompts_per_step": prompts, "mini_batch_size": args.rows // 2,
                    "micro_batch_size": 8, "output_dir": str(out / "run")},
    }  # fmt: skip
    (out / "c.yaml").write_text(yaml.safe_dump(cfg))
    config = load_config(out / "c.yaml")
    return WorkerSpec(0, config.agents[0], config.rollout, config.trainer, config.algorithm, torch_threads=1), prompts


def _rank(rank, spec, rollout, call, init, repeats, out):
    from hacrl.agent.distributed import RankInfo, full_state_dict
    from hacrl.agent.worker import AgentWorker

    worker = AgentWorker(spec, rank=RankInfo(rank, 2, init, "cpu"))
    seconds = _timed_updates(worker, rollout, call, repeats)
    state = full_state_dict(worker.agent.model, worker.agent.sampling_model, worker.agent.device, keep=rank == 0)
    if rank == 0:
        torch.save({"seconds": seconds, "state": state}, out)


def _timed_updates(worker, rollout, call, repeats: int) -> list[float]:
    """`repeats` updates of `rollout` from the worker's starting weights and a fresh AdamW, after one warm-up
    (FSDP's lazy init, the allocator) that is not counted; each one's seconds."""
    start = {n: p.detach().clone() for n, p in worker.agent.model.named_parameters()}
    seconds = []
    for _ in range(repeats + 1):
        with torch.no_grad():
            for n, p in worker.agent.model.named_parameters():
                p.copy_(start[n])
        worker.agent.optimizer.state.clear()
        worker._rollout = rollout
        seconds.append(worker.learn(call).update_s)
    return seconds[1:]


def _one(spec, rollout, call, repeats, threads):
    from hacrl.agent.worker import AgentWorker

    worker = AgentWorker(replace(spec, torch_threads=threads))
    seconds = _timed_updates(worker, rollout, call, repeats)
    return seconds, {n: p.detach().clone() for n, p in worker.agent.model.named_parameters()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--rows", type=int, default=64, help="responses in the pool (a multiple of 16)")
    parser.add_argument("--tokens", type=int, default=96, help="max new tokens per response")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)

    from hacrl.agent.distributed import free_port
    from hacrl.agent.worker import AgentWorker
    from hacrl.messages import LearnCall, SampleCall

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = _build(tmp, args.hidden, args.layers)
        spec, prompts = _specs(model, tmp, args)
        sampler = AgentWorker(replace(spec, torch_threads=2))
        params = sum(p.numel() for p in sampler.agent.model.parameters())
        call = SampleCall(1, [[{"role": "user", "content": f"{i} + {i + 3} ="}] for i in range(prompts)], 8)
        sampler.sample(call)
        rollout = sampler._rollout
        tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in rollout.samples)
        learn = LearnCall(1, [float(i % 2) for i in range(args.rows)], [], [0.5])
        results = {}
        for threads in (1, 2):
            seconds, weights = _one(spec, rollout, learn, args.repeats, threads)
            results[f"K=1, {threads} thread{'s' * (threads > 1)}"] = seconds
        group_spec = replace(spec, agent=replace(spec.agent, devices=["cpu", "cpu"]))
        out = tmp / "rank0.pt"
        init = f"tcp://127.0.0.1:{free_port()}"
        torch.multiprocessing.start_processes(_rank, (group_spec, rollout, learn, init, args.repeats, str(out)),
                                              nprocs=2, start_method="spawn")  # fmt: skip
        got = torch.load(out, weights_only=True)
        results["K=2, 1 thread per rank"] = got["seconds"]
        worst = max(float((got["state"][n] - w).abs().max()) for n, w in weights.items())

    table = {name: statistics.median(s) for name, s in results.items()}
    base = table["K=1, 2 threads"]
    lines = [
        "# One agent's update: one device vs a 2-rank worker group (FSDP2, gloo), CPU",
        "",
        f"Model: Qwen2 shape, hidden {args.hidden}, {args.layers} layers, {params / 1e6:.1f}M parameters, float32. "
        f"Pool: {args.rows} own responses ({tokens} tokens with prompts), 2 optimizer steps, micro-batches of 8. "
        f"Median of {args.repeats} updates from the same weights; {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}.",
        "",
        "| setting | update seconds (median) | vs K=1, 2 threads |",
        "| --- | ---: | ---: |",
        *(f"| {name} | {value:.2f} | {value / base:.2f}x |" for name, value in table.items()),
        "",
        f"Largest weight difference, K = 2 vs K = 1 after the update: {worst:.2e} (lr 1e-4; float summation order).",
        "",
        f"Reproduce: `python benchmarks/worker_groups.py --hidden {args.hidden} --layers {args.layers} --rows "
        f"{args.rows} --tokens {args.tokens} --repeats {args.repeats}`",
    ]
    text = "\n".join(lines)
    print(text)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "worker-groups-cpu.md").write_text(text + "\n")
    (out_dir / "worker-groups-cpu.json").write_text(json.dumps({
        "args": vars(args), "parameters": params, "tokens": tokens, "seconds": results, "median": table,
        "max_weight_difference": worst, "torch": torch.__version__, "when": time.strftime("%Y-%m-%d %H:%M"),
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
