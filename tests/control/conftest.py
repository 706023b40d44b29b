"""Fixtures of the control tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def unstable_physics(monkeypatch):
    """MuJoCo's step breaks the next arm that moves (a NaN joint speed, once); returns the counter of breaks left,
    {"left": 1}: set it back to 1 to break another."""
    mujoco = pytest.importorskip("mujoco")
    real, broken = mujoco.mj_step, {"left": 1}

    def breaking(model, data, nstep=1):
        real(model, data, nstep=nstep)
        if broken["left"] and data.qvel[0] != 0:
            broken["left"] -= 1
            data.qvel[0] = float("nan")

    monkeypatch.setattr(mujoco, "mj_step", breaking)
    return broken
