"""`runtime.backend: ray`: every agent worker is a Ray actor; calls go to all of them at once.

- Ray: `runtime.ray.address` unset starts a Ray instance on this machine for the run (and stops it after);
  `auto` or `host:port` joins a running cluster (`ray start --head` ...), which the run leaves running.
- Placement: each actor asks for `agents.<i>.num_cpus` and `agents.<i>.num_gpus` (fractions allowed, so two small
  agents can share a GPU). A request the cluster can never meet fails before any model loads, instead of waiting.
  On a GPU actor Ray sets CUDA_VISIBLE_DEVICES, so the agent's device is `cuda` (its first visible GPU).
- Failures: an error raised by hacrl inside a worker (a model directory that does not load, ...) reaches the user as
  that error; a worker process that dies stops the driver at once with a `WorkerError` naming the agent and what it
  was doing, and the latest checkpoint stays valid (`--resume`); any other exception keeps its remote traceback.
- The run directory must be on a file system every node of the cluster sees (workers write their checkpoint parts
  there).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from typing import Any

from hacrl.agent.worker import AgentWorker
from hacrl.driver.backends import WorkerGroup
from hacrl.errors import ConfigError, WorkerError
from hacrl.messages import WorkerInfo, WorkerSpec


class _Actor:
    """The Ray actor: an empty shell whose `setup` builds the worker, so that construction errors come back as
    ordinary task errors (with their original exception) rather than as a dead actor."""

    def __init__(self) -> None:
        self.worker: AgentWorker | None = None

    def setup(self, spec: WorkerSpec) -> tuple[WorkerInfo, str, str]:
        """Build the worker; its description, the Ray node id and the node's address."""
        import ray

        self.worker = AgentWorker(spec)
        node = ray.get_runtime_context().get_node_id()
        return self.worker.describe(), node, ray.util.get_node_ip_address()

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)

    def pid(self) -> int:
        return os.getpid()


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(
            'runtime.backend=ray needs Ray, which is an optional extra: pip install "hacrl[ray]" (or pip install '
            "ray), or use runtime.backend=local"
        ) from None
    return ray


class RayWorkers(WorkerGroup):
    def __init__(self, runtime, specs: list[WorkerSpec], resources: list[dict[str, float]]) -> None:
        ray = self._ray = _import_ray()
        self.names = [s.agent.name for s in specs]
        self._started_ray = False
        self.actors: list[Any] = []
        if not ray.is_initialized():
            address = runtime.ray.address
            if address is None:
                cpus = max(os.cpu_count() or 1, math.ceil(sum(r["num_cpus"] for r in resources)))
                # address="local": always a new instance, never whatever a stale /tmp/ray file points at
                ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
                self._started_ray = True
            else:
                try:
                    ray.init(address=address, logging_level=logging.WARNING)
                except (ConnectionError, RuntimeError, ValueError) as e:
                    raise ConfigError(
                        f"runtime.ray.address={address!r}: cannot join that Ray cluster ({e}); start it with "
                        "`ray start --head` or leave runtime.ray.address unset to start one for this run"
                    ) from None
        try:
            self._check_capacity(resources)
            actor_class = ray.remote(_Actor)
            for res in resources:
                options = {"num_cpus": res["num_cpus"], "num_gpus": res["num_gpus"], "max_restarts": 0}
                self.actors.append(actor_class.options(**options).remote())
            self.info = self._gather([a.setup.remote(s) for a, s in zip(self.actors, specs, strict=True)], "starting")
            placed = ", ".join(
                f"{w.name} on node {node[:8]} ({address}, pid {w.pid}, {w.device})" for w, node, address in self.info
            )
            print(f"ray: {len(self.info)} workers: {placed}", flush=True)
        except BaseException:
            self.close()
            raise

    def _check_capacity(self, resources: list[dict[str, float]]) -> None:
        total = self._ray.cluster_resources()
        need_cpu = sum(r["num_cpus"] for r in resources)
        need_gpu = sum(r["num_gpus"] for r in resources)
        have_cpu, have_gpu = total.get("CPU", 0.0), total.get("GPU", 0.0)
        if need_cpu > have_cpu + 1e-9 or need_gpu > have_gpu + 1e-9:
            raise ConfigError(
                f"the agents ask Ray for {need_cpu:g} CPUs and {need_gpu:g} GPUs in all, the cluster has "
                f"{have_cpu:g} and {have_gpu:g}: lower agents.<i>.num_cpus / num_gpus (fractions are allowed) or add "
                "nodes"
            )

    def _map(self, method: str, args: Sequence[tuple], what: str) -> list[Any]:
        refs = [actor.call.remote(method, *a) for actor, a in zip(self.actors, args, strict=True)]
        return self._gather(refs, what)

    def _gather(self, refs: list, what: str) -> list[Any]:
        """Results in agent order; the first failure, whichever agent it is, stops the wait at once."""
        ray = self._ray
        results: list[Any] = [None] * len(refs)
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                except ray.exceptions.RayTaskError as e:  # an exception inside the worker: raise it as itself
                    cause = getattr(e, "cause", None)
                    if cause is not None:
                        raise cause from None
                    raise
                except ray.exceptions.RayActorError as e:  # the worker process is gone
                    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    raise WorkerError(
                        f"the worker of agent {self.names[i]!r} died while {what} ({reason}). The latest "
                        "checkpoint is intact: continue with `hacrl train <config> --resume`."
                    ) from None
        return results

    def pids(self) -> list[int]:
        """The actors' process ids (tests kill one to check that the driver stops)."""
        return self._ray.get([a.pid.remote() for a in self.actors])

    def close(self) -> None:
        ray = self._ray
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False
