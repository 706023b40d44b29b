"""The control trainer's config: the LLM trainer's `algorithm`, `sharing`-free core settings, `logging` and
`checkpoint` groups unchanged, plus its own `policies`, `env`, `trainer` and `eval`. Loaded like the LLM config:
defaults < YAML < dotted overrides, unknown keys and bad values refused with the key. What a resumed run may change
is marked as in the LLM config (SAFE / NOT_EXACT) and decided by the same `hacrl.driver.resume`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from hacrl.config import NOT_EXACT, SAFE, AlgorithmConfig, CheckpointConfig, LoggingConfig
from hacrl.errors import ConfigError


@dataclass
class PolicyConfig:
    name: str = "???"
    """Unique; names its metrics and checkpoint parts."""
    observation: Literal["full", "polar"] = "full"
    """What it sees. `simple_v3`: `full` (the environment's own observation: velocity, landmark offset) or `polar`
    (the landmark's distance and direction, no velocity). `reach`: `full` (its joint angles as cos and sin, joint
    speeds, the goal's offset from its fingertip) or `polar` (the goal as distance and direction)."""
    platform: Literal["arm2", "arm3"] | None = None
    """`env.name: reach`: the robot it controls (`hacrl.control.arms`: `arm2`, two joints; `arm3`, three), which
    decides its action space; unset for `simple_v3`."""
    architecture: Literal["mlp", "gru"] = "mlp"
    """`mlp` (current observation) or `gru` (the history)."""
    hidden: int = 64
    lr: float = 3e-3
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    init_seed: int | None = None
    """Seed of its initial weights (None: `hacrl.seeds.adapters(trainer.seed, its index)`, a named stream of the
    run)."""


@dataclass
class EnvConfig:
    name: Literal["simple_v3", "reach"] = "simple_v3"
    """`simple_v3`: mpe2's single-agent navigation task (why: `hacrl.control`). `reach`: robot arms on MuJoCo that
    differ in their actuators bring their fingertip to a goal (`hacrl.control.arms`; each policy names its
    `platform`)."""
    max_cycles: int = 25
    """Steps per episode (`reach`: 20 actions a second)."""
    success_distance: float = 0.1
    """An episode succeeds when it ends this close to the landmark (`reach`: its fingertip to the goal, m)."""


@dataclass
class ControlTrainerConfig:
    steps: int = field(default=150, metadata=SAFE)
    initial_states_per_step: int = 8
    """B: initial states (seeded resets) per step, every policy G episodes from each."""
    group_size: int = 8
    """G."""
    mini_batch_size: int = 64
    """Episodes per optimizer step (must divide B x G)."""
    temperature: float = 1.0
    seed: int = 0
    output_dir: str = field(default="runs/control", metadata=SAFE)
    torch_threads: int = field(default=1, metadata=NOT_EXACT)
    """torch intra-op threads: these policies are tiny, and more threads than one only wait on each other (a step
    took 9 s instead of 0.6 s with 2 threads beside another process on 2 cores)."""


@dataclass
class ControlEvalConfig:
    RESUME: ClassVar[dict] = SAFE  # evaluation draws from held-out initial states, greedily: never the training's

    every: int = 25
    """Evaluate every this many steps (0: only at the end)."""
    at_start: bool = True
    initial_states: int = 200
    """Held-out initial states, each policy one greedy episode from each."""


@dataclass
class ControlConfig:
    policies: list[PolicyConfig] = field(default_factory=list)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    trainer: ControlTrainerConfig = field(default_factory=ControlTrainerConfig)
    eval: ControlEvalConfig = field(default_factory=ControlEvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


def load_control_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> ControlConfig:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from hacrl.config.loading import merge_sources, omegaconf_message

    try:
        cfg = merge_sources(ControlConfig, path, overrides)
        for i in range(len(cfg.policies)):
            if OmegaConf.is_missing(cfg.policies[i], "name"):
                raise ConfigError(f"policies.{i}.name is required")
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_message(e)) from None
    except (ValueError, TypeError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None
    validate(config)
    return config


MAX_HIDDEN = 4096
"""A policy's hidden width beyond this is a typo (`1e8` would allocate 10^16 weights), not a control policy."""
MAX_CYCLES = 1000
"""Steps per episode beyond this is a typo (`1e8`: one step would run for hours); mpe2's default is 25."""
MAX_EVAL_STATES = 100_000


def validate(config: ControlConfig) -> None:
    """The LLM config's checks where they apply (names, finite numbers, sizes: `hacrl.config`), then control's own;
    each message names the key."""

    from hacrl.config.schema import check_name
    from hacrl.config.validation import MAX_GROUP_SIZE, MAX_RESPONSES_PER_STEP, check_finite_fields
    from hacrl.core import get_algorithm

    check_finite_fields(config)
    if not config.policies:
        raise ConfigError("policies is empty: list at least one policy with a name")
    for i, p in enumerate(config.policies):
        check_name(p.name, f"policies.{i}.name", "policy")
    names = [p.name for p in config.policies]
    if len(set(names)) != len(names):
        raise ConfigError(f"policy names must be unique, got {names}; set policies.<i>.name")
    for i, p in enumerate(config.policies):
        if not 1 <= p.hidden <= MAX_HIDDEN or not p.lr > 0 or not p.grad_clip > 0 or p.weight_decay < 0:
            raise ConfigError(
                f"policies.{i}: 1 <= hidden <= {MAX_HIDDEN}, lr > 0, grad_clip > 0 and weight_decay >= 0 are "
                f"required, got hidden={p.hidden}, lr={p.lr}, grad_clip={p.grad_clip}, weight_decay={p.weight_decay}"
            )
    config.algorithm.check()
    algo, t = config.algorithm, config.trainer
    if get_algorithm(algo.name).pool_is_shared(algo) and len(config.policies) < 2:
        raise ConfigError(f"algorithm.name={algo.name!r} shares episodes, so it needs at least 2 policies")
    if t.steps < 0 or t.initial_states_per_step < 1 or t.group_size < 1 or not t.temperature > 0:
        raise ConfigError("trainer.steps >= 0, initial_states_per_step >= 1, group_size >= 1, temperature > 0")
    if t.torch_threads < 1:
        raise ConfigError(f"trainer.torch_threads must be >= 1, got {t.torch_threads}")
    per_policy = t.initial_states_per_step * t.group_size
    if t.group_size > MAX_GROUP_SIZE or per_policy > MAX_RESPONSES_PER_STEP:
        raise ConfigError(
            f"trainer.initial_states_per_step x trainer.group_size = {t.initial_states_per_step} x {t.group_size} = "
            f"{per_policy:,} episodes per policy and step is past hacrl's limits (group_size <= {MAX_GROUP_SIZE}, "
            f"episodes per policy and step <= {MAX_RESPONSES_PER_STEP:,}); lower one of them"
        )
    if t.mini_batch_size < 1 or per_policy % t.mini_batch_size:
        raise ConfigError(
            f"trainer.mini_batch_size={t.mini_batch_size} must divide initial_states_per_step x group_size = "
            f"{per_policy}"
        )
    if not 1 <= config.env.max_cycles <= MAX_CYCLES or not config.env.success_distance > 0:
        raise ConfigError(
            f"env.max_cycles must be in [1, {MAX_CYCLES}] (mpe2's default: 25) and env.success_distance > 0, got "
            f"max_cycles={config.env.max_cycles}, success_distance={config.env.success_distance}"
        )
    if config.eval.every < 0 or not 1 <= config.eval.initial_states <= MAX_EVAL_STATES:
        raise ConfigError(f"eval.every >= 0 and 1 <= eval.initial_states <= {MAX_EVAL_STATES:,} are required")
    config.checkpoint.check()
    config.logging.check()
    _check_platforms(config)
    _check_extras(config)


def _check_extras(config: ControlConfig) -> None:
    """The environment's package is installed (the control extra), or one paragraph with the install line."""
    import importlib.util

    if config.env.name == "reach":
        if importlib.util.find_spec("mujoco") is None:
            raise ConfigError(
                'env.name=reach needs MuJoCo, in the control extra: pip install "hacrl[control]" (or pip install '
                "mujoco; `make control` installs it)"
            )
    elif importlib.util.find_spec("mpe2") is None:
        raise ConfigError(
            "hacrl control needs the multi-agent particle environments, an optional extra: "
            'pip install "hacrl[control]" (or pip install mpe2; `make control` installs it)'
        )


def _check_platforms(config: ControlConfig) -> None:
    """Each policy's platform against the environment; sharing only between policies that act alike."""
    from hacrl.core import get_algorithm

    reach = config.env.name == "reach"
    for i, p in enumerate(config.policies):
        if reach and p.platform is None:
            raise ConfigError(f"policies.{i}.platform is required with env.name=reach: arm2 or arm3")
        if not reach and p.platform is not None:
            raise ConfigError(f"policies.{i}.platform={p.platform!r} is for env.name=reach; remove it for simple_v3")
    platforms = [p.platform for p in config.policies]
    if get_algorithm(config.algorithm.name).pool_is_shared(config.algorithm) and len(set(platforms)) > 1:
        first = next(i for i, p in enumerate(platforms) if p != platforms[0])
        raise ConfigError(
            f"policies.0 ({platforms[0]}) and policies.{first} ({platforms[first]}) act in different action spaces, "
            f"and algorithm.name={config.algorithm.name!r} trains each on the other's episodes, which needs a mapping "
            "of one's actions into the other's (not built yet); use algorithm.name=gspo (each alone), or policies "
            "on one platform"
        )


def control_config_to_yaml(config: ControlConfig) -> str:
    import yaml

    return yaml.safe_dump(asdict(config), sort_keys=False)
