"""DIFF Transformer V2 as duet's checkpoint format defines it (docs/gguf-format.md, "DIFF V2 checkpoints"),
written from the formulas of microsoft/unilm's Diff-Transformer-V2 (no transformers class
exists for it):

* q_proj: hidden -> 2h*d (query heads 2i and 2i+1 form pair i), k_proj, v_proj: hidden ->
  h_kv*d, o_proj: h*d -> hidden, lambda_proj: hidden -> h, no biases, all on the same
  normalised input x;
* standard causal softmax attention of all 2h query heads with GQA (query head j reads KV
  head j // (2h / h_kv), so both heads of a pair share one), RoPE in HF's rotate_half layout;
* out_i = attn_2i - sigmoid(lambda_proj(x))_i * attn_2i+1 per token and pair, then o_proj.

The rest is Llama's: RMSNorm before attention and MLP, SwiGLU MLP, final norm, tied or untied
lm_head. Used by tests/fixtures/make_v2_fixtures.py (reference logits) and meant for training.
"""

import json
import os
from types import SimpleNamespace

import torch
from torch import nn


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, self.h, self.h_kv, self.hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.q_proj = nn.Linear(d, 2 * self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.h_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.h_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, d, bias=False)
        self.lambda_proj = nn.Linear(d, self.h, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, 2 * self.h, self.hd).transpose(1, 2)  # b, 2h, t, d
        k = self.k_proj(x).view(b, t, self.h_kv, self.hd).transpose(1, 2)  # b, h_kv, t, d
        v = self.v_proj(x).view(b, t, self.h_kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = 2 * self.h // self.h_kv
        k = k.repeat_interleave(group, dim=1)  # query head j reads KV head j // group
        v = v.repeat_interleave(group, dim=1)
        # Fused causal softmax(q k^T / sqrt(d)) v: the same function as writing it out, but
        # it never materialises the t x t scores (about twice as fast to train on a CPU).
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # b, 2h, t, d
        lam = torch.sigmoid(self.lambda_proj(x)).transpose(1, 2).unsqueeze(-1)  # b, h, t, 1
        out = a[:, 0::2] - lam * a[:, 1::2]  # b, h, t, d
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.h * self.hd))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, ff, eps = cfg["hidden_size"], cfg["intermediate_size"], cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(d, eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(d, ff, bias=False)
        self.mlp.up_proj = nn.Linear(d, ff, bias=False)
        self.mlp.down_proj = nn.Linear(ff, d, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(nn.functional.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class DiffLlamaV2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.model.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.model.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.tied = cfg.get("tie_word_embeddings", False)
        if not self.tied:
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def rope(self, t, device):
        hd = self.cfg["head_dim"]
        theta = self.cfg.get("rope_parameters", {}).get("rope_theta", self.cfg.get("rope_theta", 10000.0))
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=device) / hd))
        ang = torch.arange(t, dtype=torch.float32, device=device)[:, None] * inv[None]
        emb = torch.cat((ang, ang), dim=-1)
        return emb.cos(), emb.sin()

    def init_weights(self, std=0.02):
        """transformers' Llama initialisation: N(0, std²) matrices and embeddings, unit norms."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, std)

    def forward(self, input_ids):
        """Logits for `input_ids` [batch, T] as `.logits` [batch, T, vocab] (transformers' shape)."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rope(input_ids.shape[1], input_ids.device)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return SimpleNamespace(logits=x @ w.t())


def config(vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
           num_key_value_heads, head_dim, tie_word_embeddings, rms_norm_eps=1e-5, rope_theta=10000.0,
           max_position_embeddings=512, new_rope_layout=True, bos_token_id=None, eos_token_id=None):
    """A config.json dict of the format (num_attention_heads = h, the number of pairs)."""
    cfg = {
        "model_type": "diffllama_v2",
        "architectures": ["DiffLlamaV2ForCausalLM"],
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": rms_norm_eps,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
    }
    if new_rope_layout:
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": rope_theta}
    else:
        cfg["rope_theta"] = rope_theta
        cfg["rope_scaling"] = None
    return cfg


def save(model, directory, dtype=torch.bfloat16):
    """config.json and model.safetensors (HF tensor names) in `directory`."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(model.cfg, f, indent=2)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


def load(directory):
    from safetensors.torch import load_file

    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    model = DiffLlamaV2(cfg)
    state = {k: v.to(torch.float32) for k, v in load_file(os.path.join(directory, "model.safetensors")).items()}
    model.load_state_dict(state)
    return model.eval()
