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
from hacrl.config.schema import SharingConfig
from hacrl.errors import ConfigError


@dataclass
class PolicyConfig:
    name: str = "???"
    """Unique; names its metrics and checkpoint parts."""
    observation: Literal["full", "polar", "pull"] = "full"
    """What it sees. `simple_v3`: `full` (the environment's own observation: velocity, landmark offset) or `polar`
    (the landmark's distance and direction, no velocity). `reach`: `full` (its joint angles as cos and sin, joint
    speeds, the goal's offset from its fingertip), `polar` (the goal as distance and direction) or `pull` (`full`
    and each joint's pull toward the goal: how far turning it alone brings the fingertip closer, per radian)."""
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
class MappingConfig:
    """`env.name: reach`: how a learner reads the episodes of a policy on another platform (`hacrl.control.mapping`:
    a replay of the source's fingertip path on the learner's own arm, closed loop through a mapping)."""

    default: Literal["none", "defined", "learned"] = "none"
    """The mapping of every pair of policies on different platforms that `pairs` does not name: `defined` (the
    learner's kinematics: its Jacobian's damped inverse), `learned` (an inverse model fitted on the learner's own
    transitions), `none` (no mapping: a sharing algorithm across platforms is refused)."""
    pairs: dict[str, str] = field(default_factory=dict)
    """Per pair, "<source>-><learner>" (policy names) -> none | defined | learned; the others take `default`."""
    error_bound: float = 0.1
    """m: a replay whose fingertip is farther than this from the source's path on average over its states (its
    mapping error, exploration noise included) is left out of the learner's pool, counted in
    `<learner>/mapped/<source>/filtered`."""
    hidden: int = 64
    """`learned`: the inverse model's hidden width (an MLP of two hidden layers)."""
    lr: float = 3.0e-3
    """`learned`: its Adam learning rate."""
    fit_steps: int = 50
    """`learned`: optimizer steps of its refit, once a training step."""
    batch: int = 256
    """`learned`: transitions per optimizer step of the refit."""
    window: int = 4
    """`learned`: it is fitted on the learner's own transitions of its last this many steps."""


@dataclass
class ReplayConfig:
    """Experience buffers (`sharing.replay`): each policy keeps its scored episodes of its last `steps` steps; every
    step the learners draw `groups` earlier initial states from them and train on the other policies' episodes of
    those (`hacrl.control.buffers`)."""

    steps: int = 0
    """Steps of episodes each policy keeps, before the current one (0: no buffers, only the step's own pool)."""
    groups: int = 8
    """Earlier initial states drawn per step (uniformly, without replacement, from every buffered one; the same for
    every learner); each brings every policy's buffered episodes of it."""
    max_episodes: int = 4096
    """Episodes each policy's buffer holds at most: its oldest steps leave first (at least one step's worth)."""


@dataclass
class ControlSharingConfig(SharingConfig):
    """Which other policies' episodes each learner trains on: the LLM trainer's sharing policies and budget
    (`hacrl.core.sharing`; `top_k` and `groups` are not in `hacrl control`), and experience buffers (`replay`)."""

    replay: ReplayConfig = field(default_factory=ReplayConfig)


@dataclass
class ControlTrainerConfig:
    steps: int = field(default=150, metadata=SAFE)
    initial_states_per_step: int = 8
    """B: initial states (seeded resets) per step, every policy G episodes from each."""
    group_size: int = 8
    """G."""
    mini_batch_size: int = 64
    """Episodes per optimizer step (must divide B x G)."""
    mini_batch_layout: Literal["blocks", "mixed"] = "blocks"
    """`blocks`: consecutive mini-batches in pool order (own first); `mixed`: each step holds the same share of every
    policy's episodes (`hacrl train --help-config`: trainer.mini_batch_layout)."""
    zero_grad_step: Literal["take", "skip"] = "take"
    """A mini-batch whose gradient is exactly zero: `take` the optimizer step anyway (the paper's), or `skip` it
    (the policy's weights and optimizer state untouched; `hacrl train --help-config`: trainer.zero_grad_step)."""
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
    mapping: MappingConfig = field(default_factory=MappingConfig)
    sharing: ControlSharingConfig = field(default_factory=ControlSharingConfig)
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

    from hacrl.config.agent import check_name
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
    _check_sharing(config)
    _check_extras(config)


CONTROL_SHARING_POLICIES = ("all", "correct", "learner_fails", "adaptive")
"""`sharing.policy` in `hacrl control` (`top_k` reads a relevance from the learner's tokens: not here)."""


def _check_sharing(config: ControlConfig) -> None:
    """`sharing`: a policy and budget as in the LLM config, only where episodes are shared; the replay's bounds."""
    from hacrl.core import get_algorithm

    sharing, algo, t = config.sharing, config.algorithm, config.trainer
    sharing.check()
    shares = get_algorithm(algo.name).pool_is_shared(algo) and len(config.policies) > 1
    if sharing.policy not in CONTROL_SHARING_POLICIES:
        raise ConfigError(
            f"sharing.policy={sharing.policy} is not in hacrl control (it reads a relevance from the learner's "
            f"tokens); choose one of {', '.join(CONTROL_SHARING_POLICIES)}"
        )
    if sharing.groups is not None:
        raise ConfigError("sharing.groups is not in hacrl control: remove it (every policy shares with every other)")
    changed = [key for key, on in (("policy", sharing.policy != "all"), ("budget_per_prompt",
               sharing.budget_per_prompt is not None), ("replay.steps", sharing.replay.steps > 0)) if on]  # fmt: skip
    if changed and not shares:
        raise ConfigError(
            f"sharing.{changed[0]} chooses which of the other policies' episodes a learner trains on, but "
            f"algorithm.name={algo.name!r} with {len(config.policies)} policies shares none; use algorithm.name=hacpo "
            "(or naive) with two or more policies, or remove it"
        )
    if sharing.reads("min_reward") and sharing.min_reward is not None and sharing.min_reward > algo.r_max:
        raise ConfigError(f"sharing.min_reward={sharing.min_reward} is above algorithm.r_max={algo.r_max}")
    if sharing.reads("fail_below") and not 0 < sharing.fail_below <= algo.r_max:
        raise ConfigError(f"sharing.fail_below={sharing.fail_below} must be in (0, algorithm.r_max={algo.r_max}]")
    if sharing.reads("margin") and sharing.margin >= algo.r_max:
        raise ConfigError(f"sharing.margin={sharing.margin} must be below algorithm.r_max={algo.r_max}")
    replay, per_step = sharing.replay, t.initial_states_per_step * t.group_size
    if replay.steps < 0 or replay.groups < 1:
        raise ConfigError(
            "sharing.replay.steps >= 0 (0: off) and sharing.replay.groups >= 1 are required, got "
            f"steps={replay.steps}, groups={replay.groups}"
        )
    if replay.steps and not per_step <= replay.max_episodes <= MAX_REPLAY_EPISODES:
        raise ConfigError(
            f"sharing.replay.max_episodes={replay.max_episodes} must hold one step's episodes (initial_states_per_step "
            f"x group_size = {per_step}) and at most {MAX_REPLAY_EPISODES:,}"
        )


MAX_REPLAY_EPISODES = 1_000_000
"""Per policy: beyond this the buffers are a typo, not a replay (each episode keeps its states in memory)."""


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
    """Each policy's platform against the environment; sharing across platforms only through a mapping."""
    reach = config.env.name == "reach"
    for i, p in enumerate(config.policies):
        if reach and p.platform is None:
            raise ConfigError(f"policies.{i}.platform is required with env.name=reach: arm2 or arm3")
        if not reach and p.platform is not None:
            raise ConfigError(f"policies.{i}.platform={p.platform!r} is for env.name=reach; remove it for simple_v3")
        if not reach and p.observation == "pull":
            raise ConfigError(f"policies.{i}.observation=pull is an arm's view (env.name=reach); use full or polar")
    _check_mapping(config)


def mapping_of(config: ControlConfig, source: int, learner: int) -> str:
    """How policy `learner` reads policy `source`'s episodes: `same` (one platform: re-observed), or the pair's
    mapping (`mapping.pairs`, else `mapping.default`)."""
    policies = config.policies
    if policies[source].platform == policies[learner].platform:
        return "same"
    return config.mapping.pairs.get(f"{policies[source].name}->{policies[learner].name}", config.mapping.default)


def _check_mapping(config: ControlConfig) -> None:
    """`mapping`: known names and values, only where platforms differ, bounds that make sense; a sharing algorithm
    across platforms needs a mapping for every such pair, and one that can be computed."""
    from hacrl.control import mapping as maps
    from hacrl.core import get_algorithm

    m, policies = config.mapping, config.policies
    names = [p.name for p in policies]
    if config.env.name != "reach" and (m.pairs or m.default != "none"):
        raise ConfigError(
            f"mapping.* maps between robot platforms (env.name=reach); {config.env.name} has one action space: remove "
            "mapping.default and mapping.pairs"
        )
    for key, kind in m.pairs.items():
        source, sep, learner = key.partition("->")
        if not sep or source not in names or learner not in names or source == learner:
            raise ConfigError(
                f'mapping.pairs: {key!r} is not "<source>-><learner>" with two of the policies\' names {names}'
            )
        if kind not in maps.MAPPINGS:
            raise ConfigError(f"mapping.pairs.{key}={kind!r}: one of {', '.join(maps.MAPPINGS)}")
        if policies[names.index(source)].platform == policies[names.index(learner)].platform:
            raise ConfigError(
                f"mapping.pairs: {source} and {learner} are both {policies[names.index(source)].platform}: one action "
                "space, read without a mapping; remove the pair"
            )
    if not m.error_bound > 0:
        raise ConfigError(f"mapping.error_bound must be > 0 (m), got {m.error_bound}")
    if not (1 <= m.hidden <= MAX_HIDDEN and m.lr > 0 and m.fit_steps >= 0 and m.batch >= 1 and m.window >= 1):
        raise ConfigError(
            f"mapping: 1 <= hidden <= {MAX_HIDDEN}, lr > 0, fit_steps >= 0, batch >= 1 and window >= 1 are required, "
            f"got hidden={m.hidden}, lr={m.lr}, fit_steps={m.fit_steps}, batch={m.batch}, window={m.window}"
        )
    if not get_algorithm(config.algorithm.name).pool_is_shared(config.algorithm):
        return
    for learner, to in enumerate(policies):
        for source, frm in enumerate(policies):
            kind = mapping_of(config, source, learner) if source != learner else "same"
            if kind == "none":
                raise ConfigError(
                    f"policies.{source} ({frm.name}, {frm.platform}) and policies.{learner} ({to.name}, {to.platform}) "
                    f"act in different action spaces, and algorithm.name={config.algorithm.name!r} trains each on the "
                    "other's episodes: set mapping.default (defined: through the learner's kinematics; learned: an "
                    f"inverse model) or mapping.pairs.{frm.name}->{to.name}; or use algorithm.name=gspo (each alone)"
                )
            if kind in ("defined", "learned"):
                problem = maps.unmappable(frm.platform, to.platform)
                if problem:
                    raise ConfigError(f"mapping of {frm.name}->{to.name} ({kind}): {problem}")


def control_config_to_yaml(config: ControlConfig) -> str:
    import yaml

    return yaml.safe_dump(asdict(config), sort_keys=False)
