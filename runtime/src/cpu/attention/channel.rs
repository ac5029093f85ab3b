//! A cache in per-channel groups (`q8c` … `q2c`, [`duet_quant::kv::channel`]): its
//! storage and attention's inner loops over it, reading the groups in place.
//!
//! A sequence's positions fill its f16 window of [`GROUP`] slots (position p in slot p mod
//! GROUP); when a group's last position arrives the window is quantized into the group's
//! bytes, which are the page holding those positions (a page is one group, see
//! [`crate::kv_pages`]). So of `written` positions, `0..GROUP·⌊written/GROUP⌋` are read from
//! groups and the rest, at most GROUP − 1, from the window's first slots. The first
//! [`SINK`] positions are read from the sink of the sequence's first page instead of group 0
//! (whose ranges leave them out: [`ChannelFormat::quantize_group`]), copied there from the
//! window when group 0 is quantized.
//!
//! With `value = lo_c + step_c·u`, one head's scores over a group are
//! `Σ_c q_c·lo_c + Σ_c (q_c·step_c)·u_c`: the first sum and the scaled query `q·step` once
//! per group, then integer dot products of the codes per position (AVX2: the scaled query
//! rounded to i16 per 32 channels, and its rounding error to i16 again — q·step spans the
//! channels' very different steps, too wide a range for one i16 level). The value sums
//! accumulate `Σ_t p_t·u_t` per channel and apply `lo·Σp + step·acc` once per group.

use duet_quant::kv::channel::{ChannelFormat, GROUP, SINK};
use duet_quant::kv::pack::{self, N};
use half::f16;

use super::cache::Placement;
use super::key_rope::KeyRope;
use super::plain;
use crate::error::RuntimeError;
use crate::kv_pages::SeqPages;
use crate::memory::zeroed;

pub struct ChannelRows {
    pub fmt: ChannelFormat,
    pub kv_dim: usize,
    /// One group per page, `group_bytes(kv_dim)` each.
    pub groups: Vec<u8>,
    /// Each sequence slot's window: GROUP rows of `kv_dim` f16 values.
    pub windows: Vec<f16>,
    /// The sinks, numbered by [`crate::kv_pages::PagePool::sink`] (as many as sequence
    /// slots): SINK rows of `kv_dim` f16 values each.
    pub sinks: Vec<f16>,
}

impl ChannelRows {
    pub fn new(fmt: ChannelFormat, n_pages: usize, n_seqs: usize, kv_dim: usize) -> Result<ChannelRows, RuntimeError> {
        Ok(ChannelRows {
            fmt,
            kv_dim,
            groups: zeroed(n_pages * fmt.group_bytes(kv_dim), "the K/V cache")?,
            windows: zeroed(n_seqs * GROUP * kv_dim, "the K/V cache")?,
            sinks: zeroed(n_seqs * SINK * kv_dim, "the K/V cache")?,
        })
    }

    /// The window of sequence slot `slot`.
    pub(super) fn window(&self, slot: usize) -> &[f16] {
        &self.windows[slot * GROUP * self.kv_dim..(slot + 1) * GROUP * self.kv_dim]
    }

    /// Sink `sink`'s rows.
    pub(super) fn sink(&self, sink: usize) -> &[f16] {
        &self.sinks[sink * SINK * self.kv_dim..(sink + 1) * SINK * self.kv_dim]
    }

    /// Stores `rows` (whole rows of kv_dim values) at positions pos0.. of sequence `seq`,
    /// quantizing every group they complete into its page.
    pub fn write(&mut self, seq: &SeqPages, pos0: usize, rows: &[f32]) {
        let (d, gb) = (self.kv_dim, self.fmt.group_bytes(self.kv_dim));
        let w0 = seq.slot * GROUP * d;
        for (i, row) in rows.chunks_exact(d).enumerate() {
            let p = pos0 + i;
            let slot = p % GROUP;
            let window = &mut self.windows[w0..w0 + GROUP * d];
            plain::f32_to_f16(row, &mut window[slot * d..(slot + 1) * d]);
            if slot == GROUP - 1 {
                let g = seq.pages[p / GROUP] as usize;
                let sink_rows = if p / GROUP == 0 { SINK } else { 0 };
                let s0 = seq.sink * SINK * d;
                self.sinks[s0..s0 + sink_rows * d].copy_from_slice(&window[..sink_rows * d]);
                self.fmt.quantize_group(window, d, sink_rows, &mut self.groups[g * gb..(g + 1) * gb]);
            }
        }
    }

    /// `out[j] = scale · q · K_j[col0..col0 + q.len()]` for positions j < out.len(); with
    /// `rope`, the cache holds keys before RoPE and `K_j` is key j rotated by its position.
    pub fn scores(&self, at: &Placement, q: &[f32], col0: usize, scale: f32, rope: Option<&KeyRope>, out: &mut [f32]) {
        if let Some(rope) = rope {
            let n = out.len();
            return self.scores_before_rope(at, q, col0, scale, rope, n, 0..n.div_ceil(GROUP), out, n);
        }
        let n = out.len();
        assert!(n <= at.written, "attention past the {} written positions", at.written);
        let hd = q.len();
        let grouped = grouped(at.written).min(n);
        let (mut lo, mut step, mut qs) = (vec![0f32; hd], vec![0f32; hd], vec![0f32; hd]);
        #[cfg(target_arch = "x86_64")]
        let simd =
            col0.is_multiple_of(N) && hd.is_multiple_of(N) && (N..=4 * N).contains(&hd) && crate::cpu::simd::avx2();
        for (g, o) in out[..grouped].chunks_mut(GROUP).enumerate() {
            let group = self.group(at.seq.pages[g]);
            self.head_header(group, col0, &mut lo, &mut step);
            #[cfg(target_arch = "x86_64")]
            if simd {
                let (hb, at) = (self.fmt.header_bytes(self.kv_dim), col0 / N * pack::packed_bytes(self.fmt.bits()));
                // SAFETY: features checked; lo and step are hd long, and the group's
                // GROUP ≥ o.len() rows of codes hold the head's hd/32 packed groups at
                // byte `at`.
                unsafe {
                    x86::scores(
                        self.fmt.bits(),
                        q,
                        &lo,
                        &step,
                        group.as_ptr().add(hb + at),
                        self.fmt.row_bytes(self.kv_dim),
                        scale,
                        o,
                    )
                };
                continue;
            }
            let c0: f32 = q.iter().zip(&lo).map(|(a, b)| a * b).sum();
            for ((s, a), b) in qs.iter_mut().zip(q).zip(&step) {
                *s = a * b;
            }
            let codes = &group[self.fmt.header_bytes(self.kv_dim)..];
            let mut u = [0u8; N];
            for (t, o) in o.iter_mut().enumerate() {
                let mut s = c0;
                self.for_codes(codes, t, col0, hd, &mut u, |x0, len, u| {
                    s += qs[x0..x0 + len].iter().zip(u).map(|(a, &b)| a * b as f32).sum::<f32>();
                });
                *o = s * scale;
            }
        }
        plain::scores_f16(q, &self.window(at.seq.slot)[col0..], self.kv_dim, scale, &mut out[grouped..]);
        // The sink's positions, in group 0 above, are read from the sink.
        let sunk = SINK.min(grouped);
        plain::scores_f16(q, &self.sink(at.seq.sink)[col0..], self.kv_dim, scale, &mut out[..sunk]);
    }

    /// `out += Σ_j p[j] · V_j[col0..col0 + out.len()]` over positions j < p.len().
    pub fn weighted_sum(&self, at: &Placement, p: &[f32], col0: usize, out: &mut [f32]) {
        self.weighted_sums([p], col0, at, [out]);
    }

    /// [`ChannelRows::weighted_sum`] of DIFF's two softmaxes over the same columns
    /// (`out[i] += Σ_j p[i][j] · V_j`), each group's codes read once for both.
    pub fn weighted_sum_pair(&self, at: &Placement, p: [&[f32]; 2], col0: usize, out: [&mut [f32]; 2]) {
        self.weighted_sums(p, col0, at, out);
    }

    /// The value sums of `M` probability vectors over the same positions.
    fn weighted_sums<const M: usize>(&self, p: [&[f32]; M], col0: usize, at: &Placement, mut out: [&mut [f32]; M]) {
        let n = p[0].len();
        assert!(n <= at.written, "attention past the {} written positions", at.written);
        let hd = out[0].len();
        assert!(p.iter().all(|p| p.len() == n) && out.iter().all(|o| o.len() == hd), "sums over the same rows");
        let grouped = grouped(at.written).min(n);
        let (mut lo, mut step) = (vec![0f32; hd], vec![0f32; hd]);
        let mut acc: [Vec<f32>; M] = std::array::from_fn(|_| vec![0f32; hd]);
        // The sink's positions are read from the sink, so group 0 weighs them 0.
        let sunk = SINK.min(grouped);
        let g0 = grouped.min(GROUP);
        let mut group0 = [[0f32; GROUP]; M];
        for ((p, o), g) in p.iter().zip(out.iter_mut()).zip(group0.iter_mut()) {
            plain::weighted_sum_f16(&p[..sunk], &self.sink(at.seq.sink)[col0..], self.kv_dim, o);
            g[sunk..g0].copy_from_slice(&p[sunk..g0]);
        }
        #[cfg(target_arch = "x86_64")]
        let simd =
            col0.is_multiple_of(N) && hd.is_multiple_of(N) && (N..=4 * N).contains(&hd) && crate::cpu::simd::avx2();
        let d = self.kv_dim;
        for g in 0..grouped.div_ceil(GROUP) {
            let pg: [&[f32]; M] = std::array::from_fn(|m| {
                if g == 0 { &group0[m][..g0] } else { &p[m][g * GROUP..grouped.min((g + 1) * GROUP)] }
            });
            let group = self.group(at.seq.pages[g]);
            let codes = &group[self.fmt.header_bytes(d)..];
            let sum_p: [f32; M] = std::array::from_fn(|m| pg[m].iter().sum());
            for a in acc.iter_mut() {
                a.fill(0.0);
            }
            self.head_header(group, col0, &mut lo, &mut step);
            #[cfg(target_arch = "x86_64")]
            if simd {
                let (at, rb) = (col0 / N * pack::packed_bytes(self.fmt.bits()), self.fmt.row_bytes(d));
                let (pgs, accs): (&[&[f32]], &mut [Vec<f32>]) = (&pg, &mut acc);
                // SAFETY: as in `scores`.
                unsafe {
                    let codes = codes.as_ptr().add(at);
                    match accs {
                        [a] => x86::code_sums(self.fmt.bits(), pgs[0], codes, rb, a),
                        [a0, a1] => x86::code_sums_pair(self.fmt.bits(), [pgs[0], pgs[1]], codes, rb, [a0, a1]),
                        _ => unreachable!("one or two probability vectors"),
                    }
                    for ((o, a), &sp) in out.iter_mut().zip(accs.iter()).zip(&sum_p) {
                        x86::add_group_values(&lo, &step, sp, a, o);
                    }
                }
                continue;
            }
            let mut u = [0u8; N];
            for ((o, a), (pg, &sp)) in out.iter_mut().zip(acc.iter_mut()).zip(pg.iter().zip(&sum_p)) {
                for (t, &w) in pg.iter().enumerate() {
                    self.for_codes(codes, t, col0, hd, &mut u, |x0, len, u| {
                        for (a, &c) in a[x0..x0 + len].iter_mut().zip(u) {
                            *a += w * c as f32;
                        }
                    });
                }
                for (((o, &a), &l), &s) in o.iter_mut().zip(a.iter()).zip(&lo).zip(&step) {
                    *o += l * sp + s * a;
                }
            }
        }
        for (p, o) in p.iter().zip(out.iter_mut()) {
            plain::weighted_sum_f16(&p[grouped..], &self.window(at.seq.slot)[col0..], self.kv_dim, o);
        }
    }

    /// Positions `0..at.written` as the loops read them (written·kv_dim values into `out`).
    pub fn dequantized(&self, at: &Placement, out: &mut [f32]) {
        let (d, n, grouped) = (self.kv_dim, at.written, grouped(at.written));
        let mut tmp = vec![0f32; GROUP * d];
        for g in 0..grouped / GROUP {
            self.fmt.dequantize_group(self.group(at.seq.pages[g]), d, &mut tmp);
            out[g * GROUP * d..(g + 1) * GROUP * d].copy_from_slice(&tmp);
        }
        for (o, h) in out[grouped * d..n * d].iter_mut().zip(self.window(at.seq.slot)) {
            *o = h.to_f32();
        }
        let sunk = SINK.min(grouped);
        for (o, h) in out[..sunk * d].iter_mut().zip(self.sink(at.seq.sink)) {
            *o = h.to_f32();
        }
    }

    /// The group of page `page`.
    pub(super) fn group(&self, page: u32) -> &[u8] {
        let (gb, g) = (self.fmt.group_bytes(self.kv_dim), page as usize);
        &self.groups[g * gb..(g + 1) * gb]
    }

    /// `lo` and `step` of columns col0..col0 + lo.len() of a group, decoded once a group and
    /// head for every reader ([`ChannelFormat::head_header`]; f16 pairs eight at a time
    /// where F16C is present: a scalar decode had cost a third of a per-channel V cache's
    /// decode time).
    pub(super) fn head_header(&self, group: &[u8], col0: usize, lo: &mut [f32], step: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.fmt.compact_header()
            && col0.is_multiple_of(8)
            && lo.len().is_multiple_of(8)
            && step.len() == lo.len()
            && crate::cpu::simd::avx2()
        {
            assert!(group.len() >= self.fmt.header_bytes(self.kv_dim) && col0 + lo.len() <= self.kv_dim);
            // SAFETY: AVX2 checked; the header's words and units for these columns are in
            // `group` (asserted); runs of 8 columns from a multiple of 8 stay in one block.
            unsafe { x86::compact_header(group.as_ptr(), self.kv_dim, col0, lo, step) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if !self.fmt.compact_header() && lo.len().is_multiple_of(8) && crate::cpu::simd::avx2() {
            let (l, s) = (&group[2 * col0..2 * (col0 + lo.len())], &group[2 * (self.kv_dim + col0)..]);
            assert!(step.len() == lo.len() && s.len() >= 2 * lo.len());
            // SAFETY: F16C checked; lo.len() f16 values at l and at s (asserted).
            unsafe { (x86::f16_to_f32(l.as_ptr(), lo), x86::f16_to_f32(s.as_ptr(), step)) };
            return;
        }
        self.fmt.head_header(group, self.kv_dim, col0, lo, step);
    }

    /// Calls `f(x offset, count, codes)` for the packed groups of 32 covering columns
    /// col0..col0 + n of row t of a group's codes.
    pub(super) fn for_codes(
        &self,
        codes: &[u8],
        t: usize,
        col0: usize,
        n: usize,
        u: &mut [u8; N],
        mut f: impl FnMut(usize, usize, &[u8]),
    ) {
        let (bits, pb) = (self.fmt.bits(), pack::packed_bytes(self.fmt.bits()));
        let row = &codes[t * self.fmt.row_bytes(self.kv_dim)..];
        let mut c = col0;
        while c < col0 + n {
            let (g, o) = (c / N, c % N);
            let len = (N - o).min(col0 + n - c);
            pack::unpack32(bits, &row[g * pb..], u);
            f(c - col0, len, &u[o..o + len]);
            c += len;
        }
    }
}

/// Of `written` positions, those before this one are in quantized groups.
pub(super) fn grouped(written: usize) -> usize {
    written / GROUP * GROUP
}

#[cfg(target_arch = "x86_64")]
#[path = "channel_x86.rs"]
mod x86;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RopeSpec;
    use crate::cpu::ops::rope_row;

    /// The eight-lane decode of compact headers gives the definition's bits for every word
    /// (each e and m, the not-finite mark) under units of several sizes, including 0.
    #[test]
    fn compact_headers_decode_as_defined() {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::simd::avx2() {
            let cols = 64;
            let fmt = ChannelFormat::Q3;
            let units = [0.0f32, 1.0, duet_quant::kv::channel_header::round_up_8_bits(0.0123), 3.5e3];
            for chunk in 0..65536 / cols {
                let mut group = vec![0u8; fmt.header_bytes(cols)];
                for c in 0..cols {
                    group[2 * c..2 * c + 2].copy_from_slice(&((chunk * cols + c) as u16).to_le_bytes());
                }
                for b in 0..cols / 32 {
                    let unit = units[(b + chunk) % units.len()];
                    group[2 * cols + 4 * b..2 * cols + 4 * b + 4].copy_from_slice(&unit.to_le_bytes());
                }
                let (mut lo, mut step) = (vec![0f32; cols], vec![0f32; cols]);
                let (mut lo1, mut step1) = (vec![0f32; cols], vec![0f32; cols]);
                fmt.head_header(&group, cols, 0, &mut lo, &mut step);
                // SAFETY: AVX2 checked; the whole header is in `group`.
                unsafe { x86::compact_header(group.as_ptr(), cols, 0, &mut lo1, &mut step1) };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!((bits(&lo1), bits(&step1)), (bits(&lo), bits(&step)), "words from {}", chunk * cols);
            }
        }
    }

    /// Scores and value sums over groups and window against the dequantized rows, for
    /// every width, aligned and unaligned heads, with a partial group in the window, rows
    /// stored in uneven batches, and the groups on pages out of order in the second of two
    /// sequence slots.
    #[test]
    fn loops_match_the_dequantized_cache() {
        let (n_pages, kv_dim) = (4, 128);
        let pages = [2, 0, 3];
        let seq = SeqPages { pages: &pages, slot: 1, sink: 1 };
        let len = 75; // two groups of 32 and 11 window rows
        // Offset channel 5 (as keys have), and an outlier row in channel 9 of group 0.
        let vals: Vec<f32> = (0..len * kv_dim)
            .map(|i| {
                let (r, c) = (i / kv_dim, i % kv_dim);
                let outlier = if (r, c) == (17, 9) { 300.0 } else { 0.0 };
                ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 3.0 + (c == 5) as u8 as f32 * 30.0 + outlier
            })
            .collect();
        let rope = RopeSpec { n_rot: 12, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None };
        for fmt in ChannelFormat::ALL {
            let mut c = ChannelRows::new(fmt, n_pages, 2, kv_dim).unwrap();
            for (a, b) in [(0, 7), (7, 40), (40, 41), (41, len)] {
                c.write(&seq, a, &vals[a * kv_dim..b * kv_dim]);
            }
            let at = Placement::new(seq, len);
            // What the cache holds: groups dequantized, the window as f16.
            let mut deq = vec![0f32; len * kv_dim];
            for g in 0..2 {
                let group = c.group(pages[g]);
                fmt.dequantize_group(group, kv_dim, &mut deq[g * GROUP * kv_dim..(g + 1) * GROUP * kv_dim]);
            }
            // The window's rows and the sink's (position 0) as f16.
            for p in (0..SINK).chain(64..len) {
                for i in 0..kv_dim {
                    deq[p * kv_dim + i] = f16::from_f32(vals[p * kv_dim + i]).to_f32();
                }
            }
            let mut read_back = vec![0f32; len * kv_dim];
            c.dequantized(&at, &mut read_back);
            assert_eq!(read_back, deq);
            // The other slot's window and sink and the unused page were not touched.
            assert!(c.window(0).iter().chain(c.sink(0)).all(|h| h.to_bits() == 0));
            assert!(c.group(1).iter().all(|&b| b == 0));
            for (col0, hd) in [(0, 64), (64, 64), (0, 128), (32, 96), (96, 32), (16, 16), (8, 40)] {
                let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.37).sin()).collect();
                let mut key_rope = KeyRope::new(&rope, hd);
                key_rope.reach(len);
                // The scaled query q·step is rounded to i16 per 32 channels at two levels: each
                // code (at most 2^bits − 1) meets an error of at most half a step of the second
                // level, whose range is half a step of the first (absmax/32767). Column 9's
                // outlier row gives its group a step ~100× the others': one level would miss
                // by ~1e-3 of the logits.
                let q_rounding: Vec<f32> = (0..2)
                    .map(|g| {
                        let (mut lo, mut step) = (vec![0f32; kv_dim], vec![0f32; kv_dim]);
                        fmt.header(c.group(pages[g]), kv_dim, &mut lo, &mut step);
                        let qs: Vec<f32> = q.iter().zip(&step[col0..]).map(|(a, b)| a * b).collect();
                        let top = fmt.top() as f32;
                        let amax = |ch: &[f32]| ch.iter().fold(0f32, |m, v| m.max(v.abs()));
                        qs.chunks(N).map(|ch| ch.len() as f32 * top * amax(ch) / 65534.0 / 32767.0).sum::<f32>() * 0.5
                    })
                    .collect();
                for n in [1, 31, 32, 33, 64, len] {
                    let mut got = vec![0f32; n];
                    c.scores(&at, &q, col0, 0.5, None, &mut got);
                    for (j, g) in got.iter().enumerate() {
                        let k = &deq[j * kv_dim + col0..j * kv_dim + col0 + hd];
                        let want: f32 = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * 0.5;
                        let tol = 2e-6 * (1.0 + want.abs()) + q_rounding.get(j / GROUP).copied().unwrap_or(0.0);
                        assert!(
                            (g - want).abs() <= tol,
                            "{fmt:?} {col0}+{hd} n={n} row {j}: {g} vs {want} (tol {tol})"
                        );
                    }
                    // The same keys read as stored before RoPE: each rotated by its position
                    // (here 12 of every head's dims, the rest unrotated, as partial RoPE).
                    // The f32 products differ in order from the reference's; the integer
                    // path's query rounding is not involved.
                    c.scores(&at, &q, col0, 0.5, Some(&key_rope), &mut got);
                    for (j, g) in got.iter().enumerate() {
                        let mut k = deq[j * kv_dim + col0..j * kv_dim + col0 + hd].to_vec();
                        rope_row(&mut k, 1, hd, j, &rope.thetas(), rope.freq_scale);
                        let want: f32 = q.iter().zip(&k).map(|(a, b)| a * b).sum::<f32>() * 0.5;
                        let mag: f32 = q.iter().zip(&k).map(|(a, b)| (a * b).abs()).sum::<f32>();
                        assert!(
                            (g - want).abs() <= 4e-7 * mag,
                            "{fmt:?} before RoPE {col0}+{hd} n={n} row {j}: {g} vs {want} (Σ|q·k| {mag})"
                        );
                    }
                    let p: Vec<f32> = (0..n).map(|j| 1.0 / (j + 2) as f32).collect();
                    let mut out = vec![0.25f32; hd];
                    c.weighted_sum(&at, &p, col0, &mut out);
                    super::super::cache::assert_pair_is_each_alone(
                        &p,
                        hd,
                        |p, o| c.weighted_sum(&at, p, col0, o),
                        |p, o| c.weighted_sum_pair(&at, p, col0, o),
                        &format!("{fmt:?} {col0}+{hd} n={n}"),
                    );
                    for (i, o) in out.iter().enumerate() {
                        let want: f32 = 0.25 + (0..n).map(|j| p[j] * deq[j * kv_dim + col0 + i]).sum::<f32>();
                        assert!(
                            (o - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{fmt:?} {col0}+{hd} n={n} col {i}: {o} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
