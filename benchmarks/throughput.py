"""Seconds per training step: hacrl against TRL's GRPOTrainer configured as GSPO, on the same work.

    pip install "hacrl[bench]"                       # TRL (optional; never needed by the library or the tests)
    python benchmarks/throughput.py                  # 6 alternated rounds of hacrl / TRL, 2 rounds of the HACPO rows
    python benchmarks/throughput.py --smoke          # hacrl only, 2 steps (what make test runs)

The same 1.06M-parameter Llama on a character tokenizer (built here, offline, random weights: every completion
runs to the length limit, so the work is fixed), the same 512 prompts (`Q:<a>+<b>=\\nA:`), the same reward (1 when
the completion contains the sum), 32 prompts x 8 completions of 32 new tokens per step, sampling at T = 1, GSPO's
sequence-level ratio and clip (3e-4 / 4e-4), no KL, lr 1e-5, micro-batches of 64 and one optimizer step per
generation, torch on 2 threads. Each (system, round) is its own process: 3 warm-up steps, then `--steps` measured
steps; per step the wall time, per process the start-up time (process start to the first step), peak RSS and the
work per step (completions, generated tokens, optimizer steps: checked equal across systems). Rows:

    hacrl gspo       hacrl, algorithm gspo, one agent
    trl gspo         TRL GRPOTrainer(importance_sampling_level="sequence", loss_type="grpo", epsilon 3e-4 / 4e-4)
    hacrl hacpo x2   hacrl, algorithm hacpo, two agents (each trains on both agents' 256 completions)
    hacrl gspo G=16  GSPOx2: one agent, twice the completions (as many sequences trained as a HACPO learner)
    hacrl hacpo x2 sampler-logprobs   hacpo x2 with `trainer.old_logprobs: sampler` (no pre-update pass)

    python benchmarks/throughput.py --systems "hacrl gspo" "hacrl hacpo x2" "hacrl hacpo x2 sampler-logprobs" \
        --rounds 2 --out DIR                         # some rows only (no TRL needed), order alternated per round

Writes benchmarks/results/throughput.md and throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRATCH = HERE / "results" / ".runs" / "throughput"
PROMPTS = 512
PER_STEP, G, NEW = 32, 8, 32
LR = 1e-5


def contains_answer(prompts, completions, answer, **_):
    """1.0 when the completion contains the right sum (the same reward function for every system)."""
    return [1.0 if str(a) in c else 0.0 for c, a in zip(completions, answer, strict=True)]


# -- set-up (shared, built once) -------------------------------------------------------------------------------


def build(work: Path) -> Path:
    """The model directory (1.06M Llama on characters, random weights) and the prompt file; built once."""
    model_dir = work / "llama-char"
    if (model_dir / "config.json").is_file():
        return model_dir
    from hacrl.tools.testbed.models import char_tokenizer, save_agent, tiny_model

    rng = random.Random(0)
    pairs = [(rng.randrange(100), rng.randrange(100)) for _ in range(PROMPTS)]
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs]
    (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # printable ASCII: with random weights EOS is one token in ~100, so nearly every completion runs to the limit
    tokenizer = char_tokenizer("".join(chr(c) for c in range(32, 127)) + "\n")
    model = tiny_model("llama", tokenizer, hidden=128, layers=4, heads=4, kv_heads=4, ffn=512, seed=0)
    save_agent(model, tokenizer, model_dir)
    return model_dir


# -- one measured process ------------------------------------------------------------------------------------------


def run_hacrl(work: Path, system: str, steps: int, warmup: int) -> dict:
    import torch
    import yaml

    from hacrl.config import load_config
    from hacrl.driver.trainer import Trainer

    torch.set_num_threads(2)
    model_dir = work / "llama-char"
    agents = ["a", "b"] if system.startswith("hacrl hacpo x2") else ["a"]
    group = 2 * G if system == "hacrl gspo G=16" else G
    per_agent = PER_STEP * group
    config = {
        "agents": [{"name": n, "model": str(model_dir), "lr": LR} for n in agents],
        "algorithm": {"name": "hacpo" if len(agents) == 2 else "gspo"},
        "rollout": {"group_size": group, "temperature": 1.0, "max_new_tokens": NEW, "max_prompt_tokens": 64},
        "data": {"source": "file", "train_file": str(work / "prompts.jsonl")},
        "scoring": {"function": "throughput:contains_answer"},
        "trainer": {"steps": steps + warmup, "prompts_per_step": PER_STEP, "mini_batch_size": per_agent,
                    "micro_batch_size": 64, "logprob_batch_size": per_agent,
                    "old_logprobs": "sampler" if system.endswith("sampler-logprobs") else "recompute",
                    "output_dir": str(work / f"run-{os.getpid()}")},
        "eval": {"at_start": False},
        "logging": {"console": False, "tensorboard": False, "jsonl": False},
        "checkpoint": {"every": 0},
    }  # fmt: skip
    path = work / f"config-{os.getpid()}.yaml"
    path.write_text(yaml.safe_dump(config))
    trainer = Trainer(load_config(path))
    seconds, phases, work_done = [], [], []
    try:
        for step in range(steps + warmup):
            t = time.perf_counter()
            metrics = trainer.train_step()
            trainer.step += 1
            if step == 0:
                first_step = t
            if step >= warmup:
                seconds.append(time.perf_counter() - t)
                phases.append({k: metrics[k] for k in ("time/sampling", "time/scoring", "time/update")})
                work_done.append(
                    {
                        "completions": per_agent * len(agents),
                        "tokens": round(sum(metrics[f"{n}/response_length_mean"] * per_agent for n in agents)),
                        "optimizer_steps": metrics[f"{agents[0]}/optimizer_steps"],
                    }
                )
    finally:
        trainer.close()
    return {"seconds": seconds, "phases": phases, "work": work_done, "first_step_at": first_step}


def run_trl(work: Path, steps: int, warmup: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(2)
    model_dir = work / "llama-char"
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    rows = [json.loads(x) for x in (work / "prompts.jsonl").read_text().splitlines()]
    template = [{"role": "user", "content": r["prompt"]} for r in rows]
    texts = [tokenizer.apply_chat_template([m], add_generation_prompt=True, tokenize=False) for m in template]
    dataset = Dataset.from_list([{"prompt": t, "answer": r["answer"]} for t, r in zip(texts, rows, strict=True)])
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    args = GRPOConfig(
        output_dir=str(work / f"trl-{os.getpid()}"),
        importance_sampling_level="sequence",
        loss_type="grpo",
        epsilon=3e-4,
        epsilon_high=4e-4,
        beta=0.0,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        num_generations=G,
        max_completion_length=NEW,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        per_device_train_batch_size=64,
        gradient_accumulation_steps=PER_STEP * G // 64,
        steps_per_generation=PER_STEP * G // 64,
        max_steps=steps + warmup,
        use_cpu=True,
        bf16=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    record: dict = {"seconds": [], "work": [], "phases": []}

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()
            record.setdefault("first_step_at", self.start)

        def on_step_end(self, args, state, control, **kw):
            if state.global_step > warmup:
                record["seconds"].append(time.perf_counter() - self.start)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and state.global_step > warmup and "completions/mean_length" in logs:
                record["work"].append(
                    {
                        "completions": PER_STEP * G,
                        "tokens": round(logs["completions/mean_length"] * PER_STEP * G),
                        "optimizer_steps": 1,
                    }
                )

    trainer = GRPOTrainer(
        model=model, reward_funcs=contains_answer, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    generate = trainer._generate_and_score_completions
    sampling: list[float] = []

    def timed(*a, **k):
        t = time.perf_counter()
        out = generate(*a, **k)
        sampling.append(time.perf_counter() - t)
        return out

    trainer._generate_and_score_completions = timed
    trainer.add_callback(Clock())
    trainer.train()
    measured = sampling[warmup:]
    record["phases"] = [
        {"time/sampling": s, "time/update": total - s} for s, total in zip(measured, record["seconds"], strict=False)
    ]
    return record


def measure(system: str, steps: int, warmup: int) -> None:
    """Run in a child process: one system, print its JSON result."""
    import resource

    started = time.perf_counter()
    work = SCRATCH
    sys.path.insert(0, str(HERE))  # the reward function, for hacrl's scoring processes
    if system == "trl gspo":
        result = run_trl(work, steps, warmup)
    else:
        result = run_hacrl(work, system, steps, warmup)
    result["startup_s"] = result.pop("first_step_at") - started
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def spawn(system: str, steps: int, warmup: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--measure", system, "--steps", str(steps), "--warmup",
         str(warmup)], cwd=HERE, env=env, capture_output=True, text=True,
    )  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"{system} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(line[len("RESULT ") :])


# -- the comparison ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="alternated rounds of hacrl gspo / trl gspo")
    parser.add_argument("--hacpo-rounds", type=int, default=2, help="rounds of the HACPO and GSPOx2 rows")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="hacrl only, 2 steps, results in --out")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--resummarize", action="store_true", help="rebuild the tables from --out/throughput.json")
    parser.add_argument("--systems", nargs="+", help="measure only these rows, every round (order alternated)")
    args = parser.parse_args(argv)
    if args.measure:
        measure(args.measure, args.steps, args.warmup)
        return 0
    if args.resummarize:
        out = Path(args.out)
        stored = json.loads((out / "throughput.json").read_text())
        args.steps, args.warmup = stored["summary"]["steps"], stored["summary"]["warmup"]
        summary = summarize(stored["runs"], args)
        (out / "throughput.json").write_text(json.dumps({"summary": summary, "runs": stored["runs"]}, indent=1))
        (out / "throughput.md").write_text(markdown(summary, args, stored["summary"].get("argv", [])))
        print(markdown(summary, args, stored["summary"].get("argv", [])))
        return 0
    SCRATCH.mkdir(parents=True, exist_ok=True)
    build(SCRATCH)
    if args.smoke:
        plan = [["hacrl gspo", "hacrl hacpo x2"]]
        args.steps, args.warmup = 2, 0
    elif args.systems:
        plan = [list(args.systems) if r % 2 == 0 else list(reversed(args.systems)) for r in range(args.rounds)]
    else:
        try:
            import trl  # noqa: F401
        except ImportError:
            print('TRL is not installed: pip install "hacrl[bench]" (or run --smoke)', file=sys.stderr)
            return 2
        plan = [
            (["hacrl gspo", "trl gspo"] if r % 2 == 0 else ["trl gspo", "hacrl gspo"])
            + (["hacrl hacpo x2", "hacrl gspo G=16"] if r < args.hacpo_rounds else [])
            for r in range(args.rounds)
        ]
    runs = []
    for round_, systems in enumerate(plan):
        for system in systems:
            result = spawn(system, args.steps, args.warmup)
            result.update(system=system, round=round_, median_s=statistics.median(result["seconds"]))
            runs.append(result)
            print(f"round {round_} {system:16s} {result['median_s']:.3f} s/step", flush=True)
    summary = summarize(runs, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "throughput.json").write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
    (out / "throughput.md").write_text(markdown(summary, args, argv))
    print(markdown(summary, args, argv))
    return 0


def summarize(runs: list[dict], args) -> dict:
    import torch
    import transformers

    systems = list(dict.fromkeys(r["system"] for r in runs))
    table = {}
    for system in systems:
        mine = [r for r in runs if r["system"] == system]
        medians = [r["median_s"] for r in mine]
        table[system] = {
            "s_per_step": statistics.median(medians),
            "min": min(medians),
            "max": max(medians),
            "rounds": len(mine),
            "startup_s": statistics.median(r["startup_s"] for r in mine),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in mine),
            "work": mine[0]["work"][0] if mine[0]["work"] else {},
            "phases": {k: statistics.median(p[k] for r in mine for p in r["phases"]) for k in mine[0]["phases"][0]},
        }

    def paired(system: str, baseline: str) -> dict | None:
        """Per-round ratios of two systems measured in the same round (the machine's speed drifts between rounds)."""
        ratios = []
        for round_ in sorted({r["round"] for r in runs}):
            pair = {r["system"]: r["median_s"] for r in runs if r["round"] == round_}
            if system in pair and baseline in pair:
                ratios.append(pair[system] / pair[baseline])
        return {"median": statistics.median(ratios), "per_round": ratios} if ratios else None

    try:
        import trl

        trl_version = trl.__version__
    except ImportError:
        trl_version = None
    return {
        "table": table,
        "hacrl_over_trl": paired("hacrl gspo", "trl gspo"),
        "hacpo_over_gspo": paired("hacrl hacpo x2", "hacrl gspo"),
        "gspo_x2_over_gspo": paired("hacrl gspo G=16", "hacrl gspo"),
        "hacpo_sampler_over_gspo": paired("hacrl hacpo x2 sampler-logprobs", "hacrl gspo"),
        "hacpo_sampler_over_hacpo": paired("hacrl hacpo x2 sampler-logprobs", "hacrl hacpo x2"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl_version},
        "steps": args.steps,
        "warmup": args.warmup,
        "argv": [a for a in sys.argv[1:] if a != "--resummarize"],
    }


def markdown(summary: dict, args, argv) -> str:
    v = summary["versions"]
    cmd = "python benchmarks/throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# Throughput: hacrl vs TRL on the same GSPO step",
        "",
        f"Machine: {summary['machine']}; torch {v['torch']}, transformers {v['transformers']}, TRL {v['trl']}. "
        f"Command: `{cmd.strip()}`. Per process {summary['warmup']} warm-up and {summary['steps']} measured steps; "
        "the table gives the median over rounds of each process's median step (min and max of those).",
        "",
        "| system | s/step | min | max | rounds | sampling s | update s | start-up s | peak RSS MiB | work per step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for system, t in summary["table"].items():
        w = t["work"]
        work = f"{w.get('completions')} completions, {w.get('tokens')} tokens, {w.get('optimizer_steps')} opt. step(s)"
        lines.append(
            f"| {system} | {t['s_per_step']:.3f} | {t['min']:.3f} | {t['max']:.3f} | {t['rounds']} | "
            f"{t['phases'].get('time/sampling', float('nan')):.3f} | "
            f"{t['phases'].get('time/update', float('nan')):.3f} | "
            f"{t['startup_s']:.1f} | {t['peak_rss_mib']:.0f} | {work} |"
        )
    lines.append("")
    if summary["hacrl_over_trl"]:
        r = summary["hacrl_over_trl"]
        lines.append(
            f"hacrl / TRL, median of per-round ratios: **{r['median']:.3f}** (rounds: "
            + ", ".join(f"{x:.3f}" for x in r["per_round"]) + ")."
        )  # fmt: skip
    for key, what, base in (
        ("hacpo_over_gspo", "hacrl HACPO with 2 agents", "one hacrl GSPO agent"),
        ("gspo_x2_over_gspo", "hacrl GSPOx2 (G = 16)", "one hacrl GSPO agent"),
        ("hacpo_sampler_over_gspo", "hacrl HACPO with 2 agents, sampler log-probs", "one hacrl GSPO agent"),
        ("hacpo_sampler_over_hacpo", "hacrl HACPO with 2 agents, sampler log-probs", "the same, recomputed"),
    ):
        if summary.get(key):
            r = summary[key]
            lines.append(
                f"{what} / {base}, same rounds: **{r['median']:.2f}** (rounds: "
                + ", ".join(f"{x:.2f}" for x in r["per_round"]) + ")."
            )  # fmt: skip
    lines.append(
        "Sampling = generating and scoring (TRL: its `_generate_and_score_completions`); update = the rest of the "
        "step. hacrl runs no separate old-log-prob pass here: one optimizer step per generation trains every row "
        "before any update, so the training forward's own log-probs are the old ones (ratio exactly 1)."
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
