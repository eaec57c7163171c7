"""The package's version, in its own module so that the engine can name it without importing the package root."""

__version__ = "0.1.0"
