"""The policies: a feed-forward one that acts on the current observation and a recurrent one that acts on the
history. Both give, for a whole episode at once (teacher-forced: the log-probs of the loss) and step by step
(sampling), logits over the environment's discrete actions (the particle environment), or the mean of a Gaussian
over its continuous ones (an arm's joint speeds: `continuous`), whose log standard deviation is a parameter of its
own, one per action dimension, independent of the observation (the usual form for on-policy control: PPO's). The
Gaussian's mean is tanh of the network's output: inside the actions' range [-1, 1], where the environment clips,
so the mean cannot drift past it where its gradient no longer changes what the arm does (measured on the arms:
success 21 % / 13 % at step 300 against 5 % / 4 % with an unbounded mean)."""

from __future__ import annotations

import math

import torch
from torch import nn

INITIAL_LOG_STD = -0.5
"""A continuous policy's starting log standard deviation (std 0.61 of an action range of [-1, 1])."""


class _Actions(nn.Module):
    def _action_head(self, num_actions: int, continuous: bool) -> None:
        self.continuous = continuous
        self.log_std = nn.Parameter(torch.full((num_actions,), INITIAL_LOG_STD)) if continuous else None

    def _out(self, out: torch.Tensor) -> torch.Tensor:
        """The head's output as the policy gives it: logits, or a Gaussian's mean in [-1, 1]."""
        return torch.tanh(out) if self.continuous else out


class MLPPolicy(_Actions):
    def __init__(self, obs_dim: int, hidden: int, num_actions: int, continuous: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, num_actions)
        )
        self._action_head(num_actions, continuous)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs (B, T, D) -> logits or means (B, T, A)."""
        return self._out(self.net(obs))

    def step(self, obs: torch.Tensor, state):
        """obs (B, D) -> logits or means (B, A), the unchanged (empty) state."""
        return self._out(self.net(obs)), state

    def initial_state(self, batch: int):
        return None


class GRUPolicy(_Actions):
    def __init__(self, obs_dim: int, hidden: int, num_actions: int, continuous: bool = False) -> None:
        super().__init__()
        self.gru = nn.GRU(obs_dim, hidden, batch_first=True)
        self.head = nn.Linear(hidden, num_actions)
        self._action_head(num_actions, continuous)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(obs)
        return self._out(self.head(out))

    def step(self, obs: torch.Tensor, state):
        out, state = self.gru(obs.unsqueeze(1), state)
        return self._out(self.head(out[:, 0])), state

    def initial_state(self, batch: int):
        return None


ARCHITECTURES = {"mlp": MLPPolicy, "gru": GRUPolicy}


def step_logprobs(
    policy: nn.Module, obs: torch.Tensor, actions: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Per-step log pi(a_t | o_<=t) of whole episodes: obs (B, T, D), actions (B, T) (discrete) or (B, T, A)
    (continuous: the Gaussian's density of the drawn, unclipped action, its std times the temperature) -> (B, T)."""
    out = token_logprobs(policy, obs, actions, temperature)
    return out.reshape(*actions.shape[:2], -1).sum(-1)


def token_logprobs(
    policy: nn.Module, obs: torch.Tensor, actions: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """An episode's "tokens" and their log-probs, what the losses average over: a discrete policy's steps, (B, T);
    a continuous policy's action coordinates in step order, (B, T x A): the Gaussian's covariance is diagonal, so
    an action's density is the product of its coordinates' (one token each), as a response's probability is the
    product of its tokens'. Averages over them are comparable between action spaces of different sizes."""
    out = policy(obs)
    if policy.continuous:
        log_std = policy.log_std.float() + math.log(temperature)
        z = (actions.float() - out.float()) / log_std.exp()
        return (-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi)).flatten(1)
    logits = out / temperature
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def draw(policy: nn.Module, out: torch.Tensor, temperature: float, generator: torch.Generator, greedy: bool):
    """The actions of one step from `out` (`policy.step`'s output, (B, A)): greedy, the most likely (discrete: the
    argmax; continuous: the mean); else drawn from the policy's distribution at `temperature`, with `generator`."""
    if policy.continuous:
        if greedy:
            return out.float()
        std = policy.log_std.float().exp() * temperature
        return out.float() + std * torch.randn(out.shape, generator=generator)
    if greedy:
        return out.argmax(-1)
    probs = torch.softmax(out.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
