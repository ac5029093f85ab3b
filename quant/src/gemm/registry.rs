//! The packed kernel sets by instruction set ([`GemmKernels`]) and the process's choice of
//! one ([`gemm_kernels`], [`choose_gemm_kernels`]).

use std::ops::Range;
use std::sync::OnceLock;

use super::*;
use crate::GgmlType;

/// Computes the rows of `groups` for every token of `acts`: `out[t·ld + r]`.
pub(super) type GemmFn = unsafe fn(&PackedMatrix, &QActs, Range<usize>, *mut f32, usize);

/// One set of packed kernels (one instruction set), by weight type.
#[derive(Clone, Copy)]
pub struct GemmKernels {
    /// "avx512vnni", "avx2+avxvnni", "avx2" or "portable".
    pub name: &'static str,
    /// Whether this set's kernel for a weight type reads two-level pairs' merged activations.
    pub(super) reads_merged: fn(GgmlType) -> bool,
    pub(super) q4_0: GemmFn,
    pub(super) q4_1: GemmFn,
    pub(super) q5_0: GemmFn,
    pub(super) q5_1: GemmFn,
    pub(super) q8_0: GemmFn,
    pub(super) q4_k: GemmFn,
    pub(super) q5_k: GemmFn,
    pub(super) q6_k: GemmFn,
    pub(super) f16: GemmFn,
    pub(super) bf16: GemmFn,
    /// Whether this set is worth using over the per-row kernels (the portable one is a
    /// reference, not a speed-up).
    pub fast: bool,
}

impl std::fmt::Debug for GemmKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GemmKernels({})", self.name)
    }
}

/// Errors from [`GemmKernels::gemm`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GemmError {
    #[error("activations are {got:?}, {ty} weights need {want:?}")]
    WrongActivation { ty: GgmlType, got: ActKind, want: ActKind },
    #[error("activation rows have {got} columns, the weight rows {want}")]
    Width { got: usize, want: usize },
    #[error("groups {0:?} outside the matrix")]
    Groups(Range<usize>),
    #[error("output holds {got} values, {want} needed")]
    Output { got: usize, want: usize },
}

impl GemmKernels {
    pub(super) fn get(&self, ty: GgmlType) -> GemmFn {
        match ty {
            GgmlType::Q4_0 => self.q4_0,
            GgmlType::Q4_1 => self.q4_1,
            GgmlType::Q5_0 => self.q5_0,
            GgmlType::Q5_1 => self.q5_1,
            GgmlType::Q8_0 => self.q8_0,
            GgmlType::Q4_K => self.q4_k,
            GgmlType::Q5_K => self.q5_k,
            GgmlType::Q6_K => self.q6_k,
            GgmlType::F16 => self.f16,
            GgmlType::BF16 => self.bf16,
            _ => unreachable!("a PackedMatrix has a packable type"),
        }
    }

    /// Whether this set's kernel for `ty` reads the merged activations of two-level batches
    /// (see [`QActs::add_merged`]); without them it takes a slower form with the same results.
    pub fn reads_merged(&self, ty: GgmlType) -> bool {
        (self.reads_merged)(ty)
    }

    pub(super) fn check(&self, w: &PackedMatrix, acts: &QActs, groups: &Range<usize>) -> Result<(), GemmError> {
        let want = ActKind::for_weight(w.ty).expect("packable types have an activation kind");
        if acts.kind != want {
            return Err(GemmError::WrongActivation { ty: w.ty, got: acts.kind, want });
        }
        if acts.cols != w.cols {
            return Err(GemmError::Width { got: acts.cols, want: w.cols });
        }
        if groups.start > groups.end || groups.end > w.groups() {
            return Err(GemmError::Groups(groups.clone()));
        }
        Ok(())
    }

    /// `out[t·rows + r] = Σ_k W[r][k]·x[t][k]` for all rows and tokens, on this thread
    /// (two-level activations: one output row per token, the sum of its pair's products).
    pub fn gemm(&self, w: &PackedMatrix, acts: &QActs, out: &mut [f32]) -> Result<(), GemmError> {
        self.check(w, acts, &(0..w.groups()))?;
        let want = acts.tokens() * w.rows;
        if out.len() < want {
            return Err(GemmError::Output { got: out.len(), want });
        }
        // SAFETY: checked shapes; `out` holds tokens()·rows values and is borrowed mutably.
        unsafe { (self.get(w.ty))(w, acts, 0..w.groups(), out.as_mut_ptr(), w.rows) };
        Ok(())
    }

    /// The rows of `groups` (rows 16·g.., clipped to the matrix) for every token:
    /// `out[t·ld + r]` (as [`GemmKernels::gemm`]). For splitting one matmul over threads.
    ///
    /// # Safety
    /// `out` must be valid for writes of `out[t·ld + r]` for every token t < `acts.tokens()`
    /// and every row r of `groups`, and no other thread may access those elements during
    /// the call. `ld` must be at least `w.rows()`.
    pub unsafe fn gemm_groups(
        &self,
        w: &PackedMatrix,
        acts: &QActs,
        groups: Range<usize>,
        out: *mut f32,
        ld: usize,
    ) -> Result<(), GemmError> {
        self.check(w, acts, &groups)?;
        assert!(ld >= w.rows, "output stride {ld} < rows {}", w.rows);
        // SAFETY: shapes checked; the caller guarantees the output region.
        unsafe { (self.get(w.ty))(w, acts, groups, out, ld) };
        Ok(())
    }
}

static CHOSEN_GEMM: OnceLock<Option<GemmKernels>> = OnceLock::new();

/// Whether a program named a tuning variant ([`choose_gemm_kernels`]): then it is the only
/// candidate ([`gemm_candidates`]) and nothing is timed.
static PINNED_GEMM: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// [`gemm_candidates`]'s list, made at its first call.
static CANDIDATES: OnceLock<Vec<GemmKernels>> = OnceLock::new();

/// The packed kernel set of this process: the fastest this CPU has if any beats the
/// per-row kernels, or what [`choose_gemm_kernels`] chose (decided once, at first use).
pub fn gemm_kernels() -> Option<&'static GemmKernels> {
    CHOSEN_GEMM.get_or_init(|| available().into_iter().find(|k| k.fast)).as_ref()
}

/// A program's choice of packed kernels for the rest of the process: `"off"` (the per-row
/// kernels only), a set's name (`"avx512vnni"`, `"avx2"`, `"portable"`; [`available`] lists
/// this CPU's; its tuning variants stay [`gemm_candidates`]) or a tuning variant's
/// (`"avx2/n4c1,1"`, [`variants`]; then the only candidate). Refused for a name this CPU
/// cannot run, and once kernels were used.
pub fn choose_gemm_kernels(name: &str) -> Result<(), String> {
    let all = available();
    let chosen = match name {
        "off" => None,
        _ => Some(all.iter().chain(&variants()).find(|k| k.name == name).copied().ok_or_else(|| {
            let names: Vec<&str> = all.iter().chain(&variants()).map(|k| k.name).collect();
            format!("no packed matmul kernels named {name:?} on this CPU (it has: off, {})", names.join(", "))
        })?),
    };
    let want = chosen.map(|k| k.name);
    let pin = name.contains('/');
    let used = CANDIDATES.get().is_some_and(|c| c.len() > 1) && pin;
    if used || (CHOSEN_GEMM.set(chosen).is_err() && gemm_kernels().map(|k| k.name) != want) {
        return Err("the packed matmul kernels were chosen before".into());
    }
    PINNED_GEMM.store(pin, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// The packed kernel sets a program may pick among, per weight type, for speed alone: the
/// process's set ([`gemm_kernels`]) first, then its tuning variants (the same instruction
/// set with other token tiles and accumulation chains: integer sums in another order, so the
/// same bits; `tests.rs` holds them to it). Only the process's set when a program named a
/// variant ([`choose_gemm_kernels`]); empty without packed kernels. Other instruction sets
/// are not candidates: their results may differ in the last bit (Q4_K on plain AVX2 rounds a
/// super-block's integer once, where VNNI's sums are exact).
pub fn gemm_candidates() -> &'static [GemmKernels] {
    CANDIDATES.get_or_init(|| {
        let Some(first) = gemm_kernels() else { return Vec::new() };
        let mut v = vec![*first];
        if !PINNED_GEMM.load(std::sync::atomic::Ordering::Relaxed) {
            v.extend(variants().into_iter().filter(|k| variant_of(k.name, first.name)));
        }
        v
    })
}

/// Whether the set named `variant` is a tuning variant of the set named `base` ("avx2/n4c1,1"
/// of "avx2").
pub fn variant_of(variant: &str, base: &str) -> bool {
    variant.strip_prefix(base).is_some_and(|rest| rest.starts_with('/'))
}

/// Alternative tunings (tile size, accumulation chains) of the sets this CPU can run, for
/// benchmarks and tests; never picked by [`gemm_kernels`].
pub fn variants() -> Vec<GemmKernels> {
    #[cfg(target_arch = "x86_64")]
    return x86::variants();
    #[cfg(not(target_arch = "x86_64"))]
    Vec::new()
}

/// Every packed kernel set this CPU can run, fastest first (the portable one last).
pub fn available() -> Vec<GemmKernels> {
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    v.extend(x86::available());
    v.push(portable::KERNELS);
    v
}
