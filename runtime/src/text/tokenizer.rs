//! Tokenizers from GGUF metadata.
//!
//! `tokenizer.huggingface.json`, when present, is loaded as is (it is the model's own
//! tokenizer). Otherwise the tokenizer is rebuilt from llama.cpp's `tokenizer.ggml.*` keys:
//! * `gpt2` (byte-level BPE): vocabulary and merges, with the pre-tokenizer that
//!   `tokenizer.ggml.pre` names — GPT-2's regex, Llama 3's split regex, or SmolLM's
//!   digit-splitting variant;
//! * `llama` (SentencePiece BPE with byte fallback): merges derived from the piece scores,
//!   as Hugging Face's SentencePiece converter does.
//!
//! Control and user-defined tokens become added tokens, matched whole in any text (so a
//! rendered chat template's markers encode to their ids).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use duet_quant::gguf::GgufFile;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::RuntimeError;

const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// Llama 3's pre-tokenizer split, as in its tokenizer.json.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Texts that end a turn or a document when they are control tokens (llama.cpp marks the
/// same ones as end-of-generation).
const EOG_TEXTS: &[&str] =
    &["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"];

#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    /// Ids that end generation.
    pub eog: Vec<u32>,
    /// Where it came from ("tokenizer.huggingface.json" or "tokenizer.ggml (gpt2, smollm)").
    pub source: String,
    /// [`Tokenizer::id_bytes`]'s table, made once (shared by clones): the vocabulary size it
    /// was made for, and the table or why it cannot be made.
    id_bytes: Arc<OnceLock<(usize, Result<IdBytes, String>)>>,
}

/// The bytes of every id ([`crate::text::token_bytes`]).
pub type IdBytes = Arc<Vec<Vec<u8>>>;

fn err(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Tokenizer(e.to_string())
}

impl Tokenizer {
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, RuntimeError> {
        let label = file.label().to_string();
        let tokens = file.get_string_array_opt("tokenizer.ggml.tokens")?;
        let (inner, source) = match file.get_str_opt("tokenizer.huggingface.json")? {
            Some(json) => (
                tokenizers::Tokenizer::from_bytes(json.as_bytes())
                    .map_err(|e| RuntimeError::Tokenizer(format!("{label}: tokenizer.huggingface.json: {e}")))?,
                "tokenizer.huggingface.json".to_string(),
            ),
            None => {
                let tokens = tokens.ok_or_else(|| {
                    RuntimeError::BadModel(format!("{label}: the file has no tokenizer (no tokenizer.ggml.tokens)"))
                })?;
                let model = file.get_str("tokenizer.ggml.model")?;
                let pre = file.get_str_opt("tokenizer.ggml.pre")?.unwrap_or("default");
                let types = file.get_i32_array_opt("tokenizer.ggml.token_type")?;
                let vocab: Vec<&str> = tokens.iter().collect();
                let mut tok = match model {
                    "gpt2" => {
                        let merges = file.get_string_array("tokenizer.ggml.merges")?;
                        build_byte_level(&vocab, merges.iter(), pre)?
                    }
                    "llama" => {
                        let scores = file.get_f32_array("tokenizer.ggml.scores")?;
                        let add_space = file.get_bool_opt("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
                        build_sentencepiece(&vocab, scores, add_space)?
                    }
                    other => {
                        return Err(RuntimeError::Unsupported(format!(
                            "{label}: tokenizer model '{other}' (duet supports 'gpt2' and 'llama')"
                        )));
                    }
                };
                if let Some(types) = types {
                    let added: Vec<AddedToken> = types
                        .iter()
                        .enumerate()
                        .filter(|(_, t)| **t == CONTROL || **t == USER_DEFINED)
                        .filter_map(|(id, t)| vocab.get(id).map(|text| AddedToken::from(*text, *t == CONTROL)))
                        .collect();
                    let (special, normal): (Vec<AddedToken>, Vec<AddedToken>) =
                        added.into_iter().partition(|a| a.special);
                    tok.add_special_tokens(special).map_err(err)?;
                    tok.add_tokens(normal).map_err(err)?;
                }
                let desc = format!("tokenizer.ggml ({model}, pre '{pre}')");
                (tok, desc)
            }
        };
        let bos = file.get_u32_opt("tokenizer.ggml.bos_token_id")?;
        let eos = file.get_u32_opt("tokenizer.ggml.eos_token_id")?;
        let add_bos = file.get_bool_opt("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
        let mut eog: Vec<u32> = Vec::new();
        eog.extend(eos);
        eog.extend(file.get_u32_opt("tokenizer.ggml.eot_token_id")?);
        eog.extend(file.get_u32_array_opt("duet.eog_token_ids")?.unwrap_or(&[]));
        // Control tokens whose text ends a turn, as llama.cpp does.
        let types = file.get_i32_array_opt("tokenizer.ggml.token_type")?;
        for text in EOG_TEXTS {
            if let Some(id) = inner.token_to_id(text) {
                let is_control = types.and_then(|t| t.get(id as usize)).is_none_or(|&t| t == CONTROL);
                if is_control {
                    eog.push(id);
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        eog.retain(|id| seen.insert(*id));
        Ok(Tokenizer { inner, bos, eos, add_bos, eog, source, id_bytes: Arc::default() })
    }

    /// Token ids of `text`; with `add_bos` and a BOS id, BOS first. Special-token texts in
    /// `text` map to their ids.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, RuntimeError> {
        let enc = self.inner.encode(text, false).map_err(err)?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_bos && let Some(b) = self.bos {
            ids.push(b);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Token ids of `text` as literal text: an added token's text in it (`<|im_start|>`, a
    /// user-defined token) stays characters, never becoming its control token. The text is
    /// cut inside each such occurrence and the pieces encoded apart, so no piece holds one
    /// whole (llama.cpp tokenizes user content without special parsing for the same reason).
    pub fn encode_literal(&self, text: &str) -> Result<Vec<u32>, RuntimeError> {
        let specials: Vec<String> =
            self.inner.get_added_tokens_decoder().into_values().map(|t| t.content).filter(|c| !c.is_empty()).collect();
        // Cut points: one byte (at a char boundary) into every occurrence.
        let mut cuts: Vec<usize> = Vec::new();
        for sp in &specials {
            for (at, _) in text.match_indices(sp.as_str()) {
                let mut c = at + 1;
                while !text.is_char_boundary(c) {
                    c += 1;
                }
                cuts.push(c);
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut ids = Vec::new();
        let mut start = 0;
        for c in cuts.into_iter().chain([text.len()]) {
            if c > start {
                ids.extend(self.encode(&text[start..c], false)?);
                start = c;
            }
        }
        Ok(ids)
    }

    /// Whether `text` holds the text of an added (control or user-defined) token.
    pub fn holds_special_text(&self, text: &str) -> bool {
        self.inner.get_added_tokens_decoder().values().any(|t| !t.content.is_empty() && text.contains(&t.content))
    }

    /// Token ids of a prompt rendered by a chat template: BOS first when the model asks for
    /// one, unless the template already wrote the BOS text itself (no second BOS).
    pub fn encode_rendered(&self, text: &str) -> Result<Vec<u32>, RuntimeError> {
        self.encode(text, self.wants_bos(text))
    }

    /// Whether a rendered prompt `text` gets a BOS id first: the model asks for one and the
    /// template did not write its text.
    pub fn wants_bos(&self, text: &str) -> bool {
        let bos_text = self.bos.and_then(|b| self.id_to_token(b));
        self.add_bos && self.bos.is_some() && !bos_text.is_some_and(|b| !b.is_empty() && text.starts_with(&b))
    }

    /// Text of `ids` (special tokens shown when `show_special`).
    pub fn decode(&self, ids: &[u32], show_special: bool) -> Result<String, RuntimeError> {
        self.inner.decode(ids, !show_special).map_err(err)
    }

    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The bytes of ids `0..n_vocab` ([`crate::text::token_bytes::token_bytes`]), made at the
    /// first call and shared by every later one for the same `n_vocab` (the grammar's token
    /// trie and the server's log probabilities read the same table).
    pub fn id_bytes(&self, n_vocab: usize) -> Result<IdBytes, RuntimeError> {
        let make = || crate::text::token_bytes::token_bytes(self, n_vocab).map(Arc::new);
        match self.id_bytes.get_or_init(|| (n_vocab, make().map_err(|e| e.to_string()))) {
            (n, Ok(table)) if *n == n_vocab => Ok(Arc::clone(table)),
            (n, Err(why)) if *n == n_vocab => Err(RuntimeError::Unsupported(why.clone())),
            _ => make(),
        }
    }

    /// The Hugging Face tokenizer underneath (for [`crate::text::token_bytes`]).
    pub(crate) fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

fn bpe(
    vocab: &[&str],
    merges: Vec<(String, String)>,
    byte_fallback: bool,
    unk: Option<&str>,
) -> Result<BPE, RuntimeError> {
    let map: tokenizers::models::bpe::Vocab =
        vocab.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect();
    let mut b = BPE::builder().vocab_and_merges(map, merges).byte_fallback(byte_fallback);
    if let Some(u) = unk {
        b = b.unk_token(u.to_string());
    }
    b.build().map_err(err)
}

fn build_byte_level<'a>(
    vocab: &[&str],
    merges: impl Iterator<Item = &'a str>,
    pre: &str,
) -> Result<tokenizers::Tokenizer, RuntimeError> {
    let merges: Vec<(String, String)> = merges
        .map(|m| match m.split_once(' ') {
            Some((a, b)) => Ok((a.to_string(), b.to_string())),
            None => Err(RuntimeError::Tokenizer(format!("merge '{m}' is not two tokens"))),
        })
        .collect::<Result<_, _>>()?;
    let mut tok = tokenizers::Tokenizer::new(bpe(vocab, merges, false, None)?);
    let byte_level = ByteLevel::default().add_prefix_space(false).trim_offsets(false);
    let pre_tok: PreTokenizerWrapper = match pre {
        "llama3" | "llama-bpe" | "llama-v3" | "dbrx" | "smaug-bpe" => PreSequence::new(vec![
            Split::new(SplitPattern::Regex(LLAMA3_SPLIT.into()), SplitDelimiterBehavior::Isolated, false)
                .map_err(err)?
                .into(),
            byte_level.use_regex(false).into(),
        ])
        .into(),
        "smollm" | "codeshell" => {
            PreSequence::new(vec![Digits::new(true).into(), byte_level.use_regex(true).into()]).into()
        }
        // GPT-2's regex (what the ByteLevel pre-tokenizer applies by itself).
        _ => byte_level.use_regex(true).into(),
    };
    tok.with_pre_tokenizer(Some(pre_tok));
    tok.with_decoder(Some(DecoderWrapper::from(ByteLevelDecoder::default())));
    Ok(tok)
}

/// SentencePiece BPE: every pair of pieces that concatenates to a piece is a merge, ranked
/// by the merged piece's score (higher first) — Hugging Face's SentencePiece extraction.
fn build_sentencepiece(vocab: &[&str], scores: &[f32], add_space: bool) -> Result<tokenizers::Tokenizer, RuntimeError> {
    let ids: HashMap<&str, usize> = vocab.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let mut ranked: Vec<(f32, usize, usize, &str, &str)> = Vec::new();
    for (id, piece) in vocab.iter().enumerate() {
        for (split, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(split);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                ranked.push((scores.get(id).copied().unwrap_or(0.0), li, ri, l, r));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges = ranked.into_iter().map(|(_, _, _, l, r)| (l.to_string(), r.to_string())).collect();
    let unk = vocab.iter().find(|t| **t == "<unk>").copied();
    let mut tok = tokenizers::Tokenizer::new(bpe(vocab, merges, true, unk)?);
    let mut norms: Vec<NormalizerWrapper> = Vec::new();
    if add_space {
        norms.push(Prepend::new("▁".into()).into());
    }
    norms.push(Replace::new(" ", "▁").map_err(err)?.into());
    tok.with_normalizer(Some(tokenizers::normalizers::Sequence::new(norms))).map_err(err)?;
    tok.with_decoder(Some(DecoderWrapper::from(DecoderSequence::new(vec![
        Replace::new("▁", " ").map_err(err)?.into(),
        ByteFallback::default().into(),
        Fuse::default().into(),
        Strip::new(' ', usize::from(add_space), 0).into(),
    ]))));
    Ok(tok)
}
