"""Each agent's effective settings, resolved once: its own entry where it sets one, else the run-wide group.

`AgentSettings.resolve(agent, rollout, trainer)` is the only place where `agents.<i>.temperature` falls back to
`rollout.temperature` (and so on for every field below); the agent, its worker, the memory plan, the config's
checks and the samplers all read the record it returns (a sampler through `SamplingAgent.settings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hacrl.config.schema import AgentConfig, RolloutConfig, TrainerConfig


@dataclass(frozen=True)
class AgentSettings:
    """What one agent samples with."""

    temperature: float
    """T: sampling temperature, and the temperature of every log-prob of its tokens (logits / T)."""
    top_p: float
    """Nucleus threshold (1.0: off)."""
    max_new_tokens: int
    """Response length limit in its own tokens (foreign responses are cut to it too)."""
    max_prompt_tokens: int
    """Prompt length limit in its own tokens (cut from the left)."""
    sampler: Literal["hf", "static"]
    """The sampler's name (`hacrl.agent.samplers`)."""
    rows_per_call: int | Literal["auto"]
    """Rows decoded together: a number, or `auto` (the static sampler sizes its KV pool to the device; `hf`: 64).
    Unset in the config: `auto` for `static`, `trainer.logprob_batch_size` for `hf`."""
    kv_cache_margin: float
    """With `rows_per_call: auto` on a GPU: the fraction of the device kept free beside the KV pool."""
    cuda_graphs: bool
    """The static sampler captures its decode step as a CUDA graph."""

    @property
    def max_tokens(self) -> int:
        """Prompt limit + response limit: the positions a prompt and its response can take."""
        return self.max_prompt_tokens + self.max_new_tokens

    @classmethod
    def resolve(cls, agent: AgentConfig, rollout: RolloutConfig, trainer: TrainerConfig | None = None) -> AgentSettings:
        sampler = agent.rollout_backend or rollout.backend
        rows = rollout.batch_size
        if rows is None:
            rows = "auto" if sampler == "static" else (trainer or TrainerConfig()).logprob_batch_size
        return cls(
            temperature=agent.temperature if agent.temperature is not None else rollout.temperature,
            top_p=agent.top_p if agent.top_p is not None else rollout.top_p,
            max_new_tokens=agent.max_new_tokens or rollout.max_new_tokens,
            max_prompt_tokens=agent.max_prompt_tokens or rollout.max_prompt_tokens,
            sampler=sampler,
            rows_per_call=rows,
            kv_cache_margin=rollout.kv_cache_margin,
            cuda_graphs=rollout.cuda_graphs,
        )
