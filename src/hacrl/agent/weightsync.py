"""The weights a learner hands to its sampler of its own after each update (`agents.<i>.sampler_devices`,
`trainer.lag` >= 1): one protocol, `WeightLink`, with one pair of verbs, `send` on the learner and `receive` on the
sampler, and three kinds (`Placement.weight_link` and where the roles run pick one,
`WeightsPublisher.open_weight_link`):

    SharedMemoryLink   one machine (`runtime.backend: local`, `weight_sync: host`): two slots of host shared memory,
                       each every parameter of the agent's sampling module in its compute dtype with a version stamp.
                       The learner sends inside its update (slot t % 2 after update t); the sampler receives the
                       version a batch needs just before it samples it.
    HandedLink         Ray (`weight_sync: host`): at the step's end the learner's `send` returns a host copy, which
                       Ray moves (across nodes too) to the sampler's `receive`, never through the driver.
    BroadcastLink      `weight_sync: broadcast`: a torch.distributed broadcast from the learner to its sampler in a
                       group of their own (NCCL between GPUs, gloo otherwise), both ends at the step's end.

A link whose ends `meet` is run by the schedule (`hacrl.driver.trainer.Schedule`) at the end of each step, once the
learner's update and the sampler's batch are done; the other kind works inside the two roles' own calls. A LoRA
agent hands over its adapters only (`Agent.handed_over`). A sampler never samples with half-written weights: the
shared slots are stamped after the last tensor and checked before and after the read, and a sampler whose last
transfer failed holds no version and refuses to sample (`refuse`). A learner that dies mid-transfer stops the run;
the sampler of the resumed run loads the checkpoint's weights.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

import torch

from hacrl import faults
from hacrl.errors import ConfigError, WorkerError, first_line

SLOTS = 2

Weights = torch.nn.Module | Mapping[str, torch.Tensor]
"""What is handed over: a module's parameters, or named tensors (`Agent.handed_over`: a LoRA agent's adapters)."""


def _named(weights: Weights) -> Mapping[str, torch.Tensor]:
    return dict(weights.named_parameters()) if isinstance(weights, torch.nn.Module) else weights


class WeightLink(Protocol):
    """The learner's weights after update `version` to its sampler: `send` at the learner's end (what it returns is
    carried to `receive` as `sent`: Ray's host copy; None for the others), `receive` at the sampler's, into its
    model. `meets`: both ends run together at the step's end (the schedule calls them), else each inside its own
    role's calls (the learner's update, the sampler's batch). Picklable: the learner opens it, the sampler gets it."""

    name: str
    meets: ClassVar[bool]

    def send(self, weights: Weights, version: int) -> Any: ...

    def receive(self, weights: Weights, version: int, sent: Any = None) -> None: ...


class SharedMemoryLink:
    """Shared-memory slots for one agent's sampling weights (picklable to a spawned process: the tensors are shared,
    not copied)."""

    meets = False

    def __init__(self, model: Weights, name: str) -> None:
        self.name = name
        self.shapes = {n: (tuple(p.shape), p.dtype) for n, p in _named(model).items()}
        try:
            self.slots = [
                {n: torch.empty(shape, dtype=dtype).share_memory_() for n, (shape, dtype) in self.shapes.items()}
                for _ in range(SLOTS)
            ]
        except RuntimeError as e:  # /dev/shm full (a container's default is 64 MB)
            need = SLOTS * sum(torch.Size(s).numel() * d.itemsize for s, d in self.shapes.values())
            raise ConfigError(
                f"agent {name!r}: its sampler of its own needs {need / 2**30:.2f} GiB of shared memory for two copies "
                f"of its weights, and this machine refused it ({first_line(e)}): give the container more /dev/shm "
                "(docker run --shm-size), or remove agents.<i>.sampler_devices"
            ) from None
        self.stamps = torch.full((SLOTS,), -1, dtype=torch.int64).share_memory_()

    def send(self, weights: Weights, version: int) -> None:
        """Write `weights` as those after update `version` (slot version % 2, stamped after the last tensor)."""
        slot = version % SLOTS
        self.stamps[slot] = -1
        with torch.no_grad():
            for i, (n, p) in enumerate(_named(weights).items()):
                self.slots[slot][n].copy_(p.detach())
                if i == 0:
                    faults.hit("weight_sync")  # a learner killed here leaves the slot unstamped
        self.stamps[slot] = version

    def receive(self, weights: Weights, version: int, sent: None = None) -> None:
        """Load the weights after update `version` into `weights`; a WorkerError when the slot does not hold them
        whole (never sample with half-updated weights)."""
        slot = version % SLOTS
        self._check(slot, version)
        with torch.no_grad():
            for n, p in _named(weights).items():
                p.copy_(self.slots[slot][n])
        self._check(slot, version)

    def _check(self, slot: int, version: int) -> None:
        stamp = int(self.stamps[slot])
        if stamp != version:
            refuse(self.name, version, None if stamp < 0 else stamp)


class HandedLink:
    """Ray's: `send` returns a host copy of the weights (the learner's actor answers with it, Ray keeps it in its
    object store), which the sampler's actor `receive`s."""

    meets = True

    def __init__(self, model: Weights | None, name: str) -> None:
        self.name = name

    def send(self, weights: Weights, version: int) -> tuple[int, dict[str, torch.Tensor]]:
        with torch.no_grad():
            state = {n: p.detach().to("cpu", copy=True) for n, p in _named(weights).items()}
        faults.hit("weight_sync")
        return version, state

    def receive(self, weights: Weights, version: int, sent: tuple[int, dict[str, torch.Tensor]] | None = None) -> None:
        if sent is None or sent[0] != version:
            raise RuntimeError(f"agent {self.name!r}: the weights after update {version} were not sent")
        with torch.no_grad():
            for n, p in _named(weights).items():
                p.copy_(sent[1][n])


class BroadcastLink:
    """A torch.distributed broadcast from the learner (rank 0) to its sampler (rank 1) in a group of their own (NCCL
    between GPUs, gloo otherwise; `agents.<i>.weight_sync: broadcast`). A broadcast needs both ends at once: the
    schedule runs `send` and `receive` together at the end of the step, when both are idle (one step before the
    sampler needs the weights, so nothing waits). The group's rendezvous is a free port of the learner's machine,
    chosen where the learner opens the link; each process joins at its first transfer."""

    meets = True

    def __init__(self, model: Weights | None, name: str, *, backend: str, init: str | None = None,
                 timeout_s: float = 300.0) -> None:  # fmt: skip
        from hacrl.agent.distributed import free_port

        self.init = init or f"tcp://{_this_host()}:{free_port()}"
        self.name, self.backend, self.timeout_s = name, backend, timeout_s
        self.group = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "group": None}  # each process joins the group itself

    def _join(self, rank: int) -> None:
        if self.group is not None:
            return
        import datetime

        import torch.distributed as dist

        host, port = self.init.removeprefix("tcp://").rsplit(":", 1)
        timeout = datetime.timedelta(seconds=self.timeout_s)
        store = dist.TCPStore(host, int(port), 2, rank == 0, timeout=timeout)
        kind = dist.ProcessGroupNCCL if self.backend == "nccl" else dist.ProcessGroupGloo
        self.group = kind(store, rank, 2, timeout) if kind is dist.ProcessGroupGloo else kind(store, rank, 2)

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        for i, t in enumerate(tensors):
            self.group.broadcast([t], options).wait()
            if i == 0:
                faults.hit("weight_sync")

    def send(self, weights: Weights, version: int) -> None:
        """Learner: the weights after update `version` to the sampler (which runs `receive` meanwhile)."""
        self._join(0)
        with torch.no_grad():
            self._broadcast([p.detach() for p in _named(weights).values()])

    def receive(self, weights: Weights, version: int, sent: None = None) -> None:
        """Sampler: the weights after update `version` into `weights`, straight from the learner."""
        self._join(1)
        with torch.no_grad():
            self._broadcast([p.data for p in _named(weights).values()])


def _this_host() -> str:
    """This process's address for a rendezvous: its Ray node's in a Ray worker, else the loopback."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    return "127.0.0.1"


class WeightsPublisher:
    """A learner's end of the link to its sampler of its own (`AgentWorker` is one): `self.link`, opened by
    `open_weight_link`; sent inside each update (`publish_weights`) or when the schedule asks (`send_weights`)."""

    link: WeightLink | None = None
    agent: Any
    name: str
    spec: Any

    def open_weight_link(self, across_machines: bool) -> WeightLink:
        """The link through which a sampler of its own gets its weights after each update (the sampler is given
        it: `AgentWorker.attach_weight_link`), of the kind its placement names (`Placement.weight_link`):
        "broadcast" -> `BroadcastLink`; "host" -> `SharedMemoryLink` on one machine, `HandedLink` where its sampler
        may be on another (`across_machines`: Ray)."""
        placement = self.spec.placement
        if placement.weight_link == "broadcast":
            self.link = BroadcastLink(None, self.name, backend=placement.link_backend)
        else:
            self.link = (HandedLink if across_machines else SharedMemoryLink)(self.agent.handed_over(), self.name)
        return self.link

    def publish_weights(self, step: int) -> dict[str, float]:
        """After update `step`, inside it: its weights to its sampler of its own over a link whose ends work alone;
        the seconds as a metric (0 for a link the schedule runs at the step's end)."""
        link = self.link
        if link is None:
            return {}
        start = time.perf_counter()
        if not link.meets:
            link.send(self.agent.handed_over(), step)
        return {"time/weight_sync": time.perf_counter() - start}

    def send_weights(self, step: int) -> Any:
        """The learner's end of a meeting link's transfer of the weights after update `step`."""
        return self.link.send(self.agent.handed_over(), step) if self.link is not None else None


def refuse(name: str, version: int, held: int | None) -> None:
    """A sampler's refusal to sample with weights other than those after update `version` (`held`: the update whose
    weights it holds; None: nothing whole, a transfer failed halfway)."""
    what = "no complete weights" if held is None else f"those after update {held}"
    raise WorkerError(
        f"the sampler of agent {name!r} needs the weights after update {version}, and it holds {what} (a weight sync "
        "that failed halfway?): it does not sample with them. The latest checkpoint is intact: continue with "
        "`hacrl train <config> --resume`."
    )
