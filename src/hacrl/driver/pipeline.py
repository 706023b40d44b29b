"""The fixed-lag pipeline's batches in flight (`trainer.lag` = k > 0): sampled and scored, not yet trained on.

After step t the driver holds batches t + 1 .. t + k (`Pending`): every agent's answers (text, the source's log-prob
sum, the agent's own token ids and the log-probs of the weights that sampled them) and their rewards. A checkpoint
holds them in `pending.pt` (tensors, numbers and strings only: read back with `weights_only`, never unpickled as
code), so a resumed run trains on exactly the batches the uninterrupted one would have and samples nothing twice.
The file's layout and the checks of its values, made with every other part's before a checkpoint is used:
`hacrl.inflight`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hacrl.checkpoint import restoring
from hacrl.driver.scoring import ScoreResult
from hacrl.errors import CheckpointError, first_line
from hacrl.inflight import PENDING_FILE
from hacrl.messages import OwnRollout, Sampled, Trajectory


@dataclass
class Pending:
    """One batch: every agent's `Sampled` (with its `OwnRollout` under lag) and its `ScoreResult`, in agent order."""

    step: int
    sampled: list[Sampled]
    scored: list[ScoreResult]


def write_pending(directory: Path, pending: list[Pending]) -> None:
    """`pending.pt` in a checkpoint directory being written."""
    torch.save({"batches": [_batch_state(b) for b in pending]}, directory / PENDING_FILE)


def read_pending(checkpoint: str | Path, step: int, lag: int, notice) -> list[Pending]:
    """The batches in flight a resumed run at `trainer.lag` = `lag` takes from a step-`step` checkpoint: steps
    step + 1 .. step + lag. The file was checked with the rest of the checkpoint (`hacrl.inflight`), so it holds the
    batches of the lag its run had; a run resumed at another lag (only with `checkpoint.strict_resume=false`) keeps
    the first `lag` of them and drops the rest, or has the missing ones sampled by its first step, and `notice` says
    which."""
    file = Path(checkpoint) / PENDING_FILE
    if not file.is_file():
        held = []
    else:
        try:
            state = torch.load(file, weights_only=True)
        except Exception as e:  # noqa: BLE001 - changed since it was checked: named, with what to do
            raise CheckpointError(f"{file}: cannot read the batches in flight ({type(e).__name__}: {first_line(e)}); "
                                  "resume from another checkpoint (checkpoint.resume=<dir>)") from None  # fmt: skip
        with restoring(checkpoint, "batches in flight"):
            held = [_batch(b) for b in state["batches"]]
    if len(held) > lag:
        dropped = [b.step for b in held[lag:]]
        notice(f"{file} holds the batches in flight of a trainer.lag={len(held)} run; at trainer.lag={lag} the ones "
               f"for steps {dropped} are dropped (their prompts are never trained on) and "
               f"{'each step samples its own batch' if lag == 0 else 'sampled again later'}")  # fmt: skip
    elif len(held) < lag:
        missing = list(range(step + 1 + len(held), step + 1 + lag))
        notice(
            f"{'the checkpoint holds no batches in flight' if not held else f'{file} holds {len(held)} batches'}; "
            f"at trainer.lag={lag} the first step samples those for steps {missing} with the checkpoint's weights"
        )
    return held[:lag]


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
