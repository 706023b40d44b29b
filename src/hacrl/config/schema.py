"""The config tree's schema: one dataclass per group, each field with its default, its docstring (`hacrl train
--help-config`) and, where a resumed run may change it, its resume policy (SAFE / NOT_EXACT, read by
`hacrl.driver.resume`); each group's `check` validates its own fields (checks across groups: `hacrl.config.validation`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar, Literal

from hacrl.config.agent import AgentConfig
from hacrl.config.data import DataConfig, ScoringConfig
from hacrl.config.marks import NOT_EXACT, SAFE
from hacrl.core.params import AlgorithmParams
from hacrl.errors import ConfigError


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
    mini_batch_layout: Literal["blocks", "mixed"] = "blocks"
    """Which rows of a learner's pool share an optimizer step. `blocks`: consecutive mini-batches in pool order, so
    its own rows train first and each other agent's rows in steps of their own (an agent's rows are a whole number
    of mini-batches), and foreign rows meet only the later stepwise bounds; what the paper's code does on one GPU.
    `mixed`: as many steps, each holding the same share of every source's rows (own, then each other agent's, in
    pool order inside the step), as the authors' 8-GPU runs compose them (verl splits the pool over its ranks before
    mini-batching, and each step gathers every rank's); foreign rows then meet every bound, and no step is foreign
    only. Equal to `blocks` with one agent or without sharing. docs/design.md, "Mini-batch layout"."""
    zero_grad_step: Literal["take", "skip"] = "take"
    """What a mini-batch whose gradient is exactly zero does (every row clipped out of HACPO's window, or every
    advantage zero: a foreign-only mini-batch when the window holds back every foreign row). `take`: the optimizer
    steps anyway, as the paper's code does, and AdamW moves the weights along its momentum alone (on the real bed that
    cost the partner as much as sharing gained, analysis.md); `skip`: no step, the optimizer's state and the weights
    untouched, counted in `<agent>/zero_grad_skipped`."""
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
    preloaded; `hacrl.agent.host_memory`): on SmolLM2 peak RSS 3854 -> 3238 MiB at 0.99x keep's step
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
