"""Teacher-forced per-token log-probs with correct padding, for the loss and the old-policy pass.

1. Log-probs are taken at the sampling temperature (logits / T) with position ids derived from the attention mask,
   so left- and right-padded batches give the same values.
2. With `chunk_size`, log-probs never hold a (rows x positions x vocabulary) tensor: the final hidden states of
   the response positions go through the output layer a chunk of positions at a time, each chunk recomputed in
   the backward pass (a selective log-softmax); the values are the full computation's. `auto` (the default of
   `trainer.logprob_chunk_size`) chunks only where the full logits would be large (smaller chunks on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


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
"""`chunk_size="auto"` on an accelerator: the full logits while they stay within this many bytes (float32), else
chunks of this size."""
AUTO_LOGITS_BYTES_CPU = 64 * 2**20
"""The same on the CPU, where the host's resident memory is what a run runs out of: chunks of 341 positions for
SmolLM2's 49k vocabulary instead of 1,365 (a lower update peak, docs/benchmarks.md). Above glibc's largest
mmap threshold (32 MiB) on purpose: each chunk's logits are then a mapping of their own, returned when freed,
whatever `runtime.host_memory` says. Chunks just under it land in glibc's heap among small tensors and fragment it:
chunks of 55 positions (31.5 MiB of logits) peaked at 2.8 GiB where 64 (36.6 MiB) peaked at 0.3
(`tests/agent/test_samplers.py`'s probe)."""


def auto_chunk_size(rows: int, positions: int, vocab: int, *, cpu: bool) -> int | None:
    """The `auto` rule: None (the full logits, faster for small vocabularies) while rows x positions x vocabulary
    float32 logits fit in AUTO_LOGITS_BYTES (`cpu`: AUTO_LOGITS_BYTES_CPU), else the positions per chunk whose
    logits fit in it (at least 16)."""
    budget = AUTO_LOGITS_BYTES_CPU if cpu else AUTO_LOGITS_BYTES
    if rows * positions * vocab * 4 <= budget:
        return None
    return max(16, budget // (vocab * 4))


def token_logprobs(
    model, batch: TokenBatch, temperature: float, *, chunk_size: int | str | None = None, fused: bool = True
) -> Tensor:
    """(B, L - 1) log pi(token_{t+1} | tokens_<=t) at temperature T; read it where `batch.response_mask` is set.

    `chunk_size=None`: the model's logits over every position (B x L x vocabulary floats). An int: only the response
    positions go through the output layer, `chunk_size` positions at a time, and each chunk's logits are recomputed
    in the backward pass instead of kept: memory O(chunk_size x vocabulary); positions outside the response read 0.
    `"auto"`: `auto_chunk_size` decides from the batch's shape and the model's vocabulary. `fused` (a plain linear
    output layer): each chunk's gradient is formed in the buffer of its recomputed logits (`_SelectedLogprobs`); else
    autograd's, through a checkpoint (a sharded model's output layer must be called as a module: its hooks gather
    the weight).
    """
    if chunk_size == "auto":
        head = model.get_output_embeddings()
        vocab = getattr(head, "out_features", None) or model.config.vocab_size
        chunk_size = auto_chunk_size(*batch.input_ids.shape, vocab, cpu=batch.input_ids.device.type == "cpu")
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
    fused = fused and type(head) is torch.nn.Linear  # (a LoRA-wrapped head computes more than its weight's product)
    parts = []
    for start in range(0, selected.shape[0], chunk_size):
        h, t = selected[start : start + chunk_size], targets[start : start + chunk_size]
        if fused:
            parts.append(_SelectedLogprobs.apply(h, head.weight, head.bias, t, temperature))
        elif torch.is_grad_enabled() and h.requires_grad:
            parts.append(checkpoint(_selected_logprobs, h, t, head, temperature, use_reentrant=False))
        else:
            parts.append(_selected_logprobs(h, t, head, temperature))
    out = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    return out.masked_scatter(mask, torch.cat(parts)) if parts else out


def _selected_logprobs(hidden: Tensor, targets: Tensor, head, temperature: float) -> Tensor:
    """log softmax(head(hidden) / T)[target] for (N, H) hidden states: the logits live only inside this call."""
    logits = head(hidden).float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def _scaled_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """float32 logits / T of (N, H) hidden states (a new tensor: the caller may write into it)."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


class _SelectedLogprobs(torch.autograd.Function):
    """log softmax((hidden @ weight.T + bias) / T)[target] for a chunk of (N, H) hidden states, the values of
    `_selected_logprobs`, with one (N x vocabulary) float32 tensor alive at a time: the forward keeps only the
    log-normalisers; the backward recomputes the logits and turns them into their gradient in place, (onehot -
    softmax) x grad / T, before the two products of the linear layer's backward (a fused linear cross-entropy, as
    Liger's, without a kernel of its own). Autograd through a checkpoint keeps three to five such tensors alive in the
    backward (the logits, their scaled copy, the softmax, the gather's scattered gradient and the sum): on SmolLM2's
    49k vocabulary at 341 positions a chunk, 67 MiB each. The same operations in the same order as autograd's, so
    values and gradients equal its bit for bit, float32 and bfloat16 weights alike (`tests/agent/test_samplers.py`)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature):
        logits = _scaled_logits(hidden, weight, bias, temperature)
        normaliser = logits.logsumexp(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, normaliser)
        ctx.temperature = temperature
        return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - normaliser

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias, targets, normaliser = ctx.saved_tensors
        temperature = ctx.temperature
        g = _scaled_logits(hidden, weight, bias, temperature)
        g.sub_(normaliser.unsqueeze(-1)).exp_().mul_(-grad.unsqueeze(-1))  # the normaliser's part: -grad x softmax
        g.scatter_add_(-1, targets.unsqueeze(-1), grad.unsqueeze(-1).to(g.dtype))  # the target's: + grad
        if temperature != 1.0:
            g.div_(temperature)
        g = g.to(hidden.dtype)
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = g.mm(weight) if need_hidden else None
        grad_weight = hidden.t().mm(g).t() if need_weight else None
        grad_bias = g.sum(0) if bias is not None and need_bias else None
        return grad_hidden, grad_weight, grad_bias, None, None


def _plain_output_layer(model) -> bool:
    """The chunked path computes logits as output_layer(last hidden state); models that rescale or cap their
    logits (Gemma 2's softcapping, Cohere's logit_scale, ...) take the full path instead."""
    config = model.config
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None) not in (None, 1.0):
        return False
    return hasattr(model, "base_model") and model.get_output_embeddings() is not None


@torch.no_grad()
def rows_logprobs(agent, rows, *, chunk_size: int | str | None) -> tuple[Tensor, TokenBatch]:
    """Per-token log-probs of `rows` (anything with `prompt_ids` and `response_ids`) under `agent`'s current
    weights (its log-prob module: the merged copy of a LoRA agent), and their batch."""
    tb = TokenBatch.build([r.prompt_ids for r in rows], [r.response_ids for r in rows], agent.pad_id, agent.device)
    return token_logprobs(agent.logprob_model, tb, agent.settings.temperature, chunk_size=chunk_size), tb
