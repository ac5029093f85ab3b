#!/usr/bin/env python3
"""Independent checker for GGUF files written by `duet convert` (acceptance tests, issue #3).

    check_gguf.py JOBS.json

JOBS.json is a list of jobs:

    {"gguf": "out.gguf",            # the file duet wrote
     "source": "model-dir" | "in.gguf",
     "preset": "q4_k_m",            # the --type given to duet
     "keep_dex": false,             # --keep-dex (HF sources only)
     "overrides": ["attn_v\\.weight=q8_0"]}   # --tensor-type rules, in order

Nothing here reuses duet's code: the source is read with numpy (safetensors is a u64 header
length, a JSON header and raw little-endian data; BF16 → F32 is a 16-bit shift) or with
gguf-py's GGUFReader, the HF → GGUF mapping (names, the q/k RoPE permutation of llama.cpp's
convert_hf_to_gguf.py, the DEX fold in float64) and llama.cpp's per-tensor type rules
(src/llama-quant.cpp) are written out again below, and the output is read and dequantized
by gguf-py. For every tensor the checker asserts

  * name, GGUF dims and ggml type (llama.cpp's mix for the preset and the overrides);
  * values: |source − dequantized| within the bound of the type, derived from the format
    (see `bound_*` below); F32 must be exact;
  * bytes: for the types gguf-py can quantize bit-exactly with ggml (F32, F16, BF16, Q4_0,
    Q4_1, Q5_0, Q5_1, Q8_0) the tensor must equal `gguf.quants.quantize` of the source
    values byte for byte; for a GGUF source, a tensor whose type does not change must be
    byte-identical to the source tensor;

and checks the metadata keys and their GGUF value types against config.json and the
tokenizer files (or, for a GGUF source, against the source file's keys).

It prints one JSON summary line per job and exits 1 after listing every failure.
"""

import json
import math
import os
import re
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFValueType as V, LlamaFileType as FT

# --- presets -------------------------------------------------------------------------------

# preset → (default ggml type, general.file_type) as llama.cpp's llama_ftype numbers them.
PRESETS = {
    "f32": (T.F32, FT.ALL_F32),
    "f16": (T.F16, FT.MOSTLY_F16),
    "bf16": (T.BF16, FT.MOSTLY_BF16),
    "q8_0": (T.Q8_0, FT.MOSTLY_Q8_0),
    "q6_k": (T.Q6_K, FT.MOSTLY_Q6_K),
    "q5_k_m": (T.Q5_K, FT.MOSTLY_Q5_K_M),
    "q4_k_m": (T.Q4_K, FT.MOSTLY_Q4_K_M),
    "q4_k_s": (T.Q4_K, FT.MOSTLY_Q4_K_S),
    "q4_0": (T.Q4_0, FT.MOSTLY_Q4_0),
}
FLOAT_TYPES = (T.F32, T.F16, T.BF16)
# Types gguf-py quantizes bit-exactly like ggml (see gguf/quants.py).
BYTE_EXACT = (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)


def block_size(t):
    return gguf.GGML_QUANT_SIZES[t][0]


# --- llama.cpp's type choice (src/llama-quant.cpp, no imatrix, dense model) ----------------


def category(name):
    # tensor_get_category: substring tests in this order.
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for cat in ("attn_v.weight", "attn_k.weight", "attn_q.weight", "attn_output.weight",
                "ffn_up", "ffn_gate", "ffn_down"):
        if cat in name:
            return cat
    return "other"


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


class TypeRules:
    """llama_tensor_get_type for one file; call `choose` in file order (counters advance)."""

    def __init__(self, preset, n_attn_v, n_layers, tied, overrides):
        self.preset = preset
        self.default = PRESETS[preset][0]
        self.n_attn_v = n_attn_v
        self.n_layers = n_layers
        self.tied = tied
        self.overrides = []
        for o in overrides:
            rx, ty = o.rsplit("=", 1)
            self.overrides.append((re.compile(rx), T[ty.upper()]))
        self.i_attn_v = 0
        self.i_ffn_down = 0

    def choose(self, name, n_dims, ne0):
        t = self.default
        if t in FLOAT_TYPES:
            return t  # convert_hf_to_gguf --outtype: every matrix in that type
        manual = False
        for rx, ty in self.overrides:
            if rx.search(name):  # std::regex_search
                t, manual = ty, True
                break
        cat = category(name)
        if not manual:
            p, n = self.preset, self.n_layers
            if cat == "output" or (self.tied and cat == "token_embd"):
                if ne0 % block_size(t) != 0:
                    t = T.Q8_0
                elif t != T.Q8_0:
                    t = T.Q6_K
            elif cat == "attn_v.weight":
                i = self.i_attn_v
                if p in ("q4_k_m", "q5_k_m") and use_more_bits(i, self.n_attn_v):
                    t = T.Q6_K
                elif p == "q4_k_s" and i < 4:
                    t = T.Q5_K
                self.i_attn_v += 1
            elif cat == "ffn_down":
                i = self.i_ffn_down  # layer_info(): the counter, for a dense model
                if p in ("q4_k_m", "q5_k_m") and use_more_bits(i, n):
                    t = T.Q6_K
                elif p == "q4_k_s" and i < n // 8:
                    t = T.Q5_K
                self.i_ffn_down += 1
        # tensor_type_fallback
        if ne0 % block_size(t) != 0:
            alt = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}.get(t, t)
            t = alt if ne0 % block_size(alt) == 0 else T.F16
        return t


def llama_cpp_order(names):
    """The order llama-quantize visits tensors in (its weights_map's weight_name_comparer):
    by layer number (tensors outside blk.N first), then by name. The attn_v and ffn_down
    counters advance in this order, whatever the order of the file."""
    def key(n):
        m = re.match(r"blk\.(\d+)\.", n)
        return (int(m.group(1)) if m else -1, n)
    return sorted(names, key=key)


def expected_types(tensors, rules, keep):
    """name → expected ggml type. tensors: list of (name, GGUF dims); keep(name, n_dims)
    gives the type of a tensor that is never quantized, or None."""
    dims = dict(tensors)
    out = {}
    for name in llama_cpp_order(dims):
        d = dims[name]
        k = keep(name, len(d))
        out[name] = k if k is not None else rules.choose(name, len(d), d[0])
    return out


def keeps_source_type(name, n_dims):
    # Tensors llama.cpp never quantizes (1-D, *_norm.weight) and duet's DEX matrices,
    # which duet always stores as F32.
    return n_dims < 2 or "_norm.weight" in name or "dex" in name


# --- error bounds, derived from each format ----------------------------------------------
#
# x: source values (float64, blocks in rows), y: gguf-py's dequantization, raw: block bytes.
# Each returns (err, bound) arrays of the same shape: the check is err ≤ bound everywhere,
# and the summary reports max(err/bound). SLACK covers float32 arithmetic in the quantizer
# and in gguf-py's decoder: 16 ulp of the block's magnitude.

SLACK = 2.0 ** -20
F16_REL = 2.0 ** -11  # f32 → f16 rounds to nearest: half an ulp of an 11-bit significand
F16_SUB = 2.0 ** -25  # half the spacing of f16 subnormals


def f16_err(v):
    """Bound on |f16(v) − v| for |v| within the f16 range."""
    return np.maximum(np.abs(v) * F16_REL, F16_SUB)


def f16(v):
    return np.asarray(v, dtype=np.float32).astype(np.float16).astype(np.float64)


def bound_exact(x, y, raw):
    return np.abs(x - y), np.zeros_like(x)


def bound_f16(x, y, raw):
    # Round to nearest f16: ≤ half an ulp, 2^-11 relative (2^-25 absolute below 2^-14).
    return np.abs(x - y), f16_err(x)


def bound_bf16(x, y, raw):
    # Round to nearest bf16 (8-bit significand): ≤ 2^-8 relative.
    return np.abs(x - y), np.abs(x) * 2.0 ** -8


def bound_q8_0(x, y, raw):
    # d = absmax/127 (f32), q = round(x/d) ∈ [−127, 127], stored d16 = f16(d):
    # |x − d16·q| ≤ |x − d·q| + 127·|d − d16| ≤ d/2 + 127·|d − d16|.
    amax = np.max(np.abs(x.astype(np.float32)), axis=1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float64)
    b = d / 2 + 127 * np.abs(d - f16(d)) + SLACK * amax
    return np.abs(x - y), np.broadcast_to(b, x.shape)


def _signed_max(x32):
    i = np.abs(x32).argmax(axis=1)  # first largest |x|, as ggml
    return x32[np.arange(x32.shape[0]), i][:, None]


def _bound_q_0(x, y, levels):
    # Q4_0 (levels 16) / Q5_0 (32): d = m/−(levels/2) with m the signed value of the largest
    # |x|, q − levels/2 ∈ [−levels/2, levels/2 − 1], t = x/d ∈ [−levels/2, levels/2]. Rounding
    # costs half a step, except that t above levels/2 − 1/2 clamps to levels/2 − 1 (up to a
    # whole step); the f16 scale adds (levels/2)·|d − d16|.
    x32 = x.astype(np.float32)
    h = levels // 2
    d = (_signed_max(x32) / np.float32(-h)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(d == 0, 0.0, x / np.where(d == 0, 1.0, d))
    steps = np.maximum(0.5, t - (h - 1))
    amax = np.abs(d) * h
    b = np.abs(d) * steps + h * np.abs(d - f16(d)) + SLACK * amax
    return np.abs(x - y), b


def bound_q4_0(x, y, raw):
    return _bound_q_0(x, y, 16)


def bound_q5_0(x, y, raw):
    return _bound_q_0(x, y, 32)


def _bound_q_1(x, y, nmax):
    # Q4_1 (nmax 15) / Q5_1 (31): d = (max − min)/nmax, q = round((x − min)/d) ∈ [0, nmax],
    # y = d16·q + m16: |x − y| ≤ d/2 + nmax·|d − d16| + |min − m16|.
    x32 = x.astype(np.float32)
    mn = x32.min(axis=1, keepdims=True)
    mx = x32.max(axis=1, keepdims=True)
    d = ((mx - mn) / np.float32(nmax)).astype(np.float64)
    mn = mn.astype(np.float64)
    amax = np.maximum(np.abs(mn), np.abs(mx))
    b = d / 2 + nmax * np.abs(d - f16(d)) + np.abs(mn - f16(mn)) + SLACK * amax
    return np.abs(x - y), np.broadcast_to(b, x.shape)


def bound_q4_1(x, y, raw):
    return _bound_q_1(x, y, 15)


def bound_q5_1(x, y, raw):
    return _bound_q_1(x, y, 31)


def _scale_min_k4(s):
    """get_scale_min_k4 of ggml-quants.c for all 8 sub-blocks: s is (nb, 12) uint8."""
    sc = np.empty((s.shape[0], 8), np.int64)
    m = np.empty((s.shape[0], 8), np.int64)
    s = s.astype(np.int64)
    for j in range(4):
        sc[:, j] = s[:, j] & 63
        m[:, j] = s[:, j + 4] & 63
    for j in range(4, 8):
        sc[:, j] = (s[:, j + 4] & 0xF) | ((s[:, j - 4] >> 6) << 4)
        m[:, j] = (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)
    return sc, m


def _bound_qk_min(x, y, raw, nmax):
    """Q4_K (nmax 15) / Q5_K (31): super-block of 8 sub-blocks of 32, y = d·sc·q − dmin·m.

    (a) Every element is rounded to the nearest point of its sub-block's stored grid
        {D·q − M : q = 0..nmax} (D = d16·sc, M = dmin16·m): |x − y| ≤ D/2 inside the grid's
        range, plus the distance to the range outside it.
    (b) Sub-block error, as root mean square weighted by ggml's w = rms(x) + |x|:
        make_qkx2_quants keeps a candidate only if its weighted squared error beats the
        plain min/max grid (min clamped to ≤ 0), whose every element is within half a step
        (max − min)/(2·nmax). Storing the scale as 6 bits of d (d = max_scale/63) moves it
        by ≤ d/2 + 63|d − d16|, the min by ≤ dmin/2 + 63|dmin − dmin16|; re-rounding each
        element to the stored grid can only help. So
        rms_w(x − y) ≤ (max − min)/(2·nmax) + nmax·ΔD + ΔM.
    """
    nb = raw.shape[0]
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float64)  # (nb, 1)
    dmin = raw[:, 2:4].copy().view(np.float16).astype(np.float64)
    sc, m = _scale_min_k4(raw[:, 4:16])
    D = d * sc  # (nb, 8)
    M = dmin * m
    xs = x.reshape(nb, 8, 32)
    ys = y.reshape(nb, 8, 32)
    err = np.abs(xs - ys)
    mag = np.max(np.abs(xs), axis=2) + nmax * D + M  # (nb, 8)
    lo, hi = -M, nmax * D - M
    dist = np.maximum(np.maximum(lo[..., None] - xs, xs - hi[..., None]), 0)
    ba = D[..., None] / 2 + dist + SLACK * mag[..., None]

    x32 = xs.astype(np.float32)
    av = np.sqrt(np.mean(x32.astype(np.float64) ** 2, axis=2, keepdims=True))
    w = av + np.abs(xs)
    sw = w.sum(axis=2)
    rms = np.sqrt((w * err ** 2).sum(axis=2) / np.where(sw > 0, sw, 1))
    cand = (xs.max(axis=2) - np.minimum(xs.min(axis=2), 0)) / (2 * nmax)
    ed, edm = f16_err(d) * (1 + 2.0 ** -10), f16_err(dmin) * (1 + 2.0 ** -10)
    dD = (d + ed) / 2 + 63 * ed
    dM = (dmin + edm) / 2 + 63 * edm
    bb = cand + nmax * dD + dM + SLACK * mag
    return np.concatenate([err.ravel(), rms.ravel()]), np.concatenate([ba.ravel(), bb.ravel()])


def bound_q4_k(x, y, raw):
    return _bound_qk_min(x, y, raw, 15)


def bound_q5_k(x, y, raw):
    return _bound_qk_min(x, y, raw, 31)


def bound_q6_k(x, y, raw):
    """Q6_K: 16 sub-blocks of 16, y = d16·sc·(q − 32), sc int8, q − 32 ∈ [−32, 31].

    (a) nearest point of the stored grid, as for Q4_K.
    (b) make_qx_quants (weights x², least-squares scale) keeps a candidate only if it beats
        the first one, L = round(−32·x/max) clamped to [−32, 31] with scale −max/32: every
        element within one step amax/32 (half a step, or a whole one where the clamp bites).
        The int8 scale of d = −max_scale/128 is off by ≤ |d|/2 (≤ |d| where 128 clamps to
        127), plus 128|d − d16|; |q − 32| ≤ 32. So rms_{x²}(x − y) ≤ amax/32 + 32·ΔD.
    """
    nb = raw.shape[0]
    sc = raw[:, 192:208].copy().view(np.int8).astype(np.float64)  # (nb, 16)
    d = raw[:, 208:210].copy().view(np.float16).astype(np.float64)  # (nb, 1)
    D = d * sc
    xs = x.reshape(nb, 16, 16)
    ys = y.reshape(nb, 16, 16)
    err = np.abs(xs - ys)
    amax = np.max(np.abs(xs), axis=2)
    mag = amax + 32 * np.abs(D)
    lo, hi = np.minimum(-32 * D, 31 * D), np.maximum(-32 * D, 31 * D)
    dist = np.maximum(np.maximum(lo[..., None] - xs, xs - hi[..., None]), 0)
    ba = np.abs(D)[..., None] / 2 + dist + SLACK * mag[..., None]

    w = xs ** 2
    sw = w.sum(axis=2)
    rms = np.sqrt((w * err ** 2).sum(axis=2) / np.where(sw > 0, sw, 1))
    ed = f16_err(d) * (1 + 2.0 ** -10)
    dD = (np.abs(d) + ed) * np.where(sc == 127, 1.0, 0.5) + 128 * ed
    bb = amax / 32 + 32 * dD + SLACK * mag + 1e-12
    return np.concatenate([err.ravel(), rms.ravel()]), np.concatenate([ba.ravel(), bb.ravel()])


# type → (bound function, the bound in words for the summary)
BOUNDS = {
    T.F32: (bound_exact, "exact"),
    T.F16: (bound_f16, "half an f16 ulp: max(|x|·2^-11, 2^-25)"),
    T.BF16: (bound_bf16, "half a bf16 ulp: |x|·2^-8"),
    T.Q8_0: (bound_q8_0, "d/2 + 127|d − d16|, d = absmax/127"),
    T.Q4_0: (bound_q4_0, "|d|/2 (≤ |d| where clamped) + 8|d − d16|, d = max/−8"),
    T.Q5_0: (bound_q5_0, "|d|/2 (≤ |d| where clamped) + 16|d − d16|, d = max/−16"),
    T.Q4_1: (bound_q4_1, "d/2 + 15|d − d16| + |min − m16|, d = (max − min)/15"),
    T.Q5_1: (bound_q5_1, "d/2 + 31|d − d16| + |min − m16|, d = (max − min)/31"),
    T.Q4_K: (bound_q4_k, "nearest on the stored grid; rms_w ≤ (max − min)/30 + 15ΔD + ΔM"),
    T.Q5_K: (bound_q5_k, "nearest on the stored grid; rms_w ≤ (max − min)/62 + 31ΔD + ΔM"),
    T.Q6_K: (bound_q6_k, "nearest on the stored grid; rms_x² ≤ amax/32 + 32ΔD"),
}


# --- sources -----------------------------------------------------------------------------


def read_safetensors(path):
    out = {}
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    base = 8 + n
    for name, e in header.items():
        if name == "__metadata__":
            continue
        s, t = e["data_offsets"]
        raw = buf[base + s:base + t]
        dt = e["dtype"]
        if dt == "F32":
            a = np.frombuffer(raw, "<f4").astype(np.float32)
        elif dt == "F16":
            a = np.frombuffer(raw, "<f2").astype(np.float32)
        elif dt == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} has dtype {dt}, which the checker does not read")
        out[name] = a.reshape(e["shape"])
    return out


def read_checkpoint(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(os.path.join(d, f)))
    return tensors


def permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (n_head already the KV count for k)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_factors(theta, dim, rp):
    # convert_hf_to_gguf.py generate_extra_tensors, in float64.
    factor = rp.get("factor", 8.0)
    lo_f = rp.get("low_freq_factor", 1.0)
    hi_f = rp.get("high_freq_factor", 4.0)
    old = rp.get("original_max_position_embeddings", 8192)
    lo_w, hi_w = old / lo_f, old / hi_f
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / theta ** (i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < hi_w:
            out.append(1.0)
        elif wavelen > lo_w:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo_f) / (hi_f - lo_f)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)


def rope_params(cfg):
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        return rp.get("rope_theta", cfg.get("rope_theta", 10000.0)), rp
    return cfg.get("rope_theta", 10000.0), cfg.get("rope_scaling") or {}


class Expected:
    """The tensors a GGUF must hold: name → (float64 values in numpy order, tolerance note)."""

    def __init__(self):
        self.tensors = {}  # name → float64 array (numpy order = reversed GGUF dims)
        self.rel_tol = {}  # name → relative tolerance for values computed in floating point
        self.info = {}


def expected_from_hf(d, keep_dex):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    t = read_checkpoint(d)
    H = cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads") or H
    hidden = cfg["hidden_size"]
    hd = cfg.get("head_dim") or hidden // H
    L = cfg["num_hidden_layers"]
    arch = cfg["model_type"]
    theta, rp = rope_params(cfg)
    e = Expected()
    x = e.tensors
    used = set()

    def src(name):
        used.add(name)
        return t[name].astype(np.float64)

    x["token_embd.weight"] = src("model.embed_tokens.weight")
    if (rp.get("rope_type") or rp.get("type")) == "llama3":
        x["rope_freqs.weight"] = llama3_factors(theta, hd, rp)
        e.rel_tol["rope_freqs.weight"] = 1e-5  # computed in float32 by duet and llama.cpp
    dex_heads = (cfg.get("dex") or {}).get("heads")
    e.info["dex_changed"] = {}
    for l in range(L):
        p, b = f"model.layers.{l}", f"blk.{l}"
        x[f"{b}.attn_norm.weight"] = src(f"{p}.input_layernorm.weight")
        x[f"{b}.attn_q.weight"] = permute(src(f"{p}.self_attn.q_proj.weight"), H)
        x[f"{b}.attn_k.weight"] = permute(src(f"{p}.self_attn.k_proj.weight"), Hkv)
        x[f"{b}.attn_v.weight"] = src(f"{p}.self_attn.v_proj.weight")
        wo = src(f"{p}.self_attn.o_proj.weight")
        heads = dex_heads[l] if dex_heads else []
        if heads and keep_dex:
            x[f"{b}.attn_dex.weight"] = src(f"{p}.self_attn.dex_proj.weight")
            x[f"{b}.attn_dex_lambda.weight"] = src(f"{p}.self_attn.dex_lambda").reshape(1)
        elif heads:
            # DEX fold, float64: Wo[:, h] ← Wo[:, h] · (I − λ·W_D)ᵀ on the adapted heads.
            wd = src(f"{p}.self_attn.dex_proj.weight")
            lam = float(src(f"{p}.self_attn.dex_lambda").reshape(-1)[0])
            folded = wo.copy()
            for h in heads:
                cols = slice(h * hd, (h + 1) * hd)
                folded[:, cols] = wo[:, cols] @ (np.eye(hd) - lam * wd).T
            e.info["dex_changed"][f"{b}.attn_output.weight"] = float(np.max(np.abs(folded - wo)))
            wo = folded
            e.rel_tol[f"{b}.attn_output.weight"] = 2.0 ** -23  # one f32 rounding of the product
        x[f"{b}.attn_output.weight"] = wo
        if cfg.get("attention_bias"):
            x[f"{b}.attn_q.bias"] = permute(src(f"{p}.self_attn.q_proj.bias"), H)
            x[f"{b}.attn_k.bias"] = permute(src(f"{p}.self_attn.k_proj.bias"), Hkv)
            x[f"{b}.attn_v.bias"] = src(f"{p}.self_attn.v_proj.bias")
            x[f"{b}.attn_output.bias"] = src(f"{p}.self_attn.o_proj.bias")
        if arch == "diffllama":
            for w in ("q1", "k1", "q2", "k2"):
                x[f"{b}.attn_lambda_{w}.weight"] = src(f"{p}.self_attn.lambda_{w}")
        x[f"{b}.ffn_norm.weight"] = src(f"{p}.post_attention_layernorm.weight")
        for g in ("gate", "up", "down"):
            x[f"{b}.ffn_{g}.weight"] = src(f"{p}.mlp.{g}_proj.weight")
            if cfg.get("mlp_bias"):
                x[f"{b}.ffn_{g}.bias"] = src(f"{p}.mlp.{g}_proj.bias")
    x["output_norm.weight"] = src("model.norm.weight")
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        x["output.weight"] = src("lm_head.weight")
    unused = set(t) - used - {"lm_head.weight"}
    if unused:
        raise SystemExit(f"{d}: the checker does not map {sorted(unused)}")
    e.info.update(cfg=cfg, arch=arch, n_layers=L, tied=tied, H=H, Hkv=Hkv, hd=hd, dex_heads=dex_heads)
    return e


# --- checks --------------------------------------------------------------------------------


class Failures:
    def __init__(self):
        self.items = []

    def check(self, ok, msg):
        if not ok:
            self.items.append(msg)
        return ok


def field_value(field):
    if field.types[0] == V.ARRAY:
        return list(field.contents())
    return field.contents()


def field_type(field):
    return tuple(field.types)


def check_metadata_hf(r, job, e, fail):
    cfg, arch = e.info["cfg"], e.info["arch"]
    src = job["source"]
    f = r.fields
    n = 0

    def kv(key, vtype, want):
        nonlocal n
        n += 1
        field = f.get(key)
        if not fail.check(field is not None, f"missing key {key}"):
            return
        got_t = field_type(field)
        fail.check(got_t == vtype, f"{key}: type {got_t}, want {vtype}")
        got = field_value(field)
        if isinstance(want, float):
            ok = got == np.float32(want)
        else:
            ok = got == want
        fail.check(ok, f"{key}: {str(got)[:200]!r}, want {str(want)[:200]!r}")

    theta, _ = rope_params(cfg)
    H = e.info["H"]
    kv("general.architecture", (V.STRING,), arch)
    kv("general.file_type", (V.UINT32,), int(PRESETS[job["preset"]][1]))
    kv("general.quantization_version", (V.UINT32,), 2)
    kv(f"{arch}.block_count", (V.UINT32,), cfg["num_hidden_layers"])
    kv(f"{arch}.context_length", (V.UINT32,), cfg["max_position_embeddings"])
    kv(f"{arch}.embedding_length", (V.UINT32,), cfg["hidden_size"])
    kv(f"{arch}.feed_forward_length", (V.UINT32,), cfg["intermediate_size"])
    kv(f"{arch}.attention.head_count", (V.UINT32,), H)
    kv(f"{arch}.attention.head_count_kv", (V.UINT32,), e.info["Hkv"])
    kv(f"{arch}.rope.dimension_count", (V.UINT32,), e.info["hd"])
    kv(f"{arch}.rope.freq_base", (V.FLOAT32,), float(theta))
    kv(f"{arch}.attention.layer_norm_rms_epsilon", (V.FLOAT32,), float(cfg["rms_norm_eps"]))

    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as fh:
        tok_text = fh.read()
    tok = json.loads(tok_text)
    by_id = {i: s for s, i in tok["model"]["vocab"].items()}
    special = {}
    for a in tok.get("added_tokens", []):
        by_id[a["id"]] = a["content"]
        special[a["id"]] = a.get("special", False)
    vocab = cfg["vocab_size"]
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab)]
    # llama.cpp token types: 3 control (special added), 4 user-defined, 5 unused (padding), 1 normal
    types = [(3 if special[i] else 4) if i in special else (1 if i in by_id else 5) for i in range(vocab)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    kv("tokenizer.ggml.model", (V.STRING,), "gpt2")
    kv("tokenizer.ggml.tokens", (V.ARRAY, V.STRING), tokens)
    kv("tokenizer.ggml.token_type", (V.ARRAY, V.INT32), types)
    kv("tokenizer.ggml.merges", (V.ARRAY, V.STRING), merges)
    kv("tokenizer.huggingface.json", (V.STRING,), tok_text)
    tc_path = os.path.join(src, "tokenizer_config.json")
    if os.path.exists(tc_path):
        with open(tc_path, encoding="utf-8") as fh:
            tc = json.load(fh)
        ids = {s: i for i, s in by_id.items()}
        if isinstance(tc.get("chat_template"), str):
            kv("tokenizer.chat_template", (V.STRING,), tc["chat_template"])
        if isinstance(tc.get("eos_token"), str):
            kv("tokenizer.ggml.eos_token_id", (V.UINT32,), ids[tc["eos_token"]])
        if isinstance(tc.get("pad_token"), str):
            kv("tokenizer.ggml.padding_token_id", (V.UINT32,), ids[tc["pad_token"]])
        if isinstance(tc.get("add_bos_token"), bool):
            kv("tokenizer.ggml.add_bos_token", (V.BOOL,), tc["add_bos_token"])
    dex = e.info["dex_heads"]
    if dex and job.get("keep_dex"):
        mask = [0] * (e.info["n_layers"] * H)
        for l, hs in enumerate(dex):
            for h in hs:
                mask[l * H + h] = 1
        kv("duet.dex.head_mask", (V.ARRAY, V.UINT8), mask)
    else:
        fail.check("duet.dex.head_mask" not in f, "duet.dex.head_mask written without --keep-dex")
    return n


def check_metadata_gguf(r, src, job, fail):
    n = 0
    skip = {"general.file_type", "general.quantization_version", "general.alignment", "general.name"}
    for key, field in src.fields.items():
        if key.startswith("GGUF.") or key in skip:
            continue
        n += 1
        got = r.fields.get(key)
        if fail.check(got is not None, f"source key {key} missing"):
            fail.check(field_type(got) == field_type(field), f"{key}: type {field_type(got)} != source {field_type(field)}")
            fail.check(field_value(got) == field_value(field), f"{key}: value differs from the source")
    for key, want in (("general.file_type", int(PRESETS[job["preset"]][1])), ("general.quantization_version", 2)):
        n += 1
        got = r.fields.get(key)
        if fail.check(got is not None, f"missing key {key}"):
            fail.check(field_type(got) == (V.UINT32,), f"{key}: type {field_type(got)}")
            fail.check(field_value(got) == want, f"{key}: {field_value(got)}, want {want}")
    if "general.name" in src.fields:
        fail.check("general.name" in r.fields, "general.name missing")
    return n


def check_tensor(name, t, want, rel_tol, fail, stats, src_raw=None):
    """t: gguf-py ReaderTensor; want: float64 source values (numpy order); rel_tol: values
    computed in floating point (DEX fold, rope factors), checked relative in F32 and, when
    quantized, rounded once to f32 before quantizing (as duet does); src_raw: the source
    tensor's bytes when the type is kept (GGUF source)."""
    ty = T(t.tensor_type)
    dims = [int(v) for v in t.shape]
    if not fail.check(list(reversed(dims)) == list(want.shape),
                      f"{name}: dims {dims}, want {list(reversed(want.shape))}"):
        return
    s = stats.setdefault(ty.name, {"tensors": 0, "elements": 0, "byte_exact": 0, "worst_err_over_bound": 0.0,
                                   "bound": BOUNDS[ty][1]})
    s["tensors"] += 1
    s["elements"] += int(want.size)
    raw = np.asarray(t.data)
    y = gguf.quants.dequantize(raw, ty).astype(np.float64).reshape(-1)
    x = want.reshape(-1)
    if src_raw is not None:
        s["byte_exact"] += 1
        if fail.check(src_raw.tobytes() == raw.tobytes(), f"{name}: kept type {ty.name} but bytes differ from the source"):
            return  # the same bytes: the same values
    if name in rel_tol and ty == T.F32:
        err, bound = np.abs(x - y), rel_tol[name] * np.abs(x)
        what = f"relative {rel_tol[name]:g}"
    else:
        fn, what = BOUNDS[ty]
        if ty in FLOAT_TYPES:
            err, bound = fn(x, y, None)
        else:
            bs = block_size(ty)
            nb = x.size // bs
            err, bound = fn(x.reshape(nb, bs), y.reshape(nb, bs), raw.reshape(nb, -1))
    over = err > bound
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(bound > 0, err / np.where(bound > 0, bound, 1), np.where(err > 0, np.inf, 0))
    worst = float(np.max(ratio, initial=0.0))
    s["worst_err_over_bound"] = max(s["worst_err_over_bound"], worst)
    fail.check(not over.any(), f"{name} ({ty.name}): {int(over.sum())} value(s) exceed the bound ({what}), worst err/bound {worst:.3g}")
    if ty in BYTE_EXACT and src_raw is None and not (name in rel_tol and ty == T.F32):
        ref = gguf.quants.quantize(want.astype(np.float32), ty)
        s["byte_exact"] += 1
        if not fail.check(np.asarray(ref).tobytes() == raw.tobytes(), f"{name} ({ty.name}): bytes differ from gguf.quants.quantize"):
            a = np.frombuffer(np.asarray(ref).tobytes(), np.uint8)
            b = np.frombuffer(raw.tobytes(), np.uint8)
            if a.size == b.size:
                fail.items[-1] += f" ({int(np.count_nonzero(a != b))} of {a.size} bytes)"


_SOURCES = {}


def source_reader(path):
    # Parsing a 49k-token vocabulary takes gguf-py seconds: read each source once.
    if path not in _SOURCES:
        _SOURCES[path] = gguf.GGUFReader(path)
    return _SOURCES[path]


def run_job(job):
    fail = Failures()
    r = gguf.GGUFReader(job["gguf"])
    out = {t.name: t for t in r.tensors}
    stats = {}
    preset = job["preset"]
    overrides = job.get("overrides", [])
    if os.path.isdir(job["source"]):
        e = expected_from_hf(job["source"], job.get("keep_dex", False))
        n_keys = check_metadata_hf(r, job, e, fail)
        names = list(e.tensors)
        fail.check(sorted(out) == sorted(names),
                   f"tensor names differ: extra {sorted(set(out) - set(names))}, missing {sorted(set(names) - set(out))}")
        n_attn_v = sum(1 for n in names if "attn_v.weight" in n)
        rules = TypeRules(preset, n_attn_v, e.info["n_layers"], e.info["tied"], overrides)
        types = expected_types([(n, list(reversed(v.shape))) for n, v in e.tensors.items()], rules,
                               lambda n, nd: T.F32 if keeps_source_type(n, nd) else None)
        for t in r.tensors:
            if t.name not in e.tensors:
                continue
            want_t = types[t.name]
            fail.check(T(t.tensor_type) == want_t, f"{t.name}: type {T(t.tensor_type).name}, want {want_t.name}")
            check_tensor(t.name, t, e.tensors[t.name], e.rel_tol, fail, stats)
        info = {"dex_changed": e.info["dex_changed"]}
    else:
        src = source_reader(job["source"])
        n_keys = check_metadata_gguf(r, src, job, fail)
        fail.check([t.name for t in r.tensors] == [t.name for t in src.tensors], "tensor names or order differ from the source")
        arch = field_value(src.fields["general.architecture"])
        n_layers = int(field_value(src.fields[f"{arch}.block_count"]))
        names = [t.name for t in src.tensors]
        rules = TypeRules(preset, sum(1 for n in names if "attn_v.weight" in n), n_layers,
                          "output.weight" not in names, overrides)
        src_types = {t.name: T(t.tensor_type) for t in src.tensors}
        types = expected_types([(t.name, [int(v) for v in t.shape]) for t in src.tensors], rules,
                               lambda n, nd: src_types[n] if keeps_source_type(n, nd) else None)
        for st in src.tensors:
            t = out.get(st.name)
            if t is None:
                continue
            dims = [int(v) for v in st.shape]
            fail.check([int(v) for v in t.shape] == dims, f"{st.name}: dims {list(t.shape)} != source {dims}")
            sty = T(st.tensor_type)
            want_t = types[st.name]
            fail.check(T(t.tensor_type) == want_t, f"{st.name}: type {T(t.tensor_type).name}, want {want_t.name}")
            want = gguf.quants.dequantize(np.asarray(st.data), sty).astype(np.float64).reshape(list(reversed(dims)))
            check_tensor(st.name, t, want, {}, fail, stats, src_raw=np.asarray(st.data) if want_t == sty else None)
        info = {}
    summary = {"gguf": job["gguf"], "preset": preset, "tensors": len(r.tensors), "keys_checked": n_keys,
               "types": stats, "ok": not fail.items, **info}
    return summary, fail.items


def main():
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    all_failures = []
    for job in jobs:
        summary, failures = run_job(job)
        print(json.dumps(summary, sort_keys=True), flush=True)
        all_failures += [f"{job['gguf']}: {m}" for m in failures]
    if all_failures:
        print(f"{len(all_failures)} failure(s):", file=sys.stderr)
        for m in all_failures[:200]:
            print("  " + m, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
