"""The one config tree of a hacrl run: defaults here < YAML file < dotted `key=value` overrides.

Every field has a default and a docstring (shown by `hacrl train --help`). `load_config` rejects unknown keys
(with a suggestion), wrong types and inconsistent settings before any model loads, with a message that names the
key and says what to set. The resolved config is saved in the run directory as `config.yaml`.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

from hacrl.core.params import AlgorithmParams
from hacrl.errors import ConfigError

__all__ = ["ConfigError", "TrainConfig", "load_config", "resume_differences", "validate"]


@dataclass
class AgentConfig:
    """One agent: a Hugging Face causal LM directory with its tokenizer and chat template."""

    name: str = "???"
    """Unique name; metrics are namespaced by it (`<name>/reward_mean`) and checkpoints use it as folder name."""
    model: str = "???"
    """Local directory of the model (config.json + weights). Never downloaded at run time."""
    tokenizer: str | None = None
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
    """Parameter dtype; float32 on CPU, bfloat16 on GPU when asked."""
    device: str = "cpu"
    """torch device of this agent: `cpu`, `cuda`, `cuda:1`, ..."""
    temperature: float | None = None
    """Sampling temperature for this agent; None: `rollout.temperature`."""
    top_p: float | None = None
    """Nucleus sampling threshold for this agent; None: `rollout.top_p`."""
    max_new_tokens: int | None = None
    """Response length limit for this agent, in its own tokens; None: `rollout.max_new_tokens`."""
    max_prompt_tokens: int | None = None
    """Prompt length limit for this agent (prompts are cut from the left); None: `rollout.max_prompt_tokens`."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra variables for this agent's chat template, e.g. `{enable_thinking: false}` for Qwen3."""
    rollout_backend: Literal["hf", "static"] | None = None
    """This agent's sampler; None: `rollout.backend`."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass instead of keeping them (less memory, ~30 % more
    compute in the update); for long responses on a GPU."""
    num_cpus: float = 1.0
    """runtime.backend=ray: CPUs this agent's worker asks Ray for (fractions allowed)."""
    num_gpus: float = 0.0
    """runtime.backend=ray: GPUs this agent's worker asks Ray for; 0.5 lets two agents share one GPU. Set
    `device: cuda` with it (Ray makes the assigned GPU the worker's first visible one)."""


@dataclass
class AlgorithmConfig(AlgorithmParams):
    """Which algorithm, and every hyper-parameter of the spec with the paper's defaults."""

    name: Literal["grpo", "gspo", "naive", "hacpo"] = "hacpo"
    """Registered algorithm: grpo, gspo (no sharing), naive (shared, plain pooled), hacpo."""
    capability_window: int = 5
    """K: capability is the mean of the last K per-step mean rewards (spec 3.1)."""
    capability_warmup_steps: int = 0
    """While the tracker has seen no more steps than this, all capability ratios are 1 (spec 3.1)."""

    def params(self) -> AlgorithmParams:
        """The core's view: only the fields the advantage and loss functions read."""
        return AlgorithmParams(**{f.name: getattr(self, f.name) for f in fields(AlgorithmParams)})


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
    backend: Literal["hf", "static"] = "hf"
    """Sampler: `hf` (transformers' generate, the CPU default) or `static` (preallocated KV cache, fixed-shape
    decode step, sampling on the device, finished rows dropped; the fast path on a GPU)."""
    batch_size: int | str | None = None
    """Rows per generation call. `auto`: the `static` sampler sizes its KV pool to the device (on a GPU: the rows,
    a power of two, whose pool fits in the free memory after the model, its optimizer state and gradients, and
    `kv_cache_margin` of the card; `hacrl.samplers.static.auto_rows`), 64 elsewhere. None (default):
    `auto` with the `static` sampler, `trainer.logprob_batch_size` with `hf`."""
    kv_cache_margin: float = 0.35
    """`batch_size: auto`: the fraction of the device's total memory left free beside the KV pool (the update's
    activations, log-prob chunks, the allocator's slack)."""
    cuda_graphs: bool = False
    """`static` sampler: capture the decode step as a CUDA graph (torch.compile, mode reduce-overhead); GPU only."""


@dataclass
class DataConfig:
    """Prompts, answers and how responses are scored."""

    source: Literal["reasoning_gym", "file"] = "reasoning_gym"
    """`reasoning_gym`: a procedural task by name; `file`: local JSONL/parquet files."""
    task: str = "chain_sum"
    """reasoning-gym task name (source: reasoning_gym)."""
    task_options: dict[str, Any] = field(default_factory=dict)
    """Options passed to `reasoning_gym.create_dataset` (e.g. `{min_digits: 1, max_digits: 2}`)."""
    seed: int = 0
    """Seeds the generated task data (reasoning_gym); the same for every training seed, so eval sets agree."""
    train_size: int = 10000
    """Training prompts generated (reasoning_gym); eval questions are removed from them."""
    eval_size: int = 256
    """Held-out eval prompts (reasoning_gym), or the most taken from `eval_file`."""
    heldout_size: int = 2048
    """reasoning_gym: held-out questions generated for the eval split (its first `eval_size` are evaluated) and
    removed from the training split, so the training data do not change with `eval_size` (up to this size)."""
    train_file: str | None = None
    """JSONL or parquet file of training rows (source: file)."""
    eval_file: str | None = None
    """JSONL or parquet file of eval rows (source: file)."""
    prompt_column: str = "prompt"
    """Column with the prompt: a string, or a list of chat messages `{role, content}`."""
    answer_column: str = "answer"
    """Column with the reference answer."""
    system_prompt: str | None = None
    """System message put before every prompt given as a plain string."""
    reward: Literal["auto", "reasoning_gym", "math"] = "auto"
    """Built-in scorer: `reasoning_gym` (the task's own scorer), `math` (answer extraction + math-verify); `auto`
    picks by `source`. Ignored when `reward_function` is set."""
    reward_function: str | None = None
    """Your reward as `package.module:function` with the TRL signature f(prompts, completions, **columns),
    importable from PYTHONPATH or the working directory. Naming it in a config runs that module's code with your
    permissions: treat configs like code."""
    reward_timeout: float = 5.0
    """Seconds the scoring of one completion may take, for the built-in scorers and `reward_function` alike; a
    completion past it gets `reward_on_timeout` and its scoring process is replaced (no text can hang a run)."""
    reward_on_timeout: float = 0.0
    """Reward of a completion whose scoring ran past `reward_timeout` (counted in `<agent>/reward_timeouts`)."""
    stop_on_reward_timeout: bool = False
    """Stop the run with an error at the first scoring timeout instead of scoring it `reward_on_timeout`."""
    reward_on_hung: Literal["stop", "continue"] = "stop"
    """A `reward_function` that is hung (past its limit on a whole slice, then on each of the first 3 completions
    retried alone, never returning): `stop` the run with a message (within about a minute at the defaults), or
    `continue`, scoring each such completion `reward_on_timeout` (each costs its timeout). Built-in scorers always
    go on: a text that hangs them scores 0."""
    reward_workers: int = 1
    """Scoring processes; each scores a contiguous slice of a step's completions (the rewards do not depend on it)."""
    reward_isolation: Literal["process", "inline"] = "process"
    """`process`: scoring runs in separate, time-limited processes; `inline`: in the training process with no
    hard time limit (for debugging a reward function with pdb)."""
    reward_memory_mb: int | None = 4096
    """Address-space limit of each scoring process in MiB (a hostile text cannot exhaust the machine's memory);
    null: no limit (needed when a reward function uses a GPU)."""
    max_answer_chars: int = 4096
    """Built-in scorers: an extracted answer longer than this scores 0 without being parsed."""


@dataclass
class TrainerConfig:
    """The loop's sizes and seed."""

    steps: int = 100
    """Training steps; each samples `prompts_per_step` prompts x G responses per agent."""
    prompts_per_step: int = 32
    """B: prompts per training step."""
    mini_batch_size: int = 128
    """Responses per optimizer step; must divide B x G, so a learner takes (n x B x G) / this steps per training
    step in pool order (own first), which is what makes clipping and the stepwise bound act."""
    micro_batch_size: int = 32
    """Responses per forward/backward; gradients accumulate up to the mini-batch (bounds memory)."""
    logprob_batch_size: int = 64
    """Responses per no-grad forward of the old log-probs (and per generate call unless `rollout.batch_size`)."""
    logprob_chunk_size: int | str | None = "auto"
    """`auto`: the full logits while a batch's (rows x positions x vocabulary) float32 logits stay within 256 MiB
    (tiny vocabularies: the faster path), else chunks of 256 MiB / (vocabulary x 4 bytes) positions (441 for a
    152k vocabulary). An int: only response positions go through the output layer, this many at a time,
    recomputed in the backward pass, so memory no longer grows with vocabulary x positions. null: always the full
    logits."""
    old_logprobs: str = "recompute"
    """Where the pre-update log-probs of an agent's own responses come from, when they are needed (rows trained
    after the learner's first optimizer step, and the log-prob sums other learners read under sharing):
    `recompute`: a teacher-forced no-grad pass over the responses after sampling (exact; what hacrl always did);
    `sampler`: the log-probs the sampler computed while drawing each token (no extra pass; equal to the recomputed
    ones up to float rounding: <= 2e-5 per token in float32 on the CPU, larger in bf16: measure before relying on
    it). Rows of the first optimizer step always use the training forward's own (ratio exactly 1)."""
    seed: int = 0
    """Seeds sampling and prompt order (not the starting agents)."""
    output_dir: str = "runs/hacrl"
    """Run directory: config.yaml, metrics.jsonl, eval/ (per-prompt evaluation records), TensorBoard events,
    checkpoints/, plots."""


@dataclass
class EvalConfig:
    """Evaluation of each agent alone on the eval split."""

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


@dataclass
class LoggingConfig:
    """Where metrics go."""

    console: bool = True
    """Rich progress bar and a per-step summary line."""
    jsonl: bool = True
    """`metrics.jsonl` in the run directory, one JSON object per step."""
    tensorboard: bool = True
    """TensorBoard event files in `<output_dir>/tensorboard`."""


@dataclass
class CheckpointConfig:
    """Checkpoints: each agent as a Hugging Face model directory, plus everything needed to resume."""

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


@dataclass
class RayConfig:
    """How to reach Ray (runtime.backend=ray)."""

    address: str | None = None
    """None: start a Ray instance on this machine for the run; `auto` or `host:port`: join a running cluster
    (`ray start --head`), which the run leaves running."""


@dataclass
class RuntimeConfig:
    """Where the agent workers run."""

    backend: Literal["local", "ray"] = "local"
    """`local`: every agent in this process, one after the other (no setup); `ray`: every agent a Ray actor
    (`pip install "hacrl[ray]"`), sampling and learning at the same time as the others."""
    torch_threads: int | None = None
    """torch intra-op threads in each worker's process; None: the process's default (local: this process's; a Ray
    actor: its num_cpus). Set it to compare backends bit for bit (the thread count changes float sums)."""
    ray: RayConfig = field(default_factory=RayConfig)


@dataclass
class TrainConfig:
    """Root of the config tree."""

    agents: list[AgentConfig] = field(default_factory=list)
    """One entry per agent (N >= 1); they may differ in size, architecture and tokenizer."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def validate(self) -> None:
        """Cross-field checks; each message names the key and what to set."""
        validate(self)


GROUPS = ("agents", "algorithm", "rollout", "data", "trainer", "eval", "logging", "checkpoint", "runtime")


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Defaults < YAML file < `dotted.key=value` overrides (list indexes too: `agents.1.lr=5e-7`)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = OmegaConf.structured(TrainConfig)
    try:
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise ConfigError(f"config file {str(path)!r} does not exist")
            loaded = _load_yaml(path.read_text(), f"config file {str(path)!r}") or {}
            if not isinstance(loaded, dict):
                raise ConfigError(f"config file {str(path)!r} must hold a mapping of config groups {list(GROUPS)}")
            cfg = OmegaConf.merge(cfg, OmegaConf.create(loaded))
        for item in overrides:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"override {item!r} is not of the form dotted.key=value (e.g. trainer.steps=10)")
            _check_list_index(cfg, key)
            parsed = _load_yaml(value, f"override {item!r}")
            # a dict value replaces a dict-valued key ({} clears it); config groups are merged key by key
            target = OmegaConf.select(cfg, key, default=None)
            replace = isinstance(parsed, dict) and target is not None and OmegaConf.get_type(target) is dict
            OmegaConf.update(cfg, key, parsed, merge=not replace)
        for i in range(len(cfg.agents)):
            for key in ("name", "model"):
                if OmegaConf.is_missing(cfg.agents[i], key):
                    raise ConfigError(f"agents.{i}.{key} is required: set it in the YAML file or as agents.{i}.{key}=")
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(_omegaconf_message(e)) from None
    except (ValueError, TypeError) as e:  # __post_init__ of AlgorithmParams and friends
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None
    validate(config)
    return config


MAX_YAML_NODES = 100_000
"""A config's YAML, aliases expanded, may hold at most this many nodes (a 390-byte "billion laughs" file expands to
billions, and OmegaConf expands it)."""
_INTERPOLATION = re.compile(r"(?<!\\)\$\{")


def _load_yaml(text: str, where: str) -> Any:
    """YAML text as Python data, refusing what would hang or leak later: aliases that refer to themselves or expand
    past MAX_YAML_NODES, and OmegaConf interpolations (`${oc.env:TOKEN}` would be resolved and written, secret and
    all, into config.yaml and every checkpoint)."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        _expanded_size(root, where)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {_yaml_problem(e)}") from None
    _refuse_interpolation(data, where, "")
    return data


def _expanded_size(root, where: str) -> int:
    """Nodes of the document with every alias expanded (memoised: linear in the file); a cycle is refused."""
    import yaml

    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise ConfigError(f"{where}: a YAML alias refers to itself (a recursive anchor); write the value out")
        active.add(key)
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(v) for v in node.value)
        else:
            total = 1
        active.discard(key)
        sizes[key] = total
        if total > MAX_YAML_NODES:
            raise ConfigError(
                f"{where}: its YAML aliases expand to more than {MAX_YAML_NODES:,} values (nested anchors that "
                "multiply); write the config without them"
            )
        return total

    return size(root) if root is not None else 0


def _refuse_interpolation(node: Any, where: str, key: str) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _refuse_interpolation(v, where, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _refuse_interpolation(v, where, f"{key}.{i}")
    elif isinstance(node, str) and _INTERPOLATION.search(node):
        raise ConfigError(
            f"{where}{f', key {key}' if key else ''}: {node[:80]!r} is an interpolation (${{...}}); hacrl configs do "
            "not interpolate, since the resolved value (an environment secret, say) would be written into "
            "config.yaml and every checkpoint. Write the value, or pass it from the shell as an override "
            "(hacrl train c.yaml key=\"$VAR\"); for a literal '${' write '\\${'."
        )


MAX_AGENT_NAME = 64
"""Agent names are path components (checkpoints/step_N/agents/<name>, <name>.tmp files): far below any file
system's 255-byte limit, so a long name fails at validation, not at the first checkpoint."""
_AGENT_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._+-]{{0,{MAX_AGENT_NAME - 1}}}")


MAX_GROUP_SIZE = 1024
"""G beyond this is a typo (`1e6`), not an experiment: the paper uses 8."""
MAX_RESPONSES_PER_STEP = 65536
"""prompts_per_step x group_size beyond this would hold a step's rollouts in memory for hours of sampling."""


def _check_finite_fields(node: Any, prefix: str = "") -> None:
    """Every float in the config finite: `lr: .inf` or `reward_timeout: .nan` would pass the range checks below
    (comparisons with NaN are false) and fail deep inside a run."""
    import math

    if is_dataclass(node):
        for f in fields(node):
            _check_finite_fields(getattr(node, f.name), f"{prefix}{f.name}.")
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            _check_finite_fields(item, f"{prefix}{i}.")
    elif isinstance(node, dict):
        for key, item in node.items():
            _check_finite_fields(item, f"{prefix}{key}.")
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"{prefix.rstrip('.')}={node} must be a finite number")


def validate(config: TrainConfig) -> None:
    _check_finite_fields(config)
    if not config.agents:
        raise ConfigError("agents is empty: list at least one agent with a name and a local model directory")
    names = [a.name for a in config.agents]
    if len(set(names)) != len(names):
        raise ConfigError(f"agent names must be unique, got {names}; set agents.<i>.name")
    for i, agent in enumerate(config.agents):
        if not isinstance(agent.name, str) or not _AGENT_NAME.fullmatch(agent.name):
            shown = agent.name if len(str(agent.name)) <= 80 else f"{str(agent.name)[:77]}..."
            raise ConfigError(
                f"agents.{i}.name={shown!r} ({len(str(agent.name))} characters) is not a folder-safe name: it names "
                f"the agent's checkpoint folder and metrics, so it must be 1-{MAX_AGENT_NAME} characters of letters, "
                "digits, '.', '_', '+' or '-', starting with a letter or digit (e.g. qwen3-1.7b)"
            )
        if not agent.lr > 0:
            raise ConfigError(f"agents.{i}.lr must be positive, got {agent.lr}")
        if len(agent.betas) != 2 or not all(0 <= b < 1 for b in agent.betas):
            raise ConfigError(f"agents.{i}.betas must be two numbers in [0, 1), got {agent.betas}")
        if not agent.grad_clip > 0:
            raise ConfigError(f"agents.{i}.grad_clip must be positive, got {agent.grad_clip}")
        for key in ("max_new_tokens", "max_prompt_tokens"):
            value = getattr(agent, key)
            if value is not None and value < 1:
                raise ConfigError(f"agents.{i}.{key} must be >= 1 or null, got {value}")
        if agent.temperature is not None and not agent.temperature > 0:
            raise ConfigError(f"agents.{i}.temperature must be positive, got {agent.temperature}")
        if agent.top_p is not None and not 0 < agent.top_p <= 1:
            raise ConfigError(f"agents.{i}.top_p must be in (0, 1], got {agent.top_p}")
        if agent.num_cpus < 0 or agent.num_gpus < 0:
            raise ConfigError(f"agents.{i}.num_cpus and num_gpus must be >= 0, got {agent.num_cpus}, {agent.num_gpus}")
        if agent.num_gpus > 0 and not agent.device.startswith("cuda"):
            raise ConfigError(f"agents.{i}.num_gpus={agent.num_gpus} asks for a GPU: set agents.{i}.device=cuda")
    algo, n = config.algorithm, len(config.agents)
    if algo.name in ("hacpo", "naive") and n < 2 and algo.share_rollouts:
        raise ConfigError(
            f"algorithm.name={algo.name!r} shares rollouts between agents, so it needs at least 2 entries in "
            f"`agents`; got {n}. Use algorithm.name=gspo (or grpo) for a single-agent baseline."
        )
    if algo.capability_window < 1:
        raise ConfigError(f"algorithm.capability_window must be >= 1, got {algo.capability_window}")
    if algo.capability_warmup_steps < 0:
        raise ConfigError(f"algorithm.capability_warmup_steps must be >= 0, got {algo.capability_warmup_steps}")
    r = config.rollout
    if r.group_size < 1:
        raise ConfigError(f"rollout.group_size must be >= 1, got {r.group_size}")
    if not r.temperature > 0:
        raise ConfigError(f"rollout.temperature must be positive, got {r.temperature}")
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {r.top_p}")
    if r.max_new_tokens < 1 or r.max_prompt_tokens < 1:
        raise ConfigError("rollout.max_new_tokens and rollout.max_prompt_tokens must be >= 1")
    t = config.trainer
    if t.steps < 0 or t.prompts_per_step < 1:
        raise ConfigError(
            f"trainer.steps must be >= 0 and trainer.prompts_per_step >= 1, got {t.steps}, {t.prompts_per_step}"
        )
    per_agent = t.prompts_per_step * r.group_size
    if r.group_size > MAX_GROUP_SIZE or per_agent > MAX_RESPONSES_PER_STEP:
        tokens = per_agent * len(config.agents) * (r.max_prompt_tokens + r.max_new_tokens)
        raise ConfigError(
            f"trainer.prompts_per_step x rollout.group_size = {t.prompts_per_step} x {r.group_size} = {per_agent:,} "
            f"responses per agent and step is past hacrl's limits (group_size <= {MAX_GROUP_SIZE}, responses per "
            f"agent and step <= {MAX_RESPONSES_PER_STEP:,}): up to {tokens:,} tokens per step, "
            f"{tokens * 8 / 2**20:,.0f} MiB of token ids alone before any model runs. The paper uses 128 x 8; "
            "lower one of them"
        )
    if t.mini_batch_size < 1 or per_agent % t.mini_batch_size:
        divisors = [d for d in range(1, per_agent + 1) if per_agent % d == 0]
        raise ConfigError(
            f"trainer.mini_batch_size={t.mini_batch_size} must divide the responses per agent and step, "
            f"trainer.prompts_per_step x rollout.group_size = {per_agent}; choose one of {divisors}"
        )
    if t.micro_batch_size < 1 or t.mini_batch_size % t.micro_batch_size:
        raise ConfigError(
            f"trainer.micro_batch_size={t.micro_batch_size} must divide trainer.mini_batch_size={t.mini_batch_size}"
        )
    if t.logprob_batch_size < 1:
        raise ConfigError(f"trainer.logprob_batch_size must be >= 1, got {t.logprob_batch_size}")
    chunk = t.logprob_chunk_size
    if chunk is not None and chunk != "auto" and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
        raise ConfigError(f"trainer.logprob_chunk_size must be auto, an integer >= 1 or null, got {chunk!r}")
    if t.old_logprobs not in ("recompute", "sampler"):
        raise ConfigError(f"trainer.old_logprobs must be 'recompute' or 'sampler', got {t.old_logprobs!r}")
    top_ps = [a.top_p if a.top_p is not None else r.top_p for a in config.agents]
    if t.old_logprobs == "sampler" and min(top_ps) < 1.0:
        raise ConfigError(
            f"trainer.old_logprobs=sampler with top-p {min(top_ps)}: the sampler draws from the top-p-truncated "
            "distribution, the loss's log-probs are the full one's; use trainer.old_logprobs=recompute, or top_p 1.0"
        )
    rows = r.batch_size
    if rows is not None and rows != "auto" and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 1):
        raise ConfigError(f"rollout.batch_size must be auto, an integer >= 1 or null, got {rows!r}")
    if not 0 <= r.kv_cache_margin < 1:
        raise ConfigError(f"rollout.kv_cache_margin must be in [0, 1), got {r.kv_cache_margin}")
    if r.cuda_graphs and not any(a.device.startswith("cuda") for a in config.agents):
        raise ConfigError("rollout.cuda_graphs=true needs an agent on a GPU (agents.<i>.device=cuda)")
    d = config.data
    if d.source == "file" and not d.train_file:
        raise ConfigError("data.source=file needs data.train_file (a .jsonl or .parquet file)")
    if d.source == "reasoning_gym" and (d.train_size < 1 or d.eval_size < 1):
        raise ConfigError("data.train_size and data.eval_size must be >= 1")
    if d.source == "reasoning_gym" and d.eval_size > d.heldout_size:
        raise ConfigError(
            f"data.eval_size={d.eval_size} exceeds data.heldout_size={d.heldout_size}; raise "
            "data.heldout_size (this changes the training split) or lower data.eval_size"
        )
    if d.reward_function is not None and ":" not in d.reward_function:
        raise ConfigError(f"data.reward_function={d.reward_function!r} must look like 'package.module:function'")
    if not d.reward_timeout > 0:
        raise ConfigError(f"data.reward_timeout must be positive, got {d.reward_timeout}")
    if not 0 <= d.reward_on_timeout <= algo.r_max:
        raise ConfigError(f"data.reward_on_timeout={d.reward_on_timeout} must be in [0, algorithm.r_max={algo.r_max}]")
    if d.reward_workers < 1:
        raise ConfigError(f"data.reward_workers must be >= 1, got {d.reward_workers}")
    if d.reward_memory_mb is not None and d.reward_memory_mb < 256:
        raise ConfigError(f"data.reward_memory_mb must be >= 256 or null (no limit), got {d.reward_memory_mb}")
    if d.max_answer_chars < 1:
        raise ConfigError(f"data.max_answer_chars must be >= 1, got {d.max_answer_chars}")
    e = config.eval
    if e.every < 0 or e.num_samples < 0 or e.batch_size < 1:
        raise ConfigError("eval.every and eval.num_samples must be >= 0, eval.batch_size >= 1")
    if e.max_prompts is not None and e.max_prompts < 1:
        raise ConfigError(f"eval.max_prompts must be >= 1 or null (all eval prompts), got {e.max_prompts}")
    if config.runtime.backend == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ConfigError(
                'runtime.backend=ray needs Ray, an optional extra: pip install "hacrl[ray]" (or use '
                "runtime.backend=local, the default)"
            )
    if config.runtime.torch_threads is not None and config.runtime.torch_threads < 1:
        raise ConfigError(f"runtime.torch_threads must be >= 1 or null, got {config.runtime.torch_threads}")
    c = config.checkpoint
    if c.every < 0 or c.keep_last < 1:
        raise ConfigError("checkpoint.every must be >= 0 and checkpoint.keep_last >= 1")


def config_to_yaml(config: TrainConfig) -> str:
    """The resolved config as YAML text (loadable by `load_config`)."""
    import yaml

    return yaml.safe_dump(asdict(config), sort_keys=False)


def save_config(config: TrainConfig, path: Path) -> None:
    path.write_text(config_to_yaml(config))


def describe() -> str:
    """Every config group and field with its type, default and docstring (the body of `hacrl train --help`)."""
    lines = []
    for group in GROUPS:
        cls = {"agents": AgentConfig}.get(group) or type(getattr(TrainConfig(), group))
        title = f"{group}:" + ("  (a list; index with agents.<i>.<field>)" if group == "agents" else "")
        lines.append(title)
        lines.extend(_describe_fields(cls, ""))
        lines.append("")
    return "\n".join(lines)


def _describe_fields(cls: type, prefix: str) -> list[str]:
    lines = []
    docs = field_docs(cls)
    for f in fields(cls):
        default = _default(f)
        if is_dataclass(default):  # a nested group, e.g. runtime.ray
            lines.extend(_describe_fields(type(default), f"{prefix}{f.name}."))
            continue
        doc = " ".join(docs.get(f.name, "").split())
        lines.append(f"  {prefix}{f.name} = {default!r}")
        if doc:
            lines.extend(textwrap.wrap(doc, width=100, initial_indent="      ", subsequent_indent="      "))
    return lines


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal under each field) of a dataclass and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:], strict=False):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                    docs[node.target.id] = str(after.value.value)
    return docs


def _default(f) -> Any:
    from dataclasses import MISSING

    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return "???"


def _check_list_index(cfg, key: str) -> None:
    """Give `agents.5.lr=...` with two agents a clear message instead of OmegaConf's type error."""
    parts = key.split(".")
    node = cfg
    for depth, part in enumerate(parts[:-1]):
        from omegaconf import ListConfig

        if isinstance(node, ListConfig):
            if not part.isdigit() or int(part) >= len(node):
                prefix = ".".join(parts[:depth])
                raise ConfigError(
                    f"{key}: {prefix} has {len(node)} entries (indexes 0..{len(node) - 1}); add the entry in the "
                    f"YAML file first"
                )
            node = node[int(part)]
        elif part in node:
            node = node[part]
        else:
            return  # OmegaConf reports the unknown key with a suggestion


def _yaml_problem(e: Exception) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    what = " ".join(str(x) for x in (getattr(e, "problem", None), getattr(e, "context", None)) if x) or str(e)
    return where + what


def _omegaconf_message(e: Exception) -> str:
    lines = str(e).splitlines()
    full_key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.strip().startswith("full_key:")), None)
    head = lines[0] if lines else type(e).__name__
    return f"config key {full_key}: {head}" if full_key else head


# -- what may change when a run is resumed ------------------------------------------------------------------------

RESUME_SAFE = (
    "runtime.backend",
    "runtime.ray.*",
    "agents.*.num_cpus",
    "agents.*.num_gpus",
    "trainer.steps",
    "trainer.output_dir",
    "eval.*",
    "logging.*",
    "checkpoint.*",
    "data.eval_size",
    "data.eval_file",
    "data.reward_timeout",
    "data.reward_on_timeout",
    "data.stop_on_reward_timeout",
    "data.reward_on_hung",
    "data.reward_workers",
    "data.reward_isolation",
    "data.reward_memory_mb",
)
"""Keys that never change the training numbers (evaluation runs on its own random stream)."""

RESUME_NOT_EXACT = (
    "runtime.torch_threads",
    "rollout.backend",
    "rollout.batch_size",
    "rollout.cuda_graphs",
    "agents.*.rollout_backend",
    "agents.*.gradient_checkpointing",
    "trainer.logprob_chunk_size",
    "agents.*.device",
    "agents.*.model",
    "agents.*.tokenizer",
    "trainer.micro_batch_size",
    "trainer.logprob_batch_size",
)
"""Keys a resumed run may change (to move a run, or to fit memory), at the price of bit-exactness: float sums,
batching and the sampler's random draws then differ from an uninterrupted run."""

_DICT_VALUED = ("data.task_options", "agents.*.chat_template_kwargs")


def resume_differences(saved: dict[str, Any], current: TrainConfig) -> tuple[list[str], list[str]]:
    """Compare a checkpoint's resolved config (`config.yaml`, as a dict) with the config a resume would use.

    Returns (refused, not_exact): lines `key: <saved> in the checkpoint, <now> now` for each changed key that would
    change the training numbers, and for each key of `RESUME_NOT_EXACT` that changed. `RESUME_SAFE` keys are free.
    Keys that exist on one side only are ignored (a config field added or removed by another hacrl version),
    except inside dict-valued settings such as `data.task_options`."""
    old, new = _flatten(saved), _flatten(asdict(current))
    refused, not_exact = [], []
    for key in sorted(set(old) | set(new)):
        pattern = _pattern(key)
        if key not in old or key not in new:
            if not any(pattern.startswith(d + ".") for d in _DICT_VALUED):
                continue
        before, after = old.get(key, "<unset>"), new.get(key, "<unset>")
        if before == after or _matches(pattern, RESUME_SAFE):
            continue
        line = f"{key}: {before!r} in the checkpoint, {after!r} now"
        (not_exact if _matches(pattern, RESUME_NOT_EXACT) else refused).append(line)
    return refused, not_exact


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list) and prefix == "agents":  # other lists are compared whole
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _pattern(key: str) -> str:
    import re

    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)", "*", key)


def _matches(pattern: str, rules: Sequence[str]) -> bool:
    return any(pattern == rule or (rule.endswith(".*") and pattern.startswith(rule[:-1])) for rule in rules)
