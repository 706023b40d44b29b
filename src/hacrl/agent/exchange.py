"""Trajectory exchange (spec 2, step 5): each learner's view of a pool of `hacrl.messages.Trajectory` records.

Only what the spec allows crosses agent boundaries: response text, reward, source agent id, the source's
pre-update log-prob sum and token count, and how the response ended. A learner keeps its own responses' sampled
ids; another agent's response is re-tokenized with the learner's tokenizer (see `Agent.encode_response`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from hacrl.agent.model import Agent
from hacrl.messages import Trajectory


@dataclass
class LearnerRow:
    """A pool entry in the learner's tokens."""

    prompt_ids: list[int]
    response_ids: list[int]
    source: int
    group: int
    reward: float
    old_logp: Tensor | None
    """(len(response_ids),) learner's own pre-update log-probs; None for another agent's response."""
    cut: bool
    """Re-tokenized response cut to the learner's `max_new_tokens` (foreign rows only)."""
    source_logp_sum: float = 0.0
    """The source's summed pre-update log-probs of the response (in the source's tokens)."""
    source_num_tokens: int = 1
    """The response's length in the source's tokens."""
    num_bytes: int = 1
    """The response text's UTF-8 byte count (at least 1)."""
    behaviour_logp: Tensor | None = None
    """(len(response_ids),) an own row's log-probs under the weights that sampled it, when older than `old_logp`'s
    (`trainer.lag` > 0); None otherwise."""
    foreign_shift: float = 0.0
    """A foreign row's shift of its log-ratio (`algorithm.foreign_center: median`: its source's median); 0 else."""


def learner_rows(
    learner: Agent,
    own: list[Trajectory],
    foreign: list[Trajectory],
    prompt_ids: list[list[int]],
    own_response_ids: list[list[int]],
    own_old_logp: list[Tensor | None],
) -> list[LearnerRow]:
    """The learner's pool in its own tokens: its own responses (scored, in the order it sampled them, with their
    sampled ids and old log-probs), then `foreign`, re-tokenized with the learner's tokenizer. `prompt_ids[g]` is
    the learner's rendering of prompt g, shared by own and foreign rows of that prompt."""
    if not len(own) == len(own_response_ids) == len(own_old_logp):
        raise ValueError(
            f"learner {learner.name!r}: {len(own)} own trajectories for {len(own_response_ids)} sampled responses"
        )
    rows = []
    for traj, ids, old in zip(own, own_response_ids, own_old_logp, strict=True):
        rows.append(_row(traj, prompt_ids, ids, old, cut=False))
    for traj in foreign:
        if traj.source == learner.index:
            raise ValueError(f"learner {learner.name!r}: one of its own responses came back as a foreign trajectory")
        ids, cut = learner.encode_response(traj.text, finished=traj.finish_reason == "eos")
        rows.append(_row(traj, prompt_ids, ids, None, cut=cut))
    return rows


def _row(traj: Trajectory, prompt_ids: list[list[int]], ids: list[int], old: Tensor | None, *, cut: bool) -> LearnerRow:
    return LearnerRow(
        prompt_ids[traj.group],
        ids,
        traj.source,
        traj.group,
        traj.reward,
        old,
        cut=cut,
        source_logp_sum=traj.source_logp_sum,
        source_num_tokens=traj.source_num_tokens,
        num_bytes=traj.response_bytes,
    )
