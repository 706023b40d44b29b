"""Experience buffers (`sharing.replay`; issue 72, part 3): each policy keeps its scored episodes of its last k steps,
and every step the learners draw earlier initial states from them and train on the other policies' episodes of those.

What a buffered episode carries is what crosses between policies at its own step (its logged states, actions,
reward, source, and the source's summed log-prob of its actions when it played them: the behaviour policy's, exact
and stored), so a learner weighs it as any foreign row: s = exp(l_k(y) - l_src(y)), the stored l_src in the
denominator, clipped into [lo_m, 1] (spec 3.4-3.5). An episode k steps old was played by a source k updates ago;
its stored log-prob is still that behaviour's, which is what importance weighting divides by.

The draw: `sharing.replay.groups` earlier initial states, uniformly without replacement from every one buffered, from
the run's `seeds.control(seed, "replay")` stream (checkpointed); the same for every learner, like the step's own
pool. Each brings every policy's buffered episodes of it: the learner's own join the group's baseline only (they
are stale own rows, whose ratio would need the learner's old log-probs), the others' are its foreign rows,
replayed through a mapping when they come from another platform (`control.mapping`), then chosen by the sharing
policy and budget with the step's own (`hacrl.core.sharing`). Bounds: `steps` steps per policy, at most
`max_episodes` episodes (its oldest steps leave first); buffers and the draw's stream are in every checkpoint
(`buffers.pt`), so a resume is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from hacrl.control.env import Episode


@dataclass
class Stored:
    """One policy's scored episodes of one step (its `old_logp`, the learner-side copy, is not kept)."""

    step: int
    seeds: list[int]
    episodes: list[Episode]


class Buffers:
    def __init__(self, policies: int, steps: int, max_episodes: int, seed: int) -> None:
        self.steps, self.max_episodes = steps, max_episodes
        self.held: list[list[Stored]] = [[] for _ in range(policies)]
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.added = 0

    def add(self, seeds: list[int], sampled: list[list[Episode]]) -> None:
        """The step's episodes, every policy's (after the learners drew); the oldest steps past the bounds leave."""
        for held, episodes in zip(self.held, sampled, strict=True):
            held.append(Stored(self.added, list(seeds), [replace(e, old_logp=None) for e in episodes]))
            while len(held) > self.steps or (len(held) > 1 and sum(len(s.episodes) for s in held) > self.max_episodes):
                held.pop(0)
        self.added += 1

    def draw(self, groups: int) -> list[tuple[int, int, int]]:
        """`groups` earlier initial states, (step, group, seed), in buffer order; fewer when fewer are held."""
        held = {(s.step, g, seed) for buffer in self.held for s in buffer for g, seed in enumerate(s.seeds)}
        choices = sorted(held)
        if not choices:
            return []
        picked = self.rng.choice(len(choices), size=min(groups, len(choices)), replace=False)
        return [choices[i] for i in sorted(picked.tolist())]

    def episodes(self, policy: int, step: int, group: int, as_group: int) -> list[Episode]:
        """Policy `policy`'s buffered episodes of initial state `group` of step `step`, relabelled `as_group`."""
        return [replace(e, group=as_group) for s in self.held[policy] if s.step == step for e in s.episodes
                if e.group == group]  # fmt: skip

    def size(self, policy: int) -> int:
        return sum(len(s.episodes) for s in self.held[policy])

    def state_dict(self) -> dict[str, Any]:
        def pack(stored: Stored) -> dict[str, Any]:
            e = stored.episodes
            return {
                "step": stored.step,
                "seeds": torch.tensor(stored.seeds, dtype=torch.int64),
                "group": torch.tensor([x.group for x in e], dtype=torch.int64),
                "states": torch.from_numpy(np.stack([x.states for x in e])),
                "actions": torch.from_numpy(np.stack([x.actions for x in e])),
                "reward": torch.tensor([x.reward for x in e], dtype=torch.float64),
                "source": torch.tensor([x.source for x in e], dtype=torch.int64),
                "logp_sum": torch.tensor([x.source_logp_sum for x in e], dtype=torch.float64),
                "success": torch.tensor([x.success for x in e]),
                "unstable": torch.tensor([x.unstable for x in e]),
            }

        return {
            "added": self.added,
            "rng": self.rng.bit_generator.state,
            "held": [[pack(s) for s in held] for held in self.held],
        }

    def load_state_dict(self, state: dict[str, Any], shapes: list[tuple[tuple, tuple]] | None = None) -> None:
        """Restore `state_dict()`'s buffers. Every value is checked first (`shapes`: each policy's episode states'
        and actions' shapes), since a file is untrusted input: a NaN reward, a foreign `source` or a group past its
        step's initial states would stop a later step with a traceback or quietly change the resumed run."""
        if len(state["held"]) != len(self.held):
            raise ValueError(f"the buffers of {len(state['held'])} policies, this run has {len(self.held)}")
        added = state["added"]
        if not isinstance(added, int) or added < 0:
            raise ValueError(f"'added' must be a step count, got {added!r}")
        for j, held in enumerate(state["held"]):
            _check_policy(j, held, added, self.steps, self.max_episodes, shapes[j] if shapes else None)

        def unpack(p: dict[str, Any]) -> Stored:
            episodes = [
                Episode(
                    int(p["group"][i]),
                    p["states"][i].numpy(),
                    p["actions"][i].numpy(),
                    float(p["reward"][i]),
                    int(p["source"][i]),
                    float(p["logp_sum"][i]),
                    success=bool(p["success"][i]),
                    unstable=bool(p["unstable"][i]),
                )  # fmt: skip
                for i in range(len(p["group"]))
            ]
            return Stored(int(p["step"]), [int(s) for s in p["seeds"]], episodes)

        self.added = int(state["added"])
        self.rng.bit_generator.state = state["rng"]
        self.held = [[unpack(p) for p in held] for held in state["held"]]


def _check_policy(j: int, held: list, added: int, steps: int, max_episodes: int, shapes: tuple | None) -> None:
    """Policy j's stored steps are what `Buffers.add` could have left: at most `steps` of them, distinct and before
    `added`, within `max_episodes`; each step's episodes its own (source j), of groups within its initial states, with
    finite states, actions, rewards and log-probs of the run's shapes."""
    where = f"policy {j}'s buffer"
    if not isinstance(held, list) or len(held) > steps:
        raise ValueError(f"{where} must be a list of at most {steps} steps (sharing.replay.steps)")
    seen, total = set(), 0
    for p in held:
        step = p.get("step") if isinstance(p, dict) else None
        if not isinstance(step, int) or not 0 <= step < added or step in seen:
            raise ValueError(f"{where} holds a step {step!r} that is not a distinct step before {added}")
        seen.add(step)
        here = f"{where}, step {step}"
        tensors = {k: p.get(k) for k in ("seeds", "group", "states", "actions", "reward", "source", "logp_sum",
                                         "success", "unstable")}  # fmt: skip
        if not all(isinstance(t, torch.Tensor) for t in tensors.values()):
            raise ValueError(f"{here}: every field must be a tensor ({', '.join(tensors)})")
        n = len(tensors["group"])
        total += n
        if n < 1 or any(t.dim() < 1 or len(t) != n for k, t in tensors.items() if k != "seeds"):
            raise ValueError(f"{here}: its fields must hold one value per episode, and it at least one")
        seeds, group, source = tensors["seeds"], tensors["group"], tensors["source"]
        if seeds.dim() != 1 or len(seeds) < 1 or seeds.is_floating_point() or bool((seeds < 0).any()):
            raise ValueError(f"{here}: its seeds must be non-negative integers")
        if group.is_floating_point() or bool((group < 0).any()) or bool((group >= len(seeds)).any()):
            raise ValueError(f"{here}: its groups must index its {len(seeds)} initial states")
        if source.is_floating_point() or bool((source != j).any()):
            raise ValueError(f"{here}: its episodes must be the policy's own (source {j})")
        for key in ("states", "actions", "reward", "logp_sum"):
            if not bool(tensors[key].double().isfinite().all()):
                raise ValueError(f"{here}: its {key} hold NaN or inf")
        if shapes is not None:
            for key, shape in zip(("states", "actions"), shapes, strict=True):
                if tuple(tensors[key].shape[1:]) != tuple(shape):
                    raise ValueError(f"{here}: its {key} have shape {tuple(tensors[key].shape[1:])} an episode, this "
                                     f"run's have {tuple(shape)}")  # fmt: skip
    if len(held) > 1 and total > max_episodes:
        raise ValueError(f"{where} holds {total} episodes, over sharing.replay.max_episodes={max_episodes}")
