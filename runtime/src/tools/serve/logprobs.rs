//! Log probabilities of drawn tokens (the API's `logprobs` / `top_logprobs`): from the
//! model's own distribution, the softmax of the raw logits, before a grammar's mask, the
//! penalties and the temperature (as OpenAI and llama-server report them).

use crate::tools::serve::TokenLogprob;

/// The most a request may ask for (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// What a row of logits says before sampling changes it: log of the softmax's denominator
/// and the `k` most likely ids with their log probabilities, most likely first.
pub struct Distribution {
    log_sum: f32,
    top: Vec<(u32, f32)>,
}

impl Distribution {
    pub fn of(logits: &[f32], k: usize) -> Distribution {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let log_sum = max + sum.ln() as f32;
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
        if k > 0 {
            for (id, &l) in logits.iter().enumerate() {
                if top.len() < k || l > top[top.len() - 1].1 {
                    let at = top.partition_point(|&(_, x)| x >= l);
                    top.insert(at, (id as u32, l));
                    top.truncate(k);
                }
            }
        }
        for t in &mut top {
            t.1 -= log_sum;
        }
        Distribution { log_sum, top }
    }

    /// The entry of drawn token `tok`, whose raw logit was `logit`; `piece` names ids.
    pub fn entry(&self, tok: u32, logit: f32, piece: &dyn Fn(u32) -> Vec<u8>) -> TokenLogprob {
        TokenLogprob {
            token: piece(tok),
            logprob: logit - self.log_sum,
            top: self.top.iter().map(|&(id, lp)| (piece(id), lp)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_entries_are_sorted_log_probabilities() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let d = Distribution::of(&logits, 3);
        let ids: Vec<u32> = d.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 2], "ties keep id order");
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((d.top[0].1 - (3.0f32.exp() / z).ln()).abs() < 1e-6);
        let e = d.entry(2, 2.0, &|id| vec![b'a' + id as u8]);
        assert_eq!(e.token, b"c");
        assert!((e.logprob - (2.0f32.exp() / z).ln()).abs() < 1e-6);
        assert_eq!(e.top.len(), 3);
        assert!(Distribution::of(&logits, 0).top.is_empty());
    }
}
