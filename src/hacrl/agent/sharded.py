"""One rank of an agent's worker group: the agent on K devices (`agents.<i>.devices`), FSDP2 over a
torch.distributed process group (mechanics: `hacrl.agent.distributed`).

A group answers the driver's typed calls exactly as one `AgentWorker` does (the backend sends each call to every
rank and returns rank 0's answer):

    sample    rank r samples its share of the prompts (contiguous, in order) from its own stream
              (`seeds.rank`), computes their old log-probs on its compute copy, and the ranks exchange their shares:
              every rank then holds the whole step's rollout in the order one worker would have sampled it, and
              rank 0 returns all trajectories in that order.
    learn     every rank builds the same pool and advantages (cheap, on the host); each mini-batch's rows are
              split across the ranks (contiguous); every loss is divided by the mini-batch's global counts, the
              gradients are summed across ranks, so the update is the one-device update up to float summation
              order. Ranks with fewer rows run zero-weight micro-batches, so that every rank runs the same
              collectives. The metrics of every rank's micro-batches are reduced on rank 0 in rank order.
    generate  the evaluation prompts are split the same way; rank r > 0 of a sampled evaluation draws from
              `seeds.rank(call.seed, r)`.
    save/load rank 0 writes the Hugging Face directory (the gathered float32 masters), every rank its shard of the
              optimizer state (torch.distributed.checkpoint) and its random stream (`hacrl.checkpoint`).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from hacrl import faults, seeds
from hacrl.agent.distributed import (
    RankInfo,
    full_state_dict,
    init_group,
    load_full_optimizer,
    load_optimizer_tensors,
    optimizer_tensors,
    root_logprobs,
    save_optimizer_tensors,
)
from hacrl.agent.logprobs import TokenBatch
from hacrl.agent.weightsync import WeightChannel
from hacrl.agent.worker import AgentWorker, OwnSamples
from hacrl.checkpoint import agent_part, read_rng, write_rng
from hacrl.core.metrics import MetricReducer
from hacrl.errors import CheckpointError, NonFiniteError, first_line
from hacrl.messages import Completion, GenerateCall, LearnCall, Learned, SampleCall, Sampled, WorkerInfo, WorkerSpec


def rank_share(count: int, rank: int, world: int) -> range:
    """Rank `rank`'s contiguous share of `count` items (sizes differ by at most one; earlier ranks the larger)."""
    return range(rank * count // world, (rank + 1) * count // world)


class ShardedWorker(AgentWorker):
    def __init__(self, spec: WorkerSpec, info: RankInfo) -> None:
        self.info = info
        self.rank, self.world = info.rank, info.world
        init_group(info)  # before the agent: it shards its model over the group (`Precision.trains == "shards"`)
        super().__init__(spec, device=info.device)

    def stream_seed(self) -> int:
        return seeds.rank(super().stream_seed(), self.rank)

    def training_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        chunk = self.spec.trainer.logprob_chunk_size
        return root_logprobs(self.agent.model, batch, self.agent.settings.temperature, chunk_size=chunk)

    def describe(self) -> WorkerInfo:
        info = super().describe()
        return replace(info, device=f"{info.device} (rank {self.rank} of {self.world})")

    # -- the calls ---------------------------------------------------------------------------------------------------

    def sample(self, call: SampleCall) -> Sampled:
        began = time.time()
        self.agent.sync_sampling_weights()  # up to date since `learn`: nothing to gather here
        mine, generate_s, logprobs_s = self._sample_share(call, rank_share(len(call.prompts), self.rank, self.world))
        parts: list = [None] * self.world
        dist.all_gather_object(parts, mine)  # every rank: the whole step's rollout, in one worker's order
        rollout = OwnSamples.joined(call.step, parts)
        return self._sampled(rollout, generate_s, logprobs_s, began)

    def learn(self, call: LearnCall) -> Learned:
        learned = super().learn(call)
        self.agent.sync_sampling_weights()  # a gather: on every rank here, once per update, never inside `generate`
        return learned

    def publish_weights(self, step: int) -> dict[str, float]:
        """The gathered compute copy after update `step` (the gather is a collective: every rank, before rank 0
        writes it for the sampler of its own)."""
        self.agent.sync_sampling_weights()
        return super().publish_weights(step)

    def open_weight_channel(self, kind: type = WeightChannel, options: dict | None = None) -> WeightChannel | None:
        """Rank 0 writes the group's weights for its sampler (the whole compute copy every rank gathers); the other
        ranks hold none."""
        return super().open_weight_channel(kind, options) if self.rank == 0 else None

    def adopt_stream(self, rng: dict | list[dict]) -> None:
        """A group's sampler draws each rank's share from that rank's stream: rank r takes the r-th."""
        super().adopt_stream(rng[self.rank] if isinstance(rng, list) else rng)

    def generate(self, call: GenerateCall) -> list[Completion]:
        share = rank_share(len(call.prompts), self.rank, self.world)
        seed = None if call.seed is None else seeds.rank(call.seed, self.rank)
        mine = super().generate(replace(call, prompts=[call.prompts[i] for i in share], seed=seed)) if share else []
        parts: list = [None] * self.world
        dist.all_gather_object(parts, mine)
        return [c for part in parts for c in part]

    def save(self, directory: str) -> None:
        agent, root = self.agent, Path(directory)
        part = agent_part(root, self.name)
        finite = torch.tensor(
            [all(bool(torch.isfinite(_local(p)).all()) for p in agent.model.parameters())], dtype=torch.int32
        )
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        if not bool(finite.item()):
            raise NonFiniteError(
                f"agent {self.name!r}: its weights hold NaN or inf after {self.optimizer_steps} optimizer steps, so no "
                f"checkpoint is written from them; the newest checkpoint in the run directory is the last good state. "
                f"Lower agents.{self.index}.lr or agents.{self.index}.grad_clip and resume from it."
            )
        try:
            state = full_state_dict(agent.model, agent.sampling_model, agent.device, keep=self.rank == 0)
            if self.rank == 0:
                agent.sampling_model.save_pretrained(part.weights_dir, safe_serialization=True, state_dict=state)
                agent.tokenizer.save_pretrained(part.weights_dir)
            names = [n for n, _ in agent.model.named_parameters()]
            tensors = optimizer_tensors(agent.optimizer, agent.optimizer.params, names)
            save_optimizer_tensors(tensors, part.optimizer_dir)
            write_rng(part.rank_rng_file(self.rank), self._rng, self.optimizer_steps)
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001 - as AgentWorker.save
            raise CheckpointError(
                f"could not write rank {self.rank} of agent {self.name!r}'s part of a checkpoint into {str(root)!r}: "
                f"{type(e).__name__}: {first_line(e, 300)}. The previous checkpoint is intact; free disk space or fix "
                "the directory's permissions, then continue with `hacrl train <config> --resume`."
            ) from e
        dist.barrier()  # the group's part is whole when rank 0 answers
        faults.hit("checkpoint.agent")

    def load(self, directory: str) -> None:
        """Optimizer shards and this rank's random stream; a checkpoint of another K (or of one device) loads
        resharded, and a rank it has no stream for keeps its fresh one (not bit-exact: said at resume)."""
        part = agent_part(directory, self.name)
        agent = self.agent
        names = [n for n, _ in agent.model.named_parameters()]
        try:
            if part.optimizer_dir.is_dir():
                load_optimizer_tensors(agent.optimizer, agent.optimizer.params, names, part.optimizer_dir)
            else:
                load_full_optimizer(agent.optimizer, agent.optimizer.params, part.optimizer_file, agent.device)
        except Exception as e:  # noqa: BLE001 - named, with what to do
            raise CheckpointError(
                f"{part.optimizer_dir if part.optimizer_dir.is_dir() else part.optimizer_file}: cannot load the "
                f"optimizer state of agent {self.name!r} on rank {self.rank} ({type(e).__name__}: {first_line(e)}); "
                "resume from an earlier checkpoint (checkpoint.resume=<its directory>)"
            ) from e
        _, self.optimizer_steps = read_rng(part.rng_file, f"agent {self.name!r}")  # rank 0's count is the group's
        rng_file = part.rank_rng_file(self.rank)
        if rng_file.is_file():
            self._rng, _ = read_rng(rng_file, f"agent {self.name!r}, rank {self.rank}")

    # -- the update --------------------------------------------------------------------------------------------------

    def accumulate(self, rows, adv, mini: list[int], capabilities, m: int, reducer: MetricReducer) -> None:
        num_own = sum(rows[i].source == self.index for i in mini)
        size = self.spec.trainer.micro_batch_size
        mine = [mini[i] for i in rank_share(len(mini), self.rank, self.world)]
        micro_batches = math.ceil(math.ceil(len(mini) / self.world) / size)  # the same on every rank
        collected = []
        for j in range(micro_batches):
            micro = mine[j * size : (j + 1) * size]
            if not micro:  # this rank's rows ran out: a zero-weight pass keeps the collectives in step
                self._idle_backward()
                continue
            metrics = self._micro_backward(rows, adv, micro, capabilities, m, len(mini), num_own)
            collected.append({k: v.detach().cpu() for k, v in metrics.items()})
        gathered: list | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(collected, gathered, dst=0)
        if gathered is not None:
            for metrics in (m for part in gathered for m in part):
                reducer.add(metrics)

    def _idle_backward(self) -> None:
        agent = self.agent
        batch = TokenBatch.build([[agent.eos_id]], [[agent.eos_id]], agent.pad_id, agent.device)
        (self.training_logprobs(batch).sum() * 0.0).backward()


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p
