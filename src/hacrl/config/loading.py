"""Loading a config: defaults < YAML file < dotted `key=value` overrides, with the guards a config file needs (YAML
aliases that expand without bound, interpolations that would write secrets into config.yaml, keys renamed since
an earlier version, list indexes past the end); saving the resolved config as YAML.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hacrl.config.schema import TrainConfig
from hacrl.config.validation import validate
from hacrl.errors import ConfigError


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Defaults < YAML file < `dotted.key=value` overrides (list indexes too: `agents.1.lr=5e-7`)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = merge_sources(TrainConfig, path, overrides)
        for i in range(len(cfg.agents)):
            for key in ("name", "model"):
                if OmegaConf.is_missing(cfg.agents[i], key):
                    raise ConfigError(f"agents.{i}.{key} is required: set it in the YAML file or as agents.{i}.{key}=")
        config = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_message(e)) from None
    except (ValueError, TypeError) as e:  # __post_init__ of AlgorithmParams and friends
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None
    validate(config)
    return config


def merge_sources(root: type, path: str | Path | None, overrides: Sequence[str]):
    """The OmegaConf tree of dataclass `root`: its defaults < the YAML file < `dotted.key=value` overrides, with the
    guards of `load_yaml`, renamed keys refused and list indexes checked (shared by `load_config` and the control
    trainer's loader). Raises ConfigError or OmegaConf's errors (the callers name them)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(root)
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        loaded = load_yaml(path.read_text(), f"config file {str(path)!r}") or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping of config groups")
        data = loaded.get("data")
        _refuse_renamed([f"data.{k}" for k in data] if isinstance(data, dict) else [], f"config file {path}")
        cfg = OmegaConf.merge(cfg, OmegaConf.create(loaded))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form dotted.key=value (e.g. trainer.steps=10)")
        _refuse_renamed([key], f"override {item!r}")
        _check_list_index(cfg, key)
        parsed = load_yaml(value, f"override {item!r}")
        # a dict value replaces a dict-valued key ({} clears it); config groups are merged key by key
        target = OmegaConf.select(cfg, key, default=None)
        replace = isinstance(parsed, dict) and target is not None and OmegaConf.get_type(target) is dict
        OmegaConf.update(cfg, key, parsed, merge=not replace)
    return cfg


RENAMED = {
    "data.reward": "scoring.builtin",
    "data.reward_function": "scoring.function",
    "data.reward_timeout": "scoring.timeout",
    "data.reward_on_timeout": "scoring.on_timeout",
    "data.stop_on_reward_timeout": "scoring.stop_on_timeout",
    "data.reward_on_hung": "scoring.on_hung",
    "data.reward_workers": "scoring.workers",
    "data.reward_isolation": "scoring.isolation",
    "data.reward_memory_mb": "scoring.memory_mb",
    "data.max_answer_chars": "scoring.max_answer_chars",
}
"""Keys of earlier hacrl versions and their names now: a config that uses one is refused with the new name (a
checkpoint's saved config is read through this table when a run resumes)."""


def _refuse_renamed(keys: Sequence[str], where: str) -> None:
    old = [k for k in keys if k in RENAMED]
    if old:
        moves = ", ".join(f"{k} -> {RENAMED[k]}" for k in old)
        raise ConfigError(
            f"{where}: every scoring setting moved from `data:` to its own `scoring:` group ({moves}); write "
            f"{'them' if len(old) > 1 else 'it'} under scoring: (e.g. `scoring: {{{RENAMED[old[0]].split('.')[1]}: "
            "...}` or the override " + f"{RENAMED[old[0]]}=...)"
        )


MAX_YAML_NODES = 100_000
"""A config's YAML, aliases expanded, may hold at most this many nodes (a 390-byte "billion laughs" file expands to
billions, and OmegaConf expands it)."""
_INTERPOLATION = re.compile(r"(?<!\\)\$\{")


def load_yaml(text: str, where: str) -> Any:
    """YAML text as plain Python data (yaml's SafeLoader: a `!!python` tag or any other tag that names code is a
    ConfigError, never constructed), refusing what would hang or leak later: aliases that refer to themselves or expand
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


def omegaconf_message(e: Exception) -> str:
    lines = str(e).splitlines()
    full_key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.strip().startswith("full_key:")), None)
    head = lines[0] if lines else type(e).__name__
    return f"config key {full_key}: {head}" if full_key else head


def config_to_yaml(config: TrainConfig) -> str:
    """The resolved config as YAML text (loadable by `load_config`)."""
    import yaml

    return yaml.safe_dump(asdict(config), sort_keys=False)


def save_config(config: TrainConfig, path: Path) -> None:
    path.write_text(config_to_yaml(config))
