"""Mappings between action spaces (`env.name: reach`; issue 72, part 2): how a learner reads an episode of a robot
that has other actuators.

A learner trains on another platform's episode through the episode it could have played itself from the same
initial state that does what the source's did. What the source did is its fingertip's path (the task space, logged
with every state: both arms are planar and reach the same workspace). The learner's own arm is reset to that
initial state (`Reach.start_posture`: its fingertip on the same start point) and driven, in MuJoCo, closed loop:
at each step the mapping gives the action that moves its fingertip from where it is to where the source's was one
step later, and the learner's own exploration noise is added to it (`Behaviour`: its Gaussian's standard
deviation). The result is a real episode of the learner's arm, its states its own (what it observes), its actions
in its own space, its reward its own (scored by the environment from its states: close to the source's within the
mapping error), drawn from a known behaviour policy: N(mapping's action, the learner's std). What is mapped and how:

    defined   the learner's kinematics: `arms.task_action`, damped least-squares steps of its Jacobian from its
              current posture, the displacement over one step's duration (no parameters: exact kinematics; the
              servos' lag is left to the closed loop)
    learned   an inverse model fitted on the learner's own transitions: from its state and the fingertip's
              displacement over a step to the action it took (a small MLP, `InverseModel`), refitted every step on
              the transitions of its last `mapping.window` steps; its error on the step's own transitions before
              it sees them is reported (`mapping/inverse_error`)

The mapping error of a replay is the mean distance, over its states, between the learner's fingertip and the
source's; a replay past `mapping.error_bound`, or whose physics went unstable, is left out of the learner's pool
and counted (`mapped/<source>/filtered`). The foreign ratio of a replay (docs/design.md, "Foreign rows across
action spaces") is the learner's log-density of its actions against the behaviour's, both in the learner's own
action space: an exact importance ratio between the learner's policy and the mapping-guided one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from hacrl.control.arms import MAX_SPEED, STEP_SECONDS, Reach, task_action
from hacrl.control.env import Episode

MAPPINGS = ("none", "defined", "learned")


def unmappable(source: str, learner: str) -> str | None:
    """Why no mapping can carry `source` platform's episodes to `learner`'s, or None. The replay follows the source's
    fingertip from the task's start to its goal, both in `GOAL_RADII`: the learner must reach all of that annulus
    (a path that strays outside its workspace elsewhere is one episode's mapping error: filtered, counted)."""
    from hacrl.control.arms import GOAL_RADII, PLATFORMS, reach

    near, far = reach(PLATFORMS[learner])
    if near > GOAL_RADII[0] or far < GOAL_RADII[1]:
        return (
            f"{learner}'s fingertip reaches {near:.2f}-{far:.2f} m from its base, and the tasks' start and goal points "
            f"lie {GOAL_RADII[0]:.2f}-{GOAL_RADII[1]:.2f} m from it: {source}'s episodes cannot be replayed on it; "
            "set that pair to none (mapping.pairs.<source>-><learner>=none), or algorithm.name=gspo"
        )
    return None


def tips(states: np.ndarray) -> np.ndarray:
    """The fingertip of states of any arm ((..., state size) -> (..., 2)): every arm's state ends with the
    fingertip, then the goal (`arms.state_fields`)."""
    return states[..., -4:-2]


def features(states: np.ndarray, moves: np.ndarray, joints: int) -> np.ndarray:
    """The inverse model's input: the posture (cos and sin of the joints), the joint speeds per `MAX_SPEED`, and
    the fingertip displacement wanted over the step, scaled as a joint's is by an action (per STEP_SECONDS x
    MAX_SPEED). states (..., S), moves (..., 2) -> (..., 3 joints + 2)."""
    q, dq = states[..., :joints], states[..., joints : 2 * joints]
    scaled = moves / (STEP_SECONDS * MAX_SPEED)
    return np.concatenate([np.cos(q), np.sin(q), dq / MAX_SPEED, scaled], axis=-1).astype(np.float32)


class Defined:
    """The defined mapping: the learner's own kinematics (`arms.task_action`)."""

    kind = "defined"

    def __init__(self, env: Reach) -> None:
        self.lengths, self.joints = env.lengths, env.joints

    def actions(self, states: np.ndarray, moves: np.ndarray) -> np.ndarray:
        return task_action(self.lengths, states[:, : self.joints], moves)

    def observe_own(self, episodes: list[Episode]) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class InverseModel:
    """The learned mapping: an MLP from (posture, joint speeds, fingertip displacement over the step) to the action
    (as applied: clipped to [-1, 1]) that did it, fitted by Adam on mean squared error over the learner's own
    transitions. Its weights, optimizer, transition window and random stream are run state (checkpointed)."""

    kind = "learned"

    def __init__(self, env: Reach, hidden: int, lr: float, fit_steps: int, batch: int, window: int, seed: int) -> None:
        self.joints = env.joints
        self.fit_steps, self.batch, self.window = fit_steps, batch, window
        generator = torch.Generator().manual_seed(seed)
        size = 3 * self.joints + 2
        self.net = nn.Sequential(nn.Linear(size, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, self.joints))  # fmt: skip
        with torch.no_grad():
            for p in self.net.parameters():  # its own stream: the policies' initialisations stay as they were
                p.copy_(torch.empty_like(p).uniform_(-1, 1, generator=generator) / np.sqrt(p.shape[-1]))
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.generator = generator
        self.inputs: list[np.ndarray] = []
        self.targets: list[np.ndarray] = []

    def actions(self, states: np.ndarray, moves: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = self.net(torch.from_numpy(features(states, moves, self.joints))).double().numpy()
        return np.clip(out, -1.0, 1.0)

    @staticmethod
    def transitions(episodes: list[Episode], joints: int) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets) of episodes' every step: the state before, the fingertip's displacement, the action
        applied."""
        states = np.stack([e.states for e in episodes])  # (N, T + 1, S)
        moves = tips(states[:, 1:]) - tips(states[:, :-1])
        x = features(states[:, :-1], moves, joints).reshape(-1, 3 * joints + 2)
        y = np.clip(np.stack([e.actions for e in episodes]), -1.0, 1.0).reshape(-1, joints).astype(np.float32)
        return x, y

    def error(self, x: np.ndarray, y: np.ndarray) -> float:
        """Mean squared error per action coordinate on (x, y)."""
        with torch.no_grad():
            return float(((self.net(torch.from_numpy(x)).clamp(-1, 1) - torch.from_numpy(y)) ** 2).mean())

    def observe_own(self, episodes: list[Episode]) -> dict[str, float]:
        """The learner's own episodes of this step: the model's error on them before it sees them (held out), then
        a refit on the window's transitions, these included."""
        x, y = self.transitions(episodes, self.joints)
        held_out = self.error(x, y)
        self.inputs, self.targets = [*self.inputs, x][-self.window :], [*self.targets, y][-self.window :]
        data_x, data_y = torch.from_numpy(np.concatenate(self.inputs)), torch.from_numpy(np.concatenate(self.targets))
        for _ in range(self.fit_steps):
            rows = torch.randint(0, len(data_x), (min(self.batch, len(data_x)),), generator=self.generator)
            loss = ((self.net(data_x[rows]) - data_y[rows]) ** 2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        return {"mapping/inverse_error": held_out, "mapping/inverse_fit_error": self.error(x, y)}

    def state_dict(self) -> dict[str, Any]:
        return {
            "net": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "inputs": [torch.from_numpy(x) for x in self.inputs],
            "targets": [torch.from_numpy(y) for y in self.targets],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.inputs = [x.numpy() for x in state["inputs"]]
        self.targets = [y.numpy() for y in state["targets"]]


@dataclass
class Mapped:
    """A learner's replay of one source's episodes: the episodes kept (in the source's order) and the statistics of
    all of them."""

    episodes: list[Episode]
    errors: np.ndarray
    """(N,) each source episode's mapping error (m); inf where its replay went unstable."""
    filtered: int
    reward_gap: float
    """Mean |reward of the replay - the source's| over the kept episodes (nan when none)."""

    def metrics(self, source: str) -> dict[str, float]:
        finite = self.errors[np.isfinite(self.errors)]
        out = {f"mapped/{source}/filtered": self.filtered, f"mapped/{source}/kept": len(self.episodes)}
        if len(finite):
            out[f"mapped/{source}/error_mean"] = float(finite.mean())
            out[f"mapped/{source}/error_max"] = float(finite.max())
        if self.episodes:
            out[f"mapped/{source}/reward_gap"] = self.reward_gap
        return out


@dataclass
class Behaviour:
    """The replay's exploration: Gaussian noise of standard deviation `std` (per action coordinate: the learner's
    own, its `log_std` times the temperature) around the mapping's action, drawn from `generator`."""

    std: np.ndarray
    generator: torch.Generator


def replay(env: Reach, mapping, episodes: list[Episode], seeds: dict[int, int] | list[int], bound: float,
           behaviour: Behaviour | None = None) -> Mapped:  # fmt: skip
    """Drive the learner's arms (`env`: a pool of the learner's platform) along `episodes`' fingertip paths (another
    platform's; `seeds[e.group]` is each one's initial state), closed loop through `mapping`, each action the
    mapping's plus `behaviour`'s noise (None: the mapping's alone). The replays whose mean fingertip distance to
    their source's path is within `bound` become the learner's episodes of that source: reward and success their
    own, and, with a behaviour, its log-density of their actions as the "source" log-prob (the exact behaviour
    policy of the replay, in the learner's own action space: `Episode.source_logp_sum`, `source_size`); without
    one, the source's log-prob of its own actions."""
    if not episodes:
        return Mapped([], np.zeros(0), 0, float("nan"))
    paths = tips(np.stack([e.states for e in episodes]))  # (N, T + 1, 2)
    states = [np.stack(env.reset([seeds[e.group] for e in episodes]))]
    actions, logp = [], np.zeros(len(episodes))
    for t in range(paths.shape[1] - 1):
        mean = mapping.actions(states[-1], paths[:, t + 1] - tips(states[-1]))
        if behaviour is None:
            action = mean.astype(np.float32)  # as logged: the replay is exact
        else:
            noise = torch.randn(mean.shape, generator=behaviour.generator, dtype=torch.float64).numpy()
            action = (mean + behaviour.std * noise).astype(np.float32)
            z = (action.astype(np.float64) - mean) / behaviour.std
            logp += (-0.5 * z * z - np.log(behaviour.std) - 0.5 * math.log(2 * math.pi)).sum(-1)
        actions.append(action)
        states.append(np.stack(env.step(action)))
    trajectories, acts = np.stack(states, axis=1), np.stack(actions, axis=1)
    errors = np.sqrt(((tips(trajectories) - paths) ** 2).sum(-1)).mean(axis=1)
    errors[np.asarray(env.unstable, dtype=bool)] = np.inf
    kept, gaps = [], []
    for i, e in enumerate(episodes):
        if errors[i] <= bound:
            reward, success = env.reward(trajectories[i])
            gaps.append(abs(reward - e.reward))
            own = behaviour is not None
            kept.append(Episode(e.group, trajectories[i], acts[i], reward, e.source,
                                float(logp[i]) if own else e.source_logp_sum, success=success,
                                source_size=acts[i].size if own else e.actions.size))  # fmt: skip
    return Mapped(kept, errors, len(episodes) - len(kept), float(np.mean(gaps)) if gaps else float("nan"))
