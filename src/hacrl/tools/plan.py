"""`hacrl plan CONFIG`: where each agent's device memory goes, before anything runs.

Per agent, from its model directory's config.json alone (the parameter count from a model built on torch's meta
device: no weights are read), in bytes:

- weights in the agent's dtype (and the frozen reference copy when `algorithm.kl_coef > 0`), and what training
  adds: float32 master weights, float32 gradient accumulators and float32 AdamW moments for a bfloat16 agent with
  masters (`hacrl.agent.precision`: 4 + 4 + 8 bytes per parameter beside its 2), the gradients and two AdamW moments in
  the parameters' own dtype otherwise (float32 for LoRA adapters): exact. With `offload: optimizer` the masters and
  AdamW's state are counted in host memory (`host`), with the float32 gradients the step copies there;
- the KV pool of the `static` sampler (rows x (prompt limit + max_new_tokens) positions x 2 x layers x key/value
  heads x head dim x dtype), with `rollout.batch_size: auto` resolved as the sampler resolves it on the device
  (`hacrl.agent.samplers.static.auto_rows`), and the sampling step's floats (rows x vocabulary x 16 bytes): exact;
- the update's activations for one micro-batch of `trainer.micro_batch_size` rows x (prompt limit +
  max_new_tokens) tokens, with and without gradient checkpointing, and the log-prob head (`trainer.
  logprob_chunk_size`'s rule: the chunk's float32 logits, their softmax and gradient, or the full logits):
  estimates. The activation formula is fitted to what autograd saves for the backward pass (measured with
  saved-tensor hooks on Llama, Qwen2 and Qwen3 models; tests/tools/test_plan.py checks it within 20 %): per token
  and layer 6 h + 6 q + 5 kv + 4 ffn elements (+ 2 q + 2 kv with per-head query/key norms) plus the attention mask's
  row (sequence length elements), where h is the hidden size, q = heads x head dim, kv = key/value heads x head
  dim; with gradient checkpointing, h + 128 elements per token and layer are kept, and one layer's full set exists
  while it is recomputed.

An agent on K >= 2 devices (`agents.<i>.devices`, FSDP2) is planned per rank: the gathered compute-dtype copy that
samples (whole on every rank), 1/K of the float32 master shards, float32 gradient shards and AdamW state (on the host
with `offload: optimizer`), and, during the update, the compute-dtype parameters FSDP2 gathers at a time (the
root's embeddings and output layer, and two decoder layers with prefetch: an estimate). Each rank samples and learns
its share, but holds rows per call and a micro-batch as one worker does. `render_ranks` gives each agent's peak per
rank for K = 1..8.

The peak is the larger of sampling (weights, masters and optimizer state on the device, pool, sampling floats;
gradients are freed after each update) and the update (the same, plus gradients, the micro-batch's activations and
the log-prob head). Agents on one device take turns, one phase at a time, each holding its weights, device-resident
state and pool throughout: an agent's peak adds the others' resident bytes. A device's total
memory comes from CUDA when present, else `--device-memory GIB`; without either the plan shows the needs only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from hacrl.config import TrainConfig
from hacrl.config.settings import AgentSettings, Placement, Precision, Role
from hacrl.errors import ModelError
from hacrl.model_dirs import require_model_dir

GIB = 2**30
CHECKPOINTED_EXTRA = 128
"""Elements per token and layer kept beside the hidden state with gradient checkpointing (measured)."""


@dataclass
class Shape:
    """What memory depends on in a model's config."""

    params: int
    trainable: int
    """Parameters that train (all of them; a LoRA agent's adapters only, kept in float32 by peft)."""
    dtype_bytes: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    qk_norm: bool

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def activation_elements(self, tokens_per_row: int, *, padded: bool = True) -> int:
        """Saved for the backward pass, per token and layer, without gradient checkpointing; `padded`: rows of
        different lengths, whose attention mask (a row of `tokens_per_row` per token) each layer keeps."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per = 6 * self.hidden + 6 * q + 5 * kv + 4 * self.ffn + (2 * q + 2 * kv if self.qk_norm else 0)
        return per + (tokens_per_row if padded else 0)


@dataclass
class AgentPlan:
    name: str
    device: str
    shape: Shape
    parts: dict[str, int] = field(default_factory=dict)
    """Bytes of each part (see the module docstring)."""
    rows: int | None = None
    """Rows per generation call (resolved `auto`)."""
    sampling_peak: int = 0
    update_peak: int = 0
    update_peak_checkpointed: int = 0
    checkpointing: bool = False
    device_total: int | None = None
    advice: list[str] = field(default_factory=list)
    precision: str = "float32"
    """How it trains (`Precision.describe`): float32, bfloat16 + float32 masters, pure bfloat16, LoRA, frozen."""
    host: dict[str, int] = field(default_factory=dict)
    """Bytes of each part kept in host memory (`agents.<i>.offload: optimizer`)."""
    resident: int = 0
    """Device bytes held between phases (weights, masters and optimizer state on the device, the KV pool)."""
    others_resident: int = 0
    """Device bytes the other agents on the same device hold while this one runs a phase."""
    devices: list[str] = field(default_factory=list)
    """Every device it runs on (one per rank)."""

    @property
    def peak(self) -> int:
        update = self.update_peak_checkpointed if self.checkpointing else self.update_peak
        return self.others_resident + max(self.sampling_peak, update)

    @property
    def fits(self) -> bool | None:
        return None if self.device_total is None else self.peak <= self.device_total


def model_shape(model_dir: str | Path, dtype: torch.dtype, lora=None) -> Shape:
    """The memory-relevant shape of a local model directory, without reading its weights; with `lora`
    (`LoraConfig`), `trainable` is the adapters' parameter count: r x (inputs + outputs) of each targeted layer."""
    from hacrl.model_dirs import model_config

    try:  # a GGUF agent: its shape from the file's metadata, no weights read
        config = model_config(model_dir, str(model_dir))
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - a missing or foreign directory: name it
        raise ModelError(f"{str(model_dir)!r}: cannot read the model's config.json ({type(e).__name__}: {e})") from e
    _check_sizes(model_dir, config)
    layers = config.num_hidden_layers
    if layers <= BUILT_LAYERS:
        params, trainable, model = _count(config, dtype, lora)
    else:  # every decoder layer alike: count 1 and 2 layers on the meta device, and the rest by their difference
        (one, one_trainable, model), (two, two_trainable, _) = (_count(_with_layers(config, k), dtype, lora)
                                                               for k in (1, 2))  # fmt: skip
        params = one + (layers - 1) * (two - one)
        trainable = one_trainable + (layers - 1) * (two_trainable - one_trainable)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    qk_norm = any(name.endswith("q_norm.weight") for name, _ in model.named_parameters())
    return Shape(
        params=params,
        trainable=trainable,
        dtype_bytes=torch.empty((), dtype=dtype).element_size(),
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        ffn=getattr(config, "intermediate_size", 4 * config.hidden_size),
        vocab=model.get_output_embeddings().weight.shape[0],
        qk_norm=qk_norm,
    )


BUILT_LAYERS = 64
"""Models with more decoder layers are counted from a 1- and a 2-layer copy (building 100,000 layers on the meta
device took minutes)."""
SIZE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")


MAX_SIZE = 2**24
"""The largest value `plan` accepts for any size of a config.json (vocabulary, width, layers, heads)."""


def _check_sizes(model_dir, config) -> None:
    """The sizes `plan` reads are positive integers, or the config.json is named with the field to fix."""
    for key in (*SIZE_FIELDS, "num_key_value_heads", "intermediate_size", "head_dim"):
        value = getattr(config, key, None)
        if value is None and key not in SIZE_FIELDS:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(
                f"{str(model_dir)!r}: config.json has {key}={value!r}; it must be a positive integer (fix that "
                "config.json)"
            )
        if value > MAX_SIZE:  # 1e18 overflowed torch's shape arithmetic (a traceback)
            raise ModelError(
                f"{str(model_dir)!r}: config.json has {key}={value:,}, past the {MAX_SIZE:,} hacrl plans for (the "
                "largest real models stay far below it); fix that config.json"
            )


def _with_layers(config, layers: int):
    """A copy of `config` with `layers` decoder layers (per-layer lists such as `layer_types` cut to match)."""
    import copy

    short = copy.deepcopy(config)
    for key, value in vars(config).items():
        if isinstance(value, list) and len(value) == config.num_hidden_layers:
            setattr(short, key, value[:layers])
    short.num_hidden_layers = layers
    return short


def _count(config, dtype: torch.dtype, lora):
    """(parameters, trainable parameters, the model) of `config` built on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    trainable = params
    if lora is not None:
        targets = set(lora.target_modules)
        trainable = sum(
            lora.r * (m.in_features + m.out_features)
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
        )
    return params, trainable, model


def activation_bytes(shape: Shape, rows: int, tokens: int, *, checkpointing: bool, padded: bool = True) -> int:
    """One micro-batch's activations held for the backward pass (estimate; see the module docstring). With
    checkpointing the recomputed layer is counted whole: an upper bound (tests/tools/test_plan.py compares it
    with the GPU measurements)."""
    full_layer = rows * tokens * shape.activation_elements(tokens, padded=padded) * shape.dtype_bytes
    if not checkpointing:
        return shape.layers * full_layer
    kept = rows * tokens * shape.layers * (shape.hidden + CHECKPOINTED_EXTRA) * shape.dtype_bytes
    return kept + full_layer


def logprob_head_bytes(shape: Shape, rows: int, tokens: int, chunk: int | str | None, *, cpu: bool) -> int:
    """The output layer's share of a training forward and backward: float32 logits, their softmax and gradient
    for one chunk of positions (or all of them), and the model-dtype logits of the full path (`cpu`: the device is
    the CPU, where `auto` chunks smaller)."""
    from hacrl.agent.logprobs import auto_chunk_size

    if chunk == "auto":
        chunk = auto_chunk_size(rows, tokens, shape.vocab, cpu=cpu)
    if chunk is None:
        return rows * tokens * shape.vocab * (3 * 4 + shape.dtype_bytes)
    return min(chunk, rows * tokens) * shape.vocab * 3 * 4


def plan(config: TrainConfig, *, device_memory: float | None = None) -> list[AgentPlan]:
    """Every agent's memory plan (see the module docstring); `device_memory` in GiB where CUDA cannot say."""
    plans = [_plan_agent(config, i, agent, device_memory) for i, agent in enumerate(config.agents)]
    for i, agent in enumerate(config.agents):  # a sampler of its own: its role's precision, on its own device
        if agent.sampler_devices:
            p, margin = _plan_agent(config, i, agent, device_memory, role="sampler")
            p.name = f"{agent.name} (sampler)"
            plans.append((p, margin))
    _share_devices([p for p, _ in plans])
    for i, (p, margin) in enumerate(plans):
        _advise(p, i, config.trainer.micro_batch_size)
        if margin and p.fits:
            _suggest_margin(p, config.rollout.kv_cache_margin, *margin)
    return [p for p, _ in plans]


def _plan_agent(config: TrainConfig, i: int, agent, device_memory: float | None, role: Role = "learner"):
    """Agent i's plan in `role` (its learner, or a sampler of its own), alone on its devices; with
    `rollout.batch_size: auto` on a GPU also (the memory left for the KV pool, its bytes per row) for
    `_suggest_margin`, else None."""
    from hacrl.agent.model import DTYPES
    from hacrl.agent.samplers.base import next_power_of_two
    from hacrl.agent.samplers.static import row_bytes

    precision = Precision.resolve(agent, f"agents.{i}", role)
    placement = Placement.resolve(agent)
    devices = list(placement.devices) if role == "learner" else [placement.sampler_device]
    lora = agent.lora if precision.mode == "lora" else None
    source = require_model_dir(agent.model, f"agents.{i}.model", convert=False)  # only its config.json or metadata
    shape = model_shape(source, DTYPES[precision.compute], lora)
    settings = AgentSettings.resolve(agent, config.rollout)
    tokens = settings.max_tokens
    p = AgentPlan(agent.name, devices[0], shape, checkpointing=agent.gradient_checkpointing, devices=devices,
                  precision=precision.describe())  # fmt: skip
    learns = precision.trains != "nothing"  # a frozen agent keeps no reference, gradients or optimizer state
    _trained_parts(p, precision, with_reference=config.algorithm.kl_coef > 0 and learns)
    p.device_total = _device_total(p.devices[0], device_memory)
    per_row = row_bytes(shape.kv_bytes_per_token, tokens, shape.vocab)
    budget = _rows_per_call(p, settings, per_row)
    pool_rows = next_power_of_two(p.rows) if settings.sampler == "static" else p.rows
    p.parts["KV cache (sampling)"] = pool_rows * shape.kv_bytes_per_token * tokens
    p.parts["sampling step floats"] = p.rows * shape.vocab * 16
    micro = config.trainer.micro_batch_size
    p.parts["activations, one micro-batch"] = activation_bytes(shape, micro, tokens, checkpointing=False) * learns
    p.parts["activations, gradient checkpointing"] = activation_bytes(shape, micro, tokens, checkpointing=True) * learns
    chunk, cpu = config.trainer.logprob_chunk_size, str(p.devices[0]).startswith("cpu")
    p.parts["log-prob head"] = logprob_head_bytes(shape, micro, tokens, chunk, cpu=cpu)
    held = (
        p.parts["weights"] + p.parts["reference model (KL)"] + p.parts["master weights (float32)"]
        + p.parts["optimizer state (AdamW)"] + p.parts["KV cache (sampling)"]
    )  # fmt: skip
    p.resident = held
    p.sampling_peak = held + p.parts["sampling step floats"]  # gradients are freed after each update
    update = held + p.parts["gradients"] + p.parts["log-prob head"] + p.parts["gathered for the update (FSDP2)"]
    p.update_peak = update + p.parts["activations, one micro-batch"]
    p.update_peak_checkpointed = update + p.parts["activations, gradient checkpointing"]
    return p, None if budget is None else (budget, per_row)


def _trained_parts(p: AgentPlan, precision: Precision, *, with_reference: bool) -> None:
    """The weights, the reference, and what training keeps (masters, gradients, AdamW state; on the device or the
    host), as the agent's precision says, per rank."""
    shape, learns = p.shape, precision.trains != "nothing"
    weights = shape.params * shape.dtype_bytes
    p.parts["weights"] = weights
    p.parts["reference model (KL)"] = weights if with_reference else 0
    trained_bytes = precision.trained_bytes or shape.dtype_bytes  # float32 adapters, masters, master shards
    if precision.mode == "lora":  # the adapters beside the base (a sampler holds them too, never stepped)
        p.parts["weights"] = weights + shape.trainable * (precision.trained_bytes or 4)
    ranks = len(p.devices)
    if precision.mode == "sharded":
        p.precision += f", FSDP2 x{ranks}"
        p.device = f"{p.devices[0]} x{ranks}"
    master_bytes = shape.trainable * 4 * precision.float32_masters // ranks
    state_bytes = 2 * shape.trainable * trained_bytes * learns // ranks
    gradient_bytes = shape.trainable * trained_bytes * learns // ranks
    on_host = precision.on_host
    p.parts["master weights (float32)"] = 0 if "master weights" in on_host else master_bytes
    p.parts["gradients"] = 0 if "gradients" in on_host else gradient_bytes
    p.parts["optimizer state (AdamW)"] = 0 if "optimizer state" in on_host else state_bytes
    p.parts["gathered for the update (FSDP2)"] = _gathered_bytes(shape) if precision.mode == "sharded" else 0
    if on_host:
        p.host = {"master weights (float32)": master_bytes, "optimizer state (AdamW)": state_bytes,
                  "gradients (the step's copy)": shape.trainable * 4 // ranks}  # fmt: skip


def _rows_per_call(p: AgentPlan, settings: AgentSettings, per_row: int) -> int | None:
    """`p.rows`: the configured rows per call, or `auto` resolved as the static sampler resolves it on the device
    (64 where memory is not measured). Returns the memory left for the KV pool where `auto` sized it, else None."""
    from hacrl.agent.samplers.static import MIN_ROWS, auto_rows

    rows, total = settings.rows_per_call, p.device_total
    if rows != "auto":
        p.rows = int(rows)
        return None
    if total is None or not p.devices[0].startswith("cuda"):
        p.rows = 64
        return None
    free = total - p.parts["weights"] - p.parts["reference model (KL)"] - p.parts["master weights (float32)"]
    pending = p.parts["gradients"] + p.parts["optimizer state (AdamW)"]
    try:
        p.rows = int(auto_rows(free=free, total=total, pending=pending, margin=settings.kv_cache_margin,
                               bytes_per_row=per_row))  # fmt: skip
    except Exception as e:  # noqa: BLE001 - the sampler would refuse the same way: say so here
        p.advice.append(str(e))
        p.rows = MIN_ROWS
    return free - pending


def _gathered_bytes(shape: Shape) -> int:
    """What FSDP2 holds whole in the compute dtype during a rank's forward and backward: the root's parameters (the
    embeddings and output layer, counted once: tied) and two decoder layers (the one computing and the prefetched
    next). An estimate: the layers are taken as equal, the root as vocabulary x hidden."""
    root = shape.vocab * shape.hidden
    layer = max(0, shape.params - root) // max(1, shape.layers)
    return (root + 2 * layer) * shape.dtype_bytes


def plan_ranks(config: TrainConfig, *, device_memory: float | None = None, most: int = 8) -> dict[str, list[int]]:
    """Each learning agent's planned peak per rank (bytes) with its model on K = 1..`most` devices of its kind
    (`agents.<i>.devices`), everything else as configured; LoRA and frozen agents train on one device only."""
    import copy

    out: dict[str, list[int]] = {}
    for i, agent in enumerate(config.agents):
        if agent.frozen or agent.lora is not None:
            continue
        kind = (agent.devices[0] if agent.devices else agent.device).split(":")[0]
        peaks = []
        for k in range(1, most + 1):
            one = copy.deepcopy(config)
            one.agents = [one.agents[i]]
            one.agents[0].devices = [f"{kind}:{r}" if kind == "cuda" else kind for r in range(k)] if k > 1 else None
            if k == 1 and agent.devices:
                one.agents[0].device = agent.devices[0]
            (p,) = plan(one, device_memory=device_memory)
            peaks.append(p.peak)
        out[agent.name] = peaks
    return out


def render_ranks(peaks: dict[str, list[int]]) -> str:
    """`plan_ranks` as a table: one row per agent, one column per K."""
    if not peaks:
        return ""
    most = max(len(v) for v in peaks.values())
    width = max(len(n) for n in peaks) + 2
    lines = ["peak per rank with the agent on K devices (GiB; agents.<i>.devices)", ""]
    lines.append(f"{'K':<{width}}" + "".join(f"{k:>9}" for k in range(1, most + 1)))
    for name, values in peaks.items():
        lines.append(f"{name:<{width}}" + "".join(f"{v / GIB:>9.2f}" for v in values))
    return "\n".join(lines)


def _share_devices(plans: list[AgentPlan]) -> None:
    """Agents on one device take turns (one phase at a time), each holding its resident bytes throughout: each
    agent's peak counts the others' resident bytes too."""
    for p in plans:
        p.others_resident = sum(
            q.resident for q in plans if q is not p and any(_same_device(a, b) for a in p.devices for b in q.devices)
        )


def _same_device(a: str, b: str) -> bool:
    """`cuda` is `cuda:0`; every agent on `cpu` shares the host (on a CPU the plan's sums are host memory)."""
    return (a if ":" in a or a == "cpu" else f"{a}:0") == (b if ":" in b or b == "cpu" else f"{b}:0")


def _device_total(device: str, device_memory: float | None) -> int | None:
    if device_memory is not None:
        return int(device_memory * GIB)
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return None


def _advise(p: AgentPlan, i: int, micro: int) -> None:
    if p.fits is None or p.fits:
        return
    if p.parts["master weights (float32)"]:
        moved = p.parts["master weights (float32)"] + p.parts["optimizer state (AdamW)"]
        if p.peak - moved <= p.device_total:
            p.advice.append(f"set agents.{i}.offload=optimizer ({moved / GIB:.1f} GiB of float32 masters and AdamW "
                            "state move to the host)")  # fmt: skip
    if not p.checkpointing and p.update_peak_checkpointed <= p.device_total:
        p.advice.append(f"set agents.{i}.gradient_checkpointing=true (the update then needs "
                        f"{p.update_peak_checkpointed / GIB:.1f} GiB)")  # fmt: skip
    elif micro > 1:
        p.advice.append(f"lower trainer.micro_batch_size (now {micro})")
    if p.sampling_peak > p.device_total:
        p.advice.append("lower rollout.batch_size (or raise rollout.kv_cache_margin with auto) or max_new_tokens")
    if not p.advice:
        p.advice.append("give the agent a larger GPU, or a GPU of its own")


HEADROOM = 0.05
"""`_suggest_margin` proposes more rows only where the plan's peak stays this fraction of the card below it."""


def _suggest_margin(p: AgentPlan, margin: float, budget: int, per_row: int) -> None:
    """With `rollout.batch_size: auto`: where the plan's own (conservative) update estimate leaves room for twice
    the rows per call, the `rollout.kv_cache_margin` that gives them. More rows per call read the weights once for
    more tokens at each decode step (a 4B agent at 16 rows spent 80 % of its step sampling: benchmarks/results/
    gpu-h100-paper-step.md). `budget`: the free memory after the weights, their gradients and AdamW state."""
    rows = 2 * p.rows  # auto's rows are a power of two: the pool doubles
    peak = p.peak + p.rows * per_row
    if peak > (1 - HEADROOM) * p.device_total:
        return
    wanted = (budget - rows * per_row) / p.device_total  # the largest margin whose budget holds the rows
    wanted = int(wanted * 20) / 20  # down to a multiple of 0.05
    if wanted <= 0 or wanted >= margin:
        return
    p.advice.append(
        f"rollout.kv_cache_margin={wanted:.2f} (now {margin:g}) gives {rows} rows per generation call instead of "
        f"{p.rows}, with a planned peak of {peak / GIB:.1f} GiB of {p.device_total / GIB:.1f}: each decode step "
        "then reads the weights for twice the rows"
    )


def render(plans: list[AgentPlan]) -> str:
    """The plan as a console table, one column per agent."""
    names = [p.name for p in plans]
    keys = list(plans[0].parts) if plans else []
    width = max([len(k) for k in keys] + [28])
    lines = ["memory plan (GiB; estimates for activations and the log-prob head, the rest exact)", ""]
    lines.append(f"{'':{width}}  " + "  ".join(f"{n:>14}" for n in names))
    lines.append(f"{'parameters':{width}}  " + "  ".join(f"{p.shape.params / 1e9:>13.2f}B" for p in plans))
    lines.append(f"{'device':{width}}  " + "  ".join(f"{p.device:>14}" for p in plans))
    lines.append(f"{'precision':{width}}  " + "  ".join(f"{p.precision:>14}" for p in plans))
    lines.append(f"{'rows per generation call':{width}}  " + "  ".join(f"{p.rows:>14}" for p in plans))
    for key in keys:
        lines.append(f"{key:{width}}  " + "  ".join(f"{p.parts[key] / GIB:>14.2f}" for p in plans))
    lines.append(f"{'peak while sampling':{width}}  " + "  ".join(f"{p.sampling_peak / GIB:>14.2f}" for p in plans))
    updates = [p.update_peak_checkpointed if p.checkpointing else p.update_peak for p in plans]
    lines.append(f"{'peak in the update':{width}}  " + "  ".join(f"{u / GIB:>14.2f}" for u in updates))
    if any(p.others_resident for p in plans):
        lines.append(f"{'other agents on the device':{width}}  " + "  ".join(
            f"{p.others_resident / GIB:>14.2f}" for p in plans))  # fmt: skip
    host_keys = list(dict.fromkeys(k for p in plans for k in p.host))
    for key in host_keys:
        lines.append(f"{'host: ' + key:{width}}  " + "  ".join(f"{p.host.get(key, 0) / GIB:>14.2f}" for p in plans))
    if host_keys:
        lines.append(f"{'host memory (pinned)':{width}}  " + "  ".join(
            f"{sum(p.host.values()) / GIB:>14.2f}" for p in plans))  # fmt: skip
    lines.append(f"{'device memory':{width}}  " + "  ".join(
        f"{p.device_total / GIB:>14.2f}" if p.device_total else f"{'unknown':>14}" for p in plans))  # fmt: skip
    lines.append(f"{'fits':{width}}  " + "  ".join(
        f"{('yes' if p.fits else 'NO') if p.fits is not None else '-':>14}" for p in plans))  # fmt: skip
    for p in plans:
        for line in p.advice:
            lines.append(f"{p.name}: {line}")
    if any(p.fits is None for p in plans):
        lines.append("(device memory unknown for some agents: pass --device-memory GIB, e.g. 80 for an H100)")
    return "\n".join(lines)


BYTES_PER_TOKEN = 4
"""What `pool_summary` assumes a token of generated text takes in UTF-8 (about 4 for English BPE tokenizers)."""
TRAJECTORY_BYTES = 120
"""A trajectory's numbers and the Python object around its text (measured: ~110 bytes on CPython 3.11)."""


def pool_summary(config: TrainConfig) -> str:
    """The step's pool (answers and bytes of text the driver holds) and each learner's update rows under the sharing
    policy and budget: exact where they do not depend on rewards (`all`, a budget, groups), else an upper bound."""
    from hacrl.core import get_algorithm
    from hacrl.core.sharing import foreign_per_prompt
    from hacrl.driver.pace import sharing_terms

    t, n = config.trainer, len(config.agents)
    settings = [AgentSettings.resolve(a, config.rollout) for a in config.agents]
    answers = [t.prompts_per_step * s.group_size for s in settings]
    text = sum(a * s.max_new_tokens * BYTES_PER_TOKEN for a, s in zip(answers, settings, strict=True))
    total = text + sum(answers) * TRAJECTORY_BYTES
    lines = [f"pool per step: {sum(answers):,} answers ({' + '.join(map(str, answers))}), at most "
             f"{total / 2**20:,.1f} MiB in the driver (answers at max_new_tokens, ~{BYTES_PER_TOKEN} bytes per token; "
             f"held for one step{f', and {t.lag} more in flight' if t.lag else ''})"]  # fmt: skip
    shares = get_algorithm(config.algorithm.name).pool_is_shared(config.algorithm) and n > 1
    sharing, sizes, terms = config.sharing, [s.group_size for s in settings], sharing_terms(config)
    exact = sharing.policy == "all"
    rows = []
    for k, agent in enumerate(config.agents):
        if agent.frozen:
            rows.append(f"{agent.name} 0 (frozen)")
            continue
        per_prompt = foreign_per_prompt(sizes, k, budget=terms["foreign_cap"], group_of=terms["group_of"])
        foreign = per_prompt * t.prompts_per_step if shares else 0
        bound = "" if exact or not foreign else "at most "
        rows.append(f"{agent.name} {bound}{answers[k] + foreign:,} (own {answers[k]:,} + foreign {bound}{foreign:,})")
    policy = f"sharing.policy={sharing.policy}" + (f", budget_per_prompt={sharing.budget_per_prompt}"
                                                    if sharing.budget_per_prompt is not None else "")  # fmt: skip
    lines.append(f"update rows per learner ({policy}{', groups' if sharing.groups else ''}): " + "; ".join(rows))
    return "\n".join(lines)
