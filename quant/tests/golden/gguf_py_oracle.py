#!/usr/bin/env python3
"""The live gguf-py oracle for quant/tests/oracle_gguf_py.rs.

    gguf_py_oracle.py JOBS

JOBS is a text file of tab-separated lines:

    quant    TYPE  N_PER_ROW  IN.f32  OUT.bin    gguf.quants.quantize(rows of IN, TYPE) -> OUT
    dequant  TYPE  IN.bin     OUT.f32            gguf.quants.dequantize(IN, TYPE) -> OUT (f32)

TYPE is a GGMLQuantizationType name (Q4_0, F16, Q6_K, ...). All files are little-endian.
Prints "gguf <version> numpy <version> jobs=<n>" on success.
"""

import importlib.metadata
import sys

import numpy as np
from gguf import GGMLQuantizationType, quants


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    n = 0
    with open(sys.argv[1], encoding="utf-8") as jobs:
        for line in jobs:
            f = line.rstrip("\n").split("\t")
            if not f[0]:
                continue
            qt = GGMLQuantizationType[f[1]]
            with np.errstate(all="ignore"):  # inf/NaN inputs are part of the F16/BF16 cases
                if f[0] == "quant":
                    x = np.fromfile(f[3], dtype="<f4").reshape(-1, int(f[2]))
                    q = np.ascontiguousarray(quants.quantize(x, qt))
                    q.view(np.uint8).tofile(f[4])
                elif f[0] == "dequant":
                    q = np.fromfile(f[2], dtype=np.uint8)
                    y = quants.dequantize(q, qt)
                    np.ascontiguousarray(y, dtype="<f4").reshape(-1).tofile(f[3])
                else:
                    sys.exit(f"unknown job {f[0]!r}")
            n += 1
    print(f"gguf {importlib.metadata.version('gguf')} numpy {np.__version__} jobs={n}")


if __name__ == "__main__":
    main()
