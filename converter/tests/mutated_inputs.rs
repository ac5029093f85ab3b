//! Seeded mutations of the converter's inputs — a safetensors header, config.json,
//! tokenizer.json (with tokenizer_config.json) — must give an answer or a clean error, never
//! a panic, an overflow or an unbounded allocation. Stable and deterministic (the seeds are
//! fixed), so CI runs them on every change; `converter/fuzz/` has the coverage-guided
//! counterparts.

mod common;

use std::path::Path;

use duet_convert::hf_config::HfConfig;
use duet_convert::safetensors::parse_header_bytes;
use duet_convert::tokenizer::{TokenizerFiles, from_files};
use duet_test_support::Rng;
use serde_json::{Value, json};

use common::{FIXTURES, fixture};

/// One byte-level mutation: flip, overwrite with an interesting byte, insert, delete, or
/// truncate; several at a time.
fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>, region: usize) {
    const INTERESTING: [u8; 12] = [0, 1, 0x7f, 0x80, 0xff, b'"', b'{', b'}', b'[', b']', b',', b'9'];
    for _ in 0..1 + rng.below(4) {
        let n = region.min(data.len()).max(1);
        match rng.below(6) {
            0 if !data.is_empty() => {
                let i = rng.below(n.min(data.len()));
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let i = rng.below(n.min(data.len()));
                data[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let i = rng.below(n.min(data.len()) + 1);
                data.insert(i, INTERESTING[rng.below(INTERESTING.len())]);
            }
            3 if !data.is_empty() => {
                let i = rng.below(n.min(data.len()));
                data.remove(i);
            }
            4 => data.truncate(rng.below(data.len() + 1)),
            _ => {}
        }
    }
}

/// Values that break assumptions: zero, negative, huge, fractional, the wrong type.
fn odd_value(rng: &mut Rng) -> Value {
    let pool = [
        json!(0),
        json!(-1),
        json!(1),
        json!(3),
        json!(4294967296u64),
        json!(u64::MAX),
        json!(1e300),
        json!(0.5),
        json!("x"),
        json!(null),
        json!(true),
        json!([]),
        json!({}),
        json!([1, 2]),
        json!({"type": "llama3", "factor": 0}),
    ];
    pool[rng.below(pool.len())].clone()
}

/// One structured mutation of a JSON document: set, remove or retype a member somewhere.
fn mutate_json(rng: &mut Rng, v: &mut Value, depth: usize) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let k = &keys[rng.below(keys.len())];
            match rng.below(4) {
                0 => {
                    map.remove(k);
                }
                1 if depth < 6 => mutate_json(rng, map.get_mut(k).expect("a key of this map"), depth + 1),
                _ => {
                    map.insert(k.clone(), odd_value(rng));
                }
            }
        }
        Value::Array(a) if !a.is_empty() => {
            let i = rng.below(a.len());
            match rng.below(3) {
                0 => {
                    a.remove(i);
                }
                1 if depth < 6 => mutate_json(rng, &mut a[i], depth + 1),
                _ => a[i] = odd_value(rng),
            }
        }
        _ => *v = odd_value(rng),
    }
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn mutated_safetensors_headers_never_panic() {
    let mut rng = Rng::new(101);
    let path = Path::new("mutated.safetensors");
    let (mut accepted, mut refused) = (0, 0);
    for f in FIXTURES {
        let original = read(&fixture(f).join("model.safetensors"));
        let header_len = u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;
        assert!(!parse_header_bytes(path, &original).unwrap().is_empty(), "{f} parses as committed");
        for _ in 0..400 {
            let mut data = original.clone();
            // Mostly the header (its 8-byte length included), sometimes the length itself.
            mutate_bytes(&mut rng, &mut data, 8 + header_len);
            match parse_header_bytes(path, &data) {
                Ok(tensors) => {
                    accepted += 1;
                    for (name, meta) in tensors {
                        assert!(meta.start <= meta.end && meta.end <= data.len(), "{f}: '{name}' outside the data");
                        assert_eq!(meta.end - meta.start, meta.numel() * meta.dtype.size(), "{f}: '{name}' size");
                    }
                }
                Err(e) => {
                    refused += 1;
                    assert!(e.to_string().contains("mutated.safetensors"), "errors name the file: {e}");
                }
            }
        }
    }
    eprintln!("safetensors headers: {accepted} accepted, {refused} refused");
    assert!(refused > 0 && accepted > 0, "the mutations reach both outcomes");
}

#[test]
fn mutated_config_json_never_panics() {
    let mut rng = Rng::new(202);
    let (mut accepted, mut refused) = (0, 0);
    for f in FIXTURES {
        let text = read(&fixture(f).join("config.json"));
        let original: Value = serde_json::from_slice(&text).unwrap();
        HfConfig::from_json(&original, f).unwrap_or_else(|e| panic!("{f} as committed: {e}"));
        for i in 0..600 {
            let v = if i % 3 == 0 {
                // Byte-level: most results are not JSON at all, which is the JSON parser's
                // business; those that are go through.
                let mut b = text.clone();
                mutate_bytes(&mut rng, &mut b, usize::MAX);
                match serde_json::from_slice::<Value>(&b) {
                    Ok(v) => v,
                    Err(_) => continue,
                }
            } else {
                let mut v = original.clone();
                for _ in 0..1 + rng.below(3) {
                    mutate_json(&mut rng, &mut v, 0);
                }
                v
            };
            match HfConfig::from_json(&v, f) {
                Ok(c) => {
                    accepted += 1;
                    assert!(c.vocab_size > 0 && c.hidden_size > 0 && c.n_layers > 0, "{f}: accepted {c:?}");
                    assert!(c.n_heads > 0 && c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0, "{f}: heads {c:?}");
                }
                Err(e) => {
                    refused += 1;
                    assert!(!e.is_empty());
                }
            }
        }
    }
    eprintln!("config.json: {accepted} accepted, {refused} refused");
    assert!(refused > 0 && accepted > 0, "the mutations reach both outcomes");
}

#[test]
fn mutated_tokenizer_json_never_panics() {
    let mut rng = Rng::new(303);
    let (mut accepted, mut refused) = (0, 0);
    for f in FIXTURES {
        let dir = fixture(f);
        let files = TokenizerFiles::read(&dir).unwrap();
        let tok: Value = serde_json::from_str(&files.tokenizer_json.1).unwrap();
        let cfg = HfConfig::from_json(&serde_json::from_slice(&read(&dir.join("config.json"))).unwrap(), f).unwrap();
        let vocab = cfg.vocab_size;
        let load = |tok_text: String, tok_cfg: Option<Value>, vocab: usize| {
            let files = TokenizerFiles {
                tokenizer_json: (dir.join("tokenizer.json"), tok_text),
                tokenizer_config: tok_cfg,
                generation_config: None,
                chat_template_jinja: None,
            };
            from_files(files, vocab, cfg.bos_token_id, &cfg.eos_token_ids)
        };
        load(files.tokenizer_json.1.clone(), files.tokenizer_config.clone(), vocab)
            .unwrap_or_else(|e| panic!("{f} as committed: {e}"));
        for i in 0..150 {
            let (text, tok_cfg) = if i % 4 == 0 {
                let mut b = files.tokenizer_json.1.clone().into_bytes();
                mutate_bytes(&mut rng, &mut b, usize::MAX);
                (String::from_utf8_lossy(&b).into_owned(), files.tokenizer_config.clone())
            } else {
                let mut v = tok.clone();
                let mut c = files.tokenizer_config.clone().unwrap_or(json!({}));
                for _ in 0..1 + rng.below(3) {
                    if rng.below(4) == 0 { mutate_json(&mut rng, &mut c, 0) } else { mutate_json(&mut rng, &mut v, 0) }
                }
                (v.to_string(), Some(c))
            };
            // The model's vocabulary, or one that disagrees with the tokenizer's.
            let v = [vocab, vocab / 2, vocab + 7, 0, duet_convert::tokenizer::MAX_VOCAB + 1][rng.below(5)];
            match load(text, tok_cfg, v) {
                Ok(meta) => {
                    accepted += 1;
                    assert!(meta.eog_ids.iter().all(|&id| (id as usize) < v), "{f}: end ids past the vocabulary");
                }
                Err(e) => {
                    refused += 1;
                    assert!(!e.to_string().is_empty());
                }
            }
        }
    }
    eprintln!("tokenizer.json: {accepted} accepted, {refused} refused");
    assert!(refused > 0 && accepted > 0, "the mutations reach both outcomes");
}
