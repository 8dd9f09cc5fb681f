"""The one-row quantized GEMV (a decode step at batch 1) for the types that dominate GGUF decode: Q4_K,
Q5_K (Q4_K's kernel with a fifth code bit), Q6_K, Q8_0, and Q4_0, IQ4_NL and IQ4_XS (Q8_0's kernel with nibble
codes), with the fused prologue / epilogue of the bf16 decode GEMV (kernels/gemv.py):

    gemv1(x, packed, q, n, k)                        x [1, K] @ W.T
    gemv1(..., norm_w=s, eps=e)                      rms_norm(x) * s @ W.T    (RMSNorm prologue)
    gemv1(..., residual=r)                           r + x @ W.T              (residual epilogue)
    gemv1(..., glu=True)                             silu(x @ G.T) * (x @ U.T), W = [G; U] by rows

x may have up to ``MAX_ROWS`` (8) rows (the batched engine's small decode buckets): a program per row of x and
block of outputs, program p taking row p % M, so the M programs of a block run side by side and all but the
first read its weights from L2; each row is computed exactly as a one-row call computes it (bit for bit: batched
decode equals single-stream decode). With one row M is Triton's constant 1 and the code is the one-row code.
Measured (H200, twenty-fifth session, summed over llama-8b's shapes): Q4_K_R at 2 / 4 / 8 rows 266 / 497 / 954 µs
against 751 / 1,084 / 1,819 for gguf.py's generic GEMV, which decodes each chunk once for all rows but reduces
every row across threads per chunk.

Why a separate kernel: the generic GEMV of gguf.py loads every weight byte with its own uint8 load and
decodes the full affine value per element (scale extraction, int -> float conversion, ``d*sc*q - m``),
so it is bound by instructions, not by memory (~845 GB/s on the LM head, of ~4.2 TB/s). Here:

- **Word loads.** The packed row is read as int32 words (the launcher passes ``packed.view(int32)``;
  the fast path needs row bytes and the base address to be multiples of 4, else gguf.py's kernel
  runs). The file's layouts run as they are (GPU memory = the GGUF tensor bytes): a Q4_K
  super-block is 36 words (16-byte aligned, vector loads). Q6_K super-blocks (210 bytes) and Q8_0
  blocks (34 bytes) are 2 bytes off every other one, so those kernels walk *pairs* (420 bytes = 105
  words, 68 bytes = 17 words): the first of a pair is word aligned, the second is realigned in
  registers with a funnel shift ``(w[j] >> 16) | (w[j + 1] << 16)`` (the second load hits L1).
  Our layouts ``Q4_K_R`` / ``Q6_K_R`` / ``Q8_0_R`` (shapeplan/quant/formats.py,
  ``SHAPEPLAN_QUANT_REPACK``, on by default for GGUF loads onto a GPU: the same bytes, each row's codes
  first and its headers after; H200 llama-8b Q8_0 286 -> 320 tok/s, docs/llm.md) run the same
  kernels with ``REPACK``: every block's codes aligned (Q6_K_R / Q8_0_R: no funnel shift, loads as wide
  as the tile gives a thread).
- **Integer codes -> float without a conversion instruction.** The float32 whose bits are
  ``0x4B000000 | v`` is ``2^23 + v`` exactly for v < 2^23, so subtracting 2^23 gives the code as a float
  (int->float conversions run at a quarter of the FMA rate or less). Each word's codes are first made
  one unsigned byte per element (Q4_K: ``(w >> 4h) & 0x0F0F0F0F`` per half; Q6_K: the low and high bits
  joined; Q8_0: ``w ^ 0x80808080``, i.e. q + 128), then on the GPU one byte permute (PTX ``prmt``) per
  element puts byte b under the 0x4B exponent, and one add subtracts 2^23 plus the code's offset (0,
  Q6_K's 32, Q8_0's 128): per element one PRMT, one add, one FMA. (The eighth session's version took
  each code in place with a mask and pre-scaled x by powers of two: two logic ops and a multiply more
  per element, measured in SASS; ``tests/ops/_compile_sm90.py`` builds the GPU path in CI, the
  interpreter runs the same arithmetic with shifts and masks.)
- **Q4_0 runs Q8_0's kernel** (``FOUR``): its 18-byte block (``[d f16][16 bytes]``, element j the low
  nibble of byte j, 16 + j the high one) pairs into 9 words with the same 2-byte misalignment as Q8_0's
  pairs, and tile word w = nibble half w // 4 of code word w % 4 holds elements 4w .. 4w + 3, Q8_0's
  order: x's indices, its int8 blocks and the scales' places carry over; a code is ``(w >> 4h) &
  0x0F0F0F0F`` (q, offset 8) or, for dp4a, ``(q + 0x78787878) ^ 0x80808080`` (q - 8 as signed bytes).
  IQ4_NL (Q4_0's blocks) and IQ4_XS (super-blocks of eight such 32-element blocks behind one 8-byte header
  of ``d`` and 6-bit scales, 136 bytes: aligned) run the same kernel (``IQ``); their codes index IQ4's 16
  non-linear int8 values, looked up four at a time with two byte permutes (``prmt``) of a table held in
  four constant words and a select per byte (``_iq4_bytes``). Q4_0 has its own tiles (swept on the H200:
  16 chunks per iteration on 2 warps, the same bytes in flight as Q8_0's tiles); IQ4's are Q8_0's
  (``TILES_OF``) until swept (``bench/quant_gemv.py --sweep1 --qtypes IQ4_XS``): its table lookup, not its
  bytes, set its pace on Q8_0's tiles (H200: IQ4_XS and Q8_0 take the same time per call).
- **Sub-block algebra.** Per word (4 elements of one sub-block) the products ``q * x`` are summed,
  then scaled once: Q8_0 ``d * Σ q x``, Q6_K ``d * sc * Σ (q - 32) x``, Q4_K
  ``d * sc * Σ q x - dmin * m * Σ x`` with ``Σ x`` per word.
- **Two ways to read x (XQ, chosen per shape in ``TUNE``).** The 4 elements a code word multiplies are
  4 consecutive elements of x: one 64-bit "quad" (16-bit x; float32: two). XQ = 1: x is read as quads
  through a pointer tile of the weights' own shape, with the weights' contiguity (``tl.max_contiguous``
  4 on both), so Triton gives x the weights' register layout: no shared-memory conversion and no barrier
  in the loop (bf16 halves widened by one shift or mask; each thread reads its own x from L1, once per
  row: the norm's multiply and Σx² are per row too, summed over row 0 at the end). XQ = 0: x is read
  once per program as a row-less tile of element loads and broadcast over the BN rows, which Triton
  converts into the weights' layout through shared memory (about 20 barriers per iteration, measured in
  the SASS), but shares one x and one norm multiply among many rows. Measured on the H200 (eleventh
  session): XQ = 1 wins every small matrix and every Q6_K / Q8_0 shape (llama-1b Q4_K qkv 7.8 -> 6.1 µs,
  o 5.2 -> 4.1, k/v 3.8 -> 2.9, down 13.6 -> 10.1; Q6_K down 14.4 -> 10.0), XQ = 0 the large Q4_K
  matrices with a norm prologue (gate/up 16.4 µs against 17.3, LM head 104.1 against 124.7).
- **A third way: x as int8 codes (XQ = 2), one ``dp4a`` per weight word.** A kernel before the GEMV
  (``_quant_x_kernel``, one launch; the norm prologue is applied there) writes x as int8 codes per
  block of 32 (``round(x * 127 / max|x|)``, four to an int32 word), each block's scale and its exact
  Σx (Q4_K's minimum term). The GEMV then reads one x word per weight word, in the weights' layout as
  the quads are, and a single PTX ``dp4a`` multiplies and sums the word's four code pairs; the sum
  comes out as a float with the same bit trick (the accumulator is the float 1.5 * 2^23), and is
  scaled by ``d * sc * d_x``: per 4 elements a mask, a dp4a, an add and an FMA instead of per element a
  permute, an add and an FMA plus x's widening. Q6_K codes become signed bytes ``q - 32`` with an add
  and an xor per word; Q8_0's codes are signed bytes already. llama.cpp's CUDA path (q8_1) does the
  same; the cost is x's rounding to 8 bits: about 1 % of the output's scale against
  dequantize-then-matmul (tests: against the same arithmetic in torch to 1e-3, and exact when int8
  codes hold x exactly), where the 16-bit modes are exact to fp32 rounding. Measured on the H200
  (twelfth session, µs per call, the quantize launch included): it wins every large matrix (llama-1b
  Q4_K gate/up 16.5 -> 11.9, LM head 96.1 -> 56.4 = 2.6 TB/s, Q6_K head 134.6 -> 74.1 = 2.9 TB/s;
  llama-8b Q4_K gate/up 50.2 -> 31.1, down 27.1 -> 20.6, Q6_K head 296.0 -> 141.5 = 3.0 TB/s) and loses
  the small ones, where the extra launch (~1.6 µs) is most of the time (1b k/v 2.9 -> 4.4).
  ``SHAPEPLAN_QUANT_INT8_X=0`` turns every XQ = 2 (or 3) choice into XQ = 1 (same tile). ``gemv1(...,
  x_codes=)`` takes x already quantized (no launch): the paged decode attention writes the o projection's
  x that way (kernels/paged.py ``x_codes``; both call paged_jit's ``_x_blocks``, so the codes are the same).
- A program owns BN rows and walks K in CH super-blocks (Q4_K), CH pairs of super-blocks (Q6_K) or
  CH pairs of 32-blocks (Q8_0) per iteration, all their loads in flight together; products stay
  elementwise in float32 and are summed once after the loop; one store per row. No split-K: BN goes
  down to 1 for few rows. Tunables (BN, CH, warps, XQ[, STAGES[, PF]]) per (type, N, K) in ``TUNE``
  (bench/quant_gemv.py ``--sweep1``; ``--stages`` / ``--pf`` for the last two).
- **Bytes in flight.** A one-warp program loads 16-64 bytes per thread per iteration and then waits for
  them; at the occupancy these kernels get (58-128 registers a thread) that is less than the ~32 KB per
  SM that the H200's bandwidth times DRAM latency asks for, so the large matrices run at 1.1-2.8 TB/s.
  Two ways to keep the next iteration's bytes in flight, both per shape in ``TUNE`` and off when a
  tile leaves them out:
  **STAGES** (default 1): the K loop as ``tl.range(num_stages=STAGES)``: from 2 on, Triton's pipeliner
  turns every load of the loop (x's too) into ``cp.async`` copies to shared memory, STAGES - 1
  iterations ahead. Swept on every llama-1b / 8b shape (H200, fourteenth session): it won only
  llama-1b's Q8_0 k/v (6.0 -> 5.0 µs) and lost elsewhere (the copies, their commit groups and the
  shared memory per program cost more than the latency they hide).
  **PF** (Q4_K only, default 0): the next iteration's weight words are loaded into registers before this
  iteration's arithmetic (a double buffer the loop carries). On the kernel before the next point it won
  llama-8b's qkv, o, down and k/v (qkv 11.7 -> 10.9, o 8.8 -> 8.2, down 20.0 -> 18.7 µs) and lost on
  gate/up and the heads; after it, only 8b k/v keeps it (5.1 µs).
- **Q4_K with int8 x keeps one float per sub-block**: the 8 words' dp4a results are exact integers, so
  they are summed first and multiplied by the sub-block's scale and x's block scale once. The earlier
  [BN, CH, 4, 8] accumulator made Triton convert each product from the words' layout to the scales'
  inside the loop (four `convert_layout`s: 32 `SHFL` and ~40 `FSEL` per iteration); without them the
  llama-8b gate/up tile's loop is 427 -> 367 instructions and 104 -> 80 registers (offline sm_90), and on
  the H200 qkv 11.7 -> 10.5, o 8.8 -> 8.0, gate/up 31.0 -> 30.1, down 20.0 -> 18.1, head 104.2 -> 98.8 µs
  (with re-swept tiles). Q6_K and Q8_0 have no conversion in their loops.
- **XQ = 3 (Q4_K): the same int8 x, integer dots** (``_q4k_i8_sub``, chosen per shape in ``TUNE``). The
  dp4a results stay integers (no magic-number subtraction per word) and are summed as integers; the
  sub-block's 6-bit scale multiplies that sum in one integer multiply-add that lands the product in a
  float's mantissa (|dot * scale| < 2^22); the 8 scales and 8 minimums of a super-block are unpacked four
  to a word by masks (no per-sub-block select chain), one ``prmt`` per byte; shapes whose BN and CH divide
  N and K / 256 launch it without masks. Offline sm_90, llama-8b gate/up tile: 528 -> 424 instructions,
  80 -> 64 registers. H200 (sixteenth session, same tiles, two interleaved rounds): llama-8b o 8.7 ->
  7.9 µs, down 18.8 -> 17.2, the 1b head 56.5 -> 54.5; qkv, gate/up, k/v and the 8b head tied; the 1b
  gate/up lost (11.8 -> 13.3), so XQ 2 keeps it. Fewer instructions alone bought little: the loop waits
  for its loads, not for issue slots. Tried and dropped there: each group of 8 code words loaded as two
  [.., 4] tiles so that a thread holds a sub-block's 8 words (no shuffle in the sum, 352 instructions):
  slower (8b head 98.8 -> 121.6 µs: each 16-byte load then covers every other 16 bytes of a warp's span);
  the program's whole rows asked of L2 first (``prefetch.global.L2``, one per line and thread): slower on
  every shape (gate/up 31.2 -> 34.7 µs); a register prefetch (PF) in this kernel: ptxas sank the next
  iteration's loads from the loop's top to its end (64 registers), so it could hide nothing; ``volatile``
  loads to pin them: ``ld.volatile`` is a system-scope strong load (128 registers, x's loads no longer
  shared). XQ = 3 takes no PF.
- x and the norm weight must sit at 8-byte aligned addresses (``gemv1`` copies them otherwise).

The norm is the bf16 GEMV's: rsqrt(mean(x^2) + eps) is a factor common to the row, so Σx² is summed
beside the products and the result scaled at the end; rounding as there (the product and the gate are
rounded to the activation dtype where MatMul and SiluMul round). Everything is launched with device
tensors only: it captures into the decode plan's CUDA graph.

Programmatic dependent launch (``SHAPEPLAN_QUANT_GEMV_PDL``, Hopper+; by default (``auto``) only for matrices of
4,096 or more outputs and inputs: measured faster there (H100, twenty-fourth session, one process, llama-8b
Q8_0: 262.9 / 261.6 tok/s off, 275.4 / 277.9 on) and slower on llama-1b's (H200, twelfth session, llama-1b
Q4_K_M: 1,200.4 off, 1,122.7 on)), as the bf16 GEMV has it on: the next kernel may launch at once, and each
iteration waits for the kernel before (``gdc_wait``, a no-op once it has returned) only after its weight loads
and before its first x load, so the first chunk's weights load while that kernel ends; the x quantizer then
launches early too and waits before reading x.
"""
from __future__ import annotations

import torch

from shapeplan.quant.formats import IQ4_VALUES, REPACKED
from shapeplan.quant.quantize import x_code_words
from shapeplan.runtime.backends.triton.env import interpreting
from shapeplan.runtime.backends.triton.kernels.gguf import AVAILABLE, triton, tl

if AVAILABLE:
    from shapeplan.runtime.backends.triton.kernels.gguf import _iq4_value

#: qtype -> (BN rows per program, CH chunks per iteration, warps, XQ) when ``TUNE`` has no entry
#: (Q4_0: the tile all 14 llama-1b / 8b shapes chose in its sweep, twentieth session)
DEFAULT: dict[str, tuple[int, int, int, int]] = {"Q4_K": (8, 2, 4, 1), "Q5_K": (8, 2, 4, 1), "Q6_K": (4, 1, 4, 1),
                                                 "Q8_0": (8, 4, 4, 1), "Q4_0": (2, 16, 2, 1)}
#: the same from ``LARGE`` weight elements on (N x K): x as int8 codes, the tiles that won llama-1b's large
#: matrices (XQ = 2 pays a launch, ~1.5 µs, that small matrices do not earn back)
DEFAULT_LARGE: dict[str, tuple[int, int, int, int]] = {"Q4_K": (4, 2, 1, 2), "Q5_K": (4, 2, 1, 2), "Q6_K": (1, 2, 1, 2),
                                                       "Q8_0": (2, 4, 1, 2), "Q4_0": (2, 16, 2, 2)}
LARGE = 1 << 24
#: (qtype, N outputs (GLU: after the gate), K) -> (BN, CH, warps, XQ[, STAGES[, PF]]), measured on the H200
TUNE: dict[tuple[str, int, int], tuple[int, ...]] = {   # H200, 2026-12-01/02 (bench.quant_gemv --sweep1)
    # llama-1b (eleventh session: XQ 0 and 1 swept; twelfth: XQ 2 against those, which it won on the
    # large matrices: gate/up and the LM head; then CH 8 / 16 for the down shapes, which won Q4_K and Q8_0:
    # 9.5 -> 8.9 and 19.8 -> 9.3 µs; fourteenth: STAGES 2 / 3 swept on every shape, which won only Q8_0 k/v,
    # 6.0 -> 5.0 µs;
    # Q4_K's one float per sub-block: gate/up 11.9 -> 11.3, head 56.4 -> 55.9 at BN 4; sixteenth: XQ 3 on the same
    # tiles won the head, 56.5 -> 54.5, and lost gate/up, 11.8 -> 13.3)
    ("Q4_K", 3072, 2048): (4, 4, 2, 1), ("Q6_K", 3072, 2048): (1, 2, 1, 1), ("Q8_0", 3072, 2048): (2, 4, 1, 1),
    ("Q4_K", 2048, 2048): (2, 4, 2, 1), ("Q6_K", 2048, 2048): (1, 2, 1, 1), ("Q8_0", 2048, 2048): (2, 4, 1, 1),
    ("Q4_K", 8192, 2048): (4, 2, 1, 2), ("Q6_K", 8192, 2048): (1, 2, 1, 2), ("Q8_0", 8192, 2048): (2, 4, 1, 2),
    ("Q4_K", 2048, 8192): (4, 16, 4, 1), ("Q6_K", 2048, 8192): (1, 2, 1, 1), ("Q8_0", 2048, 8192): (1, 16, 2, 1),
    ("Q4_K", 512, 2048): (1, 4, 2, 1), ("Q6_K", 512, 2048): (1, 2, 1, 1), ("Q8_0", 512, 2048): (2, 4, 1, 1, 3),
    ("Q4_K", 128256, 2048): (4, 2, 1, 3), ("Q6_K", 128256, 2048): (2, 1, 1, 2), ("Q8_0", 128256, 2048): (2, 4, 1, 2),
    # llama-8b (twelfth session: XQ 2 against the earlier tiles (XQ 0 / 1), which it won everywhere but Q4_K k/v;
    # fourteenth: XQ 2 with CH 8 / 16, and the Q8_0 shapes for the first time (8b Q8_0 226 -> 286 tok/s); then
    # Q4_K's register prefetch (PF, the 6th element); then Q4_K's one float per sub-block, after which PF won only
    # k/v and the heads moved to BN 4: qkv 11.7 -> 10.5, o 8.8 -> 8.0, gate/up 31.0 -> 30.1, down 20.0 -> 18.1,
    # head 104.2 -> 98.8 µs; sixteenth: XQ 3 (integer dots) on the same tiles won o 8.7 -> 7.9 and down 18.8 -> 17.2,
    # tied qkv, gate/up, k/v and the head)
    ("Q4_K", 6144, 4096): (2, 4, 1, 2), ("Q6_K", 6144, 4096): (1, 2, 1, 2), ("Q8_0", 6144, 4096): (1, 16, 2, 2),
    ("Q4_K", 4096, 4096): (2, 4, 1, 3), ("Q6_K", 4096, 4096): (2, 1, 1, 2), ("Q8_0", 4096, 4096): (2, 16, 4, 2),
    ("Q4_K", 14336, 4096): (2, 4, 1, 2), ("Q6_K", 14336, 4096): (1, 2, 1, 2), ("Q8_0", 14336, 4096): (1, 16, 2, 2),
    ("Q4_K", 4096, 14336): (2, 4, 1, 3), ("Q6_K", 4096, 14336): (1, 2, 1, 2), ("Q8_0", 4096, 14336): (1, 16, 2, 2),
    ("Q4_K", 1024, 4096): (2, 16, 2, 2, 1, 1), ("Q6_K", 1024, 4096): (1, 4, 1, 2), ("Q8_0", 1024, 4096): (1, 16, 2, 2),
    ("Q4_K", 128256, 4096): (4, 2, 1, 2), ("Q6_K", 128256, 4096): (2, 1, 1, 2), ("Q8_0", 128256, 4096): (1, 16, 2, 2),
    # q and k stacked without v (Q4_K_M's "more bits" layers put v in Q6_K; sixteenth session); swept in the
    # seventeenth (XQ 1-3): 1b 5.6 -> 5.2 µs, 8b 9.5 -> 9.1 against the q/k/v stack's tiles they had borrowed
    ("Q4_K", 2560, 2048): (2, 8, 2, 1), ("Q4_K", 5120, 4096): (2, 4, 1, 3),
    # Q4_0 (twentieth session; it had borrowed Q8_0's tiles): 16 chunks per iteration on 2 warps everywhere, the
    # same bytes in flight as Q8_0's; in the sweep against the borrowed tile: 8b gate/up 33.3 -> 32.0 µs, 8b qk
    # 13.5 -> 10.4, 1b qkv 7.2 -> 5.6, 1b o 6.2 -> 4.1, 1b qk 9.1 -> 4.9, 1b head 80.1 -> 73.1 (1b 1,209 -> 1,343 tok/s)
    ("Q4_0", 6144, 4096): (1, 16, 2, 2), ("Q4_0", 4096, 4096): (2, 16, 2, 2), ("Q4_0", 14336, 4096): (2, 16, 2, 2),
    ("Q4_0", 4096, 14336): (2, 16, 2, 2), ("Q4_0", 1024, 4096): (2, 16, 2, 1), ("Q4_0", 128256, 4096): (1, 16, 2, 2),
    ("Q4_0", 5120, 4096): (2, 16, 2, 2), ("Q4_0", 3072, 2048): (2, 16, 2, 1), ("Q4_0", 2048, 2048): (2, 16, 2, 1),
    ("Q4_0", 8192, 2048): (2, 16, 2, 2), ("Q4_0", 2048, 8192): (1, 16, 2, 1), ("Q4_0", 512, 2048): (2, 16, 2, 1),
    ("Q4_0", 128256, 2048): (2, 16, 2, 2), ("Q4_0", 2560, 2048): (2, 16, 2, 1),
}
#: blocks of 32 per program of the x quantizer (XQ = 2), and the most elements of x its norm's sum of
#: squares loads at once (4,096: llama-8b's hidden size in one load, 32 floats a thread; was 1,024, so
#: llama-8b's sum took four loads one after another)
QX_BLOCKS = 16
QX_CHUNK = 4096
#: programs below which BN is halved (the H200 has 132 SMs)
MIN_PROGRAMS = 264
#: the most rows of x one launch takes (the batched engine's decode buckets of 2-8 sequences): a program per row
#: and output block, the row's arithmetic the one row's, so each row's result is bit for bit the one-row call's
MAX_ROWS = 8
#: the types whose one-row kernel has x mode 3 (int8 x, integer dots)
INT_DOTS = frozenset({"Q4_K", "Q4_K_R"})
#: the types with a one-row kernel, and the K each needs (super-block or block pair)
K_MULTIPLE = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 512, "Q8_0": 64, "Q4_0": 64, "IQ4_NL": 64, "IQ4_XS": 256}
#: the 4-bit types Q8_0's kernel runs (``FOUR``) -> its ``IQ`` (0: codes q - 8, 1: IQ4_NL's table, 2: IQ4_XS's)
NIBBLES = {"Q4_0": 0, "IQ4_NL": 1, "IQ4_XS": 2}
#: types that run another type's kernel (a REPACK constexpr) and, where ``TUNE`` has no entry of their own,
#: its tiles: our layouts of its bytes (shapeplan/quant/formats.py)
TUNED_AS = {name: src for name, (src, _) in REPACKED.items()}
K_MULTIPLE.update({name: K_MULTIPLE[src] for name, src in TUNED_AS.items()})
#: types without tiles of their own (not swept on a GPU yet) that take another type's ``TUNE`` and ``DEFAULT``
#: entries: IQ4_NL and IQ4_XS run Q8_0's kernel (``FOUR``, ``IQ``) on the same tile shapes (Q4_0 did until its sweep)
TILES_OF = {name: "Q8_0" for name in ("IQ4_NL", "IQ4_XS")}


def tiles_type(qtype: str) -> str:
    """The type whose ``TUNE`` / ``DEFAULT`` tiles ``qtype`` takes where it has no ``TUNE`` entry of its own: our
    layouts their source type's (``TUNED_AS``), IQ4 Q8_0's (``TILES_OF``), every other type its own."""
    base = TUNED_AS.get(qtype, qtype)
    return TILES_OF.get(base, base)


def _iq4_table_words() -> tuple[int, ...]:
    """IQ4's 16 values (formats.IQ4_VALUES) as signed bytes, four to a word, each word as a signed int32."""
    words = [sum((IQ4_VALUES[4 * i + b] & 0xFF) << (8 * b) for b in range(4)) for i in range(4)]
    return tuple(v - (1 << 32) if v >= 1 << 31 else v for v in words)


if AVAILABLE:
    from shapeplan.runtime.backends.triton.kernels.gemv_jit import (_finish, _prefetch_l2, gdc_launch_dependents,
                                                                         gdc_wait)
    from shapeplan.runtime.backends.triton.kernels.paged_jit import _x_blocks

    MAGIC = tl.constexpr(0x4B000000)           # float32 bits of 2^23
    TWO23 = tl.constexpr(8388608.0)
    SIGN8 = tl.constexpr(-0x7F7F7F80)          # int32 0x80808080: xor flips each byte's sign bit (q + 128)
    MAGIC15 = tl.constexpr(0x4B400000)         # float32 bits of 1.5 * 2^23
    #: IQ4_NL / IQ4_XS's 16 values as signed bytes, four to an int32 word (value i: byte i % 4 of word i // 4)
    IQ4_T0, IQ4_T1, IQ4_T2, IQ4_T3 = (tl.constexpr(w) for w in _iq4_table_words())
    ONE5_23 = tl.constexpr(12582912.0)

    @triton.jit
    def _code(v, mask: tl.constexpr):
        """The bits ``v & mask`` (below bit 23) as a float, exactly, with no int->float conversion."""
        return ((v & mask) | MAGIC).to(tl.float32, bitcast=True) - TWO23

    @triton.jit
    def _byte(v, b, off: tl.constexpr, ASM: tl.constexpr):
        """Byte b (a constant, or a tensor of byte indices) of int32 ``v`` (unsigned) minus ``off``, as a
        float, exactly. ASM (on the GPU): one byte permute builds the float bits of 2^23 + byte (``prmt``
        takes the byte into bits 0..7 and 0x4B into bits 24..31), one add subtracts 2^23 + off; the
        interpreter takes ``_code`` of the byte."""
        if not ASM:
            return _code(v >> (8 * b), 0xFF) - off
        bits = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r",
                                         [v, tl.full(v.shape, MAGIC, tl.int32), tl.full(v.shape, 0x7540, tl.int32) + b],
                                         dtype=tl.int32, is_pure=True, pack=1)
        return bits.to(tl.float32, bitcast=True) - (TWO23 + off)

    @triton.jit
    def _f16(v):
        """The float16 in the low 16 bits of int32 ``v``, as float32."""
        return (v & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def _quad(P, idx, mask, BITS: tl.constexpr, F16: tl.constexpr):
        """Elements 4 idx .. 4 idx + 3 of the bf16 / float16 / float32 vector P as four float32 tensors, read
        as 64-bit words (16-bit types: one word per quad, the halves widened by a shift or a mask;
        float32: two words)."""
        P64 = P.to(tl.pointer_type(tl.int64), bitcast=True)
        if BITS == 32:
            a = tl.load(P64 + 2 * idx, mask=mask, other=0)
            b = tl.load(P64 + 2 * idx + 1, mask=mask, other=0)
            return (a.to(tl.int32).to(tl.float32, bitcast=True), (a >> 32).to(tl.int32).to(tl.float32, bitcast=True),
                    b.to(tl.int32).to(tl.float32, bitcast=True), (b >> 32).to(tl.int32).to(tl.float32, bitcast=True))
        q = tl.load(P64 + idx, mask=mask, other=0)
        lo = q.to(tl.int32)
        hi = (q >> 32).to(tl.int32)
        if F16:
            return _f16(lo), _f16(lo >> 16), _f16(hi), _f16(hi >> 16)
        return ((lo << 16).to(tl.float32, bitcast=True), (lo & -65536).to(tl.float32, bitcast=True),
                (hi << 16).to(tl.float32, bitcast=True), (hi & -65536).to(tl.float32, bitcast=True))

    @triton.jit
    def _four(P, idx, mask, XQ: tl.constexpr, BITS: tl.constexpr, F16: tl.constexpr):
        """Elements 4 idx + b (b = 0..3) of P as four float32 tensors: XQ, one 64-bit quad per index
        (``_quad``); else four element loads."""
        if XQ:
            v0, v1, v2, v3 = _quad(P, idx, mask, BITS, F16)
        else:
            v0 = tl.load(P + 4 * idx, mask=mask, other=0.0).to(tl.float32)
            v1 = tl.load(P + 4 * idx + 1, mask=mask, other=0.0).to(tl.float32)
            v2 = tl.load(P + 4 * idx + 2, mask=mask, other=0.0).to(tl.float32)
            v3 = tl.load(P + 4 * idx + 3, mask=mask, other=0.0).to(tl.float32)
        return v0, v1, v2, v3

    @triton.jit
    def _x4(X, NW, idx, mask, ss, NORM: tl.constexpr, XQ: tl.constexpr, XB: tl.constexpr, XF16: tl.constexpr,
            NB: tl.constexpr, NF16: tl.constexpr):
        """x's elements 4 idx + b (b = 0..3) as four float32 tensors, times the norm weight's with NORM,
        their sum, and ``ss`` + x_b² (the norm's squares, in the shape of ``idx``). XQ: ``idx`` is a
        tile in the weights' shape and layout, read as 64-bit quads (module doc); else ``idx`` lacks the
        weights' row axis: four element loads, the x tile then broadcast over the rows (a new leading
        axis)."""
        x0, x1, x2, x3 = _four(X, idx, mask, XQ, XB, XF16)
        if NORM:
            ss += x0 * x0
            ss += x1 * x1
            ss += x2 * x2
            ss += x3 * x3
            n0, n1, n2, n3 = _four(NW, idx, mask, XQ, NB, NF16)
            x0, x1, x2, x3 = x0 * n0, x1 * n1, x2 * n2, x3 * n3
        sx = (x0 + x1) + (x2 + x3)                  # Σ_b x per word (Q4_K's minimum term; else unused)
        if not XQ:                                  # the broadcast last, so Σx is not computed per row
            x0, x1, x2, x3, sx = x0[None], x1[None], x2[None], x3[None], sx[None]
        return x0, x1, x2, x3, sx, ss

    @triton.jit
    def _xidx(q, mask, shape: tl.constexpr, contiguity: tl.constexpr, XQ: tl.constexpr):
        """The quad index tile ``q`` (no row axis) and its mask as ``_x4`` takes them: XQ, broadcast to the
        weights' ``shape`` with the weights' ``contiguity`` (4 along the last axis: the weights' layout,
        no conversion); else as given."""
        if XQ:
            q, mask = tl.max_contiguous(tl.broadcast_to(q[None], shape), contiguity), tl.broadcast_to(mask[None], shape)
        return q, mask

    @triton.jit
    def _dot4(q, x0, x1, x2, x3, off: tl.constexpr, ASM: tl.constexpr):
        """Σ_b (byte b of q - off) * x_b: one word's four products."""
        t = tl.zeros(q.shape, dtype=tl.float32)
        t += _byte(q, 0, off, ASM) * x0                       # a chain of FMAs
        t += _byte(q, 1, off, ASM) * x1
        t += _byte(q, 2, off, ASM) * x2
        return t + _byte(q, 3, off, ASM) * x3

    @triton.jit
    def _idp4a(a, b, c, ASM: tl.constexpr):
        """c + Σ_b a_b * b_b over the four signed bytes of the int32 words ``a`` and ``b``, as an int32
        (one ``dp4a`` on the GPU)."""
        if ASM:
            return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                             dtype=tl.int32, is_pure=True, pack=1)
        t = ((a << 24) >> 24) * ((b << 24) >> 24)
        t += ((a << 16) >> 24) * ((b << 16) >> 24)
        t += ((a << 8) >> 24) * ((b << 8) >> 24)
        return c + t + (a >> 24) * (b >> 24)

    @triton.jit
    def _dp4a(a, b, ASM: tl.constexpr):
        """Σ_b a_b * b_b as ``_idp4a`` sums it, as a float, exactly: the accumulator is the float bits of
        1.5 * 2^23 (the sum, at most 2^16 in size, lands in the mantissa), then one add."""
        v = _idp4a(a, b, tl.full(a.shape, MAGIC15, tl.int32), ASM)
        return v.to(tl.float32, bitcast=True) - ONE5_23

    @triton.jit
    def _ld(ptr, mask, EVEN: tl.constexpr):
        """A load, unmasked when EVEN (every row and chunk of the launch exists)."""
        if EVEN:
            return tl.load(ptr)
        return tl.load(ptr, mask=mask, other=0)

    @triton.jit
    def _quant_x_kernel(X, NW, XW, XD, XS, K, eps, SXIN, SOUT, BB: tl.constexpr, NORM: tl.constexpr,
                        CHUNK: tl.constexpr, PDL: tl.constexpr = False):
        """x (times rsqrt(mean(x²) + eps) and the norm weight with NORM) as int8 codes per block of 32
        (XQ = 2): code = round(x * 127 / max|x|), four to an int32 word (element 4j + b in byte b of word
        j), the block's scale max|x| / 127 in XD and its exact Σx in XS. A program owns BB blocks of row
        ``program_id(1)`` of x (SXIN elements a row; its codes, scales and sums SOUT elements a row on); with
        NORM each program sums all of its row's squares too (a row is at most a few tens of KB: L2 hits), in
        chunks of CHUNK (the launcher's: a row up to 4,096 elements, one load), after its own blocks' loads
        are issued, so the two wait together. PDL: the GEMV after it may launch at once (and load its first
        weights), this kernel waits for the one before."""
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
        xr = tl.program_id(1)
        X, XW, XD, XS = X + xr * SXIN, XW + xr * SOUT, XD + xr * SOUT, XS + xr * SOUT
        blk = tl.program_id(0) * BB + tl.arange(0, BB)                             # [BB] blocks of 32
        ok = blk < K // 32
        j = tl.arange(0, 8)                                                        # word of the block
        b = tl.arange(0, 4)[None, None, :]                                         # [1, 1, 4] byte
        e = blk[:, None, None] * 32 + 4 * j[None, :, None] + b
        v = tl.load(X + e, mask=ok[:, None, None], other=0.0).to(tl.float32)
        if NORM:
            nw = tl.load(NW + e, mask=ok[:, None, None], other=0.0).to(tl.float32)
            sq = tl.zeros([CHUNK], dtype=tl.float32)
            for k0 in range(0, K, CHUNK):
                o = k0 + tl.arange(0, CHUNK)
                xo = tl.load(X + o, mask=o < K, other=0.0).to(tl.float32)
                sq += xo * xo
            v = v * tl.math.rsqrt(tl.sum(sq, axis=0) / K + eps) * nw
        words, xd, xs = _x_blocks(v)                                               # [BB, 8], [BB], [BB]
        tl.store(XW + blk[:, None] * 8 + j[None, :], words, mask=ok[:, None])
        tl.store(XD + blk, xd, mask=ok)
        tl.store(XS + blk, xs, mask=ok)

    @triton.jit
    def _ss_total(ss, XQ: tl.constexpr):
        """Σx² of the row from the accumulated squares ``ss`` ([rows, a, b(, c)] with XQ: every row holds
        the same x, row 0's is taken; else the row-less tile [a, b(, c)], all of it). Nested sums: on the
        H200 a ``tl.reshape`` before the sum came out 9 % high here (the interpreter was exact)."""
        if len(ss.shape) == 4:
            ss = tl.sum(ss, axis=3)
        if len(ss.shape) == 3:
            ss = tl.sum(ss, axis=2)
        first = tl.sum(ss, axis=1)
        if XQ:
            first = tl.where(tl.arange(0, first.shape[0]) == 0, first, 0.0)
        return tl.sum(first, axis=0)

    # ------------------------------------------------------------------------------------------ Q4_K
    @triton.jit
    def _q4k_scales(hd, s1, s2, s3, p, h: tl.constexpr):
        """Super-block words 0..3 ([d|dmin], 12 scale bytes) -> d*sc and dmin*m of sub-blocks 2p + h."""
        s = 2 * p + h
        sh = (s % 4) * 8
        a, b, c = s1 >> sh, s2 >> sh, s3 >> sh
        lo = s < 4
        sc = tl.where(lo, a & 63, (c & 15) | (((a >> 6) & 3) << 4))
        mn = tl.where(lo, b & 63, ((c >> 4) & 15) | (((b >> 6) & 3) << 4))
        return _f16(hd) * _code(sc, 63), _f16(hd >> 16) * _code(mn, 63)

    @triton.jit
    def _program_rows(W, N, HALF, ROW_WORDS, BN: tl.constexpr, PDL: tl.constexpr, MROWS, L2PF: tl.constexpr = 0,
                      GLU: tl.constexpr = False):
        """This program's BN output rows, which of them exist, the word pointers of their rows of W (and
        of the up rows HALF further, for the GLU), and its row of x: of MROWS rows of x, program p takes
        row p % MROWS of output block p // MROWS (the programs of one block run side by side, so all but
        the first read its weights from L2; MROWS = 1 is Triton's constant 1: the one-row code). PDL: the
        next kernel may launch now (the kernels wait for the one before only after an iteration's weight
        loads). L2PF (with PDL; 128-byte lines a program, 0: off): programs 0, 1, .. first ask L2 for the
        whole of W (gemv_jit's ``_prefetch_l2``), as the bf16 GEMV's PF does for the attention's output
        projection."""
        if PDL:
            gdc_launch_dependents()
        pid = tl.program_id(0)
        if L2PF:
            rows_w = N + HALF if GLU else N
            _prefetch_l2(W, pid, tl.cdiv(rows_w.to(tl.int64) * ROW_WORDS * 4, 128), L2PF)
        rows = (pid // MROWS) * BN + tl.arange(0, BN)
        rg = W + rows.to(tl.int64) * ROW_WORDS                                    # [BN] word pointers
        ru = W + (rows + HALF).to(tl.int64) * ROW_WORDS
        return rows, rows < N, rg, ru, pid % MROWS

    @triton.jit
    def _row_ptrs(X, XD, XS, R, Y, xr, SX, N):
        """X, XD, XS, R and Y at x row ``xr``: x (or its codes buffer, whose scale and sum views share its row
        stride) SX elements a row, the residual and the output N."""
        return X + xr * SX, XD + xr * SX, XS + xr * SX, R + xr * N, Y + xr * N

    @triton.jit
    def _q4k_words(rp, c, m4, woff, hoff, nc, EVEN: tl.constexpr, REPACK: tl.constexpr, FIVE: tl.constexpr = False):
        """The code words [BN, CH, 4, 8], the [d|dmin] and three scale words [BN, CH, 1, 1] and (FIVE: Q5_K)
        the high-bit words of super-blocks ``c`` of rows ``rp`` (EVEN: unmasked). REPACK
        (Q4_K_R): a row of ``nc`` super-blocks is their code words, 32 each, then their header words, 4
        each; FIVE: 44-word super-blocks, qh at word 4, codes at word 12 (``woff`` has them), and the qh
        words as a [BN, CH, 4, 8] tile at ``hoff`` (word w for every p: in the code words' register layout,
        so no conversion; the repeats hit L1); else 36-word super-blocks, codes at word 4. Without FIVE the
        last value is the code words again (unused)."""
        if REPACK:
            cw = rp[:, None, None, None] + (c * 32)[None]                         # [BN, CH, 1, 1]
            sb = rp[:, None, None, None] + (nc * 32 + c * 4)[None]
        else:
            sb = rp[:, None, None, None] + (c * (44 if FIVE else 36))[None]
            cw = sb
        qw = _ld(cw + woff, m4, EVEN)
        if FIVE:
            qh = _ld(cw + hoff, m4, EVEN)
        else:
            qh = qw
        return qw, _ld(sb, m4, EVEN), _ld(sb + 1, m4, EVEN), _ld(sb + 2, m4, EVEN), _ld(sb + 3, m4, EVEN), qh

    @triton.jit
    def _q4k_rows(rg, ru, c, m4, woff, hoff, nc, GLU: tl.constexpr, EVEN: tl.constexpr = False,
                  REPACK: tl.constexpr = False, FIVE: tl.constexpr = False):
        """``_q4k_words`` of the gate rows ``rg``, then of the up rows ``ru`` (GLU; else the gate's again)."""
        qw, hd, s1, s2, s3, qh = _q4k_words(rg, c, m4, woff, hoff, nc, EVEN, REPACK, FIVE)
        if GLU:
            qwu, hdu, s1u, s2u, s3u, qhu = _q4k_words(ru, c, m4, woff, hoff, nc, EVEN, REPACK, FIVE)
        else:
            qwu, hdu, s1u, s2u, s3u, qhu = qw, hd, s1, s2, s3, qh
        return qw, hd, s1, s2, s3, qh, qwu, hdu, s1u, s2u, s3u, qhu

    @triton.jit
    def _q4k_nib(qw, qh, p, h: tl.constexpr, FIVE: tl.constexpr):
        """The codes of nibble half ``h`` of the code words, one per byte: Q4_K's nibble; FIVE (Q5_K) with
        bit 2p + h of the matching qh byte as bit 4 (qh word w holds that bit of elements 4w..4w+3 of every
        sub-block)."""
        nib = (qw >> (4 * h)) & 0x0F0F0F0F
        if FIVE:
            nib = nib | (((qh >> (2 * p + h)) & 0x01010101) << 4)
        return nib

    @triton.jit
    def _ubyte(v, b, ASM: tl.constexpr):
        """Byte b (a tensor) of int32 ``v`` as an unsigned int: one ``prmt`` on the GPU."""
        if not ASM:
            return (v >> (8 * b)) & 0xFF
        return tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, $2;", "=r,r,r", [v, 0x4440 + b],
                                         dtype=tl.int32, is_pure=True, pack=1)

    @triton.jit
    def _q4k_packed_scales(s1, s2, s3, hi):
        """XQ = 3: a super-block's 8 6-bit scales and 8 minimums, four to a word, by masks and shifts
        (sub-blocks 0-3: the low 6 bits of scale words 1 / 2; 4-7: word 3's nibbles joined with the top 2
        bits of words 1 / 2); ``hi`` (sub-block >= 4) picks the word."""
        sc = tl.where(hi, (s3 & 0x0F0F0F0F) | ((s1 >> 2) & 0x30303030), s1 & 0x3F3F3F3F)
        mn = tl.where(hi, ((s3 >> 4) & 0x0F0F0F0F) | ((s2 >> 2) & 0x30303030), s2 & 0x3F3F3F3F)
        return sc, mn

    @triton.jit
    def _q4k_i8_sub(acc, nib, hd, sc, mn, xw, xd, xs, b, ASM: tl.constexpr):
        """XQ = 3: ``acc`` + a sub-block of each super-block: the integer dot of its codes ``nib`` with x's
        codes, times its 6-bit scale (byte ``b`` of ``sc``; an integer multiply-add whose result is the
        mantissa of a float), times d and x's block scale, minus dmin * its 6-bit minimum * x's block sum."""
        dot = tl.sum(_idp4a(nib, xw, tl.full(nib.shape, 0, tl.int32), ASM), axis=3, keep_dims=True)  # |dot| < 61,000
        # |dot * scale| < 2^22: added to the bits of 1.5 * 2^23 it is that float's mantissa, exactly
        p = (dot * _ubyte(sc, b, ASM) + MAGIC15).to(tl.float32, bitcast=True) - ONE5_23
        return acc + p * (_f16(hd) * xd) - (_f16(hd >> 16) * _byte(mn, b, 0.0, ASM)) * xs

    @triton.jit
    def _x8(X, XD, XS, xi, xm, bi, m4, EVEN: tl.constexpr):
        """XQ >= 2: x's code words at ``xi`` and the scale and Σx of its blocks ``bi`` ([BN, CH, 4, 1])."""
        return _ld(X + xi, xm, EVEN), _ld(XD + bi, m4, EVEN), _ld(XS + bi, m4, EVEN)

    @triton.jit
    def _q4k_kernel(X, NW, XD, XS, W, R, Y, N, K, HALF, ROW_WORDS, eps, MROWS, SX, BN: tl.constexpr,
                    CH: tl.constexpr, NORM: tl.constexpr, RES: tl.constexpr, GLU: tl.constexpr,
                    PDL: tl.constexpr = False, ASM: tl.constexpr = False, XQ: tl.constexpr = True,
                    XB: tl.constexpr = 16, XF16: tl.constexpr = False, NB: tl.constexpr = 16,
                    NF16: tl.constexpr = False,
                    STAGES: tl.constexpr = 1, PF: tl.constexpr = False, EVEN: tl.constexpr = False,
                    REPACK: tl.constexpr = False, FIVE: tl.constexpr = False, L2PF: tl.constexpr = 0):
        """Q4_K super-block (36 words): [d|dmin] [scales x 3] [qs x 32]; qs word 4 + 8p + w holds, in
        byte b, elements 32*(2p) + 4w + b (low nibble) and 32*(2p+1) + 4w + b (high nibble): x quad
        8(2p + h) + w of the super-block for nibble half h. EVEN: no masks (the launcher sets it for XQ = 3
        only, where it was measured). REPACK: the weight is Q4_K_R (the same words, a row's code words
        first and its header words after them: ``_q4k_words``). FIVE: Q5_K (44 words: [d|dmin] [scales x
        3] [qh x 8] [qs x 32]; the same arithmetic with 5-bit codes, ``_q4k_nib``; not XQ = 3, whose
        integer products must stay under 2^22)."""
        rows, ok, rg, ru, xr = _program_rows(W, N, HALF, ROW_WORDS, BN, PDL, MROWS, L2PF, GLU)
        X, XD, XS, R, Y = _row_ptrs(X, XD, XS, R, Y, xr, SX, N)
        ci = tl.arange(0, CH)[:, None, None]                                       # [CH, 1, 1]
        p = tl.arange(0, 4)[None, :, None]                                         # [1, 4, 1]
        w = tl.arange(0, 8)[None, None, :]                                         # [1, 1, 8]
        woff = tl.max_contiguous(tl.broadcast_to((0 if REPACK else 12 if FIVE else 4) + 8 * p[None] + w[None],
                                                 [BN, CH, 4, 8]), [1, 1, 1, 4])
        hoff = tl.max_contiguous(tl.broadcast_to(4 + 0 * p[None] + w[None], [BN, CH, 4, 8]), [1, 1, 1, 4])  # FIVE: qh
        nc = K // 256
        if XQ == 3:
            hi = p[None] >= 2                                                      # sub-blocks 2p + h >= 4,
            bsel = 2 * (p[None] % 2)                                               # their byte 2(p % 2) + h
        if XQ >= 2:                         # one float per sub-block: its integer dot times its two scales
            acc = tl.zeros([BN, CH, 4, 1], dtype=tl.float32)
            acc_u = tl.zeros([BN, CH, 4, 1], dtype=tl.float32)
        else:
            acc = tl.zeros([BN, CH, 4, 8], dtype=tl.float32)
            acc_u = tl.zeros([BN, CH, 4, 8], dtype=tl.float32)
        if XQ:
            ss = tl.zeros([BN, CH, 4, 8], dtype=tl.float32)
        else:
            ss = tl.zeros([CH, 4, 8], dtype=tl.float32)
        if PF:                              # the first iteration's words, loaded before the loop
            qw, hd, s1, s2, s3, qh, qwu, hdu, s1u, s2u, s3u, qhu = _q4k_rows(
                rg, ru, ci, ok[:, None, None, None] & (ci < nc)[None], woff, hoff, nc, GLU, False, REPACK, FIVE)
        for c0 in tl.range(0, nc, CH, num_stages=STAGES):
            c = c0 + ci
            cok = c < nc
            m4 = ok[:, None, None, None] & cok[None]                              # [BN, CH, 1, 1]
            if PF:                          # the next iteration's words in flight during this one's arithmetic
                nxt = _q4k_rows(rg, ru, c + CH, ok[:, None, None, None] & (c + CH < nc)[None], woff, hoff, nc,
                                GLU, False, REPACK, FIVE)
            else:
                qw, hd, s1, s2, s3, qh, qwu, hdu, s1u, s2u, s3u, qhu = _q4k_rows(rg, ru, c, m4, woff, hoff, nc, GLU,
                                                                                EVEN, REPACK, FIVE)
            if PDL:
                gdc_wait()
            if XQ == 3:
                sc, mn = _q4k_packed_scales(s1, s2, s3, hi)
                if GLU:
                    sc_u, mn_u = _q4k_packed_scales(s1u, s2u, s3u, hi)
            for h in tl.static_range(2):
                sub = c * 8 + 2 * p + h                                            # [CH, 4, 1] sub-block
                xi, xm = _xidx(sub * 8 + w, cok, [BN, CH, 4, 8], [1, 1, 1, 4], XQ)
                bi = tl.broadcast_to(sub[None], [BN, CH, 4, 1])                    # XQ >= 2: x's blocks
                if XQ == 3:                 # int8 x, integer dots (module doc)
                    xw, xd, xs = _x8(X, XD, XS, xi, xm, bi, m4, EVEN)
                    acc = _q4k_i8_sub(acc, (qw >> (4 * h)) & 0x0F0F0F0F, hd, sc, mn, xw, xd, xs, bsel + h, ASM)
                    if GLU:
                        acc_u = _q4k_i8_sub(acc_u, (qwu >> (4 * h)) & 0x0F0F0F0F, hdu, sc_u, mn_u, xw, xd, xs,
                                            bsel + h, ASM)
                else:
                    ds, dm = _q4k_scales(hd, s1, s2, s3, p[None], h)                  # [BN, CH, 4, 1]
                    nib = _q4k_nib(qw, qh, p[None], h, FIVE)                             # this half's codes
                    if GLU:
                        ds_u, dm_u = _q4k_scales(hdu, s1u, s2u, s3u, p[None], h)
                        nib_u = _q4k_nib(qwu, qhu, p[None], h, FIVE)
                    if XQ == 2:                 # x as int8 codes (a word per quad), one scale and Σx per sub-block
                        xw, xd, xs = _x8(X, XD, XS, xi, xm, bi, m4, EVEN)      # (after the scales: measured order)
                        # the 8 words' dp4a sums are exact integers: summed first, then the scales and Σx's minimum term
                        acc += tl.sum(_dp4a(nib, xw, ASM), axis=3, keep_dims=True) * (ds * xd) - dm * xs
                        if GLU:
                            acc_u += tl.sum(_dp4a(nib_u, xw, ASM), axis=3, keep_dims=True) * (ds_u * xd) - dm_u * xs
                    else:
                        x0, x1, x2, x3, sx, ss = _x4(X, NW, xi, xm, ss, NORM, XQ, XB, XF16, NB, NF16)
                        acc += _dot4(nib, x0, x1, x2, x3, 0.0, ASM) * ds - dm * sx
                        if GLU:
                            acc_u += _dot4(nib_u, x0, x1, x2, x3, 0.0, ASM) * ds_u - dm_u * sx
            if PF:
                qw, hd, s1, s2, s3, qh, qwu, hdu, s1u, s2u, s3u, qhu = nxt
        y = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=1)
        u = y
        if GLU:
            u = tl.sum(tl.sum(tl.sum(acc_u, axis=3), axis=2), axis=1)
        _finish(y, u, _ss_total(ss, XQ), K, eps, R, Y, rows, ok, NORM, RES, GLU)

    # ------------------------------------------------------------------------------------------ Q6_K
    @triton.jit
    def _word(wp, mask, SHIFTED: tl.constexpr):
        """Words at ``wp``; SHIFTED: the word starting 2 bytes further (a funnel shift of two)."""
        a = tl.load(wp, mask=mask, other=0)
        if SHIFTED:
            a = ((a >> 16) & 0xFFFF) | (tl.load(wp + 1, mask=mask, other=0) << 16)
        return a

    @triton.jit
    def _q6k_codes(base, m4, hg, w, ODD: tl.constexpr, REPACK: tl.constexpr = False):
        """The ql and qh words [BN, CP, 8, 4] of the super-block at ``base`` (layout: kernel doc; REPACK: its
        48 code words, aligned)."""
        shifted: tl.constexpr = ODD and not REPACK
        ql = _word(base + 4 * hg + w, m4, shifted)
        qh = _word(base + 32 + 8 * (hg // 4) + 4 * (hg % 2) + w, m4, shifted)
        return ql, qh

    @triton.jit
    def _q6k_join(ql, qh, hg, n: tl.constexpr):
        """The 6-bit codes of nibble half n, one per byte."""
        return ((ql >> (4 * n)) & 0x0F0F0F0F) | (((qh >> (4 * n + 2 * ((hg % 4) // 2))) & 0x03030303) << 4)

    @triton.jit
    def _q6k_signed(ql, qh, hg, n: tl.constexpr):
        """``_q6k_join``'s codes as signed bytes q - 32 (XQ = 2's dp4a): q + 96 has no carry out of its byte,
        then the sign bit flipped."""
        return (_q6k_join(ql, qh, hg, n) + 0x60606060) ^ SIGN8

    @triton.jit
    def _q6k_scale(base, dbase, m4, hg, n: tl.constexpr, ODD: tl.constexpr, REPACK: tl.constexpr = False):
        """d * sc of sub-block 8h + 4n + g (hg = 4h + g) of the super-block at ``base``: [BN, CP, 8, 1]. REPACK:
        ``base`` is the super-block's 4 scale words, ``dbase`` the word of its pair's two d."""
        if REPACK:
            scw = tl.load(base + 2 * (hg // 4) + n, mask=m4, other=0)
            d = _f16(tl.load(dbase, mask=m4, other=0) >> (16 * ODD))
        else:
            scw = _word(base + 48 + 2 * (hg // 4) + n, m4, ODD)
            d = _f16(_word(base + 52, m4, ODD))
        sc = _code((scw >> (8 * (hg % 4))) ^ 0x80, 0xFF) - 128.0            # int8 scale, exactly
        return d * sc

    @triton.jit
    def _q6k_kernel(X, NW, XD, XS, W, R, Y, N, K, HALF, ROW_WORDS, eps, MROWS, SX, BN: tl.constexpr,
                    CH: tl.constexpr, NORM: tl.constexpr, RES: tl.constexpr, GLU: tl.constexpr,
                    PDL: tl.constexpr = False, ASM: tl.constexpr = False, XQ: tl.constexpr = True,
                    XB: tl.constexpr = 16, XF16: tl.constexpr = False, NB: tl.constexpr = 16,
                    NF16: tl.constexpr = False,
                    STAGES: tl.constexpr = 1, REPACK: tl.constexpr = False, L2PF: tl.constexpr = 0):
        """Q6_K super-block (210 bytes): [ql 128][qh 64][scales int8 16][d]; two per pair of 105 words,
        the second 2 bytes off word alignment. With hg = 4h + g (h: half, g: 16-element group) and
        nibble half n, element 128h + 64n + 16g + 4w + b is byte b of ql word 4hg + w (nibble n) and
        of qh word 32 + 8h + 4(g % 2) + w (bits 2(2n + g // 2)); its sub-block is 8h + 4n + g. REPACK
        (Q6_K_R): a row of S super-blocks is their 48 code words each, then their 4 scale words each,
        then one word of two d per pair: every load aligned, no funnel shift."""
        rows, ok, rg, ru, xr = _program_rows(W, N, HALF, ROW_WORDS, BN, PDL, MROWS, L2PF, GLU)
        X, XD, XS, R, Y = _row_ptrs(X, XD, XS, R, Y, xr, SX, N)
        ci = tl.arange(0, CH)[:, None, None]                                       # [CP, 1, 1]
        hg = tl.arange(0, 8)[None, :, None]                                        # [1, 8, 1]
        w = tl.arange(0, 4)[None, None, :]                                         # [1, 1, 4]
        npairs = K // 512
        acc = tl.zeros([BN, CH, 8, 4], dtype=tl.float32)
        acc_u = tl.zeros([BN, CH, 8, 4], dtype=tl.float32)
        if XQ:
            ss = tl.zeros([BN, CH, 8, 4], dtype=tl.float32)
        else:
            ss = tl.zeros([CH, 8, 4], dtype=tl.float32)
        for c0 in tl.range(0, npairs, CH, num_stages=STAGES):
            c = c0 + ci
            cok = c < npairs
            m4 = ok[:, None, None, None] & cok[None]
            for odd in tl.static_range(2):
                if REPACK:                  # codes, scales and d of super-block 2c + odd in their runs
                    at = (c * 96 + 48 * odd)[None]
                    sat = (npairs * 96 + (2 * c + odd) * 4)[None]
                    dat = (npairs * 104 + c)[None]
                else:
                    at = (c * 105 + 52 * odd)[None]
                    sat = at
                    dat = at
                base = rg[:, None, None, None] + at                                   # [BN, CP, 1, 1]
                sbase = rg[:, None, None, None] + sat
                dbase = rg[:, None, None, None] + dat
                if GLU:
                    base_u = ru[:, None, None, None] + at
                    sbase_u = ru[:, None, None, None] + sat
                    dbase_u = ru[:, None, None, None] + dat
                ql, qh = _q6k_codes(base, m4, hg[None], w[None], odd, REPACK)        # [BN, CP, 8, 4]
                if GLU:
                    ql_u, qh_u = _q6k_codes(base_u, m4, hg[None], w[None], odd, REPACK)
                if PDL:
                    gdc_wait()
                for n in tl.static_range(2):
                    xi, xm = _xidx((2 * c + odd) * 64 + 32 * (hg // 4) + 16 * n + 4 * (hg % 4) + w, cok,
                                   [BN, CH, 8, 4], [1, 1, 1, 4], XQ)
                    if XQ == 2:             # x as int8 codes, the weights' as signed bytes
                        xw = tl.load(X + xi, mask=xm, other=0)
                        bi = tl.broadcast_to(((2 * c + odd) * 8 + 4 * (hg // 4) + 2 * n + (hg % 4) // 2)[None],
                                             [BN, CH, 8, 1])
                        xd = _ld(XD + bi, m4, False)
                        acc += _dp4a(_q6k_signed(ql, qh, hg[None], n), xw, ASM) \
                            * (_q6k_scale(sbase, dbase, m4, hg[None], n, odd, REPACK) * xd)
                        if GLU:
                            acc_u += _dp4a(_q6k_signed(ql_u, qh_u, hg[None], n), xw, ASM) \
                                * (_q6k_scale(sbase_u, dbase_u, m4, hg[None], n, odd, REPACK) * xd)
                    else:
                        x0, x1, x2, x3, _, ss = _x4(X, NW, xi, xm, ss, NORM, XQ, XB, XF16, NB, NF16)
                        acc += _dot4(_q6k_join(ql, qh, hg[None], n), x0, x1, x2, x3, 32.0, ASM) \
                            * _q6k_scale(sbase, dbase, m4, hg[None], n, odd, REPACK)
                        if GLU:
                            acc_u += _dot4(_q6k_join(ql_u, qh_u, hg[None], n), x0, x1, x2, x3, 32.0, ASM) \
                                * _q6k_scale(sbase_u, dbase_u, m4, hg[None], n, odd, REPACK)
        y = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=1)
        u = y
        if GLU:
            u = tl.sum(tl.sum(tl.sum(acc_u, axis=3), axis=2), axis=1)
        _finish(y, u, _ss_total(ss, XQ), K, eps, R, Y, rows, ok, NORM, RES, GLU)

    # ------------------------------------------------------------------------------------------ Q8_0
    @triton.jit
    def _iq4_bytes(q, ASM: tl.constexpr):
        """IQ4's non-linear values of the four codes 0..15 of int32 ``q`` (one a byte) as the signed bytes of one
        word. ASM: two byte permutes (``prmt``) over the 16-entry table in four constant words, selected by
        each code's low 3 bits, and a select per byte on its bit 3; the interpreter: gguf.py's table decoder,
        byte by byte."""
        if ASM:
            t = q | (q >> 4)
            sel = ((t & 0xFF) | ((t >> 8) & 0xFF00)) & 0x7777                    # code b & 7 in nibble b
            lo = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r",
                                           [tl.full(q.shape, IQ4_T0, tl.int32), tl.full(q.shape, IQ4_T1, tl.int32),
                                            sel], dtype=tl.int32, is_pure=True, pack=1)
            hi = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r",
                                           [tl.full(q.shape, IQ4_T2, tl.int32), tl.full(q.shape, IQ4_T3, tl.int32),
                                            sel], dtype=tl.int32, is_pure=True, pack=1)
            m = ((q >> 3) & 0x01010101) * 0xFF
            return (hi & m) | (lo & ~m)
        out = tl.zeros(q.shape, dtype=tl.int32)
        for b in tl.static_range(4):                                          # gguf.py's decoder of one code
            out = out | ((_iq4_value((q >> (8 * b)) & 15).to(tl.int32) & 0xFF) << (8 * b))
        return out

    @triton.jit
    def _q80_codes(base, m3, w, sub, ODD: tl.constexpr, REPACK: tl.constexpr = False, FOUR: tl.constexpr = False,
                   IQ: tl.constexpr = 0):
        """The code words [BN, CP, 8] of block ``ODD`` of the pair at ``base`` (REPACK: the pair's 16 code words).
        FOUR (Q4_0, IQ4_NL, IQ4_XS): word w holds elements 4w .. 4w + 3 as one unsigned byte each, the codes
        0..15: nibble half w // 4 of the block's code word w % 4 (the two words of a half load the same
        address: one request). IQ 2 (IQ4_XS): ``base`` is the super-block, the pair its blocks ``sub`` and
        ``sub`` + 1, whose code words start at word 2 + 4 (``sub`` + ODD): aligned."""
        if FOUR:
            j = w % 4
            if IQ == 2:
                qw = tl.load(base + 2 + 4 * (sub + ODD) + j, mask=m3, other=0)
            elif ODD:                           # bytes 18..35: [d] at word 4's high half, codes = words 5..8
                qw = tl.load(base + 5 + j, mask=m3, other=0)
            else:                             # bytes 0..17: [d] at word 0's low half, codes 2 bytes in
                qw = _word(base + j, m3, True)
            qw = (qw >> (4 * (w // 4))) & 0x0F0F0F0F
        elif REPACK:
            qw = tl.load(base + 8 * ODD + w, mask=m3, other=0)
        elif ODD:                               # bytes 34..67: [d] at word 8's high half, codes = words 9..16
            qw = tl.load(base + 9 + w, mask=m3, other=0)
        else:                                 # bytes 0..33: [d] at word 0's low half, codes 2 bytes in
            qw = _word(base + w, m3, True)
        return qw

    @triton.jit
    def _q80_scale(base, m3, sub, ODD: tl.constexpr, REPACK: tl.constexpr = False, FOUR: tl.constexpr = False,
                   IQ: tl.constexpr = 0):
        """d of block ``ODD`` of the pair at ``base`` (REPACK: ``base`` is the word of the pair's two d; FOUR:
        Q4_0's or IQ4_NL's pair, the odd block's d at word 4's high half). IQ 2 (IQ4_XS): block ``sub`` + ODD
        of the super-block at ``base``, ``d * (ls - 32)``: its 6-bit ``ls`` is nibble ``sub`` + ODD of word 1
        (``scales_l``) below bits 2 (``sub`` + ODD) of word 0's high half (``scales_h``)."""
        if IQ == 2:
            w0 = tl.load(base, mask=m3, other=0)
            ib = sub + ODD
            ls = ((tl.load(base + 1, mask=m3, other=0) >> (4 * ib)) & 0xF) | (((w0 >> (16 + 2 * ib)) & 3) << 4)
            return _f16(w0) * (_code(ls, 63) - 32.0)
        if REPACK:
            return _f16(tl.load(base, mask=m3, other=0) >> (16 * ODD))
        if ODD:
            return _f16(tl.load(base + 8 - 4 * FOUR, mask=m3, other=0) >> 16)
        return _f16(tl.load(base, mask=m3, other=0))

    @triton.jit
    def _q80_signed(qw, FOUR: tl.constexpr, IQ: tl.constexpr, ASM: tl.constexpr):
        """``_q80_codes``' words as signed bytes (XQ = 2's dp4a): Q8_0's are; Q4_0's q become q - 8 (q + 120 has
        no carry out of its byte, then the sign bit flipped); IQ4's their table values."""
        if IQ:
            qw = _iq4_bytes(qw, ASM)
        elif FOUR:
            qw = (qw + 0x78787878) ^ SIGN8
        return qw

    @triton.jit
    def _q80_unsigned(qw, FOUR: tl.constexpr, IQ: tl.constexpr, ASM: tl.constexpr):
        """``_q80_codes``' words as unsigned bytes v + off for ``_dot4`` (off 128: Q8_0's q, IQ4's table value v;
        off 8: Q4_0's q)."""
        if IQ:
            qw = _iq4_bytes(qw, ASM) ^ SIGN8
        elif not FOUR:
            qw = qw ^ SIGN8                     # q + 128
        return qw

    @triton.jit
    def _q80_kernel(X, NW, XD, XS, W, R, Y, N, K, HALF, ROW_WORDS, eps, MROWS, SX, BN: tl.constexpr,
                    CH: tl.constexpr, NORM: tl.constexpr, RES: tl.constexpr, GLU: tl.constexpr,
                    PDL: tl.constexpr = False, ASM: tl.constexpr = False, XQ: tl.constexpr = True,
                    XB: tl.constexpr = 16, XF16: tl.constexpr = False, NB: tl.constexpr = 16,
                    NF16: tl.constexpr = False,
                    STAGES: tl.constexpr = 1, REPACK: tl.constexpr = False, FOUR: tl.constexpr = False,
                    IQ: tl.constexpr = 0, L2PF: tl.constexpr = 0):
        """Q8_0 blocks [d f16][32 int8], two per pair of 17 words; CH pairs per iteration. Element
        64c + 32*odd + 4w + b is byte b of code word w of block ``odd`` of pair c: x quad 16c + 8odd + w.
        REPACK (Q8_0_R): a row is every pair's 16 code words, then one word of two d per pair: the code
        words are aligned (16-byte loads), no realignment. FOUR (Q4_0): blocks [d f16][16 bytes], element
        j < 16 the low nibble of byte j and 16 + j its high nibble, value d * (q - 8); two per pair of 9
        words, the first block's codes 2 bytes off word alignment as Q8_0's: ``_q80_codes`` gives the same
        element order (word w: elements 4w .. 4w + 3), so x's indices, blocks and scales are Q8_0's. IQ (with
        FOUR): the codes are indices into IQ4's 16 non-linear values (``_iq4_bytes``); IQ 1 (IQ4_NL): Q4_0's
        blocks; IQ 2 (IQ4_XS): super-blocks of 256 ([d f16][scales_h u16][scales_l x 4][16 bytes x 8], 34
        words, aligned), eight 32-element blocks each laid out as Q4_0's codes, four pairs a super-block, the
        block's scale ``d * (ls - 32)`` from its header."""
        rows, ok, rg, ru, xr = _program_rows(W, N, HALF, ROW_WORDS, BN, PDL, MROWS, L2PF, GLU)
        X, XD, XS, R, Y = _row_ptrs(X, XD, XS, R, Y, xr, SX, N)
        ci = tl.arange(0, CH)[:, None]                                             # [CP, 1]
        w = tl.arange(0, 8)[None, :]                                               # [1, 8]
        npairs = K // 64
        OFF: tl.constexpr = 128.0 - 120.0 * FOUR * (IQ == 0)              # Q8_0's q + 128, Q4_0's q, IQ4's v + 128
        PAIR: tl.constexpr = 17 - 8 * FOUR                                # words a pair of blocks (Q4_0, IQ4_NL: 9)
        acc = tl.zeros([BN, CH, 8], dtype=tl.float32)
        acc_u = tl.zeros([BN, CH, 8], dtype=tl.float32)
        if XQ:
            ss = tl.zeros([BN, CH, 8], dtype=tl.float32)
        else:
            ss = tl.zeros([CH, 8], dtype=tl.float32)
        for c0 in tl.range(0, npairs, CH, num_stages=STAGES):
            c = c0 + ci
            cok = c < npairs
            m3 = ok[:, None, None] & cok[None]                                    # [BN, CP, 1]
            sub = 0
            if REPACK:                      # codes at 16 words a pair, then the d words
                base = rg[:, None, None] + (c * 16)[None]
                sbase = rg[:, None, None] + (npairs * 16 + c)[None]
                if GLU:
                    base_u = ru[:, None, None] + (c * 16)[None]
                    sbase_u = ru[:, None, None] + (npairs * 16 + c)[None]
            elif IQ == 2:                   # IQ4_XS: super-block c // 4 (34 words), its blocks 2 (c % 4) + odd
                base = rg[:, None, None] + ((c // 4) * 34)[None]
                sub = (2 * (c % 4))[None]
                sbase = base
                if GLU:
                    base_u = ru[:, None, None] + ((c // 4) * 34)[None]
                    sbase_u = base_u
            else:
                base = rg[:, None, None] + (c * PAIR)[None]
                sbase = base
                if GLU:
                    base_u = ru[:, None, None] + (c * PAIR)[None]
                    sbase_u = base_u
            for odd in tl.static_range(2):
                qw = _q80_codes(base, m3, w[None], sub, odd, REPACK, FOUR, IQ)     # int8 codes (FOUR: q, unsigned)
                if GLU:
                    qw_u = _q80_codes(base_u, m3, w[None], sub, odd, REPACK, FOUR, IQ)
                if PDL:
                    gdc_wait()
                xi, xm = _xidx(c * 16 + 8 * odd + w, cok, [BN, CH, 8], [1, 1, 4], XQ)
                if XQ == 2:                 # x as int8 codes: one dp4a per word, x's blocks are the weights'
                    xw = tl.load(X + xi, mask=xm, other=0)
                    xd = _ld(XD + tl.broadcast_to((2 * c + odd)[None], [BN, CH, 1]), m3, False)
                    acc += _dp4a(_q80_signed(qw, FOUR, IQ, ASM), xw, ASM) \
                        * (_q80_scale(sbase, m3, sub, odd, REPACK, FOUR, IQ) * xd)
                    if GLU:
                        acc_u += _dp4a(_q80_signed(qw_u, FOUR, IQ, ASM), xw, ASM) \
                            * (_q80_scale(sbase_u, m3, sub, odd, REPACK, FOUR, IQ) * xd)
                else:
                    x0, x1, x2, x3, _, ss = _x4(X, NW, xi, xm, ss, NORM, XQ, XB, XF16, NB, NF16)
                    acc += _dot4(_q80_unsigned(qw, FOUR, IQ, ASM), x0, x1, x2, x3, OFF, ASM) \
                        * _q80_scale(sbase, m3, sub, odd, REPACK, FOUR, IQ)
                    if GLU:
                        acc_u += _dot4(_q80_unsigned(qw_u, FOUR, IQ, ASM), x0, x1, x2, x3, OFF, ASM) \
                            * _q80_scale(sbase_u, m3, sub, odd, REPACK, FOUR, IQ)
        y = tl.sum(tl.sum(acc, axis=2), axis=1)
        u = y
        if GLU:
            u = tl.sum(tl.sum(acc_u, axis=2), axis=1)
        _finish(y, u, _ss_total(ss, XQ), K, eps, R, Y, rows, ok, NORM, RES, GLU)

    KERNELS = {"Q4_K": _q4k_kernel, "Q5_K": _q4k_kernel, "Q6_K": _q6k_kernel, "Q8_0": _q80_kernel, "Q4_0": _q80_kernel,
               "IQ4_NL": _q80_kernel, "IQ4_XS": _q80_kernel}
    KERNELS.update({name: KERNELS[src] for name, src in TUNED_AS.items()})


# --------------------------------------------------------------------------------------- launching
def supports(x: torch.Tensor, packed: torch.Tensor, qtype: str, k: int) -> bool:
    """Whether the one-row kernel runs: x [M, K] with M <= ``MAX_ROWS``, a weight of a ``K_MULTIPLE`` type whose
    K is a multiple of the kernel's step and whose rows are whole int32 words at a 4-byte aligned address;
    not with ``SHAPEPLAN_QUANT_ONE_ROW=0`` (the generic GEMV of gguf.py then runs every such call)."""
    from shapeplan import env
    return (AVAILABLE and qtype in K_MULTIPLE and env.get("SHAPEPLAN_QUANT_ONE_ROW") and x.dim() == 2
            and 1 <= x.shape[0] <= MAX_ROWS and k % K_MULTIPLE[qtype] == 0
            and packed.dim() == 2 and packed.stride(1) == 1 and packed.stride(0) % 4 == 0
            and packed.data_ptr() % 4 == 0 and x.dtype in (torch.float16, torch.bfloat16, torch.float32))


def type_flags(qtype: str) -> dict[str, bool | int]:
    """The constexprs that make ``KERNELS[qtype]`` read ``qtype``: REPACK (our layouts), Q4_K's kernel's FIVE
    (Q5_K), Q8_0's kernel's FOUR and IQ (Q4_0, IQ4_NL, IQ4_XS)."""
    base = TUNED_AS.get(qtype, qtype)
    flags: dict[str, bool | int] = {"REPACK": qtype in TUNED_AS}
    if base in ("Q4_K", "Q5_K"):
        flags["FIVE"] = qtype == "Q5_K"
    elif base in ("Q8_0", *NIBBLES):
        flags.update(FOUR=qtype in NIBBLES, IQ=NIBBLES.get(qtype, 0))
    return flags


def config(qtype: str, n: int, k: int) -> tuple[int, ...]:
    """(BN, CH, warps, XQ[, STAGES[, PF]]) for N outputs and K inputs: ``TUNE`` (its own entry, else that of
    ``tiles_type(qtype)``), else ``DEFAULT``
    (``DEFAULT_LARGE`` from ``LARGE`` weight elements) with BN halved until there are ``MIN_PROGRAMS``
    programs (or BN is 1); XQ = 2 or 3 becomes 1 with ``SHAPEPLAN_QUANT_INT8_X=0``."""
    from shapeplan import env
    donor = tiles_type(qtype)
    hit = TUNE.get((qtype, n, k)) or TUNE.get((donor, n, k))
    if not hit:
        bn, ch, warps, xq = (DEFAULT_LARGE if n * k >= LARGE else DEFAULT)[donor]
        while bn > 1 and triton.cdiv(n, bn) < MIN_PROGRAMS:
            bn //= 2
        hit = bn, ch, warps, xq
    if hit[3] >= 2 and not env.get("SHAPEPLAN_QUANT_INT8_X"):
        hit = (*hit[:3], 1, *hit[4:])
    return hit


#: ``SHAPEPLAN_QUANT_GEMV_PDL=auto`` launches with PDL matrices with at least this many outputs and inputs
PDL_MIN_DIM = 4096


def pdl_wanted(n: int, k: int, mode: str) -> bool:
    """Whether the switch's value (auto / on / off) asks for PDL on an [n, k] matrix (``pdl_on`` then checks
    that the device and Triton can)."""
    return mode == "on" or (mode == "auto" and min(n, k) >= PDL_MIN_DIM)


def full_tiles(tiles: tuple[int, ...]) -> tuple[int, int, int, int, int, int]:
    """(BN, CH, warps, XQ[, STAGES[, PF]]) with the left-out elements at their defaults (STAGES 1, PF 0)."""
    t = tuple(tiles)
    return t + (1, 0)[len(t) - 4:]


def _aligned(v: torch.Tensor) -> torch.Tensor:
    """``v`` [M, K] with unit stride and every row at an 8-byte aligned address (the kernels read x and the
    norm weight as 64-bit words): ``v`` itself, else a copy."""
    if v.stride(1) != 1 or v.data_ptr() % 8 or (v.shape[0] > 1 and v.stride(0) * v.element_size() % 8):
        return v.clone(memory_format=torch.contiguous_format)
    return v


def gemv1(x: torch.Tensor, packed: torch.Tensor, qtype: str, n: int, k: int, *, norm_w: torch.Tensor | None = None,
          eps: float = 0.0, residual: torch.Tensor | None = None, glu: bool = False,
          tiles: tuple[int, ...] | None = None, x_codes: torch.Tensor | None = None,
          prefetch: bool = False) -> torch.Tensor:
    """The one-row quantized GEMV (module doc): x [M, K], W [n, k] packed -> [M, n] (GLU: [M, n / 2]), M <=
    ``MAX_ROWS``: each row as the one-row call computes it (same tiles, same arithmetic: the same bits), a
    program per row and block of outputs, the weights read from DRAM about once; ``tiles`` (BN, CH, warps,
    XQ[, STAGES[, PF]]) instead of ``config``'s. ``x_codes``: one row of x already as int8 codes
    (``quantize_x``'s buffer, int32 [x_code_words(K)], e.g. from the paged decode attention), which a tile
    with XQ = 2 / 3 reads instead of quantizing x itself (not with a norm prologue; other tiles read x).
    ``prefetch`` (where the launch has PDL): W is asked of L2 while the kernel before runs (gemv.py's
    ``prefetch_lines``; the attention's output projection)."""
    m = x.shape[0]
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"qgemv: x must have 1 to {MAX_ROWS} rows, got {m}")
    x = _aligned(x)
    out_n = n // 2 if glu else n
    bn, ch, warps, xq, stages, pf = full_tiles(tiles or config(qtype, out_n, k))
    words = packed.view(torch.int32)                                               # [n, row bytes / 4]
    y = torch.empty(m, out_n, dtype=x.dtype, device=x.device)
    r = residual.reshape(m, out_n) if residual is not None else y
    if not r.is_contiguous():
        r = r.contiguous()
    nw = _aligned(norm_w.reshape(1, -1)) if norm_w is not None else x
    from shapeplan import env
    from shapeplan.runtime.backends.triton.kernels.gemv import pdl_on, prefetch_lines
    launch = {"launch_pdl": True} if pdl_on(x.device, pdl_wanted(n, k, env.get("SHAPEPLAN_QUANT_GEMV_PDL"))) else {}
    if xq == 3 and qtype not in INT_DOTS:
        raise ValueError(f"qgemv: x mode 3 (integer dots) exists for {sorted(INT_DOTS)}, not {qtype}")
    norm = norm_w is not None
    xd = xs = x
    if x_codes is not None and (norm or m > 1 or x_codes.dtype != torch.int32 or x_codes.numel() != x_code_words(k)):
        raise ValueError(f"qgemv: x_codes must be int32 [{x_code_words(k)}] (x as int8 codes for K={k}) and come "
                         f"with one row of x and without a norm prologue, got {x_codes.dtype} [{x_codes.numel()}]"
                         + (" with norm_w" if norm else "") + (f" and {m} rows" if m > 1 else ""))
    if xq >= 2 and x_codes is not None:           # x came as codes (the decode attention wrote them)
        x, xd, xs = x_code_views(x_codes, k)
        nw = x
    elif xq >= 2:                                 # x quantized first (the norm applied there), then the GEMV
        x, xd, xs = quantize_x(x, nw if norm else None, eps, k, pdl=bool(launch))
        nw, norm = x, False
    extra = type_flags(qtype)
    if "FIVE" in extra:                           # Q4_K's kernel: its register prefetch, its unmasked launch
        extra.update(PF=bool(pf), EVEN=xq == 3 and out_n % bn == 0 and (k // K_MULTIPLE[qtype]) % ch == 0)
    sx = x_code_words(k) if xq >= 2 else x.stride(0)         # a row of x: its codes buffer's, or its own
    KERNELS[qtype][(triton.cdiv(out_n, bn) * m,)](
        x, nw, xd, xs, words, r, y, out_n, k, out_n, words.stride(0), float(eps), m, sx, BN=bn, CH=ch,
        NORM=norm, RES=residual is not None, GLU=glu, PDL=bool(launch), ASM=not interpreting(),
        XQ=xq, XB=8 * x.element_size(), XF16=x.dtype == torch.float16, NB=8 * nw.element_size(),
        NF16=nw.dtype == torch.float16, STAGES=stages, **extra,
        L2PF=prefetch_lines(packed) if prefetch and launch and not glu else 0, num_warps=warps, **launch)
    return y


def x_code_buffer(k: int, device: torch.device, rows: int = 1) -> torch.Tensor:
    """An empty buffer for ``rows`` rows of x as int8 codes: int32 [rows * x_code_words(K)] (``x_code_views``
    splits the first)."""
    return torch.empty(rows * x_code_words(k), dtype=torch.int32, device=device)


def x_code_views(buf: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The code words [K / 4] (int32), scales and sums [K / 32] (float32) of the first row of x in ``buf``
    (int32 [x_code_words(K)] a row, rows one after another: shapeplan/quant/quantize.py ``x_codes`` is the
    torch form of one); the kernels reach row i at ``x_code_words(K) * i`` elements further in each."""
    nb = k // 32
    xw, xd, xs = buf.reshape(-1)[:x_code_words(k)].split([k // 4, nb, nb])
    return xw, xd.view(torch.float32), xs.view(torch.float32)


def quantize_x(x: torch.Tensor, norm_w: torch.Tensor | None, eps: float, k: int, *, pdl: bool = False,
               out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] (with ``norm_w``: rms_norm(x) * norm_w, per row) as XQ = 2 reads it: per row int8 codes per
    block of 32, four to an int32 word [K / 4], the blocks' scales [K / 32] and their exact sums [K / 32]
    (float32), rows one after another in one buffer (``out``, else a new one; ``x_code_views``: the first
    row's views; module doc)."""
    m = x.shape[0]
    xw, xd, xs = x_code_views(out if out is not None else x_code_buffer(k, x.device, m), k)
    _quant_x_kernel[(triton.cdiv(k // 32, QX_BLOCKS), m)](
        x, norm_w if norm_w is not None else x, xw, xd, xs, k, float(eps), x.stride(0), x_code_words(k),
        BB=QX_BLOCKS, NORM=norm_w is not None,
        CHUNK=min(triton.next_power_of_2(k), QX_CHUNK), PDL=pdl, num_warps=4, enable_fp_fusion=False,
        **({"launch_pdl": True} if pdl else {}))
    return xw, xd, xs
