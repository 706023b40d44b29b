"""`runtime.backend: local`: the learners in the driver's process, a worker group's ranks and a sampler of its own in
processes of this machine (`ranks`). A call to a worker here runs when its value is first needed, after every call
sent before it; before the driver waits on another process it runs every call sent, so a sampler samples meanwhile."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from hacrl.agent.worker import AgentWorker
from hacrl.config.settings import Role
from hacrl.driver.backends.ranks import LocalProcesses, Reply
from hacrl.messages import WorkerSpec


class LocalTransport:
    concurrent = across_machines = False  # `Transport`'s

    def __init__(self, runtime, specs: list[WorkerSpec]) -> None:
        self.names = [spec.agent.name for spec in specs]
        self.learners: list[AgentWorker | LocalProcesses] = []
        self.samplers: list[LocalProcesses | None] = []
        self._queue: deque[_Call] = deque()
        try:
            for spec in specs:
                group, apart = spec.placement.group, spec.placement.sampler_device is not None
                self.learners.append(LocalProcesses(spec, deadlines=runtime.deadline) if group else AgentWorker(spec))
                self.samplers.append(LocalProcesses(spec, sampler=True, deadlines=runtime.deadline) if apart else None)
        except BaseException:
            self.close()
            raise

    def submit(self, agent: int, role: Role, method: str, args: tuple, what: str) -> Reply | _Call:
        target = (role == "sampler" and self.samplers[agent]) or self.learners[agent]
        args = tuple(a.value() if isinstance(a, Reply | _Call) else a for a in args)
        if isinstance(target, LocalProcesses):
            return target.submit(method, args, what)
        call = _Call(self, getattr(target, method), args, what)
        self._queue.append(call)
        return call

    def gather(self, handles: Sequence[Reply | _Call], *, peers: bool = False) -> list[Any]:
        values = []
        try:
            for h in handles:
                if isinstance(h, Reply):  # before waiting on a process, the driver's own work (it works meanwhile)
                    self.run_sent()
                values.append(h.value())
            return values
        except Exception:
            for h in handles if peers else []:  # a peer that died mid-collective is the cause, named ...
                if isinstance(h, Reply) and not h.taken:
                    h.ranks.raise_if_dead(h.what)
                    h.value()  # ... or one that failed on its side, or is silent past its deadline
            raise

    def run_sent(self, until: _Call | None = None) -> None:
        """Run the calls sent to workers in this process, in order (up to `until`)."""
        while self._queue and (until is None or not until.taken):
            self._queue.popleft().run()

    def share(self, value: Any) -> Any:
        return value

    def pids(self) -> list[int]:
        return [p for w in [*self.learners, *self.samplers] if isinstance(w, LocalProcesses) for p in w.pids()]

    def close(self, *, force: bool = False) -> None:
        for worker in [*self.learners, *self.samplers]:
            if isinstance(worker, LocalProcesses):
                worker.close(force=force)
        self.learners, self.samplers, self._queue = [], [], deque()


class _Call:
    """A call to a worker in this process, run in the order sent (`LocalTransport.run_sent`)."""

    def __init__(self, transport: LocalTransport, method: Callable, args: tuple, what: str) -> None:
        self.transport, self.method, self.args, self.what = transport, method, args, what
        self.taken, self.result = False, None

    def run(self) -> None:
        self.result, self.taken = self.method(*self.args), True

    def value(self) -> Any:
        self.transport.run_sent(until=self)
        if not self.taken:  # dropped: an earlier call failed and its error was raised
            raise RuntimeError(f"a call was dropped before it ran ({self.what})")
        return self.result
