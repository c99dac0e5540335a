"""edgefl: model-heterogeneous federated learning for edge fleets."""

from edgefl.errors import EdgeflError

__all__ = ["EdgeflError", "__version__"]
__version__ = "0.1.0"
