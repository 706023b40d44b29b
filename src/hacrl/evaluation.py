"""Independent execution: each agent alone on the eval split, greedy pass@1 and optional sampled avg@k."""

from __future__ import annotations

from typing import Any

from hacrl.agents import Agent
from hacrl.data import Example
from hacrl.rewards import RewardFn, score
from hacrl.rollout import generate


def evaluate(
    agent: Agent,
    examples: list[Example],
    reward_fn: RewardFn,
    *,
    r_max: float = 1.0,
    num_samples: int = 0,
    batch_size: int = 64,
) -> dict[str, float]:
    """`pass@1` (greedy accuracy: reward == r_max), `reward_mean` (greedy), `avg@k` (sampled, k = num_samples),
    `length_mean` and `finished` (fraction ending with EOS) of one agent."""
    if not examples:
        return {}
    prompts = [agent.render_prompt(ex.messages)[0] for ex in examples]
    greedy = generate(agent, prompts, 1, greedy=True, batch_size=batch_size)
    rewards = _score(reward_fn, examples, [s.text for s in greedy], r_max)
    out = {
        "pass@1": sum(r >= r_max for r in rewards) / len(rewards),
        "reward_mean": sum(rewards) / len(rewards),
        "length_mean": sum(len(s.response_ids) for s in greedy) / len(greedy),
        "finished": sum(s.finished for s in greedy) / len(greedy),
    }
    if num_samples > 0:
        sampled = generate(agent, prompts, num_samples, batch_size=batch_size)
        repeated = [ex for ex in examples for _ in range(num_samples)]
        sampled_rewards = _score(reward_fn, repeated, [s.text for s in sampled], r_max)
        out[f"avg@{num_samples}"] = sum(r >= r_max for r in sampled_rewards) / len(sampled_rewards)
    return out


def _score(reward_fn: RewardFn, examples: list[Example], completions: list[str], r_max: float) -> list[float]:
    columns: dict[str, list[Any]] = {key: [ex.columns.get(key) for ex in examples] for key in examples[0].columns}
    return score(reward_fn, [ex.prompt for ex in examples], completions, columns, r_max=r_max)


def evaluate_paths(config, paths) -> list[dict[str, Any]]:
    """`hacrl eval`: evaluate model directories, or every agent of a checkpoint, and print a table."""
    from dataclasses import replace

    from hacrl.config import AgentConfig
    from hacrl.data import load_task

    task = load_task(config.data)
    examples = task.eval[: config.eval.max_prompts] if config.eval.max_prompts else task.eval
    if not examples:
        raise ValueError("the eval split is empty: set data.eval_file (source: file) or data.eval_size")
    by_name = {a.name: a for a in config.agents}
    dirs = []  # (label, model directory)
    for path in paths:
        if (path / "agents").is_dir():  # a checkpoint: every agent in it
            dirs.extend((f"{p.name} ({path.name})", p) for p in sorted((path / "agents").iterdir()) if p.is_dir())
        else:
            dirs.append((path.name, path))
    results = []
    for i, (label, model_dir) in enumerate(dirs):
        base = by_name.get(model_dir.name, AgentConfig(name=model_dir.name, model=str(model_dir)))
        agent = Agent(i, replace(base, model=str(model_dir), tokenizer=None), config.rollout)
        result = evaluate(
            agent,
            examples,
            task.reward,
            r_max=config.algorithm.r_max,
            num_samples=config.eval.num_samples,
            batch_size=config.eval.batch_size,
        )
        results.append({"agent": label, **result})
        del agent
    _print_table(results, len(examples))
    return results


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
