"""The package's version (pyproject.toml's), in the base layer so that every layer may name it."""

__version__ = "0.1.0"
