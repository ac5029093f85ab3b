#!/usr/bin/env python3
"""Writes transformers' reference logits for the bundled models (acceptance check 3).

For each exported checkpoint directory (default: models/llama-ref and models/diff-ref, and
models/diffv2-ref once it exists) this loads the model with transformers (DIFF V2, which
transformers does not have: models/diff_v2.py) — the bf16 weights as stored, computed in
float32 — runs
the first N tokens (default 64) of models/reference_prompt.txt (the start of a held-out
evaluation document; the tokenizer prepends <|endoftext|>) and writes every position's
logits to <dir>/reference.logits in duet's logits file format, all little-endian:

    b"DLOG" | u32 version = 1 | u32 n_tokens | u32 n_vocab | u32 token_ids[n_tokens]
    | f32 logits[n_tokens][n_vocab]          (row t: the logits after reading tokens 0..=t)

duet's CPU runtime is compared against these files by the Rust tests; nothing here uses
duet itself.

    models/.venv/bin/python models/reference_logits.py [DIR ...] [--tokens 64]
"""

import argparse
import json
import os
import struct
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIRS = [os.path.join(HERE, n) for n in ("llama-ref", "diff-ref", "diffv2-ref")]


def load_model(d):
    with open(os.path.join(d, "config.json")) as f:
        if json.load(f).get("model_type") == "diffllama_v2":
            sys.path.insert(0, HERE)
            import diff_v2

            return diff_v2.load(d)
    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()


def write_logits(path, ids, logits):
    n, v = logits.shape
    assert len(ids) == n
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"DLOG")
        f.write(struct.pack("<III", 1, n, v))
        f.write(struct.pack(f"<{n}I", *ids))
        f.write(logits.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="*", default=[d for d in DEFAULT_DIRS if os.path.exists(os.path.join(d, "config.json"))])
    ap.add_argument("--prompt", default=os.path.join(HERE, "reference_prompt.txt"))
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    text = open(args.prompt, encoding="utf-8").read()
    for d in args.dirs:
        tok = AutoTokenizer.from_pretrained(d)
        ids = tok(text, truncation=True, max_length=args.tokens).input_ids
        assert len(ids) == args.tokens, f"{args.prompt} is shorter than {args.tokens} tokens"
        model = load_model(d)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0]
        out = os.path.join(d, "reference.logits")
        write_logits(out, ids, logits)
        nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:])).item()
        print(f"{out}: {type(model).__name__}, {len(ids)} tokens x {logits.shape[1]} vocab, "
              f"mean NLL of the prompt {nll:.3f}, greedy next token {tok.decode([int(logits[-1].argmax())])!r}")


if __name__ == "__main__":
    main()
