"""The torch.distributed mechanics of an agent on K devices (`agents.<i>.devices`): its process group, FSDP2
sharding, the training forward through the sharded root, the gathered compute copy, and the sharded optimizer state.

Choices (torchtitan's and verl's, on torch's own FSDP2, `torch.distributed.fsdp.fully_shard`):
1. `fully_shard` on every decoder layer (the classes the model names in `_no_split_modules`), then on the root.
   The parameters are float32 shards (the masters); `MixedPrecisionPolicy(param_dtype=<agent dtype>,
   reduce_dtype=float32)` gathers them in the compute dtype for forward and backward and reduces gradients in
   float32. `offload: optimizer` adds `CPUOffloadPolicy` on GPUs: the shards and AdamW's state live on the host and
   the optimizer step runs there.
2. Gradients are reduced by **sum**, not FSDP's default mean (`set_gradient_divide_factor(1)` with sum-only
   collectives): each rank's loss is its rows' share of the mini-batch loss, already divided by the mini-batch's
   global counts, so the sum over ranks is the one-device gradient.
3. The training forward runs inside the root module's call (`root_logprobs`): the root's FSDP hooks gather the
   embeddings, final norm and output layer, and the chunked log-softmax of `hacrl.agent.logprobs` runs unchanged.
4. Sampling and old log-probs read a plain (unsharded) compute-dtype copy of the model on each rank, refreshed
   from the shards once per update (`gather_into`), never per token: the samplers and their CUDA graphs work on it
   as on any model.
5. The optimizer state is saved and loaded by parameter name (`optimizer_tensors`), so a checkpoint written by
   K ranks loads on K' ranks or on one device (resharded by torch.distributed.checkpoint), and one written on one
   device loads on K ranks.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn

from hacrl.agent.logprobs import TokenBatch, token_logprobs
from hacrl.errors import CheckpointError, first_line


def free_port() -> int:
    """A TCP port that was free on this machine a moment ago (the rendezvous of a new process group)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class RankInfo:
    """Where one rank of a worker group runs and how it finds the others."""

    rank: int
    world: int
    init_method: str
    """The process group's rendezvous, `tcp://host:port` (rank 0's address)."""
    device: str
    """This rank's torch device (`cpu`, `cuda:2`; `cuda` under Ray, which sets the visible GPU)."""


def init_group(info: RankInfo, *, timeout_s: float = 1800.0) -> None:
    """Join the agent's process group: NCCL for GPU tensors and gloo for host tensors on GPUs (with CPU offload the
    gradient norm is reduced over host shards), gloo on CPU."""
    import torch.distributed as dist

    device = torch.device(info.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo",
        init_method=info.init_method,
        rank=info.rank,
        world_size=info.world,
        timeout=timedelta(seconds=timeout_s),
    )


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the modules of the classes it names in `_no_split_modules` (as transformers'
    and accelerate's automatic wrapping read them)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        from hacrl.errors import ModelError

        raise ModelError(
            f"{type(model).__name__} names no decoder layer class (`_no_split_modules`), so it cannot be sharded "
            "layer by layer; train it on one device (agents.<i>.device)"
        )
    return layers


def shard(model: nn.Module, compute_dtype: torch.dtype, *, offload: bool) -> None:
    """`fully_shard` each decoder layer, then the root, over all ranks of the process group (choices 1 and 2)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mixed = MixedPrecisionPolicy(
        param_dtype=None if compute_dtype == torch.float32 else compute_dtype, reduce_dtype=torch.float32
    )
    where = CPUOffloadPolicy() if offload and device.type == "cuda" else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mixed, offload_policy=where)
    fully_shard(model, mesh=mesh, mp_policy=mixed, offload_policy=where)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


class _Unhooked:
    """The sharded root as `token_logprobs` reads it, except that calling it runs the model's own forward without
    the module's hooks again (we are already inside its call)."""

    def __init__(self, model: nn.Module) -> None:
        self._model = model

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def __call__(self, **kwargs):
        return type(self._model).forward(self._model, **kwargs)


def root_logprobs(model: nn.Module, batch: TokenBatch, temperature: float, *, chunk_size) -> torch.Tensor:
    """`token_logprobs` of the sharded `model`, computed inside the root module's call (choice 3)."""

    def forward(*args, **kwargs):
        return token_logprobs(_Unhooked(model), batch, temperature, chunk_size=chunk_size, fused=False)

    model.forward = forward  # an instance attribute: the root's FSDP hooks run around it
    try:
        return model()
    finally:
        del model.forward


def full(parameter: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A parameter's whole value (an all-gather of a sharded one, through `device` when it is offloaded)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(parameter, DTensor):
        return parameter.detach()
    local = parameter.to_local().detach()
    if local.device != device:
        local = local.to(device)
        parameter = DTensor.from_local(
            local, parameter.device_mesh, parameter.placements, shape=parameter.shape, stride=parameter.stride()
        )
    return parameter.detach().full_tensor()


@torch.no_grad()
def gather_into(sharded: nn.Module, copy: nn.Module, device: torch.device) -> None:
    """Each parameter of the plain `copy` := the sharded model's (rounded to the copy's dtype): one all-gather per
    parameter, in the same order on every rank."""
    targets = dict(copy.named_parameters())
    for name, parameter in sharded.named_parameters():
        targets[name].copy_(full(parameter, device))


def full_state_dict(sharded: nn.Module, copy: nn.Module, device: torch.device, *, keep: bool) -> dict | None:
    """The model's state dict with every parameter whole and float32 (the masters), on the host, for a Hugging Face
    save: `keep` on the rank that writes it, None elsewhere (every rank takes part in the gathers)."""
    gathered: dict[int, torch.Tensor] = {}
    for parameter in sharded.parameters():
        value = full(parameter, device)
        if keep:
            gathered[id(parameter)] = value.to("cpu")
    if not keep:
        return None
    state = copy.state_dict()
    by_name = dict(sharded.named_parameters(remove_duplicate=False))
    for name in list(state):
        if name in by_name:
            state[name] = gathered[id(by_name[name])]
    return state


# -- optimizer state by parameter name --------------------------------------------------------------------------------


def optimizer_tensors(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], names: list[str]) -> dict:
    """AdamW's state as {"<parameter name>/<key>": tensor} (`params[i]` is named `names[i]`; a sharded parameter's
    moments are sharded tensors)."""
    out = {}
    for name, p in zip(names, params, strict=True):
        for key, value in optimizer.state.get(p, {}).items():
            if isinstance(value, torch.Tensor):
                out[f"{name}/{key}"] = value
    return out


def load_optimizer_tensors(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor], names: list[str], directory: Path
) -> None:
    """Fill `optimizer`'s state from the sharded checkpoint `directory` (written by `optimizer_tensors` on any
    number of ranks), resharded to `params`' layout (sharded or whole)."""
    import torch.distributed.checkpoint as dcp

    from hacrl.checkpoint import read_sharded_metadata

    saved = read_sharded_metadata(directory).state_dict_metadata
    template: dict[str, torch.Tensor] = {}
    for name, p in zip(names, params, strict=True):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            meta = saved.get(f"{name}/{key}")
            if meta is None:
                continue
            if tuple(meta.size) == tuple(p.shape):
                template[f"{name}/{key}"] = torch.zeros_like(p, dtype=meta.properties.dtype)
            else:  # the step count (a scalar on the host, as AdamW keeps it)
                template[f"{name}/{key}"] = torch.zeros(tuple(meta.size), dtype=meta.properties.dtype)
    missing = sorted(k for k in saved if k not in template)
    if missing:
        raise KeyError(f"the checkpoint holds optimizer state for parameters this model lacks: {missing[:3]}")
    with warnings.catch_warnings():  # one process (a single-device agent) reads a group's shards: intended
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            dcp.load(template, storage_reader=_safe_reader(directory), planner=_tensors_only_planner())
        except BaseException as e:  # CheckpointException derives from BaseException: one clear error naming the file
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            cause = next(iter(getattr(e, "failures", {}).values()), (e, None))[0]  # the rank's own error
            if isinstance(cause, CheckpointError):
                raise CheckpointError(f"{directory}: {cause}") from None
            raise CheckpointError(
                f"{directory}: the sharded optimizer state cannot be read ({type(cause).__name__}: "
                f"{first_line(cause, 300)}); resume from another checkpoint (checkpoint.resume=<its directory>)"
            ) from None
    for name, p in zip(names, params, strict=True):
        keys = [k for k in ("step", "exp_avg", "exp_avg_sq") if f"{name}/{k}" in template]
        state = {k: template[f"{name}/{k}"] for k in keys}
        if state:
            optimizer.state[p] = state


def save_optimizer_tensors(tensors: dict, directory: Path) -> None:
    """Each rank writes its part of `tensors` under `directory` (torch.distributed.checkpoint). A rank's failure
    comes back as that rank's own exception (torch wraps it in a CheckpointException, which derives from
    BaseException and so passed every `except Exception`: a full disk there was a traceback, exit 1)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.save(tensors, checkpoint_id=str(directory))
    except CheckpointException as e:
        causes = [failure[0] if isinstance(failure, tuple) else failure for failure in e.failures.values()]
        cause = next((c for c in causes if isinstance(c, OSError)), causes[0] if causes else None)
        if isinstance(cause, BaseException) and not isinstance(cause, CheckpointException):
            raise cause from None
        raise RuntimeError(f"the sharded optimizer state could not be written: {first_line(e, 300)}") from None


def load_full_optimizer(optimizer, params: list[torch.Tensor], state_file: Path, device) -> None:
    """A one-device checkpoint's AdamW state (`optimizer/<name>.pt`, keyed by parameter position) into the
    sharded parameters `params`: each rank keeps its shard of every whole moment."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    saved = torch.load(state_file, weights_only=True, map_location="cpu")["state"]
    for i, p in enumerate(params):
        if i not in saved:
            continue
        state = {}
        for key, value in saved[i].items():
            if isinstance(p, DTensor) and value.shape == p.shape:
                value = distribute_tensor(value.to(device), p.device_mesh, p.placements, src_data_rank=None)
                if p.to_local().device != value.to_local().device:
                    value = DTensor.from_local(value.to_local().to(p.to_local().device), p.device_mesh, p.placements,
                                               shape=p.shape, stride=p.stride())  # fmt: skip
            state[key] = value
        optimizer.state[p] = state


def _tensors_only_planner():
    """torch's default load planner, except that a bytes record is refused: its default hands the bytes to
    `torch.load(weights_only=False)`, which runs whatever they name (`read_sharded_metadata` admits no bytes
    records; this is the second lock)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class TensorsOnly(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            raise CheckpointError(f"{read_item.dest_index.fqn!r} is stored as bytes: an optimizer checkpoint holds "
                                  "tensors only, and hacrl never unpickles bytes from a file")  # fmt: skip

    return TensorsOnly()


def _safe_reader(directory: Path):
    """torch.distributed.checkpoint's file reader, with the metadata read by `read_sharded_metadata`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    from hacrl.checkpoint import read_sharded_metadata

    class Reader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = read_sharded_metadata(self.path)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return Reader(str(directory))
