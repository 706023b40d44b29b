"""A LoRA agent against the same agent fully trained: step time, peak memory and optimizer state (issue 27).

    python benchmarks/lora.py                  # CPU: a 13M-parameter Qwen2-shaped agent, 3 timed GSPO steps each
    python benchmarks/lora.py --device cuda    # the same on a GPU (peak from torch.cuda.max_memory_allocated)

Modes: full fine-tuning; LoRA (r 16, every projection) sampling through the unmerged adapters; LoRA sampling from a
merged copy (`lora.merge_for_sampling`). Each mode runs in its own process (a clean peak): the real trainer path
(`Trainer.train_step`), one agent, GSPO, 16 prompts x 4 samples, 24 new tokens. Reported per mode: the median step
time after one warm-up step and the update's share; the process's peak resident memory (CPU) or the device's peak
allocation (GPU); the bytes of AdamW state and of the trainable parameters, counted from the tensors. Writes
benchmarks/results/lora-<device>.md and .json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    "full": None,
    "lora r=16": {"r": 16, "alpha": 32.0},
    "lora r=16, merged sampling": {"r": 16, "alpha": 32.0, "merge_for_sampling": True},
}


def build_agent(out: Path) -> Path:
    """A Qwen2-shaped agent big enough that optimizer state matters (hidden 384, 6 layers, BPE vocabulary)."""
    from hacrl.tools.testbed.models import bpe_tokenizer, save_agent, tiny_model

    corpus = [f"{a} + {b} = {a + b}" for a in range(100) for b in range(0, 100, 7)]
    tok = bpe_tokenizer(corpus, 200)
    return save_agent(tiny_model("qwen2", tok, hidden=384, layers=6, heads=6, kv_heads=2, seed=0), tok, out)


def run_mode(model: str, lora: str, device: str, steps: int) -> dict:
    """One mode, in this process: `steps` training steps; times, peak memory, optimizer and trainable bytes."""
    import resource

    import torch

    from hacrl.config import load_config
    from hacrl.driver.trainer import Trainer

    torch.set_num_threads(2)
    run = Path(tempfile.mkdtemp()) / "run"
    overrides = [
        f"agents=[{{name: a, model: {model}, lr: 1e-4, device: {device}}}]", "algorithm.name=gspo",
        "data.task=basic_arithmetic", "data.task_options={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2}",
        "data.train_size=256", "data.eval_size=8", "data.heldout_size=8", "rollout.group_size=4",
        "rollout.max_new_tokens=24", "rollout.max_prompt_tokens=64", "trainer.prompts_per_step=16",
        "trainer.mini_batch_size=32", "trainer.micro_batch_size=16", f"trainer.steps={steps}",
        f"trainer.output_dir={run}", "eval.at_start=false", "logging.console=false", "logging.tensorboard=false",
        "checkpoint.every=0",
    ]  # fmt: skip
    if lora != "null":
        overrides.append(f"agents.0.lora={lora}")
    trainer = Trainer(load_config(None, overrides))
    agent = trainer.schedule.transport.learners[0].agent
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times, updates = [], []
    try:
        for step in range(steps):
            metrics = trainer.train_step()
            trainer.step += 1
            if step:
                times.append(metrics["time/step"])
                updates.append(metrics["time/update"])
        state = sum(t.numel() * t.element_size() for s in agent.optimizer.state.values() for t in s.values()
                    if torch.is_tensor(t))  # fmt: skip
        trainable = sum(p.numel() * p.element_size() for p in agent.model.parameters() if p.requires_grad)
        params = sum(p.numel() for p in agent.model.parameters())
        peak = (torch.cuda.max_memory_allocated() if device.startswith("cuda")
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # fmt: skip
    finally:
        trainer.close()
    return {"step_s": statistics.median(times), "update_s": statistics.median(updates), "peak_bytes": peak,
            "optimizer_state_bytes": state, "trainable_bytes": trainable, "parameters": params}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=4, help="training steps per mode (the first is warm-up)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "LORA"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_mode(args.one[0], args.one[1], args.device, args.steps)))
        return 0
    model = build_agent(Path(tempfile.mkdtemp()) / "agent")
    rows = {}
    for mode, lora in MODES.items():
        spec = json.dumps(lora) if lora else "null"
        command = [
            sys.executable,
            __file__,
            "--one",
            str(model),
            spec,
            "--device",
            args.device,
            "--steps",
            str(args.steps),
        ]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
        if done.returncode:
            raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
        rows[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        print(mode, rows[mode], flush=True)
    import torch

    machine = {"device": args.device, "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
               "python": platform.python_version()}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"lora-{args.device}.json").write_text(json.dumps({"machine": machine, "modes": rows}, indent=2) + "\n")
    mib = 2**20
    lines = [
        f"# LoRA against full fine-tuning ({args.device}; torch {machine['torch']})", "",
        f"One agent ({rows['full']['parameters'] / 1e6:.1f}M parameters), GSPO, 16 prompts x 4, 24 new tokens; "
        f"median of {args.steps - 1} steps after a warm-up. `python benchmarks/lora.py`.", "",
        "| mode | step (s) | update (s) | peak memory (MiB) | AdamW state (MiB) | trainable (MiB) |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for mode, r in rows.items():
        lines.append(f"| {mode} | {r['step_s']:.2f} | {r['update_s']:.2f} | {r['peak_bytes'] / mib:.0f} | "
                     f"{r['optimizer_state_bytes'] / mib:.2f} | {r['trainable_bytes'] / mib:.2f} |")  # fmt: skip
    (out / f"lora-{args.device}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
