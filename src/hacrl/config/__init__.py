"""The one config tree of a hacrl run: defaults < YAML file < dotted `key=value` overrides.

    schema       one dataclass per group: fields, defaults, docstrings, per-group checks, resume policy marks
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

from hacrl.config.docs import describe, field_docs
from hacrl.config.loading import RENAMED, config_to_yaml, load_config, load_yaml, save_config
from hacrl.config.schema import (
    GROUPS,
    NOT_EXACT,
    SAFE,
    AgentConfig,
    AlgorithmConfig,
    CheckpointConfig,
    DataConfig,
    DatasetSpec,
    DeadlineConfig,
    EvalConfig,
    LoggingConfig,
    LoraConfig,
    RayConfig,
    RolloutConfig,
    RuntimeConfig,
    ScoringConfig,
    SharingConfig,
    TrackioConfig,
    TrainConfig,
    TrainerConfig,
    WandbConfig,
    refuse_model_code,
    require_model_dir,
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
    "refuse_model_code",
    "require_model_dir",
    "save_config",
    "validate",
]
