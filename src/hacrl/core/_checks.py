"""Input checks shared by the core functions.

Every check raises ``ValueError`` whose message names the offending tensor, says what is wrong and, where it can,
what to do. Checks that look at values (finiteness, ranges, ids) synchronise with the device once per call; they run
on inputs, never inside the differentiated computation.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_1d(name: str, x: Tensor, length: int | None = None) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"{name} must be 1-D (one value per response), got shape {tuple(x.shape)}")
    if length is not None and x.shape[0] != length:
        raise ValueError(f"{name} has {x.shape[0]} entries but the batch has {length}; pass one value per response")


def check_2d(name: str, x: Tensor, shape: tuple[int, int] | None = None) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (batch, tokens), got shape {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(x.shape)} but the batch's log-probs have shape {tuple(shape)}")


def check_integer(name: str, x: Tensor) -> None:
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor (torch.long), got dtype {x.dtype}")


def check_finite(name: str, x: Tensor, where: Tensor | None = None) -> None:
    """Raise if ``x`` (restricted to ``where`` when given) holds NaN or +-inf."""
    values = x if where is None else x[where]
    bad = ~torch.isfinite(values)
    if bool(bad.any()):
        first = values[bad][0]
        raise ValueError(
            f"{name} contains {int(bad.sum())} non-finite value(s) (first: {float(first)}); "
            "check the producer of this tensor (a diverged model, a reward function returning nan/inf)"
        )


def check_ids(name: str, ids: Tensor, num: int, what: str) -> None:
    """Raise unless every entry of ``ids`` lies in [0, num)."""
    if ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= num:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name} contains unknown {what} id {bad}; valid ids are 0..{num - 1} ({num} {what}s)")


def check_index(name: str, value: int, num: int, what: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < num:
        raise ValueError(f"{name}={value!r} is not a valid {what} id; valid ids are 0..{num - 1} ({num} {what}s)")
