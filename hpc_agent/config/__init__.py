"""Config: schema (dataclasses), loading (YAML + overrides) and validation."""
