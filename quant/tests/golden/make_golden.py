#!/usr/bin/env python3
"""Generates quant/tests/golden/golden.bin: deterministic inputs, and what ggml (through
harness.c linked against libggml-base) makes of them. gguf-py is run as a second opinion on
every type it can quantize or dequantize, and the script fails if it disagrees with ggml
anywhere but in the three documented places (known_gguf_py_divergence, dequant_agrees).

    make_golden.py --harness PATH/TO/harness --out golden.bin

Needs numpy and gguf==0.19.0. make_golden.sh builds the harness from nothing and calls this.
The inputs use only +, -, *, / and sqrt on a splitmix64 stream (no libm transcendental
functions), so they are the same on every IEEE-754 platform. See README.md for the format.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

from gguf import GGMLQuantizationType as QT
from gguf import quants as gq

MAGIC = b"DUETGLD1"

# name in the container, harness name, elements per block, bytes per block,
# has an imatrix quantizer in ggml, has a ggml dequantizer, gguf-py quantize, gguf-py dequantize
TYPES = [
    ("Q4_0", "q4_0", 32, 18, True, True, QT.Q4_0, QT.Q4_0),
    ("Q4_1", "q4_1", 32, 20, True, True, QT.Q4_1, QT.Q4_1),
    ("Q5_0", "q5_0", 32, 22, True, True, QT.Q5_0, QT.Q5_0),
    ("Q5_1", "q5_1", 32, 24, True, True, QT.Q5_1, QT.Q5_1),
    ("Q8_0", "q8_0", 32, 34, True, True, QT.Q8_0, QT.Q8_0),
    ("Q8_1", "q8_1", 32, 36, False, False, None, None),
    ("Q4_K", "q4_K", 256, 144, True, True, None, QT.Q4_K),
    ("Q5_K", "q5_K", 256, 176, True, True, None, QT.Q5_K),
    ("Q6_K", "q6_K", 256, 210, True, True, None, QT.Q6_K),
    ("Q8_K", "q8_K", 256, 292, False, True, None, None),
    ("F16", "f16", 1, 2, False, True, QT.F16, QT.F16),
    ("BF16", "bf16", 1, 2, False, True, QT.BF16, QT.BF16),
]
FLOAT_TYPES = {"F16", "BF16"}
# Dequantization goldens: ggml's dequantize_row_* of the first DQ_ELEMS values of these
# cases (as ggml quantized them), plus random blocks of every type (random_blocks). The
# cases are chosen for their scales (ordinary, large, one outlier per super-block, exact
# ties, all-constant, zero, d flushed to zero, f16-subnormal d).
DQ_ELEMS = 256
DQ_CASES = ["normal_1", "normal_1e3", "outlier_per_superblock", "ties_sym", "near_ties_asym", "constant", "zeros",
            "below_group_eps", "f16_subnormal"]

FLAG_IMATRIX = 1
FLAG_FLOAT_ONLY = 2  # special floats (inf, NaN, huge): only F16/BF16 conversions apply


# ----------------------------------------------------------------------------- randomness

M64 = (1 << 64) - 1


class Rng:
    """splitmix64. Every derived value uses exact or correctly rounded arithmetic only."""

    def __init__(self, seed: int):
        self.s = seed & M64

    def u64(self) -> int:
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def uniform(self) -> float:
        """Uniform in [0, 1), a multiple of 2^-40 (exact in float64)."""
        return (self.u64() >> 24) * (2.0**-40)

    def normal(self) -> float:
        """Approximately N(0, 1): Irwin-Hall sum of 12 uniforms minus 6 (exact in float64,
        tails bounded at +-6)."""
        return sum(self.uniform() for _ in range(12)) - 6.0

    def below(self, n: int) -> int:
        return self.u64() % n

    def sign(self) -> float:
        return -1.0 if self.u64() & 1 else 1.0

    def normals(self, n: int, scale: float = 1.0) -> np.ndarray:
        return np.array([self.normal() * scale for _ in range(n)], dtype=np.float64)


def f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).astype(np.float32)


def bits_f32(u: int) -> np.float32:
    return np.array([u], dtype=np.uint32).view(np.float32)[0]


# ----------------------------------------------------------------------------- cases


class Case:
    def __init__(self, name: str, x: np.ndarray, imatrix: np.ndarray | None = None, float_only: bool = False):
        assert x.dtype == np.float32 and x.ndim == 2
        assert x.shape[1] % 256 == 0
        self.name = name
        self.x = x
        self.imatrix = None if imatrix is None else imatrix.astype(np.float32)
        if self.imatrix is not None:
            assert self.imatrix.shape == (x.shape[1],)
        self.float_only = float_only

    @property
    def nrows(self) -> int:
        return self.x.shape[0]

    @property
    def n_per_row(self) -> int:
        return self.x.shape[1]


def rows(*rs) -> np.ndarray:
    return np.stack([f32(r) for r in rs])


def normal_rows(rng: Rng, nrows: int, n: int, scale: float) -> np.ndarray:
    return rows(*[rng.normals(n, scale) for _ in range(nrows)])


def outlier_rows(rng: Rng, nrows: int, n: int, every: int, big: float = 1e4) -> np.ndarray:
    x = normal_rows(rng, nrows, n, 1.0)
    for r in range(nrows):
        for b in range(0, n, every):
            x[r, b + rng.below(every)] = np.float32(big * rng.sign())
    return x


def tie_block_sym(rng: Rng, levels: int, e: int, n: int = 32) -> list[float]:
    """A block whose signed extreme is +-levels*2^e, the rest multiples of 2^(e-1) inside:
    with d = max/-levels (Q4_0: 8, Q5_0: 16, Q6_K: 32, Q8_0/Q8_K: 127) every x/d is an
    exact integer or half-integer, so every rounding step meets real ties."""
    s = 2.0**e
    vals = []
    for _ in range(n):
        k = rng.below(2 * levels) - levels  # -levels .. levels-1
        half = 0.5 if rng.below(10) < 7 else 0.0
        vals.append((k + half) * s)
    vals[rng.below(n)] = levels * s * rng.sign()
    return vals


def tie_block_asym(rng: Rng, span: int, e: int, positive: bool, n: int = 32) -> list[float]:
    """A block with max - min = span*2^e (Q4_1: 15, Q5_1: 31) and every x - min a multiple
    of 2^(e-1), so (x - min)/d + 0.5 lands exactly on integers."""
    s = 2.0**e
    lo = (rng.below(span + 1) if positive else rng.below(2 * span + 1) - span - span // 2) * s
    vals = []
    for _ in range(n):
        k = rng.below(span)
        half = 0.5 if rng.below(10) < 7 else 0.0
        vals.append(lo + (k + half) * s)
    i, j = rng.below(n), rng.below(n - 1)
    j = j + 1 if j >= i else j
    vals[i] = lo
    vals[j] = lo + span * s
    return vals


def ties_sym(rng: Rng) -> np.ndarray:
    r0 = []
    for _ in range(8):
        r0 += tie_block_sym(rng, [8, 16, 32, 127][rng.below(4)], rng.below(5) - 2)
    r1 = sum((tie_block_sym(rng, 127, 0) for _ in range(8)), [])  # Q8_0 and Q8_K: d = +-1
    r2 = sum((tie_block_sym(rng, 8, 0) for _ in range(8)), [])  # Q4_0: d = +-1
    # Q5_0 (d = +-1 per 32) and Q6_K (every sub-block of 16 has its own +-32 extreme)
    r3 = sum((tie_block_sym(rng, 16, 0) if b % 2 == 0 else tie_block_sym(rng, 32, 0, 16) + tie_block_sym(rng, 32, 0, 16)
              for b in range(8)), [])
    return rows(r0, r1, r2, r3)


def ties_asym(rng: Rng) -> np.ndarray:
    r0 = []
    for _ in range(8):
        r0 += tie_block_asym(rng, [15, 31][rng.below(2)], rng.below(5) - 2, False)
    r1 = sum((tie_block_asym(rng, 15, 0, False) for _ in range(8)), [])
    r2 = sum((tie_block_asym(rng, 31, 0, False) for _ in range(8)), [])
    r3 = sum((tie_block_asym(rng, [15, 31][b % 2], 0, True) for b in range(8)), [])
    return rows(r0, r1, r2, r3)


def nudge(rng: Rng, x: np.ndarray, block: int = 32) -> np.ndarray:
    """Moves every value except each block's min, max and largest magnitude one ulp up or
    down: just beside the ties, with the block scales unchanged."""
    y = x.copy()
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], block):
            blk = x[r, b:b + block]
            keep = {int(np.argmin(blk)), int(np.argmax(blk)), int(np.argmax(np.abs(blk)))}
            for i in range(block):
                if i in keep:
                    continue
                toward = np.float32(np.inf) if rng.u64() & 1 else np.float32(-np.inf)
                y[r, b + i] = np.nextafter(blk[i], toward)
    return y


def constant_rows() -> np.ndarray:
    per_block = [0.3, -7.0, 1e-3, 2.5, -0.125, 100.0, -100.0, 3.0]
    r2 = sum(([c] * 32 for c in per_block), [])
    r3 = sum(([0.77 if b % 2 == 0 else -0.77] * 32 for b in range(8)), [])
    return rows([1.0] * 256, [-1.0] * 256, r2, r3)


def extreme_sign_rows(rng: Rng) -> np.ndarray:
    out = []
    for sgn in (-1.0, 1.0):
        r = []
        for _ in range(8):
            blk = [max(-2.0, min(2.0, rng.normal() * 0.7)) for _ in range(32)]
            blk[rng.below(32)] = sgn * (3.0 + 2.0 * rng.uniform())
            r += blk
        out.append(r)
    return rows(*out)


def equal_extreme_rows(rng: Rng) -> np.ndarray:
    """Each sub-block of 16 holds +A and -A; row 0 has +A first, row 1 -A first."""
    out = []
    for first in (1.0, -1.0):
        r = []
        for sb in range(16):
            a = 4.0 if sb % 2 == 0 else 2.75
            blk = [max(-0.9 * a, min(0.9 * a, rng.normal() * a / 4)) for _ in range(16)]
            p = rng.below(15)
            q = p + 1 + rng.below(15 - p)
            blk[p] = first * a
            blk[q] = -first * a
            r += blk
        out.append(r)
    return rows(*out)


def f16_subnormal_rows(rng: Rng) -> np.ndarray:
    r0 = rng.normals(256, 1e-6)  # all inside the f16 subnormal range (< 6.1e-5)
    step = 2.0**-24  # the smallest f16 subnormal
    r1 = [(rng.below(2047) - 1023 + (0.5 if rng.below(2) else 0.0)) * step for _ in range(256)]
    return rows(r0, r1)


def float_specials(rng: Rng) -> np.ndarray:
    u = [
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # +-0, +-inf
        0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FA00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00001,  # NaNs
        0x7F7FFFFF, 0xFF7FFFFF, 0x00800000, 0x80800000, 0x00000001, 0x80000001, 0x007FFFFF,  # f32 limits
        0x7F7F8000, 0x7F7F7FFF, 0x3F808000, 0x3F818000, 0xBF808000, 0x3F808001, 0x3F807FFF,  # bf16 ties
    ]
    v = [
        65504.0, 65519.0, 65520.0, -65520.0, 65519.99609375, 1e5, -1e5, 65536.0,  # f16 overflow edge
        1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, -(1.0 + 2.0**-11), 1.0 + 2.0**-11 + 2.0**-23,  # f16 ties
        2.0**-24, 2.0**-25, 2.0**-25 + 2.0**-40, 3 * 2.0**-25, 5 * 2.0**-25, 2.0**-26, -(2.0**-25),  # subnormal ties
        2.0**-14, 2.0**-14 - 2.0**-25, 2.0**-14 - 2.0**-24, 2.0**-15 + 2.0**-25, 1e-40, -1e-45,
    ]
    vals = [bits_f32(b) for b in u] + [np.float32(t) for t in v]
    while len(vals) < 256:
        if rng.below(2):
            vals.append(bits_f32(rng.u64() & 0xFFFFFFFF))  # any bit pattern at all
        else:  # near the f16 range, with random low bits around the rounding point
            e = rng.below(40) + 127 - 27
            vals.append(bits_f32((rng.below(2) << 31) | (e << 23) | (rng.u64() & 0x7FFFFF)))
    return np.array(vals[:256], dtype=np.float32).reshape(1, 256)


def sparse_rows(rng: Rng, nrows: int, n: int) -> np.ndarray:
    x = np.zeros((nrows, n), dtype=np.float64)
    for r in range(nrows):
        for i in range(n):
            if rng.below(10) == 0:
                x[r, i] = rng.normal()
    x[0, 32:64] = 0.0  # a whole legacy block / K sub-block of zeros
    x[0, 256 + 16:256 + 32] = 0.0  # a whole Q6_K sub-block of zeros
    return f32(x)


def ipow(u: float, k: int) -> float:
    """u**k by repeated multiplication, left to right (no libm pow)."""
    r = u
    for _ in range(k - 1):
        r = r * u
    return r


def weights(rng: Rng, n: int, zero_frac: float = 0.0, lo: float = 0.05, hi: float = 20.0, power: int = 3) -> np.ndarray:
    w = []
    for _ in range(n):
        if zero_frac > 0 and rng.uniform() < zero_frac:
            w.append(0.0)
        else:
            w.append(lo + hi * ipow(rng.uniform(), power))
    return f32(w)


def build_cases() -> list[Case]:
    rng = Rng(0x6475_6574_676C_64)  # "duetgld"
    c: list[Case] = []
    c.append(Case("normal_1", normal_rows(rng, 2, 512, 1.0)))
    c.append(Case("normal_1e-3", normal_rows(rng, 2, 512, 1e-3)))
    c.append(Case("normal_1e3", normal_rows(rng, 2, 512, 1e3)))
    c.append(Case("zeros", rows([0.0] * 256, [-0.0] * 256)))
    c.append(Case("constant", constant_rows()))
    c.append(Case("outlier_per_block", outlier_rows(rng, 2, 256, 32)))
    c.append(Case("outlier_per_superblock", outlier_rows(rng, 2, 512, 256)))
    c.append(Case("tiny_1e-7", normal_rows(rng, 1, 256, 1e-7)))
    c.append(Case("f16_subnormal", f16_subnormal_rows(rng)))
    c.append(Case("below_group_eps", rows(rng.normals(256, 1e-20), rng.normals(256, 1e-30), rng.normals(256, 2e-15))))
    ts, ta = ties_sym(rng), ties_asym(rng)
    c.append(Case("ties_sym", ts))
    c.append(Case("ties_asym", ta))
    c.append(Case("near_ties_sym", nudge(rng, ts)))
    c.append(Case("near_ties_asym", nudge(rng, ta)))
    c.append(Case("extreme_sign", extreme_sign_rows(rng)))
    c.append(Case("equal_extremes", equal_extreme_rows(rng)))
    c.append(Case("ramp", f32([(i - 256) / 64 for i in range(512)]).reshape(1, 512)))
    c.append(Case("one_signed", rows([1.0 + rng.uniform() for _ in range(256)], [-1.0 - rng.uniform() for _ in range(256)])))
    c.append(Case("sparse", sparse_rows(rng, 1, 512)))
    c.append(Case("heavy_tail", f32([0.3 * ipow(rng.normal(), 3) for _ in range(512)]).reshape(1, 512)))
    c.append(Case("float_specials", float_specials(rng), float_only=True))

    # Importance-matrix cases: the weights are one f32 per column, shared by all rows.
    c.append(Case("imat_random", normal_rows(rng, 2, 512, 1.0), weights(rng, 512)))
    w = weights(rng, 512, zero_frac=0.3)
    w[32:64] = 0.0  # a whole block / sub-block with zero weight
    w[256:272] = 0.0  # a whole Q6_K sub-block
    c.append(Case("imat_some_zero", normal_rows(rng, 2, 512, 1.0), w))
    c.append(Case("imat_all_zero", normal_rows(rng, 1, 256, 1.0), f32([0.0] * 256)))
    c.append(Case("imat_outlier", outlier_rows(rng, 1, 512, 32), weights(rng, 512)))
    c.append(Case("imat_scale_1e-3", normal_rows(rng, 1, 512, 1e-3), weights(rng, 512, lo=1e-4, hi=1e4, power=6)))
    c.append(Case("imat_ties", np.concatenate([ts[:2], ta[:2]]), f32([1.0] * 256)))
    c.append(Case("imat_zero_data", rows([0.0] * 256, [0.0] * 255 + [0.5]), weights(rng, 256)))
    c.append(Case("imat_sparse", sparse_rows(rng, 1, 512), weights(rng, 512, zero_frac=0.2)))
    c.append(Case("imat_constant", constant_rows()[:2], weights(rng, 256)))
    c.append(Case("imat_tiny", rows(rng.normals(256, 1e-20), rng.normals(256, 2e-15), rng.normals(256, 1e-7)), weights(rng, 256)))
    return c


FLOAT_PATTERNS = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
                  0x7C01, 0xFC01, 0x7D00, 0x7DFF, 0x7E00, 0xFE00, 0x7E01, 0x7FFF, 0xFFFF, 0x3C00, 0x3555,
                  0x7F80, 0xFF80, 0x7F81, 0x7FC0, 0x7FBF, 0x0080, 0x007F]


def float_patterns(rng: Rng) -> bytes:
    """1024 u16 patterns for the F16/BF16 dequantization goldens: edges, then random."""
    pats = list(FLOAT_PATTERNS)
    while len(pats) < 1024:
        pats.append(rng.u64() & 0xFFFF)
    return struct.pack("<1024H", *pats)


def finite_f16(rng: Rng) -> bytes:
    h = rng.u64() & 0xFFFF
    if h & 0x7C00 == 0x7C00:
        h &= ~0x4000  # clear the top exponent bit: finite
    return struct.pack("<H", h)


def random_blocks(rng: Rng, name: str, tsize: int, n_blocks: int) -> bytes:
    """Random block bytes (one rng.u64() per byte, low 8 bits) for the dequantization
    goldens; the scale fields are then overwritten with random finite values (a NaN scale
    would only test NaN propagation through arithmetic). quant/tests/golden.rs regenerates
    the bulk ones with the same steps in the same order."""
    out = bytearray()
    for _ in range(n_blocks):
        blk = bytearray(rng.u64() & 0xFF for _ in range(tsize))
        if name == "Q8_K":
            e = 127 - 30 + rng.below(60)
            sign = rng.below(2)
            mant = rng.u64() & 0x7FFFFF
            blk[0:4] = struct.pack("<I", (sign << 31) | (e << 23) | mant)
        elif name == "Q6_K":
            blk[208:210] = finite_f16(rng)
        else:
            blk[0:2] = finite_f16(rng)
            if name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"):
                blk[2:4] = finite_f16(rng)
        out += blk
    return bytes(out)


# ----------------------------------------------------------------------------- bulk cases
#
# Large inputs that are not stored: quant/tests/golden.rs regenerates them from the seed
# (same splitmix64 stream, same exact float64 arithmetic) and checks their hash first. Only
# 64-bit hashes of ggml's outputs are stored.

KIND_NORMAL, KIND_HEAVY, KIND_BITS = 1, 2, 3
BULK_SCALES = [1.0, 0.02, 37.5, 1e-3, 300.0]
BULK = [
    # name, seed, kind, n_per_row, nrows, with imatrix
    ("bulk_normal", 0xB0001, KIND_NORMAL, 1024, 128, False),
    ("bulk_heavy", 0xB0002, KIND_HEAVY, 1024, 32, False),
    ("bulk_imatrix", 0xB0003, KIND_NORMAL, 1024, 64, True),
    ("bulk_bits", 0xB0004, KIND_BITS, 1024, 64, False),  # any f32 bit pattern: F16/BF16 only
]
BULK_RB_SEED = 0xB10C5
BULK_RB_ELEMS = 65536
FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def fnv64(b: bytes) -> int:
    """FNV-1a over little-endian u32 words (zero-padded), then the byte length."""
    words = np.frombuffer(b + b"\0" * ((-len(b)) % 4), dtype="<u4").tolist()
    h = FNV_OFFSET
    for w in words:
        h = ((h ^ w) * FNV_PRIME) & M64
    return ((h ^ len(b)) * FNV_PRIME) & M64


def bulk_inputs(seed: int, kind: int, n: int, nrows: int, with_imatrix: bool):
    rng = Rng(seed)
    if kind == KIND_BITS:
        x = np.array([rng.u64() & 0xFFFFFFFF for _ in range(n * nrows)], dtype=np.uint32).view(np.float32)
    else:
        vals = []
        for r in range(nrows):
            sc = BULK_SCALES[r % len(BULK_SCALES)]
            for _ in range(n):
                v = rng.normal()
                vals.append(v * sc if kind == KIND_NORMAL else 0.3 * v * v * v * sc)
        x = f32(vals)
    imatrix = None
    if with_imatrix:
        w = []
        for _ in range(n):
            if rng.uniform() < 0.1:
                w.append(0.0)
            else:
                u = rng.uniform()
                w.append(0.05 + 20.0 * u * u * u)
        imatrix = f32(w)
    return x.reshape(nrows, n), imatrix


# ----------------------------------------------------------------------------- running ggml


class Harness:
    def __init__(self, path: str, tmp: str):
        self.path = path
        self.tmp = tmp
        self.unwritten: list[str] = []
        self.n = 0

    def _file(self, data: bytes) -> str:
        self.n += 1
        p = os.path.join(self.tmp, f"in{self.n}.bin")
        with open(p, "wb") as f:
            f.write(data)
        return p

    def quant(self, ty: str, x: np.ndarray, imatrix: np.ndarray | None, label: str) -> bytes:
        hname = next(t[1] for t in TYPES if t[0] == ty)
        xin = self._file(x.astype("<f4").tobytes())
        out = os.path.join(self.tmp, "out.bin")
        cmd = [self.path, "quant", hname, str(x.shape[1]), xin, out]
        if imatrix is not None:
            cmd.append(self._file(imatrix.astype("<f4").tobytes()))
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"harness failed on {ty} {label}: {r.stderr}")
        n_unwritten = int(r.stderr.strip().split("unwritten=")[1])
        if n_unwritten:
            self.unwritten.append(f"{ty} {label}: {n_unwritten} bytes not written by ggml (golden has 0 there)")
        with open(out, "rb") as f:
            return f.read()

    def dequant(self, ty: str, q: bytes) -> np.ndarray:
        hname = next(t[1] for t in TYPES if t[0] == ty)
        qin = self._file(q)
        out = os.path.join(self.tmp, "out.f32")
        r = subprocess.run([self.path, "dequant", hname, qin, out], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"harness dequant failed on {ty}: {r.stderr}")
        return np.fromfile(out, dtype="<f4")


# ----------------------------------------------------------------------------- gguf-py


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all(a.view(np.uint32) == b.view(np.uint32)))


def dequant_agrees(name: str, q: bytes, g: np.ndarray, y: np.ndarray) -> str | None:
    """'' if gguf-py's dequantization g equals ggml's y bit for bit; a description if they
    differ only in the documented way; None otherwise. The one known difference: an F16
    signaling NaN, which ggml's software f16->f32 (a multiply by 2^-112) quiets and numpy's
    astype keeps signaling; only the quiet bit 0x00400000 differs."""
    if same_bits(g, y):
        return ""
    if name != "F16" or g.shape != y.shape:
        return None
    h = np.frombuffer(q, "<u2")
    gu, yu = g.view(np.uint32), y.view(np.uint32)
    diff = gu != yu
    snan = ((h & 0x7C00) == 0x7C00) & ((h & 0x3FF) != 0) & ((h & 0x200) == 0)
    if np.all(~diff | (snan & ((gu ^ yu) == 0x00400000))):
        return "F16 dequantize of a signaling NaN: ggml quiets it (0x7FC0_0000|payload), numpy keeps it signaling"
    return None


def gguf_quant(qt, x: np.ndarray) -> bytes:
    with np.errstate(all="ignore"):
        return np.ascontiguousarray(gq.quantize(x, qt)).view(np.uint8).tobytes()


def gguf_dequant(qt, q: bytes, n: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        y = gq.dequantize(np.frombuffer(q, dtype=np.uint8).copy(), qt)
    return np.ascontiguousarray(y, dtype=np.float32).reshape(n)


def known_gguf_py_divergence(name: str, blck: int, tsize: int, x: np.ndarray, g: bytes, q: bytes) -> str | None:
    """gguf-py is not ggml. Where its bytes differ from ggml's, every differing block must be
    one of these documented cases (ggml is the reference; the Rust tests follow ggml):
      * Q4_0/Q5_0 blocks whose values are all +-0: ggml starts its signed max at +0.0 and
        never replaces it, so d = +0.0/-8 = -0.0 (0x8000); gguf-py takes x[argmax] (-0.0 for
        a block of -0.0) and writes +0.0. Only the d bytes differ; both are zeros.
      * F16 of a NaN: ggml writes sign|0x7E00, numpy keeps the payload's top bits.
    Returns a description, or None if some difference is not one of these."""
    xs = x.reshape(-1)
    kinds = set()
    for b in range(len(q) // tsize):
        gb, qb = g[b * tsize:(b + 1) * tsize], q[b * tsize:(b + 1) * tsize]
        if gb == qb:
            continue
        xb = xs[b * blck:(b + 1) * blck]
        if name in ("Q4_0", "Q5_0") and np.all(xb == 0) and gb[2:] == qb[2:] and {gb[:2], qb[:2]} <= {b"\x00\x00", b"\x00\x80"}:
            kinds.add(f"{name}: sign of d for all-zero blocks (ggml -0.0, gguf-py +0.0)")
        elif name == "F16" and np.isnan(xb[0]) and all(((h >> 10) & 0x1F) == 0x1F and (h & 0x3FF) for h in struct.unpack("<2H", gb + qb)):
            kinds.add("F16: NaN payload (ggml 0x7E00|sign, numpy keeps payload bits)")
        else:
            return None
    return "; ".join(sorted(kinds))


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--harness", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--meta", action="append", default=[], help="KEY=VALUE lines recorded in the file")
    args = ap.parse_args()

    cases = build_cases()
    entries: list[tuple[str, bytes]] = []
    notes: list[str] = []
    gguf_checked = 0

    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(args.harness, tmp)
        for c in cases:
            flags = (FLAG_IMATRIX if c.imatrix is not None else 0) | (FLAG_FLOAT_ONLY if c.float_only else 0)
            blob = struct.pack("<III", c.n_per_row, c.nrows, flags) + c.x.astype("<f4").tobytes()
            if c.imatrix is not None:
                blob += c.imatrix.astype("<f4").tobytes()
            entries.append((f"case/{c.name}", blob))

        for name, _hn, blck, tsize, has_imat, has_deq, gq_q, gq_dq in TYPES:
            for c in cases:
                if c.float_only and name not in FLOAT_TYPES:
                    continue
                q = h.quant(name, c.x, None, c.name)
                assert len(q) == c.x.size // blck * tsize
                entries.append((f"q/{name}/{c.name}", q))

                # Second opinion: gguf-py's own quantizer must agree with ggml.
                if gq_q is not None:
                    g = gguf_quant(gq_q, c.x)
                    if g != q:
                        why = known_gguf_py_divergence(name, blck, tsize, c.x, g, q)
                        if why is None:
                            sys.exit(f"gguf-py and ggml disagree: {name} {c.name}")
                        notes.append(f"gguf-py differs from ggml on {c.name}, known: {why}")
                    gguf_checked += 1

                if has_deq and name not in FLOAT_TYPES and c.name in DQ_CASES:
                    nb = DQ_ELEMS // blck
                    head = q[: nb * tsize]
                    y = h.dequant(name, head)
                    entries.append((f"dq/{name}/{c.name}", y.astype("<f4").tobytes()))
                    if gq_dq is not None:
                        if dequant_agrees(name, head, gguf_dequant(gq_dq, head, DQ_ELEMS), y) != "":
                            sys.exit(f"gguf-py and ggml dequantize differently: {name} {c.name}")
                        gguf_checked += 1

                if has_imat and c.imatrix is not None:
                    qi = h.quant(name, c.x, c.imatrix, c.name + " (imatrix)")
                    entries.append((f"qi/{name}/{c.name}", qi))

        rng = Rng(0x7261_6E64_626C_6B)  # "randblk"
        for name, _hn, blck, tsize, _hi, has_deq, _gq, gq_dq in TYPES:
            if not has_deq:
                continue
            rb = float_patterns(rng) if name in FLOAT_TYPES else random_blocks(rng, name, tsize, 1024 // blck)
            y = h.dequant(name, rb)
            entries.append((f"rb/{name}", rb))
            entries.append((f"dqr/{name}", y.astype("<f4").tobytes()))
            if gq_dq is not None:
                n = len(rb) // tsize * blck
                why = dequant_agrees(name, rb, gguf_dequant(gq_dq, rb, n), y)
                if why is None:
                    sys.exit(f"gguf-py and ggml dequantize random {name} blocks differently")
                if why:
                    notes.append(f"gguf-py differs from ggml on random {name} blocks, known: {why}")
                gguf_checked += 1

        # Bulk: regenerated by the Rust test from the seed; only hashes are stored.
        for bname, seed, kind, n, nrows, with_imat in BULK:
            x, imatrix = bulk_inputs(seed, kind, n, nrows, with_imat)
            float_only = kind == KIND_BITS
            flags = (FLAG_IMATRIX if with_imat else 0) | (FLAG_FLOAT_ONLY if float_only else 0)
            im_hash = fnv64(imatrix.astype("<f4").tobytes()) if with_imat else 0
            entries.append((f"bulk/{bname}", struct.pack("<IIIIQQQ", n, nrows, flags, kind, seed,
                                                           fnv64(x.astype("<f4").tobytes()), im_hash)))
            for name, _hn, blck, tsize, has_imat, has_deq, gq_q, gq_dq in TYPES:
                if float_only and name not in FLOAT_TYPES:
                    continue
                q = h.quant(name, x, None, bname)
                entries.append((f"hq/{name}/{bname}", struct.pack("<Q", fnv64(q))))
                if gq_q is not None:
                    g = gguf_quant(gq_q, x)
                    if g != q:
                        why = known_gguf_py_divergence(name, blck, tsize, x, g, q)
                        if why is None:
                            sys.exit(f"gguf-py and ggml disagree: {name} {bname}")
                        notes.append(f"gguf-py differs from ggml on {bname}, known: {why}")
                    gguf_checked += 1
                if has_deq:
                    y = h.dequant(name, q)
                    entries.append((f"hdq/{name}/{bname}", struct.pack("<Q", fnv64(y.astype("<f4").tobytes()))))
                    if gq_dq is not None:
                        if dequant_agrees(name, q, gguf_dequant(gq_dq, q, x.size), y) is None:
                            sys.exit(f"gguf-py and ggml dequantize differently: {name} {bname}")
                        gguf_checked += 1
                if has_imat and with_imat:
                    qi = h.quant(name, x, imatrix, bname + " (imatrix)")
                    entries.append((f"hqi/{name}/{bname}", struct.pack("<Q", fnv64(qi))))

        # Bulk random blocks (all 65536 patterns for F16/BF16) for the dequantizers.
        for name, _hn, blck, tsize, _hi, has_deq, _gq, gq_dq in TYPES:
            if not has_deq:
                continue
            if name in FLOAT_TYPES:
                seed, rb = 0, np.arange(65536, dtype="<u2").tobytes()
            else:
                seed = BULK_RB_SEED
                rb = random_blocks(Rng(seed), name, tsize, BULK_RB_ELEMS // blck)
            y = h.dequant(name, rb)
            entries.append((f"hrb/{name}", struct.pack("<QIQQ", seed, len(rb) // tsize, fnv64(rb),
                                                         fnv64(y.astype("<f4").tobytes()))))
            if gq_dq is not None:
                why = dequant_agrees(name, rb, gguf_dequant(gq_dq, rb, len(rb) // tsize * blck), y)
                if why is None:
                    sys.exit(f"gguf-py and ggml dequantize bulk random {name} blocks differently")
                if why:
                    notes.append(f"gguf-py differs from ggml on all/bulk random {name} blocks, known: {why}")
                gguf_checked += 1
        notes += h.unwritten

    meta = list(args.meta)
    meta.append(f"gguf_py=gguf {importlib.metadata.version('gguf')}, numpy {np.__version__}")
    meta.append(f"gguf_py_cross_checks={gguf_checked}")
    meta += [f"note={n}" for n in notes]
    entries.insert(0, ("meta", ("\n".join(meta) + "\n").encode()))

    out = bytearray(MAGIC)
    out += struct.pack("<I", len(entries))
    for key, val in entries:
        k = key.encode("ascii")
        out += struct.pack("<H", len(k)) + k + struct.pack("<I", len(val)) + val
    with open(args.out, "wb") as f:
        f.write(out)
    print(f"wrote {args.out}: {len(entries)} entries, {len(out)} bytes; {gguf_checked} gguf-py cross-checks passed")
    for n in notes:
        print("note:", n)


if __name__ == "__main__":
    main()
