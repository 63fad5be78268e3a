"""The config layer's one error type (its own module: every other config module,
the bounded reader included, raises it without importing one another)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """An invalid configuration value; the message names the field and the fix."""
