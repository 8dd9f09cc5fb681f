"""Engine: the public entry point (``sp.compile(model).run(feeds)``)."""
from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from shapeplan.errors import InputError
from shapeplan.ir.graph import Graph
from shapeplan.ir.tensors import runtime_to_numpy
from shapeplan.plan.compiler import Plan, compile_plan
from shapeplan.runtime.backends.slot_by_slot import run_slot_by_slot
from shapeplan.runtime.feeds import to_runtime, validate_feeds
from shapeplan.runtime.modes import Mode


def _move(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, list):
        return [_move(y, device) for y in x]
    return x


class Engine:
    """A compiled model. ``run(feeds)`` executes it; plans are built per requested outputs."""

    def __init__(self, graph: Graph, device: str | torch.device = "cpu", mode: str | Mode = "auto") -> None:
        self.graph = graph
        self.device = torch.device(device)
        self.mode = Mode.parse(mode)
        self._lock = threading.Lock()
        self._plans: dict[tuple, Plan] = {}
        self._constants: dict[int, Any] = {}
        # variables persist across calls; they live on the engine's device
        self.variables: dict[str, Any] = {v.name: _move(v.data.clone(), self.device)
                                          for v in graph.variables}
        self.calls = 0

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.graph.outputs]

    def _plan(self, outputs: Sequence[str] | None) -> Plan:
        key = tuple(outputs) if outputs is not None else None
        plan = self._plans.get(key)
        if plan is None:
            with self._lock:
                plan = self._plans.get(key)
                if plan is None:
                    plan = compile_plan(self.graph, outputs)
                    self._plans[key] = plan
        return plan

    def run(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None) -> dict[str, Any]:
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a dict of input name -> array, got {type(feeds).__name__}")
        validate_feeds(self.graph.inputs, feeds)
        torch_in = any(isinstance(x, torch.Tensor) for x in feeds.values()) or \
            (not feeds and False)
        plan = self._plan(outputs)
        regs: list[Any] = [None] * plan.n_regs
        for name, r in plan.inputs:
            regs[r] = to_runtime(feeds[name], self.device)
        for r, data in plan.constants:
            regs[r] = self._constant(r, data, plan)
        for name, r in plan.variables:
            regs[r] = self.variables[name]
        outs = run_slot_by_slot(plan, regs)
        self.calls += 1
        result = {}
        for (name, _), v in zip(plan.outputs, outs):
            result[name] = v if torch_in else runtime_to_numpy(v)
        return result

    def _constant(self, reg: int, data: Any, plan: Plan) -> Any:
        key = (id(plan), reg)
        c = self._constants.get(key)  # type: ignore[arg-type]
        if c is None:
            c = _move(data, self.device)
            self._constants[key] = c  # type: ignore[index]
        return c

    def __call__(self, feeds: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        return self.run({**(feeds or {}), **kw})
