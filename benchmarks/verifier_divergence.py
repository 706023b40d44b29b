"""Where a round-4 run parts from the committed round-3 run it should repeat: which rewards does today's verifier give
that round 3's gave otherwise? (analysis.md, round 4: "`all` against the committed rounds, and the verifier").

Reruns a grid run's config (`round4/.runs/<bed>/<method>-s<seed>/config.yaml`, written by `benchmarks/sharing.py`)
for `--steps` steps into a scratch directory, records every scoring call (training rollouts and evaluations), and
scores each completion again with round 3's verifier (`src/hacrl/rewards.py` at commit 79cbd64, read with `git
show`). Prints and writes (`--out`, JSON) each completion scored differently: the call, the row, the gold answer,
both rewards and the text. Needs the grid's warm-starts in `.cache/bench-agents` and a git checkout with history.

    python benchmarks/verifier_divergence.py --seed 1 --steps 66   # round 4's gap `all` seed 1 parts at step 65
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROUND3_VERIFIER = "79cbd64:src/hacrl/rewards.py"


def round3_verifier(scratch: Path):
    """Round 3's `math_reward()`, loaded from git into a module of its own."""
    source = subprocess.run(["git", "show", ROUND3_VERIFIER], cwd=ROOT, capture_output=True, text=True, check=True)
    path = scratch / "round3_rewards.py"
    path.write_text(source.stdout)
    spec = importlib.util.spec_from_file_location("round3_rewards", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.math_reward()


def rescore(calls: list[tuple[list[str], list[str], list[float]]], old) -> list[dict]:
    """Each recorded scoring call (completions, gold answers, today's rewards) scored again with `old`: the rows
    whose rewards differ."""
    found = []
    for call, (texts, answers, rewards) in enumerate(calls):
        again = old([""] * len(texts), texts, answers)
        for row, (text, answer, new, was) in enumerate(zip(texts, answers, rewards, again, strict=True)):
            if new != was:
                found.append({"call": call, "row": row, "answer": answer, "text": text, "today": new, "round3": was})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True, help="steps to rerun (one past the first that differs)")
    parser.add_argument("--bed", default="gap")
    parser.add_argument("--method", default="all")
    parser.add_argument("--out", type=Path, help="JSON file for the differences")
    args = parser.parse_args(argv)
    config = ROOT / f"benchmarks/results/round4/.runs/{args.bed}/{args.method}-s{args.seed}/config.yaml"
    if not config.exists():
        rerun = f"python benchmarks/sharing.py --beds {args.bed} --seeds {args.seed}"
        parser.error(f"{config} does not exist: run `{rerun}` first")

    from hacrl.driver import scoring
    from hacrl.tools.cli import main as hacrl

    calls = []
    score = scoring.Scorer.score

    def recording(self, prompts, completions, columns):
        result = score(self, prompts, completions, columns)
        calls.append((list(completions), [str(a) for a in columns["answer"]], list(result.rewards)))
        return result

    scoring.Scorer.score = recording
    try:
        with tempfile.TemporaryDirectory() as scratch:
            old = round3_verifier(Path(scratch))
            rc = hacrl(["train", str(config), f"trainer.steps={args.steps}", f"trainer.output_dir={scratch}/run"])
            if rc:
                return rc
            found = rescore(calls, old)
    finally:
        scoring.Scorer.score = score
    print(f"{len(calls)} scoring calls, {sum(len(c[0]) for c in calls)} completions, {len(found)} scored differently")
    print(json.dumps(found, indent=1))
    if args.out:
        args.out.write_text(json.dumps(found, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
