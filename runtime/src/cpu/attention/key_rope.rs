//! RoPE applied as keys are read, for K caches that hold keys as they were before RoPE
//! ([`duet_quant::kv::CacheFormat::keys_before_rope`]).
//!
//! A key at position p scores `q · R(p)·k`, R(p) rotating the pair (2i, 2i+1) of each head
//! by p·θ_i (the first n_rot dims; `crate::cpu::ops::rope_row`). Positions are taken as a
//! group start p0 = 32·g and an offset j < 32, `q · R(p)·k = R(−p0)·q · R(j)·k`: the query
//! is turned back by −p0 once per group, and each key turned forward by j from a table of 32
//! rows that stays in L1 (not a table row per position, as many bytes as an f32 key). A key
//! is decoded and turned once for all the query heads that read it (GQA: SmolLM2's 3, DIFF
//! V1's two softmaxes), where turning the query per position would repeat it per head.

use duet_quant::kv::channel::{GROUP, SINK};
use duet_quant::kv::pack::N;

use super::cache::Placement;
use super::channel::{ChannelRows, grouped};

use crate::backend::RopeSpec;

/// cos and sin of the angles one reader needs, by pair: `pair_cs[row][i] = (cos, sin)` of
/// row·GROUP·θ_i for the group starts and of j·θ_i for the offsets (angles computed as
/// RoPE computes them: position × freq_scale, then × θ_i, in f32).
#[derive(Clone, Debug)]
pub struct KeyRope {
    thetas: Vec<f32>,
    freq_scale: f32,
    /// The offsets j = 0..GROUP per lane of a head: row j is head_dim cosines (each pair's
    /// twice, then 1 for the unrotated dims), then head_dim sines signed for turning a key
    /// forward (`−sin, +sin` per pair, 0 past n_rot): `R(j)·k = cos·k + sin·swap(k)`, swap
    /// exchanging the two values of each pair.
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
    /// If RoPE rotates more than `head_dim` dims, or `head_dim` is odd.
    pub fn new(rope: &RopeSpec, head_dim: usize) -> KeyRope {
        let thetas = rope.thetas();
        assert!(2 * thetas.len() <= head_dim, "RoPE rotates {} dims of a {head_dim}-dim head", 2 * thetas.len());
        assert!(head_dim.is_multiple_of(2), "RoPE turns pairs: a {head_dim}-dim head");
        let pad = head_dim - 2 * thetas.len();
        let mut offsets = Vec::with_capacity(GROUP * thetas.len());
        for j in 0..GROUP {
            angles(j, &thetas, rope.freq_scale, &mut offsets);
        }
        let offset_lanes = (0..GROUP)
            .flat_map(|j| {
                let row = &offsets[j * thetas.len()..(j + 1) * thetas.len()];
                let c = row.iter().flat_map(|&(c, _)| [c, c]).chain(std::iter::repeat_n(1.0, pad));
                let s = row.iter().flat_map(|&(_, s)| [-s, s]).chain(std::iter::repeat_n(0.0, pad));
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

    /// Offset `j`'s cosines and signed sines per lane (head_dim each).
    pub fn offset_lanes(&self, j: usize) -> (&[f32], &[f32]) {
        let h = self.head_dim;
        self.offset_lanes[2 * h * j..2 * h * (j + 1)].split_at(h)
    }

    /// `R(j)·k` for the key `k` (before RoPE) at offset `j` of a group, into `out`.
    pub fn turn_key(&self, j: usize, k: &[f32], out: &mut [f32]) {
        let (cos, sin) = self.offset_lanes(j);
        for ((o, k), (c, s)) in
            out.chunks_exact_mut(2).zip(k.chunks_exact(2)).zip(cos.chunks_exact(2).zip(sin.chunks_exact(2)))
        {
            o[0] = c[0] * k[0] + s[0] * k[1];
            o[1] = c[1] * k[1] + s[1] * k[0];
        }
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

/// The per-channel reader of keys stored before RoPE.
impl ChannelRows {
    /// Scores over keys stored before RoPE ([`KeyRope`]) for the query heads `q` (heads of
    /// hd values one after another, all reading columns col0..col0 + hd): for the positions
    /// p < n of the groups `groups`, `out[h·stride + p − GROUP·groups.start] = scale · q_h ·
    /// R(p)·K_p`, the key read from its group, the sink or the window. Each key is decoded
    /// (`lo + step·u`, or its f16) and turned once for all the heads ([`KeyRope`]): per value
    /// a decode, a turn and a multiply-add per head, where the post-RoPE formats take an
    /// integer dot product per head.
    #[allow(clippy::too_many_arguments)]
    pub fn scores_before_rope(
        &self,
        at: &Placement,
        q: &[f32],
        col0: usize,
        scale: f32,
        rope: &KeyRope,
        n: usize,
        groups: std::ops::Range<usize>,
        out: &mut [f32],
        stride: usize,
    ) {
        assert!(n <= at.written, "attention past the {} written positions", at.written);
        let (hd, d) = (rope.offset_lanes(0).0.len(), self.kv_dim);
        assert!(q.len().is_multiple_of(hd), "queries of {hd}-value heads");
        let grouped = grouped(at.written).min(n);
        let first = GROUP * groups.start;
        let mut gq = vec![0f32; q.len()];
        let (mut lo, mut step, mut k, mut turned) = (vec![0f32; hd], vec![0f32; hd], vec![0f32; hd], vec![0f32; hd]);
        let turn_queries = |g: usize, gq: &mut [f32]| {
            for (q, gq) in q.chunks_exact(hd).zip(gq.chunks_exact_mut(hd)) {
                rope.to_group(q, g, gq);
            }
        };
        let score_heads = |gq: &[f32], turned: &[f32], out: &mut [f32], at: usize| {
            for (h, gq) in gq.chunks_exact(hd).enumerate() {
                out[h * stride + at] = dot(gq, turned) * scale;
            }
        };
        #[cfg(target_arch = "x86_64")]
        let simd =
            col0.is_multiple_of(N) && hd.is_multiple_of(N) && (N..=4 * N).contains(&hd) && crate::cpu::simd::avx2();
        let mut u = [0u8; N];
        for g in groups.start..groups.end.min(grouped.div_ceil(GROUP)) {
            let rows = (grouped - g * GROUP).min(GROUP);
            turn_queries(g, &mut gq);
            let group = self.group(at.seq.pages[g]);
            let o = &mut out[g * GROUP - first..];
            self.head_header(group, col0, &mut lo, &mut step);
            #[cfg(target_arch = "x86_64")]
            if simd {
                let (hb, at) =
                    (self.fmt.header_bytes(d), col0 / N * duet_quant::kv::pack::packed_bytes(self.fmt.bits()));
                let keys = super::key_rope::x86::GroupKeys {
                    bits: self.fmt.bits(),
                    lo: &lo,
                    step: &step,
                    codes: group[hb + at..].as_ptr(),
                    row_bytes: self.fmt.row_bytes(d),
                };
                // SAFETY: features checked; lo and step are hd long, and the group's
                // GROUP ≥ rows rows of codes hold the head's hd/32 packed groups at byte
                // `at`; gq is whole heads of hd, as the offsets' lanes are; the kernel
                // checks the bounds of `o`.
                unsafe { super::key_rope::x86::scores_heads(&keys, &gq, rope, scale, rows, o, stride) };
                continue;
            }
            let codes = &group[self.fmt.header_bytes(d)..];
            for j in 0..rows {
                self.for_codes(codes, j, col0, hd, &mut u, |x0, len, u| {
                    for i in 0..len {
                        k[x0 + i] = lo[x0 + i] + step[x0 + i] * u[i] as f32;
                    }
                });
                rope.turn_key(j, &k, &mut turned);
                score_heads(&gq, &turned, o, j);
            }
        }
        // The window's positions, and the sink's (in group 0 above, read from the sink).
        let (window, sink) = (&self.window(at.seq.slot)[col0..], &self.sink(at.seq.sink)[col0..]);
        let mut turned_to = usize::MAX;
        for p in (0..SINK.min(grouped)).chain(grouped..n).filter(|p| groups.contains(&(p / GROUP))) {
            let (g, j) = (p / GROUP, p % GROUP);
            let row = if p < grouped { &sink[p * d..] } else { &window[j * d..] };
            k.iter_mut().zip(row).for_each(|(k, h)| *k = h.to_f32());
            if turned_to != g {
                turn_queries(g, &mut gq);
                turned_to = g;
            }
            rope.turn_key(j, &k, &mut turned);
            score_heads(&gq, &turned, out, p - first);
        }
    }
}

/// `a · b` in eight partial sums (the order the vector loops take, the same for every head).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (a, b) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += a[l] * b[l];
        }
    }
    let n8 = a.len() / 8 * 8;
    acc.iter().sum::<f32>() + a[n8..].iter().zip(&b[n8..]).map(|(a, b)| a * b).sum::<f32>()
}

/// The AVX2 loop of the per-channel reader's scores over keys stored before RoPE
/// (`super::channel`), beside the tables it reads.
#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::KeyRope;
    use crate::cpu::simd::{by_head_groups, codes_u8, hsum};

    /// One group's keys for one KV head, as [`scores_heads`] reads them: the head's lo and
    /// step (decoded) and the codes of its first packed group in row 0.
    pub struct GroupKeys<'a> {
        pub bits: u32,
        pub lo: &'a [f32],
        pub step: &'a [f32],
        pub codes: *const u8,
        pub row_bytes: usize,
    }

    /// Scores of the rows `j < rows` of one group of keys stored before RoPE, the head NG·32
    /// channels wide, for every query head in `gq` (heads × NG·32, each turned to the
    /// group's start): per row the key decoded to f32 (`lo + step·u`, the codes widened
    /// eight at a time) and turned by its offset ([`KeyRope::turn_key`]) once, then
    /// `out[h·stride + j] = scale · gq_h · key`.
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `keys` as [`GroupKeys`] says for rows j < rows ≤ 32; `rope`'s
    /// lanes NG·32 long; gq a whole number of heads; out.len() > (heads − 1)·stride + rows − 1.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_heads_ng<const NG: usize>(
        keys: &GroupKeys,
        gq: &[f32],
        rope: &KeyRope,
        scale: f32,
        rows: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        let pb = 4 * keys.bits as usize;
        unsafe {
            let (lo, st, mut key) = (&keys.lo[..NG * 32], &keys.step[..NG * 32], [0f32; 128]);
            // Eight codes of a row's 32 (e = 0..4) as f32.
            let eighth = |u: __m256i, e: usize| {
                let h = if e < 2 { _mm256_castsi256_si128(u) } else { _mm256_extracti128_si256::<1>(u) };
                let h = if e.is_multiple_of(2) { h } else { _mm_unpackhi_epi64(h, h) };
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h))
            };
            for j in 0..rows {
                let (cos, sin) = rope.offset_lanes(j);
                let row = keys.codes.add(j * keys.row_bytes);
                for g in 0..NG {
                    let u = codes_u8(keys.bits, row.add(g * pb));
                    for e in 0..4 {
                        let i = 32 * g + 8 * e;
                        let k = _mm256_fmadd_ps(
                            _mm256_loadu_ps(st.as_ptr().add(i)),
                            eighth(u, e),
                            _mm256_loadu_ps(lo.as_ptr().add(i)),
                        );
                        // cos·k + sin·swap(k): the pairs' values exchanged within each 128-bit lane.
                        let swapped = _mm256_permute_ps::<0b1011_0001>(k);
                        let turned = _mm256_fmadd_ps(
                            _mm256_loadu_ps(cos.as_ptr().add(i)),
                            k,
                            _mm256_mul_ps(_mm256_loadu_ps(sin.as_ptr().add(i)), swapped),
                        );
                        _mm256_storeu_ps(key.as_mut_ptr().add(i), turned);
                    }
                }
                for (h, q) in gq.chunks_exact(NG * 32).enumerate() {
                    let mut acc = _mm256_setzero_ps();
                    for i in (0..NG * 32).step_by(8) {
                        acc = _mm256_fmadd_ps(
                            _mm256_loadu_ps(q.as_ptr().add(i)),
                            _mm256_loadu_ps(key.as_ptr().add(i)),
                            acc,
                        );
                    }
                    out[h * stride + j] = hsum(acc) * scale;
                }
            }
        }
    }

    /// # Safety
    /// As [`scores_heads_ng`] with NG = the head width / 32 in 1..=4.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores_heads(
        keys: &GroupKeys,
        gq: &[f32],
        rope: &KeyRope,
        scale: f32,
        rows: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        let hd = rope.offset_lanes(0).0.len();
        let heads = gq.len() / hd;
        assert!(rows <= 32 && hd.is_multiple_of(32) && (32..=128).contains(&hd) && gq.len() == heads * hd);
        assert!(heads == 0 || rows == 0 || out.len() > (heads - 1) * stride + rows - 1, "scores out of bounds");
        unsafe { by_head_groups!(hd / 32, scores_heads_ng(keys, gq, rope, scale, rows, out, stride)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ops::rope_row;
    use crate::kv_pages::SeqPages;
    use duet_quant::kv::channel::ChannelFormat;

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
            let (mut gq, mut turned) = (vec![0f32; hd], vec![0f32; hd]);
            kr.to_group(&q, p / GROUP, &mut gq);
            kr.turn_key(p % GROUP, &k, &mut turned);
            let got: f32 = gq.iter().zip(&turned).map(|(a, b)| a * b).sum();
            assert!((got - want).abs() < 2e-6, "position {p}: {got} vs {want}");
        }
    }

    /// Keys before RoPE scored for several heads at once, a few groups at a time (as
    /// `super::shared_keys` asks), equal each head's scores alone bit for bit: the vector
    /// loop (64-wide heads) and the portable one (40-wide), group ranges that split the
    /// quantized groups, the sink and the window apart.
    #[test]
    fn heads_scored_together_equal_each_alone() {
        let kv_dim = 128;
        let pages = [1, 0, 2];
        let seq = SeqPages { pages: &pages, slot: 0, sink: 0 };
        let len = 77;
        let vals: Vec<f32> = (0..len * kv_dim).map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 3.0).collect();
        let rope = RopeSpec { n_rot: 32, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None };
        for fmt in [ChannelFormat::Q3, ChannelFormat::Q2] {
            let mut c = ChannelRows::new(fmt, 3, 1, kv_dim).unwrap();
            c.write(&seq, 0, &vals);
            let at = Placement::new(seq, len);
            for (col0, hd) in [(64, 64), (40, 40)] {
                let mut key_rope = KeyRope::new(&rope, hd);
                key_rope.reach(len);
                let heads = 3;
                let q: Vec<f32> = (0..heads * hd).map(|i| (i as f32 * 0.37).sin()).collect();
                for n in [1, 32, 40, 64, 70, len] {
                    let alone: Vec<Vec<f32>> = q
                        .chunks(hd)
                        .map(|qh| {
                            let mut s = vec![f32::NAN; n];
                            c.scores(&at, qh, col0, 0.5, Some(&key_rope), &mut s);
                            s
                        })
                        .collect();
                    for groups in [0..1, 1..2, 2..3, 0..3, 1..3] {
                        let stride = GROUP * groups.len();
                        let mut out = vec![f32::NAN; heads * stride];
                        c.scores_before_rope(&at, &q, col0, 0.5, &key_rope, n, groups.clone(), &mut out, stride);
                        for (h, want) in alone.iter().enumerate() {
                            for p in (GROUP * groups.start..GROUP * groups.end).filter(|&p| p < n) {
                                let got = out[h * stride + p - GROUP * groups.start];
                                assert_eq!(
                                    got.to_bits(),
                                    want[p].to_bits(),
                                    "{fmt:?} {hd} n={n} {groups:?} head {h} position {p}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
