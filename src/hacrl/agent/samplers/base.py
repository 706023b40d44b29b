"""What every sampler shares: the `Sample` it returns, the `Sampler` base class, and the padding helpers.

Imports nothing else of hacrl at run time: a sampler reads its agent through `SamplingAgent` (the few attributes it
needs; `hacrl.agent.model.Agent` has them), so `hacrl.agent.model` can build a sampler and the training side can read
samples without an import circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:
    from hacrl.config.settings import AgentSettings


class SamplingAgent(Protocol):
    """What a sampler reads of the agent it samples for (read live: a changed `stop_ids` applies to the next
    call)."""

    name: str
    index: int
    """Its agent id (names its compiled decode step)."""
    model: Any
    """The Hugging Face causal LM it trains (a sampler decodes with it unless it is given a copy to decode with)."""
    device: torch.device
    pad_id: int
    stop_ids: list[int]
    settings: AgentSettings
    """Temperature, top-p, length limits, rows per call, KV margin, CUDA graphs (`hacrl.config.settings`)."""
    optimizer: Any
    """Its optimizer (None: frozen): `pending_bytes()` is what its first step will still allocate on the device,
    which the static sampler leaves free when it sizes its KV pool."""

    def decode(self, response_ids: list[int]) -> str: ...


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


@dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]
    """Sampled tokens, the final stop token included when `finished`."""
    text: str
    finished: bool
    """True: ended with a stop token (`eos`); False: cut at max_new_tokens (`length`)."""
    logprobs: list[float] | None = None
    """With `sample(..., logprobs=True)`: each response token's log-prob under the sampling policy at the sampling
    temperature (log-softmax of logits / T, no top-p), as the sampler computed it while drawing."""

    @property
    def finish_reason(self) -> str:
        return "eos" if self.finished else "length"


def cut_at_stop(tokens: list[int], stop_ids: list[int]) -> tuple[list[int], bool]:
    stops = set(stop_ids)
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[: i + 1], True
    return tokens, False


def pad_left(
    rows: list[list[int]], pad_id: int, device: torch.device, width: int | None = None
) -> tuple[Tensor, Tensor]:
    """Rows left-padded to `width` (default: the longest row): ids and attention mask."""
    width = max([len(r) for r in rows] + [width or 0])
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids.to(device), mask.to(device)


AUTO_ROWS = 64
"""Rows per call for `rollout.batch_size: auto` where memory is not measured (the `hf` sampler, the CPU)."""


class Sampler:
    """The base of every sampler: `sample` expands prompts into rows (prompt-major), decodes them `batch_size` rows
    at a time with `sample_batch`, and leaves the model in the mode it found it in."""

    name = "base"

    def __init__(self, agent: SamplingAgent, model: Any = None) -> None:
        """`model`: the module it decodes with, when it is not `agent.model` (the agent's sampling copy: a LoRA
        agent's merged base, a sharded agent's gathered weights)."""
        self.agent = agent
        self.model = agent.model if model is None else model

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

        model = self.model
        was_training = model.training
        model.eval()
        rows = [p for p in prompts for _ in range(num_samples)]
        batch_size = self.rows_per_call(rows) if batch_size == "auto" else self.cap_rows(batch_size)
        temperature = temperature or self.agent.settings.temperature
        try:
            with torch.no_grad():
                samples = self.sample_rows(rows, batch_size, greedy, temperature, logprobs=logprobs)
        finally:
            model.train(was_training)
        return samples

    def sample_rows(
        self, rows: list[list[int]], batch_size: int, greedy: bool, temperature: float, *, logprobs: bool = False
    ) -> list[Sample]:
        """One response per row, `batch_size` rows decoded together: here consecutive calls of `sample_batch` (the
        static sampler instead keeps `batch_size` slots busy, starting a waiting row in each slot a row frees)."""
        samples: list[Sample] = []
        for start in range(0, len(rows), batch_size):
            samples.extend(self.sample_batch(rows[start : start + batch_size], greedy, temperature, logprobs=logprobs))
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
        """The weights it decodes with changed since the last sampling (called before the next one, once the
        agent's sampling copy followed them); samplers that read the module's weights in place (both of hacrl's)
        have nothing to do."""
