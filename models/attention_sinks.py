#!/usr/bin/env python3
"""How much attention goes to the first token (the "attention sink"), from `duet attn-map`
output: docs/attention-maps.md's attention-sink table (models/attention_pair.sh runs it).

    python3 models/attention_sinks.py DIR [DIR ...]     # each DIR: `duet attn-map -o DIR` of one model

For every map of every layer and head (a softmax head; a DIFF or DIFF V2 pair's two softmaxes
and their combination A1 − λ·A2) it takes each query row t ≥ FIRST_ROW and measures the share
of the row's attention mass on key 0, |m[t][0]| / Σⱼ |m[t][j]| (for a softmax row, simply its
weight on key 0; for a combined DIFF row, whose weights can be negative and sum to 1 − λ, the
same share of its absolute mass). The first rows are left out because a query with a handful
of keys to choose from says little about sinks.

Prints markdown: per model and kind of map, the share averaged over layers and heads, the
largest layer average, and how many (layer, head) maps put more than half their mass on key 0;
the same for whichever of the first FIRST_ROW keys gets the largest share in each map (a model
may sink its attention into another early token); then the first-token share per layer. Standard library only (the .npy files are duet's f32 C-order
arrays), so it runs without the training venv.
"""
import ast
import json
import os
import struct
import sys
from array import array

FIRST_ROW = 16
SINK_SHARE = 0.5


def load_npy(path):
    """(shape, flat array of f32) of a version-1 little-endian f32 .npy file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x93NUMPY\x01\x00":
        sys.exit(f"error: {path}: not a version-1.0 .npy file")
    (hlen,) = struct.unpack("<H", data[8:10])
    header = ast.literal_eval(data[10:10 + hlen].decode("latin-1"))
    if header.get("descr") != "<f4" or header.get("fortran_order"):
        sys.exit(f"error: {path}: expected little-endian f32 in C order, found {header}")
    values = array("f")
    values.frombytes(data[10 + hlen:])
    if sys.byteorder != "little":
        values.byteswap()
    shape = tuple(header["shape"])
    n = 1
    for d in shape:
        n *= d
    if len(values) != n:
        sys.exit(f"error: {path}: {len(values)} values for shape {shape}")
    return shape, values


def early_key_shares(values, base, t_len):
    """For each key j < FIRST_ROW, the mean over rows t >= FIRST_ROW of |m[t][j]| / sum_i |m[t][i]|
    of the T x T map at `base`: [share of key 0, share of key 1, ...]."""
    sums = [0.0] * FIRST_ROW
    rows = 0
    for t in range(FIRST_ROW, t_len):
        row = values[base + t * t_len: base + t * t_len + t + 1]  # keys 0..=t (the rest are 0)
        mass = sum(map(abs, row))
        if mass > 0:
            rows += 1
            for j in range(FIRST_ROW):
                sums[j] += abs(row[j]) / mass
    return [x / rows for x in sums] if rows else [float("nan")] * FIRST_ROW


def kind_of(entry, k):
    """'softmax' for one softmax's map, 'combined' for a differential pair's A1 − λ·A2."""
    if len(entry["maps"]) == 3 and k == 2:
        return "combined"
    return "softmax"


def measure(directory):
    with open(os.path.join(directory, "maps.json")) as f:
        index = json.load(f)
    cache = {}
    per = {}  # kind -> layer -> [(first-token share, heaviest early key's share) per head / pair]
    tokens = None
    for e in index["entries"]:
        if e["npy"] not in cache:
            cache[e["npy"]] = load_npy(os.path.join(directory, e["npy"]))
        shape, values = cache[e["npy"]]
        _, n_maps, t_len, _ = shape
        if t_len <= FIRST_ROW:
            sys.exit(f"error: {directory}: {t_len} tokens; the measure needs more than {FIRST_ROW}")
        tokens = t_len
        for k in range(n_maps):
            base = ((e["npy_index"] * n_maps) + k) * t_len * t_len
            shares = early_key_shares(values, base, t_len)
            per.setdefault(kind_of(e, k), {}).setdefault(e["layer"], []).append((shares[0], max(shares)))
    return index, tokens, per


def main(dirs):
    if not dirs:
        sys.exit(__doc__)
    results = []
    for d in dirs:
        index, tokens, per = measure(d)
        results.append((os.path.basename(os.path.normpath(d)), index["arch"], tokens, per))
    print(f"Share of each query row's attention mass on the first token (rows {FIRST_ROW} onward), "
          f"averaged over layers and heads, and on whichever of the first {FIRST_ROW} tokens gets the "
          f"most (a sink need not be the first token):\n")
    print("| model | arch | tokens | map | first token | largest layer mean | maps with > 0.5 on it "
          f"| heaviest of the first {FIRST_ROW} | maps with > 0.5 on one |")
    print("|---|---|---|---|---|---|---|---|---|")
    label = {"softmax": "each softmax", "combined": "A1 − λ·A2"}
    for name, arch, tokens, per in results:
        for kind in ("softmax", "combined"):
            if kind not in per:
                continue
            layers = per[kind]
            first = [f for v in layers.values() for f, _ in v]
            heaviest = [h for v in layers.values() for _, h in v]
            layer_means = {l: sum(f for f, _ in v) / len(v) for l, v in layers.items()}
            top = max(layer_means, key=layer_means.get)
            print(f"| {name} | {arch} | {tokens} | {label[kind]} | {sum(first) / len(first):.3f} | "
                  f"{layer_means[top]:.3f} (layer {top}) | {sum(f > SINK_SHARE for f in first)} of {len(first)} | "
                  f"{sum(heaviest) / len(heaviest):.3f} | {sum(h > SINK_SHARE for h in heaviest)} of {len(heaviest)} |")
    # The per-layer table holds the models that share the most common layer count (the
    # reference models, not a deeper comparison model).
    counts = [len(per["softmax"]) for _, _, _, per in results]
    n_layers = max(counts, key=lambda n: (counts.count(n), -n))
    cols = [(name, kind) for name, _, _, per in results for kind in ("softmax", "combined") if kind in per
            and len(per[kind]) == n_layers]
    if cols:
        print(f"\nFirst-token share per layer (mean over the layer's heads; the {n_layers}-layer models):\n")
        print("| layer | " + " | ".join(f"{n} {label[k]}" for n, k in cols) + " |")
        print("|---|" + "---|" * len(cols))
        lookup = {name: per for name, _, _, per in results}
        for layer in sorted({l for n, k in cols for l in lookup[n][k]}):
            cells = []
            for n, k in cols:
                v = lookup[n][k].get(layer)
                cells.append(f"{sum(f for f, _ in v) / len(v):.3f}" if v else "")
            print(f"| {layer} | " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main(sys.argv[1:])
