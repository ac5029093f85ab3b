//! RoPE applied as keys are read, for K caches that hold keys as they were before RoPE
//! ([`duet_quant::kv::CacheFormat::keys_before_rope`]).
//!
//! A key at position p scores `q · R(p)·k`, R(p) rotating the pair (2i, 2i+1) of each head
//! by p·θ_i (the first n_rot dims; `crate::cpu::ops::rope_row`), and `q · R(p)·k =
//! R(−p)·q · k`: the reader rotates the query back instead of every key forward, so the
//! stored codes are read as they are. Positions are taken as a group start p0 = 32·g and an
//! offset j < 32, `R(−p) = R(−j)·R(−p0)`: the query is turned by −p0 once per group, then by
//! −j per position from a table of 32 rows that stays in L1 — not a table row per position,
//! which would be read once per head and position (as many bytes as an f32 key).

use duet_quant::kv::channel::GROUP;

use crate::backend::RopeSpec;

/// cos and sin of the angles one reader needs, by pair: `pair_cs[row][i] = (cos, sin)` of
/// row·GROUP·θ_i for the group starts and of j·θ_i for the offsets (angles computed as
/// RoPE computes them: position × freq_scale, then × θ_i, in f32).
#[derive(Clone, Debug)]
pub struct KeyRope {
    thetas: Vec<f32>,
    freq_scale: f32,
    /// The offsets j = 0..GROUP per lane of a head: row j is head_dim cosines (each pair's
    /// twice, then 1 for the unrotated dims), then head_dim sines (0 past n_rot).
    offset_lanes: Vec<f32>,
    head_dim: usize,
    /// One row per group start reached so far.
    starts: Vec<(f32, f32)>,
}

fn angles(p: usize, thetas: &[f32], freq_scale: f32, out: &mut Vec<(f32, f32)>) {
    let x = p as f32 * freq_scale;
    out.extend(thetas.iter().map(|&t| {
        let (s, c) = (x * t).sin_cos();
        (c, s)
    }));
}

impl KeyRope {
    /// # Panics
    /// If RoPE rotates more than `head_dim` dims.
    pub fn new(rope: &RopeSpec, head_dim: usize) -> KeyRope {
        let thetas = rope.thetas();
        assert!(2 * thetas.len() <= head_dim, "RoPE rotates {} dims of a {head_dim}-dim head", 2 * thetas.len());
        let pad = head_dim - 2 * thetas.len();
        let mut offsets = Vec::with_capacity(GROUP * thetas.len());
        for j in 0..GROUP {
            angles(j, &thetas, rope.freq_scale, &mut offsets);
        }
        let offset_lanes = (0..GROUP)
            .flat_map(|j| {
                let row = &offsets[j * thetas.len()..(j + 1) * thetas.len()];
                let c = row.iter().flat_map(|&(c, _)| [c, c]).chain(std::iter::repeat_n(1.0, pad));
                let s = row.iter().flat_map(|&(_, s)| [s, s]).chain(std::iter::repeat_n(0.0, pad));
                c.chain(s).collect::<Vec<_>>()
            })
            .collect();
        KeyRope { thetas, freq_scale: rope.freq_scale, offset_lanes, head_dim, starts: Vec::new() }
    }

    /// Whether this was made from `rope`'s frequencies for heads of `head_dim`.
    pub fn is_for(&self, rope: &RopeSpec, head_dim: usize) -> bool {
        self.head_dim == head_dim && self.freq_scale == rope.freq_scale && self.thetas == rope.thetas()
    }

    /// Makes the group starts of positions `0..n_pos` available.
    pub fn reach(&mut self, n_pos: usize) {
        let n = self.thetas.len();
        while self.starts.len() < n_pos.div_ceil(GROUP) * n {
            let g = self.starts.len() / n;
            angles(g * GROUP, &self.thetas, self.freq_scale, &mut self.starts);
        }
    }

    /// Rotated pairs per head.
    pub fn pairs(&self) -> usize {
        self.thetas.len()
    }

    /// `out = R(−GROUP·g)·q` for one head's query `q` (pairs past n_rot copied).
    pub fn to_group(&self, q: &[f32], g: usize, out: &mut [f32]) {
        let n = self.pairs();
        assert!((g + 1) * n <= self.starts.len(), "key RoPE asked for group {g} before reaching it");
        rotate_back(q, &self.starts[g * n..(g + 1) * n], out);
    }

    /// Offset `j`'s cosines and sines per lane (head_dim each).
    pub fn offset_lanes(&self, j: usize) -> (&[f32], &[f32]) {
        let h = self.head_dim;
        self.offset_lanes[2 * h * j..2 * h * (j + 1)].split_at(h)
    }

    /// For one head's query turned to a group's start (`gq`, [`KeyRope::to_group`]), the
    /// partner of each lane within its pair, `(b, −a)` for the pair (a, b) and 0 for the
    /// unrotated dims: offset j's query is `cos·gq + sin·partner` lane by lane.
    pub fn partners(&self, gq: &[f32], out: &mut [f32]) {
        let r = 2 * self.pairs();
        for (pt, x) in out[..r].chunks_exact_mut(2).zip(gq[..r].chunks_exact(2)) {
            pt[0] = x[1];
            pt[1] = -x[0];
        }
        out[r..].fill(0.0);
    }

    /// `q_j · k` for the key `k` (before RoPE) at offset `j` of the group that `gq` and
    /// `partner` were turned to: `Σ (cos·gq + sin·partner)·k`.
    pub fn score(&self, gq: &[f32], partner: &[f32], j: usize, k: &[f32]) -> f32 {
        let (cos, sin) = self.offset_lanes(j);
        let lane = |c: f32, s: f32, g: f32, p: f32, k: f32| (c * g + s * p) * k;
        let mut acc = [0f32; 8];
        let eights = cos.chunks_exact(8).zip(sin.chunks_exact(8)).zip(gq.chunks_exact(8));
        for ((((c, s), g), p), k) in eights.zip(partner.chunks_exact(8)).zip(k.chunks_exact(8)) {
            for l in 0..8 {
                acc[l] += lane(c[l], s[l], g[l], p[l], k[l]);
            }
        }
        let n8 = k.len() / 8 * 8;
        let rest = (n8..k.len()).map(|i| lane(cos[i], sin[i], gq[i], partner[i], k[i]));
        acc.iter().sum::<f32>() + rest.sum::<f32>()
    }
}

/// `out = R(−φ)·x` pair by pair, `cs[i]` = (cos φ_i, sin φ_i); dims past the pairs copied.
pub fn rotate_back(x: &[f32], cs: &[(f32, f32)], out: &mut [f32]) {
    let r = 2 * cs.len();
    for ((o, x), &(c, s)) in out[..r].chunks_exact_mut(2).zip(x[..r].chunks_exact(2)).zip(cs) {
        o[0] = c * x[0] + s * x[1];
        o[1] = c * x[1] - s * x[0];
    }
    out[r..].copy_from_slice(&x[r..]);
}

/// The AVX2 loop of the per-channel reader's scores over keys stored before RoPE
/// (`super::channel`), beside the tables it reads.
#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::KeyRope;
    use crate::cpu::simd::{codes_u8, hsum};

    /// One group's keys for one head, as [`scores_before_rope`] reads them: the header's
    /// lo and step of the head's first column (f16) and the codes of its first packed group
    /// in row 0.
    pub struct GroupKeys {
        pub bits: u32,
        pub lo: *const u8,
        pub step: *const u8,
        pub codes: *const u8,
        pub row_bytes: usize,
    }

    /// Scores of the rows of one group of keys stored before RoPE, the head NG·32 channels
    /// wide: per row j, `Σ (cos_j·gq + sin_j·partner)·(lo + step·u)` over the lanes
    /// ([`KeyRope::score`]), the codes widened to f32 eight at a time.
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `keys` as [`GroupKeys`] says for rows t < out.len() ≤ 32; gq,
    /// partner and `rope`'s lanes NG·32 long.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_before_rope_ng<const NG: usize>(
        keys: &GroupKeys,
        gq: &[f32],
        partner: &[f32],
        rope: &KeyRope,
        scale: f32,
        out: &mut [f32],
    ) {
        let pb = 4 * keys.bits as usize;
        unsafe {
            let (mut lo, mut st) = ([0f32; 128], [0f32; 128]);
            for i in (0..NG * 32).step_by(8) {
                _mm256_storeu_ps(lo.as_mut_ptr().add(i), _mm256_cvtph_ps(_mm_loadu_si128(keys.lo.add(2 * i).cast())));
                _mm256_storeu_ps(st.as_mut_ptr().add(i), _mm256_cvtph_ps(_mm_loadu_si128(keys.step.add(2 * i).cast())));
            }
            // Eight codes of a row's 32 (e = 0..4) as f32.
            let eighth = |u: __m256i, e: usize| {
                let h = if e < 2 { _mm256_castsi256_si128(u) } else { _mm256_extracti128_si256::<1>(u) };
                let h = if e.is_multiple_of(2) { h } else { _mm_unpackhi_epi64(h, h) };
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h))
            };
            // Two rows at a time share the loads of lo, step and the query's lanes.
            let mut j = 0;
            while j < out.len() {
                let two = j + 1 < out.len();
                let j1 = if two { j + 1 } else { j };
                let ((c0, s0), (c1, s1)) = (rope.offset_lanes(j), rope.offset_lanes(j1));
                let (row0, row1) = (keys.codes.add(j * keys.row_bytes), keys.codes.add(j1 * keys.row_bytes));
                let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                for g in 0..NG {
                    let (u0, u1) = (codes_u8(keys.bits, row0.add(g * pb)), codes_u8(keys.bits, row1.add(g * pb)));
                    for e in 0..4 {
                        let i = 32 * g + 8 * e;
                        let (stv, lov) = (_mm256_loadu_ps(st.as_ptr().add(i)), _mm256_loadu_ps(lo.as_ptr().add(i)));
                        let (gv, pv) = (_mm256_loadu_ps(gq.as_ptr().add(i)), _mm256_loadu_ps(partner.as_ptr().add(i)));
                        let k0 = _mm256_fmadd_ps(stv, eighth(u0, e), lov);
                        let k1 = _mm256_fmadd_ps(stv, eighth(u1, e), lov);
                        let turned0 = _mm256_mul_ps(_mm256_loadu_ps(s0.as_ptr().add(i)), pv);
                        let turned1 = _mm256_mul_ps(_mm256_loadu_ps(s1.as_ptr().add(i)), pv);
                        let q0 = _mm256_fmadd_ps(_mm256_loadu_ps(c0.as_ptr().add(i)), gv, turned0);
                        let q1 = _mm256_fmadd_ps(_mm256_loadu_ps(c1.as_ptr().add(i)), gv, turned1);
                        a0 = _mm256_fmadd_ps(q0, k0, a0);
                        a1 = _mm256_fmadd_ps(q1, k1, a1);
                    }
                }
                out[j] = hsum(a0) * scale;
                if two {
                    out[j + 1] = hsum(a1) * scale;
                }
                j += 2;
            }
        }
    }

    /// # Safety
    /// As [`scores_before_rope_ng`] with NG = gq.len()/32 in 1..=4.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores_before_rope(
        keys: &GroupKeys,
        gq: &[f32],
        partner: &[f32],
        rope: &KeyRope,
        scale: f32,
        out: &mut [f32],
    ) {
        assert!(out.len() <= 32 && rope.offset_lanes(0).0.len() == gq.len() && partner.len() == gq.len());
        unsafe {
            match gq.len() / 32 {
                1 => scores_before_rope_ng::<1>(keys, gq, partner, rope, scale, out),
                2 => scores_before_rope_ng::<2>(keys, gq, partner, rope, scale, out),
                3 => scores_before_rope_ng::<3>(keys, gq, partner, rope, scale, out),
                _ => scores_before_rope_ng::<4>(keys, gq, partner, rope, scale, out),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ops::rope_row;

    /// Reading a key before RoPE against the rotated-back query gives the score of the
    /// roped key, at positions across several groups and with part of the head unrotated.
    #[test]
    fn rotated_back_query_scores_as_the_roped_key() {
        let rope = RopeSpec { n_rot: 6, freq_base: 10000.0, freq_scale: 0.5, freq_factors: None };
        let hd = 8;
        let mut kr = KeyRope::new(&rope, hd);
        kr.reach(200);
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.7).sin() + 0.3).collect();
        let k: Vec<f32> = (0..hd).map(|i| (i as f32 * 1.3).cos() - 0.2).collect();
        for p in [0, 1, 31, 32, 77, 199] {
            let mut roped = k.clone();
            rope_row(&mut roped, 1, hd, p, &rope.thetas(), rope.freq_scale);
            let want: f32 = q.iter().zip(&roped).map(|(a, b)| a * b).sum();
            let (mut gq, mut partner) = (vec![0f32; hd], vec![0f32; hd]);
            kr.to_group(&q, p / GROUP, &mut gq);
            kr.partners(&gq, &mut partner);
            let got = kr.score(&gq, &partner, p % GROUP, &k);
            assert!((got - want).abs() < 2e-6, "position {p}: {got} vs {want}");
        }
    }
}
