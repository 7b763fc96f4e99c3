"""The package's version: the one constant pyproject.toml reads (setuptools dynamic version)."""

__version__ = "0.1.0"
