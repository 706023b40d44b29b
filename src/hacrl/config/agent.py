"""The `agents:` entries of the config: one agent's model, optimizer, sampling overrides, devices and precision
settings (`AgentConfig`, with `LoraConfig`), and the rules for agent and device names. Each checks its own fields;
how its precision settings combine: `hacrl.config.settings.Precision`, run by `hacrl.config.validation`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from hacrl.config.marks import NOT_EXACT, SAFE
from hacrl.errors import ConfigError

MAX_AGENT_NAME = 64
"""Agent names are path components (checkpoints/step_N/agents/<name>, <name>.tmp files): far below any file
system's 255-byte limit, so a long name fails at validation, not at the first checkpoint."""
_AGENT_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._+-]{{0,{MAX_AGENT_NAME - 1}}}")


RESERVED_AGENT_NAMES = ("eval", "time", "tokens_per_second")
"""Names that start run-wide metric keys (`eval/<agent>/...`, `time/step`, `tokens_per_second/sampling`)."""


@dataclass
class LoraConfig:
    """LoRA adapters (peft, `pip install "hacrl[lora]"`): the agent trains these only; its base weights never
    change, its optimizer state and gradients are the adapters' (a few MB instead of 3x the model)."""

    r: int = 16
    """Rank of each adapter."""
    alpha: float = 32.0
    """Scale: the adapter's output is multiplied by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Names of the linear layers that get an adapter (every attention and MLP projection of Llama / Qwen)."""
    merge_for_sampling: bool = False
    """Sample from a copy of the base with the adapters merged into its weights (refreshed before each sampling
    after an update): plain matmuls instead of two extra small ones per targeted layer, for one more copy of the
    base's weights in memory. The loss always uses the unmerged model (the base never changes)."""

    def check(self, where: str) -> None:
        import importlib.util

        if self.r < 1 or not self.alpha > 0 or not 0 <= self.dropout < 1 or not self.target_modules:
            raise ConfigError(
                f"{where}: r >= 1, alpha > 0, dropout in [0, 1) and at least one target module, got r={self.r}, "
                f"alpha={self.alpha}, dropout={self.dropout}, target_modules={list(self.target_modules)}"
            )
        if importlib.util.find_spec("peft") is None:
            raise ConfigError(f'{where} needs peft, an optional extra: pip install "hacrl[lora]" (or pip install peft)')


def check_name(name: Any, key: str, what: str) -> None:
    """An agent's (or a control policy's) name: a folder-safe path component that no run-wide metric key starts
    with. It names checkpoint folders and files (`agents/<name>/`, `optimizer/<name>.pt`), so `../x` would write
    outside the run."""
    if not isinstance(name, str) or not _AGENT_NAME.fullmatch(name):
        shown = name if len(str(name)) <= 80 else f"{str(name)[:77]}..."
        raise ConfigError(
            f"{key}={shown!r} ({len(str(name))} characters) is not a folder-safe name: it names the {what}'s "
            f"checkpoint folder and metrics, so it must be 1-{MAX_AGENT_NAME} characters of letters, digits, '.', "
            "'_', '+' or '-', starting with a letter or digit (e.g. qwen3-1.7b)"
        )
    if name in RESERVED_AGENT_NAMES:
        raise ConfigError(
            f"{key}={name!r} is the first part of run-wide metric keys ({name}/...; `hacrl.driver.metrics`), so "
            f"a {what} of that name would be mixed up with them: choose another name"
        )


def check_device_name(name: Any, key: str) -> None:
    """`name` parses as a torch device (`cpu`, `cuda`, `cuda:1`, `mps`); whether this machine has it is checked
    where the agent starts (`validation.check_devices_here`: `hacrl plan` plans GPU runs on any machine)."""
    import torch

    try:
        torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"{key}={name!r} is not a torch device name: use cpu, cuda, cuda:<index> or mps") from None


@dataclass
class AgentConfig:
    """One agent: a Hugging Face causal LM directory with its tokenizer and chat template."""

    name: str = "???"
    """Unique name; metrics are namespaced by it (`<name>/reward_mean`) and checkpoints use it as folder name."""
    model: str = field(default="???", metadata=NOT_EXACT)
    """Local directory of the model (config.json + weights). Never downloaded at run time."""
    tokenizer: str | None = field(default=None, metadata=NOT_EXACT)
    """Directory of the tokenizer and chat template; None: the model directory."""
    lr: float = 1e-6
    """AdamW learning rate (paper: 1e-6 for 1.7B-4B models; tiny CPU models need ~3e-4)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (spec 3.6); a non-finite norm skips the optimizer step."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype: the weights forward, backward, sampling and log-probs read; float32 on CPU, bfloat16 on GPU
    when asked. A learning agent in bfloat16 trains float32 master weights (`master_weights`); float16 is for frozen
    agents only (training in it needs loss scaling)."""
    master_weights: Literal["float32", "none"] = "float32"
    """With `dtype: bfloat16`: AdamW steps float32 master weights with float32 state, and the bfloat16 weights are
    their rounded copy, refreshed after each optimizer step (mixed precision, as verl and DeepSpeed train). `none`:
    AdamW steps the bfloat16 weights themselves (pure low precision: an update below half a bf16 ulp of a weight,
    ~6e-5 at |w| = 0.02, rounds away; `hacrl train` warns when lr is below it). No effect on float32 agents, LoRA
    adapters (float32 already), frozen agents and agents on `devices` (FSDP2 always keeps float32 master shards).
    How each combination computes and steps: `hacrl.config.settings.Precision`."""
    offload: Literal["none", "optimizer"] = field(default="none", metadata=NOT_EXACT)
    """`optimizer`: the float32 master weights and AdamW's state live in host memory (pinned with CUDA) and the
    optimizer step runs there; the device holds the bfloat16 weights, the gradients during an update, activations
    and the KV pool (for a 4B agent 48 GB move to the host). Needs `dtype: bfloat16` with float32 masters, or
    `devices` (FSDP2's CPU offload: the shards, their gradients and AdamW's state); the moves cost time (on one device
    logged as `time/offload`)."""
    device: str = field(default="cpu", metadata=NOT_EXACT)
    """torch device of this agent: `cpu`, `cuda`, `cuda:1`, ..."""
    devices: list[str] | None = field(default=None, metadata=NOT_EXACT)
    """K devices for one agent, e.g. `[cuda:0, cuda:1, cuda:2, cuda:3]`: the agent runs as a worker group of K
    ranks (one process each, one torch.distributed group: NCCL on GPUs, gloo on CPU), its model sharded with FSDP2
    (float32 master shards, `dtype` compute, float32 gradient reductions; `offload: optimizer` keeps the shards and
    AdamW's state on the host). The prompts of a step and the rows of each mini-batch are split across the ranks; the
    update equals the one-device update up to float summation order. `[cpu, cpu]` runs two gloo ranks on the CPU
    (tests); `[cuda:0]` is FSDP2 on one GPU (with `offload: optimizer`, its CPUOffloadPolicy: the float32 shards, their
    gradients and AdamW's state live on the host, each layer copied to the GPU when it computes). Under
    `runtime.backend: ray` each rank is an actor asking for `num_cpus` and `num_gpus`; Ray picks the GPUs, the list's
    length is K. None (the default): one worker on `device`, without FSDP."""
    sampler_devices: list[str] | None = field(default=None, metadata=SAFE)
    """With `trainer.lag` >= 1: a sampler of its own on this device, e.g. `[cpu]` or `[cuda:3]` (one device): a
    process holding the agent's compute-dtype weights, its sampler and its old-log-prob pass, which samples batch
    t + k while the learner runs update t, and takes the learner's new weights after each update (host shared
    memory on the local backend; on Ray a second actor with the agent's num_cpus / num_gpus, the weights handed over
    through Ray's object store; `<agent>/time/weight_sync`). The numbers are those of the same run without it. With
    `devices` (a worker group) rank 0 hands over the whole compute copy the ranks gather after each update, and the
    sampler draws each rank's share from that rank's stream. With `lora` only the adapters are handed over (the
    sampler loads the same base). None: the agent's worker samples and learns in turn."""
    weight_sync: Literal["auto", "host", "broadcast"] = field(default="auto", metadata=SAFE)
    """How a sampler of its own gets the weights: `host` (two slots of shared memory on the local backend, Ray's
    object store on Ray: through host memory, which also crosses nodes), `broadcast` (a torch.distributed broadcast
    in a group of the learner and its sampler, NCCL between GPUs, gloo otherwise, at the end of each step), `auto`:
    broadcast when the learner and its sampler are both on CUDA devices, else host. The numbers do not depend on
    it."""
    temperature: float | None = None
    """Sampling temperature for this agent; None: `rollout.temperature`."""
    top_p: float | None = None
    """Nucleus sampling threshold for this agent; None: `rollout.top_p`."""
    max_new_tokens: int | None = None
    """Response length limit for this agent, in its own tokens; None: `rollout.max_new_tokens`."""
    max_prompt_tokens: int | None = None
    """Prompt length limit for this agent (prompts are cut from the left); None: `rollout.max_prompt_tokens`."""
    group_size: int | None = None
    """Answers this agent samples per prompt, its rollout budget; None: `rollout.group_size`. A fast agent can draw
    more than a slow one so that neither waits (`hacrl plan --measure` proposes budgets). Pools then hold unequal
    counts per source: every baseline is the mean over the prompt's pooled answers (docs/design.md, "Unequal
    rollout budgets"); equal budgets give exactly the numbers of `rollout.group_size`."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra variables for this agent's chat template, e.g. `{enable_thinking: false}` for Qwen3."""
    rollout_backend: Literal["hf", "static", "vllm"] | None = field(default=None, metadata=NOT_EXACT)
    """This agent's sampler; None: `rollout.backend`."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of every weight, e.g. `{r: 16, alpha: 32}` (see `LoraConfig`); None: full
    fine-tuning. Checkpoints hold the adapters (the base stays `model`); `hacrl export` merges them."""
    frozen: bool = False
    """A peer that shares without learning: it samples, is scored, has its capability tracked and its rollouts go
    into the others' pools, but it never computes a loss or steps an optimizer (none is allocated; checkpoints
    keep only its random stream, its weights stay those of `model`). Needs a sharing algorithm (hacpo, naive)."""
    gradient_checkpointing: bool = field(default=False, metadata=NOT_EXACT)
    """Recompute each layer's activations in the backward pass instead of keeping them (less memory, ~30 % more
    compute in the update); for long responses on a GPU."""
    num_cpus: float = field(default=1.0, metadata=SAFE)
    """runtime.backend=ray: CPUs this agent's worker asks Ray for (fractions allowed)."""
    num_gpus: float = field(default=0.0, metadata=SAFE)
    """runtime.backend=ray: GPUs this agent's worker asks Ray for; 0.5 lets two agents share one GPU. Set
    `device: cuda` with it (Ray makes the assigned GPU the worker's first visible one)."""

    def check(self, where: str) -> None:
        check_name(self.name, f"{where}.name", "agent")
        if not self.lr > 0:
            raise ConfigError(f"{where}.lr must be positive, got {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"{where}.betas must be two numbers in [0, 1), got {self.betas}")
        if not self.grad_clip > 0:
            raise ConfigError(f"{where}.grad_clip must be positive, got {self.grad_clip}")
        for key in ("max_new_tokens", "max_prompt_tokens", "group_size"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{where}.{key} must be >= 1 or null, got {value}")
        if self.temperature is not None and not self.temperature > 0:
            raise ConfigError(f"{where}.temperature must be positive, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"{where}.top_p must be in (0, 1], got {self.top_p}")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ConfigError(f"{where}.num_cpus and num_gpus must be >= 0, got {self.num_cpus}, {self.num_gpus}")
        if self.num_gpus > 0 and not self.device.startswith("cuda"):
            raise ConfigError(f"{where}.num_gpus={self.num_gpus} asks for a GPU: set {where}.device=cuda")
        check_device_name(self.device, f"{where}.device")
        if self.devices is not None:
            self._check_devices(where)
        if self.sampler_devices is not None:
            self._check_sampler_devices(where)
        elif self.weight_sync != "auto":
            raise ConfigError(
                f"{where}.weight_sync={self.weight_sync} chooses how a sampler of its own gets the weights, and this "
                f"agent has none: set {where}.sampler_devices (with trainer.lag >= 1), or remove {where}.weight_sync"
            )
        if self.lora is not None:
            if self.frozen:
                raise ConfigError(f"{where}: a frozen agent trains nothing, so {where}.lora has nothing to do; "
                                  "remove one of them")  # fmt: skip
            self.lora.check(f"{where}.lora")

    def _check_sampler_devices(self, where: str) -> None:
        key, devices = f"{where}.sampler_devices", self.sampler_devices
        if not isinstance(devices, list) or len(devices) != 1 or not isinstance(devices[0], str):
            raise ConfigError(f"{key} must name one device, like [cpu] or [cuda:3], got {devices!r}")
        check_device_name(devices[0], f"{key}.0")
        learner = self.devices if self.devices else [self.device]
        if devices[0].startswith("cuda") and devices[0] in learner:
            which = f"{where}.devices" if self.devices else f"{where}.device"
            raise ConfigError(
                f"{key}={devices} is one of the learner's own GPUs ({which}): sampling would take turns with the "
                "update there and gain nothing; name another GPU, or remove it"
            )

    def _check_devices(self, where: str) -> None:
        devices = self.devices
        if not isinstance(devices, list) or not all(isinstance(d, str) and d for d in devices):
            raise ConfigError(
                f"{where}.devices must be a list of torch device names like [cuda:0, cuda:1], got {devices!r}"
            )
        if not devices:
            raise ConfigError(f"{where}.devices=[] names no device: list one or more, or remove it ({where}.device)")
        for i, device in enumerate(devices):
            check_device_name(device, f"{where}.devices.{i}")
        kinds = {d.split(":")[0] for d in devices}
        if kinds not in ({"cpu"}, {"cuda"}):
            raise ConfigError(
                f"{where}.devices={devices}: a worker group runs on CPUs (gloo: [cpu, cpu]) or on GPUs (NCCL: "
                "[cuda:0, cuda:1]), not on a mix"
            )
        if kinds == {"cuda"} and len(set(devices)) != len(devices):
            raise ConfigError(f"{where}.devices={devices} names a GPU twice: each rank needs a GPU of its own")
        if self.frozen:
            raise ConfigError(
                f"{where}: a frozen agent trains nothing, so sharding it over {where}.devices gains nothing; give it "
                f"one {where}.device"
            )
        if self.lora is not None:
            raise ConfigError(
                f"{where}: LoRA agents train on one device ({where}.devices with {where}.lora is not supported yet: "
                f"their adapters are small); remove {where}.devices, or train the whole agent"
            )

    @property
    def num_ranks(self) -> int:
        """K: the ranks of this agent's worker group (`devices`; 1 without it: one worker on `device`)."""
        return len(self.devices) if self.devices else 1
