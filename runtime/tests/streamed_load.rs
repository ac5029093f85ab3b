//! A model loaded from a stream ([`Streamed`], the browser's way: a fetch's body read once, in
//! order) computes the same logits as the same file memory-mapped, holds about one layer's
//! bytes at a time whatever order the file stores its layers in, and refuses a stream that
//! is not GGUF or ends early with a message naming the file and the tensor.

use std::path::PathBuf;
use std::sync::Arc;

use duet_quant::gguf::{GgufFile, GgufWriter};
use duet_runtime::RuntimeError;
use duet_runtime::cpu::CpuBackend;
use duet_runtime::gguf_names::layer_of;
use duet_runtime::kv_cache::CacheFormat;
use duet_runtime::model::source::{ChunkReader, Streamed, TensorSource};
use duet_runtime::model::{Logits, Model};
use duet_runtime::ready::finish;
use duet_test_support::{Rng, repo_root};

/// The bundled DIFF model (10 layers, q8_0).
fn bundled() -> PathBuf {
    repo_root().join("models/duet-diff-ref.q8_0.gguf")
}

/// `bytes` in chunks of 1 byte to 96 KiB (as a network delivers them; or all of `fixed`
/// bytes), ending after `limit` bytes; counts the chunks read.
struct Chunks {
    bytes: Vec<u8>,
    pos: usize,
    limit: usize,
    rng: Rng,
    fixed: Option<usize>,
    reads: usize,
}

impl Chunks {
    fn new(bytes: Vec<u8>, seed: u64) -> Chunks {
        let limit = bytes.len();
        Chunks { bytes, pos: 0, limit, rng: Rng::new(seed), fixed: None, reads: 0 }
    }
}

impl ChunkReader for Chunks {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, RuntimeError> {
        self.reads += 1;
        if self.pos >= self.limit {
            return Ok(None);
        }
        let n = match self.fixed {
            Some(n) => n,
            None if self.rng.below(8) == 0 => 1 + self.rng.below(16),
            None => 1 + self.rng.below(96 << 10),
        };
        let end = (self.pos + n).min(self.limit);
        let chunk = self.bytes[self.pos..end].to_vec();
        self.pos = end;
        Ok(Some(chunk))
    }
}

/// Logits of every position of `tokens`, with the model loaded from `src`.
fn logits<S: TensorSource>(src: &mut S, tokens: &[u32]) -> Vec<f32> {
    let mut b = CpuBackend::new(2);
    let model = finish(Model::load_from(&mut b, src)).unwrap();
    let mut s = model.new_session(&mut b, tokens.len(), CacheFormat::F32, CacheFormat::F32).unwrap();
    let mut ctx = model.new_context(&mut b, tokens.len()).unwrap();
    model.decode_one(&mut b, &mut ctx, &mut s, tokens, Logits::All).unwrap()
}

/// The most bytes a load may hold: the largest layer's tensors, or the largest tensor
/// outside the layers (the token table), whichever is more; and the largest layer's alone.
fn one_part_bounds(file: &GgufFile) -> (u64, u64) {
    let mut per_layer = std::collections::HashMap::<usize, u64>::new();
    let mut outside = 0u64;
    for t in file.tensors() {
        match layer_of(t.name()) {
            Some(il) => *per_layer.entry(il).or_default() += t.n_bytes(),
            None => outside = outside.max(t.n_bytes()),
        }
    }
    let layer = per_layer.values().copied().max().unwrap_or(0);
    (layer.max(outside), layer)
}

/// `src` rewritten with the final norm first, then its layers last to first (each layer's
/// tensors reversed too), the token table last.
fn reversed_layers(src: &GgufFile, dst: &std::path::Path) {
    let mut w = GgufWriter::new(dst);
    for (k, v) in src.metadata() {
        if k != "general.alignment" {
            w.add(k, v.clone()).unwrap();
        }
    }
    let mut order: Vec<_> = src.tensors().iter().collect();
    order.sort_by_key(|t| match (t.name(), layer_of(t.name())) {
        ("token_embd.weight", _) => (3, 0, 0),
        (_, Some(il)) => (1, usize::MAX - il, usize::MAX - t.file_offset() as usize),
        (_, None) => (0, 0, t.file_offset() as usize),
    });
    for t in &order {
        w.add_tensor(t.name(), t.dims(), t.ggml_type()).unwrap();
    }
    let mut dw = w.start().unwrap();
    for t in &order {
        dw.write_tensor(t.name(), src.tensor_data(t)).unwrap();
    }
    dw.finish().unwrap();
}

#[test]
fn a_streamed_model_equals_the_mapped_one_holding_one_layer_at_a_time() {
    let path = bundled();
    let tokens = [1u32, 17, 240, 5, 99, 3];
    let mapped = Arc::new(GgufFile::open(&path).unwrap());
    let want = logits(&mut Arc::clone(&mapped), &tokens);

    let dir = std::env::temp_dir().join(format!("duet-streamed-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let reversed = dir.join("reversed.gguf");
    reversed_layers(&mapped, &reversed);

    let orders = [
        ("file order", path.clone()),
        ("the norm first, layers last to first, the token table last", reversed.clone()),
    ];
    for (what, file) in orders {
        let bytes = std::fs::read(&file).unwrap();
        let size = bytes.len() as u64;
        for seed in [1, 2] {
            let mut s = finish(Streamed::open(Chunks::new(bytes.clone(), seed), size, "stream.gguf")).unwrap();
            let (bound, layer) = one_part_bounds(s.file());
            let got = logits(&mut s, &tokens);
            assert!(got == want, "{what}, seed {seed}: the streamed model's logits differ from the mapped one's");
            let (peak, ahead) = (s.peak_bytes(), s.peak_ahead_bytes());
            println!(
                "{what}, seed {seed}: held at most {peak} of {size} bytes (bound {bound}), {ahead} read ahead of the model (a layer: {layer})"
            );
            assert!(peak <= bound, "{what}: held {peak} bytes, more than one part's {bound}");
            assert!(ahead <= layer, "{what}: {ahead} bytes were read ahead of the model, more than a layer's {layer}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stream_that_is_not_gguf_or_ends_early_is_refused_with_its_name() {
    // Not GGUF: refused at the first chunk, not after the whole stream.
    let html = b"<!DOCTYPE html><html><body>Not Found</body></html>".repeat(4000);
    let size = html.len() as u64;
    let mut r = Chunks::new(html, 3);
    r.fixed = Some(4096);
    let e = finish(Streamed::open(&mut r, size, "page.gguf")).err().expect("not GGUF");
    assert!(e.to_string().contains("page.gguf") && e.to_string().contains("not a GGUF file"), "{e}");
    assert_eq!(r.reads, 1);

    // Ends inside a tensor: the load names the file and the tensor.
    let bytes = std::fs::read(bundled()).unwrap();
    let size = bytes.len() as u64;
    let file = GgufFile::open(bundled()).unwrap();
    let cut = file.tensor("blk.4.ffn_up.weight").unwrap();
    let mut r = Chunks::new(bytes.clone(), 4);
    r.limit = (cut.file_offset() + cut.n_bytes() / 2) as usize;
    let mut s = finish(Streamed::open(r, size, "cut.gguf")).unwrap();
    let mut b = CpuBackend::new(1);
    let e = finish(Model::load_from(&mut b, &mut s)).err().expect("a cut stream");
    let msg = e.to_string();
    assert!(msg.contains("cut.gguf") && msg.contains("blk.4.ffn_up.weight") && msg.contains("ended"), "{msg}");

    // Ends inside the header.
    let mut r = Chunks::new(bytes, 5);
    r.limit = 200;
    let e = finish(Streamed::open(r, size, "short.gguf")).err().expect("a cut header");
    assert!(
        e.to_string().contains("short.gguf: the file ended after 200 of its") && e.to_string().contains("header"),
        "{e}"
    );
}

/// A reader by reference reads the same stream (the not-GGUF case counts its reads).
impl ChunkReader for &mut Chunks {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, RuntimeError> {
        (**self).next_chunk().await
    }
}
