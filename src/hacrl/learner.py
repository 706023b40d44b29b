"""One learner update, for both trainers (`hacrl train`'s agent workers and `hacrl control`'s policies): torch only.

    loss_inputs   the core's `LossInputs` of a batch of pool rows (any object with the row columns `source`,
                  `source_logp_sum`, `source_num_tokens`, `num_bytes`), built one way for every caller
    update        the mini-batch loop: for each mini-batch, zero the gradients, let the caller accumulate them
                  (`backward`), clip, take the optimizer step when the norm is finite (spec 3.6: else skip it and
                  count it), then release the gradients; the metrics of the loss (`MetricReducer`), the mean
                  gradient norm and the step counters

What differs between the trainers stays with them: how a mini-batch's gradient is accumulated (micro-batches of
token rows, or whole episodes), how the gradient norm is clipped (float32 masters, a sharded model, plain
parameters), and what happens after a step (a sampling copy marked stale, a failpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import torch

from hacrl.core import LossInputs
from hacrl.core.metrics import MetricReducer

Batch = TypeVar("Batch")


class Row(Protocol):
    """What `loss_inputs` reads of a pool row (an LLM trainer's `LearnerRow`, a control `Episode`)."""

    source: int
    source_logp_sum: float

    @property
    def source_num_tokens(self) -> int: ...

    @property
    def num_bytes(self) -> int: ...


class Steps(Protocol):
    """What `update` needs of an optimizer (torch's, or hacrl's `ParameterStep` / `MasterStep`)."""

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> Any: ...


def loss_inputs(
    rows: Sequence[Row],
    logp: torch.Tensor,
    mask: torch.Tensor,
    old_logp: torch.Tensor,
    adv: Sequence[float] | torch.Tensor,
    learner: int,
    capabilities: torch.Tensor,
    **options: Any,
) -> LossInputs:
    """The core's inputs for `rows` (in batch order) on `logp`'s device: advantages as float32, source ids, the
    sources' log-prob sums as float64 (a foreign row's ratio reads them), token and byte counts. `options` are
    `LossInputs`'s own (`ref_logp`, `num_seqs`, `num_own`, `check_values`)."""
    device = logp.device
    adv = adv if isinstance(adv, torch.Tensor) else torch.tensor(adv, dtype=torch.float64)
    return LossInputs(
        logp=logp,
        mask=mask,
        old_logp=old_logp,
        adv=adv.to(device=device, dtype=torch.float32),
        source=torch.tensor([r.source for r in rows], device=device),
        learner=learner,
        capabilities=capabilities.to(device),
        source_logp_sum=torch.tensor([r.source_logp_sum for r in rows], dtype=torch.float64, device=device),
        source_num_tokens=torch.tensor([r.source_num_tokens for r in rows], device=device),
        num_bytes=torch.tensor([r.num_bytes for r in rows], device=device),
        **options,
    )


def update(
    optimizer: Steps,
    mini_batches: Iterable[tuple[int, Batch]],
    backward: Callable[[int, Batch, MetricReducer], None],
    clip_grad_norm: Callable[[], torch.Tensor],
    on_step: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """One optimizer step per mini-batch, in order. `mini_batches` gives (m, batch): m is the step's index in the
    update (the loss's `step_index`: the stepwise clipping bound reads it). `backward(m, batch, reducer)` accumulates
    the mini-batch's gradient and adds its loss metrics to `reducer`; `clip_grad_norm()` clips and returns the
    norm; `on_step()` runs after each step taken. A non-finite norm skips the step (counted). The gradients are
    released at the end (not held through the next sampling).

    Returns the loss metrics (mean over mini-batches), `grad_norm` (mean over the steps taken), `skipped_steps` and
    `optimizer_steps` (steps taken)."""
    reducer = MetricReducer()
    norms: list[torch.Tensor] = []
    skipped = 0
    for m, batch in mini_batches:
        optimizer.zero_grad(set_to_none=True)
        backward(m, batch, reducer)
        reducer.end_mini_batch()
        norm = clip_grad_norm()
        if torch.isfinite(norm):  # one host sync per optimizer step: whether to take it
            optimizer.step()
            norms.append(norm)
            on_step()
        else:
            optimizer.zero_grad(set_to_none=True)
            skipped += 1
    optimizer.zero_grad(set_to_none=True)
    metrics: dict[str, Any] = reducer.result()
    if norms:
        total = 0.0
        for value in torch.stack([n.detach().cpu() for n in norms]).double().tolist():
            total += value
        metrics["grad_norm"] = total / len(norms)
    metrics["skipped_steps"] = skipped
    metrics["optimizer_steps"] = len(norms)
    return metrics
