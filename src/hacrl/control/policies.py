"""The policies: a feed-forward one that acts on the current observation and a recurrent one that acts on the
history. Both give logits over the environment's discrete actions for a whole episode at once (teacher-forced:
the log-probs of the loss) and step by step (sampling)."""

from __future__ import annotations

import torch
from torch import nn


class MLPPolicy(nn.Module):
    def __init__(self, obs_dim: int, hidden: int, num_actions: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, num_actions)
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs (B, T, D) -> logits (B, T, A)."""
        return self.net(obs)

    def step(self, obs: torch.Tensor, state):
        """obs (B, D) -> logits (B, A), the unchanged (empty) state."""
        return self.net(obs), state

    def initial_state(self, batch: int):
        return None


class GRUPolicy(nn.Module):
    def __init__(self, obs_dim: int, hidden: int, num_actions: int) -> None:
        super().__init__()
        self.gru = nn.GRU(obs_dim, hidden, batch_first=True)
        self.head = nn.Linear(hidden, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(obs)
        return self.head(out)

    def step(self, obs: torch.Tensor, state):
        out, state = self.gru(obs.unsqueeze(1), state)
        return self.head(out[:, 0]), state

    def initial_state(self, batch: int):
        return None


ARCHITECTURES = {"mlp": MLPPolicy, "gru": GRUPolicy}


def step_logprobs(
    policy: nn.Module, obs: torch.Tensor, actions: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Per-step log pi(a_t | o_<=t) of whole episodes: obs (B, T, D), actions (B, T) -> (B, T)."""
    logits = policy(obs) / temperature
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
