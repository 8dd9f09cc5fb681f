from shapeplan.runtime.engine import Engine
from shapeplan.runtime.modes import Mode

__all__ = ["Engine", "Mode"]
