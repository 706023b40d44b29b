"""Episodes of mpe2's `simple_v3` with their states logged (why this environment: the package docstring).

An episode runs `max_cycles` steps from a seeded reset. Its record is what crosses between policies: the
environment's state before each action and after the last (`STATE_FIELDS`), the actions, the reward, the source.
Reward in [0, 1]: the share of the initial distance to the landmark closed at the end, max(0, 1 - d_T / d_0);
success: d_T < `success_distance`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

STATE_FIELDS = ("x", "y", "vel_x", "vel_y", "landmark_x", "landmark_y")
NUM_ACTIONS = 5
"""mpe2's discrete actions: no move, left, right, down, up."""


def _require_mpe2():
    try:
        from mpe2 import simple_v3
    except ImportError as e:
        from hacrl.errors import ConfigError

        raise ConfigError(
            'hacrl control needs the multi-agent particle environments, an optional extra: pip install "hacrl[control]"'
            f" (or pip install mpe2); {e}"
        ) from None
    return simple_v3


@dataclass
class Episode:
    group: int
    """Which initial state of the step (the "prompt")."""
    states: np.ndarray
    """(T + 1, 6) float64: the state before each action, then after the last."""
    actions: np.ndarray
    """(T,) int64 (discrete actions), or (T, A) float32 (continuous ones, as drawn)."""
    reward: float
    source: int
    source_logp_sum: float = float("nan")
    """The source policy's summed pre-update log-probs of its actions (set after sampling)."""
    success: bool = False
    unstable: bool = False
    """Its physics went unstable (`reach`): ended there, reward 0, counted in `unstable_episodes`."""
    contact: bool = False
    """Its arm's links touched at some step (`reach`), counted in `contact_episodes` (not kept in the buffers)."""
    old_logp: Any = None
    """(T,) the source's pre-update per-step log-probs, kept by the source for its own update (never crosses)."""

    source_size: int = 0
    """A mapped episode (`control.mapping`): the source's own action count (its `actions.size`); 0: this one's."""

    @property
    def source_num_tokens(self) -> int:
        """The episode's length in the source's "tokens": its action coordinates (a discrete action is one, a
        continuous one has one per actuator), over which a foreign row's ratio averages the source's log-probs."""
        return self.source_size or int(self.actions.size)

    @property
    def num_bytes(self) -> int:
        """An episode has no text: its token count stands for the byte count too (the `bytes` normalisation)."""
        return self.source_num_tokens


def environments(config) -> tuple[list, list, list[int]]:
    """Each policy's environment (one shared `Simple`; a `Reach` per platform), its observation function and its
    observation size (`ControlConfig`'s `env` and `policies`)."""
    from functools import partial

    env, policies = config.env, config.policies
    if env.name == "reach":
        from hacrl.control import arms

        pools = {p: arms.Reach(p, env.max_cycles, env.success_distance) for p in {x.platform for x in policies}}
        envs = [pools[p.platform] for p in policies]
        views = [(arms.OBSERVATIONS[p.observation], e.joints) for p, e in zip(policies, envs, strict=True)]
        observe = [partial(view, n=n, lengths=e.lengths) for ((view, _), n), e in zip(views, envs, strict=True)]
        sizes = [size(n) for (_, size), n in views]
        return envs, observe, sizes
    from hacrl.control.observations import OBSERVATIONS

    shared = Simple(env.max_cycles, env.success_distance)
    return (
        [shared] * len(policies),
        [OBSERVATIONS[p.observation][0] for p in policies],
        [OBSERVATIONS[p.observation][1] for p in policies],
    )


class Simple:
    """A pool of `simple_v3` environments stepped in lockstep (one per concurrent episode)."""

    discrete = True
    action_size = NUM_ACTIONS
    state_size = len(STATE_FIELDS)

    def __init__(self, max_cycles: int = 25, success_distance: float = 0.1) -> None:
        self.max_cycles, self.success_distance = max_cycles, success_distance
        self._envs: list = []

    def _env(self, i: int):
        while len(self._envs) <= i:
            env = _require_mpe2().parallel_env(max_cycles=self.max_cycles, continuous_actions=False)
            self._envs.append(env)
        return self._envs[i]

    @staticmethod
    def state(env) -> np.ndarray:
        world = env.unwrapped.world
        agent, landmark = world.agents[0], world.landmarks[0]
        return np.concatenate([agent.state.p_pos, agent.state.p_vel, landmark.state.p_pos]).astype(np.float64)

    def reset(self, seeds: list[int]) -> list[np.ndarray]:
        """Reset one environment per seed; the initial states, and the environments' own first observations."""
        out = []
        self._observed = []
        self.unstable = [False] * len(seeds)  # a point mass's physics cannot go unstable (`arms.Reach`'s can)
        for i, seed in enumerate(seeds):
            obs, _ = self._env(i).reset(seed=int(seed))
            self._observed.append([obs["agent_0"]])
            out.append(self.state(self._env(i)))
        return out

    def step(self, actions: list[int]) -> list[np.ndarray]:
        """One step of every reset environment; their states after it."""
        out = []
        for i, action in enumerate(actions):
            obs, _, _, _, _ = self._env(i).step({"agent_0": int(action)})
            self._observed[i].append(obs["agent_0"])
            out.append(self.state(self._env(i)))
        return out

    def observed(self, i: int) -> np.ndarray:
        """Environment i's own observations since its reset (what the env returned), (steps + 1, 4)."""
        return np.stack(self._observed[i])

    def reward(self, states: np.ndarray) -> tuple[float, bool]:
        """(reward, success) of an episode's logged states."""
        d0 = float(np.hypot(*(states[0, 4:6] - states[0, 0:2])))
        dt = float(np.hypot(*(states[-1, 4:6] - states[-1, 0:2])))
        reward = max(0.0, 1.0 - dt / d0) if d0 > 0 else 1.0
        return reward, dt < self.success_distance
