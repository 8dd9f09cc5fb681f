"""Quantized weights: block formats (GGUF and shapeplan's load-time int8/int4), dequantization in
torch, our quantizers (K-quants, group-wise int), and the GGUF writer of ``shapeplan quantize``.
The ops that read packed weights are in shapeplan/ops/quantized.py; docs/llm.md#quantization."""
from __future__ import annotations

from shapeplan.quant.formats import GGUF_TYPES, QTYPES, QType, QuantTypeError, QuantWeight, qtype

__all__ = ["GGUF_TYPES", "QTYPES", "QType", "QuantTypeError", "QuantWeight", "qtype"]
