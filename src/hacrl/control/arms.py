"""A manipulation domain on MuJoCo (`env.name: reach`): robot arms that differ in their actuators reach a goal with
their fingertip. The platforms (`policies.<i>.platform`):

    arm2    2 hinge joints, links 0.50 + 0.40 m     the actions: 2 joint speeds
    arm3    3 hinge joints, links 0.35 + 0.30 + 0.25 m    3 joint speeds (a redundant arm: many postures per goal)

Both are planar arms on a table (hinges about the vertical axis, so gravity does no work on them), driven by
MuJoCo velocity servos (gain `SERVO_GAIN`: a joint settles to the asked speed within about a quarter of a step): an
action in [-1, 1] per joint (clipped there) asks that joint for that fraction of `MAX_SPEED`. They reach the same
0.9 m, and each seed gives both the same task: the same start point of the fingertip and the same goal, both in
the annulus between `GOAL_RADII` (reachable by either), each arm starting in a posture of its own that puts its
fingertip on the start point (`inverse_kinematics`, its free choices drawn from the seed). So a step's initial
states are the same tasks for every platform, and another platform's episode can be replayed on an arm from its
own initial state (`hacrl.control.mapping`). Why these: a task that needs control (the fingertip must get to the
goal and stop there, at speeds the joints' limit bounds), the smallest arms that differ in what matters here (the
number of actuators, so the action spaces, and the link lengths, so the kinematics), and cheap on a CPU (one
MjData per episode, ~10 us a physics step).

An episode's record, like the particle environment's, is its states and actions: the state before each action and
after the last, `STATE_FIELDS(n)` = joint angles, joint speeds, the fingertip's position (the task space, computed
by MuJoCo, equal to `fingertip`'s forward kinematics: a test), the goal. Reward: the share of the initial fingertip
distance to the goal closed at the end, max(0, 1 - d_T / d_0); success (completion): d_T < `success_distance`.

Physics that goes unstable (a non-finite state, a joint speed past `UNSTABLE_SPEED`) ends that episode where it
happened: its later states repeat the last sound one, its reward is 0 and it is counted (`unstable`), never the run.
So does MuJoCo's own word that it met a NaN, inf or huge value (its warning counters: it then resets the arm to
joint angles 0 and steps on as if nothing happened). Links that touch (arm3's first and last can) never do at the
start (`start_posture` draws again); an episode in which they touch later is counted (`contact`).
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
SERVO_GAIN = 10.0
"""N m s / rad: the velocity servos' gain kv (torque kv x (asked - actual speed)). With the links' inertia (at most
0.12 kg m^2, about the stretched shoulder) the speed settles with a time constant of 0.012 s, a quarter of a step:
the arm does what it is asked, as a real arm's joint-velocity loop does, and an episode's fingertip path is its
actions' (a replay can follow it)."""
START_ATTEMPTS = 64
"""Draws of a start posture's free choices before a seed is given up (none has needed more than a few)."""
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


def jacobian(lengths: tuple[float, ...], q: np.ndarray) -> np.ndarray:
    """d fingertip / d q of a planar arm: q (..., n) -> (..., 2, n). Column i moves the fingertip about joint i:
    (-sum_{l>=i} L_l sin(theta_l), sum_{l>=i} L_l cos(theta_l)), theta_l = q_0 + ... + q_l."""
    angles = np.cumsum(q, axis=-1)
    lengths = np.asarray(lengths)
    dx = -np.flip(np.cumsum(np.flip(lengths * np.sin(angles), -1), -1), -1)
    dy = np.flip(np.cumsum(np.flip(lengths * np.cos(angles), -1), -1), -1)
    return np.stack([dx, dy], axis=-2)


DAMPING = 0.01
"""m: the damping of the task-space inverse (`task_action`), which keeps joint speeds bounded near a stretched or
folded posture (where the Jacobian loses rank) at the cost of a lag of about DAMPING^2 / sigma^2 there."""
STEP_SECONDS = TIMESTEP * FRAME_SKIP
"""The time one action lasts."""


def task_action(lengths: tuple[float, ...], q: np.ndarray, move: np.ndarray, iterations: int = 3) -> np.ndarray:
    """The action (joint speeds per `MAX_SPEED`, clipped to [-1, 1]) that moves the fingertip by `move` (m) over one
    step: the joint motion dq that puts the fingertip of posture q + dq on fingertip(q) + move, by `iterations`
    damped least-squares steps dq += J^T (J J^T + DAMPING^2 I)^-1 (target - fingertip(q + dq)) (J at q + dq: the
    smallest joint motion; arm3: the redundant arm's minimum-norm choice), over STEP_SECONDS x MAX_SPEED. One
    iteration is the Jacobian's first-order answer; more remove its error on long steps. q (..., n), move (..., 2)
    -> (..., n)."""
    q = np.asarray(q, dtype=np.float64)
    target = fingertip(lengths, q) + move
    dq = np.zeros_like(q)
    for _ in range(iterations):
        jac = jacobian(lengths, q + dq)
        gram = jac @ np.swapaxes(jac, -1, -2) + DAMPING**2 * np.eye(2)
        error = target - fingertip(lengths, q + dq)
        dq = dq + (np.swapaxes(jac, -1, -2) @ np.linalg.solve(gram, error[..., None]))[..., 0]
    return np.clip(dq / (STEP_SECONDS * MAX_SPEED), -1.0, 1.0)


def reach(lengths: tuple[float, ...]) -> tuple[float, float]:
    """(nearest, farthest) distance from the base the fingertip can be."""
    longest, total = max(lengths), sum(lengths)
    return max(0.0, 2 * longest - total), total


def _two_link(l1: float, l2: float, point: np.ndarray, elbow: float) -> np.ndarray:
    """The two joint angles putting a two-link arm's end on `point` (reachable), elbow sign `elbow` (+1 or -1)."""
    x, y = point
    c = (x * x + y * y - l1 * l1 - l2 * l2) / (2 * l1 * l2)
    q1 = elbow * math.acos(min(1.0, max(-1.0, c)))
    q0 = math.atan2(y, x) - math.atan2(l2 * math.sin(q1), l1 + l2 * math.cos(q1))
    return np.array([q0, q1])


def inverse_kinematics(lengths: tuple[float, ...], tip: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Joint angles that put the fingertip on `tip` (inside the arm's reach), the free choices from `rng`: the elbow's
    side; for three links, the last link's direction (drawn until the wrist it leaves is reachable by the first
    two, else the direction along or against the radius, one of which always is for goals in `GOAL_RADII`)."""
    elbow = 1.0 if rng.uniform() < 0.5 else -1.0
    if len(lengths) == 2:
        return _two_link(*lengths, np.asarray(tip, dtype=np.float64), elbow)
    if len(lengths) != 3:
        raise ValueError(f"inverse_kinematics knows arms of 2 or 3 links, got {len(lengths)}")
    l1, l2, l3 = lengths
    near, far = abs(l1 - l2), l1 + l2
    radial = math.atan2(tip[1], tip[0])
    for phi in [*rng.uniform(-math.pi, math.pi, 16), radial, radial + math.pi]:
        wrist = np.asarray(tip) - l3 * np.array([math.cos(phi), math.sin(phi)])
        if near + 1e-6 <= float(np.hypot(*wrist)) <= far - 1e-6:
            q01 = _two_link(l1, l2, wrist, elbow)
            return np.array([q01[0], q01[1], phi - q01[0] - q01[1]])
    raise ValueError(f"no posture of the links {lengths} puts the fingertip on {tuple(tip)}")


def _annulus_point(rng: np.random.Generator) -> np.ndarray:
    radius = rng.uniform(*GOAL_RADII)
    angle = rng.uniform(-math.pi, math.pi)
    return np.array([radius * math.cos(angle), radius * math.sin(angle)])


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
        f'<velocity joint="j{i}" kv="{SERVO_GAIN}" ctrlrange="-{MAX_SPEED} {MAX_SPEED}" ctrllimited="true"/>'
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
    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)
    return mujoco


last_mujoco_warning: str | None = None
"""MuJoCo's latest warning. Its default handler prints each one and appends it to MUJOCO_LOG.TXT in the working
directory; what it warns of here (a NaN, inf or huge value in a joint's position, speed, acceleration or control:
`_UNSOUND`) is read from the simulation's own warning counters in `Reach.step`, which ends that episode as unstable
and counts it."""


def _mujoco_warning(message: str) -> None:
    global last_mujoco_warning
    last_mujoco_warning = str(message)[:300]


_UNSOUND = ("mjWARN_BADQPOS", "mjWARN_BADQVEL", "mjWARN_BADQACC", "mjWARN_BADCTRL")
"""MuJoCo's warnings that it met a non-finite or huge value, after which it resets the arm to its initial posture
(joint angles 0) and steps on, as if nothing happened."""


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
        self._probe = mujoco.MjData(self.model)  # where start postures are checked for touching links
        self._goals: list[np.ndarray] = []
        self.unstable: list[bool] = []
        self.contact: list[bool] = []
        """Each arm's links touched at some step of its episode (counted in `contact_episodes`)."""

    def _state(self, i: int) -> np.ndarray:
        data = self._data[i]
        tip = data.site("tip").xpos[:2]
        return np.concatenate([data.qpos, data.qvel, tip, self._goals[i]]).astype(np.float64)

    @staticmethod
    def goal(seed: int) -> np.ndarray:
        """The goal of initial state `seed`, the same for every platform."""
        return _annulus_point(np.random.default_rng([int(seed), 0]))

    @staticmethod
    def start(seed: int) -> np.ndarray:
        """Where the fingertip starts in initial state `seed`, the same for every platform (each arm reaches it in a
        posture of its own: `start_posture`)."""
        return _annulus_point(np.random.default_rng([int(seed), 1]))

    def start_posture(self, seed: int) -> np.ndarray:
        """This arm's joint angles at the start of initial state `seed`: its fingertip on `start(seed)`, the
        posture's free choices (the elbow's side; arm3's last link direction) drawn from the seed, and drawn again
        (from the seed's next stream) while the links would touch: arm3's first and last link can overlap, and did
        in 34 of 1,000 seeds, which then moved the arm under zero actions and spoiled replays."""
        mujoco, probe = self._mujoco, self._probe
        for attempt in range(START_ATTEMPTS):
            rng = np.random.default_rng([int(seed), 2] if attempt == 0 else [int(seed), 2, attempt])
            q = inverse_kinematics(self.lengths, self.start(seed), rng)
            mujoco.mj_resetData(self.model, probe)
            probe.qpos[:] = q
            mujoco.mj_forward(self.model, probe)
            if probe.ncon == 0:
                return q
        raise ValueError(f"no posture of {self.platform} without touching links reaches the start of seed {seed}")

    def reset(self, seeds: list[int]) -> list[np.ndarray]:
        """One arm per seed at its starting posture (`start_posture`), at rest; their states."""
        mujoco = self._mujoco
        while len(self._data) < len(seeds):
            self._data.append(mujoco.MjData(self.model))
        self._goals, self.unstable, self.contact = [], [False] * len(seeds), [False] * len(seeds)
        for i, seed in enumerate(seeds):
            data = self._data[i]
            mujoco.mj_resetData(self.model, data)
            data.qpos[:] = self.start_posture(seed)
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
                warned = self._warnings(data)
                data.ctrl[:] = np.clip(np.asarray(actions[i], dtype=np.float64), -1.0, 1.0) * MAX_SPEED
                mujoco.mj_step(self.model, data, nstep=FRAME_SKIP)
                mujoco.mj_kinematics(self.model, data)  # the fingertip where the joints now are
                sound = np.isfinite(data.qpos).all() and np.isfinite(data.qvel).all()
                # MuJoCo resets an arm it found non-finite or huge to angles 0 and says so only in its counters
                sound = sound and self._warnings(data) == warned
                if not sound or np.abs(data.qvel).max() > UNSTABLE_SPEED:
                    self.unstable[i] = True
                    data.qpos[:], data.qvel[:] = before
                    mujoco.mj_forward(self.model, data)
                self.contact[i] = self.contact[i] or data.ncon > 0
            out.append(self._state(i))
        return out

    def _warnings(self, data) -> tuple[int, ...]:
        """How often MuJoCo met a non-finite or huge value in this arm's simulation so far (`_UNSOUND`)."""
        return tuple(int(data.warning[int(getattr(self._mujoco.mjtWarning, w))].number) for w in _UNSOUND)

    def reward(self, states: np.ndarray) -> tuple[float, bool]:
        """(reward, success) of an episode's logged states."""
        d0 = float(np.hypot(*(states[0, -2:] - states[0, -4:-2])))
        dt = float(np.hypot(*(states[-1, -2:] - states[-1, -4:-2])))
        reward = max(0.0, 1.0 - dt / d0) if d0 > 0 else 1.0
        return reward, dt < self.success_distance


def full(states: np.ndarray, n: int, lengths: tuple[float, ...] | None = None) -> np.ndarray:
    """An arm's own view: cos and sin of its joint angles, its joint speeds (per `MAX_SPEED`), and the goal's offset
    from its fingertip."""
    states = np.asarray(states, dtype=np.float64)
    q, dq = states[:, :n], states[:, n : 2 * n]
    offset = states[:, 2 * n + 2 : 2 * n + 4] - states[:, 2 * n : 2 * n + 2]
    return np.concatenate([np.cos(q), np.sin(q), dq / MAX_SPEED, offset], axis=1).astype(np.float32)


def polar(states: np.ndarray, n: int, lengths: tuple[float, ...] | None = None) -> np.ndarray:
    """The same posture, the goal as its distance and direction from the fingertip (direction (1, 0) on it)."""
    view = full(states, n).astype(np.float64)
    offset = view[:, -2:]
    dist = np.sqrt((offset**2).sum(axis=1))
    safe = np.where(dist > 0, dist, 1.0)
    direction = np.where(dist[:, None] > 0, offset / safe[:, None], np.array([1.0, 0.0]))
    return np.concatenate([view[:, :-2], dist[:, None], direction], axis=1).astype(np.float32)


def pull(states: np.ndarray, n: int, lengths: tuple[float, ...] | None = None) -> np.ndarray:
    """`full`, and each joint's pull toward the goal: how far turning that joint alone would bring the fingertip
    toward the goal, per radian, to first order (J^T times the goal's offset: J's column i is the fingertip's
    velocity per unit speed of joint i), computed from the arm's own kinematics. Measured (issue 72): with `full`
    alone the arms' policies plateaued near 5-20 % success by 400 steps, with `pull` they reached 34-50 % by 200."""
    states = np.asarray(states, dtype=np.float64)
    q = states[:, :n]
    offset = states[:, 2 * n + 2 : 2 * n + 4] - states[:, 2 * n : 2 * n + 2]
    if lengths is None or len(lengths) != n:
        raise ValueError(f"the pull view needs the arm's {n} link lengths, got {lengths}")
    joints = (np.swapaxes(jacobian(lengths, q), -1, -2) @ offset[..., None])[..., 0]
    return np.concatenate([full(states, n), joints], axis=1).astype(np.float32)


OBSERVATIONS = {  # name -> (function of (states, joints, link lengths), observation size for n joints)
    "full": (full, lambda n: 3 * n + 2),
    "polar": (polar, lambda n: 3 * n + 3),
    "pull": (pull, lambda n: 4 * n + 2),
}
