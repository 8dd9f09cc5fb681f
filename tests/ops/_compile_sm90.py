"""Compile the quantized-matmul (and the bf16 decode GEMV) Triton kernels for sm_90 (Hopper) without a GPU, with the ptxas that
ships in Triton's wheel; run by tests/ops/test_quant_ops.py in a process without TRITON_INTERPRET.

    python tests/ops/_compile_sm90.py gemv:Q4_K:1 gemm:Q6_K:0 rows:Q8_0:0

Prints one JSON line: spec -> {"ok": bool, "error": str, "vector_loads": bool}. Exit 3: cannot compile
here (another Triton API, no CUDA backend)."""
from __future__ import annotations

import json
import re
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


def _sm90(fn, sig: dict, consts: dict, options: dict, aligned=()):
    """``fn`` compiled for sm_90 with signature ``sig`` and ``consts``; the ``aligned`` arguments (pointers, sizes)
    specialised as 16-byte multiples, as Triton does for a packed weight's."""
    names = list(sig)
    attrs = {(names.index(p),): [["tt.divisibility", 16]] for p in aligned if p in names}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def compile_one(kernel: str, name: str, m: int):
    q = QTYPES.get(name)
    meta = {} if q is None else dict(KIND=gguf.KINDS[q.kind], TS=q.type_size, NSUB=q.tile[0], SUBLEN=q.tile[1])
    ptrs = {"x_ptr": "*bf16", "w_ptr": "*u8", "y_ptr": "*bf16"}
    if kernel in ("gemv1", "gemv1t", "gemv1i", "gemv1s", "gemv1p", "gemv1q"):  # the one-row Q4_K / Q6_K / Q8_0
        # kernel (x as quads, XQ = 1; gemv1t: x tile broadcast, XQ = 0; gemv1i: x as int8 codes, XQ = 2, no norm in
        # the kernel then; gemv1s: gemv1i with its K loop in 3 stages; gemv1p: gemv1i with Q4_K's register
        # prefetch; gemv1q: Q4_K's integer dots, XQ = 3, unmasked (EVEN));
        # m: 0 plain, 1 norm + GLU, 2 residual, 3/4 = 1/2 + PDL; plus 8: several rows of x (MROWS a runtime int;
        # one row, as Triton specialises an int argument of 1, is the constant 1); plus 16: the weight asked of L2
        # first (L2PF, 1,024 lines a program)
        from shapeplan.runtime.backends.triton.kernels import qgemv
        xq = {"gemv1": 1, "gemv1t": 0, "gemv1i": 2, "gemv1s": 2, "gemv1p": 2, "gemv1q": 3}[kernel]
        ptrs = {"X": "*i32" if xq >= 2 else "*bf16", "NW": "*bf16", "XD": "*fp32", "XS": "*fp32", "W": "*i32",
                "R": "*bf16", "Y": "*bf16"}
        args = ["N", "K", "HALF", "ROW_WORDS"]
        l2pf, rows, m = m & 16, m & 8, m & 7
        bn, ch, warps, _ = qgemv.DEFAULT[qgemv.tiles_type(name)]
        fn = qgemv.KERNELS[name]
        consts = dict(BN=bn, CH=ch, NORM=m in (1, 3) and xq < 2, RES=m in (2, 4), GLU=m in (1, 3), PDL=m >= 3,
                      ASM=True, XQ=xq, XB=16, XF16=False, NB=16, NF16=False, STAGES=3 if kernel == "gemv1s" else 1,
                      L2PF=1024 if l2pf else 0, **qgemv.type_flags(name))
        if "FIVE" in consts:                                  # Q4_K's kernel
            consts.update(PF=kernel == "gemv1p", EVEN=xq == 3)
        if not rows:
            consts = {"MROWS": 1, **consts}
        sig = {**ptrs, **{a: "i32" for a in args}, "eps": "fp32", **({"MROWS": "i32"} if rows else {}), "SX": "i32",
               **{c: "constexpr" for c in consts}}
        sig = {a: sig[a] for a in fn.arg_names}                  # in the kernel's order (MROWS may be a constant)
        return _sm90(fn, sig, consts, {"num_warps": warps}, ("X", "NW", "W", "K", "ROW_WORDS"))
    if kernel == "quantx":    # XQ = 2's x quantizer (qgemv.py); m: 1 = with the norm, 2 = 1 + PDL
        from shapeplan.runtime.backends.triton.kernels import qgemv
        consts = dict(BB=qgemv.QX_BLOCKS, NORM=m >= 1, CHUNK=qgemv.QX_CHUNK, PDL=m == 2)
        sig = {"X": "*bf16", "NW": "*bf16", "XW": "*i32", "XD": "*fp32", "XS": "*fp32", "K": "i32", "eps": "fp32",
               "SXIN": "i32", "SOUT": "i32", **{c: "constexpr" for c in consts}}
        return _sm90(qgemv._quant_x_kernel, sig, consts, {"num_warps": 4, "enable_fp_fusion": False})
    if kernel == "mmq":       # the integer tensor-core GEMM of kernels/mmq.py; m: bit 1 = split along K (float32
        # partial sums), bit 2 = the plain operand order (no SWAP), bit 4 = the tile for 64 rows (else for 8)
        from shapeplan.runtime.backends.triton.kernels import mmq
        t = mmq.tiling(name)
        consts = dict(BM=mmq.block_m(64 if m & 4 else 8), BN=t["bn"], KIND=mmq.TYPES[name],
                      PARTIAL=bool(m & 1), SWAP=not m & 2)
        sig = {"XC": "*i8", "XD": "*fp32", "XS": "*fp32", "W": "*u8", "Y": "*fp32" if m & 1 else "*bf16",
               **{a: "i32" for a in ("M", "N", "K", "ROW_BYTES", "SX", "stride_ym", "PER")},
               **{c: "constexpr" for c in consts}}
        return _sm90(mmq._mmq_kernel, sig, consts, {"num_warps": t["warps"], "num_stages": t["stages"]},
                     ("XC", "W", "K", "ROW_BYTES", "SX"))
    if kernel == "dense":     # the bf16 decode GEMV of kernels/gemv.py; m: 0 plain, 1 norm + GLU, 2 residual, 3 = 1 + PDL,
        # 4 = 2 + PDL + the weight's L2 prefetch (1,024 lines a program)
        from shapeplan.runtime.backends.triton.kernels import gemv as dense
        ptrs = {"X": "*bf16", "NW": "*bf16", "W": "*bf16", "R": "*bf16", "Y": "*bf16"}
        bn, bk, warps = dense.config(3072, 2048)
        consts = dict(BN=bn, BK=bk, NORM=m in (1, 3), RES=m in (2, 4), GLU=m in (1, 3), EVEN_K=True, PDL=m in (3, 4),
                      PF=1024 if m == 4 else 0)
        sig = {**ptrs, **{a: "i32" for a in ("N", "K", "HALF", "stride_wn")}, "eps": "fp32",
               **{c: "constexpr" for c in consts}}
        return _sm90(dense._gemv_kernel, sig, consts, {"num_warps": warps}, ("X", "NW", "W", "K", "stride_wn"))
    if kernel == "paged":     # the paged decode attention of kernels/paged.py as the LLM graph calls it; m: 1 = PDL,
        # 2 = the EARLY form, 4 = with STRIDED (bits add up)
        from shapeplan.runtime.backends.triton.kernels import paged_jit
        ptrs = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", pos_ptr="*i64", len_ptr="*i64", bt_ptr="*i32",
                    m_ptr="*fp32", l_ptr="*fp32", acc_ptr="*fp32", cnt_ptr="*i32", o_ptr="*bf16", c_ptr="*bf16",
                    s_ptr="*bf16", kn_ptr="*bf16", vn_ptr="*bf16", xw_ptr="*i32", xd_ptr="*fp32", xs_ptr="*fp32")
        ints = ["sq_b", "sq_h", "sk_n", "sk_h", "sk_s", "sv_n", "sv_h", "sv_s", "s_bt", "sc_b", "so_b", "so_h",
                "skn_b", "skn_h", "svn_b", "svn_h"]
        from shapeplan.runtime.backends.triton.kernels import paged
        d = 128 if name.endswith("128") else 64            # llama-1b's head dim, or llama-8b's ("write128")
        # "writeq128": also the o projection's x as int8 codes (XQ_OUT)
        tiling = paged._decode_tiling(1, 8, 64, 4, d)       # batch 1, 8 KV heads, 1024 keys of blocks of 16
        consts = dict(HKV=8, G=4, GP=4, D=d, DP=d, NS=tiling["NS"], BPS=tiling["BPS"], BS=16, WINDOW=0, ROTATE=True,
                      INTERLEAVED=False, HALF=d // 2, HALFP=d // 2, WRITE=name.startswith("write"), TABLE=True,
                      PDL=bool(m & 1), MCH=tiling["MCH"], XQ_OUT="q" in name, EARLY=bool(m & 2), BPSP=tiling["BPSP"],
                      STRIDED=bool(m & 4))
        sig = {**ptrs, **{a: "i32" for a in ints}, "scale": "fp32", **{c: "constexpr" for c in consts}}
        return _sm90(paged_jit._paged_decode, sig, consts,
                     {"num_warps": tiling["num_warps"], "enable_fp_fusion": False})
    if kernel == "argmax":    # the two passes of kernels/argmax.py; m: 1 = PDL
        from shapeplan.runtime.backends.triton.kernels import argmax_jit
        if name == "partial":
            consts = dict(BLOCK=2048, LARGEST=True, PDL=m == 1)
            sig = {"X": "*bf16", "VAL": "*fp32", "IDX": "*i64", "NAN": "*i64", "N": "i32", "stride_x": "i32",
                   "PER": "i32", "NSPLIT": "i32", **{c: "constexpr" for c in consts}}
            fn, warps = argmax_jit._arg_partial, 8
        else:
            consts = dict(NSP=32, PDL=m == 1)
            sig = {"VAL": "*fp32", "IDX": "*i64", "NAN": "*i64", "OUT": "*i64", "NSPLIT": "i32",
                   **{c: "constexpr" for c in consts}}
            fn, warps = argmax_jit._arg_merge, 1
        return _sm90(fn, sig, consts, {"num_warps": warps})
    if kernel == "gemv":
        fn, args = gguf._gemv_kernel, ["N", "K", "ROW_BYTES", "stride_xm", "stride_ym", "CHUNKS_PER_PROGRAM"]
        consts = dict(M=m, BM=max(2, 1 << (m - 1).bit_length()), BN=gguf.GEMV["bn"], PARTIAL=False,
                      UNROLL=gguf.GEMV["unroll"], **meta)
        opts = {"num_warps": gguf.GEMV["warps"]}
    elif kernel == "gemm":    # m: bit 1 = split along K (float32 partial sums), bit 2 = the tiling for <= 16 rows,
        # bit 4 = the weight tile as the MMA's first operand (SWAP)
        fn, args = gguf._gemm_kernel, ["M", "N", "K", "ROW_BYTES", "stride_xm", "stride_ym", "PER"]
        consts = dict(BM=gguf.gemm_bm(16 if m & 2 else 64), BN=gguf.GEMM["bn"],
                      NT=max(1, min(q.tile[0], gguf.GEMM["bk"] // q.tile[1])), IEEE=False, PARTIAL=bool(m & 1),
                      SWAP=bool(m & 4), **meta)
        ptrs["y_ptr"] = "*fp32" if m & 1 else "*bf16"
        opts = {"num_warps": gguf.GEMM["warps"], "num_stages": gguf.GEMM["stages"]}
    else:
        fn, args = gguf._rows_kernel, ["R", "K", "ROW_BYTES", "stride_o"]
        ptrs = {"w_ptr": "*u8", "idx_ptr": "*i64", "out_ptr": "*bf16"}
        consts, opts = dict(BN=4, HAS_IDX=True, **meta), {}
    sig = {**ptrs, **{a: "i32" for a in args}, **{c: "constexpr" for c in consts}}
    # the row stride and base pointers as Triton specialises them for a packed weight (16-byte multiples)
    return _sm90(fn, sig, consts, opts, ("x_ptr", "w_ptr", "idx_ptr", "K", "ROW_BYTES"))


def main(specs: list[str]) -> int:
    out = {}
    for spec in specs:
        kernel, name, m = spec.split(":")
        try:
            k = compile_one(kernel, name, int(m))
            ptx = k.asm["ptx"]
            out[spec] = {"ok": bool(k.asm.get("cubin")), "error": "", "vector_loads": "ld.global.v4" in ptx,
                         "global_loads": len(re.findall(r"\bld\.global", ptx)),
                         "griddepcontrol": "griddepcontrol.wait" in ptx,
                         "prefetch_l2": ptx.count("prefetch.global.L2"), "dp4a": "dp4a.s32.s32" in ptx,
                         "cp_async": "cp.async" in ptx, "int8_mma": bool(re.search(r"mma\S*\.s8", ptx)),
                         "wgmma": "wgmma" in ptx,
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
