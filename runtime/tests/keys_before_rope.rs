//! K caches that store keys before RoPE (`q4c`, `q3c`, `q2c`: `CacheFormat::keys_before_rope`)
//! on the CPU backend: the attention step stores the keys it is given, unrotated, and
//! rotates each as it reads it. Keys that are the same vector at every position (plus a
//! little noise) show it: before RoPE each channel's group spans only the noise, so 4, 3 or
//! 2 bits reproduce it closely; after RoPE each channel pair sweeps a circle over the
//! positions of a group, which few levels cannot follow; rotated twice, the scores are wrong.

use duet_runtime::backend::{AttentionKind, AttentionSpec, Backend, RopeSpec, SeqSpan};
use duet_runtime::cpu::CpuBackend;
use duet_runtime::kv_cache::{CacheFormat, KvCacheSpec};
use duet_runtime::kv_pages::{PAGE, SeqPages, pages_for};

struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn take(&mut self, n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * amp).collect()
    }
}

const H: usize = 4;
const HKV: usize = 2;
const HD: usize = 64;
/// A prompt of 40 positions, one decoded, then 34 more: two complete groups of 32 (group 0
/// with its sink) and 11 positions in the f16 window.
const STEPS: [usize; 3] = [40, 1, 34];

/// Attention outputs of every step, K cached as `kt` (V in f32), the keys before RoPE
/// `k_pre` (positions × HKV·HD).
fn outputs(kt: CacheFormat, q: &[f32], k_pre: &[f32], v: &[f32], rope: &RopeSpec) -> Vec<f32> {
    let spec = AttentionSpec {
        kind: AttentionKind::Standard,
        n_heads: H,
        n_kv_heads: HKV,
        head_dim: HD,
        scale: (HD as f32).powf(-0.5),
        rms_eps: 1e-5,
        logit_quant: None,
    };
    let n_ctx: usize = STEPS.iter().sum();
    let kv = KvCacheSpec {
        n_layers: 1,
        n_ctx,
        n_seqs: 1,
        kv_dim: HKV * HD,
        head_dim: HD,
        k_type: kt,
        v_type: CacheFormat::F32,
    };
    let mut b = CpuBackend::new(2);
    let mut cache = b.new_kv_cache(&kv).unwrap();
    let pages: Vec<u32> = (0..pages_for(n_ctx) as u32).collect();
    assert!(pages.len() * PAGE >= n_ctx);
    let seq = SeqPages { pages: &pages, slot: 0, sink: 0 };
    let (mut pos0, mut all) = (0, Vec::new());
    for n in STEPS {
        let rows = |x: &[f32], cols: usize| x[pos0 * cols..(pos0 + n) * cols].to_vec();
        let mut qt = b.new_tensor(n, H * HD);
        qt.data.copy_from_slice(&rows(q, H * HD));
        let mut kt = b.new_tensor(n, HKV * HD);
        kt.data.copy_from_slice(&rows(k_pre, HKV * HD));
        let mut vt = b.new_tensor(n, HKV * HD);
        vt.data.copy_from_slice(&rows(v, HKV * HD));
        let mut out = b.new_tensor(n, H * HD);
        b.attention(
            &mut qt,
            &mut kt,
            &vt,
            &mut cache,
            0,
            &[SeqSpan::whole(seq, n, pos0, &spec)],
            Some(rope),
            None,
            &mut out,
        );
        all.extend_from_slice(&out.data[..n * H * HD]);
        pos0 += n;
    }
    all
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w as f64).powi(2)).sum();
    let den: f64 = want.iter().map(|&w| (w as f64).powi(2)).sum();
    num / den
}

#[test]
fn keys_before_rope_are_stored_unrotated_and_rotated_as_read() {
    let rope = RopeSpec { n_rot: HD, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None };
    let n: usize = STEPS.iter().sum();
    let mut rng = Rng(7);
    let q = rng.take(n * H * HD, 2.0);
    let v = rng.take(n * HKV * HD, 1.0);
    let key = rng.take(HKV * HD, 2.0);
    let noise = rng.take(n * HKV * HD, 0.02);
    let k_pre: Vec<f32> = noise.iter().enumerate().map(|(i, e)| key[i % (HKV * HD)] + e).collect();
    let exact = outputs(CacheFormat::F32, &q, &k_pre, &v, &rope);
    assert!([CacheFormat::Q4c, CacheFormat::Q3c, CacheFormat::Q2c].iter().all(|t| t.keys_before_rope()));
    assert!(!CacheFormat::Q6c.keys_before_rope());
    // Measured (Zen 4, 2026-11-28): q4c 4.3e-7, q3c 1.6e-5, q2c 1.7e-5; the same keys stored
    // after RoPE and rotated again as read: 0.31 (q3c) and 0.29 (q2c). q6c stores keys after
    // RoPE: 3.5e-5, its 64 levels spread over each pair's circle (q4c did so, 6.5e-4). These
    // keys are the compact headers' hard case (duet_quant::kv::channel_header): a channel's
    // offset (σ 2) some 140 steps from zero over a spread of 0.1 at 3 bits, past the 255
    // quarter steps a bottom may lie, so both widths take the step that reaches it (with f16
    // bottoms q3c gave 1.3e-6, q2c 5.9e-6).
    for (kt, bound) in [(CacheFormat::Q4c, 8e-7), (CacheFormat::Q3c, 3e-5), (CacheFormat::Q2c, 3e-5)] {
        let e = nmse(&outputs(kt, &q, &k_pre, &v, &rope), &exact);
        eprintln!("K {kt}: nmse {e:.3e} against an f32 K cache");
        assert!(e <= bound, "K {kt}: nmse {e:.3e} against an f32 K cache (bound {bound:.0e})");
    }
    let e = nmse(&outputs(CacheFormat::Q6c, &q, &k_pre, &v, &rope), &exact);
    eprintln!("K q6c (keys after RoPE): nmse {e:.3e} against an f32 K cache");
    assert!((2e-5..=7e-5).contains(&e), "K q6c (keys after RoPE): nmse {e:.3e} against an f32 K cache");
}
