"""Which part of each batch one process of an agent handles, and how the parts meet: the one strategy both of its
roles are given (`hacrl.agent.sampling`, `hacrl.agent.learning`).

    Share.whole()         one worker: the whole batch, from the agent's own stream
    Share.of_rank(info)   rank r of a worker group (`agents.<i>.devices`, FSDP2): rank r's contiguous share of the
                          prompts and of each mini-batch's rows, from its own stream (`seeds.rank`); the parts meet in
                          collectives (every rank gets every rank's sampled share, rank 0 the micro-batches' metrics)
    Share.every_rank(K)   a worker group's sampler of its own: every rank's share in rank order, each from that rank's
                          stream, in one process: what the group would have sampled, without collectives

So a run samples the same answers whatever the number of processes its roles run in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hacrl import seeds


def rank_share(count: int, rank: int, world: int) -> range:
    """Rank `rank`'s contiguous share of `count` items (sizes differ by at most one; earlier ranks the larger)."""
    return range(rank * count // world, (rank + 1) * count // world)


@dataclass(frozen=True)
class Share:
    ranks: tuple[int, ...]
    """The ranks whose shares this process handles, in order."""
    world: int
    """The ranks of the agent's learner (1: one worker)."""
    collective: bool
    """Whether this process is one rank of a group whose parts meet in collectives."""

    @classmethod
    def whole(cls) -> Share:
        return cls((0,), 1, False)

    @classmethod
    def of_rank(cls, info) -> Share:
        return cls((info.rank,), info.world, True)

    @classmethod
    def every_rank(cls, world: int) -> Share:
        return cls(tuple(range(world)), world, False)

    @property
    def rank(self) -> int:
        """This process's rank in its group (0 for one worker and for a sampler)."""
        return self.ranks[0] if self.collective else 0

    def part(self, count: int, rank: int) -> range:
        """Rank `rank`'s part of `count` items."""
        return rank_share(count, rank, self.world)

    def seed(self, base: int, rank: int) -> int:
        """The seed of rank `rank`'s stream, from the agent's (`base`)."""
        return base if self.world == 1 else seeds.rank(base, rank)

    def joined(self, parts: list[Any]) -> list[Any]:
        """Every rank's part in rank order: this process's `parts`, and a group's others by a collective."""
        if not self.collective:
            return parts
        import torch.distributed as dist

        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, parts[0])
        return everyone

    def at_first(self, part: Any) -> list[Any] | None:
        """Every rank's `part` on rank 0, in rank order (None on the others; `[part]` for one process)."""
        if not self.collective:
            return [part]
        import torch.distributed as dist

        gathered: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(part, gathered, dst=0)
        return gathered
