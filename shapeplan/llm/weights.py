"""Checkpoint weights: memory-mapped safetensors (single file or sharded with an index), name and
shape validation against the config, and random weights for the benchmark presets.

The safetensors format is a little-endian u64 header length, a JSON header
``{name: {dtype, shape, data_offsets}}`` and the raw bytes; we map the file and build tensors that
view the mapping (copy-on-write), so nothing is read until a tensor is used.
"""
from __future__ import annotations

import itertools
import json
import math
import mmap
import os
import struct
import sys
import threading
import time
from typing import Any, Iterator, Sequence, TypeVar

import torch

from shapeplan import env
from shapeplan.errors import ModelError
from shapeplan.llm import stream_load
from shapeplan.llm.config import LlamaConfig, read_json

_ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _check_entry(path: str, name: str, e: Any) -> None:
    """A header entry is {"dtype": str, "shape": [int >= 0, ...], "data_offsets": [start, end]} with
    0 <= start <= end: anything else (a damaged or hand-made file) is a ModelError naming the tensor."""
    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0
    ok = (isinstance(e, dict) and isinstance(e.get("dtype"), str) and isinstance(e.get("shape"), list)
          and all(count(d) for d in e["shape"]) and isinstance(e.get("data_offsets"), list)
          and len(e["data_offsets"]) == 2 and all(count(o) for o in e["data_offsets"])
          and e["data_offsets"][0] <= e["data_offsets"][1])
    if not ok:
        raise ModelError(f"{path}: tensor {name!r} has a malformed header entry {json.dumps(e)[:120]} (expected "
                         '{"dtype": ..., "shape": [...], "data_offsets": [start, end]})')


class SafetensorsFile:
    """One memory-mapped .safetensors file."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) != 8:
                    raise ModelError(f"{path}: truncated safetensors file (no header)")
                (n,) = struct.unpack("<Q", head)
                if n > 100_000_000:
                    raise ModelError(f"{path}: implausible safetensors header length {n}")
                header = json.loads(f.read(n))
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if os.path.getsize(path) else None
        except (OSError, ValueError, RecursionError) as e:
            raise ModelError(f"{path}: cannot read safetensors file: {e}") from None
        self._base = 8 + n
        if not isinstance(header, dict):
            raise ModelError(f"{path}: the safetensors header must be a JSON object, got {type(header).__name__}")
        header.pop("__metadata__", None)
        for name, e in header.items():
            _check_entry(path, name, e)
        self.entries: dict[str, dict] = header

    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entries[name]["shape"])

    def layout(self, name: str) -> tuple[torch.dtype, int, int]:
        """(dtype, offset in the file, byte count) of tensor ``name``, checked against its shape."""
        e = self.entries[name]
        dt = _ST_DTYPES.get(e["dtype"])
        if dt is None:
            raise ModelError(f"{self.path}: tensor {name!r} has unsupported dtype {e['dtype']}")
        start, end = e["data_offsets"]
        want = math.prod(e["shape"]) * torch.empty((), dtype=dt).element_size()
        if end - start != want:
            raise ModelError(f"{self.path}: tensor {name!r} has {end - start} bytes, its shape and dtype need {want}")
        return dt, self._base + start, end - start

    def get(self, name: str) -> torch.Tensor:
        dt, offset, count = self.layout(name)
        shape = self.shape(name)
        if self._mm is None or offset + count > len(self._mm):
            raise ModelError(f"{self.path}: tensor {name!r} lies beyond the end of the file (truncated?)")
        if count == 0:
            return torch.empty(shape, dtype=dt)
        t = torch.frombuffer(self._mm, dtype=torch.uint8, count=count, offset=offset)
        return t.view(dt).reshape(shape)


#: checkpoints whose layers store some projections stacked in one tensor (Phi-3's ``qkv_proj`` and
#: ``gate_up_proj``): model_type -> {fused tensor (within a layer) -> its parts, each (name, LlamaConfig field of its
#: row count)}
FUSED: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "phi3": {"self_attn.qkv_proj.weight": (("self_attn.q_proj.weight", "q_size"),
                                           ("self_attn.k_proj.weight", "kv_size"),
                                           ("self_attn.v_proj.weight", "kv_size")),
             "mlp.gate_up_proj.weight": (("mlp.gate_proj.weight", "intermediate_size"),
                                         ("mlp.up_proj.weight", "intermediate_size"))}}


class CheckpointWeights:
    """All tensors of a checkpoint directory: ``model.safetensors`` or ``*.safetensors.index.json``. With the
    model's ``cfg``, the parts of a fused tensor (``FUSED``) are tensors of their own: row blocks of it, so byte
    ranges of its file (the memory map and the streamed load read them as any other tensor)."""

    def __init__(self, path: str, cfg: LlamaConfig | None = None) -> None:
        self.path = path
        index = os.path.join(path, "model.safetensors.index.json")
        self._where: dict[str, str] = {}
        self._files: dict[str, SafetensorsFile] = {}
        if os.path.exists(index):
            wm = read_json(index).get("weight_map", {})
            if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
                raise ModelError(f"{index}: 'weight_map' must map tensor names to file names")
            for name, fn in wm.items():
                self._where[name] = os.path.join(path, fn)
        else:
            files = sorted(fn for fn in os.listdir(path) if fn.endswith(".safetensors"))
            if not files:
                raise ModelError(f"{path}: no *.safetensors weights (only safetensors checkpoints are loaded; "
                                 "pickled .bin files are refused)")
            for fn in files:
                sf = self._file(os.path.join(path, fn))
                for name in sf.names():
                    self._where[name] = sf.path
        if cfg is not None:
            self._split(cfg)

    def _split(self, cfg: LlamaConfig) -> None:
        """Entries for the parts of every fused tensor of ``cfg``'s checkpoint layout (``FUSED``)."""
        for i in range(cfg.num_layers):
            for fused, parts in FUSED.get(cfg.model_type, {}).items():
                name = f"model.layers.{i}.{fused}"
                if name not in self._where:
                    continue                              # (missing: the parts' own check names them)
                sf = self._file(self._where[name])
                if name not in sf.entries:
                    raise ModelError(f"tensor {name!r} is missing from {sf.path} (the index says it is there)")
                e = sf.entries[name]
                rows = [getattr(cfg, attr) for _, attr in parts]
                shape = tuple(e["shape"])
                if len(shape) != 2 or shape[0] != sum(rows):
                    raise ModelError(f"tensor {name!r} in {sf.path} has shape {list(shape)}, expected [{sum(rows)}, "
                                     f"{cfg.hidden_size}] from config.json ({' + '.join(map(str, rows))} rows)")
                start, end = e["data_offsets"]
                row_bytes = (end - start) // shape[0]
                for (part, _), r0, n in zip(parts, [0, *itertools.accumulate(rows)], rows):
                    pname = f"model.layers.{i}.{part}"
                    sf.entries[pname] = {"dtype": e["dtype"], "shape": [n, shape[1]],
                                         "data_offsets": [start + r0 * row_bytes, start + (r0 + n) * row_bytes]}
                    self._where[pname] = sf.path

    def _file(self, path: str) -> SafetensorsFile:
        sf = self._files.get(path)
        if sf is None:
            if not os.path.exists(path):
                raise ModelError(f"{path}: shard listed in the index is missing")
            sf = self._files[path] = SafetensorsFile(path)
        return sf

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def file_of(self, name: str) -> str:
        return self._where.get(name, "<none>")

    def file(self, name: str) -> SafetensorsFile:
        return self._file(self._where[name])

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The tensor ``name``, checked to have ``shape``; errors name the tensor and the file."""
        if name not in self._where:
            files = sorted({os.path.basename(p) for p in self._where.values()}) or ["<no files>"]
            raise ModelError(f"tensor {name!r} is missing from the checkpoint {self.path} "
                             f"(files: {', '.join(files)})")
        sf = self._file(self._where[name])
        if name not in sf.entries:
            raise ModelError(f"tensor {name!r} is missing from {sf.path} (the index says it is there)")
        got = sf.shape(name)
        if got != tuple(shape):
            raise ModelError(f"tensor {name!r} in {sf.path} has shape {list(got)}, expected {list(shape)} "
                             "from config.json")
        return sf.get(name)


def expected_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape for a Llama-family model."""
    h, f, v, d = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (v, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (cfg.q_size, h), p + "self_attn.k_proj.weight": (cfg.kv_size, h),
            p + "self_attn.v_proj.weight": (cfg.kv_size, h), p + "self_attn.o_proj.weight": (h, cfg.q_size),
            p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        })
        if cfg.attention_bias:
            out.update({p + "self_attn.q_proj.bias": (cfg.q_size,), p + "self_attn.k_proj.bias": (cfg.kv_size,),
                        p + "self_attn.v_proj.bias": (cfg.kv_size,)})
        if cfg.qk_norm:
            out.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    return out


def fused_groups(cfg: LlamaConfig) -> list[list[str]]:
    """The tensors the decoder builder stacks into one weight (``model.build_graph``'s fused q/k/v and
    gate/up projections, and the q/k/v biases), each group in stacking order."""
    out = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        out.append([p + f"self_attn.{n}_proj.weight" for n in "qkv"])
        if cfg.attention_bias:
            out.append([p + f"self_attn.{n}_proj.bias" for n in "qkv"])
        out.append([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"])
    return out


def stacked_slots(cfg: LlamaConfig, shapes: dict[str, tuple[int, ...]], device: str | torch.device,
                  dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Uninitialised tensors for every name of ``fused_groups``, each group's tensors consecutive row
    blocks of one buffer: weights loaded into them are already in the stacked layout the builder uses,
    so it stacks nothing (vLLM's fused QKV parameters load the same way). Construction then copies no
    weights: on the H200 the copies of llama-1b's q/k/v and gate/up (1.3 GB, 32 new allocations) were
    part of every start."""
    out: dict[str, torch.Tensor] = {}
    for names in fused_groups(cfg):
        rows = sum(shapes[n][0] for n in names)
        buf = torch.empty((rows, *shapes[names[0]][1:]), device=device, dtype=dtype)
        row = 0
        for n in names:
            out[n] = buf[row:row + shapes[n][0]]
            row += shapes[n][0]
    return out


class _Progress:
    """A progress bar (rich) that appears only once a load has taken ``after`` seconds: a checkpoint in the
    page cache is loaded before it would show, and rich's import (~0.06 s) is not paid. ``enabled=None``:
    when stderr is a terminal. ``advance`` may be called from several threads."""

    def __init__(self, enabled: bool | None, what: str, total: int, after: float = 0.5) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.what, self.total, self.after = what, total, after
        self.done, self.t0 = 0, time.perf_counter()
        self._lock = threading.Lock()
        self._bar: Any = None
        self._task: Any = None

    def advance(self, n: int = 1) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.done += n
            if self._bar is None:
                if time.perf_counter() - self.t0 < self.after:
                    return
                from rich.progress import Progress
                self._bar = Progress(transient=True)
                self._bar.start()
                self._task = self._bar.add_task(self.what, total=self.total)
            self._bar.update(self._task, completed=self.done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


_T = TypeVar("_T")


def _progress(items: Sequence[_T], enabled: bool | None, what: str) -> Iterator[_T]:
    """``items``, with a ``_Progress`` bar over them."""
    bar = _Progress(enabled, what, len(items))
    try:
        for it in items:
            yield it
            bar.advance()
    finally:
        bar.close()


def load_weights(path: str, cfg: LlamaConfig, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None, progress: bool | None = None,
                 stream: bool | None = None) -> dict[str, torch.Tensor]:
    """name -> tensor for every tensor the model needs, validated, on ``device`` in ``dtype``.
    On the CPU in the checkpoint's dtype the tensors stay views of the memory map; on another device
    the q/k/v and gate/up tensors load into stacked buffers (``stacked_slots``). ``stream`` (default: on
    CUDA, unless ``SHAPEPLAN_WEIGHTS_STREAM=0``): read the files straight into device memory through
    pinned staging buffers on several threads (``stream_load``); otherwise each tensor is copied from
    the memory map."""
    dev = torch.device(device)
    if stream if stream is not None else streaming(dev):
        return StreamedLoad(path, cfg, dev, dtype, progress).run()
    ckpt = CheckpointWeights(path, cfg)
    shapes = expected_shapes(cfg)
    for name, shape in shapes.items():                # validate everything before moving anything
        ckpt.get(name, shape)
    slots: dict[str, torch.Tensor] = {}
    if dev.type != "cpu" and dtype is not None:
        slots = stacked_slots(cfg, shapes, dev, dtype)
    out: dict[str, torch.Tensor] = {}
    bar = _Progress(progress, "loading weights", len(shapes))
    try:
        for name in shapes:
            t = ckpt.get(name, shapes[name])
            slot = slots.get(name)
            out[name] = slot.copy_(t) if slot is not None else t.to(device=dev, dtype=dtype or t.dtype)
            bar.advance()
    finally:
        bar.close()
    return out


class StreamedLoad:
    """``load_weights`` through ``stream_load``, in two steps: construction validates the checkpoint and
    allocates every destination on the device (a stacked slot, or a new tensor; a tensor stored in
    another dtype gets a temporary of its own dtype, converted on the device after the read), ``run``
    reads the files into them. Between the two, ``head`` is the LM head (or tied embedding) tensor the
    load will fill: the CUDA warm-up may run its GEMM on it while it loads (values unused)."""

    def __init__(self, path: str, cfg: LlamaConfig, device: torch.device, dtype: torch.dtype | None,
                 progress: bool | None = None) -> None:
        ckpt = CheckpointWeights(path, cfg)
        self.shapes = shapes = expected_shapes(cfg)
        for name, shape in shapes.items():                # validate everything before moving anything
            ckpt.get(name, shape)
        self.device, self.dtype, self.progress = device, dtype, progress
        slots = stacked_slots(cfg, shapes, device, dtype) if dtype is not None else {}
        self.out: dict[str, torch.Tensor] = {}
        self.plan: list[stream_load.Piece] = []
        self.convert: list[tuple[str, torch.Tensor, torch.Tensor | None]] = []
        for name, shape in shapes.items():
            sf = ckpt.file(name)
            src_dt, offset, _ = sf.layout(name)
            slot = slots.get(name)
            if src_dt == (dtype or src_dt):
                fill = self.out[name] = slot if slot is not None else torch.empty(shape, dtype=src_dt, device=device)
            else:
                fill = torch.empty(shape, dtype=src_dt, device=device)
                self.convert.append((name, fill, slot))
            self.plan += stream_load.pieces(name, sf.path, offset, fill)

    @property
    def head(self) -> torch.Tensor | None:
        """The LM head (or the tied embedding) as it will be after ``run``, if it is read in place."""
        return self.out.get("lm_head.weight", self.out.get("model.embed_tokens.weight"))

    def run(self) -> dict[str, torch.Tensor]:
        bar = _Progress(self.progress, "loading weights", sum(p.nbytes for p in self.plan))
        try:
            stream_load.load(self.plan, self.device, on_progress=bar.advance)
        finally:
            bar.close()
        for name, tmp, slot in self.convert:
            self.out[name] = slot.copy_(tmp) if slot is not None else tmp.to(self.dtype)
        return {name: self.out[name] for name in self.shapes}


def streaming(device: torch.device) -> bool:
    """Whether ``load_weights`` streams to ``device`` by default (CUDA, ``SHAPEPLAN_WEIGHTS_STREAM``)."""
    return device.type == "cuda" and env.get("SHAPEPLAN_WEIGHTS_STREAM")


def random_weights(cfg: LlamaConfig, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                   seed: int = 0, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Random weights with the checkpoint's names and shapes (norm weights 1), made on ``device``; the
    q/k/v and gate/up tensors are row blocks of stacked buffers (``stacked_slots``; same values)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = dtype or cfg.torch_dtype
    shapes = expected_shapes(cfg)
    slots = stacked_slots(cfg, shapes, device, dtype)
    out: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, device=device, dtype=dtype)
        else:
            t = slots[name] if name in slots else torch.empty(shape, device=device, dtype=dtype)
            out[name] = t.normal_(0.0, std, generator=gen)
    return out
