"""Model importers. ``load(src)`` picks one by what ``src`` is."""
from __future__ import annotations

import os
from typing import Any

from shapeplan.errors import ModelError
from shapeplan.ir.graph import Graph


def load(src: Any, **kw: Any) -> Graph:
    """ONNX path / bytes / ModelProto, sp.Graph, HF checkpoint dir, .gguf file, torch ExportedProgram."""
    if isinstance(src, Graph):
        return src
    if isinstance(src, (str, os.PathLike)):
        path = os.fspath(src)
        if os.path.isdir(path):
            if os.path.exists(os.path.join(path, "config.json")):
                from shapeplan.importers.hf import load_hf
                return load_hf(path, **kw)
            raise ModelError(f"directory {path!r} has no config.json (not a Hugging Face checkpoint)")
        if path.endswith(".gguf"):
            from shapeplan.importers.gguf import load_gguf
            return load_gguf(path, **kw)
        from shapeplan.ir.onnx_io import load_onnx
        return load_onnx(path, **kw)
    try:
        import onnx
        if isinstance(src, (onnx.ModelProto, bytes, bytearray)):
            from shapeplan.ir.onnx_io import load_onnx
            return load_onnx(src, **kw)
    except ImportError:  # pragma: no cover
        pass
    try:
        from torch.export import ExportedProgram
        if isinstance(src, ExportedProgram):
            from shapeplan.importers.torch_export import load_exported
            return load_exported(src, **kw)
    except ImportError:  # pragma: no cover
        pass
    raise ModelError(f"cannot load a model from {type(src).__name__}; give an ONNX path/ModelProto, "
                     "an sp.Graph, a Hugging Face directory, a .gguf file or a torch ExportedProgram")
