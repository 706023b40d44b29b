"""Seconds per training step: hacrl against TRL's GRPOTrainer configured as GSPO, on the same work.

    pip install "hacrl[bench]"                       # TRL (optional; never needed by the library or the tests)
    python benchmarks/throughput.py                  # 4 rounds of hacrl / TRL alternated, in each of the 4
                                                     # conditions; 2 rounds of the HACPO rows
    python benchmarks/throughput.py --smoke          # hacrl only, 1 step of 8 prompts (what make test runs)

The same 1.06M-parameter Llama on a character tokenizer (built here, offline, random weights: every completion
runs to the length limit, so the work is fixed), the same 512 prompts (`Q:<a>+<b>=\\nA:`), the same reward (1 when
the completion contains the sum), 32 prompts x 8 completions of 32 new tokens per step, sampling at T = 1, GSPO's
sequence-level ratio and clip (3e-4 / 4e-4), no KL, lr 1e-5, micro-batches of 64 and one optimizer step per
generation, torch on 2 threads. Like for like in four conditions (`CONDITIONS`): gradient checkpointing off and
on (TRL's GRPOConfig turns it on by default; hacrl's `agents.<i>.gradient_checkpointing` is off by default), each at
micro-batches of 64 and 256 rows (TRL: per_device_train_batch_size, with gradient_accumulation_steps and
steps_per_generation 256 / micro-batch so that one generation of 256 completions makes one optimizer step). Each
measuring process records the settings it actually ran with (TRL's `trainer.args`, hacrl's resolved config and
whether the model checkpoints), printed side by side under the results. Each (system, condition, round) is its own
process: 3 warm-up steps, then `--steps` measured
steps; per step the wall time, per process the start-up time (process start to the first step), peak RSS and the
work per step (completions, generated tokens, optimizer steps: checked equal across systems). Rows:

    hacrl gspo       hacrl, algorithm gspo, one agent
    trl gspo         TRL GRPOTrainer(importance_sampling_level="sequence", loss_type="grpo", epsilon 3e-4 / 4e-4)
    hacrl hacpo x2   hacrl, algorithm hacpo, two agents (each trains on both agents' 256 completions)
    hacrl gspo G=16  GSPOx2: one agent, twice the completions (as many sequences trained as a HACPO learner)
    hacrl hacpo x2 sampler-logprobs   hacpo x2 with `trainer.old_logprobs: sampler` (no pre-update pass)

The HACPO and GSPOx2 rows run in the first condition only (checkpointing off, micro-batch 64).

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
SMOKE_PROMPTS = 8
"""--smoke: prompts per step (x 8 completions: one micro-batch of 64 rows), a quarter of the measured work."""
LR = 1e-5
CONDITIONS = {"off-64": (False, 64), "on-64": (True, 64), "off-256": (False, 256), "on-256": (True, 256)}
"""condition -> (gradient checkpointing, rows per micro-batch): the same on both sides."""
DEFAULT = "off-64"
TRL_SETTINGS = ("gradient_checkpointing", "gradient_checkpointing_kwargs", "loss_type", "importance_sampling_level",
                "epsilon", "epsilon_high", "beta", "scale_rewards", "num_generations", "generation_batch_size",
                "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "num_iterations",
                "max_completion_length", "temperature", "top_k", "top_p", "mask_truncated_completions", "use_vllm",
                "logging_steps", "torch_compile")  # fmt: skip


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


def run_hacrl(
    work: Path, system: str, steps: int, warmup: int, condition: str = DEFAULT, prompts: int = PER_STEP
) -> dict:
    import torch
    import yaml

    from hacrl.config import load_config
    from hacrl.driver.trainer import Trainer

    torch.set_num_threads(2)
    model_dir = work / "llama-char"
    agents = ["a", "b"] if system.startswith("hacrl hacpo x2") else ["a"]
    group = 2 * G if system == "hacrl gspo G=16" else G
    per_agent = prompts * group
    checkpointing, micro = CONDITIONS[condition]
    config = {
        "agents": [{"name": n, "model": str(model_dir), "lr": LR, "gradient_checkpointing": checkpointing}
                   for n in agents],
        "algorithm": {"name": "hacpo" if len(agents) == 2 else "gspo"},
        "rollout": {"group_size": group, "temperature": 1.0, "max_new_tokens": NEW, "max_prompt_tokens": 64},
        "data": {"source": "file", "train_file": str(work / "prompts.jsonl")},
        "scoring": {"function": "throughput:contains_answer"},
        "trainer": {"steps": steps + warmup, "prompts_per_step": prompts, "mini_batch_size": per_agent,
                    "micro_batch_size": micro, "logprob_batch_size": per_agent,
                    "old_logprobs": "sampler" if system.endswith("sampler-logprobs") else "recompute",
                    "output_dir": str(work / f"run-{os.getpid()}")},
        "eval": {"at_start": False},
        "logging": {"console": False, "tensorboard": False, "jsonl": False},
        "checkpoint": {"every": 0},
    }  # fmt: skip
    path = work / f"config-{os.getpid()}.yaml"
    path.write_text(yaml.safe_dump(config))
    cfg = load_config(path)
    trainer = Trainer(cfg)
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
        settings = hacrl_settings(trainer, cfg)
    finally:
        trainer.close()
    return {"seconds": seconds, "phases": phases, "work": work_done, "first_step_at": first_step, "settings": settings}


def hacrl_settings(trainer, cfg) -> dict:
    """What hacrl ran with, in the terms of TRL_SETTINGS (read from the resolved config and the live model)."""
    agent, a = cfg.agents[0], cfg.algorithm
    live = trainer.schedule.transport.learners[0].agent
    model = live.model
    return {
        "gradient_checkpointing": agent.gradient_checkpointing,
        "model checkpoints (live)": model.is_gradient_checkpointing,
        "algorithm": a.name,
        "epsilon / epsilon_high": f"{a.eps_low} / {a.eps_high}",
        "adv_eps (std epsilon)": cfg.algorithm.adv_eps,
        "kl_coef (beta)": cfg.algorithm.kl_coef,
        "group_size": cfg.rollout.group_size,
        "rows per generate call (resolved)": live.settings.rows_per_call,
        "mini_batch_size (rows per optimizer step)": cfg.trainer.mini_batch_size,
        "micro_batch_size": cfg.trainer.micro_batch_size,
        "old_logprobs": cfg.trainer.old_logprobs,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "temperature / top_p (top_k off)": f"{cfg.rollout.temperature} / {cfg.rollout.top_p}",
        "logging": "metrics per step, no files",
    }


def time_sampling(trainer) -> list[float]:
    """The seconds of each of TRL's generation calls (`_generate_and_score_completions`), appended to the list
    returned as the trainer runs."""
    generate, sampling = trainer._generate_and_score_completions, []

    def timed(*a, **k):
        t = time.perf_counter()
        out = generate(*a, **k)
        sampling.append(time.perf_counter() - t)
        return out

    trainer._generate_and_score_completions = timed
    return sampling


def run_trl(work: Path, steps: int, warmup: int, condition: str = DEFAULT, prompts: int = PER_STEP) -> dict:
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
    checkpointing, micro = CONDITIONS[condition]
    args = GRPOConfig(
        gradient_checkpointing=checkpointing,
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
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=prompts * G // micro,
        steps_per_generation=prompts * G // micro,
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

        def on_step_end(self, args, state, control, model=None, **kw):
            record.setdefault("live_checkpointing", getattr(model, "is_gradient_checkpointing", None))
            if state.global_step > warmup:
                record["seconds"].append(time.perf_counter() - self.start)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and state.global_step > warmup and "completions/mean_length" in logs:
                record["work"].append(
                    {
                        "completions": prompts * G,
                        "tokens": round(logs["completions/mean_length"] * prompts * G),
                        "optimizer_steps": 1,
                    }
                )

    trainer = GRPOTrainer(
        model=model, reward_funcs=contains_answer, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    sampling = time_sampling(trainer)
    trainer.add_callback(Clock())
    trainer.train()
    record["settings"] = {k: getattr(trainer.args, k, None) for k in TRL_SETTINGS}
    record["settings"]["model checkpoints (live)"] = record.pop("live_checkpointing", None)
    measured = sampling[warmup:]
    record["phases"] = [
        {"time/sampling": s, "time/update": total - s} for s, total in zip(measured, record["seconds"], strict=False)
    ]
    return record


def measure(system: str, steps: int, warmup: int, condition: str, prompts: int = PER_STEP) -> None:
    """Run in a child process: one system in one condition, print its JSON result."""
    import resource

    started = time.perf_counter()
    work = SCRATCH
    sys.path.insert(0, str(HERE))  # the reward function, for hacrl's scoring processes
    if system == "trl gspo":
        result = run_trl(work, steps, warmup, condition, prompts)
    else:
        result = run_hacrl(work, system, steps, warmup, condition, prompts)
    result["startup_s"] = result.pop("first_step_at") - started
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result, default=str))


def spawn(system: str, steps: int, warmup: int, condition: str = DEFAULT, prompts: int = PER_STEP) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--measure", system, "--steps", str(steps), "--warmup",
         str(warmup), "--condition", condition, "--prompts", str(prompts)],
        cwd=HERE, env=env, capture_output=True, text=True,
    )  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"{system} ({condition}) failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(line[len("RESULT ") :])


def label(system: str, condition: str) -> str:
    """A table row's name: the system, with its condition unless it is the default one."""
    return system if condition == DEFAULT else f"{system} [{condition}]"


# -- the comparison ----------------------------------------------------------------------------------------------


def plan_rounds(args) -> list[list[tuple[str, str]]]:
    """Each round's (system, condition) processes in the order they run: the conditions rotated by round, within a
    condition hacrl and TRL alternated by round (and the HACPO rows, default condition, in the first rounds)."""
    if args.smoke:
        return [[("hacrl gspo", DEFAULT), ("hacrl hacpo x2", DEFAULT)]]
    if args.systems:
        return [[(s, c) for c in args.conditions for s in (args.systems if r % 2 == 0 else args.systems[::-1])]
                for r in range(args.rounds)]  # fmt: skip
    rounds = []
    for r in range(args.rounds):
        conditions = args.conditions[r % len(args.conditions) :] + args.conditions[: r % len(args.conditions)]
        pair = ["hacrl gspo", "trl gspo"] if r % 2 == 0 else ["trl gspo", "hacrl gspo"]
        runs = [(s, c) for c in conditions for s in pair]
        if r < args.hacpo_rounds:
            runs += [("hacrl hacpo x2", DEFAULT), ("hacrl gspo G=16", DEFAULT)]
        rounds.append(runs)
    return rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="alternated rounds of hacrl gspo / trl gspo")
    parser.add_argument("--hacpo-rounds", type=int, default=2, help="rounds of the HACPO and GSPOx2 rows")
    parser.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS),
                        help="checkpointing-microbatch: the same on both sides")  # fmt: skip
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="hacrl only, 1 step, results in --out")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--condition", default=DEFAULT, help=argparse.SUPPRESS)
    parser.add_argument("--prompts", type=int, default=PER_STEP, help=argparse.SUPPRESS)  # per step
    parser.add_argument("--resummarize", action="store_true", help="rebuild the tables from --out/throughput.json")
    parser.add_argument("--systems", nargs="+", help="measure only these rows, every round (order alternated)")
    args = parser.parse_args(argv)
    if args.measure:
        measure(args.measure, args.steps, args.warmup, args.condition, args.prompts)
        return 0
    if args.resummarize:
        out = Path(args.out)
        stored = json.loads((out / "throughput.json").read_text())
        args.steps, args.warmup = stored["summary"]["steps"], stored["summary"]["warmup"]
        summary = summarize(stored["runs"], args)
        (out / "throughput.json").write_text(json.dumps({"summary": summary, "runs": stored["runs"]}, indent=1))
        (out / "throughput.md").write_text(markdown(summary, stored["summary"].get("argv", [])))
        print(markdown(summary, stored["summary"].get("argv", [])))
        return 0
    SCRATCH.mkdir(parents=True, exist_ok=True)
    build(SCRATCH)
    if args.smoke:
        args.steps, args.warmup, args.prompts = 1, 0, SMOKE_PROMPTS
    elif not args.systems:
        try:
            import trl  # noqa: F401
        except ImportError:
            print('TRL is not installed: pip install "hacrl[bench]" (or run --smoke)', file=sys.stderr)
            return 2
    runs = []
    for round_, processes in enumerate(plan_rounds(args)):
        for system, condition in processes:
            result = spawn(system, args.steps, args.warmup, condition, args.prompts)
            result.update(
                system=system, condition=condition, round=round_, median_s=statistics.median(result["seconds"])
            )
            runs.append(result)
            print(f"round {round_} {label(system, condition):28s} {result['median_s']:.3f} s/step", flush=True)
    summary = summarize(runs, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "throughput.json").write_text(json.dumps({"summary": summary, "runs": runs}, indent=1, default=str))
    (out / "throughput.md").write_text(markdown(summary, argv))
    print(markdown(summary, argv))
    return 0


def summarize(runs: list[dict], args) -> dict:
    import torch
    import transformers

    for r in runs:
        r.setdefault("condition", DEFAULT)
    rows = list(dict.fromkeys((r["system"], r["condition"]) for r in runs))
    table = {}
    for system, condition in rows:
        mine = [r for r in runs if (r["system"], r["condition"]) == (system, condition)]
        medians = [r["median_s"] for r in mine]
        table[label(system, condition)] = {
            "system": system,
            "condition": condition,
            "s_per_step": statistics.median(medians),
            "min": min(medians),
            "max": max(medians),
            "rounds": len(mine),
            "startup_s": statistics.median(r["startup_s"] for r in mine),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in mine),
            "work": mine[0]["work"][0] if mine[0]["work"] else {},
            "phases": {k: statistics.median(p[k] for r in mine for p in r["phases"]) for k in mine[0]["phases"][0]},
        }

    def paired(system: str, baseline: str, condition: str = DEFAULT) -> dict | None:
        """Per-round ratios of two systems measured in the same round and condition (the machine's speed drifts
        between rounds)."""
        ratios = []
        for round_ in sorted({r["round"] for r in runs}):
            pair = {r["system"]: r["median_s"] for r in runs if r["round"] == round_ and r["condition"] == condition}
            if system in pair and baseline in pair:
                ratios.append(pair[system] / pair[baseline])
        return {"median": statistics.median(ratios), "per_round": ratios} if ratios else None

    settings = {}
    for system in ("hacrl gspo", "trl gspo"):
        mine = [r for r in runs if r["system"] == system and r.get("settings")]
        if mine:
            settings[system] = {c: next(r["settings"] for r in mine if r["condition"] == c)
                                for c in dict.fromkeys(r["condition"] for r in mine)}  # fmt: skip
    try:
        import trl

        trl_version = trl.__version__
    except ImportError:
        trl_version = None
    conditions = list(dict.fromkeys(r["condition"] for r in runs))
    return {
        "table": table,
        "hacrl_over_trl": {c: x for c in conditions if (x := paired("hacrl gspo", "trl gspo", c))},
        "hacpo_over_gspo": paired("hacrl hacpo x2", "hacrl gspo"),
        "gspo_x2_over_gspo": paired("hacrl gspo G=16", "hacrl gspo"),
        "hacpo_sampler_over_gspo": paired("hacrl hacpo x2 sampler-logprobs", "hacrl gspo"),
        "hacpo_sampler_over_hacpo": paired("hacrl hacpo x2 sampler-logprobs", "hacrl hacpo x2"),
        "settings": settings,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl_version},
        "steps": args.steps,
        "warmup": args.warmup,
        "argv": [a for a in sys.argv[1:] if a != "--resummarize"],
    }


def describe(condition: str) -> str:
    checkpointing, micro = CONDITIONS[condition]
    return f"checkpointing {'on' if checkpointing else 'off'}, micro-batch {micro}"


def markdown(summary: dict, argv) -> str:
    v = summary["versions"]
    cmd = "python benchmarks/throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# Throughput: hacrl vs TRL on the same GSPO step",
        "",
        f"Machine: {summary['machine']}; torch {v['torch']}, transformers {v['transformers']}, TRL {v['trl']}. "
        f"Command: `{cmd.strip()}`. Per process {summary['warmup']} warm-up and {summary['steps']} measured steps; "
        "the table gives the median over rounds of each process's median step (min and max of those).",
        "",
        "| system | checkpointing | micro-batch | s/step | min | max | rounds | sampling s | update s | start-up s | "
        "peak RSS MiB | work per step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in summary["table"].values():
        w = t["work"]
        work = f"{w.get('completions')} completions, {w.get('tokens')} tokens, {w.get('optimizer_steps')} opt. step(s)"
        checkpointing, micro = CONDITIONS[t.get("condition", DEFAULT)]
        lines.append(
            f"| {t.get('system')} | {'on' if checkpointing else 'off'} | {micro} | {t['s_per_step']:.3f} | "
            f"{t['min']:.3f} | {t['max']:.3f} | {t['rounds']} | "
            f"{t['phases'].get('time/sampling', float('nan')):.3f} | "
            f"{t['phases'].get('time/update', float('nan')):.3f} | "
            f"{t['startup_s']:.1f} | {t['peak_rss_mib']:.0f} | {work} |"
        )
    lines.append("")
    for condition, r in summary["hacrl_over_trl"].items():
        lines.append(
            f"hacrl / TRL ({describe(condition)}), median of per-round ratios: **{r['median']:.3f}** (rounds: "
            + ", ".join(f"{x:.3f}" for x in r["per_round"]) + ")."
        )  # fmt: skip
    lines.append("")
    for key, what, base in (
        ("hacpo_over_gspo", "hacrl HACPO with 2 agents", "one hacrl GSPO agent"),
        ("gspo_x2_over_gspo", "hacrl GSPOx2 (G = 16)", "one hacrl GSPO agent"),
        ("hacpo_sampler_over_gspo", "hacrl HACPO with 2 agents, sampler log-probs", "one hacrl GSPO agent"),
        ("hacpo_sampler_over_hacpo", "hacrl HACPO with 2 agents, sampler log-probs", "the same, recomputed"),
    ):
        if summary.get(key):
            r = summary[key]
            lines.append(
                f"{what} / {base} ({describe(DEFAULT)}), same rounds: **{r['median']:.2f}** (rounds: "
                + ", ".join(f"{x:.2f}" for x in r["per_round"]) + ")."
            )  # fmt: skip
    lines.append(
        "Sampling = generating and scoring (TRL: its `_generate_and_score_completions`); update = the rest of the "
        "step. hacrl runs no separate old-log-prob pass here: one optimizer step per generation trains every row "
        "before any update, so the training forward's own log-probs are the old ones (ratio exactly 1); neither "
        "does TRL (its generation and optimizer steps are aligned)."
    )
    lines += settings_table(summary.get("settings", {}))
    return "\n".join(lines) + "\n"


def settings_table(settings: dict) -> list[str]:
    """The settings each side ran with, per condition, as its measuring process read them."""
    if not settings:
        return []
    lines = ["", "## The settings each side ran with", ""]
    for system, by_condition in settings.items():
        conditions = list(by_condition)
        lines += [f"**{system}** (as read in the measuring process)", "",
                  "| setting | " + " | ".join(conditions) + " |", "|---|" + "---|" * len(conditions)]  # fmt: skip
        keys = list(dict.fromkeys(k for c in conditions for k in by_condition[c]))
        for k in keys:
            lines.append(f"| {k} | " + " | ".join(str(by_condition[c].get(k)) for c in conditions) + " |")
        lines.append("")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
