"""`runtime.backend: local`: every worker lives in the driver's process and is called in agent order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hacrl.agent.worker import AgentWorker
from hacrl.driver.backends import WorkerGroup
from hacrl.messages import WorkerSpec


class LocalWorkers(WorkerGroup):
    def __init__(self, runtime, specs: list[WorkerSpec], resources: list[dict[str, float]]) -> None:
        self.workers = [AgentWorker(spec) for spec in specs]
        self.names = [w.name for w in self.workers]

    def _map(self, method: str, args: Sequence[tuple], what: str) -> list[Any]:
        return [getattr(worker, method)(*a) for worker, a in zip(self.workers, args, strict=True)]

    def close(self) -> None:
        self.workers = []
