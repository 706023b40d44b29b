"""Agent capability estimates and the capability ratios HACPO derives from them (spec 3.1, 3.3; paper Eqs. 6, 9, 10).

Choices, in order:
1. P_k(step) is the *mean* reward of agent k's own responses in the step (the paper's Eq. 9; the authors' code
   counts positive rewards, which differs only for partial credit).
2. P_hat_k is the mean of the last K per-step values, the current step included, floored at 1e-8 so that a
   hopeless agent never divides by zero. Before any step every P_hat is 1.
3. Optional warm-up: while the tracker has seen no more than ``warmup_steps`` steps, capabilities read as 1, so
   every ratio is 1.
4. Ratios are clamped to [0.1, 10]. The baseline weight is learner/source (Eq. 6), the loss coefficient is
   source/learner (Eq. 10): a stronger source lowers the learner's baseline weight and speaks louder in its loss.
5. Everything is float64, so equal capabilities give ratios of exactly 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from hacrl.core._checks import check_1d, check_finite, check_ids, check_index, check_integer

RATIO_MIN = 0.1
"""Lower clamp of every capability ratio (spec 3.2, 3.3)."""
RATIO_MAX = 10.0
"""Upper clamp of every capability ratio (spec 3.2, 3.3)."""
CAPABILITY_FLOOR = 1e-8
"""P_hat is floored here so that ratios stay finite (spec 3.1)."""


def baseline_weights(capabilities: Tensor, learner: int) -> Tensor:
    """Weights of each source's rewards in learner k's baseline: w_kj = clamp(P_hat_k / P_hat_j, 0.1, 10), w_kk = 1.

    Paper Eq. 6. A source stronger than the learner gets a weight below 1 (its successes say less about how good a
    response the *learner* can produce), a weaker one above 1.

    capabilities: (n,) float, P_hat per agent (positive)
    returns:      (n,) float64
    """
    caps = _as_capabilities(capabilities, learner)
    weights = (caps[learner] / caps).clamp(RATIO_MIN, RATIO_MAX)
    weights[learner] = 1.0
    return weights


def loss_coefficients(capabilities: Tensor, learner: int) -> Tensor:
    """Coefficient of each source's advantages in learner k's loss: rho_jk = clamp(P_hat_j / P_hat_k, 0.1, 10).

    Paper Eq. 10. Note the direction, the inverse of `baseline_weights`: a stronger source speaks louder.
    rho_kk = 1.

    capabilities: (n,) float, P_hat per agent (positive)
    returns:      (n,) float64
    """
    caps = _as_capabilities(capabilities, learner)
    coefficients = (caps / caps[learner]).clamp(RATIO_MIN, RATIO_MAX)
    coefficients[learner] = 1.0
    return coefficients


def step_mean_rewards(rewards: Tensor, source: Tensor, num_agents: int) -> Tensor:
    """P_k(step): mean reward of each agent's own responses in this step (paper Eq. 9, one step's term).

    rewards: (N,) float, every scored response of the step
    source:  (N,) long in [0, num_agents), the agent that generated each response
    returns: (num_agents,) float64
    """
    check_1d("rewards", rewards)
    check_1d("source", source, rewards.shape[0])
    check_integer("source", source)
    check_finite("rewards", rewards)
    check_ids("source", source, num_agents, "agent")
    r = rewards.detach().to(torch.float64).cpu()
    src = source.detach().cpu()
    counts = torch.zeros(num_agents, dtype=torch.float64).index_add_(0, src, torch.ones_like(r))
    if bool((counts == 0).any()):
        missing = (counts == 0).nonzero().flatten().tolist()
        raise ValueError(f"source has no response from agent(s) {missing}; every agent must sample in every step")
    return torch.zeros(num_agents, dtype=torch.float64).index_add_(0, src, r) / counts


class CapabilityTracker:
    """Sliding-window capability estimate P_hat for n agents (spec 3.1).

    >>> tracker = CapabilityTracker(num_agents=2, window=2)
    >>> tracker.update([0.5, 0.25]); tracker.update([0.75, 0.5])
    >>> tracker.capabilities().tolist()
    [0.625, 0.375]
    >>> tracker.loss_coefficients(learner=1).tolist()  # rho_j1 = P_hat_j / P_hat_1
    [1.6666666666666667, 1.0]
    """

    def __init__(self, num_agents: int, window: int = 5, warmup_steps: int = 0) -> None:
        if not isinstance(num_agents, int) or num_agents < 1:
            raise ValueError(f"num_agents must be a positive int, got {num_agents!r}")
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"capability window must be a positive int (spec default 5), got {window!r}")
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"capability warmup_steps must be an int >= 0, got {warmup_steps!r}")
        self.num_agents = num_agents
        self.window = window
        self.warmup_steps = warmup_steps
        self._history: list[list[float]] = []  # one row of per-agent mean rewards per step seen

    @property
    def num_steps(self) -> int:
        """How many steps the tracker has seen."""
        return len(self._history)

    @property
    def history(self) -> Tensor:
        """(num_steps, n) float64: every per-step mean reward seen, oldest first (for diagnostics and plots)."""
        return torch.tensor(self._history, dtype=torch.float64).reshape(-1, self.num_agents)

    def update(self, mean_rewards: Sequence[float] | Tensor) -> None:
        """Record one step's P_k(step) for every agent (see `step_mean_rewards`)."""
        values = torch.as_tensor(mean_rewards, dtype=torch.float64).detach().cpu()
        check_1d("mean_rewards", values, self.num_agents)
        check_finite("mean_rewards", values)
        self._history.append(values.tolist())

    def capabilities(self) -> Tensor:
        """(n,) float64 P_hat: mean of the last `window` steps, floored at 1e-8; ones before any step or in warm-up."""
        if self.num_steps <= self.warmup_steps:  # also covers "no step yet" (spec: before any step P_hat = 1)
            return torch.ones(self.num_agents, dtype=torch.float64)
        recent = torch.tensor(self._history[-self.window :], dtype=torch.float64)
        return recent.mean(dim=0).clamp(min=CAPABILITY_FLOOR)

    def baseline_weights(self, learner: int) -> Tensor:
        """(n,) float64 w_kj for learner k from the current capabilities; see the module-level function."""
        return baseline_weights(self.capabilities(), learner)

    def loss_coefficients(self, learner: int) -> Tensor:
        """(n,) float64 rho_jk for learner k from the current capabilities; see the module-level function."""
        return loss_coefficients(self.capabilities(), learner)

    def state_dict(self) -> dict:
        """Plain data (ints, lists of floats) that `load_state_dict` restores exactly; safe for JSON or safetensors."""
        return {
            "num_agents": self.num_agents,
            "window": self.window,
            "warmup_steps": self.warmup_steps,
            "history": [list(row) for row in self._history],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict`; refuses one written for other agents, another window or another warm-up."""
        missing = {"num_agents", "window", "warmup_steps", "history"} - set(state)
        if missing:
            raise ValueError(f"capability state is missing {sorted(missing)}; it was not written by CapabilityTracker")
        for key in ("num_agents", "window", "warmup_steps"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"capability state was saved with {key}={state[key]} but this tracker has "
                    f"{key}={getattr(self, key)}; resume with the same agents and algorithm.capability_* settings "
                    "as the run that wrote the checkpoint"
                )
        history = [[float(v) for v in row] for row in state["history"]]
        if any(len(row) != self.num_agents for row in history):
            raise ValueError(f"capability state has a history row whose length is not num_agents={self.num_agents}")
        self._history = history


def _as_capabilities(capabilities: Tensor, learner: int) -> Tensor:
    caps = torch.as_tensor(capabilities, dtype=torch.float64)
    check_1d("capabilities", caps)
    check_index("learner", learner, caps.shape[0], "agent")
    check_finite("capabilities", caps)
    if bool((caps <= 0).any()):
        raise ValueError(f"capabilities must be positive (P_hat is floored at {CAPABILITY_FLOOR}), got {caps.tolist()}")
    return caps.clone()
