"""The weights a learner hands to its sampler process (`agents.<i>.sampler_devices`, `trainer.lag` >= 1).

One machine (`runtime.backend: local`): two slots of host shared memory, each with every parameter of the agent's
sampling module in its compute dtype and a version stamp. After update t the learner writes slot t % 2 (`publish`);
the sampler, before sampling a batch that the schedule assigns to the weights after update v, reads slot v % 2
(`take`). A LoRA agent hands over its adapters only (`Agent.handed_over`). The pipeline's schedule keeps the two
apart: in step t the learner writes version t while the sampler reads version t - 1 (or none).

Ray (`HandedWeights`): the learner keeps a host copy of its weights after each update; the driver passes its object
reference to the sampler's actor (Ray moves it, across nodes too), which holds it until the batch that needs it.

A sampler never samples with half-written weights: `publish` clears the slot's stamp before it writes and stamps it
after the last tensor; `take` refuses a slot whose stamp is not the version it needs, and checks the stamp again
after reading (a writer that came in meanwhile would have cleared it). A learner that dies mid-sync stops the run;
the sampler of the resumed run loads the checkpoint's weights.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from hacrl import faults
from hacrl.errors import ConfigError, WorkerError, first_line

SLOTS = 2

Weights = torch.nn.Module | Mapping[str, torch.Tensor]
"""What is handed over: a module's parameters, or named tensors (`Agent.handed_over`: a LoRA agent's adapters)."""


def _named(weights: Weights) -> Mapping[str, torch.Tensor]:
    return dict(weights.named_parameters()) if isinstance(weights, torch.nn.Module) else weights


class WeightChannel:
    """Shared-memory slots for one agent's sampling weights (picklable to a spawned process: the tensors are shared,
    not copied)."""

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

    def publish(self, model: Weights, version: int) -> float:
        """Write `model`'s parameters as the weights after update `version`; the seconds it took."""
        start, slot = time.perf_counter(), version % SLOTS
        self.stamps[slot] = -1
        with torch.no_grad():
            for i, (n, p) in enumerate(_named(model).items()):
                self.slots[slot][n].copy_(p.detach())
                if i == 0:
                    faults.hit("weight_sync")  # a learner killed here leaves the slot unstamped
        self.stamps[slot] = version
        return time.perf_counter() - start

    def take(self, model: Weights, version: int) -> float:
        """Load the weights after update `version` into `model`; the seconds it took. A WorkerError when the slot
        does not hold them whole (never sample with half-updated weights)."""
        start, slot = time.perf_counter(), version % SLOTS
        self._check(slot, version)
        with torch.no_grad():
            for n, p in _named(model).items():
                p.copy_(self.slots[slot][n])
        self._check(slot, version)
        return time.perf_counter() - start

    def _check(self, slot: int, version: int) -> None:
        stamp = int(self.stamps[slot])
        if stamp != version:
            _refuse(self.name, version, "no complete weights" if stamp < 0 else f"those after update {stamp}")


class HandedWeights:
    """The same two ends for Ray: `publish` keeps a host copy (the learner's actor hands it over, `hand_over`);
    the sampler's actor `receive`s it and `take` loads it into the model when the batch that needs it comes."""

    def __init__(self, model: Weights | None, name: str) -> None:
        self.name = name
        self.held: tuple[int, dict[str, torch.Tensor]] | None = None

    def publish(self, model: Weights, version: int) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            state = {n: p.detach().to("cpu", copy=True) for n, p in _named(model).items()}
        faults.hit("weight_sync")
        self.held = (version, state)
        return time.perf_counter() - start

    def hand_over(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        held, self.held = self.held, None
        return held

    def receive(self, held: tuple[int, dict[str, torch.Tensor]] | None) -> None:
        if held is not None:
            self.held = held

    def take(self, model: Weights, version: int) -> float:
        start = time.perf_counter()
        if self.held is None or self.held[0] != version:
            _refuse(self.name, version, "nothing" if self.held is None else f"those after update {self.held[0]}")
        with torch.no_grad():
            for n, p in _named(model).items():
                p.copy_(self.held[1][n])
        return time.perf_counter() - start


class BroadcastWeights:
    """A torch.distributed broadcast from the learner (rank 0) to its sampler (rank 1) in a group of their own (NCCL
    between GPUs, gloo otherwise; `agents.<i>.weight_sync: broadcast`). A broadcast needs both ends at once, so it
    is not sent from inside the update: `publish` only notes the version, and the backend runs `send` on the learner
    and `recv` on the sampler together at the end of the step, when both are idle (one step later than the
    sampler needs it at the soonest, so nothing waits). The group is joined at the first transfer, in each process.

    A transfer that fails halfway leaves the sampler's version unset: it refuses to sample until a later transfer
    completes (a run stops at the failure anyway, and the sampler of the resumed run loads the checkpoint)."""

    def __init__(self, model: Weights | None, name: str, *, init: str, backend: str, timeout_s: float = 300.0) -> None:
        self.init, self.name, self.backend, self.timeout_s = init, name, backend, timeout_s
        self.group = None
        self.pending: int | None = None
        """Learner: the version `publish` noted, sent at the next `send`."""
        self.received: int | None = None
        """Sampler: the version its weights hold after the last complete `recv` (None: mid-transfer)."""

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

    def publish(self, model: Weights, version: int) -> float:
        self.pending = version
        return 0.0

    def send(self, model: Weights, version: int) -> float:
        """Learner: the weights after update `version` to the sampler (which runs `recv` meanwhile)."""
        if self.pending != version:
            raise RuntimeError(f"agent {self.name!r}: no weights after update {version} to send ({self.pending} noted)")
        start = time.perf_counter()
        self._join(0)
        with torch.no_grad():
            self._broadcast([p.detach() for p in _named(model).values()])
        self.pending = None
        return time.perf_counter() - start

    def recv(self, model: Weights, version: int) -> float:
        """Sampler: the weights after update `version` into `model`, straight from the learner."""
        start, self.received = time.perf_counter(), None
        self._join(1)
        with torch.no_grad():
            self._broadcast([p.data for p in _named(model).values()])
        self.received = version
        return time.perf_counter() - start

    def take(self, model: Weights, version: int) -> float:
        """Sampler, before a batch: its weights are those after update `version` (received), or it refuses."""
        if self.received != version:
            _refuse(self.name, version, "nothing whole" if self.received is None else f"those after update "
                    f"{self.received}")  # fmt: skip
        return 0.0

    def hand_over(self) -> None:
        """Nothing travels through Ray's object store (see `send`)."""

    def receive(self, held: None) -> None:
        """Nothing comes that way either (`HandedWeights.receive`'s place on Ray)."""


class WeightsPublisher:
    """A learner's side of the link to its sampler of its own (`AgentWorker` is one): `self.channel` set by
    `open_weight_channel`, written after each update (`publish_weights`), sent by a broadcast (`send_weights`)."""

    channel = None
    agent: Any
    name: str

    def open_weight_channel(self, kind: type = WeightChannel, options: dict | None = None):
        """The channel through which a sampler of its own gets its weights after each update: shared memory on one
        machine (`WeightChannel`), handed over on Ray (`HandedWeights`), or a broadcast (`BroadcastWeights`)."""
        self.channel = kind(self.agent.handed_over(), self.name, **(options or {}))
        return self.channel

    def publish_weights(self, step: int) -> dict[str, float]:
        """After update `step`: its weights to its sampler of its own (if any); the seconds as a metric."""
        channel = self.channel
        return {} if channel is None else {"time/weight_sync": channel.publish(self.agent.handed_over(), step)}

    def send_weights(self, step: int) -> float:
        """A broadcast channel's transfer of the weights after update `step` (its sampler receives meanwhile)."""
        return self.channel.send(self.agent.handed_over(), step) if self.channel is not None else 0.0


def _refuse(name: str, version: int, held: str) -> None:
    raise WorkerError(
        f"the sampler of agent {name!r} needs the weights after update {version}, and it holds {held} (a weight sync "
        "that failed halfway?): it does not sample with them. The latest checkpoint is intact: continue with "
        "`hacrl train <config> --resume`."
    )
