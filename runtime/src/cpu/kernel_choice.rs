//! Which CPU kernels this process runs. The library picks the fastest this CPU has; a
//! program may choose otherwise once, before any model work (the `duet` CLI reads
//! `DUET_FORCE_SCALAR`, `DUET_GEMM` and `DUET_ATTN_SIMD`, documented in its `--help`, and
//! passes them here: no library code reads the environment).

use crate::error::RuntimeError;

/// A program's choice of CPU kernels (the default: the fastest of each).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelChoice {
    /// The scalar reference dot kernels instead of the SIMD ones.
    pub scalar_dots: bool,
    /// Packed matmul kernels: `None` the fastest; `"off"` none (per-row dot kernels); a set
    /// by name (`"avx2"`, `"avx512vnni"`, `"portable"`; its tuning variants still timed per
    /// weight type, [`super::GemmChoice`]); or one variant, untimed (`"avx2/n4c1,1"`).
    pub gemm: Option<String>,
    /// Attention's logits in 8 lanes (AVX2) even on an AVX-512 CPU.
    pub attention_avx2: bool,
}

/// Makes `choice` the kernels of the rest of this process. Refused (an error, nothing
/// changed for that part) when a set was already in use, or a named set is not on this CPU.
pub fn choose_kernels(choice: &KernelChoice) -> Result<(), RuntimeError> {
    if choice.scalar_dots {
        duet_quant::dot::use_scalar_kernels().map_err(|e| RuntimeError::Usage(e.to_string()))?;
    }
    if let Some(name) = &choice.gemm {
        duet_quant::gemm::choose_gemm_kernels(name).map_err(RuntimeError::Usage)?;
    }
    if choice.attention_avx2 {
        super::attention::keep_to_avx2().map_err(|e| RuntimeError::Usage(e.to_string()))?;
    }
    Ok(())
}
