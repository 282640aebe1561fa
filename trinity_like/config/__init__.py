"""Configuration: one typed dataclass per part, loaded from YAML with ``key=value`` overrides.

The dataclasses are the single source of truth for every setting: each field carries its description as a
docstring right under it, and its allowed values in ``field(metadata=...)`` (``choices``, ``choices_from`` a
registry, ``min``, ``max``). ``docs/config.md`` is generated from them (``trinity-like config-docs``).
OmegaConf turns them into structured configs, so an unknown key or a value of the wrong type is caught on
load; ``validate`` then checks choices, ranges and the rules that tie fields together.

Every problem raises :class:`ConfigError` with one sentence that names the key and says how to fix it; the
command line prints it and exits with status 2.

The package: ``schema`` (the dataclasses), ``loading`` (YAML, overrides, OmegaConf errors, ``to_yaml``),
``validation``, and ``tools`` (the tool config file that ``explorer.tool_config_path`` names). Runtime state derived from a config (resolved paths) lives in
``trinity_like.runtime.paths.RunPaths``, never in user fields.
"""

from trinity_like.config.loading import flatten, load_config, to_yaml
from trinity_like.config.schema import (
    ENGINES,
    MODES,
    RENAMED_KEYS,
    WANDB_MODES,
    AlgorithmConfig,
    BufferConfig,
    Config,
    ConfigError,
    CriticConfig,
    EvalTasksetConfig,
    ExplorerConfig,
    KLControlConfig,
    LoraConfig,
    ModelConfig,
    MonitorConfig,
    NodeConfig,
    OffPolicyConfig,
    OptimizerConfig,
    OverlongBufferConfig,
    RewardConfig,
    RewardModelConfig,
    SamplingConfig,
    ServeConfig,
    SynchronizerConfig,
    TasksetConfig,
    TrainerConfig,
    VLLMConfig,
    WarmupConfig,
    allowed_values,
)
from trinity_like.config.validation import validate

__all__ = ['AlgorithmConfig', 'BufferConfig', 'Config', 'ConfigError', 'CriticConfig', 'ENGINES', 'EvalTasksetConfig', 'ExplorerConfig', 'KLControlConfig', 'LoraConfig', 'MODES', 'ModelConfig', 'MonitorConfig', 'NodeConfig', 'OffPolicyConfig', 'OptimizerConfig', 'OverlongBufferConfig', 'RENAMED_KEYS', 'RewardConfig', 'RewardModelConfig', 'SamplingConfig', 'ServeConfig', 'SynchronizerConfig', 'TasksetConfig', 'TrainerConfig', 'VLLMConfig', 'WANDB_MODES', 'WarmupConfig', 'allowed_values', 'flatten', 'load_config', 'to_yaml', 'validate']
