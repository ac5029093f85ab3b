//! Which packed kernel set multiplies each weight type, chosen by timing on this machine.
//!
//! The kernels were tuned on one CPU (a Zen 5 EPYC); other cores order the same work
//! differently (Zen 4 runs AVX-512 as two 256-bit halves, Zen 3 has no AVX-512 at all), so
//! the set's tuning variants (token tiles, accumulation chains: [`gemm_candidates`]) are
//! timed at load on the model's own matrices, and the fastest runs that type from then on,
//! one pick for decoding (≤ [`DECODE_ROWS`] activation rows) and one for batches. Every
//! candidate gives the same bits (`duet_quant`'s `tuning_variants_give_their_sets_bits`), so
//! the choice changes speed only.
//!
//! Timing: the first matrix of a type with at least [`TIMED_MIN_WEIGHTS`] weights (smaller
//! ones would time the call, not the kernel) is multiplied by one token (the decode pick,
//! whole matrix, on the pool as in decoding) and by [`BATCH_TOKENS`] tokens (the batch pick,
//! its first [`BATCH_GROUPS`] groups of rows), the candidates taking turns within each round
//! so that they share the machine's noise; a candidate's time is its fastest round. A
//! candidate replaces the default only when [`MARGIN`] faster. At most [`ROUNDS`] rounds and
//! about [`BUDGET`] per type: a model with three weight types spends well under a second.

use std::time::{Duration, Instant};

use duet_quant::GgmlType;
use duet_quant::gemm::{ActKind, GemmKernels, PackedMatrix, QActs, gemm_candidates};

use super::matmul::{self, ActPrecision, TWO_LEVEL_FREE_ROWS, run_groups};
use super::pool::ThreadPool;

/// Products of at most this many activation rows use the decode pick.
pub const DECODE_ROWS: usize = TWO_LEVEL_FREE_ROWS;
/// Matrices below this many weights are not timed.
pub const TIMED_MIN_WEIGHTS: usize = 1 << 20;
/// Tokens of the timed batch product.
pub const BATCH_TOKENS: usize = 16;
/// Groups of 16 rows the timed batch product covers.
pub const BATCH_GROUPS: usize = 16;
/// How much faster (relative) a candidate must be to replace the default set.
pub const MARGIN: f64 = 0.03;
/// Most rounds of timing per type.
pub const ROUNDS: usize = 9;
/// Fewest rounds of timing per type, whatever the budget.
pub const MIN_ROUNDS: usize = 3;
/// Time spent timing one type, beyond which no new round starts (after [`MIN_ROUNDS`]).
pub const BUDGET: Duration = Duration::from_millis(120);

/// The packed kernel set of each weight type (see the module docs).
#[derive(Clone, Debug)]
pub struct GemmChoice {
    /// The candidates, the default set first.
    candidates: &'static [GemmKernels],
    /// Types timed so far and their picks (indices into `candidates`).
    picks: Vec<Pick>,
    /// A candidate every type uses, untimed ([`GemmChoice::pin`]).
    pinned: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Pick {
    ty: GgmlType,
    decode: usize,
    batch: usize,
}

impl GemmChoice {
    /// The process's packed kernels and their candidates; `None` without packed kernels.
    pub fn new() -> Option<GemmChoice> {
        GemmChoice::with_candidates(gemm_candidates())
    }

    fn with_candidates(candidates: &'static [GemmKernels]) -> Option<GemmChoice> {
        (!candidates.is_empty()).then_some(GemmChoice { candidates, picks: Vec::new(), pinned: None })
    }

    /// The default set (the one named in reports).
    pub fn default_set(&self) -> &'static GemmKernels {
        &self.candidates[0]
    }

    /// The names of the candidates, the default first.
    pub fn candidate_names(&self) -> Vec<&'static str> {
        self.candidates.iter().map(|k| k.name).collect()
    }

    /// Makes the candidate `name` run every type from now on, untimed (tests and
    /// benchmarks: each candidate must give the same logits).
    pub fn pin(&mut self, name: &str) -> Result<(), String> {
        let i = self.candidates.iter().position(|k| k.name == name).ok_or_else(|| {
            format!("no packed kernel candidate named {name:?} (this CPU has: {})", self.candidate_names().join(", "))
        })?;
        self.pinned = Some(i);
        Ok(())
    }

    /// The set that multiplies `rows` activation rows by a `ty` matrix.
    pub fn for_product(&self, ty: GgmlType, rows: usize) -> &'static GemmKernels {
        &self.candidates[self.index(ty, rows)]
    }

    /// [`GemmChoice::for_product`]'s index into the candidates.
    fn index(&self, ty: GgmlType, rows: usize) -> usize {
        match (self.pinned, self.picks.iter().find(|p| p.ty == ty)) {
            (Some(i), _) => i,
            (None, Some(p)) if rows <= DECODE_ROWS => p.decode,
            (None, Some(p)) => p.batch,
            (None, None) => 0,
        }
    }

    /// Whether a matrix of `weights` weights of type `ty` is timed when it loads.
    pub fn wants_timing(&self, ty: GgmlType, weights: usize) -> bool {
        self.candidates.len() > 1
            && self.pinned.is_none()
            && weights >= TIMED_MIN_WEIGHTS
            && !self.picks.iter().any(|p| p.ty == ty)
    }

    /// Times the candidates on `w` (see the module docs) and keeps the picks for its type.
    pub fn time(&mut self, pool: &ThreadPool, w: &PackedMatrix, precision: ActPrecision) {
        let ty = w.ty();
        let kind = ActKind::for_weight(ty).expect("packed types have an activation kind");
        let cols = w.cols();
        // Activations of a plausible spread (a fixed pseudo-random sequence): the time of an
        // integer kernel does not depend on the values.
        let x: Vec<f32> = (0..BATCH_TOKENS * cols).map(|i| ((i as f32) * 0.618_034).fract() * 2.0 - 1.0).collect();
        // As matmul_packed quantizes them: float weights take their activations as f32.
        let two_level = |rows| precision.two_level(rows) && kind != ActKind::F32;
        let decode = acts(pool, kind, &x[..cols], 1, two_level(1), self.default_set(), ty);
        let batch = acts(pool, kind, &x, BATCH_TOKENS, two_level(BATCH_TOKENS), self.default_set(), ty);
        let batch_groups = w.groups().min(BATCH_GROUPS);
        let mut out = vec![0f32; BATCH_TOKENS * w.rows()];
        let n = self.candidates.len();
        let (mut t_decode, mut t_batch) = (vec![f64::MAX; n], vec![f64::MAX; n]);
        let start = Instant::now();
        for round in 0..ROUNDS {
            if round >= MIN_ROUNDS && start.elapsed() > BUDGET {
                break;
            }
            for (i, k) in self.candidates.iter().enumerate() {
                let t0 = Instant::now();
                run_groups(pool, k, w, 0..w.groups(), &decode, &mut out, w.rows());
                let t1 = Instant::now();
                run_groups(pool, k, w, 0..batch_groups, &batch, &mut out, w.rows());
                let t2 = Instant::now();
                t_decode[i] = t_decode[i].min((t1 - t0).as_secs_f64());
                t_batch[i] = t_batch[i].min((t2 - t1).as_secs_f64());
            }
        }
        self.picks.push(Pick { ty, decode: fastest(&t_decode), batch: fastest(&t_batch) });
    }

    /// The sets in words: "avx2 packed", with the types whose timing picked a variant
    /// ("avx2 packed (Q6_K prompts: avx2/n4c1,1)"), or the pinned candidate.
    pub fn describe(&self) -> String {
        if let Some(i) = self.pinned {
            return format!("{} packed (pinned)", self.candidates[i].name);
        }
        let name = |i: usize| self.candidates[i].name;
        let other: Vec<String> = self
            .picks
            .iter()
            .filter_map(|p| match (p.decode, p.batch) {
                (0, 0) => None,
                (d, b) if d == b => Some(format!("{}: {}", p.ty, name(d))),
                (0, b) => Some(format!("{} prompts: {}", p.ty, name(b))),
                (d, 0) => Some(format!("{} decode: {}", p.ty, name(d))),
                (d, b) => Some(format!("{} decode: {}, prompts: {}", p.ty, name(d), name(b))),
            })
            .collect();
        match other.is_empty() {
            true => format!("{} packed", self.default_set().name),
            false => format!("{} packed ({})", self.default_set().name, other.join("; ")),
        }
    }
}

/// Activations of `n` tokens for the timing, as the runtime quantizes them (merged values
/// where the kernels read them).
fn acts(
    pool: &ThreadPool,
    kind: ActKind,
    x: &[f32],
    n: usize,
    two_level: bool,
    set: &GemmKernels,
    ty: GgmlType,
) -> QActs {
    let mut a = QActs::new(kind);
    matmul::quantize(pool, &mut a, x, n, x.len() / n, two_level);
    if two_level && set.reads_merged(ty) {
        a.add_merged(&matmul::par(pool));
    }
    a
}

/// The index of the fastest time, the default (0) unless another is [`MARGIN`] faster.
fn fastest(times: &[f64]) -> usize {
    let (best, t) = times.iter().enumerate().fold((0, times[0]), |b, (i, &t)| if t < b.1 { (i, t) } else { b });
    if t < times[0] * (1.0 - MARGIN) { best } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variant_replaces_the_default_only_when_clearly_faster() {
        assert_eq!(fastest(&[1.0, 0.99, 1.2]), 0, "1% is noise");
        assert_eq!(fastest(&[1.0, 0.9, 0.95]), 1);
        assert_eq!(fastest(&[1.0, 0.96, 0.8]), 2);
        assert_eq!(fastest(&[1.0]), 0);
    }

    /// Timing a matrix records one pick for its type, decode and batch, among the candidates.
    #[test]
    fn timing_a_matrix_picks_once_per_type() {
        let Some(mut c) = GemmChoice::new() else {
            duet_test_support::cpu_lacks(
                "timing_a_matrix_picks_once_per_type",
                &["avx2", "fma", "f16c"],
                "no packed kernels",
            );
            return;
        };
        let (rows, cols) = (512, 2048);
        let ty = GgmlType::Q4_K;
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i as f32) * 0.754_877_7).fract() - 0.5).collect();
        let mut bytes = vec![0u8; duet_quant::row_bytes(ty, cols).unwrap() * rows];
        duet_quant::quantize(ty, &w, cols, &mut bytes).unwrap();
        let pool = ThreadPool::new(2);
        let par = |n: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)| pool.for_chunks(n, 1, f);
        let p = PackedMatrix::pack(ty, &bytes, rows, cols, &par).unwrap();
        assert_eq!(c.wants_timing(ty, rows * cols), c.candidates.len() > 1);
        c.time(&pool, &p, ActPrecision::Q8x2);
        assert_eq!(c.picks.len(), 1);
        let pick = c.picks[0];
        assert_eq!(pick.ty, ty);
        assert!(pick.decode < c.candidates.len() && pick.batch < c.candidates.len());
        assert!(!c.wants_timing(ty, rows * cols), "a type is timed once");
    }

    #[test]
    fn picks_apply_by_type_and_rows_and_a_pin_overrides_them() {
        static SETS: std::sync::OnceLock<Vec<GemmKernels>> = std::sync::OnceLock::new();
        // Two sets of this CPU (the portable one twice where it is the only one).
        let sets = SETS.get_or_init(|| {
            let mut v: Vec<GemmKernels> = duet_quant::gemm::available();
            v.push(v[0]);
            v.truncate(2);
            v
        });
        let mut c = GemmChoice::with_candidates(sets).unwrap();
        c.picks.push(Pick { ty: GgmlType::Q6_K, decode: 1, batch: 0 });
        assert_eq!(c.index(GgmlType::Q6_K, 1), 1);
        assert_eq!(c.index(GgmlType::Q6_K, DECODE_ROWS + 1), 0);
        assert_eq!(c.index(GgmlType::Q4_K, 1), 0, "an untimed type runs the default");
        assert!(!c.wants_timing(GgmlType::Q6_K, TIMED_MIN_WEIGHTS), "timed once");
        assert!(c.wants_timing(GgmlType::Q4_K, TIMED_MIN_WEIGHTS));
        assert!(!c.wants_timing(GgmlType::Q4_K, TIMED_MIN_WEIGHTS - 1), "too small to time");
        assert_eq!(c.describe(), format!("{} packed (Q6_K decode: {})", sets[0].name, sets[1].name));
        c.pin(sets[0].name).unwrap();
        assert_eq!(c.index(GgmlType::Q6_K, 1), 0);
        assert!(c.pin("nonesuch").unwrap_err().contains(sets[0].name), "the refusal lists the candidates");
    }
}
