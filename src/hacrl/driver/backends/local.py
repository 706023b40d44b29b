"""`runtime.backend: local`: every worker lives in the driver's process and is called in agent order; an agent on
its own devices (`agents.<i>.devices`) is a group of K local processes (`hacrl.driver.backends.ranks`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hacrl.agent.worker import AgentWorker
from hacrl.driver.backends import WorkerGroup
from hacrl.driver.backends.ranks import LocalRanks
from hacrl.messages import WorkerSpec


class LocalWorkers(WorkerGroup):
    def __init__(self, runtime, specs: list[WorkerSpec], resources: list[dict[str, float]]) -> None:
        self.workers: list[Any] = []
        self.names = [spec.agent.name for spec in specs]
        try:
            for spec in specs:
                self.workers.append(LocalRanks(spec) if spec.agent.devices else AgentWorker(spec))
        except BaseException:
            self.close()
            raise

    def _map(self, method: str, args: Sequence[tuple], what: str) -> list[Any]:
        return [
            worker.call(method, a, what) if isinstance(worker, LocalRanks) else getattr(worker, method)(*a)
            for worker, a in zip(self.workers, args, strict=True)
        ]

    def close(self) -> None:
        for worker in self.workers:
            if isinstance(worker, LocalRanks):
                worker.close()
        self.workers = []
