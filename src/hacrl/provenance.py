"""Which log-probs each of an agent's own rows carries, from whom and when: one small pure plan (`LogprobPlan`), made
from the agent's `WorkerSpec` alone, that the sampling role, the learning role and the driver's schedule all read.

An own row's update needs two per-token log-prob vectors (spec 2, steps 3 and 5): the *behaviour* ones, of the
weights that sampled it (its truncated importance weight under `trainer.lag` or `trainer.old_logprobs: corrected`,
and its log-prob sum, which the other learners read when the algorithm shares), and the *proximal* (old) ones, of
the weights its update starts from (the ratio's denominator). Where they come from:

    rows                      behaviour                           proximal
    the first mini-batch      the sampling pass (below)           the training forward's own, detached: these rows
    (rows [0, first))                                             train before the first optimizer step (ratio 1)
    the rest, lag 0           recompute: the learner's pass at    the behaviour ones (the same weights)
                              sampling; sampler: the sampler's    corrected: the learner's pass at sampling
                              report; corrected: the report
    the rest, lag k >= 1      as at lag 0 (recompute: every       the learner's pass when the update starts, with
                              row's learner pass at sampling)     its starting weights: by the learner's own process,
                                                                  or by its sampler of its own (`sampler_devices`)
                                                                  while the learner trains the first mini-batch

The sampling pass runs over `at_sampling(count)` rows; a row whose behaviour log-probs nobody reads gets none. The
proximal pass of a lagged update covers `proximal_rows(count)`, and its values reach the learner as one plain value,
`ProximalLogprobs` (row index -> float32 values), after its first optimizer step, whichever process computed them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hacrl.config.settings import AgentSettings, OldLogprobs, old_logprobs_of
from hacrl.messages import WorkerSpec

ProximalBy = Literal["none", "learner", "sampler"]


@dataclass(frozen=True)
class RowSources:
    """Where one own row's log-probs come from (`LogprobPlan.sources`): in words, for documents and tests."""

    behaviour: str
    proximal: str


@dataclass(frozen=True)
class LogprobPlan:
    """One agent's plan (module docstring), the same in every process that holds its spec."""

    mode: OldLogprobs
    """`trainer.old_logprobs` resolved for the agent: recompute, sampler or corrected."""
    lag: int
    """`trainer.lag`: k > 0 trains a batch k steps after it was sampled."""
    mini_batch: int
    """`trainer.mini_batch_size`: the first mini-batch's rows train before any optimizer step."""
    sums_read: bool
    """Other learners read this agent's log-prob sums (a sharing algorithm with several agents)."""
    proximal_by: ProximalBy
    """Who computes a lagged update's proximal pass: its learner, its sampler of its own, none (lag 0, frozen)."""
    layout: str = "blocks"
    """`trainer.mini_batch_layout`: with `mixed` and foreign rows in the pool, the first step holds a share of the
    own rows that depends on how many foreign rows the learner keeps, known only when it learns."""

    @classmethod
    def of(cls, spec: WorkerSpec) -> LogprobPlan:
        from hacrl.core import get_algorithm

        algorithm = get_algorithm(spec.algorithm.name)
        sampler = AgentSettings.resolve(spec.agent, spec.rollout).sampler
        placement = spec.placement
        proximal_by: ProximalBy = "none"
        if spec.trainer.lag and not spec.agent.frozen:  # a worker group's ranks compute theirs
            apart = placement.sampler_device is not None and not placement.group
            proximal_by = "sampler" if apart else "learner"
        return cls(
            mode=old_logprobs_of(spec.trainer.old_logprobs, sampler, algorithm.takes_stale_rows),
            lag=spec.trainer.lag,
            mini_batch=spec.trainer.mini_batch_size,
            layout=spec.trainer.mini_batch_layout,
            sums_read=algorithm.pool_is_shared(spec.algorithm.params()) and spec.num_agents > 1,
            proximal_by=proximal_by,
        )

    def first(self, count: int) -> int:
        """The rows of the first mini-batch of an update of `count` own rows: they need no proximal pass. With the
        `mixed` layout beside foreign rows, none is sure to be in the first step: every row gets the pass (at lag 0
        every row's log-probs are computed at sampling anyway, for the others' sums)."""
        if self.layout == "mixed" and self.sums_read:
            return 0
        return min(count, self.mini_batch)

    @property
    def weighs_behaviour(self) -> bool:
        """Whether own rows carry behaviour log-probs other than their proximal ones, weighted by the truncated ratio
        of the two: sampled by older weights (lag), or reported by the sampler (`corrected`)."""
        return bool(self.lag) or self.mode == "corrected"

    def at_sampling(self, count: int) -> list[int]:
        """The rows of a batch of `count` whose log-probs are computed when it is sampled: by the learner's pass
        (`recompute`, `corrected`'s proximal ones at lag 0) or taken from the sampler's report (`sampler`). All rows
        when their behaviour log-probs are read (lag, or log-prob sums the other learners read); else only the rows
        after the first mini-batch. `corrected` reports every row's behaviour, so it computes only lag 0's proximal
        rows (a lagged update's come when it starts)."""
        rest = list(range(self.first(count), count))
        if self.mode == "corrected":
            return [] if self.lag else rest
        if self.lag or self.sums_read:
            return list(range(count))
        return rest

    def proximal_rows(self, count: int) -> range:
        """The rows of a lagged update of `count` own rows whose proximal log-probs are computed when it starts."""
        return range(self.first(count), count) if self.proximal_by != "none" else range(0)

    def sources(self, count: int) -> list[RowSources]:
        """Each row's sources, as the table of the module docstring says them."""
        first, sampled = self.first(count), set(self.at_sampling(count))
        report = "the sampler's report"
        out = []
        for i in range(count):
            pass_ = "the learner's pass at sampling"
            behaviour = report if self.mode == "corrected" else "none"
            if i in sampled and self.mode != "corrected":
                behaviour = pass_ if self.mode == "recompute" else report
            if i < first:
                proximal = "the training forward"
            elif self.lag:
                who = "its sampler" if self.proximal_by == "sampler" else "the learner"
                proximal = f"{who}'s pass when the update starts" if self.proximal_by != "none" else "none"
            else:
                proximal = pass_ if self.mode == "corrected" else behaviour
            out.append(RowSources(behaviour, proximal))
        return out


@dataclass(frozen=True)
class ProximalLogprobs:
    """A lagged update's proximal pass (`LogprobPlan.proximal_rows`): each own row's per-token log-probs under the
    update's starting weights, by row index in the update's own rollout (float32 values, as lists: a tensor would
    travel as shared memory its process hands over, lost if it dies before the learner reads the reply)."""

    step: int
    rows: list[int]
    values: list[list[float]]

    def value(self) -> ProximalLogprobs:
        """Itself: a pass the learner's own process made is read as a reply from its sampler is (`Deferred`)."""
        return self
