"""Batched sampling through the agent's sampler, and teacher-forced per-token log-probs with correct padding.

Choices:
1. Sampling goes through `agent.sampler` (`hacrl.samplers`: `hf` generate, or the `static` fixed-shape sampler).
2. A response runs up to and including the first stop token (the agent's EOS and the model's other EOS ids);
   tokens after it are padding and never enter the loss. A response without a stop token hit the length limit.
3. Log-probs are taken at the sampling temperature (logits / T) with position ids derived from the attention
   mask, so left- and right-padded batches give the same values.
4. With `chunk_size`, log-probs never hold a (rows x positions x vocabulary) tensor: the final hidden states of
   the response positions go through the output layer a chunk of positions at a time, each chunk recomputed in
   the backward pass (a selective log-softmax); the values are the full computation's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from hacrl.agents import Agent


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


def generate(agent: Agent, prompts: list[list[int]], num_samples: int, **options) -> list[Sample]:
    """`num_samples` responses to each prompt (prompt-major: all of prompt 0's, then prompt 1's, ...) from the
    agent's sampler (`rollout.backend`); options: greedy, batch_size, temperature, logprobs
    (`hacrl.samplers.Sampler`)."""
    return agent.sampler.sample(prompts, num_samples, **options)


@dataclass(frozen=True)
class Completion:
    """One generated response, as evaluation sees it."""

    text: str
    num_tokens: int
    finished: bool


def generate_completions(
    agent: Agent, prompts: list[list[dict[str, str]]], num_samples: int, *, greedy: bool, batch_size: int = 64
) -> list[Completion]:
    """`num_samples` completions per prompt (prompt-major), rendered with the agent's own chat template."""
    prompt_ids = [agent.render_prompt(messages)[0] for messages in prompts]
    samples = generate(agent, prompt_ids, num_samples, greedy=greedy, batch_size=batch_size)
    return [Completion(s.text, len(s.response_ids), s.finished) for s in samples]


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


@dataclass
class TokenBatch:
    """Prompt + response rows, right-padded. Position t of `response_mask` refers to token t + 1 of `input_ids`."""

    input_ids: Tensor  # (B, L)
    attention_mask: Tensor  # (B, L)
    response_mask: Tensor  # (B, L - 1) bool: targets that are response tokens

    @classmethod
    def build(cls, prompts: list[list[int]], responses: list[list[int]], pad_id: int, device, *, left: bool = False):
        rows = [p + r for p, r in zip(prompts, responses, strict=True)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        resp = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            offset = width - len(p) - len(r) if left else 0
            ids[i, offset : offset + len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
            attn[i, offset : offset + len(p) + len(r)] = 1
            resp[i, offset + len(p) : offset + len(p) + len(r)] = True
        return cls(ids.to(device), attn.to(device), resp[:, 1:].to(device))


AUTO_LOGITS_BYTES = 256 * 2**20
"""`chunk_size="auto"`: the full logits while they stay within this many bytes (float32), else chunks of this size."""


def auto_chunk_size(rows: int, positions: int, vocab: int) -> int | None:
    """The `auto` rule: None (the full logits, faster for small vocabularies) while rows x positions x vocabulary
    float32 logits fit in AUTO_LOGITS_BYTES, else the positions per chunk whose logits fit in it (at least 16)."""
    if rows * positions * vocab * 4 <= AUTO_LOGITS_BYTES:
        return None
    return max(16, AUTO_LOGITS_BYTES // (vocab * 4))


def token_logprobs(model, batch: TokenBatch, temperature: float, *, chunk_size: int | str | None = None) -> Tensor:
    """(B, L - 1) log pi(token_{t+1} | tokens_<=t) at temperature T; read it where `batch.response_mask` is set.

    `chunk_size=None`: the model's logits over every position (B x L x vocabulary floats). An int: only the response
    positions go through the output layer, `chunk_size` positions at a time, and each chunk's logits are recomputed
    in the backward pass instead of kept: memory O(chunk_size x vocabulary); positions outside the response read 0.
    `"auto"`: `auto_chunk_size` decides from the batch's shape and the model's vocabulary.
    """
    if chunk_size == "auto":
        head = model.get_output_embeddings()
        vocab = getattr(head, "out_features", None) or model.config.vocab_size
        chunk_size = auto_chunk_size(*batch.input_ids.shape, vocab)
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    if chunk_size is None or not _plain_output_layer(model):
        logits = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids, use_cache=False
        ).logits[:, :-1]
        logits = logits.float() / temperature
        targets = batch.input_ids[:, 1:].unsqueeze(-1)
        return logits.gather(-1, targets).squeeze(-1) - logits.logsumexp(-1)
    hidden = model.base_model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state[:, :-1]
    mask = batch.response_mask
    selected = hidden[mask]  # (N, H): the positions whose next token is a response token
    targets = batch.input_ids[:, 1:][mask]  # (N,)
    head = model.get_output_embeddings()
    parts = []
    for start in range(0, selected.shape[0], chunk_size):
        h, t = selected[start : start + chunk_size], targets[start : start + chunk_size]
        if torch.is_grad_enabled() and h.requires_grad:
            parts.append(checkpoint(_selected_logprobs, h, t, head, temperature, use_reentrant=False))
        else:
            parts.append(_selected_logprobs(h, t, head, temperature))
    out = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    return out.masked_scatter(mask, torch.cat(parts)) if parts else out


def _selected_logprobs(hidden: Tensor, targets: Tensor, head, temperature: float) -> Tensor:
    """log softmax(head(hidden) / T)[target] for (N, H) hidden states: the logits live only inside this call."""
    logits = head(hidden).float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def _plain_output_layer(model) -> bool:
    """The chunked path computes logits as output_layer(last hidden state); models that rescale or cap their
    logits (Gemma 2's softcapping, Cohere's logit_scale, ...) take the full path instead."""
    config = model.config
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None) not in (None, 1.0):
        return False
    return hasattr(model, "base_model") and model.get_output_embeddings() is not None
