"""Supervised warm-start (SFT) of a causal LM on (chat messages -> target text) pairs, loss on the target only.

Users SFT before RL so that rewards are informative; the built-in demo uses this to make its tiny agents partly
capable. The prompt is rendered with the tokenizer's own chat template (generation prompt on), exactly as the RL
trainer renders it, and the target is followed by the tokenizer's EOS so the model learns to stop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class SFTConfig:
    steps: int = 300
    """Optimizer steps."""
    batch_size: int = 64
    """Pairs per step."""
    lr: float = 3e-3
    """Peak AdamW learning rate."""
    warmup_steps: int = 50
    """Linear warm-up from 0 to `lr`."""
    schedule: str = "cosine"
    """After the warm-up: `cosine` decay to 10 % of `lr`, or `constant`."""
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


def encode_pairs(tokenizer, pairs: Sequence[tuple[list[dict[str, str]], str]], chat_template_kwargs=None):
    """Token ids of each prompt (chat template) and target (+ EOS)."""
    kwargs = chat_template_kwargs or {}
    out = []
    for messages, target in pairs:
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        target_ids = tokenizer(target, add_special_tokens=False, split_special_tokens=True).input_ids
        out.append((prompt_ids, [*target_ids, tokenizer.eos_token_id]))
    return out


def supervised_finetune(
    model,
    tokenizer,
    pairs: Sequence[tuple[list[dict[str, str]], str]],
    cfg: SFTConfig,
    *,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train `model` in place on `pairs` for `cfg.steps` steps; returns the loss of every step.

    Batches are drawn in seeded random order; the loss is the mean negative log-likelihood over target tokens.
    `on_step(step, loss)` is called after every step (progress reporting, evaluation).
    """
    if not pairs:
        raise ValueError("supervised_finetune needs at least one (messages, target) pair")
    if cfg.schedule not in ("cosine", "constant"):
        raise ValueError(f"SFTConfig.schedule must be 'cosine' or 'constant', got {cfg.schedule!r}")
    device = next(model.parameters()).device
    encoded = encode_pairs(tokenizer, pairs, cfg.chat_template_kwargs)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, cfg))
    g = torch.Generator().manual_seed(cfg.seed)
    model.train()
    losses = []
    order: list[int] = []
    for step in range(1, cfg.steps + 1):
        if len(order) < cfg.batch_size:
            order += torch.randperm(len(encoded), generator=g).tolist()
        batch, order = [encoded[i] for i in order[: cfg.batch_size]], order[cfg.batch_size :]
        input_ids, labels, attention = _collate(batch, pad_id, device)
        logits = model(input_ids=input_ids, attention_mask=attention, use_cache=False).logits[:, :-1].float()
        targets = labels[:, 1:]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    return losses


def _lr_factor(step: int, cfg: SFTConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _collate(batch, pad_id: int, device):
    width = max(len(p) + len(t) for p, t in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (p, t) in enumerate(batch):
        ids = p + t
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, len(p) : len(ids)] = torch.tensor(t)
        attention[i, : len(ids)] = 1
    return input_ids.to(device), labels.to(device), attention.to(device)
