"""`runtime.backend: ray`: every process of every agent is a Ray actor; a call starts as it is sent.

- Ray: `runtime.ray.address` unset starts a Ray instance on this machine for the run (and stops it after); `auto` or
  `host:port` joins a running cluster (`ray start --head` ...), which the run leaves running. The run directory must
  be on a file system every node sees (workers write their checkpoint parts there).
- Placement: each actor asks for its agent's `num_cpus` and `num_gpus` (fractions allowed: two small agents can share
  a GPU); a request the cluster can never meet fails before any model loads. On a GPU actor Ray sets
  CUDA_VISIBLE_DEVICES, so the agent's device is `cuda`. An agent on K devices (`agents.<i>.devices`) is K actors in
  a placement group (`runtime.ray.group_strategy`: one node by default), rank 0's node the rendezvous.
- Failures: an error raised inside a worker reaches the user as itself; a process that dies, or is silent past its
  call's deadline, stops the driver at once with a `WorkerError` naming the agent, the rank or the sampler and what
  it was doing; the latest checkpoint stays valid (`--resume`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import signal
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from hacrl.agent.worker import AgentWorker
from hacrl.config.settings import Placement, Role
from hacrl.driver.backends import PEER_GRACE_S
from hacrl.driver.supervision import Deadlines, is_stopped, kind_of, process_state, silent
from hacrl.errors import INTACT, ConfigError, WorkerError
from hacrl.messages import WorkerInfo, WorkerSpec


class _Actor:
    """The Ray actor: an empty shell whose `setup` builds the worker, so that construction errors come back as
    ordinary task errors (with their original exception) rather than as a dead actor."""

    def __init__(self) -> None:
        self.worker: AgentWorker | None = None

    def setup(self, spec: WorkerSpec, info=None, sampler: bool = False) -> tuple[WorkerInfo, str, str]:
        """Build the worker (rank `info` of a worker group when given; `sampler`: the agent's sampler of its own);
        its description, the Ray node id and the node's address."""
        import ray

        self.worker = AgentWorker(spec, rank=info, role="sampler" if sampler else None)
        node = ray.get_runtime_context().get_node_id()
        return self.worker.describe(), node, ray.util.get_node_ip_address()

    def rendezvous(self) -> str:
        """`tcp://<this node's address>:<a free port>`: where a worker group's ranks meet (asked of rank 0)."""
        import ray

        from hacrl.agent.distributed import free_port

        return f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)


class _Sent:
    """One call's references (every rank's of a worker group; rank 0's answer is its value) and their owners:
    (agent, rank, or None for one worker, or "sampler"). Inside a worker (a `Deferred` carried by a call) `value`
    fetches rank 0's answer."""

    def __init__(self, refs: list, owners: list[tuple], what: str, sent: float) -> None:
        self.refs, self.owners, self.what, self.sent = refs, owners, what, sent

    def value(self) -> Any:
        import ray

        return ray.get(self.refs[0])


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(
            'runtime.backend=ray needs Ray, which is an optional extra: pip install "hacrl[ray]" (or pip install '
            "ray), or use runtime.backend=local"
        ) from None
    return ray


def _join_or_start(ray, address: str | None, placements: list[Placement]) -> bool:
    """Join the cluster at `address`, or start one on this machine with room for every process (a worker group's
    ranks and a sampler each ask for their agent's share); whether this run started it. Then check that the cluster
    can ever hold them all, before any model loads."""
    started = False
    if not ray.is_initialized() and address is None:
        cpus = max(os.cpu_count() or 1, math.ceil(sum(p.num_cpus * p.processes for p in placements)))
        # address="local": always a new instance, never whatever a stale /tmp/ray file points at
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
        started = True
    elif not ray.is_initialized():
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ConfigError(
                f"runtime.ray.address={address!r}: cannot join that Ray cluster ({e}); start it with "
                "`ray start --head` or leave runtime.ray.address unset to start one for this run"
            ) from None
    total = ray.cluster_resources()
    need_cpu = sum(p.num_cpus * p.processes for p in placements)
    need_gpu = sum(p.num_gpus * p.processes for p in placements)
    have_cpu, have_gpu = total.get("CPU", 0.0), total.get("GPU", 0.0)
    if need_cpu > have_cpu + 1e-9 or need_gpu > have_gpu + 1e-9:
        if started:
            ray.shutdown()
        raise ConfigError(
            f"the agents ask Ray for {need_cpu:g} CPUs and {need_gpu:g} GPUs in all, the cluster has {have_cpu:g} and "
            f"{have_gpu:g}: lower agents.<i>.num_cpus / num_gpus (fractions are allowed) or add nodes"
        )
    return started


class RayTransport:
    concurrent = True
    across_machines = True

    def __init__(self, runtime, specs: list[WorkerSpec]) -> None:
        ray = self._ray = _import_ray()
        self.names, self.specs = [s.agent.name for s in specs], specs
        self.groups: list[list[Any]] = []
        """Each agent's learner actors, in rank order."""
        self.samplers: list[Any] = [None] * len(specs)
        """Each agent's sampler actor (`agents.<i>.sampler_devices`), or None."""
        self.actors: list[Any] = []
        self.owners: list[tuple] = []
        """Each actor's (agent, rank; None for one worker; "sampler"), in the order of `actors`."""
        self._placement_groups: list[Any] = []
        self._placed: dict[tuple, tuple[Any, int, str]] = {}
        """Each owner's (actor, pid, node id), for a silent actor's kill."""
        self.deadlines = Deadlines(runtime.deadline)
        self._started_ray = _join_or_start(ray, runtime.ray.address, [s.placement for s in specs])
        try:
            setups = []
            for i, spec in enumerate(specs):
                group = self._start_group(i, spec, runtime) if spec.placement.group else None
                if group is None:
                    self.groups.append([self._actor(spec.placement, (i, None))])
                    setups.append(self.groups[i][0].setup.remote(spec))
                setups.extend(group or [])
            for i, spec in enumerate(specs):
                if spec.placement.sampler_device is not None:
                    self.samplers[i] = self._actor(spec.placement, (i, "sampler"))
                    setups.append(self.samplers[i].setup.remote(spec, None, True))
            infos = self._gather(setups, "starting")
            for owner, actor, (info, node, _) in zip(self.owners, self.actors, infos, strict=True):
                self._placed[owner] = (actor, info.pid, node)
            placed = ", ".join(f"{w.name} on node {node[:8]} ({ip}, pid {w.pid}, {w.device})" for w, node, ip in infos)
            print(f"ray: {len(infos)} workers: {placed}", flush=True)
        except BaseException:
            self.close()
            raise

    def _actor(self, placement: Placement, owner: tuple, **options: Any):
        from hacrl.agent.host_memory import ray_options

        options = {**placement.resources(), "max_restarts": 0, **ray_options(self.specs[owner[0]].host_memory),
                   **options}  # fmt: skip
        actor = self._ray.remote(_Actor).options(**options).remote()
        self.actors.append(actor)
        self.owners.append(owner)
        return actor

    def _start_group(self, i: int, spec: WorkerSpec, runtime) -> list:
        """Agent i's K rank actors in a placement group; their setup calls (which meet at rank 0's node)."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from hacrl.agent.distributed import RankInfo

        placement = spec.placement
        k = placement.ranks
        bundle = {"CPU": placement.num_cpus, **({"GPU": placement.num_gpus} if placement.num_gpus else {})}
        group = placement_group([bundle] * k, strategy=runtime.ray.group_strategy)
        self._placement_groups.append(group)
        ready, _ = self._ray.wait([group.ready()], timeout=120)
        if not ready:
            raise ConfigError(
                f"agents.{i} ({spec.agent.name!r}) asks Ray for {k} bundles of {bundle} placed "
                f"{runtime.ray.group_strategy} (runtime.ray.group_strategy), and the cluster cannot place them: "
                "use PACK or SPREAD to allow several nodes, or lower num_cpus / num_gpus"
            )
        strategy = [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=r) for r in range(k)]
        actors = [self._actor(placement, (i, r), scheduling_strategy=strategy[r]) for r in range(k)]
        init = self._ray.get(actors[0].rendezvous.remote())
        device = "cuda" if placement.num_gpus > 0 else "cpu"
        self.groups.append(actors)
        return [a.setup.remote(spec, RankInfo(r, k, init, device)) for r, a in enumerate(actors)]

    def submit(self, agent: int, role: Role, method: str, args: tuple, what: str) -> _Sent:
        if role == "sampler" and self.samplers[agent] is not None:
            actors, owners = [self.samplers[agent]], [(agent, "sampler")]
        else:
            actors, group = self.groups[agent], self.specs[agent].placement.group
            owners = [(agent, r if group else None) for r in range(len(actors))]
        args = tuple(a.refs[0] if isinstance(a, _Sent) else a for a in args)  # Ray resolves it in the actor
        return _Sent([actor.call.remote(method, *args) for actor in actors], owners, what, time.monotonic())

    def gather(self, handles: Sequence[_Sent], *, peers: bool = False) -> list[Any]:
        """Each handle's rank 0 answer; every rank's reply waited for, its deadline counted from when it was sent."""
        if not handles:
            return []
        refs = [ref for h in handles for ref in h.refs]
        owners = [owner for h in handles for owner in h.owners]
        results = self._gather(refs, handles[0].what, owners, since=min(h.sent for h in handles), peers=peers)
        firsts = itertools.accumulate([0, *(len(h.refs) for h in handles[:-1])])
        return [results[j] for j in firsts]

    def share(self, value: Any) -> Any:
        return self._ray.put(value)

    def _gather(self, refs: list, what: str, owners: list | None = None, *, since: float | None = None,
                peers: bool = False) -> list[Any]:  # fmt: skip
        """Results in actor order (`owners`: each ref's (agent, rank or "sampler"); default: every actor's, in
        order); the first failure, whichever actor it is, stops the wait at once, and so does an actor silent past
        its call's deadline (`runtime.deadline`, counted from `since`, when the calls were sent: now by default).
        An error of a worker group's rank, or with `peers` of any role, may be its peer's death (`Transport.gather`)."""
        ray, owners = self._ray, owners if owners is not None else self.owners
        start = time.monotonic() if since is None else since
        keys = [(owner, kind_of(what)) for owner in owners]
        deadlines = [start + self.deadlines.limit(key) for key in keys]
        results: list[Any] = [None] * len(refs)
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            soonest = min(deadlines[index[ref]] for ref in pending)
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, soonest - time.monotonic()))
            if not ready:
                late = [index[ref] for ref in pending if deadlines[index[ref]] <= time.monotonic()]
                if late:
                    self._silent([owners[i] for i in late], what, keys[late[0]][1], time.monotonic() - start)
            for ref in ready:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                    self.deadlines.observe(keys[i], time.monotonic() - start)
                except ray.exceptions.RayTaskError as e:  # an exception inside the worker: raise it as itself
                    self._raise_if_a_peer_died(i, refs, what, owners, peers)
                    cause = getattr(e, "cause", None)
                    if cause is not None:
                        raise cause from None
                    raise
                except ray.exceptions.RayActorError as e:  # the worker process is gone
                    self._raise_died(owners[i], e, what)
        return results

    def _silent(self, late: list[tuple], what: str, kind: str, waited: float) -> NoReturn:
        """Actors silent past their deadline: name one (a stopped one first: its peers wait for it), kill it, raise."""
        placed = [(owner, *self._placed.get(owner, (None, None, None))) for owner in late]
        owner, actor, pid, node = min(placed, key=lambda p: not (self._here(p[3]) and is_stopped(p[2])))
        state = process_state(pid) if self._here(node) else ""
        rule = self.deadlines.rule((owner, kind))
        if pid is not None and self._here(node):
            with contextlib.suppress(OSError):  # Ray's own kill asks the process, which a stopped one never hears
                os.kill(pid, signal.SIGKILL)
        if actor is not None:
            with contextlib.suppress(Exception):  # already gone
                self._ray.kill(actor)
        raise silent(self._who(owner), pid, what, waited, rule, state=state)

    def _here(self, node: str | None) -> bool:
        """Whether Ray node `node` is this process's own (its processes are ours to look at and signal)."""
        return node is not None and node == self._ray.get_runtime_context().get_node_id()

    def _who(self, owner: tuple) -> str:
        agent, rank = owner
        role = "" if rank is None else f" (rank {rank})" if isinstance(rank, int) else f" ({rank})"
        return f"the worker of agent {self.names[agent]!r}{role}"

    def _raise_died(self, owner: tuple, error: Exception, what: str) -> NoReturn:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        who = self._who(owner)
        raise WorkerError(f"{who} died while {what} ({reason}). {INTACT}.") from None

    def _raise_if_a_peer_died(self, i: int, refs: list, what: str, owners: list, any_role: bool) -> None:
        """A rank's error may be its peer's death seen through the collective (gloo: 'Connection reset by peer',
        NCCL: a timeout): give the other ranks of its group (`any_role`: its agent's other processes) a grace to
        answer, and report a death as the cause."""
        agent, rank = owners[i]
        if not (any_role or isinstance(rank, int)):
            return
        peers = [r for j, r in enumerate(refs)
                 if j != i and owners[j][0] == agent and (any_role or isinstance(owners[j][1], int))]  # fmt: skip
        ready, _ = self._ray.wait(peers, num_returns=len(peers), timeout=PEER_GRACE_S)
        for ref in ready:
            try:
                self._ray.get(ref)
            except self._ray.exceptions.RayActorError as e:
                self._raise_died(owners[refs.index(ref)], e, what)
            except Exception:  # noqa: BLE001 - the peer's own error: the first one is raised
                pass

    def pids(self) -> list[int]:
        """The actors' process ids, in the order of `actors` (tests kill one to check that the driver stops)."""
        return [self._placed[owner][1] for owner in self.owners]

    def close(self, *, force: bool = False) -> None:
        """Kill every actor (Ray's kill does not wait for a call in progress, so `force` changes nothing here)."""
        ray = self._ray
        for actor in self.actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(actor)
        for group in self._placement_groups:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(group)
        self.actors, self._placement_groups = [], []
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False
