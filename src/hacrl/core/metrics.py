"""Reducing a learner's loss metrics over micro- and mini-batches by declared kind, with one host sync.

Every metric a loss reports has a kind (`METRIC_KINDS`):

- `part`: the micro-batch's share of its mini-batch's value (the loss terms are divided by the mini-batch's
  sizes): parts add up within a mini-batch; the result is the mean over mini-batches.
- `own` / `foreign`: a mean over the batch's own / foreign rows: the result is the mean over all such rows of the
  update (each micro-batch weighted by `num_own` / `num_foreign`); absent when the update had none.
- `count`: a row count used as a weight; not reported.
- `values`: one value per row (a 1-D tensor): all of them are kept, and the result is their 10th, 50th and 90th
  percentiles (`<key>_p10`, ...) and, when present, nothing else (absent when the update had none).

A key a loss reports without declaring it (a user's own algorithm, say) is averaged over the micro-batches that
report it: never an error in a run. The losses registered here declare all of theirs (a test checks it), and
`hacrl.driver.metrics` names every metric a run logs.

The sums stay tensors on the learner's device through the update; `result` reads them in one transfer. The
arithmetic is float64 in a fixed order, so the values do not depend on where they are reduced.
"""

from __future__ import annotations

import torch
from torch import Tensor

METRIC_KINDS: dict[str, str] = {
    "loss": "part",
    "policy_loss": "part",
    "kl": "part",
    "num_own": "count",
    "num_foreign": "count",
    "own_ratio_mean": "own",
    "own_clip_frac": "own",
    "foreign_ratio_mean": "foreign",
    "foreign_clip_frac": "foreign",
    "foreign_below_frac": "foreign",
    "foreign_above_frac": "foreign",
    "foreign_lower_bound": "foreign",
    "rho_foreign_mean": "foreign",
    "foreign_ratios": "values",
    "behaviour_weight_mean": "own",
    "behaviour_capped_frac": "own",
}
QUANTILES = (0.1, 0.5, 0.9)
_WEIGHT = {"own": "num_own", "foreign": "num_foreign"}


class MetricReducer:
    """Accumulate `LossOutput.metrics` of every micro-batch of an update; `result()` gives the reduced floats.

    >>> r = MetricReducer()
    >>> r.add({"loss": torch.tensor(0.25), "num_own": torch.tensor(2), "num_foreign": torch.tensor(0),
    ...        "own_clip_frac": torch.tensor(0.5), "foreign_clip_frac": torch.tensor(0.0)})
    >>> r.add({"loss": torch.tensor(0.5), "num_own": torch.tensor(1), "num_foreign": torch.tensor(1),
    ...        "own_clip_frac": torch.tensor(1.0), "foreign_clip_frac": torch.tensor(1.0)})
    >>> r.end_mini_batch()
    >>> r.result()
    {'loss': 0.75, 'own_clip_frac': 0.6666666666666666, 'foreign_clip_frac': 1.0}
    """

    def __init__(self) -> None:
        self._sums: dict[str, Tensor] = {}
        self._counts: dict[str, Tensor | float] = {}
        self._parts_in_mini_batch: set[str] = set()
        self._values: dict[str, list[Tensor]] = {}

    def add(self, metrics: dict[str, Tensor]) -> None:
        for key, value in metrics.items():
            kind = METRIC_KINDS.get(key, "mean")
            if kind == "count":
                continue
            if kind == "values":
                self._values.setdefault(key, []).append(value.detach().double().reshape(-1))
                continue
            value = value.detach().double()
            if kind == "part":
                self._sums[key] = self._sums.get(key, 0.0) + value
                self._parts_in_mini_batch.add(key)
                self._counts.setdefault(key, 0.0)
            elif kind == "mean":
                self._sums[key] = self._sums.get(key, 0.0) + value
                self._counts[key] = self._counts.get(key, 0.0) + 1.0
            else:
                weight = metrics[_WEIGHT[kind]].detach().double()
                self._sums[key] = self._sums.get(key, 0.0) + value * weight
                self._counts[key] = self._counts.get(key, 0.0) + weight

    def end_mini_batch(self) -> None:
        for key in self._parts_in_mini_batch:
            self._counts[key] += 1.0
        self._parts_in_mini_batch.clear()

    def result(self) -> dict[str, float]:
        """The reduced metrics (one device-to-host transfer); keys whose count is 0 are left out."""
        keys = list(self._sums)
        out: dict[str, float] = {}
        if keys:
            sums = torch.stack([torch.as_tensor(self._sums[k], dtype=torch.float64) for k in keys])
            device = sums.device
            counts = torch.stack([torch.as_tensor(self._counts[k], dtype=torch.float64, device=device) for k in keys])
            values = torch.stack([sums, counts]).tolist()
            out = {k: s / c for k, s, c in zip(keys, values[0], values[1], strict=True) if c > 0}
        for key, parts in self._values.items():
            values = torch.cat(parts)
            if values.numel():
                q = torch.quantile(values, torch.tensor(QUANTILES, dtype=values.dtype, device=values.device)).tolist()
                stem = key.removesuffix("s")
                out.update({f"{stem}_p{round(100 * level)}": v for level, v in zip(QUANTILES, q, strict=True)})
        return out
