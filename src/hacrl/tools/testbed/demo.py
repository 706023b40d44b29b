"""The built-in test bed: tiny heterogeneous agents made from code, warm-started on a reasoning-gym task.

`hacrl bootstrap` builds, from nothing but code and seeds:
- a character-level tokenizer and a BPE tokenizer trained on the task's text (`tokenizers`), each with EOS/PAD
  and a one-line chat template (`Q:<question>\\nA:`);
- a Llama-style agent on the character tokenizer and a Qwen2-style agent, about 2x larger, on the BPE one;
- a supervised warm-start (`hacrl.tools.testbed.sft`) on the task's training split, the target being a short worked
  solution (the column sums from right to left, carries included) and the answer on the last line, so each agent
  is partly capable and RL rewards are informative.
Outputs are cached in `--out` (default `.cache/demo-agents`) with a `bootstrap.json` that records the recipe
and the measured accuracies; a second call with the same recipe reuses them.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hacrl import seeds
from hacrl.config import DataConfig

DEMO_TASK: dict[str, Any] = {
    "task": "basic_arithmetic",
    "task_options": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 3,
        "operators": ["+"],
        "allow_parentheses": False,
        "allow_negation": False,
        "whitespace": "single",
        "format_style": "simple",
    },
}
"""1-3 digit additions, `Calculate 347 + 85.`; scored by reasoning-gym's own scorer on the last line."""


@dataclass
class AgentRecipe:
    name: str
    family: str  # llama | qwen2
    tokenizer: str  # char | bpe
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    sft_steps: int
    sft_lr: float
    bpe_vocab: int = 128
    seed: int = 0
    sft_schedule: str = "cosine"
    sft_mix: dict[str, float] | None = None
    """Share of each sub-skill (`+`, `-`) in this agent's warm-start data; None: the task's own mixture."""
    split_digits: bool = False
    """A BPE tokenizer with every digit a token of its own (`bpe_tokenizer(digits=True)`)."""
    target: str = "worked"
    """The warm-start's answers: `worked` (the column results, then the answer on its own line: `worked_solution`)
    or `boxed` (the same columns, then a sentence ending in the boxed answer, as a real instruct model is asked to give
    it: `boxed_solution`)."""


@dataclass
class BootstrapRecipe:
    agents: list[AgentRecipe] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=lambda: dict(DEMO_TASK))
    train_size: int = 20000
    eval_size: int = 1280
    sft_batch_size: int = 64
    seed: int = 0


DEMO = BootstrapRecipe(
    agents=[
        AgentRecipe(
            "llama-char",
            "llama",
            "char",
            hidden=128,
            layers=4,
            heads=4,
            kv_heads=4,
            sft_steps=640,
            sft_lr=3e-3,
            seed=1,
            sft_schedule="constant",
        ),
        AgentRecipe(
            "qwen-bpe",
            "qwen2",
            "bpe",
            hidden=192,
            layers=4,
            heads=4,
            kv_heads=4,
            sft_steps=720,
            sft_lr=2e-3,
            seed=2,
            sft_schedule="constant",
        ),
    ],
    sft_batch_size=32,
)
"""The demo's two agents: 1.1M-parameter Llama on characters, 2.4M-parameter Qwen2 on a 128-token BPE."""

TINY = BootstrapRecipe(
    agents=[
        AgentRecipe(
            "llama-char", "llama", "char", hidden=32, layers=2, heads=2, kv_heads=1, sft_steps=30, sft_lr=3e-3, seed=1
        ),
        AgentRecipe(
            "qwen-bpe",
            "qwen2",
            "bpe",
            hidden=48,
            layers=2,
            heads=4,
            kv_heads=2,
            sft_steps=30,
            sft_lr=3e-3,
            bpe_vocab=64,
            seed=2,
        ),
    ],
    train_size=500,
    eval_size=32,
    sft_batch_size=16,
)
"""Seconds-scale version of DEMO for tests: the same code path, smaller everything."""

DEMO3 = BootstrapRecipe(
    agents=[
        *DEMO.agents,
        AgentRecipe(
            "llama-bpe", "llama", "bpe", hidden=160, layers=3, heads=4, kv_heads=4, sft_steps=300, sft_lr=2e-3, seed=3
        ),
    ],
    sft_batch_size=DEMO.sft_batch_size,
)
"""DEMO plus a third agent (a 1.2M Llama on the BPE tokenizer) for n = 3 runs."""

TINY3 = BootstrapRecipe(
    agents=[
        *TINY.agents,
        AgentRecipe(
            "llama-bpe",
            "llama",
            "bpe",
            hidden=16,
            layers=1,
            heads=2,
            kv_heads=1,
            sft_steps=10,
            sft_lr=3e-3,
            bpe_vocab=64,
            seed=3,
        ),
    ],
    train_size=TINY.train_size,
    eval_size=TINY.eval_size,
    sft_batch_size=TINY.sft_batch_size,
)

REAL_TASK: dict[str, Any] = {
    "task": "basic_arithmetic",
    "task_options": {**DEMO_TASK["task_options"], "max_digits": 2},
    "system_prompt": "Solve the problem. Put the final answer in \\boxed{}.",
    "scoring": "auto",
}
"""The real bed's task (`configs/real.yaml`): 1-2 digit additions, `Calculate 47 + 5.` with a system prompt asking
for a boxed answer, scored by the task's scorer on the last number of the answer's final answer (the last
`\\boxed{}`, else its last line: `scoring.builtin: auto`). Not the math verifier, which evaluates what it reads: it
credited SmolLM2's "which is 222. This is the result of the operation of 81 + 42." against 123 (5 of its 64 greedy
answers, a third of those it scored right)."""

REAL_PARTNER = BootstrapRecipe(
    agents=[
        AgentRecipe(
            "qwen-bpe-4m",
            "qwen2",
            "bpe",
            hidden=256,
            layers=4,
            heads=4,
            kv_heads=2,
            sft_steps=300,
            sft_lr=2e-3,
            bpe_vocab=384,
            seed=5,
            sft_schedule="constant",
            split_digits=True,
            target="boxed",
        ),
    ],
    data=REAL_TASK,
    sft_batch_size=32,
)
"""The real bed's partner beside SmolLM2-135M-Instruct (`hacrl bootstrap --recipe real`): a 4M-parameter Qwen2 on a
384-token BPE trained on the task's text, with its own one-line template, warm-started to answer in a sentence that
ends in the boxed sum. It differs from SmolLM2 in size (~30x), tokenizer (its 384 tokens against a 49,152-token
BPE), architecture (Qwen2 against Llama) and template (`Q:`/`A:` against ChatML), and trains in seconds a step
beside SmolLM2's minute on 2 CPU cores."""

RECIPES = {
    "demo": DEMO,
    "demo3": DEMO3,
    "tiny": TINY,
    "tiny3": TINY3,
    "real-partner": REAL_PARTNER,
}
"""The demo's bootstrap recipes (`hacrl demo --recipe`, `hacrl bootstrap --recipe`); the learning benchmarks' own
beds are in `benchmarks/beds.py`."""


def worked_solution(expression: str) -> str:
    """The warm-start target: column results right to left, then the answer on its own line.

    Addition: each column's sum, carry in included (a sum of 10 or more carries 1). Subtraction (non-negative
    results): each column's difference, borrow in included, before borrowing (a negative one borrows 1), so the
    borrow is as visible in the column list as the carry is for addition.

    >>> worked_solution("347 + 85")
    '12,13,4\\n432'
    >>> worked_solution("5 + 5")
    '10,1\\n10'
    >>> worked_solution("432 - 85")
    '-3,-6,3\\n347'
    """
    match = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(\d+)\s*", expression)
    if match is None:
        raise ValueError(f"worked_solution takes 'a + b' or 'a - b' with non-negative integers, got {expression!r}")
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    if op == "-" and a < b:
        raise ValueError(f"worked_solution takes subtractions with a non-negative result, got {expression!r}")
    da, db = str(a)[::-1], str(b)[::-1]
    columns, carry = [], 0
    for i in range(max(len(da), len(db))):
        x, y = int(da[i] if i < len(da) else 0), int(db[i] if i < len(db) else 0)
        if op == "+":
            value = x + y + carry
            carry = value // 10
        else:
            value = x - y - carry
            carry = int(value < 0)
        columns.append(str(value))
    if op == "+" and carry:
        columns.append(str(carry))
    return ",".join(columns) + "\n" + str(a + b if op == "+" else a - b)


def boxed_solution(expression: str) -> str:
    """The `boxed` warm-start target: the column results (as `worked_solution`), then a sentence ending in the boxed
    result.

    >>> boxed_solution("47 + 5")
    '12,5\\n47 + 5 = \\\\boxed{52}.'
    """
    columns, answer = worked_solution(expression).split("\n")
    return f"{columns}\n{' '.join(expression.split())} = \\boxed{{{answer}}}."


def sub_skill(expression_or_prompt: str) -> str:
    """`+` or `-`: which sub-skill a 2-term task (its expression or its prompt, `Calculate 85 - 432.`) exercises."""
    match = re.search(r"\d\s*([+-])\s*\d", expression_or_prompt)
    if match is None:
        raise ValueError(f"no 2-term '+' or '-' expression in {expression_or_prompt!r}")
    return match.group(1)


def _mix(pairs: list, skills: list[str], mix: dict[str, float] | None) -> list:
    """The warm-start pairs in the recipe's sub-skill proportions: every pair of the most represented sub-skill
    (relative to its share), and the first pairs of the others up to their shares; the order stays the data's."""
    if not mix:
        return pairs
    counts = {k: skills.count(k) for k in mix}
    scale = min(counts[k] / w for k, w in mix.items() if w > 0)
    quota = {k: round(scale * w) for k, w in mix.items()}
    out = []
    for pair, skill in zip(pairs, skills, strict=True):
        if quota.get(skill, 0) > 0:
            out.append(pair)
            quota[skill] -= 1
    return out


def with_seed(recipe: BootstrapRecipe, seed: int) -> BootstrapRecipe:
    """The recipe for benchmark seed `seed`: each agent's initialisation and warm-start order move with the seed;
    the task data (train and eval prompts) stay the same, so every seed is evaluated on the same prompts."""
    if seed == 0:
        return recipe
    agents = [replace(a, seed=seeds.warm_start(a.seed, seed)) for a in recipe.agents]
    return replace(recipe, agents=agents)


def data_config(recipe: BootstrapRecipe, out: str | Path | None = None) -> DataConfig:
    """The recipe's task as a data config: a reasoning-gym task by name, or (`data.generator`) the files that
    `write_task_files` wrote under `out/data`."""
    if "generator" in recipe.data:
        if out is None:
            raise ValueError("a recipe with a generated task needs the bootstrap directory that holds its files")
        files = Path(out) / "data"
        return DataConfig(
            source="file",
            train_file=str(files / "train.jsonl"),
            eval_file=str(files / "eval.jsonl"),
            eval_size=recipe.eval_size,
            seed=recipe.seed,
        )  # scored by the math scorer: `scoring.builtin: auto` picks it for files
    return DataConfig(
        task=recipe.data["task"],
        task_options=dict(recipe.data["task_options"]),
        train_size=recipe.train_size,
        eval_size=recipe.eval_size,
        seed=recipe.seed,
        system_prompt=recipe.data.get("system_prompt"),
    )


def scoring_config(recipe: BootstrapRecipe):
    """How the recipe's task is scored: its built-in scorer, or the math verifier where the recipe says so."""
    from hacrl.config import ScoringConfig

    # a reasoning-gym task: its own scorer as the demo was calibrated (`auto` reads an untagged answer's last number)
    return ScoringConfig(builtin=recipe.data.get("scoring", "auto" if "generator" in recipe.data else "reasoning_gym"))


def arithmetic_rows(count: int, rng: random.Random, operators: list[str], max_digits: int = 3) -> list[dict]:
    """`count` rows `{"prompt": "Calculate a op b.", "answer", "expression"}` drawn like reasoning-gym's
    basic_arithmetic (digits uniform in 1..max_digits, each operand uniform in [0, 10**digits]), except that a
    subtraction's operands are ordered so that its result is never negative."""
    rows = []
    for _ in range(count):
        digits = rng.randint(1, max_digits)
        a, b = rng.randint(0, 10**digits), rng.randint(0, 10**digits)
        op = rng.choice(operators)
        if op == "-" and a < b:
            a, b = b, a
        expression = f"{a} {op} {b}"
        rows.append(
            {
                "prompt": f"Calculate {expression}.",
                "answer": str(a + b if op == "+" else a - b),
                "expression": expression,
            }
        )
    return rows


def write_task_files(recipe: BootstrapRecipe, out: str | Path) -> None:
    """The generated task of a recipe (`data.generator: arithmetic`) as `out/data/{train,eval}.jsonl`: a held-out
    pool first, then training rows, any training prompt that occurs in the pool dropped (the splits never overlap).
    Same recipe seed, same files."""
    spec = recipe.data
    if spec.get("generator") != "arithmetic":
        raise ValueError(f"unknown task generator {spec.get('generator')!r} (known: arithmetic)")
    directory = Path(out) / "data"
    directory.mkdir(parents=True, exist_ok=True)
    held_out = arithmetic_rows(
        max(2048, recipe.eval_size), random.Random(f"heldout-{recipe.seed}"), spec["operators"], spec["max_digits"]
    )
    prompts = {r["prompt"] for r in held_out}
    train = arithmetic_rows(
        recipe.train_size, random.Random(f"train-{recipe.seed}"), spec["operators"], spec["max_digits"]
    )
    for name, rows in (
        ("eval", held_out[: recipe.eval_size]),
        ("train", [r for r in train if r["prompt"] not in prompts]),
    ):
        tmp = directory / f"{name}.jsonl.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(directory / f"{name}.jsonl")


def _log(message: str) -> None:
    print(message, flush=True)


def bootstrap(
    out: str | Path,
    recipe: BootstrapRecipe = DEMO,
    *,
    log=_log,
    force: bool = False,
    evaluate_agents: bool = True,
    parallel: int | None = None,
) -> dict[str, Any]:
    """Build (or reuse) the recipe's agents under `out`; returns the report stored in `out/bootstrap.json`.

    `evaluate_agents=False` skips the greedy evaluation of each warm-started agent (`hacrl demo` does: its training
    run evaluates the same agents on the same prompts at step 0). `parallel`: how many agents are warm-started at
    once, each in its own process with its share of the CPU cores as torch threads (default: as many as there are
    agents, at most one per core). The warm-start is compute-bound, so on 2 cores two 1-thread processes finish
    sooner than one 2-thread process doing one agent after the other (and a process count gives the same agents
    on every run of one machine: the threads per process are part of what the numbers depend on). With more than
    one process, each prints its own progress and `log` is not used."""
    out = Path(out)
    manifest = out / "bootstrap.json"
    key = asdict(recipe)
    if "generator" in recipe.data:  # deterministic and cheap: rewritten, so cached agents never lack their data
        write_task_files(recipe, out)
    if not force and manifest.is_file():
        report = json.loads(manifest.read_text())
        if report.get("recipe") == key and all((out / a.name / "config.json").is_file() for a in recipe.agents):
            log(f"bootstrap: reusing the agents cached in {out} (delete it to rebuild)")
            return report

    cores = os.cpu_count() or 1
    parallel = max(1, min(parallel or cores, len(recipe.agents), cores))
    threads = max(1, cores // parallel)
    jobs = [(recipe, a.name, str(out), threads, evaluate_agents) for a in recipe.agents]
    start = time.perf_counter()
    if parallel == 1:
        results = [_warm_start_agent(*job, log=log) for job in jobs]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        log(f"bootstrap: warm-starting {len(jobs)} agents, {parallel} at a time ({threads} torch thread(s) each)")
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
        with ProcessPoolExecutor(max_workers=parallel, mp_context=context) as pool:
            results = list(pool.map(_warm_start_agent, *zip(*jobs, strict=True)))
    report: dict[str, Any] = {
        "recipe": key,
        "agents": dict(results),
        "eval_prompts": recipe.eval_size,
        "parallel": parallel,
        "torch_threads": threads,
        "seconds": time.perf_counter() - start,
    }
    manifest.write_text(json.dumps(report, indent=1))
    return report


def _warm_start_agent(
    recipe: BootstrapRecipe, name: str, out: str, threads: int, evaluate_agent: bool, log=_log, on_step=None
) -> tuple[str, dict[str, Any]]:
    """Tokenizer, model and supervised warm-start of one recipe agent, saved to `out/<name>`; (name, report).
    `on_step(step, model, tokenizer, task)` after every warm-start step (benchmarks/warm_start_curve.py evaluates
    there; it must leave the model's weights and the warm-start's random state alone)."""
    import torch

    from hacrl.tasks.data import load_task
    from hacrl.tools.testbed.models import save_agent
    from hacrl.tools.testbed.sft import SFTConfig, supervised_finetune

    torch.set_num_threads(threads)
    start = time.perf_counter()
    recipe_agent = next(a for a in recipe.agents if a.name == name)
    scoring = scoring_config(recipe)
    task = load_task(data_config(recipe, out), scoring)
    pairs, tokenizer, model = _untrained_agent(recipe_agent, task)
    params = sum(p.numel() for p in model.parameters())
    log(
        f"bootstrap: {name}: {recipe_agent.family}, {recipe_agent.tokenizer} tokenizer ({len(tokenizer)} tokens), "
        f"{params / 1e6:.2f}M parameters; supervised warm-start for {recipe_agent.sft_steps} steps"
    )
    every = max(1, recipe_agent.sft_steps // 5)

    def progress(step: int, loss: float) -> None:
        if step % every == 0:
            log(f"  {name} sft step {step}: loss {loss:.3f} ({time.perf_counter() - start:.0f}s)")
        if on_step is not None:
            on_step(step, model, tokenizer, task)

    sft = SFTConfig(
        steps=recipe_agent.sft_steps,
        batch_size=recipe.sft_batch_size,
        lr=recipe_agent.sft_lr,
        warmup_steps=min(50, recipe_agent.sft_steps // 5),
        seed=recipe_agent.seed,
        schedule=recipe_agent.sft_schedule,
    )
    supervised_finetune(model, tokenizer, pairs, sft, on_step=progress)
    directory = save_agent(model, tokenizer, Path(out) / name)
    accuracy = _greedy_accuracy(name, directory, task, scoring) if evaluate_agent else None
    seconds = time.perf_counter() - start
    if accuracy is None:
        log(f"  {name}: warm-started in {seconds:.0f}s")
    else:
        log(f"  {name}: greedy accuracy {100 * accuracy:.1f}% on {len(task.eval)} eval prompts after {seconds:.0f}s")
    return name, {"parameters": params, "vocab": len(tokenizer), "seconds": seconds, "eval_pass@1": accuracy}


def _untrained_agent(recipe_agent, task):
    """A recipe agent's supervised pairs (prompt messages, worked solution; with its sub-skill mix), its tokenizer
    (characters, or a BPE trained on the train split) and its randomly initialised model."""
    from hacrl.tools.testbed.models import bpe_tokenizer, char_tokenizer, tiny_model

    expressions = [
        ex.columns["expression"] if "expression" in ex.columns else ex.columns["entry"]["metadata"]["expression"]
        for ex in task.train
    ]
    solve = boxed_solution if recipe_agent.target == "boxed" else worked_solution
    pairs = [(ex.messages, solve(e)) for ex, e in zip(task.train, expressions, strict=True)]
    system = [m["content"] for m in task.train[0].messages if m["role"] == "system"]
    texts = [f"{f'S:{system[0]}' if system else ''}Q:{ex.prompt}\nA:{target}"
             for ex, (_, target) in zip(task.train, pairs, strict=True)]  # fmt: skip
    if recipe_agent.sft_mix:
        pairs = _mix(pairs, [sub_skill(e) for e in expressions], recipe_agent.sft_mix)
    if recipe_agent.tokenizer == "char":
        tokenizer = char_tokenizer("".join(sorted({ch for t in texts for ch in t})))
    else:
        tokenizer = bpe_tokenizer(texts[:5000], recipe_agent.bpe_vocab, digits=recipe_agent.split_digits)
    model = tiny_model(
        recipe_agent.family,
        tokenizer,
        hidden=recipe_agent.hidden,
        layers=recipe_agent.layers,
        heads=recipe_agent.heads,
        kv_heads=recipe_agent.kv_heads,
        seed=recipe_agent.seed,
    )
    return pairs, tokenizer, model


def _greedy_accuracy(name: str, directory, task, scoring=None) -> float:
    """Greedy pass@1 of the saved agent in `directory` on the task's eval split."""
    from hacrl.agent.model import Agent
    from hacrl.config import AgentConfig, RolloutConfig, ScoringConfig
    from hacrl.driver.scoring import scorer_for
    from hacrl.tools.evaluate import evaluate

    scorer = scorer_for(task, scoring or ScoringConfig(), r_max=1.0).start()
    try:
        agent = Agent(0, AgentConfig(name=name, model=str(directory)), RolloutConfig(max_new_tokens=24))
        return evaluate(agent, task.eval, scorer)["pass@1"]
    finally:
        scorer.close()


def _check_task(data, expected, config_path, recipe: BootstrapRecipe) -> None:
    """The config trains on the task the recipe warm-starts its agents for; else a clear error before anything is
    built (e.g. the benchmarks' `complement` bed with the demo's config would train on additions only)."""
    from hacrl.errors import ConfigError

    if expected.source == "file":
        same = data.source == "file" and Path(data.train_file or "").resolve() == Path(expected.train_file).resolve()
        task = f"the files it generates ({expected.train_file})"
    else:
        same = data.source == expected.source and (data.task, dict(data.task_options)) == (
            expected.task,
            dict(expected.task_options),
        )
        task = f"reasoning-gym {expected.task} with {dict(expected.task_options)}"
    if not same:
        name = next((k for k, v in RECIPES.items() if v is recipe), "this recipe")
        hint = " (a generated-task bed runs with `python benchmarks/evidence.py --beds complement`)"
        raise ConfigError(
            f"{config_path} trains on another task than the {name!r} recipe's agents are warm-started for, "
            f"{task}; give a config whose data section is that task" + (hint if expected.source == "file" else "")
        )


def run_demo(config_path: str | Path, overrides: list[str] = (), recipe: BootstrapRecipe = DEMO) -> dict[str, Any]:
    """`hacrl demo`: bootstrap the agents if they are not cached, train them with the config, print a summary."""
    from hacrl.config import load_config
    from hacrl.driver.trainer import Trainer
    from hacrl.errors import ModelError
    from hacrl.tools.plot import plot_run

    config = load_config(config_path, overrides)
    start = time.perf_counter()
    agents_dir = Path(config.agents[0].model).parent
    _check_task(config.data, data_config(recipe, agents_dir), config_path, recipe)
    report = bootstrap(agents_dir, recipe, evaluate_agents=False)  # the run evaluates them at step 0
    missing = [a.model for a in config.agents if not (Path(a.model) / "config.json").is_file()]
    if missing:
        raise ModelError(f"the demo config names agents that bootstrap did not build: {missing}")
    bootstrap_seconds = time.perf_counter() - start
    run_dir = Path(config.trainer.output_dir)
    if run_dir.exists():  # the demo's own output: a rerun starts fresh
        import shutil

        _log(f"removing the previous demo run in {run_dir}")
        shutil.rmtree(run_dir)
    from hacrl.config.settings import AgentSettings

    group_size = {a.name: AgentSettings.resolve(a, config.rollout).group_size for a in config.agents}
    sizes = sorted(set(group_size.values()))
    _log(
        f"training {len(config.agents)} agents with {config.algorithm.name} for {config.trainer.steps} steps "
        f"({config.trainer.prompts_per_step} prompts x {'/'.join(map(str, sizes))} samples per agent and step)"
    )
    train_start = time.perf_counter()
    history = Trainer(config).train()
    train_seconds = time.perf_counter() - train_start
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    from hacrl.driver.evaluation import paired_change
    from hacrl.driver.metrics import eval_key, scope

    first = next(r for r in records if any(scope(k) == "eval" for k in r))
    last = records[-1]

    paired = _paired_records(run_dir, first["step"], last["step"]) if config.eval.save_completions else None
    rows = []
    for agent in config.agents:
        before, after = first.get(eval_key(agent.name, "pass@1")), last.get(eval_key(agent.name, "pass@1"))
        se = paired_change(*paired, agent.name, config.algorithm.r_max)[1] if paired else None
        rows.append(
            {
                "agent": agent.name,
                "before": before,
                "after": after,
                "change_se": se,
                "rollouts": len(history) * config.trainer.prompts_per_step * group_size[agent.name],
                "seconds": train_seconds,
            }
        )
    plot = plot_run(run_dir)[0]
    _print_summary(rows, report, bootstrap_seconds, run_dir, plot)
    return {"rows": rows, "bootstrap": report, "run_dir": str(run_dir)}


def _paired_records(run_dir: Path, first: int, last: int):
    """The per-prompt records of the first and last evaluation, when both were written."""
    from hacrl.driver.evaluation import eval_records_path, read_eval_records

    paths = eval_records_path(run_dir, first), eval_records_path(run_dir, last)
    if first == last or not all(p.is_file() for p in paths):
        return None
    return read_eval_records(run_dir, first), read_eval_records(run_dir, last)


def _print_summary(rows, report, bootstrap_seconds: float, run_dir: Path, plot: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    n = report.get("eval_prompts", 0)
    se = 100 * (0.25 / n) ** 0.5 if n else float("nan")
    table = Table(
        title=f"greedy accuracy, {n} held-out prompts (1 s.e. of an accuracy <= {se:.1f} pts; change: ± 1 s.e. "
        "of the paired difference)"
    )
    for column in ("agent", "before", "after", "change", "rollouts generated", "train time"):
        table.add_column(column, justify="left" if column == "agent" else "right")
    for r in rows:
        change = f"{100 * (r['after'] - r['before']):+.1f}" if r["before"] is not None else "-"
        if r["before"] is not None and r.get("change_se") is not None:
            change += f" ± {100 * r['change_se']:.1f}"
        table.add_row(
            r["agent"],
            f"{100 * r['before']:.1f}%",
            f"{100 * r['after']:.1f}%",
            change,
            str(r["rollouts"]),
            f"{r['seconds']:.0f}s",
        )
    console = Console()
    console.print(table)
    console.print(f"bootstrap (tokenizers, models, warm-start; cached): {bootstrap_seconds:.0f}s")
    console.print(
        f"run directory: {run_dir}  |  TensorBoard: tensorboard --logdir {run_dir / 'tensorboard'}  |  curves: {plot}"
    )
