"""Compile the quantized-matmul (and the bf16 decode GEMV) Triton kernels for sm_90 (Hopper) without a GPU, with the ptxas that
ships in Triton's wheel; run by tests/ops/test_quant_ops.py in a process without TRITON_INTERPRET.

    python tests/ops/_compile_sm90.py gemv:Q4_K:1 gemm:Q6_K:0 rows:Q8_0:0

Prints one JSON line: spec -> {"ok": bool, "error": str, "vector_loads": bool}. Exit 3: cannot compile
here (another Triton API, no CUDA backend)."""
from __future__ import annotations

import json
import sys

try:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as e:
    print(f"no Triton CUDA compiler: {e}")
    sys.exit(3)

from shapeplan.quant.formats import QTYPES
from shapeplan.runtime.backends.triton.kernels import gguf


def compile_one(kernel: str, name: str, m: int):
    q = QTYPES[name]
    meta = dict(KIND=gguf.KINDS[q.kind], TS=q.type_size, NSUB=q.tile[0], SUBLEN=q.tile[1])
    ptrs = {"x_ptr": "*bf16", "w_ptr": "*u8", "y_ptr": "*bf16"}
    if kernel == "gemv1":                 # the one-row Q4_K / Q6_K / Q8_0 kernel; m: 0 plain, 1 norm + GLU, 2 residual
        from shapeplan.runtime.backends.triton.kernels import qgemv
        fn = qgemv.KERNELS[name]
        ptrs = {"X": "*bf16", "NW": "*bf16", "W": "*i32", "R": "*bf16", "Y": "*bf16"}
        args = ["N", "K", "HALF", "ROW_WORDS"]
        bn, ch, warps = qgemv.DEFAULT[name]
        consts = dict(BN=bn, CH=ch, NORM=m == 1, RES=m == 2, GLU=m == 1)
        sig = {**ptrs, **{a: "i32" for a in args}, "eps": "fp32", **{c: "constexpr" for c in consts}}
        names = list(sig)
        attrs = {(names.index(p),): [["tt.divisibility", 16]] for p in ("X", "NW", "W", "K", "ROW_WORDS")}
        return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    if kernel == "dense":     # the bf16 decode GEMV of kernels/gemv.py; m: 0 plain, 1 norm + GLU, 2 residual, 3 = 1 + PDL
        from shapeplan.runtime.backends.triton.kernels import gemv as dense
        ptrs = {"X": "*bf16", "NW": "*bf16", "W": "*bf16", "R": "*bf16", "Y": "*bf16"}
        bn, bk, warps = dense.config(3072, 2048)
        consts = dict(BN=bn, BK=bk, NORM=m in (1, 3), RES=m == 2, GLU=m in (1, 3), EVEN_K=True, PDL=m == 3)
        sig = {**ptrs, **{a: "i32" for a in ("N", "K", "HALF", "stride_wn")}, "eps": "fp32",
               **{c: "constexpr" for c in consts}}
        names = list(sig)
        attrs = {(names.index(p),): [["tt.divisibility", 16]] for p in ("X", "NW", "W", "K", "stride_wn")}
        return triton.compile(ASTSource(fn=dense._gemv_kernel, signature=sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    if kernel == "gemv":
        fn, args = gguf._gemv_kernel, ["N", "K", "ROW_BYTES", "stride_xm", "stride_ym", "CHUNKS_PER_PROGRAM"]
        consts = dict(M=m, BM=max(2, 1 << (m - 1).bit_length()), BN=gguf.GEMV["bn"], PARTIAL=False,
                      UNROLL=gguf.GEMV["unroll"], **meta)
        opts = {"num_warps": gguf.GEMV["warps"]}
    elif kernel == "gemm":
        fn, args = gguf._gemm_kernel, ["M", "N", "K", "ROW_BYTES", "stride_xm", "stride_ym"]
        consts = dict(BM=gguf.GEMM["bm"], BN=gguf.GEMM["bn"], NT=max(1, min(q.tile[0], gguf.GEMM["bk"] // q.tile[1])),
                      IEEE=False, **meta)
        opts = {"num_warps": gguf.GEMM["warps"], "num_stages": gguf.GEMM["stages"]}
    else:
        fn, args = gguf._rows_kernel, ["R", "K", "ROW_BYTES", "stride_o"]
        ptrs = {"w_ptr": "*u8", "idx_ptr": "*i64", "out_ptr": "*bf16"}
        consts, opts = dict(BN=4, HAS_IDX=True, **meta), {}
    sig = {**ptrs, **{a: "i32" for a in args}, **{c: "constexpr" for c in consts}}
    # the row stride and base pointers as Triton specialises them for a packed weight (16-byte multiples)
    names = list(sig)
    aligned = [p for p in ("x_ptr", "w_ptr", "idx_ptr", "K", "ROW_BYTES") if p in names]
    attrs = {(names.index(p),): [["tt.divisibility", 16]] for p in aligned}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=opts)


def main(specs: list[str]) -> int:
    out = {}
    for spec in specs:
        kernel, name, m = spec.split(":")
        try:
            k = compile_one(kernel, name, int(m))
            ptx = k.asm["ptx"]
            out[spec] = {"ok": bool(k.asm.get("cubin")), "error": "", "vector_loads": "ld.global.v4" in ptx,
                         "griddepcontrol": "griddepcontrol.wait" in ptx,
                         "shared": ptx.count("st.shared"), "cvt_rn_f32": ptx.count("cvt.rn.f32.s32"),
                         "regs": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None)}
        except TypeError as e:                            # another ASTSource signature
            print(f"this Triton's compile API differs: {e}")
            return 3
        except Exception as e:  # noqa: BLE001 - reported per kernel
            out[spec] = {"ok": False, "error": f"{type(e).__name__}: {e}"[-1500:], "vector_loads": False}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
