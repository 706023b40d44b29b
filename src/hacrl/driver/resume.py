"""Resume: what a run does with its run directory, decided in one place before any worker starts.

`plan_resume(config, run_dir, resume)` turns the config and the directory into a `ResumePlan` that the trainer
executes: start fresh; restart in place (an earlier attempt stopped before its first checkpoint); or continue from
a checkpoint (`never`: none; a path: that one, or an error; `auto`: the newest that passes its checks, damaged ones
kept aside as step_N.damaged). Continuing, the checkpoint's saved config is compared with the current one key by
key: a key marked SAFE in the schema (evaluation, logging, where workers run) changes freely, one marked
NOT_EXACT (devices, batch sizes, the sampler) changes with a notice that the run is no longer bit-identical, any
other (it would change the training numbers) is refused unless `checkpoint.strict_resume=false`.
`prepare_run_dir` then makes the directory match the plan: a fresh run never writes into an old one, a restart
replaces the old metrics, a continued run drops the metrics logged after its checkpoint.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from hacrl.checkpoint import agent_weights_dir, latest_checkpoint, read_checkpoint_state, resume_point
from hacrl.config import RENAMED, AgentConfig, ConfigError, SharingConfig, TrainConfig, load_yaml
from hacrl.config.docs import default_of
from hacrl.driver.rundir import last_logged_step, trim_metrics
from hacrl.errors import CheckpointError, RunDirError, warn

Notice = Callable[[str], None]


@dataclass(frozen=True)
class ResumePlan:
    """Where a run starts: fresh (no checkpoint), restarting in place, or from `checkpoint` at `step`."""

    checkpoint: Path | None = None
    state: dict[str, Any] | None = None
    """The checkpoint's driver state: step, capability tracker, prompt stream."""
    restarting: bool = False
    """No checkpoint, but an earlier attempt's metrics in the directory: start again from step 0 in place."""

    @property
    def step(self) -> int:
        return self.state["step"] if self.state is not None else 0

    @property
    def purge_step(self) -> int | None:
        """The first step whose logged records (TensorBoard) a restarted or continued run replaces; None: fresh."""
        return self.step + 1 if self.checkpoint else 0 if self.restarting else None

    def weights_from(self, agent: AgentConfig) -> str | None:
        """The checkpoint's weights directory of `agent` (None: its model directory; a frozen agent never changed)."""
        if self.checkpoint is None or agent.frozen:
            return None
        return str(agent_weights_dir(self.checkpoint, agent.name))


def plan_resume(config: Any, run_dir: Path, resume: str, notice: Notice, names: list[str] | None = None) -> ResumePlan:
    """The plan for `resume` (`never`, `auto` or a checkpoint path) in `run_dir`, its settings checked; for either
    config root (`names`: the entries a checkpoint must hold, default the config's agents)."""
    checkpoint, restarting = choose_checkpoint(config, run_dir, resume, notice)
    if checkpoint is None:
        return ResumePlan(restarting=restarting)
    state = read_checkpoint_state(checkpoint, names if names is not None else [a.name for a in config.agents])
    check_settings(config, checkpoint, notice)
    return ResumePlan(checkpoint, state)


def prepare_run_dir(plan: ResumePlan, run_dir: Path, notice: Notice) -> None:
    """A fresh run never writes into an old one; a resumed run drops metrics logged after its checkpoint."""
    metrics = run_dir / "metrics.jsonl"
    if plan.checkpoint is None and not plan.restarting:
        if metrics.exists() or latest_checkpoint(run_dir) is not None:
            last = last_logged_step(metrics) if metrics.exists() else None
            has_checkpoint = latest_checkpoint(run_dir) is not None
            what = f"metrics up to step {last}" if last is not None else "an earlier run"
            how = (
                "continue it with --resume (or checkpoint.resume=auto)"
                if has_checkpoint
                else "it has no checkpoint, so --resume starts it again from step 0 in place"
            )
            raise RunDirError(
                f"trainer.output_dir={str(run_dir)!r} already holds a run ({what}"
                f"{', with checkpoints' if has_checkpoint else ''}); {how}, or choose another trainer.output_dir"
            )
    elif metrics.exists():
        trim_metrics(metrics, plan.step if plan.checkpoint else None, notice=notice)
    run_dir.mkdir(parents=True, exist_ok=True)


def choose_checkpoint(config: Any, run_dir: Path, resume: str, notice: Notice) -> tuple[Path | None, bool]:
    """`never`: none. A path: that one, or an error. `auto`: the newest good one; none when the run stopped
    before its first checkpoint (it starts again from step 0: restarting)."""
    if resume == "never":
        return None, False
    if resume != "auto":
        return Path(resume), False
    checkpoint, damaged = resume_point(run_dir, verify_digests=config.checkpoint.verify_digests, notice=notice)
    if checkpoint is None and damaged:
        raise CheckpointError(
            f"no usable checkpoint in {str(run_dir)!r}: every one is damaged ({len(damaged)}, kept as "
            "step_N.damaged). To train again from step 0, move the run directory away or choose another "
            "trainer.output_dir."
        )
    if checkpoint is None and (run_dir / "metrics.jsonl").exists():
        last = last_logged_step(run_dir / "metrics.jsonl")
        notice(
            f"{run_dir} has no checkpoint: the earlier attempt stopped before its first one"
            f"{f' (it logged up to step {last})' if last is not None else ''}. Starting again from step 0 in "
            "place; its metrics.jsonl is replaced."
        )
        return None, True
    return checkpoint, False


def saved_config(checkpoint: Path) -> dict[str, Any]:
    """The settings a checkpoint was trained with (its config.yaml), as plain data read by the config loader
    (`load_yaml`: no tags that name code, no alias bombs, no interpolation); a CheckpointError names the file."""
    saved = checkpoint / "config.yaml"
    if not saved.is_file():
        raise CheckpointError(
            f"{checkpoint} has no config.yaml (every checkpoint hacrl writes holds the run's config), so the settings "
            "it was trained with are unknown: resume from another checkpoint (checkpoint.resume=<its directory>)"
        )
    try:
        data = load_yaml(saved.read_text(encoding="utf-8", errors="replace"), str(saved))
    except ConfigError as e:
        raise CheckpointError(f"{e}. hacrl writes plain YAML there: resume from another checkpoint "
                              "(checkpoint.resume=<its directory>)") from None  # fmt: skip
    if not isinstance(data, dict):
        raise CheckpointError(
            f"{saved} holds a {type(data).__name__}, not the run's config (a mapping of config groups): resume from "
            "another checkpoint (checkpoint.resume=<its directory>)"
        )
    return data


def check_settings(config: Any, checkpoint: Path, notice: Notice) -> None:
    """The checkpoint's saved config against `config` (either root): a change of the numbers refused (unless
    `checkpoint.strict_resume=false`: then a warning per change), a not-exact change announced."""
    root = type(config)
    refused, not_exact = resume_differences(saved_config(checkpoint), config)
    if refused and config.checkpoint.strict_resume:
        raise CheckpointError(
            f"resuming from {checkpoint} would change settings of the run that wrote it, so it would not "
            "continue that run: " + "; ".join(refused) + ". Set them back, or start a new run in another "
            f"trainer.output_dir. Safe to change on resume: {', '.join(resume_rules('safe', root))}; allowed but no "
            f"longer bit-exact: {', '.join(resume_rules('not_exact', root)) or 'nothing'}. To resume anyway, set "
            "checkpoint.strict_resume=false."
        )
    for line in refused:
        warn(f"resuming with a changed setting (checkpoint.strict_resume=false): {line}")
    for line in not_exact:
        notice(f"resuming with {line}: allowed, but no longer bit-identical to an uninterrupted run")


# -- what may change when a run is resumed ------------------------------------------------------------------------
# Generic over the config's root (`TrainConfig` for `hacrl train`, `ControlConfig` for `hacrl control`): each root
# declares its fields' SAFE / NOT_EXACT marks, and its lists of entries (`agents`, `policies`) by their type hints.


@functools.cache
def _entries(cls: type) -> dict[str, type]:
    """{field: entry class} of `cls`'s list-of-dataclass fields (`agents: list[AgentConfig]`)."""
    import typing

    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        args = typing.get_args(hints.get(f.name))
        if typing.get_origin(hints.get(f.name)) is list and args and is_dataclass(args[0]):
            out[f.name] = args[0]
    return out


def resume_policy(key: str, root: type = TrainConfig) -> str:
    """`safe`, `not_exact` or `refused`: what changing the flattened config key `key` (`agents.1.device`,
    `data.task_options.min_digits`) does to a resumed run, from the field's metadata (SAFE / NOT_EXACT) or its
    group's `RESUME`; `refused` when neither says otherwise (it would change the training numbers)."""
    cls: Any = root
    policy = "refused"
    parts = key.split(".")
    i = 0
    while i < len(parts) and cls is not None and is_dataclass(cls):
        known = {f.name: f for f in fields(cls)}
        f = known.get(parts[i])
        if f is None:
            break
        policy = f.metadata.get("resume", policy)
        default = default_of(f)
        entries = _entries(cls)
        if is_dataclass(default):
            cls = type(default)
            policy = getattr(cls, "RESUME", {}).get("resume", policy)
        elif f.name in entries:
            cls, i = entries[f.name], i + 1  # skip the index
        else:
            cls = None
        i += 1
    return policy


def resume_rules(policy: str, root: type = TrainConfig) -> list[str]:
    """The keys (`eval.*` for a whole group, `agents.*.device`) whose resume policy is `policy`."""
    out: list[str] = []

    def walk(cls: type, prefix: str, inherited: str) -> None:
        group = getattr(cls, "RESUME", {}).get("resume", inherited)
        if group == policy and group != inherited:
            out.append(f"{prefix}*")
            return
        entries = _entries(cls)
        for f in fields(cls):
            default = default_of(f)
            if is_dataclass(default):
                walk(type(default), f"{prefix}{f.name}.", group)
            elif f.name in entries:
                walk(entries[f.name], f"{prefix}{f.name}.*.", group)
            elif f.metadata.get("resume", group) == policy and group != policy:
                out.append(prefix + f.name)

    walk(root, "", "refused")
    return out


def _dict_valued(cls: type, prefix: str = "") -> list[str]:
    """The patterns of `cls`'s dict-valued settings (`data.task_options`, `agents.*.chat_template_kwargs`): keys
    inside them are compared even when one side lacks them."""
    import typing

    hints = typing.get_type_hints(cls)
    entries = _entries(cls)
    out = []
    for f in fields(cls):
        default = default_of(f)
        if is_dataclass(default):
            out += _dict_valued(type(default), f"{prefix}{f.name}.")
        elif f.name in entries:
            out += _dict_valued(entries[f.name], f"{prefix}{f.name}.*.")
        elif any(
            t is dict or typing.get_origin(t) is dict for t in (hints.get(f.name), *typing.get_args(hints.get(f.name)))
        ):
            out.append(prefix + f.name)
    return out


def resume_differences(saved: dict[str, Any], current: Any) -> tuple[list[str], list[str]]:
    """Compare a checkpoint's resolved config (`config.yaml`, as a dict) with the config a resume would use (a
    `TrainConfig` or a `ControlConfig`).

    Returns (refused, not_exact): lines `key: <saved> in the checkpoint, <now> now` for each changed key that would
    change the training numbers, and for each changed key whose `resume_policy` is `not_exact`; `safe` keys are
    free. A saved key of an earlier version is read under its new name (`RENAMED`). Keys that exist on one side
    only are ignored (a config field added or removed by another hacrl version), except inside dict-valued settings
    such as `data.task_options`. A whole config group that a checkpoint lacks (written before the group existed,
    like `sharing`) is compared as its defaults: what that version did."""
    root = type(current)
    defaults, entries = root(), set(_entries(root))
    groups = [f.name for f in fields(root) if is_dataclass(getattr(defaults, f.name))]
    saved = {**{g: asdict(getattr(defaults, g)) for g in groups if g not in saved}, **saved}
    old = {RENAMED.get(k, k): v for k, v in _flatten(saved, entries=entries).items()}
    new = _flatten(asdict(current), entries=entries)
    dict_valued = _dict_valued(root)
    refused, not_exact = [], []
    for key in sorted(set(old) | set(new)):
        pattern = _pattern(key)
        if key not in old or key not in new:
            if not any(pattern.startswith(d + ".") for d in dict_valued):
                continue
        before, after = old.get(key, "<unset>"), new.get(key, "<unset>")
        policy = resume_policy(key, root)
        if before == after or policy == "safe" or _unread_sharing_setting(key, saved, current):
            continue
        if _same_old_logprobs(key, before, current):
            continue
        line = f"{key}: {before!r} in the checkpoint, {after!r} now"
        (not_exact if policy == "not_exact" else refused).append(line)
    return refused, not_exact


def _unread_sharing_setting(key: str, saved: dict[str, Any], current: Any) -> bool:
    """`sharing.<setting>` of a sharing policy (`hacrl.core.sharing.SETTINGS`) that neither the checkpoint's policy
    nor the resumed one reads (`min_reward` under `all`): a change of it changes no number. The settings every
    policy reads (`budget_per_prompt`, `groups`, control's `replay.*`) are never unread."""
    from hacrl.core.sharing import SETTINGS

    group, _, name = key.partition(".")
    if group != "sharing" or not hasattr(current, "sharing"):
        return False
    if not any(name in settings for settings in SETTINGS.values()):
        return False
    before = SharingConfig(policy=(saved.get("sharing") or {}).get("policy", "all"))
    return not before.reads(name) and not current.sharing.reads(name)


def _same_old_logprobs(key: str, before: Any, current: Any) -> bool:
    """`trainer.old_logprobs` changed in name only: for every agent, `auto` resolves to what the other side says
    (a checkpoint written before `auto` says `recompute`, which `auto` is for an agent on `hf` or `static`)."""
    if key != "trainer.old_logprobs" or not hasattr(current, "agents"):
        return False
    from hacrl.config.settings import AgentSettings, old_logprobs_of
    from hacrl.core import get_algorithm

    stale = get_algorithm(current.algorithm.name).takes_stale_rows
    samplers = [AgentSettings.resolve(a, current.rollout).sampler for a in current.agents]
    now = current.trainer.old_logprobs
    return all(old_logprobs_of(str(before), s, stale) == old_logprobs_of(now, s, stale) for s in samplers)


def _flatten(value: Any, prefix: str = "", *, entries: set[str] = frozenset({"agents"})) -> dict[str, Any]:
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list) and prefix in entries:  # other lists are compared whole
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k), entries=entries))
    return out


def _pattern(key: str) -> str:
    import re

    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)", "*", key)
