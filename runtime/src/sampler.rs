//! Token sampling: a grammar's mask (structured output, [`crate::grammar`]), the penalties
//! (repetition, frequency, presence), then greedy, or top-k → top-p → min-p → temperature →
//! a draw, in llama.cpp's order. The random stream is seeded, so the same seed gives the
//! same output.

use crate::grammar::Constraint;

#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep the k most likely tokens (0: off).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1: off).
    pub top_p: f32,
    /// Drop tokens below min_p × the top probability (0: off).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by this (1: off).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtract this × a token's count among the recent tokens from its logit (0: off).
    pub frequency_penalty: f32,
    /// Subtract this from the logit of every token among the recent ones (0: off).
    pub presence_penalty: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0x5eed,
        }
    }
}

impl SamplerConfig {
    pub fn greedy() -> SamplerConfig {
        SamplerConfig { temperature: 0.0, ..SamplerConfig::default() }
    }
}

/// A model file's recommended sampling (`general.sampling.*`,
/// [`crate::gguf_names::sampling`]): the defaults that flags and request fields override.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplingHints {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
}

impl SamplingHints {
    /// The hints of `file`; a value of the wrong type or out of range is an error naming
    /// the key.
    pub fn from_gguf(file: &duet_quant::gguf::GgufFile) -> Result<SamplingHints, crate::RuntimeError> {
        use crate::gguf_names::sampling as k;
        let bad = |key: &str, v: String| {
            crate::RuntimeError::BadModel(format!("{}: {key} is {v}, out of its range", file.label()))
        };
        let ranged = |key: &str, ok: fn(f32) -> bool| -> Result<Option<f32>, crate::RuntimeError> {
            match file.get_f32_opt(key)? {
                Some(v) if !ok(v) => Err(bad(key, v.to_string())),
                v => Ok(v),
            }
        };
        let top_k = match file.get_i32_opt(k::TOP_K)? {
            Some(v) if v < 0 => return Err(bad(k::TOP_K, v.to_string())),
            v => v.map(|v| v as usize),
        };
        Ok(SamplingHints {
            temperature: ranged(k::TEMP, |t| t >= 0.0 && t.is_finite())?,
            top_k,
            top_p: ranged(k::TOP_P, |p| p > 0.0 && p <= 1.0)?,
            min_p: ranged(k::MIN_P, |p| (0.0..=1.0).contains(&p))?,
            repeat_penalty: ranged(k::PENALTY_REPEAT, |r| r > 0.0 && r.is_finite())?,
        })
    }

    /// `base` with the hints the model gives.
    pub fn apply(&self, base: SamplerConfig) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_k: self.top_k.unwrap_or(base.top_k),
            top_p: self.top_p.unwrap_or(base.top_p),
            min_p: self.min_p.unwrap_or(base.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(base.repeat_penalty),
            ..base
        }
    }
}

/// PCG-XSH-RR 64/32: small, fast and reproducible across platforms.
#[derive(Clone, Debug)]
struct Pcg32 {
    state: u64,
}

impl Pcg32 {
    fn new(seed: u64) -> Pcg32 {
        let mut r = Pcg32 { state: 0 };
        r.next_u32();
        r.state = r.state.wrapping_add(seed);
        r.next_u32();
        r
    }
    fn next_u32(&mut self) -> u32 {
        let old = self.state;
        self.state = old.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let xorshifted = (((old >> 18) ^ old) >> 27) as u32;
        xorshifted.rotate_right((old >> 59) as u32)
    }
    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        let hi = (self.next_u32() as u64) << 21;
        let lo = (self.next_u32() >> 11) as u64;
        (hi | lo) as f64 / (1u64 << 53) as f64
    }
}

pub struct Sampler {
    pub cfg: SamplerConfig,
    rng: Pcg32,
    /// The grammar the output follows, if any.
    constraint: Option<Constraint>,
    /// What went wrong in the grammar (the draw after it is an end of generation).
    constraint_error: Option<String>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = Pcg32::new(cfg.seed);
        Sampler { cfg, rng, constraint: None, constraint_error: None }
    }

    /// Holds the output to `c`'s grammar.
    pub fn with_constraint(mut self, c: Option<Constraint>) -> Sampler {
        self.constraint = c;
        self
    }

    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Computes the grammar's mask for the next draw, if there is a grammar and the mask is
    /// not known yet: run it beside the forward pass that makes the next logits.
    pub fn prepare(&mut self) {
        if let Some(c) = &mut self.constraint
            && let Err(e) = c.prepare()
        {
            self.constraint_error.get_or_insert(e);
        }
    }

    /// The grammar admits nothing more: the output is complete.
    pub fn is_complete(&self) -> bool {
        self.constraint.as_ref().is_some_and(Constraint::is_complete)
    }

    /// Why the grammar failed, if it did (the output then ends where it failed).
    pub fn error(&self) -> Option<&str> {
        self.constraint_error.as_deref()
    }

    /// Picks the next token from `logits` (modified in place by the mask and the
    /// penalties); `recent` are the tokens seen so far (prompt and output).
    pub fn sample(&mut self, logits: &mut [f32], recent: &[u32]) -> u32 {
        if let Some(c) = &mut self.constraint
            && let Err(e) = c.apply(logits)
        {
            self.constraint_error.get_or_insert(e);
        }
        self.penalize(logits, recent);
        let tok = self.draw(logits);
        if let Some(c) = &mut self.constraint
            && let Err(e) = c.commit(tok)
        {
            self.constraint_error.get_or_insert(e);
        }
        tok
    }

    /// The repetition, frequency and presence penalties over the last `repeat_last_n`
    /// tokens of `recent`.
    fn penalize(&self, logits: &mut [f32], recent: &[u32]) {
        let c = &self.cfg;
        let any = c.repeat_penalty != 1.0 || c.frequency_penalty != 0.0 || c.presence_penalty != 0.0;
        if !any || c.repeat_last_n == 0 {
            return;
        }
        let start = recent.len().saturating_sub(c.repeat_last_n);
        let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
        for &t in &recent[start..] {
            *counts.entry(t).or_insert(0) += 1;
        }
        for (t, n) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                if c.repeat_penalty != 1.0 {
                    *l = if *l > 0.0 { *l / c.repeat_penalty } else { *l * c.repeat_penalty };
                }
                *l -= n as f32 * c.frequency_penalty + c.presence_penalty;
            }
        }
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        let c = &self.cfg;
        if c.temperature <= 0.0 {
            return crate::logits_file::argmax(logits) as u32;
        }
        // Candidates sorted by logit, best first (ties by id for determinism).
        let mut cand: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        let k = if c.top_k > 0 { c.top_k.min(cand.len()) } else { cand.len() };
        let cmp = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if k < cand.len() {
            cand.select_nth_unstable_by(k - 1, cmp);
            cand.truncate(k);
        }
        cand.sort_unstable_by(cmp);
        let probs = softmax(cand.iter().map(|c| c.1), 1.0);
        if c.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = cand.len();
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= c.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if c.min_p > 0.0 {
            let threshold = probs[0] * c.min_p as f64;
            let keep = probs.iter().take(cand.len()).take_while(|&&p| p >= threshold).count();
            cand.truncate(keep.max(1));
        }
        let probs = softmax(cand.iter().map(|c| c.1), c.temperature);
        let r = self.rng.next_f64();
        let mut acc = 0.0;
        for (cand, p) in cand.iter().zip(&probs) {
            acc += p;
            if r < acc {
                return cand.0;
            }
        }
        cand.last().map_or(0, |c| c.0)
    }
}

fn softmax(logits: impl Iterator<Item = f32> + Clone, temperature: f32) -> Vec<f64> {
    let t = temperature as f64;
    let max = logits.clone().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits.map(|l| ((l as f64 - max) / t).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        (0..100).map(|i| ((i * 37 % 101) as f32) * 0.05).collect()
    }

    #[test]
    fn greedy_is_argmax() {
        let mut l = logits();
        let want = crate::logits_file::argmax(&l) as u32;
        assert_eq!(Sampler::new(SamplerConfig::greedy()).sample(&mut l, &[]), want);
    }

    #[test]
    fn same_seed_same_tokens_and_different_seeds_differ() {
        let draw = |seed| {
            let mut s = Sampler::new(SamplerConfig {
                seed,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                temperature: 1.5,
                ..Default::default()
            });
            (0..50).map(|_| s.sample(&mut logits(), &[])).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn top_k_one_is_greedy_and_min_p_prunes() {
        let want = crate::logits_file::argmax(&logits()) as u32;
        let mut s = Sampler::new(SamplerConfig { top_k: 1, ..Default::default() });
        for _ in 0..20 {
            assert_eq!(s.sample(&mut logits(), &[]), want);
        }
        // A huge gap: min-p keeps only the top token.
        let mut l = vec![0.0f32; 10];
        l[3] = 20.0;
        let mut s =
            Sampler::new(SamplerConfig { top_k: 0, top_p: 1.0, min_p: 0.1, temperature: 1.0, ..Default::default() });
        for _ in 0..20 {
            assert_eq!(s.sample(&mut l.clone(), &[]), 3);
        }
    }

    #[test]
    fn repetition_penalty_lowers_recent_tokens() {
        let mut l = vec![1.0f32, 2.0, -1.0];
        let mut s = Sampler::new(SamplerConfig { repeat_penalty: 2.0, temperature: 0.0, ..Default::default() });
        assert_eq!(s.sample(&mut l, &[1, 2]), 0);
        assert_eq!(l, vec![1.0, 1.0, -2.0]);
    }

    #[test]
    fn frequency_and_presence_penalties_subtract_per_count_and_once() {
        let mut l = vec![1.0f32, 2.0, 3.0];
        let cfg = SamplerConfig {
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            repeat_last_n: 3,
            temperature: 0.0,
            ..Default::default()
        };
        // Token 0 is outside the window of the last 3.
        Sampler::new(cfg).sample(&mut l, &[0, 2, 2, 1]);
        assert_eq!(l, vec![1.0, 2.0 - 0.5 - 0.25, 3.0 - 1.0 - 0.25]);
    }
}
