"""`algorithm.foreign_center: median` (a hacrl extension of spec 3.5, issue 85): each source's log-ratios centred by
their median before HACPO's window, on hand-computed rows; `none` is the paper's window, value for value."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from hacrl.core import AlgorithmParams, hacpo_loss, median_by_source, sequence_log_ratios
from tests.core.helpers import Row, grad_of, make_inputs

# learner 0 beside agents 1 and 2, every foreign s below 0.8 (the paper's window holds each one back); log s is the
# row's new mean - its source's mean (-1)
LOG_S = [None, -3.1, -3.0, -2.9, -1.0, -0.5, -4.55, -4.45]
ROWS = [Row(3, -1.0, -1.0, 1.0, 0)] + [
    Row(2 if src == 1 else 1, log_s - 1.0, -1.0, -1.0 if i == 2 else 1.0, src)
    for i, (log_s, src) in enumerate(zip(LOG_S, [0, 1, 1, 1, 1, 2, 2, 2], strict=True)) if i
]  # fmt: skip
CAPS = (0.5, 0.5, 0.5)


def inputs(**kwargs):
    return make_inputs(ROWS, capabilities=CAPS, **kwargs)


def test_the_median_of_each_source_is_taken_over_its_own_rows():
    log_s = sequence_log_ratios(inputs(), "source_mean")
    assert log_s[1:].tolist() == pytest.approx(LOG_S[1:])
    shift = median_by_source(log_s, inputs().source, ~inputs().is_own)
    # agent 1: -3.1, -3.0, -2.9, -1.0, an even count: the lower middle; agent 2: -4.55, -4.45, -0.5
    assert shift.tolist() == pytest.approx([0.0, -3.0, -3.0, -3.0, -3.0, -4.45, -4.45, -4.45])


def test_centred_rows_inside_the_window_carry_gradient_and_the_others_stay_held_back():
    params = AlgorithmParams(delta=0.2, delta_step=0.0)
    paper = hacpo_loss(inputs(), params=params, step_index=0)
    assert float(paper.metrics["foreign_clip_frac"]) == 1.0

    raw = inputs()
    shift = median_by_source(sequence_log_ratios(raw, "source_mean"), raw.source, ~raw.is_own)
    centred = inputs(foreign_shift=shift)
    out = hacpo_loss(centred, params=params, step_index=0)
    grad = grad_of(out, centred).sum(-1).tolist()
    # log s' = log s - median: rows 1 and 6 at -0.1 (s' = 0.905, inside [0.8, 1]), rows 3, 4, 5 at 0.1, 2.0 and
    # 4.05 (held back above); rows 2 and 7 are their source's median (s' = 1 up to rounding: not asserted)
    assert [grad[i] == 0 for i in (3, 4, 5)] == [True, True, True]
    inside = math.exp(-0.1) ** 2  # d/dlogp summed over a row's tokens: s'^(1 + alpha) rho A, rho = 1, / B = 8
    assert grad[1] == pytest.approx(-inside / 8) and grad[6] == pytest.approx(-inside / 8)
    assert 3 / 7 <= float(out.metrics["foreign_clip_frac"]) <= 5 / 7


def test_a_zero_shift_is_the_papers_window_value_for_value():
    params = AlgorithmParams()
    a = hacpo_loss(inputs(), params=params, step_index=1)
    b = hacpo_loss(inputs(foreign_shift=torch.zeros(len(ROWS), dtype=torch.float64)), params=params, step_index=1)
    assert torch.equal(a.loss, b.loss)
    with pytest.raises(ValueError, match="foreign_center must be none or median"):
        replace(params, foreign_center="mean")
