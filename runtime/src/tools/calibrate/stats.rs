//! Streaming statistics of activation magnitudes: maximum, approximate quantiles from a
//! logarithmic histogram, and the exact k largest values.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Histogram bins per decade of |x|: quantiles are exact to within 10^(1/64) ≈ 3.7 %.
const BINS_PER_DECADE: usize = 64;
/// |x| below 10^MIN_EXP counts as zero; above 10^MAX_EXP as the last bin.
const MIN_EXP: i32 = -8;
const MAX_EXP: i32 = 8;
const N_BINS: usize = (MAX_EXP - MIN_EXP) as usize * BINS_PER_DECADE + 1;

/// Magnitude statistics of one stream of values.
#[derive(Clone, Debug)]
pub struct MagnitudeStats {
    pub count: u64,
    pub absmax: f32,
    bins: Vec<u64>,
}

impl Default for MagnitudeStats {
    fn default() -> Self {
        MagnitudeStats { count: 0, absmax: 0.0, bins: vec![0; N_BINS] }
    }
}

fn bin_of(a: f32) -> usize {
    if a.is_nan() || a <= 0.0 {
        return 0;
    }
    let e = (a as f64).log10();
    let b = ((e - MIN_EXP as f64) * BINS_PER_DECADE as f64).floor();
    if b < 0.0 { 0 } else { (b as usize + 1).min(N_BINS - 1) }
}

/// Geometric middle of bin `b` (0 is exact zero).
fn bin_value(b: usize) -> f32 {
    if b == 0 {
        return 0.0;
    }
    let e = MIN_EXP as f64 + (b as f64 - 0.5) / BINS_PER_DECADE as f64;
    10f64.powf(e) as f32
}

impl MagnitudeStats {
    pub fn add(&mut self, x: f32) {
        let a = x.abs();
        if a.is_nan() {
            return;
        }
        self.count += 1;
        self.absmax = self.absmax.max(a);
        self.bins[bin_of(a)] += 1;
    }

    pub fn add_all(&mut self, xs: &[f32]) {
        for &x in xs {
            self.add(x);
        }
    }

    /// The q-quantile of |x| (0 ≤ q ≤ 1), to within the histogram's resolution; the
    /// maximum itself for q = 1.
    pub fn quantile(&self, q: f64) -> f32 {
        if self.count == 0 {
            return 0.0;
        }
        if q >= 1.0 {
            return self.absmax;
        }
        let target = (q * self.count as f64).ceil().max(1.0) as u64;
        let mut acc = 0u64;
        for (b, &n) in self.bins.iter().enumerate() {
            acc += n;
            if acc >= target {
                return bin_value(b).min(self.absmax);
            }
        }
        self.absmax
    }

    pub fn merge(&mut self, o: &MagnitudeStats) {
        self.count += o.count;
        self.absmax = self.absmax.max(o.absmax);
        for (a, b) in self.bins.iter_mut().zip(&o.bins) {
            *a += b;
        }
    }
}

/// The k largest magnitudes seen (exact).
#[derive(Clone, Debug)]
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Reverse<u32>>, // f32 bits of non-negative values order like the values
}

impl TopK {
    pub fn new(k: usize) -> TopK {
        TopK { k, heap: BinaryHeap::with_capacity(k + 1) }
    }

    pub fn add(&mut self, x: f32) {
        let a = x.abs();
        if a.is_nan() {
            return;
        }
        let bits = a.to_bits();
        if self.heap.len() < self.k {
            self.heap.push(Reverse(bits));
        } else if self.heap.peek().is_some_and(|m| bits > m.0) {
            self.heap.pop();
            self.heap.push(Reverse(bits));
        }
    }

    /// Largest first.
    pub fn sorted(&self) -> Vec<f32> {
        let mut v: Vec<f32> = self.heap.iter().map(|r| f32::from_bits(r.0)).collect();
        v.sort_by(|a, b| b.total_cmp(a));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_within_resolution() {
        let mut s = MagnitudeStats::default();
        for i in 1..=10_000 {
            s.add(i as f32 * 0.01 * if i % 2 == 0 { 1.0 } else { -1.0 });
        }
        assert_eq!(s.absmax, 100.0);
        let median = s.quantile(0.5);
        assert!((median - 50.0).abs() / 50.0 < 0.04, "{median}");
        let p999 = s.quantile(0.999);
        assert!((p999 - 99.9).abs() / 99.9 < 0.04, "{p999}");
        assert_eq!(s.quantile(1.0), 100.0);
    }

    #[test]
    fn top_k_is_exact() {
        let mut t = TopK::new(3);
        for x in [1.0f32, -7.0, 3.0, 0.5, 6.0, -2.0] {
            t.add(x);
        }
        assert_eq!(t.sorted(), vec![7.0, 6.0, 3.0]);
    }
}
