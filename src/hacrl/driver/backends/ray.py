"""`runtime.backend: ray`: every agent worker is a Ray actor; calls go to all of them at once.

- Ray: `runtime.ray.address` unset starts a Ray instance on this machine for the run (and stops it after);
  `auto` or `host:port` joins a running cluster (`ray start --head` ...), which the run leaves running.
- Placement: each actor asks for `agents.<i>.num_cpus` and `agents.<i>.num_gpus` (fractions allowed, so two small
  agents can share a GPU). A request the cluster can never meet fails before any model loads, instead of waiting.
  On a GPU actor Ray sets CUDA_VISIBLE_DEVICES, so the agent's device is `cuda` (its first visible GPU).
- Failures: an error raised by hacrl inside a worker (a model directory that does not load, ...) reaches the user as
  that error; a worker process that dies stops the driver at once with a `WorkerError` naming the agent and what it
  was doing, and the latest checkpoint stays valid (`--resume`); any other exception keeps its remote traceback.
- An agent on K >= 2 devices (`agents.<i>.devices`) is K actors in a placement group of K bundles of its
  `num_cpus` / `num_gpus` (`runtime.ray.group_strategy`: one node by default), each a rank
  (`hacrl.agent.sharded.ShardedWorker`); rank 0's node and a free port of it are the process group's rendezvous.
  Calls go to every rank; rank 0 answers. A rank that dies stops the run naming the agent and the rank.
- The run directory must be on a file system every node of the cluster sees (workers write their checkpoint parts
  there).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NoReturn

from hacrl.agent.worker import AgentWorker
from hacrl.config.settings import Placement
from hacrl.core.sharing import foreign_of, in_pool_order
from hacrl.driver.backends import PEER_GRACE_S, WorkerGroup
from hacrl.driver.supervision import Deadlines, is_stopped, kind_of, process_state, silent
from hacrl.errors import INTACT, ConfigError, WorkerError
from hacrl.messages import LearnCall, Trajectory, WorkerInfo, WorkerSpec


class _Actor:
    """The Ray actor: an empty shell whose `setup` builds the worker, so that construction errors come back as
    ordinary task errors (with their original exception) rather than as a dead actor."""

    def __init__(self) -> None:
        self.worker: AgentWorker | None = None

    def setup(self, spec: WorkerSpec, info=None, role: str = "worker", broadcast=None) -> tuple[WorkerInfo, str, str]:
        """Build the worker (rank `info` of a worker group when given; `role` "sampler": the agent's sampler of its
        own, "learner": a worker whose sampler is another actor; `broadcast`: a sampler's `BroadcastWeights` options);
        its description, the Ray node id and the node's address."""
        import ray

        from hacrl.agent.weightsync import BroadcastWeights, HandedWeights

        if role == "sampler":
            from hacrl.agent.sampler_worker import SamplerWorker

            name = spec.agent.name
            channel = BroadcastWeights(None, name, **broadcast) if broadcast else HandedWeights(None, name)
            self.worker = SamplerWorker(spec, channel)
        elif info is None:
            self.worker = AgentWorker(spec)
        else:
            from hacrl.agent.sharded import ShardedWorker

            self.worker = ShardedWorker(spec, info)
        if role == "learner":
            self.worker.open_weight_channel(HandedWeights)
        node = ray.get_runtime_context().get_node_id()
        return self.worker.describe(), node, ray.util.get_node_ip_address()

    def hand_over(self):
        """A learner's weights after its last update (`HandedWeights`), for its sampler's actor."""
        return self.worker.channel.hand_over()

    def receive(self, held) -> None:
        """A sampler's: the weights its learner handed over (Ray resolved the reference)."""
        self.worker.channel.receive(held)

    def rendezvous(self) -> str:
        """`tcp://<this node's address>:<a free port>`: where a worker group's ranks meet (asked of rank 0)."""
        import ray

        from hacrl.driver.backends.ranks import free_port

        return f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)

    def learn(self, call: LearnCall, pool: list[Trajectory] | None) -> Any:
        """`learn` with the step's pool sent once for every learner (`RayWorkers._submit_learns`): this learner's
        foreign answers are every other agent's, in pool order (`foreign_of`, as the driver gives them)."""
        if pool is not None:
            call = replace(call, foreign=foreign_of(pool, self.worker.index))
        if call.proximal is not None:  # a reference to what its sampler computes: fetched when the update needs it
            import ray

            ref = call.proximal
            call = replace(call, proximal=lambda: ray.get(ref))
        return self.worker.learn(call)

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


def _learner_role(spec: WorkerSpec) -> str:
    """An actor's role in `_Actor.setup`: "learner" when the agent has a sampler of its own, else "worker"."""
    return "learner" if spec.placement.sampler_device is not None else "worker"


class RayWorkers(WorkerGroup):
    concurrent = True

    def __init__(self, runtime, specs: list[WorkerSpec]) -> None:
        ray = self._ray = _import_ray()
        self.names = [s.agent.name for s in specs]
        self.specs = specs
        self._started_ray = False
        self.actors: list[Any] = []
        self.groups = []
        self.owners = []
        self.samplers: list[Any] = [None] * len(specs)
        """Each agent's sampler actor (`agents.<i>.sampler_devices`), or None."""
        self._handed: list[Any] = [None] * len(specs)
        """Each learner's weights after its last update (an object reference), for its sampler's next batch."""
        self._placement_groups: list[Any] = []
        self.deadlines = Deadlines(runtime.deadline)
        self._placed: dict[tuple, tuple[Any, int, str]] = {}
        """(agent, rank / None / "sampler") -> (its actor, its pid, its node id), for a silent actor's kill."""
        placements = [s.placement for s in specs]
        if not ray.is_initialized():
            address = runtime.ray.address
            if address is None:  # room for every actor: a worker group's ranks and a sampler each ask their agent's
                asked = sum(p.num_cpus * p.processes for p in placements)
                cpus = max(os.cpu_count() or 1, math.ceil(asked))
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
            self._check_capacity(placements)
            self.groups: list[list[Any]] = []  # each agent's actors, rank order
            self.owners: list[tuple[int, int | None]] = []  # (agent, rank) of each actor in self.actors
            setups = []
            for i, spec in enumerate(specs):
                if not spec.agent.devices:
                    actor = self._actor(spec.placement)
                    self.groups.append([actor])
                    self.actors.append(actor)
                    self.owners.append((i, None))
                    setups.append(actor.setup.remote(spec, None, _learner_role(spec)))
                else:
                    setups.extend(self._start_group(i, spec, runtime))
            infos = self._gather(setups, "starting")
            self.info = [infos[j] for j, (_, rank) in enumerate(self.owners) if not rank]
            self._note_placed(self.owners, self.actors, infos)
            infos += self._start_samplers(specs)
            placed = ", ".join(
                f"{w.name} on node {node[:8]} ({address}, pid {w.pid}, {w.device})" for w, node, address in infos
            )
            print(f"ray: {len(infos)} workers: {placed}", flush=True)
        except BaseException:
            self.close()
            raise

    def _start_samplers(self, specs: list[WorkerSpec]) -> list:
        """The samplers of their own (`agents.<i>.sampler_devices`), each an actor with its agent's resources."""
        setups, owners = [], []
        for i, spec in enumerate(specs):
            if spec.placement.sampler_device is not None:
                self.samplers[i] = actor = self._actor(spec.placement)
                self.actors.append(actor)
                setups.append(actor.setup.remote(spec, None, "sampler", self._broadcast_channel(i, spec)))
                owners.append((i, "sampler"))
        if not setups:
            return []
        infos = self._gather(setups, "starting", owners)
        self._note_placed(owners, [self.samplers[i] for i, _ in owners], infos)
        return infos

    def _note_placed(self, owners: list[tuple], actors: list, infos: list) -> None:
        """Where each started actor runs (its pid and node), for a silent one's kill."""
        for owner, actor, (info, node, _) in zip(owners, actors, infos, strict=True):
            self._placed[owner] = (actor, info.pid, node)

    def _broadcast_channel(self, i: int, spec: WorkerSpec) -> dict | None:
        """Where agent i's learner (rank 0) and sampler meet for its weight broadcast (`agents.<i>.weight_sync`),
        with the learner's channel opened; None: the weights go through the object store."""
        placement = spec.placement
        if not placement.broadcasts:
            return None
        from hacrl.agent.weightsync import BroadcastWeights

        learner = self.groups[i][0]
        options = {"init": self._ray.get(learner.rendezvous.remote()), "backend": placement.link_backend}
        owner = [(i, 0 if len(self.groups[i]) > 1 else None)]
        self._gather([learner.call.remote("open_weight_channel", BroadcastWeights, options)], "starting", owner)
        return options

    def _actor(self, placement: Placement, **options: Any):
        options = {**placement.resources(), "max_restarts": 0, **options}
        return self._ray.remote(_Actor).options(**options).remote()

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
        actors = [
            self._actor(
                placement, scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=r)
            )
            for r in range(k)
        ]
        init = self._ray.get(actors[0].rendezvous.remote())
        device = "cuda" if placement.num_gpus > 0 else "cpu"
        self.groups.append(actors)
        self.actors.extend(actors)
        self.owners.extend((i, r) for r in range(k))
        return [a.setup.remote(spec, RankInfo(r, k, init, device), _learner_role(spec)) for r, a in enumerate(actors)]

    def _check_capacity(self, placements: list[Placement]) -> None:
        total = self._ray.cluster_resources()
        need_cpu = sum(p.num_cpus * p.processes for p in placements)
        need_gpu = sum(p.num_gpus * p.processes for p in placements)
        have_cpu, have_gpu = total.get("CPU", 0.0), total.get("GPU", 0.0)
        if need_cpu > have_cpu + 1e-9 or need_gpu > have_gpu + 1e-9:
            raise ConfigError(
                f"the agents ask Ray for {need_cpu:g} CPUs and {need_gpu:g} GPUs in all, the cluster has "
                f"{have_cpu:g} and {have_gpu:g}: lower agents.<i>.num_cpus / num_gpus (fractions are allowed) or add "
                "nodes"
            )

    def _map(self, method: str, args: Sequence[tuple], what: str) -> list[Any]:
        """Each agent's call on all of its actors (every rank of a group); each agent's answer is its rank 0's."""
        refs, first = self._submit(method, args)
        results = self._gather(refs, what)
        return [results[j] for j in first]

    def _submit(self, method: str, args: Sequence[tuple]) -> tuple[list, list[int]]:
        """The calls' refs, in actor order, and where each agent's rank 0 is among them."""
        refs, first = [], []
        for actors, a in zip(self.groups, args, strict=True):
            first.append(len(refs))
            refs.extend(actor.call.remote(method, *a) for actor in actors)
        return refs, first

    def sample(self, calls):
        if not any(self.samplers):
            return super().sample(calls)
        refs, owners, first = self._submit_samples(calls)
        results = self._gather(refs, f"sampling at step {calls[0].step}", owners)
        return [results[j] for j in first]

    def learn(self, calls):
        refs, first = self._submit_learns(calls)
        results = self._gather(refs, f"learning at step {calls[0].step}")
        return [results[j] for j in first]

    def _submit_learns(self, calls) -> tuple[list, list[int]]:
        """The learn calls, the step's pool put into the object store once: each learner's call carries a reference
        to it instead of its own copy of every other agent's answers (N copies of the pool, one per learner, would
        grow as N^2). A learner with no foreign answers (frozen, or no sharing) gets its call as it is."""
        union: dict[int, Trajectory] = {}
        for call in calls:
            union.update((id(t), t) for t in call.foreign)
        if not union:
            return self._submit("learn", [(c,) for c in calls])
        pool = self._ray.put(in_pool_order(union.values()))
        refs, first = [], []
        for actors, call in zip(self.groups, calls, strict=True):
            first.append(len(refs))
            shared = (replace(call, foreign=[]), pool) if call.foreign else (call, None)
            refs.extend(actor.learn.remote(*shared) for actor in actors)
        return refs, first

    def _submit_samples(self, calls, learns=None) -> tuple[list, list, list[int]]:
        """Each agent's sample call: on its sampler's actor (after the weights its learner handed over last, and
        with `learns` its learner's proximal pass, `_proximal_ref`), or on every actor of its worker; the refs, their
        owners and where each agent's answer is among them."""
        refs, owners, first = [], [], []
        for i, call in enumerate(calls):
            first.append(len(refs))
            sampler = self.samplers[i]
            if sampler is None:
                start = sum(len(g) for g in self.groups[:i])
                refs.extend(a.call.remote("sample", call) for a in self.groups[i])
                owners.extend(self.owners[start : start + len(self.groups[i])])
                continue
            if self._handed[i] is not None:
                sampler.receive.remote(self._handed[i])  # an actor runs its calls in order: before the sample
                self._handed[i] = None
            if learns is not None:
                learns[i] = self._proximal_ref(i, learns[i])
            refs.append(sampler.call.remote("sample", call))
            owners.append((i, "sampler"))
        return refs, owners, first

    def _proximal_ref(self, i: int, call: LearnCall) -> LearnCall:
        """Learner i's call with a reference to the proximal log-probs its sampler computes first (the learner takes
        them after its first optimizer step, `SamplerWorker.proximal`); as it was for a worker group, a frozen agent,
        or an update of one mini-batch."""
        spec, sampler = self.specs[i], self.samplers[i]
        first = spec.trainer.mini_batch_size
        if len(self.groups[i]) != 1 or spec.agent.frozen or call.rollout is None:
            return call
        if len(call.rollout.response_ids) <= first:
            return call
        return replace(call, proximal=sampler.call.remote("proximal", call.step, call.rollout, first))

    def sample_then_learn(self, samples, learns, between):
        """Every actor gets both calls at once (an actor runs its calls in order): an agent learns as soon as it has
        sampled, whatever the others do; `between` runs on the driver once every sample is in. An agent with a
        sampler actor samples there while its learner learns; the learner's new weights (an object reference) go
        to the sampler before its next batch."""
        learns = list(learns)
        since = time.monotonic()
        sample_refs, owners, first = self._submit_samples(samples, learns)
        learn_refs, learn_first = self._submit_learns(learns)
        for i, sampler in enumerate(self.samplers):
            if sampler is not None and not self.specs[i].placement.broadcasts:
                self._handed[i] = self.groups[i][0].hand_over.remote()
        results = self._gather(sample_refs, f"sampling at step {samples[0].step}", owners)
        sampled = [results[j] for j in first]
        extra = between(sampled)
        results = self._gather(learn_refs, f"learning at step {learns[0].step}", since=since)
        self._broadcast_weights(learns)
        return sampled, extra, [results[j] for j in learn_first]

    def _broadcast_weights(self, learns) -> None:
        """Each broadcast channel's transfer of the weights after this step's update (`BroadcastWeights`): the
        sampler's actor receives while its learner's rank 0 sends, both idle now."""
        refs, owners = [], []
        for i, (sampler, call) in enumerate(zip(self.samplers, learns, strict=True)):
            spec = self.specs[i]
            if sampler is None or spec.agent.frozen or not spec.placement.broadcasts:
                continue
            learner = self.groups[i][0]
            refs += [sampler.call.remote("recv_weights", call.step), learner.call.remote("send_weights", call.step)]
            owners += [(i, "sampler"), (i, 0 if len(self.groups[i]) > 1 else None)]
        if refs:
            self._gather(refs, f"handing over the weights after update {learns[0].step}", owners)

    def save(self, directory: str, *, what: str) -> None:
        """A sampler's stream goes into its learner's part (as the agent's) before the save."""
        for i, sampler in enumerate(self.samplers):
            if sampler is not None:
                stream = self._gather([sampler.call.remote("stream")], what, [(i, "sampler")])[0]
                ranks = self.groups[i]  # a worker group's ranks each take their own (`ShardedWorker.adopt_stream`)
                owners = [(i, r if len(ranks) > 1 else None) for r in range(len(ranks))]
                self._gather([a.call.remote("adopt_stream", stream) for a in ranks], what, owners)
        super().save(directory, what=what)

    def load(self, directory: str) -> None:
        super().load(directory)
        refs = [(i, s.call.remote("load", directory)) for i, s in enumerate(self.samplers) if s is not None]
        if refs:
            self._gather([r for _, r in refs], "loading its checkpoint part", [(i, "sampler") for i, _ in refs])

    def _gather(self, refs: list, what: str, owners: list | None = None, *, since: float | None = None) -> list[Any]:
        """Results in actor order (`owners`: each ref's (agent, rank or "sampler"); default: every actor's, in
        order); the first failure, whichever actor it is, stops the wait at once, and so does an actor silent past
        its call's deadline (`runtime.deadline`, counted from `since`, when the calls were sent: now by default)."""
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
                    self._raise_if_a_peer_died(i, refs, what, owners)
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
            try:
                os.kill(pid, signal.SIGKILL)  # Ray's own kill asks the process, which a stopped one never hears
            except OSError:
                pass
        if actor is not None:
            try:
                self._ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
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

    def _raise_if_a_peer_died(self, i: int, refs: list, what: str, owners: list) -> None:
        """A rank's error may be its peer's death seen through the collective (gloo: 'Connection reset by peer',
        NCCL: a timeout): give the other ranks of its group a grace to answer, and report a death as the cause."""
        agent, rank = owners[i]
        if not isinstance(rank, int):
            return
        peers = [r for j, r in enumerate(refs) if j != i and owners[j][0] == agent and isinstance(owners[j][1], int)]
        ready, _ = self._ray.wait(peers, num_returns=len(peers), timeout=PEER_GRACE_S)
        for ref in ready:
            try:
                self._ray.get(ref)
            except self._ray.exceptions.RayActorError as e:
                self._raise_died(owners[refs.index(ref)], e, what)
            except Exception:  # noqa: BLE001 - the peer's own error: the first one is raised
                pass

    def pids(self) -> list[int]:
        """The actors' process ids (tests kill one to check that the driver stops)."""
        return self._ray.get([a.pid.remote() for a in self.actors])

    def close(self, *, force: bool = False) -> None:
        """Kill every actor (Ray's kill does not wait for a call in progress, so `force` changes nothing here)."""
        ray = self._ray
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
        for group in self._placement_groups:
            try:
                ray.util.remove_placement_group(group)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._placement_groups = []
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False
