"""Independent execution: each agent alone on the eval split, greedy pass@1 and optional sampled avg@k.

Generating is the agent's side (`generate_completions`, called by a worker); scoring and the metrics are the
driver's (`completion_metrics`). `evaluate_agents` does both for any number of agents, given how they generate:
the trainer's workers, or one agent in the calling process (`hacrl.tools.evaluate`: `hacrl eval`, bootstrap).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hacrl.driver.scoring import Scorer, ScoreResult
from hacrl.messages import Completion, GenerateCall
from hacrl.tasks.data import Example


def completion_metrics(
    examples: list[Example],
    greedy: list[Completion],
    sampled: list[Completion] | None,
    scorer: Scorer,
    num_samples: int = 0,
    rewards_out: list[float] | None = None,
) -> dict[str, float]:
    """`pass@1` (greedy accuracy: reward == r_max), `reward_mean` (greedy), `avg@k` (the mean accuracy of k
    sampled answers per prompt, k = num_samples), `pass@k` (the share of prompts with at least one of the k right),
    `length_mean`, `finished` (fraction ending with EOS) and `reward_timeouts` of one agent. `rewards_out`, when
    given, receives the greedy reward of every example, in order."""
    r_max = scorer.r_max
    result = _score(scorer, examples, [c.text for c in greedy])
    rewards = result.rewards
    if rewards_out is not None:
        rewards_out.extend(float(r) for r in rewards)
    out = {
        "pass@1": sum(r >= r_max for r in rewards) / len(rewards),
        "reward_mean": sum(rewards) / len(rewards),
        "length_mean": sum(c.num_tokens for c in greedy) / len(greedy),
        "finished": sum(c.finished for c in greedy) / len(greedy),
    }
    timeouts = len(result.timeouts)
    if num_samples > 0 and sampled is not None:
        repeated = [ex for ex in examples for _ in range(num_samples)]
        sampled_result = _score(scorer, repeated, [c.text for c in sampled])
        right = [r >= r_max for r in sampled_result.rewards]
        out[f"avg@{num_samples}"] = sum(right) / len(right)
        per_prompt = [right[i : i + num_samples] for i in range(0, len(right), num_samples)]
        out[f"pass@{num_samples}"] = sum(any(p) for p in per_prompt) / len(per_prompt)
        timeouts += len(sampled_result.timeouts)
    out["reward_timeouts"] = timeouts
    return out


def evaluate_agents(
    examples: list[Example],
    generate: Callable[[list[GenerateCall]], list[list[Completion]]],
    scorer: Scorer,
    *,
    num_agents: int,
    num_samples: int = 0,
    seeds: list[int | None] | None = None,
) -> tuple[list[dict[str, float]], list[list[Completion]], list[list[float]]]:
    """Each of `num_agents` agents alone on `examples`: `completion_metrics` of its greedy completions and, with
    `num_samples` > 0, of `num_samples` sampled ones per prompt (agent j's drawn from a stream seeded `seeds[j]`;
    None: the generating process's own). `generate(calls)` gives each agent's completions of its call: the run's
    workers (`Trainer.evaluate`) or an agent in this process (`evaluate`).

    Returns every agent's metrics, its greedy completions and the reward of each (for the per-prompt records)."""
    prompts = [ex.messages for ex in examples]
    greedy = generate([GenerateCall(prompts, 1, True)] * num_agents)
    sampled: list[list[Completion] | None] = [None] * num_agents
    if num_samples > 0:
        seeds = seeds or [None] * num_agents
        sampled = generate([GenerateCall(prompts, num_samples, False, seeds[j]) for j in range(num_agents)])
    rewards: list[list[float]] = [[] for _ in range(num_agents)]
    metrics = [
        completion_metrics(examples, greedy[j], sampled[j], scorer, num_samples, rewards_out=rewards[j])
        for j in range(num_agents)
    ]
    return metrics, greedy, rewards


def _score(scorer: Scorer, examples: list[Example], completions: list[str]) -> ScoreResult:
    columns: dict[str, list[Any]] = {key: [ex.columns.get(key) for ex in examples] for key in examples[0].columns}
    return scorer.score([ex.prompt for ex in examples], completions, columns)


def eval_records_path(run_dir, step: int, benchmark: str | None = None):
    """`<run_dir>/eval/step_NNNNNN.jsonl`, or `<run_dir>/eval/<benchmark>/step_NNNNNN.jsonl` for a benchmark."""

    folder = Path(run_dir) / "eval"
    return (folder / benchmark if benchmark else folder) / f"step_{step:06d}.jsonl"


def write_eval_records(
    run_dir, step: int, examples: list[Example], names, greedy, rewards, benchmark: str | None = None
) -> None:
    """`eval_records_path(...)`: one line per eval prompt, `{"index", "prompt", "agents": {name:
    {"completion", "reward", "num_tokens", "finished"}}}`. Written to a temporary file, then renamed, so a reader
    (or a crash) never sees half of one."""
    import json
    import os

    path = eval_records_path(run_dir, step, benchmark)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w") as f:
        for i, ex in enumerate(examples):
            agents = {
                name: {
                    "completion": greedy[j][i].text,
                    "reward": rewards[j][i],
                    "num_tokens": greedy[j][i].num_tokens,
                    "finished": greedy[j][i].finished,
                }
                for j, name in enumerate(names)
            }
            f.write(json.dumps({"index": i, "prompt": ex.prompt, "agents": agents}) + "\n")
    os.replace(tmp, path)


BENCHMARK_COLUMNS = ("pass@1", "avg@", "pass@")
"""What the benchmark table shows per agent and benchmark: greedy pass@1 (the paper's accuracy: its evaluation is
greedy), then avg@k and pass@k when eval.num_samples = k."""


def benchmark_table(results: dict[str, dict[str, dict[str, float]]], step: int | None = None) -> str:
    """`results[agent][benchmark]` (`completion_metrics`) as a markdown table: a row per agent, a column per
    benchmark and metric, in percent, and the mean over benchmarks of each metric (the paper's "average")."""
    benchmarks = list(next(iter(results.values())))
    metrics = [k for k in next(iter(next(iter(results.values())).values())) if k.startswith(BENCHMARK_COLUMNS)]
    head = ["agent", *(f"{b} {m}" for b in benchmarks for m in metrics), *(f"mean {m}" for m in metrics)]
    lines = [f"Benchmarks{f' at step {step}' if step is not None else ''} (accuracy, %)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    for agent, per_bench in results.items():
        cells = [f"{100 * per_bench[b][m]:.1f}" for b in benchmarks for m in metrics]
        means = [f"{100 * sum(per_bench[b][m] for b in benchmarks) / len(benchmarks):.1f}" for m in metrics]
        lines.append("| " + " | ".join([agent, *cells, *means]) + " |")
    return "\n".join(lines) + "\n"


def write_benchmark_table(
    directory, step: int | None, results: dict[str, dict[str, dict[str, float]]], *, replace: bool = True
):
    """`<directory>/benchmarks_step_NNNNNN.json` (every metric) and `.md` (the table), each written whole
    (`benchmarks.json` / `.md` when the results are of no one step). With `replace=False` an existing table is
    kept and the new one is numbered (`..._2`, `..._3`, ...). Returns the path written, without its suffix."""
    import json

    from hacrl.files import write_atomically

    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        from hacrl.errors import ConfigError

        raise ConfigError(f"--out {str(folder)!r} is a file: name a directory for the benchmark tables")
    folder.mkdir(parents=True, exist_ok=True)
    base = "benchmarks" if step is None else f"benchmarks_step_{step:06d}"
    stem, number = folder / base, 1
    while not replace and any(stem.with_name(stem.name + s).exists() for s in (".json", ".md")):
        number += 1
        stem = folder / f"{base}_{number}"
    for suffix, text in (
        (".json", json.dumps({"step": step, "results": results}, indent=2) + "\n"),
        (".md", benchmark_table(results, step)),
    ):
        write_atomically(stem.with_name(stem.name + suffix), text)
    return stem


def read_eval_records(run_dir, step: int) -> list[dict[str, Any]]:
    import json

    return [json.loads(line) for line in eval_records_path(run_dir, step).read_text().splitlines()]


def paired_change(before: list[dict[str, Any]], after: list[dict[str, Any]], agent: str, r_max: float = 1.0):
    """Change in greedy accuracy of `agent` between two evaluations of the same prompts, and its standard error
    from the per-prompt differences (paired: both evaluations score the same prompts, so prompt difficulty cancels).
    Returns (change, standard error), as fractions."""
    if len(before) != len(after) or any(b["prompt"] != a["prompt"] for b, a in zip(before, after, strict=True)):
        raise ValueError("paired_change needs two evaluations of the same prompts in the same order")
    diffs = [
        float(a["agents"][agent]["reward"] >= r_max) - float(b["agents"][agent]["reward"] >= r_max)
        for b, a in zip(before, after, strict=True)
    ]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else float("nan")
    return mean, (var / n) ** 0.5
