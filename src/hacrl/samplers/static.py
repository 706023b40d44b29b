"""`rollout.backend: static`: fixed-shape decoding with a preallocated KV cache, built for CUDA graphs.

One call decodes a batch of rows (prompts left-padded to one length P) for up to N = `max_new_tokens` steps:

1. Prefill: the prompts through the model into a `StaticCache` of P + N positions (transformers' preallocated
   cache); the attention mask is one (rows, P + N) buffer whose column P + t is switched on before step t.
2. Decode step (fixed shapes: one token per row): logits of the last position, temperature and top-p applied and
   the next token drawn on the device (greedy: argmax), written into a (rows, N) buffer; a row that has produced a
   stop token is finished and feeds padding from then on. No value goes to the host inside the loop.
3. Every `sync_every` steps the host reads how many rows are still running: when none, the batch stops; when at
   most half, the running rows are gathered into the next power-of-two batch (cache, mask, positions, logits), so
   finished rows stop costing attention work and the decode step only ever sees a few shapes (one CUDA graph each).
4. `cuda_graphs=True` (`rollout.cuda_graphs`) compiles the decode step with `torch.compile(mode="reduce-overhead")`,
   which captures it as a CUDA graph per shape. So that the shapes repeat from call to call, the prompts are then
   left-padded to a multiple of `WIDTH_BUCKET` tokens and the KV cache of each (rows, length) shape is kept and
   reset rather than reallocated (a captured graph reads and writes fixed addresses), and a model with grouped
   key/value heads attends through `hacrl.samplers.attention` (the cache read in place, not expanded per query
   head as transformers' sdpa does under compile). Everything else is the same
   on CPU and GPU, and tested on CPU:
   greedy outputs equal `hf`'s token for token, sampled ones follow the same distribution (same temperature and
   top-p rules as transformers' logits warpers), stops and length limits are handled the same way.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hacrl.rollout import Sample, pad_left
from hacrl.samplers import Sampler
from hacrl.samplers.attention import use_grouped_decode

SYNC_EVERY = 8
"""Decode steps between the host's looks at how many rows are still running."""
WIDTH_BUCKET = 64
"""With CUDA graphs: prompts are left-padded to a multiple of this many tokens, so few shapes are ever compiled."""


class StaticSampler(Sampler):
    name = "static"

    def __init__(self, agent, *, cuda_graphs: bool = False, sync_every: int = SYNC_EVERY) -> None:
        super().__init__(agent)
        self.sync_every = sync_every
        self.cuda_graphs = cuda_graphs
        self._caches: dict[tuple[int, int], object] = {}
        """With CUDA graphs: one KV cache per (rows, length), reset and reused by every call of that shape."""
        self._step = self._decode_step
        if cuda_graphs:
            # compiled, transformers' sdpa would expand the whole cache per key/value group every token: read in place
            use_grouped_decode(agent.model)
            self._step = torch.compile(self._decode_step, mode="reduce-overhead", dynamic=False)

    def sample_batch(
        self, rows: list[list[int]], greedy: bool, temperature: float, *, logprobs: bool = False
    ) -> list[Sample]:
        tokens, lengths, finished, token_logp = self._decode(rows, greedy, temperature, logprobs)
        decode = self.agent.decode
        return [
            Sample(prompt_ids, row[:length], decode(row[:length]), done, lp[:length] if logprobs else None)
            for prompt_ids, row, length, done, lp in zip(rows, tokens, lengths, finished, token_logp, strict=True)
        ]

    def _decode(self, rows: list[list[int]], greedy: bool, temperature: float, logprobs: bool = False):
        from transformers import StaticCache

        agent, model = self.agent, self.agent.model
        device, pad, steps = agent.device, agent.pad_id, agent.max_new_tokens
        batch, width = len(rows), max(len(r) for r in rows)
        if self.cuda_graphs:
            width = -(-width // WIDTH_BUCKET) * WIDTH_BUCKET
        input_ids, prompt_mask = pad_left(rows, pad, device, width)
        attention = torch.zeros((batch, width + steps), dtype=torch.long, device=device)
        attention[:, :width] = prompt_mask
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        cache = self._cache(StaticCache, model.config, batch, width + steps)
        logits = model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        position = positions[:, -1:] + 1  # (rows, 1)
        stops = torch.tensor(agent.stop_ids, device=device)
        out = torch.full((batch, steps), pad, dtype=torch.long, device=device)
        out_logp = torch.zeros((batch, steps), dtype=torch.float32, device=device) if logprobs else None
        lengths = torch.full((batch,), steps, dtype=torch.long, device=device)
        live = torch.arange(batch, device=device)  # the output row of each decoding row (rows get compacted)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        for t in range(steps):
            token = self._pick(logits, greedy, temperature)
            token = torch.where(finished, torch.full_like(token, pad), token)
            out[live, t] = token
            if out_logp is not None:  # the drawn token's log-prob at the sampling temperature (no top-p)
                scaled = logits.float() if greedy else logits.float() / temperature
                out_logp[live, t] = torch.log_softmax(scaled, dim=-1).gather(1, token[:, None])[:, 0]
            stopped = torch.isin(token, stops) & ~finished
            lengths[live] = torch.where(stopped, torch.full_like(token, t + 1), lengths[live])
            finished = finished | stopped
            if t == steps - 1:
                break
            if (t + 1) % self.sync_every == 0:
                running = int((~finished).sum())  # the loop's only host sync, once per `sync_every` steps
                if running == 0:
                    break
                size = _bucket(running)
                if size <= finished.shape[0] // 2:  # compact: the running rows, topped up with finished ones
                    keep = torch.cat([(~finished).nonzero()[:, 0], finished.nonzero()[:, 0]])[:size]
                    _select_rows(cache, keep)
                    live, finished, token = live[keep], finished[keep], token[keep]
                    attention, position = attention[keep], position[keep]
            attention[:, width + t] = 1
            logits = self._step(token.unsqueeze(-1), attention, position, cache)
            position = position + 1
        last = out[:, steps - 1]
        done = (lengths < steps) | torch.isin(last, stops)
        token_logp = out_logp.tolist() if out_logp is not None else [None] * batch
        return out.tolist(), lengths.tolist(), done.tolist(), token_logp

    def _cache(self, factory, config, batch: int, length: int):
        """A fresh StaticCache, or with CUDA graphs the kept one of this shape, emptied (same tensors, same
        addresses). Row compaction (`_select_rows`) replaces a layer's tensors, so a compacted cache is not kept."""
        if not self.cuda_graphs:
            return factory(config=config, max_cache_len=length)
        cache = self._caches.get((batch, length))
        if cache is None or any(getattr(layer, "batch_size", batch) != batch for layer in cache.layers):
            cache = self._caches[(batch, length)] = factory(config=config, max_cache_len=length)
        else:
            cache.reset()
        return cache

    def _decode_step(self, token: Tensor, attention: Tensor, position: Tensor, cache) -> Tensor:
        """One token per row through the model; fixed shapes for a given batch size (a CUDA graph each)."""
        return self.agent.model(
            input_ids=token, attention_mask=attention, position_ids=position, cache=cache, use_cache=True
        ).logits[:, -1]

    def _pick(self, logits: Tensor, greedy: bool, temperature: float) -> Tensor:
        """The next token of each row: argmax, or a draw after temperature and top-p (transformers' rules; the
        draw follows the same distribution as `hf`'s, not the same random numbers)."""
        scores = logits.float()
        if greedy:
            return scores.argmax(-1)
        scores = scores / temperature
        top_p = self.agent.top_p
        if top_p < 1.0:
            ordered, order = torch.sort(scores, descending=False)
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            remove = cumulative <= (1 - top_p)
            remove[..., -1:] = False  # keep at least one token
            scores = scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
        # the exponential race: argmax of p_i / q_i with q_i ~ Exp(1) draws i with probability p_i, like
        # torch.multinomial, but elementwise and an argmax: no host sync per token (multinomial waits on the device)
        # and it can live inside a captured graph; q is kept above zero so a p_i of 0 is never drawn
        probs = scores.softmax(dim=-1)
        race = torch.empty_like(probs).exponential_().clamp_(min=torch.finfo(probs.dtype).tiny)
        return (probs / race).argmax(dim=-1)


def _bucket(running: int) -> int:
    """The smallest power of two that holds `running` rows."""
    return 1 << max(0, running - 1).bit_length()


def _select_rows(cache, keep: Tensor) -> None:
    """Keep rows `keep` of a StaticCache, in that order (transformers' static layers cannot do it themselves)."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False):
            layer.keys = layer.keys[keep]
            layer.values = layer.values[keep]
            layer.batch_size = keep.shape[0]
