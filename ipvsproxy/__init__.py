"""ipvsproxy: an incremental IPVS-mode kube-proxy."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ipvsproxy")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
