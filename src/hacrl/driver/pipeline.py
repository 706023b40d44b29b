"""The fixed-lag pipeline's batches in flight (`trainer.lag` = k > 0): sampled and scored, not yet trained on.

After step t the driver holds batches t + 1 .. t + k (`Pending`): every agent's answers (text, the source's log-prob
sum, the agent's own token ids and the log-probs of the weights that sampled them) and their rewards. A checkpoint
holds them in `pending.pt` (tensors, numbers and strings only: read back with `weights_only`, never unpickled as
code), so a resumed run trains on exactly the batches the uninterrupted one would have and samples nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hacrl.checkpoint import restoring
from hacrl.driver.scoring import ScoreResult
from hacrl.errors import CheckpointError, first_line
from hacrl.messages import OwnRollout, Sampled, Trajectory

PENDING_FILE = "pending.pt"


@dataclass
class Pending:
    """One batch: every agent's `Sampled` (with its `OwnRollout` under lag) and its `ScoreResult`, in agent order."""

    step: int
    sampled: list[Sampled]
    scored: list[ScoreResult]


def write_pending(directory: Path, pending: list[Pending]) -> None:
    """`pending.pt` in a checkpoint directory being written."""
    torch.save({"batches": [_batch_state(b) for b in pending]}, directory / PENDING_FILE)


def read_pending(checkpoint: str | Path, step: int, lag: int, names: list[str]) -> list[Pending]:
    """The batches a checkpoint of step `step` holds for a run at `trainer.lag` = `lag`: steps step + 1 .. step + lag,
    checked; a CheckpointError naming the file otherwise."""
    file = Path(checkpoint) / PENDING_FILE
    try:
        state = torch.load(file, weights_only=True)
    except Exception as e:  # noqa: BLE001 - missing or damaged: named, with what to do
        raise CheckpointError(
            f"{file}: cannot read the batches in flight of this trainer.lag={lag} run ({type(e).__name__}: "
            f"{first_line(e)}); a checkpoint of a run without lag has none: resume with the trainer.lag it was "
            "written with, or from another checkpoint (checkpoint.resume=<dir>)"
        ) from None
    with restoring(checkpoint, "batches in flight"):
        batches = [_batch(b) for b in state["batches"]]
        steps = [b.step for b in batches]
        if steps != list(range(step + 1, step + 1 + lag)) or any(len(b.sampled) != len(names) for b in batches):
            raise ValueError(
                f"it holds batches {steps} of {len(batches[0].sampled) if batches else 0} agents, a step-{step} "
                f"checkpoint at trainer.lag={lag} needs {list(range(step + 1, step + 1 + lag))} of {len(names)}"
            )
    return batches


def _batch_state(batch: Pending) -> dict[str, Any]:
    return {
        "step": batch.step,
        "agents": [_agent_state(s, r) for s, r in zip(batch.sampled, batch.scored, strict=True)],
    }


def _agent_state(sampled: Sampled, scored: ScoreResult) -> dict[str, Any]:
    rollout = sampled.rollout
    state = {
        "trajectories": [_trajectory_state(t) for t in sampled.trajectories],
        "times": [sampled.generate_s, sampled.logprobs_s, *sampled.span],
        "rewards": list(scored.rewards),
        "timeouts": list(scored.timeouts),
        "errors": list(scored.errors),
    }
    if rollout is not None:
        state["rollout"] = {
            "step": rollout.step,
            "prompt_ids": rollout.prompt_ids,
            "response_ids": rollout.response_ids,
            "behaviour": torch.tensor([x for row in rollout.behaviour_logp for x in row], dtype=torch.float32),
            "lengths": [len(row) for row in rollout.behaviour_logp],
        }
    return state


def _trajectory_state(t: Trajectory) -> list[Any]:
    return [t.group, t.text, t.reward, t.source, t.source_logp_sum, t.source_num_tokens, t.finish_reason, t.num_bytes]


def _batch(state: dict[str, Any]) -> Pending:
    sampled, scored = [], []
    for agent in state["agents"]:
        trajectories = [Trajectory(*row) for row in agent["trajectories"]]
        generate_s, logprobs_s, began, ended = agent["times"]
        rollout = None
        if "rollout" in agent:
            r = agent["rollout"]
            flat, behaviour, start = r["behaviour"].tolist(), [], 0
            for length in r["lengths"]:
                behaviour.append(flat[start : start + length])
                start += length
            rollout = OwnRollout(r["step"], r["prompt_ids"], r["response_ids"], behaviour, trajectories)
        sampled.append(Sampled(trajectories, generate_s, logprobs_s, (began, ended), rollout=rollout))
        scored.append(ScoreResult(agent["rewards"], agent["timeouts"], agent["errors"]))
    return Pending(state["step"], sampled, scored)
