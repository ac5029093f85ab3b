//! Tokenizer files of an HF checkpoint → GGUF tokenizer metadata.
//!
//! Written twice, as llama.cpp expects and as duet prefers: `tokenizer.ggml.*` (tokens,
//! types, merges, special ids, the pre-tokenizer name) so llama.cpp can use the file, and
//! the whole `tokenizer.json` as `tokenizer.huggingface.json`, which duet's runtime loads
//! when present. The chat template comes from chat_template.jinja or tokenizer_config.json.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use duet_quant::gguf::{Array, StringArray, Value};
use serde_json::Value as Json;

use crate::error::ConvertError;

/// llama.cpp token types.
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

/// The GPT-2 / Llama 3 pre-tokenizer regexes as they appear in tokenizer.json files.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

pub struct TokenizerMeta {
    pub kvs: Vec<(String, Value)>,
    /// Every end-of-generation id found (generation_config, config, tokenizer_config).
    pub eog_ids: Vec<u32>,
}

fn read_json(path: &Path) -> Result<Option<Json>, ConvertError> {
    match duet_quant::input::read_text(path, duet_quant::input::MAX_JSON_BYTES) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| ConvertError::corrupt(path, format!("not valid JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ConvertError::io(path, e)),
    }
}

/// A special token in tokenizer_config.json is either a string or `{"content": …}`.
fn special_token_text(v: Option<&Json>) -> Option<&str> {
    match v? {
        Json::String(s) => Some(s),
        Json::Object(o) => o.get("content").and_then(Json::as_str),
        _ => None,
    }
}

fn ids_of(v: Option<&Json>) -> Vec<u32> {
    match v {
        Some(Json::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|x| x as u32)).collect(),
        Some(x) => x.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        None => vec![],
    }
}

/// The files a checkpoint's tokenizer comes from, as read from its directory.
pub struct TokenizerFiles {
    /// `tokenizer.json` (its path names it in errors).
    pub tokenizer_json: (PathBuf, String),
    pub tokenizer_config: Option<Json>,
    pub generation_config: Option<Json>,
    /// `chat_template.jinja`, which wins over tokenizer_config.json's template.
    pub chat_template_jinja: Option<String>,
}

impl TokenizerFiles {
    pub fn read(dir: &Path) -> Result<TokenizerFiles, ConvertError> {
        let tok_path = dir.join("tokenizer.json");
        let tok_text =
            duet_quant::input::read_text(&tok_path, duet_quant::input::MAX_JSON_BYTES).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ConvertError::missing(
                    &tok_path,
                    "not found: duet needs the Hugging Face fast-tokenizer file to write the GGUF's tokenizer",
                ),
                _ => ConvertError::io(&tok_path, e),
            })?;
        let jinja = dir.join("chat_template.jinja");
        let chat_template_jinja = match duet_quant::input::read_text(&jinja, duet_quant::input::MAX_JSON_BYTES) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(ConvertError::io(&jinja, e)),
        };
        Ok(TokenizerFiles {
            tokenizer_json: (tok_path, tok_text),
            tokenizer_config: read_json(&dir.join("tokenizer_config.json"))?,
            generation_config: read_json(&dir.join("generation_config.json"))?,
            chat_template_jinja,
        })
    }
}

/// Reads the tokenizer of `dir` ([`TokenizerFiles::read`], then [`from_files`]).
pub fn load(
    dir: &Path,
    vocab_size: usize,
    config_bos: Option<u32>,
    config_eos: &[u32],
) -> Result<TokenizerMeta, ConvertError> {
    from_files(TokenizerFiles::read(dir)?, vocab_size, config_bos, config_eos)
}

/// The largest vocabulary accepted (the largest real ones are a few hundred thousand).
pub const MAX_VOCAB: usize = 1 << 24;

/// The GGUF tokenizer keys of a checkpoint's tokenizer files. `vocab_size` is the model's
/// (the embedding rows, checked against the tensors first), which may exceed the
/// tokenizer's; the gap is filled with unused `[PAD{i}]` tokens as llama.cpp does.
pub fn from_files(
    files: TokenizerFiles,
    vocab_size: usize,
    config_bos: Option<u32>,
    config_eos: &[u32],
) -> Result<TokenizerMeta, ConvertError> {
    let (tok_path, tok_text) = files.tokenizer_json;
    if vocab_size > MAX_VOCAB {
        return Err(ConvertError::shape(format!(
            "a vocabulary of {vocab_size} tokens is more than duet accepts ({MAX_VOCAB})"
        )));
    }
    let tok: Json = serde_json::from_str(&tok_text)
        .map_err(|e| ConvertError::corrupt(&tok_path, format!("not valid JSON: {e}")))?;
    let bad = |msg: String| ConvertError::corrupt(&tok_path, msg);

    let model = tok.get("model").ok_or_else(|| bad("no \"model\" section".into()))?;
    let model_type = model.get("type").and_then(Json::as_str).unwrap_or("BPE");
    if model_type != "BPE" {
        return Err(ConvertError::unsupported(format!(
            "{}: tokenizer model \"{model_type}\" is not supported (duet converts BPE tokenizers)",
            tok_path.display()
        )));
    }
    let vocab_obj = model.get("vocab").and_then(Json::as_object).ok_or_else(|| bad("BPE model has no vocab".into()))?;
    let mut by_id: HashMap<u32, String> = HashMap::with_capacity(vocab_obj.len());
    for (text, id) in vocab_obj {
        let id = id.as_u64().ok_or_else(|| bad(format!("vocab entry '{text}' has no integer id")))? as u32;
        by_id.insert(id, text.clone());
    }
    let mut added_special: HashMap<u32, bool> = HashMap::new();
    if let Some(added) = tok.get("added_tokens").and_then(Json::as_array) {
        for t in added {
            let (Some(id), Some(content)) =
                (t.get("id").and_then(Json::as_u64), t.get("content").and_then(Json::as_str))
            else {
                return Err(bad("an added_tokens entry lacks id or content".into()));
            };
            by_id.insert(id as u32, content.to_string());
            added_special.insert(id as u32, t.get("special").and_then(Json::as_bool).unwrap_or(false));
        }
    }
    let max_id = by_id.keys().copied().max().map(|m| m as usize + 1).unwrap_or(0);
    if max_id > vocab_size {
        return Err(ConvertError::shape(format!(
            "{}: the tokenizer has ids up to {} but config.json's vocab_size is {vocab_size}",
            tok_path.display(),
            max_id - 1
        )));
    }

    let merges: Vec<String> = match model.get("merges") {
        Some(Json::Array(list)) => list
            .iter()
            .map(|m| match m {
                Json::String(s) => Ok(s.clone()),
                Json::Array(pair) => match pair.as_slice() {
                    [Json::String(a), Json::String(b)] => Ok(format!("{a} {b}")),
                    _ => Err(bad("a merge is not a pair of strings".into())),
                },
                _ => Err(bad("a merge is not a string or a pair".into())),
            })
            .collect::<Result<_, _>>()?,
        _ => vec![],
    };

    let byte_level =
        json_mentions(tok.get("pre_tokenizer"), "ByteLevel") || json_mentions(tok.get("decoder"), "ByteLevel");
    let byte_fallback = model.get("byte_fallback").and_then(Json::as_bool).unwrap_or(false);
    let ggml_model = if byte_level {
        "gpt2"
    } else if byte_fallback {
        "llama"
    } else {
        return Err(ConvertError::unsupported(format!(
            "{}: a BPE tokenizer that is neither byte-level nor byte-fallback (SentencePiece) is not supported",
            tok_path.display()
        )));
    };

    let cfg = files.tokenizer_config;
    let cfg_get = |k: &str| cfg.as_ref().and_then(|c| c.get(k));
    let text_to_id: HashMap<&str, u32> = by_id.iter().map(|(id, t)| (t.as_str(), *id)).collect();
    let lookup = |k: &str| special_token_text(cfg_get(k)).and_then(|t| text_to_id.get(t).copied());
    let unk = model
        .get("unk_token")
        .and_then(Json::as_str)
        .and_then(|t| text_to_id.get(t).copied())
        .or_else(|| lookup("unk_token"));

    // Merge ranks give SentencePiece-style scores: earlier merges win.
    let mut merge_rank: HashMap<String, usize> = HashMap::new();
    if ggml_model == "llama" {
        for (rank, m) in merges.iter().enumerate() {
            merge_rank.entry(m.replacen(' ', "", 1)).or_insert(rank);
        }
    }

    let mut tokens = StringArray::with_capacity(vocab_size, vocab_size * 8);
    let mut types = Vec::with_capacity(vocab_size);
    let mut scores = Vec::with_capacity(vocab_size);
    for id in 0..vocab_size as u32 {
        let (text, ty) = match by_id.get(&id) {
            None => (format!("[PAD{id}]"), UNUSED),
            Some(t) => {
                let ty = match added_special.get(&id) {
                    Some(true) => CONTROL,
                    Some(false) => USER_DEFINED,
                    None if Some(id) == unk => UNKNOWN,
                    None if ggml_model == "llama" && is_byte_token(t) => BYTE,
                    None => NORMAL,
                };
                (t.clone(), ty)
            }
        };
        scores.push(merge_rank.get(&text).map(|&r| -(r as f32)).unwrap_or(0.0));
        tokens.push(&text);
        types.push(ty);
    }

    let mut kvs: Vec<(String, Value)> = vec![
        ("tokenizer.ggml.model".into(), Value::String(ggml_model.into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre_tokenizer_name(&tok, ggml_model).into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(Array::String(tokens))),
    ];
    if ggml_model == "llama" {
        kvs.push(("tokenizer.ggml.scores".into(), Value::Array(Array::F32(scores))));
    }
    kvs.push(("tokenizer.ggml.token_type".into(), Value::Array(Array::I32(types))));
    if !merges.is_empty() {
        let mut m = StringArray::with_capacity(merges.len(), merges.iter().map(String::len).sum());
        for s in &merges {
            m.push(s);
        }
        kvs.push(("tokenizer.ggml.merges".into(), Value::Array(Array::String(m))));
    }

    let gen_cfg = files.generation_config;
    let bos = lookup("bos_token")
        .or(config_bos)
        .or_else(|| gen_cfg.as_ref().and_then(|g| g.get("bos_token_id")?.as_u64()).map(|v| v as u32));
    let mut eog_ids: Vec<u32> = Vec::new();
    eog_ids.extend(lookup("eos_token"));
    eog_ids.extend(ids_of(gen_cfg.as_ref().and_then(|g| g.get("eos_token_id"))));
    eog_ids.extend_from_slice(config_eos);
    eog_ids.dedup();
    let mut seen = std::collections::HashSet::new();
    eog_ids.retain(|id| seen.insert(*id) && (*id as usize) < vocab_size);

    if let Some(b) = bos {
        kvs.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(b)));
    }
    if let Some(&e) = eog_ids.first() {
        kvs.push(("tokenizer.ggml.eos_token_id".into(), Value::U32(e)));
    }
    if let Some(u) = unk {
        kvs.push(("tokenizer.ggml.unknown_token_id".into(), Value::U32(u)));
    }
    if let Some(p) = lookup("pad_token") {
        kvs.push(("tokenizer.ggml.padding_token_id".into(), Value::U32(p)));
    }
    let add_bos = match cfg_get("add_bos_token").and_then(Json::as_bool) {
        Some(b) => b,
        None => bos.is_some_and(|b| post_processor_adds(&tok, by_id.get(&b).map(String::as_str).unwrap_or(""))),
    };
    kvs.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos)));
    if let Some(add_eos) = cfg_get("add_eos_token").and_then(Json::as_bool) {
        kvs.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(add_eos)));
    }
    if let Some(t) = files.chat_template_jinja.or_else(|| chat_template(cfg.as_ref())) {
        kvs.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    kvs.push(("tokenizer.huggingface.json".into(), Value::String(tok_text)));
    // The model's recommended sampling travels with the same generation_config.json.
    kvs.extend(crate::sampling::kvs(gen_cfg.as_ref()));
    Ok(TokenizerMeta { kvs, eog_ids })
}

fn is_byte_token(t: &str) -> bool {
    t.len() == 6 && t.starts_with("<0x") && t.ends_with('>') && u8::from_str_radix(&t[3..5], 16).is_ok()
}

/// True if `v` (any JSON) contains an object with `"type": ty`.
fn json_mentions(v: Option<&Json>, ty: &str) -> bool {
    match v {
        Some(Json::Object(o)) => {
            o.get("type").and_then(Json::as_str) == Some(ty) || o.values().any(|x| json_mentions(Some(x), ty))
        }
        Some(Json::Array(a)) => a.iter().any(|x| json_mentions(Some(x), ty)),
        _ => false,
    }
}

/// Names the pre-tokenizer the way llama.cpp's `tokenizer.ggml.pre` does, for the styles
/// duet's runtime rebuilds: Llama 3's split regex, SmolLM's digit splitting, plain GPT-2.
fn pre_tokenizer_name(tok: &Json, ggml_model: &str) -> &'static str {
    if ggml_model == "llama" {
        return "default";
    }
    let pre = tok.get("pre_tokenizer");
    let mut regexes = Vec::new();
    collect_split_regexes(pre, &mut regexes);
    // Llama 3's split groups digits in threes; no other supported style does.
    if regexes.iter().any(|r| *r == LLAMA3_REGEX || r.contains(r"\p{N}{1,3}")) {
        "llama3"
    } else if json_mentions(pre, "Digits") {
        "smollm"
    } else {
        "gpt-2"
    }
}

/// Every `"pattern": {"Regex": …}` string inside a pre-tokenizer description.
fn collect_split_regexes<'a>(v: Option<&'a Json>, out: &mut Vec<&'a str>) {
    match v {
        Some(Json::Object(o)) => {
            if let Some(r) = o.get("pattern").and_then(|p| p.get("Regex")).and_then(Json::as_str) {
                out.push(r);
            }
            o.values().for_each(|x| collect_split_regexes(Some(x), out));
        }
        Some(Json::Array(a)) => a.iter().for_each(|x| collect_split_regexes(Some(x), out)),
        _ => {}
    }
}

/// Whether tokenizer.json's post-processor prepends `bos` to a single sequence.
fn post_processor_adds(tok: &Json, bos: &str) -> bool {
    let Some(single) = tok.get("post_processor").and_then(|p| p.get("single")).and_then(Json::as_array) else {
        return false;
    };
    matches!(single.first().and_then(|f| f.get("SpecialToken")).and_then(|s| s.get("id")).and_then(Json::as_str), Some(id) if id == bos)
}

/// tokenizer_config.json's chat template: a string, or the "default" of several named ones
/// (as llama.cpp picks), else the first.
fn chat_template(cfg: Option<&Json>) -> Option<String> {
    match cfg.and_then(|c| c.get("chat_template")) {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write(dir: &Path, name: &str, v: &Json) {
        std::fs::write(dir.join(name), serde_json::to_string(v).unwrap()).unwrap();
    }

    fn get<'a>(m: &'a TokenizerMeta, k: &str) -> &'a Value {
        &m.kvs.iter().find(|(key, _)| key == k).unwrap_or_else(|| panic!("no {k}")).1
    }

    #[test]
    fn byte_level_bpe_with_specials_and_padding() {
        let dir = std::env::temp_dir().join(format!("duet-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write(
            &dir,
            "tokenizer.json",
            &json!({
                "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]},
                "added_tokens": [{"id": 3, "content": "<|im_end|>", "special": true},
                                  {"id": 4, "content": "<tool>", "special": false}],
                "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": true}, {"type": "ByteLevel"}]},
                "decoder": {"type": "ByteLevel"}
            }),
        );
        write(&dir, "tokenizer_config.json", &json!({"eos_token": "<|im_end|>", "chat_template": "{{ messages }}"}));
        let m = load(&dir, 8, None, &[]).unwrap();
        assert_eq!(get(&m, "tokenizer.ggml.model"), &Value::String("gpt2".into()));
        assert_eq!(get(&m, "tokenizer.ggml.pre"), &Value::String("smollm".into()));
        assert_eq!(get(&m, "tokenizer.ggml.eos_token_id"), &Value::U32(3));
        assert_eq!(get(&m, "tokenizer.ggml.token_type"), &Value::Array(Array::I32(vec![1, 1, 1, 3, 4, 5, 5, 5])));
        let Value::Array(Array::String(toks)) = get(&m, "tokenizer.ggml.tokens") else { panic!() };
        assert_eq!(toks.get(5), Some("[PAD5]"));
        let Value::Array(Array::String(merges)) = get(&m, "tokenizer.ggml.merges") else { panic!() };
        assert_eq!(merges.get(0), Some("a b"));
        assert_eq!(get(&m, "tokenizer.chat_template"), &Value::String("{{ messages }}".into()));
        assert_eq!(m.eog_ids, vec![3]);
        // A vocab_size smaller than the tokenizer is a config/tokenizer mismatch.
        let e = load(&dir, 4, None, &[]).err().unwrap().to_string();
        assert!(e.contains("vocab_size is 4"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_tokenizer_is_named() {
        let dir = std::env::temp_dir().join(format!("duet-tok-missing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = load(&dir, 8, None, &[]).err().unwrap().to_string();
        assert!(e.contains("tokenizer.json") && e.contains("not found"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
