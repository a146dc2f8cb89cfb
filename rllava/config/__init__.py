"""rllava's config: dataclass schema (`schema.py`) and the YAML + command-line loader (`loader.py`)."""

from rllava.config.loader import ALIASES, as_config, config_to_yaml, load_config
from rllava.config.schema import (ActorConfig, AlgorithmConfig, CheckpointConfig, ConfigError, CriticConfig, DataConfig,
                                  DeepSpeedConfig, FSDPConfig, KLControlConfig, ModelConfig, OptimConfig,
                                  PolicyLossConfig, PPOConfig, RefConfig, RewardConfig, RolloutConfig, SGLangConfig,
                                  TrainerConfig, VLLMConfig)

__all__ = [
    "ALIASES", "ActorConfig", "AlgorithmConfig", "CheckpointConfig", "ConfigError", "CriticConfig", "DataConfig",
    "DeepSpeedConfig", "FSDPConfig", "KLControlConfig", "ModelConfig", "OptimConfig", "PPOConfig",
    "PolicyLossConfig", "RefConfig", "RewardConfig", "RolloutConfig", "SGLangConfig", "TrainerConfig",
    "VLLMConfig", "as_config", "config_to_yaml", "load_config",
]
