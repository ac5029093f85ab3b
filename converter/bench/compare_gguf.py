#!/usr/bin/env python3
"""Compares the tensors of two GGUF files by name: type, shape and bytes (gguf-py).

    python3 converter/bench/compare_gguf.py A.gguf B.gguf

Meant for checking duet against llama-quantize on the same input (e.g. the bench model's F32
GGUF quantized by both, see measure_rss.sh); the tensor order may differ (llama-quantize
sorts by layer). Prints a line per type and every difference; exits 1 if any.
"""

import sys
from collections import Counter

import gguf


def main():
    a, b = (gguf.GGUFReader(p) for p in sys.argv[1:3])
    ta = {t.name: t for t in a.tensors}
    tb = {t.name: t for t in b.tensors}
    diffs = []
    if set(ta) != set(tb):
        diffs.append(f"names differ: only in A {sorted(set(ta) - set(tb))}, only in B {sorted(set(tb) - set(ta))}")
    same = Counter()
    for name in sorted(set(ta) & set(tb)):
        x, y = ta[name], tb[name]
        if x.tensor_type != y.tensor_type:
            diffs.append(f"{name}: type {x.tensor_type.name} vs {y.tensor_type.name}")
        elif list(x.shape) != list(y.shape):
            diffs.append(f"{name}: shape {list(x.shape)} vs {list(y.shape)}")
        elif x.data.tobytes() != y.data.tobytes():
            diffs.append(f"{name}: {x.tensor_type.name} bytes differ")
        else:
            same[x.tensor_type.name] += 1
    for ty, n in sorted(same.items()):
        print(f"{ty}: {n} tensors byte-identical")
    for d in diffs:
        print(d)
    print(f"{sum(same.values())} identical, {len(diffs)} difference(s)")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
