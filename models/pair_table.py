#!/usr/bin/env python3
"""Side-by-side markdown tables of a DIFF / Llama (and DIFF V2) `duet attn-bench` JSON (the tables of
docs/low-bit-attention.md).

    python3 models/pair_table.py models/results/ref-pair-attn-bench.json

Prints the number of tokens scored; one row per setting (the 16-bit pass first, then
target, granularity, bits) with both models' perplexity, mean KL to their own 16-bit pass
and top-1 agreement; and both outlier summaries (the paper's Table 5 columns). Standard
library only, so it runs without the training venv.
"""
import json
import sys


def by_setting(model):
    return {(r["target"], r["bits"], r["granularity"]): r for r in model["runs"]}


def main(path):
    try:
        with open(path) as f:
            models = json.load(f)["models"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"error: {path}: not a readable attn-bench JSON ({e})")
    order = {"diffllama": 0, "diffllama_v2": 1, "llama": 2}
    label = {"diffllama": "DIFF", "diffllama_v2": "DIFF V2", "llama": "Llama"}
    archs = [m["arch"] for m in models]
    if sorted(archs, key=lambda a: order.get(a, len(order))) not in (["diffllama", "llama"], ["diffllama", "diffllama_v2", "llama"]):
        sys.exit(f"error: {path} holds {archs}; expected a DIFF / Llama pair, or DIFF / DIFF V2 / Llama")
    models = sorted(models, key=lambda m: order[m["arch"]])
    names = [label[m["arch"]] for m in models]
    runs = [by_setting(m) for m in models]
    llama = models[-1]

    print(f"tokens scored per model: {models[0]['tokens']:,} ({llama['tokens']:,} for Llama)\n")
    print("| setting | " + " | ".join(f"{n} PPL" for n in names) + " | "
          + " | ".join(f"{n} mean KL" for n in names) + " | "
          + " | ".join(f"{n} top-1" for n in names) + " |")
    print("|---|" + "---|" * (3 * len(names)))
    targets = ["none", "logits", "k", "v", "kv"]
    grans = ["none", "tensor", "head", "row", "static", "block32", "chan32", "rot64", "chan32+rot64"]
    rank = lambda order, x: order.index(x) if x in order else len(order)
    keys = sorted(set.intersection(*(set(r) for r in runs)),
                  key=lambda k: (rank(targets, k[0]), rank(grans, k[2]), k[2], -k[1]))
    for key in keys:
        target, bits, gran = key
        setting = "16-bit" if target == "none" else f"{target} {bits}-bit {gran}"
        rs = [r[key] for r in runs]
        print(f"| {setting} | " + " | ".join(f"{r['ppl']:.2f}" for r in rs) + " | "
              + " | ".join(f"{r['mean_kl']:.2e}" for r in rs) + " | "
              + " | ".join(f"{100 * r['top1']:.1f}%" for r in rs) + " |")

    print("\n| model | activation | top-1 | top-2 | top-3 | top-10 | top-100 | median |")
    print("|---|---|---|---|---|---|---|---|")
    for name, m in zip(names, models):
        for act in ("attention_logits", "hidden_states"):
            vals = " | ".join(f"{v:.1f}" if v >= 10 else f"{v:.2f}" for v in m["outliers"][act])
            print(f"| {name} | {act.replace('_', ' ')} | {vals} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
