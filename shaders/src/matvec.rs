//! The decode matrix-vector kernel's compile-time shape and epilogues, and its WGSL.
//!
//! One token times a weight matrix reads every weight byte once and does two flops per
//! weight: it runs at the speed of memory when a warp's lanes read neighbouring bytes, when
//! enough loads are in flight and when little else runs. The kernel (`wgsl/matvec.wgsl`)
//! gives each workgroup [`MvShape::rows`] weight rows and walks their bytes in *slots* of 16
//! values (`wgsl/matvec_slots/`): consecutive threads take consecutive slots, so a warp reads
//! a run of contiguous bytes of each row, and each slot's activations are loaded once for
//! all the rows. The partial sums meet through subgroup adds where the adapter has them,
//! else a tree in workgroup memory.
//!
//! The epilogue folds the op that follows a product into its last step, one dispatch
//! instead of two or three: the residual add (attn_output, ffn_down), SwiGLU over the gate
//! and up rows of one group, and the split of one group's rows into the q, k, v (and DIFF
//! V2 λ) outputs.

use std::fmt;

use crate::GgmlType;

/// Workgroup shape of the matvec kernel: `wg` threads over `rows` weight rows, their partial
/// sums reduced with subgroup operations (`subgroups`, needs the SUBGROUP feature) or in
/// workgroup memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MvShape {
    pub wg: u32,
    pub rows: u32,
    pub subgroups: bool,
}

impl MvShape {
    /// Workgroup sizes a shape may have.
    pub const WGS: [u32; 4] = [32, 64, 128, 256];
    /// Rows per workgroup a shape may have.
    pub const ROWS: [u32; 3] = [1, 2, 4];

    /// The default on hardware (`true`) or software adapters. A GPU wants a warp's lanes on
    /// neighbouring bytes and several rows per workgroup, so that the activations are
    /// loaded once for all of them (llama.cpp's Vulkan matvec: 2 to 4 rows). lavapipe runs
    /// a workgroup's threads as SIMD lanes and pays for every reduction step: small
    /// workgroups of several rows suit it.
    pub const fn default_for(hardware: bool, subgroups: bool) -> MvShape {
        if hardware { MvShape { wg: 128, rows: 2, subgroups } } else { MvShape { wg: 32, rows: 4, subgroups } }
    }

    /// Parses "WGxROWS" (e.g. "128x2"); `subgroups` is set apart.
    pub fn parse(s: &str, subgroups: bool) -> Result<MvShape, String> {
        let bad = || {
            format!(
                "'{s}' is not a matvec shape: WGxROWS with WG one of {:?} and ROWS one of {:?} (e.g. 128x2)",
                MvShape::WGS,
                MvShape::ROWS
            )
        };
        let (wg, rows) = s.split_once('x').ok_or_else(bad)?;
        let wg: u32 = wg.trim().parse().map_err(|_| bad())?;
        let rows: u32 = rows.trim().parse().map_err(|_| bad())?;
        if !MvShape::WGS.contains(&wg) || !MvShape::ROWS.contains(&rows) {
            return Err(bad());
        }
        Ok(MvShape { wg, rows, subgroups })
    }

    /// Every shape (the kernel sweeps of `duet bench --gpu-kernels` walk them).
    pub fn all(subgroups: bool) -> Vec<MvShape> {
        let mut v = Vec::new();
        for wg in MvShape::WGS {
            for rows in MvShape::ROWS {
                v.push(MvShape { wg, rows, subgroups });
            }
        }
        v
    }
}

impl fmt::Display for MvShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}{}", self.wg, self.rows, if self.subgroups { "" } else { "-nosub" })
    }
}

/// What the matvec does with its dot products (`s` below; row `r` of the output).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MvEpilogue {
    /// `O[r] = s`.
    Store,
    /// `O[r] += s`: the residual add after attn_output and ffn_down.
    Add,
    /// `O[r] = silu(s_gate) · s_up`: gate and up, two matrices of one group with the same
    /// rows, in one pass over the activations.
    SwiGlu,
    /// The rows of up to four matrices of one group (q, k, v and DIFF V2's λ), each into its
    /// own output.
    Split,
}

impl MvEpilogue {
    pub const ALL: [MvEpilogue; 4] = [MvEpilogue::Store, MvEpilogue::Add, MvEpilogue::SwiGlu, MvEpilogue::Split];

    pub fn name(self) -> &'static str {
        match self {
            MvEpilogue::Store => "store",
            MvEpilogue::Add => "add",
            MvEpilogue::SwiGlu => "swiglu",
            MvEpilogue::Split => "split",
        }
    }

    /// The WGSL constant `EPI` the kernel branches on.
    fn code(self) -> u32 {
        match self {
            MvEpilogue::Store => 0,
            MvEpilogue::Add => 1,
            MvEpilogue::SwiGlu => 2,
            MvEpilogue::Split => 3,
        }
    }
}

/// Outputs a [`MvEpilogue::Split`] matvec writes at most (bindings O0..O3).
pub const MV_MAX_SPLIT: usize = 4;

/// The slot reader of a weight type: its own where one is written (the types of the
/// common GGUF mixes), else the generic one over `decode4`, correct for every type.
fn slots(t: GgmlType) -> &'static str {
    match t {
        GgmlType::Q4_0 => include_str!("wgsl/matvec_slots/q4_0.wgsl"),
        GgmlType::Q8_0 => include_str!("wgsl/matvec_slots/q8_0.wgsl"),
        GgmlType::Q4_K => include_str!("wgsl/matvec_slots/q4_k.wgsl"),
        GgmlType::Q6_K => include_str!("wgsl/matvec_slots/q6_k.wgsl"),
        _ => include_str!("wgsl/matvec_slots/generic.wgsl"),
    }
}

/// Whether `t` has a slot reader of its own (else the generic one).
pub fn has_own_slots(t: GgmlType) -> bool {
    matches!(t, GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q6_K)
}

/// The storage binding of a normed matvec's RMSNorm weight: after its outputs.
pub fn norm_binding(epi: MvEpilogue) -> u32 {
    if epi == MvEpilogue::Split { 7 } else { 4 }
}

/// The matvec's constants, slot reader and kernel, after the header, prelude and weight
/// decoder that `crate::source` puts first. `norm`: the input is RMSNorm(X)·G, folded in
/// (the threads' activations together are the whole row: their squares sum to its norm).
pub(crate) fn source(s: &mut String, t: GgmlType, epi: MvEpilogue, shape: MvShape, norm: bool) {
    use std::fmt::Write;
    assert!(!(norm && epi == MvEpilogue::Add), "a residual add's input is never normalised");
    let sums = shape.rows * if epi == MvEpilogue::SwiGlu { 2 } else { 1 };
    let _ = writeln!(
        s,
        "const MV_WG: u32 = {}u;\nconst MV_R: u32 = {}u;\nconst EPI: u32 = {}u;\nconst MV_NORM: bool = {norm};\nconst MV_ACC: u32 = {}u;",
        shape.wg,
        shape.rows,
        epi.code(),
        sums + u32::from(norm),
    );
    if norm {
        let _ = writeln!(s, "@group(0) @binding({}) var<storage, read> G: array<vec4<f32>>;", norm_binding(epi));
    } else {
        // Never read: MV_NORM is false.
        s.push_str("var<private> G: array<vec4<f32>, 1>;\n");
    }
    s.push_str(include_str!("wgsl/matvec_slots/common.wgsl"));
    s.push_str(slots(t));
    s.push_str(include_str!("wgsl/matvec.wgsl"));
    s.push_str(if epi == MvEpilogue::Split {
        include_str!("wgsl/matvec_split_out.wgsl")
    } else {
        include_str!("wgsl/matvec_one_out.wgsl")
    });
    if shape.subgroups {
        s.push_str(include_str!("wgsl/matvec_reduce_subgroup.wgsl"));
    } else {
        s.push_str(include_str!("wgsl/matvec_reduce_workgroup.wgsl"));
    }
}
