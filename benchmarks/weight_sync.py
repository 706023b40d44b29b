"""The weight sync of a sampler of its own (issue 59, 6): seconds to hand a model's weights from the learner to its
sampler through each path hacrl has, on the paper's model shape.

    python benchmarks/weight_sync.py --device cuda --shape qwen3-4b     # on a GPU machine (benchmarks/gpu_check.sh,
                                                                        # part `sync`)
    python benchmarks/weight_sync.py --tiny                             # the CPU dry run (tests)

Paths (`hacrl/agent/weightsync.py`), each `--repeats` times, the median:
    shared    SharedMemoryLink.send (the learner's parameters into host shared memory) + receive (into the sampler's
              model on the same device): the local backend's path
    handed    HandedLink.send (a host copy) + receive: Ray's path, less the object store's transfer
    device    a same-device copy of every parameter (what CUDA IPC or a device-to-device broadcast would cost at
              best): the floor the host paths are measured against
Writes weight-sync.md / weight-sync.json into --out (default benchmarks/results; the dry run: weight-sync-cpu.*).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def build(shape: dict, dtype: torch.dtype, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    config = (Qwen3Config if shape["family"] == "qwen3" else LlamaConfig)(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv"], head_dim=shape["head_dim"],
        intermediate_size=shape["ffn"], tie_word_embeddings=True,
    )  # fmt: skip
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).requires_grad_(False)


def timed(fn, repeats: int, device: str) -> float:
    runs = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def measure(shape_name: str, shape: dict, device: str, dtype: torch.dtype, repeats: int) -> dict:
    from hacrl.agent.weightsync import HandedLink, SharedMemoryLink

    learner, sampler = build(shape, dtype, device), build(shape, dtype, device)
    params = sum(p.numel() for p in learner.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in learner.parameters())
    out = {"shape": shape_name, "device": device, "dtype": str(dtype).removeprefix("torch."), "parameters": params,
           "bytes": nbytes}  # fmt: skip
    try:
        channel = SharedMemoryLink(learner, "learner")
        version = iter(range(1, 10**6))

        def shared() -> None:
            v = next(version)
            channel.send(learner, v)
            channel.receive(sampler, v)

        out["shared_s"] = timed(shared, repeats, device)
    except (RuntimeError, OSError) as e:  # /dev/shm too small for two slots of the weights
        out["shared_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    handed = HandedLink(learner, "learner")

    def hand() -> None:
        handed.receive(sampler, 1, handed.send(learner, 1))

    out["handed_s"] = timed(hand, repeats, device)
    pairs = list(zip(learner.parameters(), sampler.parameters(), strict=True))
    out["device_s"] = timed(lambda: [b.copy_(a) for a, b in pairs], repeats, device)
    assert all(torch.equal(a, b) for a, b in pairs)
    return out


def render(result: dict) -> str:
    r = result["row"]
    gb = r["bytes"] / 1e9

    def cell(key: str) -> str:
        if key not in r:
            return r.get(key.replace("_s", "_error"), "-")
        return f"{r[key]:.3f} s ({gb / r[key]:.1f} GB/s)"

    return "\n".join([
        "# The weight sync of a sampler of its own", "",
        f"Machine: {result['machine']}. Command: `python benchmarks/weight_sync.py {' '.join(result['argv'])}`. "
        f"{r['shape']} shape, {r['parameters'] / 1e9:.2f} B parameters, {r['dtype']} on {r['device']}: {gb:.2f} GB "
        f"per sync; median of {result['repeats']} (publish + take; GB/s of the weights' bytes).", "",
        "| path | seconds per sync |", "|---|---|",
        f"| shared memory (local backend) | {cell('shared_s')} |",
        f"| handed host copy (Ray, without the object store's transfer) | {cell('handed_s')} |",
        f"| same-device copy (the floor) | {cell('device_s')} |", "",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from gpu_throughput import SHAPES, TINY

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="the CPU dry run: the shape's tiny stand-in")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    shape = dict((TINY if args.tiny else SHAPES)[args.shape], vocab=4096 if args.tiny else SHAPES[args.shape]["vocab"])
    row = measure(args.shape, shape, args.device, getattr(torch, args.dtype), args.repeats)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else f"{platform.machine()} CPU"
    result = {"machine": f"{gpu}, torch {torch.__version__}", "argv": argv if argv is not None else sys.argv[1:],
              "repeats": args.repeats, "row": row}  # fmt: skip
    stem = "weight-sync-cpu" if args.tiny else "weight-sync"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = render(result)
    (args.out / f"{stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
