"""Batched generation through an agent's sampler, for training and for evaluation.

1. Sampling goes through `agent.sampler` (`hacrl.agent.samplers`: `hf` generate, or the `static` fixed-address sampler).
2. A response runs up to and including the first stop token (the agent's EOS and the model's other EOS ids);
   tokens after it are padding and never enter the loss. A response without a stop token hit the length limit.
   (Teacher-forced log-probs live in `hacrl.agent.logprobs`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hacrl.agent.samplers.base import Sample
from hacrl.messages import Completion

if TYPE_CHECKING:
    from hacrl.agent.model import Agent


def generate(
    agent: Agent,
    prompts: list[list[int]],
    num_samples: int,
    *,
    greedy: bool = False,
    batch_size: int | str | None = None,
    logprobs: bool = False,
) -> list[Sample]:
    """`num_samples` responses to each prompt (prompt-major: all of prompt 0's, then prompt 1's, ...) from the
    agent's sampler, `batch_size` rows per call (None: the agent's `settings.rows_per_call`; `auto`: the sampler
    decides), at the agent's temperature; with `logprobs`, each sample carries its tokens' log-probs as the
    sampler computed them (`hacrl.agent.samplers.Sampler.sample`)."""
    rows = agent.settings.rows_per_call if batch_size is None else batch_size
    return agent.sampler.sample(prompts, num_samples, greedy=greedy, batch_size=rows, logprobs=logprobs)


def generate_completions(
    agent: Agent, prompts: list[list[dict[str, str]]], num_samples: int, *, greedy: bool, batch_size: int = 64
) -> list[Completion]:
    """`num_samples` completions per prompt (prompt-major), rendered with the agent's own chat template."""
    prompt_ids = [agent.render_prompt(messages)[0] for messages in prompts]
    samples = generate(agent, prompt_ids, num_samples, greedy=greedy, batch_size=batch_size)
    return [Completion(s.text, len(s.response_ids), s.finished) for s in samples]
