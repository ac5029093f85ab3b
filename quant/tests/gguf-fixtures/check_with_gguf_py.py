#!/usr/bin/env python3
"""Reads a GGUF file with gguf-py's GGUFReader and prints it as JSON on stdout, in the
encoding make_fixtures.py documents (floats as IEEE bits, arrays as {"elem", "items"}).
Used by quant/tests/gguf_writer_gguf_py.rs to check our writer against an independent
reader.

    python check_with_gguf_py.py FILE.gguf
"""

import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf import GGUFValueType as T

TYPE_NAMES = {
    T.UINT8: "u8", T.INT8: "i8", T.UINT16: "u16", T.INT16: "i16", T.UINT32: "u32",
    T.INT32: "i32", T.FLOAT32: "f32", T.BOOL: "bool", T.STRING: "str", T.ARRAY: "arr",
    T.UINT64: "u64", T.INT64: "i64", T.FLOAT64: "f64",
}


def scalar(part, vtype):
    raw = part.tobytes()
    if vtype == T.FLOAT32:
        return int(np.frombuffer(raw, dtype="<u4")[0])
    if vtype == T.FLOAT64:
        return int(np.frombuffer(raw, dtype="<u8")[0])
    if vtype == T.BOOL:
        assert raw in (b"\x00", b"\x01"), raw
        return raw == b"\x01"
    return int(part[0])


def decode(parts, i, vtype):
    """Decodes one value of `vtype` from GGUFReader's flat list of parts starting at i.
    GGUFReader flattens nested arrays in ReaderField.contents(), but its parts keep the
    on-disk sequence (element type, count, elements...), which this walks."""
    if vtype == T.STRING:
        return bytes(parts[i + 1]).decode("utf-8"), i + 2
    if vtype == T.ARRAY:
        elem = T(int(parts[i][0]))
        count = int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(count):
            v, i = decode(parts, i, elem)
            items.append(v)
        return {"elem": TYPE_NAMES[elem], "items": items}, i
    return scalar(parts[i], vtype), i + 1


def main(path):
    r = GGUFReader(path)
    meta = []
    for field in r.fields.values():
        if field.name.startswith("GGUF."):
            continue
        # parts: key length, key bytes, value type, value parts...
        vtype = T(int(field.parts[2][0]))
        value, end = decode(field.parts, 3, vtype)
        assert end == len(field.parts), (field.name, end, len(field.parts))
        meta.append({"key": field.name, "type": TYPE_NAMES[vtype], "value": value})
    tensors = []
    for t in r.tensors:
        tensors.append({
            "name": t.name,
            "type": t.tensor_type.name,
            "dims": [int(d) for d in t.shape],
            "offset": int(t.data_offset) - int(r.data_offset),
            "n_bytes": int(t.n_bytes),
            "hex": t.data.tobytes().hex(),
        })
    out = {
        "version": int(r.fields["GGUF.version"].parts[0][0]),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "metadata": meta,
        "tensors": tensors,
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
