"""The one config tree of a hacrl run: defaults here < YAML file < dotted `key=value` overrides.

Every field has a default and a docstring (shown by `hacrl train --help`). `load_config` rejects unknown keys
(with a suggestion), wrong types and inconsistent settings before any model loads, with a message that names the
key and says what to set. The resolved config is saved in the run directory as `config.yaml`.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

from hacrl.core.params import AlgorithmParams


class ConfigError(ValueError):
    """A config problem, found before anything heavy happens; the message says what to set."""


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
    """Your reward as `package.module:function` with the TRL signature f(prompts, completions, **columns)."""
    reward_timeout: float = 5.0
    """Seconds one built-in verification may take before it scores 0 (guards against hostile outputs)."""


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
    """Responses per generate call and per no-grad forward of the old log-probs (bounds sampling memory)."""
    seed: int = 0
    """Seeds sampling and prompt order (not the starting agents)."""
    output_dir: str = "runs/hacrl"
    """Run directory: config.yaml, metrics.jsonl, TensorBoard events, checkpoints/, plots."""


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
    """`never`, `auto` (the newest complete checkpoint in `output_dir`, if any) or a checkpoint directory."""


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

    def validate(self) -> None:
        """Cross-field checks; each message names the key and what to set."""
        validate(self)


GROUPS = ("agents", "algorithm", "rollout", "data", "trainer", "eval", "logging", "checkpoint")


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Defaults < YAML file < `dotted.key=value` overrides (list indexes too: `agents.1.lr=5e-7`)."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = OmegaConf.structured(TrainConfig)
    try:
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise ConfigError(f"config file {str(path)!r} does not exist")
            loaded = yaml.safe_load(path.read_text()) or {}
            if not isinstance(loaded, dict):
                raise ConfigError(f"config file {str(path)!r} must hold a mapping of config groups {list(GROUPS)}")
            cfg = OmegaConf.merge(cfg, OmegaConf.create(loaded))
        for item in overrides:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"override {item!r} is not of the form dotted.key=value (e.g. trainer.steps=10)")
            _check_list_index(cfg, key)
            OmegaConf.update(cfg, key, yaml.safe_load(value), merge=True)
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


def validate(config: TrainConfig) -> None:
    if not config.agents:
        raise ConfigError("agents is empty: list at least one agent with a name and a local model directory")
    names = [a.name for a in config.agents]
    if len(set(names)) != len(names):
        raise ConfigError(f"agent names must be unique, got {names}; set agents.<i>.name")
    for i, agent in enumerate(config.agents):
        if not agent.name or "/" in agent.name or agent.name.startswith("."):
            raise ConfigError(f"agents.{i}.name={agent.name!r} must be a non-empty folder-safe name")
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
    e = config.eval
    if e.every < 0 or e.num_samples < 0 or e.batch_size < 1:
        raise ConfigError("eval.every and eval.num_samples must be >= 0, eval.batch_size >= 1")
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
        docs = field_docs(cls)
        for f in fields(cls):
            default = _default(f)
            doc = " ".join(docs.get(f.name, "").split())
            lines.append(f"  {f.name} = {default!r}")
            if doc:
                lines.extend(textwrap.wrap(doc, width=100, initial_indent="      ", subsequent_indent="      "))
        lines.append("")
    return "\n".join(lines)


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


def _omegaconf_message(e: Exception) -> str:
    lines = str(e).splitlines()
    full_key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.strip().startswith("full_key:")), None)
    head = lines[0] if lines else type(e).__name__
    return f"config key {full_key}: {head}" if full_key else head
