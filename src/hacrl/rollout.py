"""Batched sampling with a KV cache, and teacher-forced per-token log-probs with correct padding.

Choices:
1. Sampling uses `model.generate` (KV cache) with a GenerationConfig built here in full, so a model directory's
   own generation_config (top_k=50, repetition penalties, ...) never changes what hacrl samples.
2. A response runs up to and including the first stop token (the agent's EOS and the model's other EOS ids);
   tokens after it are padding and never enter the loss. A response without a stop token hit the length limit.
3. Log-probs are taken at the sampling temperature (logits / T) with position ids derived from the attention
   mask, so left- and right-padded batches give the same values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hacrl.agents import Agent


@dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]
    """Sampled tokens, the final stop token included when `finished`."""
    text: str
    finished: bool
    """True: ended with a stop token (`eos`); False: cut at max_new_tokens (`length`)."""

    @property
    def finish_reason(self) -> str:
        return "eos" if self.finished else "length"


@torch.no_grad()
def generate(
    agent: Agent,
    prompts: list[list[int]],
    num_samples: int,
    *,
    greedy: bool = False,
    batch_size: int = 256,
    temperature: float | None = None,
) -> list[Sample]:
    """`num_samples` responses to each prompt (prompt-major order: all of prompt 0's, then prompt 1's, ...)."""
    from transformers import GenerationConfig

    model = agent.model
    was_training = model.training
    model.eval()
    config = GenerationConfig(
        do_sample=not greedy,
        temperature=(temperature or agent.temperature) if not greedy else None,
        top_p=agent.top_p if not greedy else None,
        top_k=0 if not greedy else None,
        max_new_tokens=agent.max_new_tokens,
        eos_token_id=agent.stop_ids,
        pad_token_id=agent.pad_id,
        use_cache=True,
    )
    rows = [p for p in prompts for _ in range(num_samples)]
    samples: list[Sample] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        input_ids, attention_mask = pad_left(chunk, agent.pad_id, agent.device)
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
        new = out[:, input_ids.shape[1] :].tolist()
        for prompt_ids, tokens in zip(chunk, new, strict=True):
            response, finished = _cut_at_stop(tokens, agent.stop_ids)
            samples.append(Sample(prompt_ids, response, agent.decode(response), finished))
    model.train(was_training)
    return samples


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


def _cut_at_stop(tokens: list[int], stop_ids: list[int]) -> tuple[list[int], bool]:
    stops = set(stop_ids)
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[: i + 1], True
    return tokens, False


def pad_left(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    width = max(len(r) for r in rows)
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


def token_logprobs(model, batch: TokenBatch, temperature: float) -> Tensor:
    """(B, L - 1) log pi(token_{t+1} | tokens_<=t) at temperature T; read it where `batch.response_mask` is set."""
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids, use_cache=False
    ).logits[:, :-1]
    logits = logits.float() / temperature
    targets = batch.input_ids[:, 1:].unsqueeze(-1)
    return logits.gather(-1, targets).squeeze(-1) - logits.logsumexp(-1)
