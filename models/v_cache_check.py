#!/usr/bin/env python3
"""transformers' side of attn-bench's V-cache rows: an independent check of duet's numbers.

    models/.venv/bin/python models/v_cache_check.py models/diff-ref models/.cache/attn-bench/eval.txt 512

Runs the HF checkpoint in float32 over the first N tokens of TEXT twice: once with every
v_proj output rounded to f16 (attn-bench's 16-bit pass keeps an f16 cache), once with it
quantized as duet's q8/q6/q4 cache stores it (blocks of 32 consecutive values of the row,
f16 scale d = absmax/m, m = 2^(bits-1) - 1, values clamp(round(x/d), -m, m)), and prints the
mean KL divergence of the next-token distributions to the f16 pass and the top-1 agreement,
i.e. the `v` rows of `duet attn-bench -c N -w 1` computed by another implementation. V
needs no RoPE, so hooking v_proj quantizes exactly what duet's cache holds. First it prints,
per layer, what decides V's rounding error: V's RMS and absmax, the mean over blocks of
absmax/RMS (the block's outlier ratio: the step is absmax/m) and the relative error
||q8(V) - V|| / ||V||.
"""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def block_absmax(x, bits):
    """x rounded as duet's cache stores it: blocks of 32, f16 scale, symmetric levels."""
    m = 2 ** (bits - 1) - 1
    blocks = x.reshape(-1, 32)
    d = (blocks.abs().amax(-1, keepdim=True) / m).half().float()
    safe = torch.where(d > 0, d, torch.ones_like(d))
    # torch.round rounds halves to even, duet away from zero: exact halves are rare enough
    # in float32 activations not to move these statistics.
    q = torch.where(d > 0, torch.clamp(torch.round(blocks / safe), -m, m), torch.zeros_like(blocks))
    return (q * d).reshape(x.shape)


def main(path, text, n):
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with open(text) as f:
        ids = tok(f.read(), return_tensors="pt").input_ids[:, :n]
    bits, seen = None, []  # seen: each layer's V of the f16 pass

    def quantize_v(_module, _inputs, out):
        if bits is None:
            seen.append(out[0])
            return out.half().float()
        return block_absmax(out, bits)

    for layer in model.model.layers:
        layer.self_attn.v_proj.register_forward_hook(quantize_v)
    with torch.no_grad():
        base = torch.log_softmax(model(ids).logits[0].float(), -1)
        for i, v in enumerate(seen):  # v: [tokens, n_kv_heads * head_dim]
            blocks = v.reshape(-1, 32)
            ratio = (blocks.abs().amax(-1) / blocks.pow(2).mean(-1).sqrt().clamp_min(1e-30)).mean().item()
            err = ((block_absmax(v, 8) - v).norm() / v.norm()).item()
            print(f"{path}: layer {i} V: rms {v.pow(2).mean().sqrt().item():.3f}, absmax {v.abs().max().item():.2f}, "
                  f"block absmax/rms {ratio:.2f}, q8 relative error {err:.2e}")
        for bits in (8, 6, 4):
            lq = torch.log_softmax(model(ids).logits[0].float(), -1)
            kl = (base.exp() * (base - lq)).sum(-1).mean().item()
            top1 = (base.argmax(-1) == lq.argmax(-1)).float().mean().item()
            print(f"{path}: V q{bits} over {ids.shape[1]} tokens: mean KL {kl:.3e}, top-1 {100 * top1:.1f}%")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
