"""Engine: the public entry point (``sp.compile(model).run(feeds)``).

One Engine holds one graph, compiled once per requested-output set into a ``Plan``, and a plan cache
of ``PlanRunner``s keyed by (requested outputs, placeholder shape signature, mode, device, thread).
A new shape signature creates another runner; it never mutates a frozen one.
"""
from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

import torch

from shapeplan import diagnostics, env
from shapeplan.cache.memory import PlanCache
from shapeplan.errors import InputError, LifecycleError
from shapeplan.ir.dtypes import dtype_name
from shapeplan.ir.graph import Graph
from shapeplan.ir.tensors import runtime_to_numpy
from shapeplan.plan.compiler import Plan, compile_plan
from shapeplan.runtime.backends import get_backend
from shapeplan.runtime.feeds import to_runtime, validate_feeds
from shapeplan.runtime.modes import Mode
from shapeplan.runtime.runner import Phase, PlanKey, PlanRunner


def _move(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, list):
        return [_move(y, device) for y in x]
    return x


def _adoptable(variables: list[Any], device: torch.device) -> set[str]:
    """Names of the variables whose initial tensors can serve as the engine's state without a copy: on
    the engine's device, contiguous (no broadcast view) and overlapping no other variable's memory."""
    spans: list[tuple[int, int, int, str]] = []
    for v in variables:
        t = v.data
        here = isinstance(t, torch.Tensor) and t.device.type == device.type and \
            (device.index is None or t.device.index == device.index)
        if here and t.is_contiguous() and t.numel():
            start = t.data_ptr()
            spans.append((start, start + t.numel() * t.element_size(), id(t.untyped_storage()), v.name))
    spans.sort()
    clash: set[str] = set()
    for a, b in zip(spans, spans[1:]):
        if b[0] < a[1]:                          # two variables over the same bytes: both are copied
            clash.update((a[3], b[3]))
    return {name for *_, name in spans if name not in clash}


def resolve_mode(mode: Mode, device: torch.device) -> tuple[Mode, bool, str | None]:
    """(the mode that runs, per-segment fallback allowed, why the requested mode was replaced)."""
    if mode in (Mode.SLOT_BY_SLOT, Mode.SHAPE_INFERENCE_ONLY):
        return mode, False, None
    if mode is Mode.AUTO:
        if device.type == "cuda":                      # triton -> cuda_graphs (per segment) -> slot_by_slot
            for m in (Mode.TRITON, Mode.CUDA_GRAPHS):
                b = get_backend(m)
                if b is not None and b.available(device) is None:
                    return m, True, None
        return Mode.EMULATED_REPLAY, True, None
    b = get_backend(mode)
    why = None if b is not None else f"no {mode.value} backend is registered"
    if b is not None:
        why = b.available(device)
    if why is None:
        return mode, False, None
    return Mode.EMULATED_REPLAY, False, f"{mode.value} unavailable on {device}: {why}; running emulated_replay"


def _guard_chunks(values: list[Any], size: int) -> list[tuple[tuple[Any, Any, int | None], ...]]:
    """The constant guard in chunks of ``size``: (Value, its data object, the tensor's version counter
    or None for a non-tensor) per constant."""
    guards = [(v, v.data, v.data._version if isinstance(v.data, torch.Tensor) else None) for v in values]
    return [tuple(guards[i:i + size]) for i in range(0, len(guards), size)]


class Engine:
    """A compiled model. ``run(feeds)`` executes it; plans are built per requested outputs and shapes."""

    #: with ``weight_guard="sampled"``: constants whose identity and version counter a steady replay
    #: checks (round robin over chunks of this size; every other call checks all of them)
    GUARD_CHUNK = 32

    def __init__(self, graph: Graph, device: str | torch.device = "cpu", mode: str | Mode = "auto", *,
                 warmup_calls: int = 1, max_plans: int = 64, max_plan_bytes: int = 1 << 30,
                 max_recaptures: int = 3, fallback: bool | None = None,
                 weight_guard: str | None = None, adopt_variables: bool = False) -> None:
        self.graph = graph
        self.device = torch.device(device)
        self.mode = Mode.parse(mode)
        self.exec_mode, auto_fallback, why = resolve_mode(self.mode, self.device)
        if self.device.type == "cuda":
            from shapeplan.runtime import determinism
            determinism.apply()                    # TF32 opt-in; SHAPEPLAN_DETERMINISTIC=1 bit-comparable
            if self.exec_mode is Mode.TRITON:
                from shapeplan.runtime.backends.triton import warmup
                warmup.prepare(self.device)   # Triton import + patch() + driver in the background (start-up)
        if why:
            diagnostics.record("FALLBACK", why, requested=self.mode, running=self.exec_mode)
        self.fallback = auto_fallback if fallback is None else fallback
        self.warmup_calls, self.max_recaptures = max(1, warmup_calls), max_recaptures
        self._lock = threading.Lock()
        self._plans: dict[tuple | None, Plan] = {}
        self.cache = PlanCache(max_plans, max_plan_bytes, on_evict=lambda k, r: r.release())
        # constants are snapshotted (moved to the device once); a replaced or edited weight is rejected
        self.constants: dict[str, Any] = {v.name: _move(v.data, self.device) for v in graph.constants}
        # "full" (default): every call checks every constant, so an edited weight is rejected at once;
        # "sampled": a steady replay checks one chunk (bounded cost; caught within a round of chunks)
        guard = (weight_guard or env.get("SHAPEPLAN_WEIGHT_GUARD")).strip().lower()
        if guard not in ("full", "sampled"):
            raise ValueError(f"weight_guard must be 'full' or 'sampled', got {guard!r}")
        self._guard_sampled = guard == "sampled"
        self._guards = _guard_chunks(graph.constants, self.GUARD_CHUNK)
        self._guard_next = 0
        # variables persist across calls; they live on the engine's device
        # (``adopt_variables``: the graph's own tensors where they can be the state, see _adoptable)
        owned = _adoptable(graph.variables, self.device) if adopt_variables else set()
        self.variables: dict[str, Any] = {v.name: v.data if v.name in owned else _move(v.data.clone(), self.device)
                                          for v in graph.variables}
        self.calls = 0
        self._valid: set[tuple] = set()           # feed specs that passed validate_feeds
        self._mode_value, self._device_str = self.exec_mode.value, str(self.device)
        self._last_key: PlanKey | None = None
        self._names = {v.name: v for v in graph.inputs}

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.graph.outputs]

    # ------------------------------------------------------------------ plans
    def plan(self, outputs: Sequence[str] | None = None) -> Plan:
        key = tuple(outputs) if outputs is not None else None
        plan = self._plans.get(key)
        if plan is None:
            with self._lock:
                plan = self._plans.get(key)
                if plan is None:
                    plan = compile_plan(self.graph, outputs)
                    self._plans[key] = plan
                    diagnostics.record("COMPILE", "plan compiled", outputs=plan.output_names, **plan.summary())
        return plan

    _plan = plan   # older name

    def _runner(self, plan: Plan, key: PlanKey) -> PlanRunner:
        runner = self.cache.get(key)
        if runner is None:
            runner = self._new_runner(plan, key)
            self._keep(runner)
        return runner

    def _new_runner(self, plan: Plan, key: PlanKey) -> PlanRunner:
        backend = None if self.exec_mode in (Mode.SLOT_BY_SLOT, Mode.SHAPE_INFERENCE_ONLY) \
            else get_backend(self.exec_mode)
        consts = {r: self.constants.get(plan.reg_names[r]) if plan.reg_names[r] in self.constants
                  else _move(d, self.device) for r, d in plan.constants}
        name = f"p{len(self._plans)}.{abs(hash(key)) % 10**6:06d}"
        return PlanRunner(plan, key, name, device=self.device, backend=backend, constants=consts,
                          variables=self.variables, warmup_calls=self.warmup_calls, fallback=self.fallback,
                          max_recaptures=self.max_recaptures)

    def _keep(self, runner: PlanRunner) -> None:
        self.cache.put(runner.key, runner)
        diagnostics.record("SHAPE", "new shape signature: new plan", plan=runner.name, signature=str(runner.key.signature))

    def _check_constants(self, replaying: bool = False) -> None:
        """Reject a constant replaced (``value.data = ...``) or edited in place after compile.

        By default every call checks every constant. With ``weight_guard="sampled"`` a steady replay
        checks one chunk of ``GUARD_CHUNK`` constants (round robin), so the cost per call is bounded and
        an edit is caught within ``ceil(#constants / GUARD_CHUNK)`` calls; any other call (a new plan,
        warm-up, freeze, capture) still checks every constant."""
        guards = self._guards
        if not guards:
            return
        if replaying and self._guard_sampled:
            i = self._guard_next
            self._guard_next = (i + 1) % len(guards)
            chunks = (guards[i],)
        else:
            chunks = guards
        for chunk in chunks:
            for v, obj, ver in chunk:
                if v.data is not obj or (ver is not None and obj._version != ver):
                    what = "replaced" if v.data is not obj else "modified in place"
                    diagnostics.record("LIFECYCLE", "constant changed after compile", constant=v.name, what=what)
                    raise LifecycleError(f"constant {v.name!r} was {what} after sp.compile snapshotted it; "
                                         "constants are frozen into the plans: compile a new engine "
                                         "(or make it a Graph.variable for mutable state)")

    # ------------------------------------------------------------------ run
    def run(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None, *,
            copy: bool = True) -> dict[str, Any]:
        """Run the plan of ``outputs`` (default: every graph output) for ``feeds`` (input name -> array).

        ``copy=False`` (torch feeds, zero-copy): a replaying plan's outputs are its own buffers, not copies:
        valid until this plan's next call, and not to be written. A loop that feeds a call's outputs back
        into the next call (``input_buffers``) then copies each value once, device to device."""
        if type(feeds) is not dict and not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a dict of input name -> array, got {type(feeds).__name__}")
        plan, rt = self._bind(feeds, outputs)
        torch_in = any(isinstance(x, torch.Tensor) for x in feeds.values())
        if self.exec_mode is Mode.SHAPE_INFERENCE_ONLY:
            self._check_constants()
            from shapeplan.runtime.shape_only import infer_outputs
            return infer_outputs(plan, rt, self.constants, self.variables)
        key = self._key(plan, rt)
        runner = self._runner(plan, key)
        self._check_constants(replaying=runner.phase is Phase.REPLAYING)
        if runner.input_dtypes and tuple(getattr(x, "dtype", None) for x in rt) != runner.input_dtypes:
            self._check_dtypes(plan, runner, rt)
        with self.cache.pinned(key):
            outs = runner.run(rt, copy=copy)
        self.calls += 1
        self._last_key = key
        if torch_in:
            return {name: v for (name, _), v in zip(plan.outputs, outs)}
        vals = self.graph.values        # declared dtypes restore int4/float4 (they run widened)
        return {name: runtime_to_numpy(v, getattr(vals.get(name), "dtype", None))
                for (name, _), v in zip(plan.outputs, outs)}

    def input_buffers(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """The staging buffers that ``run(feeds, outputs)`` copies its inputs into, by input name, once that
        call's plan is frozen (else ``{}``: nothing to write into yet). Only the feeds' shapes matter. A
        buffer passed back as its own input's feed is not copied: write the next call's value into it
        (e.g. the previous call's output, ``copy=False``) and feed it, one device copy instead of a copy
        out and a copy in. Its contents are the last call's input until then."""
        plan, rt = self._bind(feeds, outputs)
        runner = self.cache.get(self._key(plan, rt))
        if runner is None or runner.phase is Phase.SLOT_BY_SLOT:
            return {}
        return {name: runner.staging[r] for name, r in plan.inputs if r in runner.staging}

    def _bind(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None) -> tuple[Plan, list[Any]]:
        """The plan of ``outputs`` and ``feeds`` as runtime values in its input order (feeds validated first:
        a bad one is an ``InputError`` naming it)."""
        self._validate(feeds)
        plan = self.plan(outputs)
        device = self.device
        return plan, [to_runtime(feeds[name], device) for name, _ in plan.inputs]

    def _key(self, plan: Plan, rt: list[Any]) -> PlanKey:
        """The plan cache key of a call: outputs, shape signature, mode, device, calling thread."""
        sig = tuple(tuple(x.shape) if isinstance(x, torch.Tensor) else
                    (len(x),) if isinstance(x, list) else None for x in rt)
        return PlanKey(plan.requested, sig, self._mode_value, self._device_str, threading.get_ident())

    def prepare(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None) -> bool:
        """Freeze, now and on this thread, the plan that ``run(feeds, outputs)`` would use, from its
        frozen-plan record (docs/runtime.md), and compile its segments, so that call captures at once.
        Only the feeds' shapes, dtypes and devices matter, not their values. Returns False, changing
        nothing, when there is no usable record (then the first run records as usual), when records are
        off (the CPU by default), or when the plan has already run. Used by the LLM pipeline while its
        CUDA warm-up runs (start-up time). A signature with a plan already (run or prepared) is left
        as it is (False)."""
        plan, rt = self._bind(feeds, outputs)
        if self.exec_mode in (Mode.SLOT_BY_SLOT, Mode.SHAPE_INFERENCE_ONLY):
            return False
        key = self._key(plan, rt)
        if self.cache.get(key) is not None:
            return False                          # this signature has a plan already
        self._check_constants()
        runner = self._new_runner(plan, key)
        if not runner.prepare(rt):
            return False                          # no record: nothing kept
        self._keep(runner)
        return True

    def _validate(self, feeds: Mapping[str, Any]) -> None:
        """``validate_feeds`` once per distinct (names, types, dtypes, shapes) of the feeds."""
        try:
            spec = tuple((k, type(x), getattr(x, "dtype", None), getattr(x, "shape", None))
                         for k, x in feeds.items())
            if spec in self._valid:
                return
        except TypeError:                     # an unhashable dtype/shape: validate every time
            spec = None
        validate_feeds(self.graph.inputs, feeds)
        if spec is not None:
            if len(self._valid) > 1024:
                self._valid.clear()
            self._valid.add(spec)

    def _check_dtypes(self, plan: Plan, runner: PlanRunner, rt: list[Any]) -> None:
        for (name, _), want, x in zip(plan.inputs, runner.input_dtypes, rt):
            got = getattr(x, "dtype", None)
            if got != want:
                w = dtype_name(want)
                g = dtype_name(got)
                raise InputError(f"input {name!r}: expected dtype {w} (as in earlier calls with shape "
                                 f"{list(getattr(x, 'shape', []))}), got {g}")

    def __call__(self, feeds: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        return self.run({**(feeds or {}), **kw})

    # ------------------------------------------------------------------ lifecycle
    def _current(self) -> PlanRunner | None:
        if self._last_key is not None:
            r = self.cache.get(self._last_key)
            if r is not None:
                return r
        rs = [r for r in self.cache.values() if r.key.thread == threading.get_ident()]
        return rs[-1] if rs else None

    def freeze(self) -> None:
        """Explicit SHAPES_FROZEN for the current (last used) shape signature."""
        r = self._current()
        if r is None:
            raise LifecycleError("engine.freeze(): no shape signature yet; run the engine once with the "
                                 "shapes to freeze")
        if r.backend is None and self.exec_mode is Mode.SLOT_BY_SLOT:
            r.backend = None
        r.freeze()

    @property
    def phase(self) -> Phase | None:
        r = self._current()
        return r.phase if r is not None else None

    def runners(self) -> list[PlanRunner]:
        return self.cache.values()

    def inspect(self) -> "Any":
        from shapeplan.runtime.inspection import Inspection
        return Inspection(self, self._current())

    def close(self) -> None:
        self.cache.clear()
