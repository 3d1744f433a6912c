"""Operations: health and Prometheus metrics."""

from . import routes  # noqa: F401  (registers the routes on bp)
from .blueprint import bp

__all__ = ["bp"]
