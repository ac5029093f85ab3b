"""Prints what gguf-py reads from a GGUF, for tests/cli_info.rs: a line per scalar metadata
key ("kv NAME VALUE", strings JSON-escaped), per array ("arr NAME LENGTH"), and per tensor ("t INDEX NAME TYPE
DIMS BYTES", dims in ggml order, as `duet info` shows them)."""
import json
import sys

from gguf import GGUFReader, GGUFValueType

r = GGUFReader(sys.argv[1])
for f in r.fields.values():
    if f.name.startswith("GGUF."):
        continue
    t = f.types[0]
    if t == GGUFValueType.ARRAY:
        print("arr", f.name, len(f.data))
    elif t == GGUFValueType.STRING:
        # Escaped as duet shows strings (newlines as \n), so each stays on one line.
        print("kv", f.name, json.dumps(bytes(f.parts[f.data[0]]).decode("utf-8"), ensure_ascii=False)[1:-1])
    else:
        print("kv", f.name, f.parts[f.data[0]][0])
for i, t in enumerate(r.tensors):
    dims = ",".join(str(int(d)) for d in t.shape)
    print("t", i, t.name, t.tensor_type.name, dims, int(t.n_bytes))
