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


def _refuse(name: str, version: int, held: str) -> None:
    raise WorkerError(
        f"the sampler of agent {name!r} needs the weights after update {version}, and it holds {held} (a weight sync "
        "that failed halfway?): it does not sample with them. The latest checkpoint is intact: continue with "
        "`hacrl train <config> --resume`."
    )
