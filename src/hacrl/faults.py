"""Failpoints: named places where the fault-injection tests stop a run, by signal, at an exact moment.

`HACRL_FAULTS="update.micro_batch:3,checkpoint.agent:1:TERM"` makes the 3rd time this process passes
`hit("update.micro_batch")` send it SIGKILL, and the 1st `hit("checkpoint.agent")` send it SIGTERM (`:STOP`: SIGSTOP,
a worker that stops answering; `:ENOSPC`: raise the OSError of a full disk there instead of a signal). Without the
variable (always, outside tests) `hit` is a dictionary lookup. With `HACRL_FAULTS_RANK=r` the plan holds only in
rank r of a worker group (`agents.<i>.devices`), not in the driver or the other ranks; `HACRL_FAULTS_RANK=sampler`:
only in a sampler process (`agents.<i>.sampler_devices`). The places:

    sampling             after an agent sampled its responses
    scoring              after every agent's responses were scored (one call per step)
    update.micro_batch   after a micro-batch's backward pass
    update.optimizer     after an optimizer step
    checkpoint.agent     after an agent's part of a checkpoint was written
    checkpoint.before_rename / checkpoint.after_rename
    metrics.write        half-way through writing a metrics.jsonl line (the kill leaves a cut-off line)
    weight_sync          after a learner wrote the first tensor of its new weights for its sampler
    start                in a rank or sampler process, once its worker is built, before it says it is ready
    logger.close         before the metrics sinks (metrics.jsonl, TensorBoard) are closed at the run's end
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable

ENOSPC = "ENOSPC"
"""The plan's word for 'raise a full disk's OSError here' instead of a signal."""

_plan: dict[str, tuple[int, signal.Signals | str]] | None = None
_counts: dict[str, int] = {}
_rank: int | str | None = None


def set_rank(rank: int | str) -> None:
    """This process is rank `rank` of a worker group, or `sampler` (for `HACRL_FAULTS_RANK`)."""
    global _rank
    _rank = rank
    reset()


def _load() -> dict[str, tuple[int, signal.Signals | str]]:
    only = os.environ.get("HACRL_FAULTS_RANK")
    if only is not None and str(_rank) != only:
        return {}
    plan = {}
    for item in filter(None, (x.strip() for x in os.environ.get("HACRL_FAULTS", "").split(","))):
        name, _, rest = item.partition(":")
        nth, _, sig = rest.partition(":")
        plan[name] = (int(nth or 1), ENOSPC if sig == ENOSPC else signal.Signals[f"SIG{sig or 'KILL'}"])
    return plan


def hit(name: str, before: Callable[[], None] | None = None) -> None:
    """Pass failpoint `name`; when the plan says so, run `before` (e.g. write half a line) and send the signal."""
    global _plan
    if _plan is None:
        _plan = _load()
    if not _plan or name not in _plan:
        return
    _counts[name] = _counts.get(name, 0) + 1
    nth, sig = _plan[name]
    if _counts[name] == nth:
        if before is not None:
            before()
        if sig == ENOSPC:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"(failpoint {name})")
        os.kill(os.getpid(), sig)


def reset() -> None:
    """Forget the plan and the counts (tests that change HACRL_FAULTS in-process)."""
    global _plan
    _plan = None
    _counts.clear()
