"""Where the agent workers run: `runtime.backend` picks an implementation of `Workers` from this registry.

    local   every worker in the driver's process, called one after the other (the zero-setup default)
    ray     every worker a Ray actor; all agents sample at the same time and all learners learn at the same time

A backend starts one `hacrl.agent.worker.AgentWorker` per agent (an agent on K devices: a group of K
`hacrl.agent.sharded.ShardedWorker` ranks, `ranks.LocalRanks` or K Ray actors, answering as one) and makes the same
typed call on each (`Workers`), returning their results in agent order. Only the messages of `hacrl.messages` and
checkpoint paths cross the boundary. Backends load lazily: the local backend and `hacrl.core` never import Ray.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from hacrl.messages import Completion, GenerateCall, LearnCall, Learned, SampleCall, Sampled

PEER_GRACE_S = 10.0
"""How long a rank's error waits for news of a peer's death before it is raised as itself: a kill -9 of one rank
reaches its peers as a collective's error ('Connection reset by peer') sooner than as the death it is."""

T = TypeVar("T")

BACKENDS = {"local": "hacrl.driver.backends.local:LocalWorkers", "ray": "hacrl.driver.backends.ray:RayWorkers"}


class Workers(Protocol):
    """The agent workers of a run, one per agent, in config order. Each method takes one message per worker (or
    the same argument for all) and returns the results in agent order; `what` says what the call is doing
    (`evaluating at step 3`), for the error message if a worker fails."""

    names: list[str]
    concurrent: bool
    """Whether the workers run a call at the same time (Ray) or one after another (local)."""

    def sample(self, calls: Sequence[SampleCall]) -> list[Sampled]: ...

    def learn(self, calls: Sequence[LearnCall]) -> list[Learned]: ...

    def sample_then_learn(
        self, samples: Sequence[SampleCall], learns: Sequence[LearnCall], between: Callable[[list[Sampled]], T]
    ) -> tuple[list[Sampled], T, list[Learned]]:
        """`trainer.lag` > 0: each worker samples one batch, then learns on an older one, with no barrier between
        its two calls where the workers run concurrently; `between(sampled)` (the driver's scoring of the new batch)
        runs once every agent's sample is in, while the learns run."""
        ...

    def generate(self, calls: Sequence[GenerateCall], *, what: str) -> list[list[Completion]]: ...

    def save(self, directory: str, *, what: str) -> None: ...

    def load(self, directory: str) -> None: ...

    def close(self, *, force: bool = False) -> None:
        """Stop the workers (idempotent); `force`: at once, without waiting for a call they are in."""
        ...


class WorkerGroup:
    """The typed calls of `Workers` over one primitive a backend provides: `_map(method, args, what)` runs
    `worker_i.method(*args[i])` on every worker (concurrently where it can) and returns the results in order."""

    names: list[str]
    concurrent = False

    def _map(self, method: str, args: Sequence[tuple], what: str) -> list[Any]:
        raise NotImplementedError

    def sample(self, calls: Sequence[SampleCall]) -> list[Sampled]:
        return self._map("sample", [(c,) for c in calls], f"sampling at step {calls[0].step}")

    def learn(self, calls: Sequence[LearnCall]) -> list[Learned]:
        return self._map("learn", [(c,) for c in calls], f"learning at step {calls[0].step}")

    def sample_then_learn(
        self, samples: Sequence[SampleCall], learns: Sequence[LearnCall], between: Callable[[list[Sampled]], T]
    ) -> tuple[list[Sampled], T, list[Learned]]:
        """One after another here (the local backend): every sample, then `between` in a thread of the driver (the
        scoring processes work) while the learns run in this one."""
        sampled = self.sample(samples)
        with ThreadPoolExecutor(1, thread_name_prefix="hacrl-between") as pool:
            future = pool.submit(between, sampled)
            try:
                learned = self.learn(learns)
            finally:
                extra = future.result()  # its error first: the learns' own error, if any, is raised after it
        return sampled, extra, learned

    def generate(self, calls: Sequence[GenerateCall], *, what: str) -> list[list[Completion]]:
        return self._map("generate", [(c,) for c in calls], what)

    def save(self, directory: str, *, what: str) -> None:
        self._map("save", [(directory,)] * len(self.names), what)

    def load(self, directory: str) -> None:
        self._map("load", [(directory,)] * len(self.names), "loading its checkpoint part")


def start_workers(runtime, specs: list) -> Workers:
    """Start one worker per spec on `runtime.backend`, placed as each spec's `placement` says."""
    target = BACKENDS.get(runtime.backend)
    if target is None:
        from hacrl.errors import ConfigError

        raise ConfigError(f"runtime.backend={runtime.backend!r} is not one of {sorted(BACKENDS)}")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(runtime, specs)
