"""Plan caches: ``PlanCache`` (in memory) and ``DiskCache`` (compiled models on disk)."""
from shapeplan.cache.memory import PlanCache

__all__ = ["PlanCache", "DiskCache"]


def __getattr__(name: str):  # noqa: ANN201
    if name == "DiskCache":
        from shapeplan.cache.disk import DiskCache
        return DiskCache
    raise AttributeError(name)
