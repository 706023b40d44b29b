"""`rollout.backend: hf`: transformers' `generate` with a KV cache, one call per batch of rows.

The GenerationConfig is built here in full, so a model directory's own generation_config (top_k=50, repetition
penalties, ...) never changes what hacrl samples. The KV cache is transformers' own `DynamicCache` with each
layer's keys and values in a buffer reserved for the whole call (`reserved_cache`): a token is written in place
instead of concatenated, which would copy the whole cache at every token and layer (O(length^2) bytes over a call:
on 2 CPU cores, 256 rows of 46 positions, 39 % of generate's time). Tokens, log-probs and random draws are the
same bit for bit (a test). With `logprobs`, a logits processor applies the temperature
itself (generate's own temperature is then 1, so the order of processors does not matter), keeps that step's
log-softmax and reads off the token drawn from it at the next step: the sampled tokens' log-probs at no extra
forward, in the memory of one (rows x vocabulary) tensor. top-p must be off for those (the config refuses it).
"""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from hacrl.agent.samplers.base import AUTO_ROWS, Sample, Sampler, cut_at_stop, pad_left

AUTO_BYTES = 4 * 2**30
"""`rollout.batch_size: auto` (the default): the rows of one generate call may hold this much cache and logits at
their length limits (a fixed number, not the free memory, so the batching and with it the samples are the same on
every machine and after a resume)."""


class _ReservedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of a buffer of `capacity` positions, allocated at the first
    update and written in place (grown by doubling past it); `keys` / `values` are always the filled part."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._buffers = tuple(
            x.new_empty((*x.shape[:-2], max(self.capacity, x.shape[-2]), x.shape[-1]))
            for x in (key_states, value_states)
        )
        self.length = 0
        self._views()
        self.is_initialized = True

    def _views(self) -> None:
        self.keys, self.values = (b[..., : self.length, :] for b in self._buffers)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._buffers[0].shape[-2]:
            self._refill(self.keys, self.values, room=max(end, 2 * self._buffers[0].shape[-2]))
        for buffer, states in zip(self._buffers, (key_states, value_states), strict=True):
            buffer[..., self.length : end, :] = states
        self.length = end
        self._views()
        return self.keys, self.values

    def _refill(self, keys: torch.Tensor, values: torch.Tensor, room: int | None = None) -> None:
        """New buffers holding `keys` / `values` (of any batch size) with room for `room` positions."""
        room = room or self._buffers[0].shape[-2]
        self._buffers = tuple(x.new_empty((*x.shape[:-2], room, x.shape[-1])) for x in (keys, values))
        for buffer, states in zip(self._buffers, (keys, values), strict=True):
            buffer[..., : states.shape[-2], :] = states
        self.length = keys.shape[-2]
        self._views()

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def reset(self) -> None:
        self._buffers, self.length = None, 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)  # validates, and narrows keys / values
        if self.is_initialized:
            self.length = self.keys.shape[-2]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length:
            self._refill(self.keys.repeat_interleave(repeats, dim=0), self.values.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length:
            self._refill(self.keys[indices, ...], self.values[indices, ...])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self.device))


def reserved_cache(model, capacity: int) -> DynamicCache | None:
    """A `DynamicCache` for `model` whose layers reserve `capacity` positions each; None (generate then builds its
    own cache) for a model whose cache layers are not all plain full-attention `DynamicLayer`s (sliding windows,
    linear attention, ...)."""
    cache = DynamicCache(config=model.config)
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [_ReservedLayer(capacity) for _ in cache.layers]
    return cache


def _cache_argument(model) -> str:
    """generate's name for a cache it is given: `cache` from transformers 5.2x on (`past_key_values` then warns),
    `past_key_values` before; read off the model's own forward."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


class _TokenLogprobs:
    """A logits processor that scales the raw scores by 1 / temperature (the same division transformers' own
    temperature warper does) and records the log-prob of each drawn token: at step t it stores the log-softmax of
    the scaled scores, at step t + 1 it gathers the token that was drawn (the last column of `input_ids`); `finish`
    reads the last step's tokens."""

    def __init__(self, temperature: float | None) -> None:
        self.temperature = temperature
        self.previous: torch.Tensor | None = None
        self.columns: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.columns.append(self.previous.gather(1, input_ids[:, -1:])[:, 0])
        if self.temperature is not None:
            scores = scores / self.temperature
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(rows, generated tokens): the log-prob of every drawn token, the last step's included."""
        self.columns.append(self.previous.gather(1, last_tokens[:, None])[:, 0])
        self.previous = None
        return torch.stack(self.columns, dim=1)


class HFSampler(Sampler):
    name = "hf"

    def rows_per_call(self, rows: list[list[int]]) -> int:
        """`auto`: every row in one call (a call per 64 rows made sampling 1.7x slower on 2 CPU cores, 256 answers
        of 32 tokens), unless their keys, values and logits at the length limits would pass AUTO_BYTES: then as
        many as fit, at least AUTO_ROWS."""
        from hacrl.agent.samplers.static import KVPool, row_bytes

        model = self.model
        dtype = next(model.parameters()).dtype
        vocab = model.get_output_embeddings().weight.shape[0]
        per_row = row_bytes(KVPool.bytes_per_token(model.config, dtype), self.agent.settings.max_tokens, vocab)
        return max(1, min(len(rows), max(AUTO_ROWS, AUTO_BYTES // per_row)))

    def sample_batch(
        self, rows: list[list[int]], greedy: bool, temperature: float, *, logprobs: bool = False
    ) -> list[Sample]:
        from transformers import GenerationConfig, LogitsProcessorList

        agent = self.agent
        recorder = _TokenLogprobs(None if greedy else temperature) if logprobs else None
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=(1.0 if recorder else temperature) if not greedy else None,  # the recorder applies it
            top_p=agent.settings.top_p if not greedy else None,
            top_k=0 if not greedy else None,
            max_new_tokens=agent.settings.max_new_tokens,
            eos_token_id=agent.stop_ids,
            pad_token_id=agent.pad_id,
            use_cache=True,
        )
        input_ids, attention_mask = pad_left(rows, agent.pad_id, agent.device)
        cache = reserved_cache(self.model, input_ids.shape[1] + agent.settings.max_new_tokens)
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=config,
            **({_cache_argument(self.model): cache} if cache is not None else {}),
            **({"logits_processor": LogitsProcessorList([recorder])} if recorder else {}),
        )
        generated = out[:, input_ids.shape[1] :]
        token_logp = recorder.finish(generated[:, -1]).tolist() if recorder else None
        samples = []
        for i, (prompt_ids, tokens) in enumerate(zip(rows, generated.tolist(), strict=True)):
            response, finished = cut_at_stop(tokens, agent.stop_ids)
            row_logp = token_logp[i][: len(response)] if token_logp is not None else None
            samples.append(Sample(prompt_ids, response, agent.decode(response), finished, row_logp))
        return samples
