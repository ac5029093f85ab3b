//! CPU activations and weights.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use duet_quant::GgmlType;
use duet_quant::gemm::PackedMatrix;
use duet_quant::gguf::GgufFile;

/// `rows × cols` f32 activations. `version` changes on every write, so quantized copies of
/// the activations can be cached and reused by the several matmuls that read them.
pub struct CpuTensor {
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
    pub version: u64,
}

static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);

impl CpuTensor {
    pub fn new(rows: usize, cols: usize) -> CpuTensor {
        CpuTensor { data: vec![0.0; rows * cols], rows, cols, version: fresh_version() }
    }

    /// The rows in use.
    pub fn view(&self) -> &[f32] {
        &self.data[..self.rows * self.cols]
    }

    /// Mutable rows in use; marks the tensor as changed.
    pub fn view_mut(&mut self) -> &mut [f32] {
        self.version = fresh_version();
        let n = self.rows * self.cols;
        &mut self.data[..n]
    }

    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

pub fn fresh_version() -> u64 {
    NEXT_VERSION.fetch_add(1, Ordering::Relaxed)
}

/// Where a weight's bytes live.
pub enum Storage {
    /// Inside the model file's memory map (no copy).
    Mapped { file: Arc<GgufFile>, start: usize, len: usize },
    /// Converted at load (f32 copies of small vectors, repacked matrices).
    Owned(Vec<u8>),
}

pub struct CpuWeight {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub storage: Storage,
    /// 1-D weights (norms, biases) as f32, ready to use.
    pub f32_values: Option<Vec<f32>>,
    /// The matrix repacked for the packed matmul kernels ([`duet_quant::gemm`]): done at load
    /// for every matrix but the token embedding, which is packed at its first matmul (only
    /// when the output projection is tied to it). `None` inside: this matrix keeps the per-row
    /// kernels.
    pub packed: OnceLock<Option<PackedMatrix>>,
}

impl CpuWeight {
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mapped { file, start, len } => &file.bytes()[*start..*start + *len],
            Storage::Owned(v) => v,
        }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        duet_quant::row_bytes(self.ty, self.cols).expect("weight rows are whole blocks")
    }

    /// The values of a vector weight (norm, bias, λ) as f32.
    pub fn values(&self) -> &[f32] {
        self.f32_values.as_deref().expect("vector weights are converted to f32 at load")
    }
}
