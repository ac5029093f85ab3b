#!/usr/bin/env python3
"""Writes the committed GGUF fixtures with gguf-py (PyPI gguf==0.19.0, numpy), plus a JSON
sidecar per file stating what the file must contain, for quant/tests/gguf_fixtures.rs.

    /path/to/venv/bin/python quant/tests/gguf-fixtures/make_fixtures.py

The sidecars are built from the values handed to gguf-py, not by reading the files back,
so the Rust test checks our reader against gguf-py's writer. Value encoding in the JSON
(shared with check_with_gguf_py.py):
  {"key": k, "type": t, "value": v} with t one of u8 i8 u16 i16 u32 i32 f32 bool str arr
  u64 i64 f64; integers as numbers, f32/f64 as the integer of their IEEE bits (so NaN,
  -0.0 and infinities compare exactly), arrays as {"elem": t, "items": [...]}, nested.
Tensor data is given as hex.
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as T

HERE = Path(__file__).resolve().parent

TYPE_NAMES = {
    T.UINT8: "u8", T.INT8: "i8", T.UINT16: "u16", T.INT16: "i16", T.UINT32: "u32",
    T.INT32: "i32", T.FLOAT32: "f32", T.BOOL: "bool", T.STRING: "str", T.ARRAY: "arr",
    T.UINT64: "u64", T.INT64: "i64", T.FLOAT64: "f64",
}


class Arr(list):
    """An array with an explicit element type. gguf-py infers element types (ints become
    i32) and refuses empty arrays; this lets the fixtures hold typed and empty arrays, nested
    too. Packed in gguf-py's own layout by FixtureWriter below."""

    def __init__(self, elem, items=()):
        super().__init__(items)
        self.elem = elem


class FixtureWriter(gguf.GGUFWriter):
    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == T.ARRAY and isinstance(val, Arr):
            out = bytearray()
            if add_vtype:
                out += self._pack("I", vtype)
            out += self._pack("I", val.elem)
            out += self._pack("Q", len(val))
            for item in val:
                out += self._pack_val(item, val.elem, add_vtype=False)
            return bytes(out)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f64_bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def encode(vtype, v):
    if vtype == T.FLOAT32:
        return f32_bits(v)
    if vtype == T.FLOAT64:
        return f64_bits(v)
    if vtype == T.BOOL:
        return bool(v)
    if vtype == T.ARRAY:
        if isinstance(v, Arr):
            elem = v.elem
        else:  # gguf-py's own inference, for plain lists
            elem = T.get_type(v[0])
        return {"elem": TYPE_NAMES[elem], "items": [encode(elem, x) for x in v]}
    return v


class Fixture:
    def __init__(self, name, arch="duet-fixture"):
        self.name = name
        self.w = FixtureWriter(str(HERE / f"{name}.gguf"), arch)
        self.meta = [{"key": "general.architecture", "type": "str", "value": arch}]
        self.tensors = []
        self.alignment = 32

    def kv(self, key, vtype, value, sub_type=None):
        self.w.add_key_value(key, value, vtype, sub_type=sub_type)
        if vtype == T.ARRAY and sub_type is not None:
            value = Arr(sub_type, value)
        self.meta.append({"key": key, "type": TYPE_NAMES[vtype], "value": encode(vtype, value)})

    def align(self, n):
        self.w.add_custom_alignment(n)
        self.alignment = n
        self.meta.append({"key": "general.alignment", "type": "u32", "value": n})

    def tensor(self, name, arr, raw_dtype=None):
        """arr: a float/int numpy array, or (with raw_dtype) uint8 bytes whose last axis is
        whole blocks; numpy order, so ggml dims are the reversed shape."""
        if raw_dtype is None:
            self.w.add_tensor(name, arr)
            shape = list(arr.shape)
            type_name = gguf.GGMLQuantizationType(
                {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.float64): 28,
                 np.dtype(np.int8): 24, np.dtype(np.int16): 25, np.dtype(np.int32): 26,
                 np.dtype(np.int64): 27}[arr.dtype]).name
        else:
            assert arr.dtype == np.uint8
            self.w.add_tensor(name, arr, raw_dtype=raw_dtype)
            block, size = gguf.GGML_QUANT_SIZES[raw_dtype]
            shape = list(arr.shape[:-1]) + [arr.shape[-1] // size * block]
            type_name = raw_dtype.name
        self.tensors.append({"name": name, "type": type_name, "dims": shape[::-1],
                             "hex": arr.tobytes().hex()})

    def write(self):
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()
        side = {"file": f"{self.name}.gguf", "version": 3, "alignment": self.alignment,
                "metadata": self.meta, "tensors": self.tensors}
        (HERE / f"{self.name}.json").write_text(json.dumps(side, indent=1) + "\n")


def kv_types():
    f = Fixture("kv_types")
    nan, inf = float("nan"), float("inf")
    f.kv("t.u8", T.UINT8, 255)
    f.kv("t.i8", T.INT8, -128)
    f.kv("t.u16", T.UINT16, 65535)
    f.kv("t.i16", T.INT16, -32768)
    f.kv("t.u32", T.UINT32, 4294967295)
    f.kv("t.i32", T.INT32, -2147483648)
    f.kv("t.f32", T.FLOAT32, 1e-5)
    f.kv("t.f32.neg_zero", T.FLOAT32, -0.0)
    f.kv("t.f32.nan", T.FLOAT32, nan)
    f.kv("t.f32.inf", T.FLOAT32, -inf)
    f.kv("t.f32.subnormal", T.FLOAT32, 1e-45)
    f.kv("t.bool.true", T.BOOL, True)
    f.kv("t.bool.false", T.BOOL, False)
    f.kv("t.str", T.STRING, "hello")
    f.kv("t.str.empty", T.STRING, "")
    f.kv("t.str.unicode", T.STRING, "Grüße, 世界! 🦀 e\u0301 \u0000 tab\tnl\n")
    f.kv("t.u64", T.UINT64, 2**64 - 1)
    f.kv("t.i64", T.INT64, -2**63)
    f.kv("t.f64", T.FLOAT64, 2.718281828459045)
    f.kv("t.f64.max", T.FLOAT64, 1.7976931348623157e308)
    f.kv("t.f64.nan", T.FLOAT64, nan)
    f.kv("ключ.unicode", T.UINT8, 7)
    # Arrays of every element type, through gguf-py's sub_type.
    f.kv("a.u8", T.ARRAY, [0, 1, 255], sub_type=T.UINT8)
    f.kv("a.i8", T.ARRAY, [-128, 0, 127], sub_type=T.INT8)
    f.kv("a.u16", T.ARRAY, [0, 65535], sub_type=T.UINT16)
    f.kv("a.i16", T.ARRAY, [-32768, 32767], sub_type=T.INT16)
    f.kv("a.u32", T.ARRAY, [1, 2, 4294967295], sub_type=T.UINT32)
    f.kv("a.i32", T.ARRAY, [-1, 0, 2147483647, 3], sub_type=T.INT32)
    f.kv("a.f32", T.ARRAY, [0.5, -0.0, inf, nan, 3.4028234663852886e38], sub_type=T.FLOAT32)
    f.kv("a.bool", T.ARRAY, [True, False, True], sub_type=T.BOOL)
    f.kv("a.u64", T.ARRAY, [0, 2**64 - 1], sub_type=T.UINT64)
    f.kv("a.i64", T.ARRAY, [-2**63, 2**63 - 1], sub_type=T.INT64)
    f.kv("a.f64", T.ARRAY, [1.0, -1e-300], sub_type=T.FLOAT64)
    # Plain lists, gguf-py inferring the element type (ints -> i32, floats -> f32).
    f.kv("a.str", T.ARRAY, ["<unk>", "", "▁the", "Ġworld", "🦀", "a b"])
    f.kv("a.inferred_i32", T.ARRAY, [3, 1, 4, 1, 5])
    f.kv("a.inferred_f32", T.ARRAY, [0.1, 0.2])
    # Nested arrays: gguf-py's own nesting, then typed and empty ones.
    f.kv("n.i32", T.ARRAY, [[1, 2, 3], [4], [5, 6]])
    f.kv("n.str", T.ARRAY, [["a", "bc"], ["", "日本"]])
    f.kv("n.typed", T.ARRAY, Arr(T.ARRAY, [Arr(T.UINT8, [1, 2]), Arr(T.UINT8, []), Arr(T.UINT8, [3])]))
    f.kv("n.deep", T.ARRAY, Arr(T.ARRAY, [Arr(T.ARRAY, [Arr(T.FLOAT64, [0.25])]), Arr(T.ARRAY, [])]))
    f.kv("n.empty_outer", T.ARRAY, Arr(T.ARRAY, []))
    # Empty arrays of a few element types.
    f.kv("e.u32", T.ARRAY, Arr(T.UINT32, []))
    f.kv("e.str", T.ARRAY, Arr(T.STRING, []))
    f.kv("e.bool", T.ARRAY, Arr(T.BOOL, []))
    f.write()


def block_bytes(rng, qtype, lead_shape, blocks_per_row):
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    return rng.integers(0, 256, size=(*lead_shape, blocks_per_row * size), dtype=np.uint8)


def tensor_types():
    rng = np.random.default_rng(20240611)
    f = Fixture("tensor_types", arch="diffllama")
    f.kv("general.name", T.STRING, "fixture")
    f.kv("general.file_type", T.UINT32, 15)
    f.kv("diffllama.block_count", T.UINT32, 1)
    f.kv("diffllama.rope.freq_base", T.FLOAT32, 10000.0)
    f.kv("diffllama.attention.layer_norm_rms_epsilon", T.FLOAT32, 1e-6)
    f.kv("tokenizer.ggml.tokens", T.ARRAY, ["<s>", "</s>", "a", "b"])
    f.kv("tokenizer.ggml.scores", T.ARRAY, [0.0, 0.0, -1.5, -2.5], sub_type=T.FLOAT32)
    f.kv("tokenizer.ggml.token_type", T.ARRAY, [3, 3, 1, 1], sub_type=T.INT32)
    f.kv("tokenizer.ggml.add_bos_token", T.BOOL, True)
    # 1-D to 4-D, every type the runtime supports, plus the integer types.
    f.tensor("f32.1d", rng.standard_normal(7).astype(np.float32))
    f.tensor("f16.2d", rng.standard_normal((3, 5)).astype(np.float16))
    f.tensor("bf16.3d", block_bytes(rng, Q.BF16, (2, 2), 3), raw_dtype=Q.BF16)
    f.tensor("q4_0.2d", block_bytes(rng, Q.Q4_0, (3,), 2), raw_dtype=Q.Q4_0)
    f.tensor("q4_1.1d", block_bytes(rng, Q.Q4_1, (), 2), raw_dtype=Q.Q4_1)
    f.tensor("q5_0.3d", block_bytes(rng, Q.Q5_0, (2, 1), 1), raw_dtype=Q.Q5_0)
    f.tensor("q5_1.2d", block_bytes(rng, Q.Q5_1, (2,), 1), raw_dtype=Q.Q5_1)
    f.tensor("q8_0.4d", block_bytes(rng, Q.Q8_0, (2, 1, 3), 1), raw_dtype=Q.Q8_0)
    f.tensor("q4_k.2d", block_bytes(rng, Q.Q4_K, (2,), 2), raw_dtype=Q.Q4_K)
    f.tensor("q5_k.1d", block_bytes(rng, Q.Q5_K, (), 1), raw_dtype=Q.Q5_K)
    f.tensor("q6_k.4d", block_bytes(rng, Q.Q6_K, (1, 2, 1), 1), raw_dtype=Q.Q6_K)
    f.tensor("i8.1d", rng.integers(-128, 128, 5, dtype=np.int8))
    f.tensor("i16.1d", rng.integers(-30000, 30000, 3, dtype=np.int16))
    f.tensor("i32.2d", rng.integers(-2**31, 2**31, (2, 2), dtype=np.int32))
    f.tensor("i64.1d", rng.integers(-2**63, 2**63, 2, dtype=np.int64))
    f.tensor("f64.1d", rng.standard_normal(3))
    f.tensor("blk.0.attn_lambda_q1.weight", rng.standard_normal(16).astype(np.float32))
    f.write()


def align128():
    rng = np.random.default_rng(7)
    f = Fixture("align128")
    f.kv("general.name", T.STRING, "alignment 128")
    f.align(128)
    f.kv("after.alignment", T.UINT32, 1)
    # Sizes that are not multiples of 128 so that every tensor needs padding.
    f.tensor("odd.f32", rng.standard_normal(3).astype(np.float32))
    f.tensor("odd.q8_0", block_bytes(rng, Q.Q8_0, (3,), 1), raw_dtype=Q.Q8_0)
    f.tensor("odd.f16", rng.standard_normal((1, 1, 1, 5)).astype(np.float16))
    f.tensor("odd.q6_k", block_bytes(rng, Q.Q6_K, (), 1), raw_dtype=Q.Q6_K)
    f.write()


if __name__ == "__main__":
    kv_types()
    tensor_types()
    align128()
    print("wrote fixtures to", HERE, file=sys.stderr)
