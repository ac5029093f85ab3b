//! The uniform parameters of every kernel: one `#[repr(C)]` struct per WGSL `struct Params`,
//! field for field. `tests/params.rs` reflects the `Params` of every variant's WGSL through
//! naga and compares member names, types and offsets with the struct [`Op::params`] names,
//! and the GPU backend refuses to dispatch an op with another op's struct, so a value can
//! neither land in the wrong field nor reach the wrong kernel.

use crate::{CacheKind, Op};

/// The WGSL type of a parameter field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    U32,
    F32,
    /// `array<vec4<u32>, 2>` (the DEX head mask).
    U32x4x2,
}

/// A field of a parameter struct: its name, type and byte offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub ty: ParamType,
    pub offset: usize,
}

/// A kernel's parameter struct.
pub trait KernelParams: bytemuck::Pod {
    const NAME: &'static str;
    const FIELDS: &'static [Field];
}

/// The WGSL type of a Rust field type.
pub trait ParamField {
    const TY: ParamType;
}

impl ParamField for u32 {
    const TY: ParamType = ParamType::U32;
}

impl ParamField for f32 {
    const TY: ParamType = ParamType::F32;
}

impl ParamField for [[u32; 4]; 2] {
    const TY: ParamType = ParamType::U32x4x2;
}

macro_rules! params {
    ($($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident: $ty:ty),* $(,)? })*) => {
    $(
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name {
            $($(#[$fm])* pub $field: $ty,)*
        }

        impl KernelParams for $name {
            const NAME: &'static str = stringify!($name);
            const FIELDS: &'static [Field] = &[$(Field {
                name: stringify!($field),
                ty: <$ty as ParamField>::TY,
                offset: std::mem::offset_of!($name, $field),
            }),*];
        }
    )*
        /// The name of every parameter struct, in definition order.
        pub const PARAMS_STRUCTS: &[&str] = &[$(stringify!($name)),*];
    };
}

params! {
    /// matvec.wgsl: tokens (workgroup z, each on its own) times up to four matrices of one
    /// weight buffer.
    MatVecParams {
        /// Elements per row (K), the same for every matrix.
        cols: u32,
        /// Bytes per row.
        row_bytes: u32,
        /// Workgroups along x of the dispatch.
        grid_x: u32,
        /// Vec4s from one token's activations in X to the next's.
        x_stride4: u32,
        /// Added to every output index (a weight chunk's first row).
        out_off: u32,
        /// Outputs from one token's row to the next's (store and add epilogues; split
        /// outputs and SwiGLU's are whole matrices, a row of `rows` each).
        out_stride: u32,
        /// Matrix 0: rows and first byte in W.
        rows0: u32,
        woff0: u32,
        /// Matrix 1 (the split epilogue's second output, SwiGLU's up rows): rows, first
        /// byte, first workgroup; likewise matrices 2 and 3 (split only).
        rows1: u32,
        woff1: u32,
        wg1: u32,
        rows2: u32,
        woff2: u32,
        wg2: u32,
        rows3: u32,
        woff3: u32,
        wg3: u32,
        /// The folded RMSNorm's epsilon (normed variants).
        eps: f32,
        /// Tokens interleaved along x: 0, a product of several tokens has one per dispatch
        /// z; n > 0, workgroup i takes token i mod n of job i / n, so that the n tokens'
        /// workgroups of the same rows run side by side and read the weights through the
        /// cache once (`--gpu-tune mvinterleave`).
        tok_x: u32,
    }

    /// matmul.wgsl: tokens times a weight chunk, tiled.
    MatMulParams {
        n_rows: u32,
        cols: u32,
        row_bytes: u32,
        out_off: u32,
        grid_x: u32,
        /// Tokens.
        t_rows: u32,
        /// Elements per token row of X and of O.
        x_stride: u32,
        o_stride: u32,
        /// First byte of the weight chunk in W.
        w_off: u32,
        /// 1: add the products into O (the residual add), 0: store them.
        accumulate: u32,
    }

    /// embed.wgsl: rows of a token-embedding chunk.
    EmbedParams {
        n_tokens: u32,
        cols: u32,
        row_bytes: u32,
        /// First table row in this chunk, and the chunk's rows.
        row0: u32,
        n_rows: u32,
        grid_x: u32,
        /// First byte of the chunk in W.
        w_off: u32,
    }

    RmsNormParams {
        rows: u32,
        cols: u32,
        eps: f32,
        grid_x: u32,
    }

    RopeParams {
        rows: u32,
        cols: u32,
        n_heads: u32,
        head_dim: u32,
        n_pairs: u32,
        pos0: u32,
        grid_x: u32,
    }

    SwiGluParams {
        n: u32,
        grid_x: u32,
    }

    /// add.wgsl: x[i] += y[i mod y_len].
    AddParams {
        n: u32,
        y_len: u32,
        grid_x: u32,
    }

    CopyRowParams {
        n: u32,
        src: u32,
        dst: u32,
        grid_x: u32,
    }

    /// kv_write.wgsl, kv_write_absmax.wgsl and kv_write_signed_max.wgsl.
    KvWriteParams {
        rows: u32,
        kv_dim: u32,
        pos0: u32,
        grid_x: u32,
        /// The sequence's page table: its first entry in the page-table buffer.
        pt_base: u32,
    }

    /// kv_write_channel.wgsl: the groups of 32 positions a batch completes.
    KvWriteChannelParams {
        rows: u32,
        kv_dim: u32,
        pos0: u32,
        grid_x: u32,
        first_group: u32,
        n_groups: u32,
        /// The sequence's page table: its first entry in the page-table buffer.
        pt_base: u32,
        /// The sequence's f16 window: its first word in the cache buffer.
        window_word: u32,
        /// The sequence's sink (its first positions in f16): its first word.
        sink_word: u32,
    }

    /// rope_kv.wgsl: RoPE on the new Q and K rows and their plain cache write.
    RopeKvParams {
        rows: u32,
        q_dim: u32,
        kv_dim: u32,
        head_dim: u32,
        n_pairs: u32,
        pos0: u32,
        grid_x: u32,
        /// The sequence's page table: its first entry in the page-table buffer.
        pt_base: u32,
    }

    /// kv_window.wgsl: a per-channel cache's f16 window.
    KvWindowParams {
        rows: u32,
        kv_dim: u32,
        pos0: u32,
        grid_x: u32,
        from_row: u32,
        window_word: u32,
    }

    /// rotate.wgsl: Hadamard rotation of row blocks.
    RotateParams {
        rows: u32,
        cols: u32,
        block: u32,
        grid_x: u32,
        /// 1/√block as the CPU computes it.
        norm: f32,
        /// Length of the weight applied after the rotation (0: none).
        w_len: u32,
    }

    AttentionParams {
        rows: u32,
        n_heads: u32,
        n_kv_heads: u32,
        head_dim: u32,
        pos0: u32,
        q_dim: u32,
        kv_dim: u32,
        grid_x: u32,
        scale: f32,
        /// Keys per chunk (a multiple of the tile's keys) and chunks per (row tile, unit).
        chunk_keys: u32,
        n_chunks: u32,
        /// n_heads (standard) or n_heads / 2 (differential).
        units: u32,
        /// 2^(bits−1) − 1 of the logit quantization (0: off), and the absmax table's row
        /// stride.
        lq_qmax: f32,
        lq_stride: u32,
        cache_groups: u32,
        /// The sequence's page table (first entry), its per-channel window and the first
        /// f16 row (after the cache's groups) of its sink.
        pt_base: u32,
        window: u32,
        sink_row: u32,
        /// As [`LogitAbsmaxParams`]'s.
        rope_pairs: u32,
    }

    /// attn_combine.wgsl: the chunks of attention.wgsl's partials merged.
    AttnCombineParams {
        rows: u32,
        units: u32,
        head_dim: u32,
        n_chunks: u32,
        q_dim: u32,
        grid_x: u32,
        lambda: f32,
        /// 1 − λ_init.
        out_scale: f32,
        eps: f32,
        has_sub_norm: u32,
    }

    LogitAbsmaxParams {
        rows: u32,
        n_heads: u32,
        n_kv_heads: u32,
        head_dim: u32,
        pos0: u32,
        q_dim: u32,
        kv_dim: u32,
        grid_x: u32,
        scale: f32,
        cache_groups: u32,
        pt_base: u32,
        window: u32,
        sink_row: u32,
        /// RoPE's pairs per head where the K cache holds keys before RoPE (its reader rotates
        /// them, `cache/k_before_rope.wgsl`), else 0.
        rope_pairs: u32,
    }

    LogitReduceParams {
        rows: u32,
        n_heads: u32,
        whole_tensor: u32,
    }

    /// pair_combine.wgsl: DIFF V2's `o_i = a_2i − sigmoid(g_i)·a_2i+1`.
    PairCombineParams {
        rows: u32,
        n_pairs: u32,
        head_dim: u32,
        grid_x: u32,
    }

    /// dex.wgsl: the adapted heads as 256 mask bits.
    DexParams {
        rows: u32,
        cols: u32,
        n_heads: u32,
        head_dim: u32,
        lambda: f32,
        grid_x: u32,
        _pad0: u32,
        _pad1: u32,
        mask: [[u32; 4]; 2],
    }
}

impl Op {
    /// The name and fields of this op's parameter struct.
    pub fn params(self) -> (&'static str, &'static [Field]) {
        fn of<P: KernelParams>() -> (&'static str, &'static [Field]) {
            (P::NAME, P::FIELDS)
        }
        match self {
            Op::MatVec { .. } => of::<MatVecParams>(),
            Op::MatMul(_) | Op::MatMulCoop { .. } => of::<MatMulParams>(),
            Op::Embed(_) => of::<EmbedParams>(),
            Op::RmsNorm => of::<RmsNormParams>(),
            Op::Rope => of::<RopeParams>(),
            Op::SwiGlu => of::<SwiGluParams>(),
            Op::Add => of::<AddParams>(),
            Op::CopyRow => of::<CopyRowParams>(),
            Op::KvWrite(e) if matches!(e.kind(), CacheKind::Channel { .. }) => of::<KvWriteChannelParams>(),
            Op::KvWrite(_) => of::<KvWriteParams>(),
            Op::KvWindow => of::<KvWindowParams>(),
            Op::RopeKv { .. } => of::<RopeKvParams>(),
            Op::Rotate => of::<RotateParams>(),
            Op::Attention { .. } => of::<AttentionParams>(),
            Op::AttnCombine { .. } => of::<AttnCombineParams>(),
            Op::LogitAbsmax(_) => of::<LogitAbsmaxParams>(),
            Op::LogitReduce => of::<LogitReduceParams>(),
            Op::Dex => of::<DexParams>(),
            Op::PairCombine => of::<PairCombineParams>(),
        }
    }
}
