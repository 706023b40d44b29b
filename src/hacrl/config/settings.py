"""Each agent's effective settings, resolved once: its own entry where it sets one, else the run-wide group.

`AgentSettings.resolve(agent, rollout)` is the only place where `agents.<i>.temperature` falls back to
`rollout.temperature` (and so on for every field below); the agent, its worker, the memory plan, the config's
checks and the samplers all read the record it returns (a sampler through `SamplingAgent.settings`).
`Precision.resolve(agent, role=...)` is the only place where an agent's dtype, master weights, offload, LoRA, frozen and
devices settings become a mode (what it computes in, what AdamW steps, where the step runs), for each of its roles:
the learner, and a sampler of its own. `Placement.resolve(agent)` is the only place where its devices become
processes (its worker or worker group, its sampler), the weight link between them and what each asks of Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hacrl.errors import ConfigError

if TYPE_CHECKING:  # the config's classes check themselves through this module: no import back at run time
    from hacrl.config.agent import AgentConfig
    from hacrl.config.schema import RolloutConfig

Role = Literal["learner", "sampler"]
"""What a process does with an agent: learn (and sample, without a sampler of its own), or sample for its learner
(`agents.<i>.sampler_devices`: its compute-dtype weights, nothing stepped)."""


OldLogprobs = Literal["recompute", "sampler", "corrected"]


def old_logprobs_of(setting: str, sampler: str, takes_stale_rows: bool) -> OldLogprobs:
    """Where one agent's pre-update log-probs come from (`trainer.old_logprobs`): `auto` is `corrected` for an agent
    that samples with vLLM, whose reported log-probs are its own kernels' (in bfloat16 on the real model they differ
    from the learner's by 0.04 a token on average: benchmarks/results/sampler_mismatch.md), when its algorithm can
    weight a row by its behaviour ratio (not grpo), and `recompute` otherwise (the `hf` and `static` samplers compute
    with the learner's own module: their log-probs are the learner's up to float rounding)."""
    if setting != "auto":
        return setting  # type: ignore[return-value]
    return "corrected" if sampler == "vllm" and takes_stale_rows else "recompute"


@dataclass(frozen=True)
class AgentSettings:
    """What one agent samples with."""

    temperature: float
    """T: sampling temperature, and the temperature of every log-prob of its tokens (logits / T)."""
    top_p: float
    """Nucleus threshold (1.0: off)."""
    max_new_tokens: int
    """Response length limit in its own tokens (foreign responses are cut to it too)."""
    max_prompt_tokens: int
    """Prompt length limit in its own tokens (cut from the left)."""
    group_size: int
    """Answers it samples per prompt (its rollout budget)."""
    sampler: Literal["hf", "static", "vllm"]
    """The sampler's name (`hacrl.agent.samplers`)."""
    rows_per_call: int | Literal["auto"]
    """Rows decoded together: a number, or `auto` (the static sampler sizes its KV pool to the device; `hf`: every
    row of the call, as long as their worst-case cache fits in 4 GiB, and at least 64). Unset in the config:
    `auto`."""
    kv_cache_margin: float
    """With `rows_per_call: auto` on a GPU: the fraction of the device kept free beside the KV pool."""
    cuda_graphs: bool
    """The static sampler captures its decode step as a CUDA graph."""

    @property
    def max_tokens(self) -> int:
        """Prompt limit + response limit: the positions a prompt and its response can take."""
        return self.max_prompt_tokens + self.max_new_tokens

    @classmethod
    def resolve(cls, agent: AgentConfig, rollout: RolloutConfig) -> AgentSettings:
        sampler = agent.rollout_backend or rollout.backend
        rows = rollout.batch_size
        if rows is None:
            rows = "auto"
        return cls(
            temperature=agent.temperature if agent.temperature is not None else rollout.temperature,
            top_p=agent.top_p if agent.top_p is not None else rollout.top_p,
            max_new_tokens=agent.max_new_tokens or rollout.max_new_tokens,
            max_prompt_tokens=agent.max_prompt_tokens or rollout.max_prompt_tokens,
            group_size=agent.group_size or rollout.group_size,
            sampler=sampler,
            rows_per_call=rows,
            kv_cache_margin=rollout.kv_cache_margin,
            cuda_graphs=rollout.cuda_graphs,
        )


@dataclass(frozen=True)
class Precision:
    """How one agent computes and how its weights are stepped, decided here once from its config
    (`Precision.resolve`); the agent, its worker (one device or a sharded group), `hacrl plan` and the config's
    checks read this record, and no class rewrites a config to steer another.

        mode      compute   loads     AdamW steps   masters         offload: optimizer keeps on the host
        frozen    dtype     dtype     nothing       -               (not allowed)
        float32   float32   float32   parameters    -               (not allowed)
        pure      dtype     dtype     parameters    -               (not allowed)  master_weights: none
        masters   dtype     float32   masters       float32, 1 dev  masters, AdamW state (and the step)
        lora      dtype     dtype     adapters      -               (not allowed)  peft keeps adapters in float32
        sharded   dtype     float32   shards        float32 shards  shards, their gradients, AdamW state (FSDP2's
                                                                    CPUOffloadPolicy: each layer copied in to compute)
    """

    mode: Literal["frozen", "float32", "pure", "masters", "lora", "sharded"]
    compute: str
    """The dtype forward, backward, sampling and log-probs read (`agents.<i>.dtype`)."""
    load: str
    """The dtype the trained module loads in: float32 where it becomes masters or master shards."""
    trains: Literal["nothing", "parameters", "adapters", "masters", "shards"]
    """What AdamW steps: nothing (frozen), the model's parameters, LoRA adapters, float32 masters of the compute
    weights (`hacrl.agent.precision.MasterStep`), or FSDP2's float32 shards (`hacrl.agent.learning`)."""
    steps_on: Literal["none", "device", "host"]
    """Where AdamW's state lives and its step runs (`host`: `offload: optimizer`)."""
    on_host: tuple[str, ...]
    """What `offload: optimizer` keeps in host memory (empty: nothing)."""
    sampling_copy: Literal["none", "merged", "gathered"]
    """What the sampler decodes with: the trained module itself (`none`), a copy of the base with the LoRA deltas
    merged in (`lora.merge_for_sampling`), or a whole compute-dtype copy gathered from the shards."""

    @property
    def float32_masters(self) -> bool:
        """AdamW steps float32 copies of lower-precision (or sharded) compute weights: the checkpoint holds them."""
        return self.trains in ("masters", "shards")

    @property
    def trained_bytes(self) -> int | None:
        """Bytes per element of what AdamW steps (its gradients and both moments have the same); None: the
        compute dtype's."""
        return 4 if self.trains in ("adapters", "masters", "shards") else None

    def describe(self) -> str:
        """One line for `hacrl plan`: e.g. `bfloat16 + fp32 masters, offloaded`."""
        offloaded = ", offloaded" if self.on_host else ""
        return {
            "frozen": f"{self.compute} (frozen)",
            "float32": "float32",
            "pure": f"{self.compute}, pure",
            "masters": f"{self.compute} + fp32 masters{offloaded}",
            "lora": f"LoRA, {self.compute} base",
            "sharded": f"{self.compute}" + (" + fp32 masters" if self.compute != "float32" else "") + offloaded,
        }[self.mode]

    @classmethod
    def resolve(cls, agent: AgentConfig, where: str = "agent", role: Role = "learner") -> Precision:
        """The precision of `agent` in `role`; a combination that cannot train is a ConfigError naming `where`'s
        keys."""
        if role == "sampler":
            return cls.of_sampler(agent)
        dtype, offload = agent.dtype, agent.offload == "optimizer"
        if not agent.frozen and dtype == "float16":
            raise ConfigError(
                f"{where}.dtype=float16 cannot train: float16 gradients underflow without loss scaling, which hacrl "
                f"does not do. Use {where}.dtype=bfloat16 (the same memory, float32's range; float32 master weights "
                "by default) or float32; float16 is for frozen agents (sampling only)"
            )
        if agent.frozen:
            mode = "frozen"
        elif agent.lora is not None:
            mode = "lora"
        elif agent.devices:
            mode = "sharded"
        elif dtype == "float32":
            mode = "float32"
        else:
            mode = "masters" if agent.master_weights == "float32" else "pure"
        if offload and mode not in ("masters", "sharded"):
            raise ConfigError(
                f"{where}.offload=optimizer moves float32 master weights and their AdamW state to the host, which only "
                f"a fully trained bfloat16 agent with {where}.master_weights=float32 (or one sharded over "
                f"{where}.devices) has (this one: dtype {dtype}, master_weights {agent.master_weights}"
                + (", LoRA" if agent.lora is not None else "")
                + (", frozen" if agent.frozen else "")
                + f"); set {where}.offload=none"
            )
        trains = {"frozen": "nothing", "lora": "adapters", "masters": "masters", "sharded": "shards"}
        on_host = ()
        if offload:
            on_host = ("master weights", "optimizer state", *(("gradients",) if mode == "sharded" else ()))
        return cls(
            mode=mode,
            compute=dtype,
            load="float32" if mode in ("masters", "sharded") else dtype,
            trains=trains.get(mode, "parameters"),
            steps_on="none" if mode == "frozen" else "host" if offload else "device",
            on_host=on_host,
            sampling_copy="gathered"
            if mode == "sharded"
            else "merged"
            if mode == "lora" and agent.lora.merge_for_sampling
            else "none",  # fmt: skip
        )

    @classmethod
    def of_sampler(cls, agent: AgentConfig) -> Precision:
        """The precision of `agent`'s sampler of its own: the learner's compute dtype, nothing stepped (so nothing
        offloaded, whatever `offload` says: it has no optimizer), one device (a worker group's sampler holds the
        whole model); a LoRA agent's keeps its adapters (taken from the learner after each update, so its log-probs
        are the learner's) and merges them for sampling as its learner does."""
        lora = agent.lora is not None and not agent.frozen
        return cls(
            mode="lora" if lora else "frozen",
            compute=agent.dtype,
            load=agent.dtype,
            trains="nothing",
            steps_on="none",
            on_host=(),
            sampling_copy="merged" if lora and agent.lora.merge_for_sampling else "none",
        )


@dataclass(frozen=True)
class Placement:
    """Where one agent's roles run, decided here once from its config (`Placement.resolve`): the processes, the
    weight link between its learner and a sampler of its own, and what each process asks of Ray. The backends, the
    workers and `hacrl plan` read this record; nothing rewrites the agent's config to describe its sampler.

        agents.<i>          learner                         sampler                  weight link
        device              one worker on `device`          -                        none
        devices             a worker group, a rank each     -                        none
        + sampler_devices   as above                        one process, one device  host, or broadcast
    """

    devices: tuple[str, ...]
    """The learner's devices: one worker's, or a worker group's ranks in rank order (`agents.<i>.devices`)."""
    group: bool
    """Whether the learner is a worker group of rank processes (`agents.<i>.devices` set, even to one device)."""
    sampler_device: str | None
    """The device of its sampler of its own (`agents.<i>.sampler_devices`); None: the learner samples."""
    weight_link: Literal["none", "host", "broadcast"]
    """How the learner hands its sampler the weights after each update (`agents.<i>.weight_sync`): through host
    memory (shared memory on one machine, Ray's object store across nodes), a torch.distributed broadcast, or none
    (no sampler of its own)."""
    link_backend: Literal["gloo", "nccl"]
    """The broadcast's torch.distributed backend: NCCL when the learner and its sampler are all on CUDA devices."""
    num_cpus: float
    """CPUs each of its processes asks of Ray (`agents.<i>.num_cpus`)."""
    num_gpus: float
    """GPUs (fractions allowed) each of its processes asks of Ray (`agents.<i>.num_gpus`)."""

    @property
    def ranks(self) -> int:
        """K: the processes of its learner (1: one worker)."""
        return len(self.devices)

    @property
    def processes(self) -> int:
        """Its processes in all: the learner's ranks, and its sampler's."""
        return self.ranks + (self.sampler_device is not None)

    @property
    def broadcasts(self) -> bool:
        return self.weight_link == "broadcast"

    def device(self, role: Role, rank: int = 0) -> str:
        """The device of `role`'s process (rank `rank` of a worker group)."""
        return self.sampler_device if role == "sampler" else self.devices[rank]

    def resources(self) -> dict[str, float]:
        """What one of its processes asks of Ray."""
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}

    @classmethod
    def resolve(cls, agent: AgentConfig) -> Placement:
        devices = tuple(agent.devices) if agent.devices else (agent.device,)
        sampler = agent.sampler_devices[0] if agent.sampler_devices else None
        on_cuda = all(d.startswith("cuda") for d in [*devices, sampler or "cpu"])
        if sampler is None:
            link = "none"
        elif agent.weight_sync != "auto":
            link = agent.weight_sync
        else:
            link = "broadcast" if on_cuda else "host"
        return cls(
            devices=devices,
            group=agent.devices is not None,
            sampler_device=sampler,
            weight_link=link,
            link_backend="nccl" if on_cuda else "gloo",
            num_cpus=agent.num_cpus,
            num_gpus=agent.num_gpus,
        )
