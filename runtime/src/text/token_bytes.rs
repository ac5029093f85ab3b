//! The bytes each token id stands for: what constrained decoding matches a grammar against
//! (a token is allowed when its bytes continue a string the grammar admits).
//!
//! Decoding one id alone does not give them: a byte-fallback piece `<0xE2>` decodes to U+FFFD,
//! and byte-level BPE's pieces are characters standing for bytes. So the vocabulary is read
//! the way its decoder reads it:
//! * byte-level BPE (GPT-2, Llama 3, SmolLM): each character of a piece maps back to the byte
//!   GPT-2's table gave it;
//! * SentencePiece with byte fallback (Llama 2, Mistral): `<0xHH>` is byte HH, other pieces
//!   are their UTF-8 with `▁` (or the decoder's replaced character) as a space.
//!
//! Added tokens are their text; control (special) ones start with [`SPECIAL_MARKER`], so that
//! no grammar over text can produce them (llguidance's convention). Ids past the tokenizer's
//! vocabulary (an embedding padded to a round size) stand for nothing: empty, never allowed.

use std::collections::HashMap;

use serde_json::Value;

use crate::error::RuntimeError;
use crate::text::Tokenizer;

/// Marks a control token's bytes (0xFF never appears in UTF-8 text).
pub const SPECIAL_MARKER: u8 = 0xFF;

/// How a tokenizer's pieces become bytes.
enum PieceBytes {
    ByteLevel(HashMap<char, u8>),
    ByteFallback { space: char },
}

/// GPT-2's byte-to-character table, inverted: printable Latin-1 bytes stand for themselves,
/// the other 68 bytes for U+0100 onwards in byte order.
fn byte_level_chars() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    let mut map = HashMap::with_capacity(256);
    for b in 0..=255u8 {
        let c = if printable(b) {
            b as char
        } else {
            next += 1;
            char::from_u32(next - 1).expect("U+0100..U+0143 are characters")
        };
        map.insert(c, b);
    }
    map
}

fn piece_bytes_of(decoder: &Value) -> Option<PieceBytes> {
    match decoder["type"].as_str() {
        Some("ByteLevel") => Some(PieceBytes::ByteLevel(byte_level_chars())),
        Some("Sequence") => {
            let parts = decoder["decoders"].as_array()?;
            if parts.iter().any(|d| d["type"] == "ByteLevel") {
                return Some(PieceBytes::ByteLevel(byte_level_chars()));
            }
            if !parts.iter().any(|d| d["type"] == "ByteFallback") {
                return None;
            }
            // The piece character the decoder turns into a space (SentencePiece's ▁).
            let space = parts
                .iter()
                .filter(|d| d["type"] == "Replace" && d["content"] == " ")
                .filter_map(|d| d["pattern"]["String"].as_str())
                .filter_map(|p| {
                    let mut cs = p.chars();
                    cs.next().filter(|_| cs.next().is_none())
                })
                .next()
                .unwrap_or('▁');
            Some(PieceBytes::ByteFallback { space })
        }
        _ => None,
    }
}

/// `<0xHH>` → HH.
fn fallback_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() == 2 { u8::from_str_radix(hex, 16).ok() } else { None }
}

/// The bytes of ids `0..n_vocab` of `tok` (see the module docs); an error names what the
/// tokenizer's decoder is when it is neither byte-level nor byte-fallback.
pub fn token_bytes(tok: &Tokenizer, n_vocab: usize) -> Result<Vec<Vec<u8>>, RuntimeError> {
    let hf = tok.hf();
    let decoder = hf
        .get_decoder()
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| RuntimeError::Unsupported(format!("the tokenizer's decoder cannot be read: {e}")))?;
    let kind = decoder.as_ref().and_then(piece_bytes_of).ok_or_else(|| {
        let name = decoder.as_ref().and_then(|d| d["type"].as_str().map(str::to_string)).unwrap_or("none".into());
        RuntimeError::Unsupported(format!(
            "structured output needs a byte-level or byte-fallback tokenizer; this model's decoder is '{name}'"
        ))
    })?;
    let mut out = vec![Vec::new(); n_vocab];
    for (piece, id) in hf.get_vocab(false) {
        let Some(slot) = out.get_mut(id as usize) else { continue };
        *slot = match &kind {
            PieceBytes::ByteLevel(map) => {
                // A piece with a character outside the table stands for its UTF-8 (added
                // pieces in some vocabularies).
                match piece.chars().map(|c| map.get(&c).copied()).collect::<Option<Vec<u8>>>() {
                    Some(b) => b,
                    None => piece.into_bytes(),
                }
            }
            PieceBytes::ByteFallback { space } => match fallback_byte(&piece) {
                Some(b) => vec![b],
                None => piece.replace(*space, " ").into_bytes(),
            },
        };
    }
    for (id, added) in hf.get_added_tokens_decoder() {
        let Some(slot) = out.get_mut(id as usize) else { continue };
        let mut bytes = Vec::with_capacity(added.content.len() + 1);
        if added.special {
            bytes.push(SPECIAL_MARKER);
        }
        bytes.extend_from_slice(added.content.as_bytes());
        *slot = bytes;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_is_gpt2s() {
        let m = byte_level_chars();
        assert_eq!(m.len(), 256);
        assert_eq!(m[&'Ġ'], b' ');
        assert_eq!(m[&'Ċ'], b'\n');
        assert_eq!(m[&'A'], b'A');
        assert_eq!(m[&'\u{100}'], 0);
        assert_eq!(fallback_byte("<0xE2>"), Some(0xE2));
        assert_eq!(fallback_byte("<0xE2"), None);
        assert_eq!(fallback_byte("<0x1>"), None);
    }
}
