"""Where an agent's roles run, and how a call reaches one: `runtime.backend` picks a transport from this registry.

    local   the learners in the driver's process, their calls run when gathered, in the order they were sent; a
            worker group's ranks and a sampler of its own in processes of this machine (`ranks.LocalProcesses`)
    ray     every process a Ray actor, each call started as it is sent

A transport starts each agent's processes as its `Placement` says (a learner: one worker, or a worker group of K
ranks that answer as one, rank 0 replying; a sampler of its own: one more process) and carries one kind of thing:
`submit(agent, role, method, args, what)` sends a role's call and returns a `Handle` at once, `gather(handles)` waits
for their values. It knows nothing of steps, lag, proximal passes or weight links: the schedule
(`hacrl.driver.trainer.Schedule`) decides which call goes to which role, and when. Only the messages of
`hacrl.messages` and checkpoint paths cross. Backends load lazily: the local backend and `hacrl.core` never import Ray.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

from hacrl.config.settings import Role

PEER_GRACE_S = 10.0
"""How long a rank's error waits for news of a peer's death before it is raised as itself: a kill -9 of one rank
reaches its peers as a collective's error ('Connection reset by peer') sooner than as the death it is."""

BACKENDS = {"local": "hacrl.driver.backends.local:LocalTransport", "ray": "hacrl.driver.backends.ray:RayTransport"}


class Handle(Protocol):
    """A call sent to a role (`Transport.submit`); `value()` waits for its reply (rank 0's, for a worker group)."""

    what: str
    """What the call is doing (`sampling at step 3`), for the error message if it fails."""

    def value(self) -> Any: ...


class Transport(Protocol):
    """The processes of a run's agents, in config order, and the one way to call them."""

    names: list[str]
    concurrent: bool
    """Whether the agents' calls run at the same time (Ray) or one after another in the driver (local)."""
    across_machines: bool
    """Whether an agent's two roles may run on different machines (Ray): its weights then travel by value."""

    def submit(self, agent: int, role: Role, method: str, args: tuple, what: str) -> Handle:
        """Send `method(*args)` to agent `agent`'s `role` (every rank of a worker group; an agent without a sampler
        of its own samples on its learner). A handle among `args` reaches the worker as its value."""
        ...

    def gather(self, handles: Sequence[Handle], *, peers: bool = False) -> list[Any]:
        """The handles' values, in order. The first error, death, or silence past its call's deadline
        (`runtime.deadline`) stops the wait and is raised, naming the agent and what it was doing. `peers`: the calls
        meet in a collective, so one's error may be the other's death, which is then the error raised."""
        ...

    def share(self, value: Any) -> Any:
        """`value` as one argument of many calls (Ray: one object in its store, each call carries a reference)."""
        ...

    def pids(self) -> list[int]:
        """The process ids of the agents' ranks, samplers and actors (tests kill one)."""
        ...

    def close(self, *, force: bool = False) -> None:
        """Stop every process (idempotent); `force`: at once, without waiting for a call they are in."""
        ...


def start_transport(runtime, specs: list) -> Transport:
    """Start each spec's processes on `runtime.backend`, placed as its `placement` says."""
    target = BACKENDS.get(runtime.backend)
    if target is None:
        from hacrl.errors import ConfigError

        raise ConfigError(f"runtime.backend={runtime.backend!r} is not one of {sorted(BACKENDS)}")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(runtime, specs)


def host_workers_here(runtime) -> None:
    """This process is about to host workers (`runtime.backend: local`: the learners run in the driver's process):
    its allocator setting, `runtime.host_memory`, before it allocates a tensor (torch reads its huge-page setting at
    its first allocation: `hacrl.agent.host_memory.apply`). Elsewhere each worker's process sets its own."""
    if runtime.backend == "local":
        from hacrl.agent import host_memory

        host_memory.apply(runtime.host_memory)
