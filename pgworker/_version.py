"""The installed version, read from the package metadata so that it is written in one place
(pyproject.toml)."""

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "pgworker-queue"
"""The distribution's name on the package index (the import package is always `pgworker`)."""

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
