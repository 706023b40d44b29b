"""Trajectory exchange (spec 2, step 5): the tokenizer-neutral record and each learner's view of a pool.

Only what the spec allows crosses agent boundaries: response text, reward, source agent id, the source's
pre-update log-prob sum and token count, and how the response ended. A learner keeps its own responses' sampled
ids; another agent's response is re-tokenized with the learner's tokenizer (see `Agent.encode_response`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from hacrl.agents import Agent


@dataclass(frozen=True)
class Trajectory:
    """One scored response, as every agent may see it."""

    group: int
    """Index of its prompt in the step (the advantage's group id)."""
    messages: list[dict[str, str]]
    """The raw prompt messages (each learner renders them with its own template)."""
    text: str
    """Decoded response text (special tokens dropped)."""
    reward: float
    source: int
    """Agent id that generated it."""
    source_logp_sum: float
    """Sum of the source's pre-update per-token log-probs of its response (EOS included)."""
    source_num_tokens: int
    """Number of response tokens in the source's tokenization."""
    finish_reason: str
    """`eos` or `length`."""
    num_bytes: int = -1
    """UTF-8 bytes of `text` (the `bytes` foreign-ratio normalisation, spec 3.4b); -1: not recorded, counted here."""

    @property
    def response_bytes(self) -> int:
        """b(y): the response text's UTF-8 byte count, at least 1 (EOS is not text)."""
        if self.num_bytes >= 0:
            return max(1, self.num_bytes)
        return max(1, len(self.text.encode("utf-8", errors="surrogatepass")))

    @property
    def truncated(self) -> bool:
        """Cut at the source's length limit."""
        return self.finish_reason == "length"

    @property
    def source_logp_mean(self) -> float:
        return self.source_logp_sum / self.source_num_tokens


@dataclass
class LearnerRow:
    """A pool entry in the learner's tokens."""

    prompt_ids: list[int]
    response_ids: list[int]
    source: int
    group: int
    reward: float
    source_logp_mean: float
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


def learner_pool(pool: list[Trajectory], learner: int, *, shared: bool) -> list[Trajectory]:
    """Learner k's pool (spec 2, step 5a): its own responses first, then, when the algorithm shares, each other
    agent's responses, agents in config order; within a source, the order they were sampled in. Mini-batches are
    taken in this order, so the own rows get the first optimizer steps and m counts the same for every learner.

    >>> pool = [Trajectory(0, [], "", 0.0, source, 0.0, 1, "eos") for source in (0, 0, 1, 2, 2)]
    >>> [t.source for t in learner_pool(pool, 1, shared=True)]
    [1, 0, 0, 2, 2]
    >>> [t.source for t in learner_pool(pool, 2, shared=False)]
    [2, 2]
    """
    own = [t for t in pool if t.source == learner]
    if not shared:
        return own
    return own + sorted((t for t in pool if t.source != learner), key=lambda t: t.source)


def learner_view(
    learner: Agent,
    pool: list[Trajectory],
    own_prompt_ids: list[list[int]],
    own_response_ids: list[list[int]],
    own_old_logp: list[Tensor],
) -> list[LearnerRow]:
    """The learner's rows for `pool`, in pool order. Own rows (source == learner.index) take the sampled ids and
    old log-probs in the order they were sampled; foreign rows are re-tokenized. `own_prompt_ids[g]` is the
    learner's rendering of prompt g, shared by own and foreign rows of that prompt."""
    rows, own = [], 0
    for traj in pool:
        if traj.source == learner.index:
            rows.append(
                LearnerRow(
                    own_prompt_ids[traj.group],
                    own_response_ids[own],
                    traj.source,
                    traj.group,
                    traj.reward,
                    traj.source_logp_mean,
                    own_old_logp[own],
                    cut=False,
                    source_logp_sum=traj.source_logp_sum,
                    source_num_tokens=traj.source_num_tokens,
                    num_bytes=traj.response_bytes,
                )
            )
            own += 1
        else:
            ids, cut = learner.encode_response(traj.text, finished=traj.finish_reason == "eos")
            rows.append(
                LearnerRow(
                    own_prompt_ids[traj.group],
                    ids,
                    traj.source,
                    traj.group,
                    traj.reward,
                    traj.source_logp_mean,
                    None,
                    cut=cut,
                    source_logp_sum=traj.source_logp_sum,
                    source_num_tokens=traj.source_num_tokens,
                    num_bytes=traj.response_bytes,
                )
            )
    if own != len(own_response_ids):
        raise ValueError(
            f"pool holds {own} of learner {learner.name!r}'s responses but it sampled {len(own_response_ids)}"
        )
    return rows
