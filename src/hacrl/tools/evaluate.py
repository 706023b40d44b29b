"""`hacrl eval`: saved agents (model directories, a checkpoint's agents, a run's newest checkpoint) evaluated alone,
each loaded into this process one at a time; and `evaluate`, one agent of this process on an eval split (bootstrap's
warm-starts use it too). Scoring and the metrics are the driver's (`hacrl.driver.evaluation`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hacrl.agent.model import Agent
from hacrl.agent.rollout import generate_completions
from hacrl.driver.evaluation import benchmark_table, evaluate_agents, write_benchmark_table
from hacrl.driver.scoring import Scorer
from hacrl.messages import Completion, GenerateCall
from hacrl.tasks.data import Example


def evaluate(
    agent: Agent,
    examples: list[Example],
    scorer: Scorer,
    *,
    num_samples: int = 0,
    batch_size: int = 64,
) -> dict[str, float]:
    """`completion_metrics` of an agent in this process (sampled completions draw from the process's stream)."""
    if not examples:
        return {}

    def generate(calls: list[GenerateCall]) -> list[list[Completion]]:
        return [
            generate_completions(agent, c.prompts, c.num_samples, greedy=c.greedy, batch_size=batch_size) for c in calls
        ]

    return evaluate_agents(examples, generate, scorer, num_agents=1, num_samples=num_samples)[0][0]


def evaluate_paths(config, paths) -> list[dict[str, Any]]:
    """`hacrl eval`: evaluate model directories, or every agent of a checkpoint, and print a table."""
    from hacrl.config.validation import check_devices_here
    from hacrl.driver.scoring import scorer_for
    from hacrl.errors import DataError
    from hacrl.tasks.data import load_task

    check_devices_here(config)
    dirs = [d for path in paths for d in _model_dirs(path)]  # (label, model directory); checked before data loads
    task = load_task(config.data, config.scoring)
    examples = task.eval[: config.eval.max_prompts] if config.eval.max_prompts else task.eval
    if not examples:
        raise DataError("the eval split is empty: set data.eval_file (source: file) or data.eval_size")
    scorer = scorer_for(task, config.scoring, r_max=config.algorithm.r_max).wait_ready()
    results = [
        {"agent": label, **by_split["eval"]}
        for label, by_split in _evaluate_saved(config, dirs, {"eval": examples}, scorer)
    ]
    _print_table(results, len(examples))
    return results


def evaluate_benchmarks(config, paths, benchmarks: list[str], *, out=None) -> dict[str, dict[str, dict[str, float]]]:
    """`hacrl eval PATH... --benchmarks NAME...`: every agent alone on each named set (at most `eval.max_prompts`
    prompts each, scored by the math verifier); prints the table, and writes it (markdown and JSON) under `out`."""
    from hacrl.driver.scoring import math_scorer
    from hacrl.errors import ConfigError
    from hacrl.named_sets import not_named
    from hacrl.tasks.data import load_benchmark

    problem = not_named(benchmarks)
    if problem:
        raise ConfigError(f"--benchmarks: {problem}")
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file: name a directory for the benchmark tables")
    from hacrl.config.validation import check_devices_here

    check_devices_here(config)
    dirs = [d for path in paths for d in _model_dirs(path)]
    rows = {b: load_benchmark(config.data, b, config.eval.max_prompts) for b in benchmarks}
    scorer = math_scorer(config.scoring, r_max=config.algorithm.r_max).start()
    results = dict(_evaluate_saved(config, dirs, rows, scorer))
    print(benchmark_table(results))
    if out is not None:
        import re

        # the step of the checkpoint the models come from (`.../step_000050/agents/<name>`): one, or none
        found = [re.fullmatch(r"step_(\d+)", Path(d).parent.parent.name) for _, d in dirs]
        steps = {int(m.group(1)) for m in found if m}
        step = steps.pop() if len(steps) == 1 and all(found) else None
        written = write_benchmark_table(out, step, results, replace=False)
        print(f"written: {written}.md and .json")
    return results


def _evaluate_saved(config, dirs, splits: dict[str, list[Example]], scorer: Scorer):
    """[(label, {split: result})]: each saved agent of `dirs` alone on each split, one agent loaded at a time."""
    by_name = {a.name: a for a in config.agents}
    out = []
    for i, (label, model_dir) in enumerate(dirs):
        agent = _saved_agent(i, by_name, model_dir, config.rollout)
        out.append(
            (
                label,
                {
                    name: evaluate(
                        agent, examples, scorer, num_samples=config.eval.num_samples, batch_size=config.eval.batch_size
                    )
                    for name, examples in splits.items()
                },
            )
        )
        del agent
    return out


def _saved_agent(index: int, by_name, model_dir, rollout) -> Agent:
    """An agent of a saved directory, for evaluation only (no optimizer state): a model directory, or a LoRA
    agent's adapters on the base model they name."""
    from dataclasses import replace

    from hacrl.checkpoint import adapter_base
    from hacrl.config import AgentConfig, LoraConfig

    base = by_name.get(model_dir.name, AgentConfig(name=model_dir.name, model=str(model_dir)))
    base_model = adapter_base(model_dir)
    if base_model is None:  # the directory is the model
        cfg, weights_from = replace(base, model=str(model_dir), tokenizer=None, lora=None), None
    else:  # the adapters on the base they name
        cfg, weights_from = replace(base, model=base_model, tokenizer=None, lora=base.lora or LoraConfig()), model_dir
    agent = Agent(index, cfg, rollout, weights_from=weights_from, role="sampler")  # it samples, steps nothing
    agent.model.eval()
    return agent


def _model_dirs(path) -> list[tuple[str, Any]]:
    """A model directory as it is; every agent of a checkpoint; every agent of a run directory's newest checkpoint."""
    from hacrl.checkpoint import AGENTS_DIR, checkpoint_root, checkpoint_to_read
    from hacrl.errors import ModelError

    def notice(message: str) -> None:
        print(f"hacrl eval: {message}")

    if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
        return [(path.name, path)]
    if (path / AGENTS_DIR).is_dir():
        checkpoint_to_read(path, notice=notice)  # a damaged checkpoint is refused, not evaluated
    elif checkpoint_root(path).is_dir():  # a run directory
        newest = checkpoint_to_read(path, notice=notice)
        if newest is None:
            raise ModelError(f"{str(path)!r} is a run directory without a complete, undamaged checkpoint: nothing to "
                             "evaluate")  # fmt: skip
        notice(f"{path} is a run directory; evaluating its newest checkpoint, {newest.name}")
        path = newest
    if (path / AGENTS_DIR).is_dir():
        return [(f"{p.name} ({path.name})", p) for p in sorted((path / AGENTS_DIR).iterdir()) if p.is_dir()]
    raise ModelError(
        f"{str(path)!r} is not a model directory (no config.json), a checkpoint (no agents/) or a run directory "
        "(no checkpoints/); give one of those"
    )


def _print_table(results: list[dict[str, Any]], num_prompts: int) -> None:
    from rich.console import Console
    from rich.table import Table

    keys = [k for k in results[0] if k != "agent"]
    table = Table(title=f"independent evaluation on {num_prompts} eval prompts")
    table.add_column("agent", overflow="fold")
    for key in keys:
        table.add_column(key, justify="right")
    for row in results:
        table.add_row(row["agent"], *(f"{row[k]:.4f}" for k in keys))
    Console().print(table)
