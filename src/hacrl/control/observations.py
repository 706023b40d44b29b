"""Observation functions: what a policy sees of an environment state. Each maps an episode's logged states
(`env.STATE_FIELDS`, shape (T, 6), float64) to observations (T, D), float32, row t computed from state t only, so
another policy's episode is re-observed exactly as this policy would have observed it had it taken the same
actions (the environment is deterministic given the reset and the actions).

    full    [vel_x, vel_y, landmark_x - x, landmark_y - y]: the environment's own observation (mpe2 `simple_v3`)
    polar   [distance to the landmark, cos, sin of its direction]: no velocity, another encoding
"""

from __future__ import annotations

import numpy as np


def full(states: np.ndarray) -> np.ndarray:
    """mpe2 simple_v3's observation: concatenate(agent velocity, landmark position - agent position)."""
    states = np.asarray(states, dtype=np.float64)
    return np.concatenate([states[:, 2:4], states[:, 4:6] - states[:, 0:2]], axis=1).astype(np.float32)


def polar(states: np.ndarray) -> np.ndarray:
    """The landmark's distance and direction from the agent; direction (1, 0) when it sits exactly on it."""
    states = np.asarray(states, dtype=np.float64)
    rel = states[:, 4:6] - states[:, 0:2]
    dist = np.sqrt((rel**2).sum(axis=1))
    safe = np.where(dist > 0, dist, 1.0)
    cos = np.where(dist > 0, rel[:, 0] / safe, 1.0)
    sin = np.where(dist > 0, rel[:, 1] / safe, 0.0)
    return np.stack([dist, cos, sin], axis=1).astype(np.float32)


OBSERVATIONS = {"full": (full, 4), "polar": (polar, 3)}
"""name -> (function, observation size)."""
