"""Batched generation through an agent's sampler, for training and for evaluation.

1. Sampling goes through `agent.sampler` (`hacrl.samplers`: `hf` generate, or the `static` fixed-address sampler).
2. A response runs up to and including the first stop token (the agent's EOS and the model's other EOS ids);
   tokens after it are padding and never enter the loss. A response without a stop token hit the length limit.
   (Teacher-forced log-probs live in `hacrl.logprobs`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hacrl.messages import Completion
from hacrl.samplers.base import Sample

if TYPE_CHECKING:
    from hacrl.agents import Agent


def generate(agent: Agent, prompts: list[list[int]], num_samples: int, **options) -> list[Sample]:
    """`num_samples` responses to each prompt (prompt-major: all of prompt 0's, then prompt 1's, ...) from the
    agent's sampler (`rollout.backend`); options: greedy, batch_size, temperature, logprobs
    (`hacrl.samplers.Sampler`)."""
    return agent.sampler.sample(prompts, num_samples, **options)


def generate_completions(
    agent: Agent, prompts: list[list[dict[str, str]]], num_samples: int, *, greedy: bool, batch_size: int = 64
) -> list[Completion]:
    """`num_samples` completions per prompt (prompt-major), rendered with the agent's own chat template."""
    prompt_ids = [agent.render_prompt(messages)[0] for messages in prompts]
    samples = generate(agent, prompt_ids, num_samples, greedy=greedy, batch_size=batch_size)
    return [Completion(s.text, len(s.response_ids), s.finished) for s in samples]
