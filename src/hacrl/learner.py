"""One learner update, for both trainers (`hacrl train`'s agent workers and `hacrl control`'s policies): torch only.

    loss_inputs   the core's `LossInputs` of a batch of pool rows (any object with the row columns `source`,
                  `source_logp_sum`, `source_num_tokens`, `num_bytes`), built one way for every caller
    mini_batches  which rows of a pool each optimizer step takes (`trainer.mini_batch_layout`: blocks or mixed)
    update        the mini-batch loop: for each mini-batch, zero the gradients, let the caller accumulate them
                  (`backward`), clip, take the optimizer step when the norm is finite (spec 3.6: else skip it and
                  count it) and, with `skip_zero`, not zero, then release the gradients; the metrics of the
                  loss (`MetricReducer`), the mean gradient norm and the step counters

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


def mini_batches(sources: Sequence[int], size: int, layout: str = "blocks") -> list[list[int]]:
    """The rows (indexes into a pool whose row i came from agent `sources[i]`) of each optimizer step, in order: as
    many steps as `size` rows each make, ceil(len / size). `blocks`: consecutive rows. `mixed`: each source's rows
    (in pool order) cut into that many consecutive chunks of floor-rounded equal shares, step m holding chunk m of
    every source, sources in the order they first appear; a pool of one source gives `blocks`' steps when `size`
    divides it (the config's rule for an agent's own rows).

    >>> mini_batches([0, 0, 0, 0, 1, 1, 1, 1], 4)
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> mini_batches([0, 0, 0, 0, 1, 1, 1, 1], 4, "mixed")
    [[0, 1, 4, 5], [2, 3, 6, 7]]
    >>> mini_batches([0, 0, 0, 0, 1, 2, 2], 4, "mixed")
    [[0, 1, 5], [2, 3, 4, 6]]
    """
    steps = -(-len(sources) // size)
    if layout == "blocks" or steps <= 1:
        return [list(range(start, min(start + size, len(sources)))) for start in range(0, len(sources), size)]
    if layout != "mixed":
        raise ValueError(f"mini-batch layout {layout!r} is not one of blocks, mixed")
    rows: dict[int, list[int]] = {}
    for i, source in enumerate(sources):
        rows.setdefault(source, []).append(i)
    out: list[list[int]] = [[] for _ in range(steps)]
    for own in rows.values():
        for m in range(steps):
            out[m] += own[m * len(own) // steps : (m + 1) * len(own) // steps]
    return out


def update(
    optimizer: Steps,
    mini_batches: Iterable[tuple[int, Batch]],
    backward: Callable[[int, Batch, MetricReducer], None],
    clip_grad_norm: Callable[[], torch.Tensor],
    on_step: Callable[[], None] = lambda: None,
    *,
    skip_zero: bool = False,
) -> dict[str, Any]:
    """One optimizer step per mini-batch, in order. `mini_batches` gives (m, batch): m is the step's index in the
    update (the loss's `step_index`: the stepwise clipping bound reads it). `backward(m, batch, reducer)` accumulates
    the mini-batch's gradient and adds its loss metrics to `reducer`; `clip_grad_norm()` clips and returns the
    norm; `on_step()` runs after each step taken. A non-finite norm skips the step (counted); with `skip_zero`
    (`trainer.zero_grad_step: skip`) so does a norm of exactly 0, which leaves the optimizer's state and the weights
    as they were (AdamW would move them along its momentum alone). The gradients are released at the end (not held
    through the next sampling).

    Returns the loss metrics (mean over mini-batches), `grad_norm` (mean over the steps taken), `skipped_steps`,
    `optimizer_steps` (steps taken) and, with `skip_zero`, `zero_grad_skipped`."""
    reducer = MetricReducer()
    norms: list[torch.Tensor] = []
    skipped = zero = 0
    for m, batch in mini_batches:
        optimizer.zero_grad(set_to_none=True)
        backward(m, batch, reducer)
        reducer.end_mini_batch()
        norm = clip_grad_norm()
        if skip_zero and bool(norm == 0):  # every row's gradient is zero: nothing to step on
            optimizer.zero_grad(set_to_none=True)
            zero += 1
        elif torch.isfinite(norm):  # one host sync per optimizer step: whether to take it
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
    if skip_zero:
        metrics["zero_grad_skipped"] = zero
    return metrics
