"""The one config tree of a hacrl run: defaults < YAML file < dotted `key=value` overrides.

    schema       one dataclass per group: fields, defaults, docstrings, per-group checks; the `agents:` entries
                 in `agent`, `data:` and `scoring:` in `data`; the resume policy marks in `marks`
    loading      YAML and overrides into a TrainConfig (and its guards); the resolved config saved as YAML
    validation   the checks across groups
    docs         `hacrl train --help-config`, generated from the schema's docstrings
    settings     each agent's effective settings, resolved once from its entry and the run-wide groups, and its
                 precision mode (`Precision`: compute dtype, what AdamW steps, where, what offload keeps on the host)

Every field has a default and a docstring. `load_config` rejects unknown keys (with a suggestion), wrong types and
inconsistent settings before any model loads, with a message that names the key and says what to set. The resolved
config is saved in the run directory as `config.yaml`. What a resumed run may change is decided in `hacrl.driver.resume`
from the marks here.
"""

from hacrl.config.agent import AgentConfig, LoraConfig
from hacrl.config.data import DataConfig, DatasetSpec, ScoringConfig
from hacrl.config.docs import describe, field_docs
from hacrl.config.loading import RENAMED, config_to_yaml, load_config, load_yaml, save_config
from hacrl.config.marks import NOT_EXACT, SAFE
from hacrl.config.schema import (
    GROUPS,
    AlgorithmConfig,
    CheckpointConfig,
    DeadlineConfig,
    EvalConfig,
    LoggingConfig,
    RayConfig,
    RolloutConfig,
    RuntimeConfig,
    SharingConfig,
    TrackioConfig,
    TrainConfig,
    TrainerConfig,
    WandbConfig,
)
from hacrl.config.validation import validate
from hacrl.errors import ConfigError

__all__ = [
    "GROUPS",
    "NOT_EXACT",
    "RENAMED",
    "SAFE",
    "AgentConfig",
    "AlgorithmConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "DatasetSpec",
    "DeadlineConfig",
    "EvalConfig",
    "LoggingConfig",
    "LoraConfig",
    "RayConfig",
    "RolloutConfig",
    "RuntimeConfig",
    "ScoringConfig",
    "SharingConfig",
    "TrackioConfig",
    "TrainConfig",
    "TrainerConfig",
    "WandbConfig",
    "config_to_yaml",
    "describe",
    "field_docs",
    "load_config",
    "load_yaml",
    "save_config",
    "validate",
]
