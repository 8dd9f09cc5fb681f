"""Multi-device execution: tensor parallelism over torch.distributed (one process per device) and
pipeline placement of one model's layers over several devices (one process). See docs/parallel.md."""
from shapeplan.parallel.launch import init_distributed, init_from_env, leave_group, spawn
from shapeplan.parallel.placement import STRATEGIES, Placement
from shapeplan.parallel.staged import StagedEngine
from shapeplan.parallel.tensor import TensorParallel

__all__ = ["Placement", "STRATEGIES", "StagedEngine", "TensorParallel", "init_distributed", "init_from_env", "leave_group", "spawn"]
