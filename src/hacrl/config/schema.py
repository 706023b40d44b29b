"""The config tree's schema: one dataclass per group, each field with its default, its docstring (`hacrl train
--help-config`) and, where a resumed run may change it, its resume policy (SAFE / NOT_EXACT, read by
`hacrl.driver.resume`); each group's `check` validates its own fields (checks across groups: `hacrl.config.validation`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

from hacrl.core.params import AlgorithmParams
from hacrl.errors import ConfigError, ModelError, clip

MAX_AGENT_NAME = 64
"""Agent names are path components (checkpoints/step_N/agents/<name>, <name>.tmp files): far below any file
system's 255-byte limit, so a long name fails at validation, not at the first checkpoint."""
_AGENT_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._+-]{{0,{MAX_AGENT_NAME - 1}}}")


RESERVED_AGENT_NAMES = ("eval", "time", "tokens_per_second")
"""Names that start run-wide metric keys (`eval/<agent>/...`, `time/step`, `tokens_per_second/sampling`)."""


# What a resumed run may change, per field (`field(metadata=...)`) or per group (a class's RESUME); anything else
# would change the training numbers and is refused by `checkpoint.strict_resume` (`hacrl.driver.resume`).
SAFE = {"resume": "safe"}
"""Never changes the training numbers (evaluation, logging, scoring limits, where workers run)."""
NOT_EXACT = {"resume": "not_exact"}
"""Allowed, to move a run or to fit memory, at the price of bit-exactness (float sums, batching and the sampler's
random draws then differ from an uninterrupted run)."""


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


def require_model_dir(model: str | Path, key: str, *, convert: bool = True) -> Path:
    """`model` as a local Hugging Face model directory (one with config.json) that ships no code to run, or a
    ModelError that names the config key and the fix: hacrl loads local directories only and never downloads. A GGUF
    file (or a directory holding one) is converted once into a plain directory (`hacrl.gguf`), which is returned;
    `convert=False`: the GGUF file itself (`hacrl plan` reads its metadata only)."""
    from hacrl.gguf import gguf_file, plain_directory

    path = Path(model).expanduser()
    gguf = gguf_file(path)
    if gguf is not None:
        if not gguf.is_file():
            raise ModelError(f"{key}: the GGUF file {str(gguf)!r} does not exist (hacrl never downloads: point {key} "
                             "at a local copy, e.g. the one `hacrl bootstrap --recipe smollm2` fetches)")  # fmt: skip
        return plain_directory(gguf, key) if convert else gguf
    if not (path / "config.json").is_file():
        what = "holds no config.json" if path.is_dir() else "does not exist"
        raise ModelError(
            f"{key}: {str(model)!r} is not a Hugging Face model directory ({what}); hacrl loads local directories "
            f"only and never downloads: point {key} at a local copy (the paper presets ship placeholder paths: "
            f"`{key}=/models/<name>` on the command line)"
        )
    refuse_model_code(path, key)
    return path


CODE_FILES = ("config.json", "tokenizer_config.json")
"""The files of a model directory whose `auto_map` would make transformers import Python shipped beside them."""


def refuse_model_code(directory: str | Path, key: str) -> None:
    """ModelError when a model or tokenizer directory asks to run its own Python (`auto_map` in config.json or
    tokenizer_config.json: transformers would import the module it names, or ask "run the custom code? [y/N]").

    hacrl never runs code from a model, tokenizer or checkpoint directory, and every load also passes
    `trust_remote_code=False`; there is no opt-in. A model whose architecture transformers has (its `model_type`)
    loads with transformers' own class once `auto_map` is deleted from the file."""
    import json

    for name in CODE_FILES:
        file = Path(directory) / name
        if not file.is_file():
            continue
        try:
            data = json.loads(file.read_bytes()[: 1 << 24])
        except (OSError, ValueError):
            continue  # unreadable: the load itself names the problem, and runs nothing
        if isinstance(data, dict) and data.get("auto_map"):
            native = data.get("model_type") if name == "config.json" else None
            if native is not None:
                from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

                native = native if native in CONFIG_MAPPING_NAMES else None
            fix = (
                f"If transformers' own {native!r} class is the architecture, delete the auto_map entry from {name} "
                "and it loads with that class. "
                if native
                else ""
            )
            raise ModelError(
                f"{key}: {file} asks to run Python shipped with the model (auto_map: "
                f"{clip(json.dumps(data['auto_map']), 120)}); hacrl never runs code from a model, tokenizer or "
                f"checkpoint directory. {fix}A model that needs its own code cannot be trained with hacrl."
            )


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
        from hacrl.config.settings import Precision  # beside AgentSettings, which imports this module

        Precision.resolve(self, where)  # float16 training, offload without masters: refused there, with the fix
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


@dataclass
class AlgorithmConfig(AlgorithmParams):
    """Which algorithm, and every hyper-parameter of the spec with the paper's defaults."""

    name: str = "hacpo"
    """A registered algorithm (`hacrl.core.algorithms`): grpo, gspo (no sharing), naive (shared, plain pooled),
    hacpo, or one added with `register`."""
    capability_window: int = 5
    """K: capability is the mean of the last K per-step mean rewards (spec 3.1)."""
    capability_warmup_steps: int = 0
    """While the tracker has seen no more steps than this, all capability ratios are 1 (spec 3.1)."""

    def params(self) -> AlgorithmParams:
        """The core's view: only the fields the advantage and loss functions read."""
        return AlgorithmParams(**{f.name: getattr(self, f.name) for f in fields(AlgorithmParams)})

    def check(self, where: str = "algorithm") -> None:
        """This group's own fields (the inherited ones are checked by `AlgorithmParams` on construction)."""
        from hacrl.core import ALGORITHMS

        if self.name not in ALGORITHMS:
            raise ConfigError(
                f"{where}.name={self.name!r} is not a registered algorithm; known: {', '.join(sorted(ALGORITHMS))} "
                "(add one with hacrl.core.register)"
            )
        if self.capability_window < 1:
            raise ConfigError(f"{where}.capability_window must be >= 1, got {self.capability_window}")
        if self.capability_warmup_steps < 0:
            raise ConfigError(f"{where}.capability_warmup_steps must be >= 0, got {self.capability_warmup_steps}")


@dataclass
class SharingConfig:
    """Which of the other agents' rollouts each learner trains on (a sharing policy; algorithms that share only).
    The advantages are always computed over every scored response; the policy then chooses the foreign rows that
    enter the learner's loss (own rows always do; `hacrl.core.sharing`, docs/design.md)."""

    policy: str = "all"
    """`all`: every foreign row (the paper). `correct`: foreign rows with reward >= `min_reward`. `learner_fails`:
    the foreign rows of prompts where the learner's own mean reward is below `fail_below`. `top_k`: per prompt, the
    `k` foreign rows of highest relevance to the learner (|d objective / d its mean log-prob| at the start of its
    update, from one extra no-grad forward over the foreign rows). `adaptive`: per prompt, a source's rows when its
    mean reward there exceeds the learner's own by more than `margin`. Measured (analysis.md, round 4: tiny agents,
    two beds, 5 seeds): none beats or loses to `all`; `correct` and `adaptive` match it with 28-40 % fewer update
    seconds."""
    min_reward: float | None = None
    """`correct`: the least reward a kept foreign row has; None: algorithm.r_max (only fully correct responses)."""
    fail_below: float = 0.5
    """`learner_fails`: share a prompt's foreign rows when the learner's own mean reward on it is below this."""
    k: int = 4
    """`top_k`: foreign rows kept per prompt (over all other agents together)."""
    margin: float = 0.0
    """`adaptive`: a source's rows of a prompt are kept when its mean reward there exceeds the learner's by more."""
    budget_per_prompt: int | None = None
    """After the policy: per prompt, at most this many of the foreign rows it kept, those of largest |rho A| (the
    bound of their weight in HACPO's loss; rho 1 for a loss without it, `naive`'s; no forward pass, no random draw;
    `hacrl.core.sharing.kept_rows`); a learner's update is then its own rows + this many per prompt, whatever the
    number of agents or their `group_size`. None: no budget."""
    groups: list[list[str]] | None = None
    """Hierarchical sharing, e.g. `[[qwen3-1.7b, qwen3-4b], [llama-1b, llama-3b]]` (agent names; every agent in
    exactly one group of two or more): inside its group a learner takes the foreign rows the policy keeps; from the
    other groups only `budget_per_prompt` rows per prompt (those of largest |rho A|), none without a budget. For
    families or sizes that transfer well among themselves. None: one group of all."""

    def reads(self, key: str) -> bool:
        """Whether this policy reads `sharing.<key>` (`hacrl.core.sharing.SETTINGS`): the others are neither
        checked against `algorithm` nor compared on resume."""
        from hacrl.core.sharing import SETTINGS

        return key in SETTINGS.get(self.policy, ())

    def check(self, where: str = "sharing") -> None:
        from hacrl.core.sharing import POLICIES

        if self.policy not in POLICIES:
            raise ConfigError(
                f"{where}.policy={self.policy!r} is not a sharing policy: choose one of {', '.join(POLICIES)}"
            )
        if self.k < 1:
            raise ConfigError(f"{where}.k must be >= 1 (foreign rows kept per prompt by top_k), got {self.k}")
        if self.min_reward is not None and self.min_reward < 0:
            raise ConfigError(f"{where}.min_reward must be >= 0 or null (algorithm.r_max), got {self.min_reward}")
        if self.margin < 0:
            raise ConfigError(f"{where}.margin must be >= 0, got {self.margin}")
        if self.budget_per_prompt is not None and self.budget_per_prompt < 0:
            budget = self.budget_per_prompt
            raise ConfigError(f"{where}.budget_per_prompt must be >= 0 (foreign rows per prompt) or null, got {budget}")

    def min_reward_or(self, r_max: float) -> float:
        return r_max if self.min_reward is None else self.min_reward


@dataclass
class RolloutConfig:
    """Sampling settings shared by every agent (each can override some in `agents:`)."""

    group_size: int = 8
    """G: responses each agent samples per prompt."""
    temperature: float = 1.0
    """Sampling temperature T; log-probs for the loss are taken at the same T (logits / T)."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0: off)."""
    max_new_tokens: int = 256
    """Response length limit, in each agent's own tokens."""
    max_prompt_tokens: int = 512
    """Prompt length limit; longer prompts are cut from the left."""
    backend: Literal["hf", "static", "vllm"] = field(default="hf", metadata=NOT_EXACT)
    """Sampler: `hf` (transformers' generate, the CPU default), `static` (preallocated KV cache, fixed-shape
    decode step, sampling on the device, finished rows dropped; the fast path on a GPU) or `vllm` (vLLM's offline
    engine, an optional extra: `hacrl.agent.samplers.vllm`)."""
    batch_size: int | str | None = field(default=None, metadata=NOT_EXACT)
    """Rows decoded together: `hf`, rows per generate call; `static`, slots of its KV pool (every row of a rollout
    goes in one call, and a row that ends frees its slot for a waiting one). `auto`: the `static` sampler sizes its
    KV pool to the device (on a GPU: the rows,
    a power of two, whose pool fits in the free memory after the model, its optimizer state and gradients, and
    `kv_cache_margin` of the card; `hacrl.agent.samplers.static.auto_rows`), 64 elsewhere; `hf` decodes every row
    of the step in one call while their cache and logits at the length limits fit in 4 GiB, at least 64 (a fixed
    rule, so the samples do not depend on the machine's free memory). None (default): `auto`."""
    kv_cache_margin: float = field(default=0.35, metadata=NOT_EXACT)
    """`batch_size: auto`: the fraction of the device's total memory left free beside the KV pool (the update's
    activations, log-prob chunks, the allocator's slack)."""
    cuda_graphs: bool = field(default=False, metadata=NOT_EXACT)
    """`static` sampler: capture the decode step as a CUDA graph (torch.compile, mode reduce-overhead); GPU only."""

    def check(self, where: str = "rollout") -> None:
        if self.group_size < 1:
            raise ConfigError(f"{where}.group_size must be >= 1, got {self.group_size}")
        if not self.temperature > 0:
            raise ConfigError(f"{where}.temperature must be positive, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"{where}.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1 or self.max_prompt_tokens < 1:
            raise ConfigError(f"{where}.max_new_tokens and {where}.max_prompt_tokens must be >= 1")
        rows = self.batch_size
        if rows is not None and rows != "auto" and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 1):
            raise ConfigError(f"{where}.batch_size must be auto, an integer >= 1 or null, got {rows!r}")
        if not 0 <= self.kv_cache_margin < 1:
            raise ConfigError(f"{where}.kv_cache_margin must be in [0, 1), got {self.kv_cache_margin}")


@dataclass
class DatasetSpec:
    """Rows through the `datasets` library (`data.source: datasets`; `hacrl.tasks.sources`): one of the paper's named
    sets, or any Hub id, local directory or data file, with how to read its question and gold answer."""

    set: str | None = None
    """A named set: math (training), math_test, math500, gsm8k, aime25, amc23, minerva, olympiadbench (`hacrl data
    prepare --list`). Read from `data.datasets_dir/<set>/<split>.jsonl` when prepared there, else from the Hub."""
    path: str | None = None
    """A Hub id (`openai/gsm8k`), a local directory, or a .parquet / .json / .jsonl / .arrow file; with `set`, a
    local copy of that set in its original columns."""
    name: str | None = None
    """The Hub dataset's config (`main` for gsm8k); None: the set's, or the default."""
    split: str | None = None
    """Split to read; None: the set's (train for math, test for the benchmarks), else `train`."""
    question_column: str | None = None
    """Column of the question; None: the set's, else `question`."""
    answer_column: str | None = None
    """Column that holds the gold answer; None: the set's, else `answer`."""
    gold: Literal["plain", "boxed", "after_hash", "first"] | None = None
    """How the gold answer is written in that column: `plain`, `boxed` (the last \\boxed{} of a worked solution),
    `after_hash` (after `####`), `first` (first entry of a list); None: the set's rule, else `plain`. A row whose
    gold answer cannot be read is skipped and counted."""
    template: str | None = None
    """The user message, with `{question}` where the question goes; None: with a named set the paper's math prompt
    (the question, then "Please reason step by step, and put your final answer within \\boxed{}."), else the
    question alone."""
    filter: dict[str, Any] = field(default_factory=dict)
    """Keep only rows whose column holds one of the listed values, e.g. `{level: [Level 4, Level 5]}`."""
    max_rows: int | None = None
    """Read at most this many usable rows (None: all)."""

    def check(self, where: str) -> None:
        if self.set is None and self.path is None:
            raise ConfigError(f"{where} names no data: set {where}.set (a named set) or {where}.path")
        if self.template is not None and "{question}" not in self.template:
            raise ConfigError(f"{where}.template must contain {{question}} where the question goes")
        if any(not isinstance(v, list) for v in self.filter.values()):
            raise ConfigError(f"{where}.filter maps a column to a list of allowed values, got {dict(self.filter)}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"{where}.max_rows must be >= 1 or null, got {self.max_rows}")


@dataclass
class DataConfig:
    """Prompts and answers (how responses are scored: `scoring`)."""

    source: Literal["reasoning_gym", "file", "datasets"] = "reasoning_gym"
    """`reasoning_gym`: a procedural task by name; `file`: local JSONL/parquet files; `datasets`: `train` and
    `eval` through the `datasets` library (the paper's named sets, a Hub id, a local directory or file)."""
    task: str = "chain_sum"
    """reasoning-gym task name (source: reasoning_gym)."""
    task_options: dict[str, Any] = field(default_factory=dict)
    """Options passed to `reasoning_gym.create_dataset` (e.g. `{min_digits: 1, max_digits: 2}`)."""
    seed: int = 0
    """Seeds the generated task data (reasoning_gym); the same for every training seed, so eval sets agree."""
    train_size: int = 10000
    """Training prompts generated (reasoning_gym); eval questions are removed from them."""
    eval_size: int = field(default=256, metadata=SAFE)
    """Held-out eval prompts (reasoning_gym), or the most taken from `eval_file`."""
    heldout_size: int = 2048
    """reasoning_gym: held-out questions generated for the eval split (its first `eval_size` are evaluated) and
    removed from the training split, so the training data do not change with `eval_size` (up to this size)."""
    train_file: str | None = None
    """JSONL or parquet file of training rows (source: file)."""
    eval_file: str | None = field(default=None, metadata=SAFE)
    """JSONL or parquet file of eval rows (source: file)."""
    prompt_column: str = "prompt"
    """Column with the prompt: a string, or a list of chat messages `{role, content}`."""
    answer_column: str = "answer"
    """Column with the reference answer."""
    system_prompt: str | None = "auto"
    """System message put before every prompt given as a plain string; null: none. `auto`: the source's own, which
    is reasoning-gym's (its `default` prompt, asking for the answer in `<answer>` tags, which its scorer reads) for
    `source: reasoning_gym` and none for files and datasets. Without it an instruct model answers in prose that
    reasoning-gym's scorer reads as its last line ("3 + 4 equals 7." against 7), so training starts on noise."""

    train: DatasetSpec | None = None
    """source: datasets: the training rows, e.g. `{set: math}` (see `DatasetSpec`)."""
    eval: DatasetSpec | None = field(default=None, metadata=SAFE)
    """source: datasets: the evaluation rows, e.g. `{set: math500}`; None: no evaluation split."""
    datasets_dir: str = "data"
    """Where `hacrl data prepare --out` wrote the named sets (`<dir>/<set>/<split>.jsonl`); a set found there is
    read from there, never from the Hub."""

    def check(self, where: str = "data") -> None:
        if self.source == "datasets":
            if self.train is None:
                raise ConfigError(f"{where}.source=datasets needs {where}.train, e.g. {{set: math}}")
            self.train.check(f"{where}.train")
            if self.eval is not None:
                self.eval.check(f"{where}.eval")
        if self.source == "file" and not self.train_file:
            raise ConfigError(f"{where}.source=file needs {where}.train_file (a .jsonl or .parquet file)")
        if self.source == "reasoning_gym" and (self.train_size < 1 or self.eval_size < 1):
            raise ConfigError(f"{where}.train_size and {where}.eval_size must be >= 1")
        if self.source == "reasoning_gym" and self.eval_size > self.heldout_size:
            raise ConfigError(
                f"{where}.eval_size={self.eval_size} exceeds {where}.heldout_size={self.heldout_size}; raise "
                f"{where}.heldout_size (this changes the training split) or lower {where}.eval_size"
            )


@dataclass
class ScoringConfig:
    """How responses are scored: which reward, and the limits that no reward function and no text can get past
    (`hacrl.driver.scoring`)."""

    builtin: Literal["auto", "reasoning_gym", "math"] = "auto"
    """Built-in scorer: `reasoning_gym` (the task's own scorer, on what the last `<answer>` tags hold, else on the
    last box, "answer:" or the last line), `math` (answer extraction + math-verify); `auto` picks by `data.source`:
    the math verifier for files and datasets; for a reasoning-gym task its own scorer, which on a task whose gold
    answers are all numbers reads an answer without tags as the last number of its final answer (not the whole last
    line: "3 + 4 equals 7." against 7). Ignored when `function` is set."""
    function: str | None = None
    """Your reward as `package.module:function` with the TRL signature f(prompts, completions, **columns),
    importable from PYTHONPATH or the working directory. Naming it in a config runs that module's code with your
    permissions: treat configs like code."""
    timeout: float = field(default=5.0, metadata=SAFE)
    """Seconds the scoring of one completion may take, for the built-in scorers and `function` alike; a completion
    past it gets `on_timeout` and its scoring process is replaced (no text can hang a run)."""
    on_timeout: float = field(default=0.0, metadata=SAFE)
    """Reward of a completion whose scoring ran past `timeout` (counted in `<agent>/reward_timeouts`)."""
    stop_on_timeout: bool = field(default=False, metadata=SAFE)
    """Stop the run with an error at the first scoring timeout instead of scoring it `on_timeout`."""
    on_hung: Literal["stop", "continue"] = field(default="stop", metadata=SAFE)
    """A `function` that is hung (past its limit on a whole slice, then on each of the first 3 completions retried
    alone, never returning): `stop` the run with a message (within about a minute at the defaults), or `continue`,
    scoring each such completion `on_timeout` (each costs its timeout). Built-in scorers always go on: a text that
    hangs them scores 0."""
    workers: int = field(default=1, metadata=SAFE)
    """Scoring processes; each scores a contiguous slice of a step's completions (the rewards do not depend on it)."""
    isolation: Literal["process", "inline"] = field(default="process", metadata=SAFE)
    """`process`: scoring runs in separate, time-limited processes; `inline`: in the training process with no
    hard time limit (for debugging a reward function with pdb)."""
    memory_mb: int | None = field(default=4096, metadata=SAFE)
    """Address-space limit of each scoring process in MiB (a hostile text cannot exhaust the machine's memory);
    null: no limit (needed when a reward function uses a GPU)."""
    max_answer_chars: int = 4096
    """Built-in scorers: an extracted answer longer than this scores 0 without being parsed."""
    start_timeout: float = field(default=300.0, metadata=SAFE)
    """Seconds a scoring process may take to import `function` (a reward model that loads at import counts here):
    the run waits for it before step 1 and stops, naming the module, when the import hangs, raises or exits."""

    def check(self, where: str = "scoring") -> None:
        if self.function is not None and ":" not in self.function:
            raise ConfigError(f"{where}.function={self.function!r} must look like 'package.module:function'")
        if not self.timeout > 0:
            raise ConfigError(f"{where}.timeout must be positive, got {self.timeout}")
        if not self.on_timeout >= 0:
            raise ConfigError(f"{where}.on_timeout must be >= 0, got {self.on_timeout}")
        if self.workers < 1:
            raise ConfigError(f"{where}.workers must be >= 1, got {self.workers}")
        if self.memory_mb is not None and self.memory_mb < 256:
            raise ConfigError(f"{where}.memory_mb must be >= 256 or null (no limit), got {self.memory_mb}")
        if self.max_answer_chars < 1:
            raise ConfigError(f"{where}.max_answer_chars must be >= 1, got {self.max_answer_chars}")
        if not self.start_timeout > 0:
            raise ConfigError(f"{where}.start_timeout must be positive, got {self.start_timeout}")


@dataclass
class TrainerConfig:
    """The loop's sizes and seed."""

    steps: int = field(default=100, metadata=SAFE)
    """Training steps; each samples `prompts_per_step` prompts x G responses per agent."""
    prompts_per_step: int = 32
    """B: prompts per training step."""
    mini_batch_size: int = 128
    """Responses per optimizer step; must divide B x G, so a learner takes (n x B x G) / this steps per training
    step in pool order (own first), which is what makes clipping and the stepwise bound act."""
    micro_batch_size: int = field(default=32, metadata=NOT_EXACT)
    """Responses per forward/backward; gradients accumulate up to the mini-batch (bounds memory)."""
    micro_batch_order: Literal["pool", "length"] = field(default="pool", metadata=NOT_EXACT)
    """Which rows of a mini-batch share a micro-batch when it takes more than one. `pool`: consecutive rows in pool
    order. `length`: the rows longest first (prompt + response, in the learner's tokens), so that each micro-batch
    is padded to about its own rows' length rather than to the longest answer among consecutive rows (answers that
    stop at EOS vary in length; one that runs to the limit pads its whole micro-batch). The gradient is the same sum
    in another order (float rounding differs); the first micro-batch is the largest, so memory runs out at once if it
    does. Measured on SmolLM2 (`benchmarks/real_trl.py`): see docs/benchmarks.md."""
    logprob_batch_size: int = field(default=64, metadata=NOT_EXACT)
    """Responses per no-grad forward of the old log-probs (and per generate call unless `rollout.batch_size`)."""
    logprob_chunk_size: int | str | None = field(default="auto", metadata=NOT_EXACT)
    """`auto`: the full logits while a batch's (rows x positions x vocabulary) float32 logits stay within 256 MiB
    (64 MiB on the CPU; tiny vocabularies: the faster path), else chunks of that many bytes / (vocabulary x 4 bytes)
    positions (441 for a 152k vocabulary, 110 on the CPU). An int: only response positions go through the output
    layer, this many at a time, recomputed in the backward pass, so memory no longer grows with vocabulary x
    positions. null: always the full logits."""
    old_logprobs: Literal["auto", "recompute", "sampler", "corrected"] = "auto"
    """Where the pre-update log-probs of an agent's own responses come from, when they are needed (rows trained
    after the learner's first optimizer step, and the log-prob sums other learners read under sharing):
    `recompute`: a teacher-forced no-grad pass over the responses after sampling (exact; what hacrl always did);
    `sampler`: the log-probs the sampler computed while drawing each token (no extra pass; equal to the recomputed
    ones up to float rounding with `hf` / `static`: <= 2e-5 per token in float32 on the CPU, larger in bf16);
    `corrected`: the sampler's are the behaviour policy's (what the tokens were drawn from: vLLM's kernels, its
    top-p), the learner's own pass the proximal ones, and each own row is weighted by the truncated behaviour ratio
    min(exp(l_prox - l_behav), `algorithm.behaviour_cap`) (AReaL's decoupled objective, TRL's
    `vllm_importance_sampling_correction` at sequence level); the sums other learners read are the sampler's, the
    policy that really drew the answer. Logged: `<agent>/sampler_logp_gap` (mean |difference| a token where both
    are known), `<agent>/behaviour_weight_mean`, `<agent>/behaviour_capped_frac`;
    `auto`: `corrected` for an agent sampled by vLLM (not with grpo), else `recompute` (docs/gpu.md, "The
    sampler-learner mismatch"). Rows of the first optimizer step use the training forward's own (ratio exactly 1)."""
    lag: int = 0
    """k: the rollouts of step t + k are sampled while step t's update runs (a fixed-lag pipeline, docs/design.md
    "The fixed-lag pipeline"). Batch s is always sampled by the weights after update s - 1 - k (the first k + 1
    batches by the starting weights), so which weights sample which batch, and what each update trains on, depend on
    the step number only: a run repeats bit for bit and resumes exactly (the k sampled-but-untrained batches are in
    every checkpoint). An own row is then off-policy by k updates: clipped around the weights its update starts
    from and weighted by the truncated behaviour ratio (`algorithm.behaviour_cap`); foreign rows are unchanged.
    0: sample, then learn, every step (the paper's loop). Not with grpo."""
    seed: int = 0
    """Seeds sampling, prompt order, new LoRA adapters and sampled evaluation (not the starting agents); every
    stream is derived from it in `hacrl.seeds`."""
    output_dir: str = field(default="runs/hacrl", metadata=SAFE)
    """Run directory: config.yaml, metrics.jsonl, eval/ (per-prompt evaluation records), TensorBoard events,
    checkpoints/, plots."""

    def check(self, where: str = "trainer") -> None:
        if self.steps < 0 or self.prompts_per_step < 1:
            raise ConfigError(
                f"{where}.steps must be >= 0 and {where}.prompts_per_step >= 1, got {self.steps}, "
                f"{self.prompts_per_step}"
            )
        if self.micro_batch_size < 1 or self.mini_batch_size % self.micro_batch_size:
            raise ConfigError(
                f"{where}.micro_batch_size={self.micro_batch_size} must divide "
                f"{where}.mini_batch_size={self.mini_batch_size}"
            )
        if self.logprob_batch_size < 1:
            raise ConfigError(f"{where}.logprob_batch_size must be >= 1, got {self.logprob_batch_size}")
        if isinstance(self.lag, bool) or not isinstance(self.lag, int) or not 0 <= self.lag <= 16:
            raise ConfigError(
                f"{where}.lag must be an integer in [0, 16] (0: sample then learn; k: batch t + k is sampled during "
                f"update t), got {self.lag!r}"
            )
        if self.lag > self.steps:
            raise ConfigError(
                f"{where}.lag={self.lag} samples {self.lag} batches ahead of a {self.steps}-step run: "
                f"{self.lag + self.steps} batches sampled, {self.steps} trained on. Set {where}.lag <= "
                f"{where}.steps (batches sampled ahead of the last step are kept in its checkpoint, for a resume with "
                "more steps)"
            )
        chunk = self.logprob_chunk_size
        if (
            chunk is not None
            and chunk != "auto"
            and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1)
        ):
            raise ConfigError(f"{where}.logprob_chunk_size must be auto, an integer >= 1 or null, got {chunk!r}")
        if isinstance(self.seed, bool) or not 0 <= self.seed < 2**40:
            raise ConfigError(
                f"{where}.seed must be an integer in [0, 2**40) (its streams are derived in hacrl.seeds), got "
                f"{self.seed!r}"
            )


@dataclass
class EvalConfig:
    """Evaluation of each agent alone on the eval split."""

    RESUME: ClassVar[dict] = SAFE

    every: int = 0
    """Evaluate every this many steps (0: only before training and at the end)."""
    at_start: bool = True
    """Evaluate before the first step, so curves start at the initial accuracy."""
    max_prompts: int | None = None
    """Evaluate on at most this many eval prompts; None: all of them."""
    num_samples: int = 0
    """k for sampled avg@k at `rollout.temperature` (0: greedy pass@1 only)."""
    batch_size: int = 64
    """Prompts per generation batch during evaluation."""
    save_completions: bool = True
    """Write each evaluation's greedy completions and rewards, one line per prompt with every agent's, to
    `<output_dir>/eval/step_NNNNNN.jsonl` (for reading what the agents answer, and for paired comparisons)."""
    benchmarks: list[str] = field(default_factory=list)
    """Named sets to evaluate every agent on at each evaluation, beside the eval split (e.g. `[math500, gsm8k,
    aime25]`; `hacrl data list`): greedy pass@1, and avg@k / pass@k with `num_samples` = k, per benchmark, logged as
    `eval/<agent>/<benchmark>/...`, with a table in `<output_dir>/eval/benchmarks/` (markdown and JSON) and the
    per-prompt records in `eval/<benchmark>/`. At most `max_prompts` prompts each; scored by the math verifier."""

    def check(self, where: str = "eval") -> None:
        if self.benchmarks:
            from hacrl.named_sets import not_named

            problem = not_named(self.benchmarks)
            if problem:
                raise ConfigError(f"{where}.benchmarks: {problem}")
        if self.every < 0 or self.num_samples < 0 or self.batch_size < 1:
            raise ConfigError(f"{where}.every and {where}.num_samples must be >= 0, {where}.batch_size >= 1")
        if self.max_prompts is not None and self.max_prompts < 1:
            raise ConfigError(f"{where}.max_prompts must be >= 1 or null (all eval prompts), got {self.max_prompts}")


@dataclass
class WandbConfig:
    """Weights & Biases (`pip install "hacrl[wandb]"`): every metric of every step, the resolved config, the run
    directory. A resumed run continues the same W&B run (its id is derived from the run directory)."""

    project: str = "hacrl"
    """W&B project."""
    entity: str | None = None
    """W&B entity (team or user); None: your default."""
    name: str | None = None
    """Run name; None: the run directory's name."""
    mode: Literal["online", "offline", "disabled"] = "online"
    """`offline` writes under `<output_dir>/wandb` without a network (`wandb sync` uploads it later)."""


@dataclass
class TrackioConfig:
    """trackio (`pip install "hacrl[trackio]"`), local-first: every metric of every step and the resolved config,
    in trackio's local store (TRACKIO_DIR) or a Space; `trackio show` draws them."""

    project: str = "hacrl"
    """trackio project."""
    name: str | None = None
    """Run name; None: the run directory's name."""
    space_id: str | None = None
    """A Hugging Face Space to log to; None: local only."""


@dataclass
class LoggingConfig:
    """Where metrics go."""

    RESUME: ClassVar[dict] = SAFE

    console: bool = True
    """Rich progress bar and a per-step summary line."""
    jsonl: bool = True
    """`metrics.jsonl` in the run directory, one JSON object per step."""
    tensorboard: bool = True
    """TensorBoard event files in `<output_dir>/tensorboard`."""
    wandb: WandbConfig | None = None
    """Also log to Weights & Biases, e.g. `{project: my-runs, mode: offline}` (see `WandbConfig`)."""
    trackio: TrackioConfig | None = None
    """Also log to trackio, e.g. `{project: my-runs}` (see `TrackioConfig`)."""

    def check(self, where: str = "logging") -> None:
        import importlib.util

        for key, module in (("wandb", "wandb"), ("trackio", "trackio")):
            if getattr(self, key) is not None and importlib.util.find_spec(module) is None:
                raise ConfigError(
                    f'{where}.{key} needs {module}, an optional extra: pip install "hacrl[{key}]" (or pip install '
                    f"{module}), or remove {where}.{key}"
                )


@dataclass
class CheckpointConfig:
    """Checkpoints: each agent as a Hugging Face model directory, plus everything needed to resume."""

    RESUME: ClassVar[dict] = SAFE

    every: int = 0
    """Save every this many steps (0: only at the end)."""
    keep_last: int = 2
    """Keep the newest this many step checkpoints (older ones are deleted after a new one is complete)."""
    resume: str = "never"
    """`never`, `auto` (the newest good checkpoint in `output_dir`; a run that stopped before its first checkpoint
    starts again from step 0) or a checkpoint directory."""
    strict_resume: bool = True
    """Refuse to resume when a setting that changes the training numbers differs from the checkpoint's run
    (false: resume anyway, with a warning naming each change)."""
    verify_digests: bool = True
    """Check every checkpoint file against the SHA-256 recorded when it was written before resuming from it (reads
    the whole checkpoint once; sizes and headers are always checked)."""

    def check(self, where: str = "checkpoint") -> None:
        if self.every < 0 or self.keep_last < 1:
            raise ConfigError(f"{where}.every must be >= 0 and {where}.keep_last >= 1")


@dataclass
class RayConfig:
    """How to reach Ray (runtime.backend=ray)."""

    RESUME: ClassVar[dict] = SAFE

    address: str | None = None
    """None: start a Ray instance on this machine for the run; `auto` or `host:port`: join a running cluster
    (`ray start --head`), which the run leaves running."""
    group_strategy: Literal["STRICT_PACK", "PACK", "SPREAD"] = "STRICT_PACK"
    """How the K rank actors of an agent on several devices (`agents.<i>.devices`) are placed (a Ray placement
    group of K bundles): `STRICT_PACK` all on one node (the default: NCCL inside one node); `PACK` or `SPREAD`
    across nodes when one node has too few GPUs."""


@dataclass
class DeadlineConfig:
    """How long a call to a worker process (a rank of a worker group, a sampler of its own, a Ray actor) may go
    unanswered before the worker is called stuck, killed, and the run stopped naming it (resumable with `--resume`).
    A call's deadline: `first_call` seconds while no call of its kind (method, agent and role) has answered yet,
    then `factor` x the slowest answer of its kind so far, at least `minimum` seconds. Workers in the driver's own
    process (the local backend's one-device agents) have none: the driver is the worker."""

    RESUME: ClassVar[dict] = SAFE

    first_call: float = 3600.0
    """Seconds for a call whose kind has not answered yet (the start, which loads the model, and each kind's first
    call, which may compile or warm up)."""
    factor: float = 10.0
    """A later call may take this many times the slowest answer of its kind so far."""
    minimum: float = 300.0
    """...and never less than this many seconds."""

    LONGEST: ClassVar[float] = 1e6
    """The longest deadline, in seconds (11.6 days): the operating system's waits take no more than ~2.1e6 s, so a
    longer one failed at the first call instead of waiting."""

    def check(self, where: str = "runtime.deadline") -> None:
        for key in ("first_call", "factor", "minimum"):
            value = getattr(self, key)
            if not value > 0:
                raise ConfigError(f"{where}.{key} must be positive, got {value}")
        for key in ("first_call", "minimum"):
            if getattr(self, key) > self.LONGEST:
                raise ConfigError(f"{where}.{key} is {getattr(self, key):g} s, over the longest deadline hacrl can "
                                  f"wait ({self.LONGEST:g} s, 11.6 days): set it to at most {self.LONGEST:g} for a "
                                  "deadline that never comes in practice")  # fmt: skip
        if self.factor < 1:
            raise ConfigError(f"{where}.factor must be >= 1 (a call may take as long as its kind did): {self.factor}")


@dataclass
class RuntimeConfig:
    """Where the agent workers run."""

    backend: Literal["local", "ray"] = field(default="local", metadata=SAFE)
    """`local`: every agent in this process, one after the other (no setup); `ray`: every agent a Ray actor
    (`pip install "hacrl[ray]"`), sampling and learning at the same time as the others."""
    torch_threads: int | None = field(default=None, metadata=NOT_EXACT)
    """torch intra-op threads in each worker's process; None: the process's default (local: this process's; a Ray
    actor: its num_cpus). Set it to compare backends bit for bit (the thread count changes float sums)."""
    host_memory: Literal["keep", "release", "mimalloc"] = field(default="keep", metadata=SAFE)
    """What a worker's process does with host memory it frees (glibc on Linux; elsewhere nothing changes). `keep`:
    glibc's default, which keeps freed activations in its heap and reuses them (the fastest); `release`: every
    allocation of 1 MiB or more is mapped on its own and given back to the system when freed, so the resident memory
    follows what is in use, at the price of the kernel's work on every fresh mapping (torch's large tensors then ask
    for huge pages to cut it). Measured on SmolLM2 (`benchmarks/results/real_trl_release.md`, a step of 64 answers on
    2 cores, gradient checkpointing on): peak RSS 3948 -> 3005 MiB, the step 81 -> 99 s (1.22x). For a host that
    would otherwise run out of memory. `mimalloc` (Linux; `pip install "hacrl[mimalloc]"`, or `hacrl[gguf]`):
    every worker's process runs on Microsoft's mimalloc allocator, which reuses freed memory without fragmenting and
    gives unused pages back to the system (`hacrl train` and `hacrl plan --measure` restart themselves with it
    preloaded; `hacrl.agent.allocator`): on SmolLM2 peak RSS 3854 -> 3238 MiB at 0.99x keep's step
    (`benchmarks/results/real_trl_mimalloc.md`; `configs/real.yaml` runs on it). The numbers are the same with
    every setting."""
    ray: RayConfig = field(default_factory=RayConfig)
    deadline: DeadlineConfig = field(default_factory=DeadlineConfig)

    def check(self, where: str = "runtime") -> None:
        self.deadline.check(f"{where}.deadline")
        if self.backend == "ray":
            import importlib.util

            if importlib.util.find_spec("ray") is None:
                raise ConfigError(
                    f'{where}.backend=ray needs Ray, an optional extra: pip install "hacrl[ray]" (or use '
                    f"{where}.backend=local, the default)"
                )
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ConfigError(f"{where}.torch_threads must be >= 1 or null, got {self.torch_threads}")


@dataclass
class TrainConfig:
    """Root of the config tree."""

    agents: list[AgentConfig] = field(default_factory=list)
    """One entry per agent (N >= 1); they may differ in size, architecture and tokenizer."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    data: DataConfig = field(default_factory=DataConfig)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)


GROUPS = (
    "agents",
    "algorithm",
    "sharing",
    "rollout",
    "data",
    "scoring",
    "trainer",
    "eval",
    "logging",
    "checkpoint",
    "runtime",
)
