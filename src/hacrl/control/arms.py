"""A manipulation domain on MuJoCo (`env.name: reach`): robot arms that differ in their actuators reach a goal with
their fingertip. The platforms (`policies.<i>.platform`):

    arm2    2 hinge joints, links 0.50 + 0.40 m     the actions: 2 joint speeds
    arm3    3 hinge joints, links 0.35 + 0.30 + 0.25 m    3 joint speeds (a redundant arm: many postures per goal)

Both are planar arms on a table (hinges about the vertical axis, so gravity does no work on them), driven by
MuJoCo velocity servos: an action in [-1, 1] per joint (clipped there) asks that joint for that fraction of
`MAX_SPEED`. They reach the same 0.9 m, and each seed gives both the same goal, in the annulus between
`GOAL_RADII` (every goal reachable by either), so a step's initial states are the same tasks for every platform;
the starting posture is drawn from the same seed, in each platform's own joints. Why these: a task that needs
control (the fingertip must get to the goal and stay there: the servos have inertia to brake), the smallest arms
that differ in what matters here (the number of actuators, so the action spaces, and the link lengths, so the
kinematics), and cheap on a CPU (one MjData per episode, ~10 us a physics step).

An episode's record, like the particle environment's, is its states and actions: the state before each action and
after the last, `STATE_FIELDS(n)` = joint angles, joint speeds, the fingertip's position (the task space, computed
by MuJoCo, equal to `fingertip`'s forward kinematics: a test), the goal. Reward: the share of the initial fingertip
distance to the goal closed at the end, max(0, 1 - d_T / d_0); success (completion): d_T < `success_distance`.

Physics that goes unstable (a non-finite state, a joint speed past `UNSTABLE_SPEED`) ends that episode where it
happened: its later states repeat the last sound one, its reward is 0 and it is counted (`unstable`), never the run.
"""

from __future__ import annotations

import math

import numpy as np

PLATFORMS: dict[str, tuple[float, ...]] = {"arm2": (0.5, 0.4), "arm3": (0.35, 0.3, 0.25)}
"""platform -> its link lengths (m), base to fingertip; one hinge joint, one actuator per link."""
GOAL_RADII = (0.25, 0.8)
"""Goals lie at this distance from the base (both arms reach 0.9 m; their base's neighbourhood is folded reach)."""
MAX_SPEED = 3.0
"""rad/s asked of a joint by an action of 1."""
TIMESTEP, FRAME_SKIP = 0.01, 5
"""MuJoCo's step (s) and physics steps per action: 20 actions a second."""
UNSTABLE_SPEED = 100.0
"""rad/s: a joint this fast has left the physics a velocity servo of `MAX_SPEED` can make."""


def state_fields(joints: int) -> tuple[str, ...]:
    return (*(f"q{i}" for i in range(joints)), *(f"dq{i}" for i in range(joints)), "tip_x", "tip_y", "goal_x", "goal_y")


def fingertip(lengths: tuple[float, ...], q: np.ndarray) -> np.ndarray:
    """Forward kinematics: the fingertip of a planar arm with these links at joint angles q (..., n) -> (..., 2)."""
    angles = np.cumsum(q, axis=-1)
    x = (np.asarray(lengths) * np.cos(angles)).sum(axis=-1)
    y = (np.asarray(lengths) * np.sin(angles)).sum(axis=-1)
    return np.stack([x, y], axis=-1)


def arm_xml(lengths: tuple[float, ...]) -> str:
    """The MJCF of a planar arm: a chain of capsules on hinges about z, a velocity servo on each, a fingertip site."""
    body, close = "", ""
    for i, length in enumerate(lengths):
        pos = "0 0 0" if i == 0 else f"{lengths[i - 1]} 0 0"
        body += (
            f'<body name="link{i}" pos="{pos}"><joint name="j{i}" type="hinge" axis="0 0 1" damping="0.05"/>'
            f'<geom type="capsule" fromto="0 0 0 {length} 0 0" size="0.02" mass="{0.5 * length:.4f}"/>'
        )
        close += "</body>"
    body = body.replace(
        f'size="0.02" mass="{0.5 * lengths[-1]:.4f}"/>',
        f'size="0.02" mass="{0.5 * lengths[-1]:.4f}"/><site name="tip" pos="{lengths[-1]} 0 0"/>',
    )
    servos = "".join(
        f'<velocity joint="j{i}" kv="1" ctrlrange="-{MAX_SPEED} {MAX_SPEED}" ctrllimited="true"/>'
        for i in range(len(lengths))
    )
    return (
        f'<mujoco><option timestep="{TIMESTEP}" integrator="implicitfast"/><worldbody>{body}{close}</worldbody>'
        f"<actuator>{servos}</actuator></mujoco>"
    )


def _require_mujoco():
    try:
        import mujoco
    except ImportError:
        from hacrl.errors import ConfigError

        raise ConfigError(
            'env.name=reach needs MuJoCo, in the control extra: pip install "hacrl[control]" (or pip install mujoco;'
            " `make control` installs it)"
        ) from None
    return mujoco


class Reach:
    """A pool of one platform's arms stepped in lockstep (one MjData per concurrent episode)."""

    discrete = False

    def __init__(self, platform: str, max_cycles: int = 25, success_distance: float = 0.1) -> None:
        mujoco = _require_mujoco()
        self.platform, self.lengths = platform, PLATFORMS[platform]
        self.joints = len(self.lengths)
        self.action_size = self.joints
        self.state_size = 2 * self.joints + 4
        self.max_cycles, self.success_distance = max_cycles, success_distance
        self.model = mujoco.MjModel.from_xml_string(arm_xml(self.lengths))
        self._mujoco = mujoco
        self._data: list = []
        self._goals: list[np.ndarray] = []
        self.unstable: list[bool] = []

    def _state(self, i: int) -> np.ndarray:
        data = self._data[i]
        tip = data.site("tip").xpos[:2]
        return np.concatenate([data.qpos, data.qvel, tip, self._goals[i]]).astype(np.float64)

    @staticmethod
    def goal(seed: int) -> np.ndarray:
        """The goal of initial state `seed`, the same for every platform."""
        rng = np.random.default_rng([int(seed), 0])
        radius = rng.uniform(*GOAL_RADII)
        angle = rng.uniform(-math.pi, math.pi)
        return np.array([radius * math.cos(angle), radius * math.sin(angle)])

    def reset(self, seeds: list[int]) -> list[np.ndarray]:
        """One arm per seed at its starting posture (joint angles from the seed), at rest; their states."""
        mujoco = self._mujoco
        while len(self._data) < len(seeds):
            self._data.append(mujoco.MjData(self.model))
        self._goals, self.unstable = [], [False] * len(seeds)
        for i, seed in enumerate(seeds):
            data = self._data[i]
            mujoco.mj_resetData(self.model, data)
            data.qpos[:] = np.random.default_rng([int(seed), 1]).uniform(-math.pi, math.pi, self.joints)
            mujoco.mj_forward(self.model, data)
            self._goals.append(self.goal(seed))
        self._live = len(seeds)
        return [self._state(i) for i in range(len(seeds))]

    def step(self, actions) -> list[np.ndarray]:
        """One action (n joint speeds in [-1, 1], clipped there) of every reset arm; their states after it. An arm
        whose physics goes unstable keeps its last sound state from then on (`unstable`)."""
        mujoco, out = self._mujoco, []
        for i in range(self._live):
            data = self._data[i]
            if not self.unstable[i]:
                before = (data.qpos.copy(), data.qvel.copy())
                data.ctrl[:] = np.clip(np.asarray(actions[i], dtype=np.float64), -1.0, 1.0) * MAX_SPEED
                mujoco.mj_step(self.model, data, nstep=FRAME_SKIP)
                mujoco.mj_kinematics(self.model, data)  # the fingertip where the joints now are
                sound = np.isfinite(data.qpos).all() and np.isfinite(data.qvel).all()
                if not sound or np.abs(data.qvel).max() > UNSTABLE_SPEED:
                    self.unstable[i] = True
                    data.qpos[:], data.qvel[:] = before
                    mujoco.mj_forward(self.model, data)
            out.append(self._state(i))
        return out

    def reward(self, states: np.ndarray) -> tuple[float, bool]:
        """(reward, success) of an episode's logged states."""
        d0 = float(np.hypot(*(states[0, -2:] - states[0, -4:-2])))
        dt = float(np.hypot(*(states[-1, -2:] - states[-1, -4:-2])))
        reward = max(0.0, 1.0 - dt / d0) if d0 > 0 else 1.0
        return reward, dt < self.success_distance


def full(states: np.ndarray, n: int) -> np.ndarray:
    """An arm's own view: cos and sin of its joint angles, its joint speeds (per `MAX_SPEED`), and the goal's offset
    from its fingertip."""
    states = np.asarray(states, dtype=np.float64)
    q, dq = states[:, :n], states[:, n : 2 * n]
    offset = states[:, 2 * n + 2 : 2 * n + 4] - states[:, 2 * n : 2 * n + 2]
    return np.concatenate([np.cos(q), np.sin(q), dq / MAX_SPEED, offset], axis=1).astype(np.float32)


def polar(states: np.ndarray, n: int) -> np.ndarray:
    """The same posture, the goal as its distance and direction from the fingertip (direction (1, 0) on it)."""
    view = full(states, n).astype(np.float64)
    offset = view[:, -2:]
    dist = np.sqrt((offset**2).sum(axis=1))
    safe = np.where(dist > 0, dist, 1.0)
    direction = np.where(dist[:, None] > 0, offset / safe[:, None], np.array([1.0, 0.0]))
    return np.concatenate([view[:, :-2], dist[:, None], direction], axis=1).astype(np.float32)


OBSERVATIONS = {"full": (full, lambda n: 3 * n + 2), "polar": (polar, lambda n: 3 * n + 3)}
"""name -> (function of (states, joints), observation size for n joints)."""
