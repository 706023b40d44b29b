"""Warm-start calibration of a test bed: greedy accuracy per sub-skill along one agent's supervised warm-start.

A bed's warm-start budgets (how many supervised steps each agent gets) are fixed from warm-start accuracies
alone, before any RL run (benchmarks/results/analysis.md pre-registers the rule per round). This script gives
those curves: the recipe's agent warm-started for `--steps` steps, evaluated greedily every `--every` steps on the
first `--eval` held-out prompts, split by sub-skill (`+`, `-`) where the task has both. The evaluation leaves the
warm-start alone (a saved copy is evaluated; the warm-start's own random stream is untouched), so the point at
step k is the agent that a budget of k steps gives (with a constant learning rate; a cosine schedule depends on
the total).

    python benchmarks/warm_start_curve.py --recipe gap --agent qwen-bpe --steps 1600 --every 160
    python benchmarks/warm_start_curve.py --recipe gap --seed 1 ...     # the seed-shifted warm-start of seed 1
    python benchmarks/warm_start_curve.py --smoke --out /tmp/c          # seconds: tiny agents (the tests run it)

Prints a table and writes `<out>/<recipe>-s<seed>-<agent>.json` (default out: benchmarks/results/round3/
calibration).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def curve(recipe_name: str, agent_name: str, steps: int, every: int, eval_size: int, seed: int, work: Path) -> dict:
    """The warm-start of one recipe agent with evaluations along the way (see the module docstring)."""
    import torch
    from beds import recipes

    from hacrl.agent.model import Agent
    from hacrl.config import AgentConfig, RolloutConfig, ScoringConfig
    from hacrl.driver.scoring import scorer_for
    from hacrl.tools.evaluate import evaluate
    from hacrl.tools.testbed.demo import _warm_start_agent, sub_skill, with_seed, write_task_files
    from hacrl.tools.testbed.models import save_agent

    recipe = with_seed(recipes()[recipe_name], seed)
    agent_recipe = next((a for a in recipe.agents if a.name == agent_name), None)
    if agent_recipe is None:
        raise SystemExit(f"recipe {recipe_name!r} has no agent {agent_name!r}: {[a.name for a in recipe.agents]}")
    recipe = replace(recipe, agents=[replace(agent_recipe, sft_steps=steps)])
    if "generator" in recipe.data:
        write_task_files(recipe, work)
    points: list[dict] = []
    scorer = None

    def on_step(step: int, model, tokenizer, task) -> None:
        nonlocal scorer
        if step % every and step != steps:
            return
        if scorer is None:
            scorer = scorer_for(task, ScoringConfig(), r_max=1.0).start()
        directory = save_agent(model, tokenizer, work / "eval-copy")
        agent = Agent(0, AgentConfig(name=agent_name, model=str(directory)), RolloutConfig(max_new_tokens=24))
        examples = task.eval[:eval_size]
        by_skill: dict[str, list] = {}
        for ex in examples:
            by_skill.setdefault(_skill(ex.prompt, sub_skill), []).append(ex)
        accuracy = {skill: evaluate(agent, subset, scorer)["pass@1"] for skill, subset in sorted(by_skill.items())}
        point = {"step": step, "all": sum(accuracy[k] * len(v) for k, v in by_skill.items()) / len(examples)}
        if len(accuracy) > 1:
            point |= accuracy
        points.append(point)
        shown = "  ".join(f"{k} {100 * v:5.1f} %" for k, v in point.items() if k != "step")
        print(f"{agent_name} s{seed} step {step:5d}: {shown}", flush=True)

    start = time.perf_counter()
    try:
        _warm_start_agent(recipe, agent_name, str(work), torch.get_num_threads(), False, on_step=on_step)
    finally:
        if scorer is not None:
            scorer.close()
    return {
        "recipe": recipe_name, "agent": agent_name, "seed": seed, "steps": steps, "every": every,
        "eval_prompts": eval_size, "agent_recipe": {k: v for k, v in vars(recipe.agents[0]).items()},
        "points": points, "seconds": time.perf_counter() - start,
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
                   f"{torch.__version__}",
    }  # fmt: skip


def _skill(prompt: str, sub_skill) -> str:
    try:
        return sub_skill(prompt)
    except ValueError:
        return "all"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="gap", help="a bootstrap recipe (benchmarks/beds.py: recipes())")
    parser.add_argument("--agent", help="the recipe's agent (default: its first)")
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--every", type=int, default=160)
    parser.add_argument("--eval", type=int, default=640, help="held-out prompts per evaluation")
    parser.add_argument("--seed", type=int, default=0, help="the benchmark seed (seed-shifted warm-start)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "round3" / "calibration"))
    parser.add_argument("--smoke", action="store_true", help="tiny agents, a few steps (seconds)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.recipe, args.steps, args.every, args.eval = "tiny_gap", 6, 3, 16
    from beds import recipes

    agent = args.agent or recipes()[args.recipe].agents[0].name
    with tempfile.TemporaryDirectory() as tmp:
        result = curve(args.recipe, agent, args.steps, args.every, args.eval, args.seed, Path(tmp))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.recipe}-s{args.seed}-{agent}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
