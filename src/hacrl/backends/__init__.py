"""Where the agent workers run: `runtime.backend` picks an implementation of `Workers` from this registry.

    local   every worker in the driver's process, called one after the other (the zero-setup default)
    ray     every worker a Ray actor; all agents sample at the same time and all learners learn at the same time

A backend starts one `hacrl.worker.AgentWorker` per agent and calls the same methods on each (`call`), returning
their results in agent order. Only `WorkerSpec`s, prompts, trajectories, metrics and checkpoint paths cross the
boundary. Backends load lazily: the local backend and `hacrl.core` never import Ray.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

BACKENDS = {"local": "hacrl.backends.local:LocalWorkers", "ray": "hacrl.backends.ray:RayWorkers"}


class Workers(Protocol):
    """The agent workers of a run, one per agent, in config order."""

    names: list[str]

    def call(self, method: str, args: Sequence[tuple], *, what: str) -> list[Any]:
        """`worker_i.method(*args[i])` for every worker (concurrently where the backend can), results in order.
        `what` says what the call is doing (`sampling at step 3`), for the error message if a worker fails."""
        ...

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        ...


def start_workers(runtime, specs: list, resources: list[dict[str, float]]) -> Workers:
    """Start one worker per spec on `runtime.backend`; `resources[i]`: {"num_cpus", "num_gpus"} of agent i."""
    target = BACKENDS.get(runtime.backend)
    if target is None:
        from hacrl.errors import ConfigError

        raise ConfigError(f"runtime.backend={runtime.backend!r} is not one of {sorted(BACKENDS)}")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(runtime, specs, resources)
