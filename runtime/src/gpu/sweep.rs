//! Timing the decode matvec's variants on an adapter (`duet bench --gpu-kernels`): every
//! workgroup shape, with and without subgroup sums, with and without trusted modules, on
//! the matrix shapes of a 1.1B and an 8B Llama, so that one run on a GPU machine shows which
//! variant each weight type wants there (device time is short: see `gpu_speed.sh`).
//!
//! Each timing is a pass of back-to-back dispatches of one matvec, timed by the pass's own
//! timestamps (none between dispatches), over copies of the matrix spread through a pool
//! larger than any GPU's last-level cache, so that the weights stream from memory as in a
//! decoded token (a matrix read again from cache would time the cache). The dispatches
//! write one output, so each waits for the one before, as in a model.

use std::sync::Arc;

use duet_quant::GgmlType;
use duet_shaders::MvShape;

use super::buffers::{Chunk, GpuWeight};
use super::{AdapterChoice, GpuBackend, GpuOptions, GpuTune};
use crate::backend::Backend;
use crate::error::RuntimeError;

/// A weight matrix shape to time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatvecCase {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// What it stands for ("1.1B q", "8B down", …).
    pub what: &'static str,
}

/// The matrices of a decoded token of TinyLlama-1.1B (q and o 2048², k and v 256 × 2048,
/// gate and up 5632 × 2048, down 2048 × 5632, the Q6_K output of Q4_K_M files) and of
/// Llama-3-8B (q and o 4096², gate and up 14336 × 4096, down 4096 × 14336), in the types of
/// the Q4_0, Q4_K_M and Q8_0 files.
pub fn llama_cases() -> Vec<MatvecCase> {
    let mut v = Vec::new();
    for ty in [GgmlType::Q4_0, GgmlType::Q4_K] {
        for (rows, cols, what) in [
            (2048, 2048, "1.1B q, o"),
            (256, 2048, "1.1B k, v"),
            (5632, 2048, "1.1B gate, up"),
            (2048, 5632, "1.1B down"),
            (4096, 4096, "8B q, o"),
            (14336, 4096, "8B gate, up"),
            (4096, 14336, "8B down"),
        ] {
            v.push(MatvecCase { ty, rows, cols, what });
        }
    }
    v.push(MatvecCase { ty: GgmlType::Q6_K, rows: 2048, cols: 5632, what: "1.1B down (Q4_K_M)" });
    v.push(MatvecCase { ty: GgmlType::Q6_K, rows: 32000, cols: 2048, what: "1.1B output (Q4_K_M)" });
    v.push(MatvecCase { ty: GgmlType::Q8_0, rows: 2048, cols: 2048, what: "1.1B q, o" });
    v.push(MatvecCase { ty: GgmlType::Q8_0, rows: 5632, cols: 2048, what: "1.1B gate, up" });
    v
}

/// One variant's time on one case.
#[derive(Clone, Debug)]
pub struct MatvecTiming {
    pub case: MatvecCase,
    pub shape: MvShape,
    pub trusted: bool,
    /// GPU seconds per dispatch (the pass's time over its dispatches).
    pub seconds: f64,
}

impl MatvecTiming {
    /// Weight bytes read per second.
    pub fn bytes_per_second(&self) -> f64 {
        let row_bytes = duet_quant::row_bytes(self.case.ty, self.case.cols).unwrap_or(0);
        (self.case.rows * row_bytes) as f64 / self.seconds
    }
}

/// Bytes of each weight pool of a full sweep: larger than an H200's 60 MB of L2, so that the
/// copies a pass cycles through are not all cached.
pub const POOL_BYTES: usize = 256 << 20;

/// A pool of `bytes` of quantized random weights of `ty` with rows of `cols`: 4 MiB
/// quantized on the host (values of spread 1), repeated.
fn pool_bytes(ty: GgmlType, cols: usize, bytes: usize) -> Result<Vec<u8>, RuntimeError> {
    let row_bytes = duet_quant::row_bytes(ty, cols).ok_or_else(|| RuntimeError::Usage(format!("{ty}: {cols}")))?;
    let rows = ((4 << 20) / row_bytes).clamp(1, bytes / row_bytes.max(1)).max(1);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ cols as u64;
    let vals: Vec<f32> = (0..rows * cols)
        .map(|_| {
            // xorshift, then a sum of uniforms: roughly normal, never all zeros.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let u = (seed >> 40) as f32 / (1u64 << 24) as f32;
            (u - 0.5) * 3.4
        })
        .collect();
    let mut tile = vec![0u8; rows * row_bytes];
    duet_quant::quantize(ty, &vals, cols, &mut tile).map_err(|e| RuntimeError::Usage(format!("{ty}: {e}")))?;
    Ok(tile.iter().copied().cycle().take(bytes.max(tile.len())).collect())
}

impl GpuBackend {
    /// Seconds per dispatch of `dispatches` matvecs of `case` in `shape`, cycling through
    /// the copies of the matrix in `pool` (a buffer of `case`'s type and row length).
    fn time_matvec(
        &mut self,
        case: &MatvecCase,
        ty: GgmlType,
        pool: &Arc<super::buffers::Buf>,
        shape: MvShape,
        dispatches: usize,
    ) -> Result<f64, RuntimeError> {
        let row_bytes = duet_quant::row_bytes(case.ty, case.cols).expect("checked by pool_bytes");
        let size = (case.rows * row_bytes).next_multiple_of(16);
        let copies = (pool.size as usize - super::buffers::WEIGHT_PAD) / size;
        let x = self.new_tensor(1, case.cols);
        let out = self.new_tensor(1, case.rows);
        let xs: Vec<f32> = (0..case.cols).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        self.upload(&x, &xs);
        // Compiled, bound and run once before the timed pass.
        let weight = |i: usize| GpuWeight {
            ty,
            rows: case.rows,
            cols: case.cols,
            row_bytes,
            chunks: vec![Chunk { row0: 0, rows: case.rows, buf: Arc::clone(pool), w_off: (i % copies.max(1)) * size }],
        };
        for i in 0..copies.clamp(1, 64) {
            super::matmul::matvec_store_shaped(self, shape, &weight(i), &x, &out);
        }
        self.read_rows(&out, 0..1)?;
        self.take_kernel_times();
        for i in 0..dispatches {
            super::matmul::matvec_store_shaped(self, shape, &weight(i), &x, &out);
        }
        self.read_rows(&out, 0..1)?;
        let times = self.take_kernel_times().unwrap_or_default();
        let (calls, secs) = times
            .iter()
            .filter(|t| t.kernel.starts_with("matvec-"))
            .fold((0, 0.0), |(c, s), t| (c + t.calls, s + t.seconds));
        if calls != dispatches as u64 || secs <= 0.0 {
            return Err(RuntimeError::Device(format!("the kernel sweep timed {calls} of {dispatches} dispatches")));
        }
        Ok(secs / calls as f64)
    }
}

/// Times every matvec shape on every case (`dispatches` a pass, the weights cycling through
/// pools of `pool` bytes), with subgroup sums (where the adapter has them) and without, and
/// with trusted modules; `progress` hears of each configuration.
pub fn matvec_sweep(
    adapter: AdapterChoice,
    cases: &[MatvecCase],
    dispatches: usize,
    pool: usize,
    mut progress: impl FnMut(&str),
) -> Result<Vec<MatvecTiming>, RuntimeError> {
    // The host's pools, once for all configurations: one per (type, row length).
    let mut pools: Vec<((GgmlType, usize), Vec<u8>)> = Vec::new();
    for case in cases {
        super::buffers::weight_type(case.ty)
            .ok_or_else(|| RuntimeError::Unsupported(format!("no GPU kernels for {}", case.ty)))?;
        if !pools.iter().any(|(k, _)| *k == (case.ty, case.cols)) {
            let row_bytes = duet_quant::row_bytes(case.ty, case.cols).unwrap_or(0);
            let bytes = pool.max(case.rows * row_bytes + 16 + super::buffers::WEIGHT_PAD);
            pools.push(((case.ty, case.cols), pool_bytes(case.ty, case.cols, bytes)?));
        }
    }
    let mut out = Vec::new();
    for (subgroups, trusted) in [(true, false), (true, true), (false, false)] {
        let tune = GpuTune { subgroups: Some(subgroups), trusted: Some(trusted), ..Default::default() };
        let opts = GpuOptions {
            adapter,
            profile: true,
            profile_passes: true,
            submit_every: Some(usize::MAX),
            tune,
            ..Default::default()
        };
        let mut b = match GpuBackend::new(&opts) {
            Ok(b) => b,
            Err(e) if subgroups => {
                progress(&format!("no subgroup variants: {e}"));
                continue;
            }
            Err(e) => return Err(e),
        };
        progress(&format!("{} (subgroups {subgroups}, trusted {trusted})", b.describe()));
        let mut bufs: Vec<((GgmlType, usize), Arc<super::buffers::Buf>)> = Vec::new();
        for ((key, bytes), _) in pools.iter().map(|(k, v)| ((k, v), ())) {
            let buf = b.ctx.checked("the kernel sweep's weights", || b.alloc.init(&b.ctx, bytes, "sweep pool"))?;
            bufs.push((*key, buf));
        }
        for case in cases {
            let ty = super::buffers::weight_type(case.ty).expect("checked above");
            let pool = Arc::clone(&bufs.iter().find(|(k, _)| *k == (case.ty, case.cols)).expect("made above").1);
            for wg in MvShape::WGS {
                for rows in MvShape::ROWS {
                    let shape = MvShape { wg, rows, subgroups };
                    let seconds = b.time_matvec(case, ty, &pool, shape, dispatches)?;
                    out.push(MatvecTiming { case: *case, shape, trusted, seconds });
                }
            }
        }
    }
    Ok(out)
}
