"""Samplers: how an agent generates responses. `rollout.backend` (or `agents.<i>.rollout_backend`) picks one by name.

    hf      transformers' `generate` with a dynamic KV cache (the CPU default; what hacrl always did)
    static  a preallocated KV cache and a fixed-shape decode step: sampling on the device without a host sync per
            token, finished rows dropped from the batch in power-of-two buckets, the whole batch stopping when every
            row has finished; `rollout.cuda_graphs` captures its decode step as a CUDA graph (GPU)

Every sampler keeps one contract (`Sampler.sample` -> `hacrl.rollout.Sample`): a response runs up to and including
its first stop token (the agent's EOS and the model's other EOS ids), `finished` says whether it ended there, the
text is decoded with special tokens dropped; it honours the agent's temperature, top-p and length limit. `refresh`
is called after each optimizer update (a no-op where the sampler shares the training module's weights, as both
of these do; an engine holding its own copy, vLLM say, would load the new weights there).

Implementations load lazily: naming one imports its module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hacrl.agents import Agent
    from hacrl.rollout import Sample

AUTO_ROWS = 64
"""Rows per call for `rollout.batch_size: auto` where memory is not measured (the `hf` sampler, the CPU)."""

SAMPLERS = {"hf": "hacrl.samplers.hf:HFSampler", "static": "hacrl.samplers.static:StaticSampler"}


class Sampler:
    """The base of every sampler: `sample` expands prompts into rows (prompt-major), decodes them `batch_size` rows
    at a time with `sample_batch`, and leaves the model in the mode it found it in."""

    name = "base"

    def __init__(self, agent: Agent, *, cuda_graphs: bool = False) -> None:
        self.agent = agent

    def sample(
        self,
        prompts: list[list[int]],
        num_samples: int,
        *,
        greedy: bool = False,
        batch_size: int | str = 256,
        temperature: float | None = None,
        logprobs: bool = False,
    ) -> list[Sample]:
        """`num_samples` responses to each prompt (token ids), prompt-major, `batch_size` rows per call (`auto`:
        `rows_per_call` decides); with `logprobs`, each Sample carries its tokens' log-probs as computed while
        sampling (`Sample.logprobs`)."""
        import torch

        model = self.agent.model
        was_training = model.training
        model.eval()
        rows = [p for p in prompts for _ in range(num_samples)]
        batch_size = self.rows_per_call(rows) if batch_size == "auto" else self.cap_rows(batch_size)
        temperature = temperature or self.agent.temperature
        samples: list[Sample] = []
        try:
            with torch.no_grad():
                for start in range(0, len(rows), batch_size):
                    batch = rows[start : start + batch_size]
                    samples.extend(self.sample_batch(batch, greedy, temperature, logprobs=logprobs))
        finally:
            model.train(was_training)
        return samples

    def sample_batch(
        self, rows: list[list[int]], greedy: bool, temperature: float, *, logprobs: bool = False
    ) -> list[Sample]:
        """One response per row, all rows decoded together (with `logprobs`: and their tokens' log-probs)."""
        raise NotImplementedError

    def rows_per_call(self, rows: list[list[int]]) -> int:
        """`rollout.batch_size: auto`: rows per generation call. Here a fixed 64; the static sampler sizes its KV
        pool to the device."""
        return AUTO_ROWS

    def cap_rows(self, batch_size: int) -> int:
        """A given number of rows per call, capped where the sampler must bound its memory (the static sampler with
        `rollout.batch_size: auto` on a GPU: evaluation's `eval.batch_size` never grows its KV pool past the size
        it chose)."""
        return batch_size

    def refresh(self) -> None:
        """The policy's weights changed (after an optimizer step); samplers that decode with the training module
        itself (both of hacrl's) have nothing to do."""


def make_sampler(name: str, agent: Agent, *, cuda_graphs: bool = False) -> Sampler:
    target = SAMPLERS.get(name)
    if target is None:
        from hacrl.errors import ConfigError

        raise ConfigError(f"rollout backend {name!r} is not one of {sorted(SAMPLERS)}")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)(agent, cuda_graphs=cuda_graphs)
