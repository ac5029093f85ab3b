#!/usr/bin/env python3
"""Writes a random-weight Llama checkpoint in the TinyLlama-1.1B shape, for measuring the
converter's memory and speed (converter/bench/measure_rss.sh). numpy only; nothing here is
committed but this script.

    python3 converter/bench/make_random_llama.py OUT_DIR [--dtype bf16|f16] [--shards N] [--diff | --v2]
        [--shape 1b|8b] [--layers N]

Shape (TinyLlama-1.1B): hidden 2048, 22 layers, 32 heads, 4 KV heads, ffn 5632, vocab
32000, untied embeddings: 1.1 B parameters, 2.2 GB of BF16. The weights are N(0, 0.02²)
(norms 1 + N(0, 0.1²)), streamed to disk one tensor at a time so that making the file needs
no more memory than its largest tensor. The tokenizer is the committed fixtures' byte-level
BPE tokenizer.json (320 ids; the converter pads the vocabulary to 32000). --diff writes the
DiffLlama of the same shape instead (plus the four λ vectors of head_dim per layer), for
comparing DIFF and Llama decode speed. --v2 writes the DIFF V2 (duet's diffllama_v2 format)
whose 2h = 32 query heads and 4 KV heads match the Llama's: h = 16 pairs, q_proj 32·64 rows,
o_proj reading 16·64, and a lambda_proj [16, 2048] per layer.

--shape 8b writes Llama-3-8B's shape instead (hidden 4096, 32 layers, 32 heads, 8 KV heads,
ffn 14336, vocab 128256, untied: 8.0 B parameters, 16 GB), for the GPU decode speed of an
8B-class model (runtime/bench/gpu_speed_run.sh). Drawing 8 billion normals would take
minutes of a lent GPU machine's time, so there each distinct tensor shape's values are drawn
once and written for every layer: the file has the right size and layout, and speed does not
depend on the values. --layers N keeps only the first N layers (a quick check of a shape).
"""

import argparse
import json
import os
import shutil

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "..", "tests", "fixtures", "models", "llama-gqa")

# (hidden, layers, heads, KV heads, ffn, vocab, training context, RoPE base)
SHAPES = {
    "1b": (2048, 22, 32, 4, 5632, 32000, 2048, 10000.0),
    "8b": (4096, 32, 32, 8, 14336, 128256, 8192, 500000.0),
}
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, VOCAB, CTX, ROPE_THETA = SHAPES["1b"]
HEAD_DIM = HIDDEN // HEADS


def set_shape(name, layers=None):
    global HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, VOCAB, CTX, ROPE_THETA, HEAD_DIM
    HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, VOCAB, CTX, ROPE_THETA = SHAPES[name]
    if layers is not None:
        LAYERS = layers
    HEAD_DIM = HIDDEN // HEADS


def tensor_shapes(diff=False, v2=False):
    yield "model.embed_tokens.weight", (VOCAB, HIDDEN)
    out_heads = HEADS // 2 if v2 else HEADS  # V2: each pair of query heads becomes one
    for l in range(LAYERS):
        p = f"model.layers.{l}"
        yield f"{p}.input_layernorm.weight", (HIDDEN,)
        yield f"{p}.self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN)
        yield f"{p}.self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)
        yield f"{p}.self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)
        yield f"{p}.self_attn.o_proj.weight", (HIDDEN, out_heads * HEAD_DIM)
        if v2:
            yield f"{p}.self_attn.lambda_proj.weight", (out_heads, HIDDEN)
        if diff:
            for lam in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                yield f"{p}.self_attn.{lam}", (HEAD_DIM,)
        yield f"{p}.post_attention_layernorm.weight", (HIDDEN,)
        yield f"{p}.mlp.gate_proj.weight", (FFN, HIDDEN)
        yield f"{p}.mlp.up_proj.weight", (FFN, HIDDEN)
        yield f"{p}.mlp.down_proj.weight", (HIDDEN, FFN)
    yield "model.norm.weight", (HIDDEN,)
    yield "lm_head.weight", (VOCAB, HIDDEN)


def to_bf16(x):
    """float32 → bfloat16 bits, rounding to nearest even (as torch does)."""
    u = x.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def write_shard(path, items, dtype, rng, reuse=False):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in items:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": dtype.upper(), "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        drawn = {}  # with `reuse`: the bytes of each (shape, norm) drawn so far
        for name, shape in items:
            norm = name.endswith("norm.weight")
            b = drawn.get((shape, norm))
            if b is None:
                x = rng.standard_normal(shape, dtype=np.float32)
                if norm:
                    x = 1 + 0.1 * x
                else:
                    x *= 0.02
                b = to_bf16(x).tobytes() if dtype == "bf16" else x.astype("<f2").tobytes()
                if reuse:
                    drawn[(shape, norm)] = b
            f.write(b)
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--diff", action="store_true", help="a DiffLlama of the same shape")
    kind.add_argument("--v2", action="store_true", help="a DIFF V2 with the same query and KV heads")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--layers", type=int, help="only the first N layers")
    args = ap.parse_args()
    set_shape(args.shape, args.layers)
    reuse = args.shape != "1b"
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    items = list(tensor_shapes(args.diff, args.v2))
    n_params = sum(int(np.prod(s)) for _, s in items)
    if args.shards == 1:
        write_shard(os.path.join(args.out, "model.safetensors"), items, args.dtype, rng, reuse)
    else:
        per = -(-len(items) // args.shards)
        weight_map, total = {}, 0
        for i in range(args.shards):
            chunk = items[i * per:(i + 1) * per]
            name = f"model-{i + 1:05}-of-{args.shards:05}.safetensors"
            total += write_shard(os.path.join(args.out, name), chunk, args.dtype, rng, reuse)
            weight_map.update({t: name for t, _ in chunk})
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
        "max_position_embeddings": CTX, "rms_norm_eps": 1e-5, "rope_theta": ROPE_THETA,
        "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "bfloat16" if args.dtype == "bf16" else "float16",
    }
    if args.diff:
        config.update({"architectures": ["DiffLlamaForCausalLM"], "model_type": "diffllama", "lambda_std_dev": 0.1})
    if args.v2:
        config.update({"architectures": ["DiffLlamaV2ForCausalLM"], "model_type": "diffllama_v2",
                       "num_attention_heads": HEADS // 2, "head_dim": HEAD_DIM})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIXTURE, name), os.path.join(args.out, name))
    print(f"{args.out}: {n_params / 1e9:.3f} B parameters, {args.dtype}, {args.shards} file(s)")


if __name__ == "__main__":
    main()
