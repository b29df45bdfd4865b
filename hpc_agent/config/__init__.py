"""Config: schema (dataclasses), loading (YAML + overrides) and validation."""
from hpc_agent.config.problems import ConfigError, Problem
from hpc_agent.config.schema import Config, RunConfig, SlurmConfig, TrainConfig, WatchConfig

__all__ = ["Config", "ConfigError", "Problem", "RunConfig", "SlurmConfig", "TrainConfig", "WatchConfig"]
