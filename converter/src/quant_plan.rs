//! Which ggml type each tensor gets: the file-type presets and llama.cpp's mixing rules
//! (`llama_tensor_get_type` in llama-quant.cpp) for the Llama-shaped tensors duet writes,
//! plus `--tensor-type REGEX=TYPE` overrides and shape fallbacks.

use duet_quant::GgmlType;
use regex::Regex;

/// A `--type` preset (llama.cpp's `llama_ftype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    F32,
    F16,
    BF16,
    Q8_0,
    Q6K,
    Q5KM,
    Q4KM,
    Q4KS,
    Q4_0,
}

impl Preset {
    pub const ALL: [Preset; 9] = [
        Preset::F32,
        Preset::F16,
        Preset::BF16,
        Preset::Q8_0,
        Preset::Q6K,
        Preset::Q5KM,
        Preset::Q4KM,
        Preset::Q4KS,
        Preset::Q4_0,
    ];

    pub fn parse(s: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(s))
    }

    pub fn name(self) -> &'static str {
        match self {
            Preset::F32 => "f32",
            Preset::F16 => "f16",
            Preset::BF16 => "bf16",
            Preset::Q8_0 => "q8_0",
            Preset::Q6K => "q6_k",
            Preset::Q5KM => "q5_k_m",
            Preset::Q4KM => "q4_k_m",
            Preset::Q4KS => "q4_k_s",
            Preset::Q4_0 => "q4_0",
        }
    }

    /// `general.file_type` as llama.cpp numbers it.
    pub fn file_type(self) -> u32 {
        match self {
            Preset::F32 => 0,
            Preset::F16 => 1,
            Preset::Q4_0 => 2,
            Preset::Q8_0 => 7,
            Preset::Q4KS => 14,
            Preset::Q4KM => 15,
            Preset::Q5KM => 17,
            Preset::Q6K => 18,
            Preset::BF16 => 32,
        }
    }

    /// The type most weight matrices get.
    pub fn default_type(self) -> GgmlType {
        match self {
            Preset::F32 => GgmlType::F32,
            Preset::F16 => GgmlType::F16,
            Preset::BF16 => GgmlType::BF16,
            Preset::Q8_0 => GgmlType::Q8_0,
            Preset::Q6K => GgmlType::Q6_K,
            Preset::Q5KM => GgmlType::Q5_K,
            Preset::Q4KM | Preset::Q4KS => GgmlType::Q4_K,
            Preset::Q4_0 => GgmlType::Q4_0,
        }
    }

    /// Preset naming a source file's `general.file_type` (for "lower to higher" warnings).
    pub fn from_file_type(ft: u32) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.file_type() == ft)
    }
}

/// What a tensor is, for the mixing rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    TokenEmbd,
    Output,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    FfnGate,
    FfnUp,
    FfnDown,
    /// Norms, biases, λ vectors, rope factors, DEX matrices: always F32.
    KeepF32,
}

impl Category {
    /// Categorises a GGUF tensor name (`blk.N.attn_v.weight` …).
    pub fn of(name: &str, n_dims: usize) -> Category {
        if n_dims < 2 || !name.ends_with(".weight") || name.contains("_norm.") || name.contains("dex") {
            return Category::KeepF32;
        }
        let tail = name.rsplit_once('.').map(|(head, _)| head).unwrap_or(name);
        let leaf = tail.rsplit('.').next().unwrap_or(tail);
        match leaf {
            "token_embd" => Category::TokenEmbd,
            "output" => Category::Output,
            "attn_q" => Category::AttnQ,
            "attn_k" => Category::AttnK,
            "attn_v" => Category::AttnV,
            "attn_output" => Category::AttnOutput,
            "ffn_gate" => Category::FfnGate,
            "ffn_up" => Category::FfnUp,
            "ffn_down" => Category::FfnDown,
            _ => Category::KeepF32,
        }
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third
/// layer in between, get a bigger type in the _M mixes.
pub fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as isize - (n / 8) as isize).rem_euclid(3) == 2
}

/// One `--tensor-type REGEX=TYPE` rule.
#[derive(Clone, Debug)]
pub struct Override {
    pub pattern: Regex,
    pub ty: GgmlType,
}

impl Override {
    /// Parses `REGEX=TYPE`.
    pub fn parse(s: &str) -> Result<Override, String> {
        let (re, ty) = s.rsplit_once('=').ok_or_else(|| format!("--tensor-type '{s}' is not REGEX=TYPE"))?;
        let ty = GgmlType::from_name(ty)
            .filter(|t| t.is_supported() && *t != GgmlType::Q8_K)
            .ok_or_else(|| format!("--tensor-type '{s}': '{ty}' is not a type duet can write"))?;
        let pattern = Regex::new(re).map_err(|e| format!("--tensor-type '{s}': bad regex: {e}"))?;
        Ok(Override { pattern, ty })
    }
}

/// The order llama-quantize visits tensors in (its `weight_name_comparer`): by layer number,
/// tensors outside `blk.N.` first, then by name. Returns indices into `names`.
///
/// The attn_v and ffn_down rules count tensors in this order, not in file order: a GGUF whose
/// tensors are sorted by name (blk.0, blk.1, blk.10, …, as many llama.cpp files are) must
/// still get the mix llama-quantize gives it.
pub fn llama_cpp_order<S: AsRef<str>>(names: &[S]) -> Vec<usize> {
    let layer = |n: &str| -> i64 {
        n.strip_prefix("blk.").and_then(|r| r.split_once('.')).and_then(|(l, _)| l.parse().ok()).unwrap_or(-1)
    };
    let mut idx: Vec<usize> = (0..names.len()).collect();
    idx.sort_by(|&a, &b| {
        let (a, b) = (names[a].as_ref(), names[b].as_ref());
        (layer(a), a).cmp(&(layer(b), b))
    });
    idx
}

/// Chooses types tensor by tensor. Call [`Planner::choose`] in [`llama_cpp_order`]: like
/// llama.cpp, the attn_v and ffn_down rules count those tensors as they go (the counter, not
/// the layer in the name, is the layer index the rules use), and a tensor that a
/// `--tensor-type` rule matches is not counted.
pub struct Planner<'a> {
    pub preset: Preset,
    pub n_layers: usize,
    pub tied_embeddings: bool,
    pub has_imatrix: bool,
    pub overrides: &'a [Override],
    i_attention_wv: usize,
    i_ffn_down: usize,
}

impl<'a> Planner<'a> {
    pub fn new(
        preset: Preset,
        n_layers: usize,
        tied_embeddings: bool,
        has_imatrix: bool,
        overrides: &'a [Override],
    ) -> Self {
        Planner { preset, n_layers, tied_embeddings, has_imatrix, overrides, i_attention_wv: 0, i_ffn_down: 0 }
    }

    /// The type for tensor `name` whose fastest dimension is `ne0`.
    pub fn choose(&mut self, name: &str, n_dims: usize, ne0: usize) -> GgmlType {
        let category = Category::of(name, n_dims);
        if category == Category::KeepF32 {
            return GgmlType::F32;
        }
        let default = self.preset.default_type();
        if !default.is_quantized() {
            // Float presets store every matrix in that type (llama.cpp's convert --outtype).
            return default;
        }
        let mut ty = default;
        let mut manual = false;
        for o in self.overrides {
            if o.pattern.is_match(name) {
                ty = o.ty;
                manual = true;
                break;
            }
        }
        // As in llama.cpp, a manual type skips the mixing rules and their counters.
        if !manual {
            ty = self.mix(ty, category, ne0);
        }
        fallback(ty, ne0)
    }

    fn mix(&mut self, ty: GgmlType, category: Category, ne0: usize) -> GgmlType {
        let n = self.n_layers;
        let p = self.preset;
        match category {
            Category::Output => output_type(ty, ne0),
            Category::TokenEmbd if self.tied_embeddings => output_type(ty, ne0),
            Category::AttnV => {
                let i = self.i_attention_wv;
                self.i_attention_wv += 1;
                match p {
                    Preset::Q4KM | Preset::Q5KM if use_more_bits(i, n) => GgmlType::Q6_K,
                    Preset::Q4KS if i < 4 => GgmlType::Q5_K,
                    _ => ty,
                }
            }
            Category::FfnDown => {
                let layer = self.i_ffn_down;
                self.i_ffn_down += 1;
                match p {
                    Preset::Q4KM | Preset::Q5KM if use_more_bits(layer, n) => GgmlType::Q6_K,
                    Preset::Q4KS if layer < n / 8 => GgmlType::Q5_K,
                    // With an imatrix llama.cpp guards the first ffn_down layers of Q4_0.
                    Preset::Q4_0 if self.has_imatrix && layer < n / 8 => GgmlType::Q4_1,
                    _ => ty,
                }
            }
            _ => ty,
        }
    }
}

/// output.weight (and tied token embeddings): Q6_K unless the target is Q8_0; Q8_0 when
/// the rows do not fit the block size.
fn output_type(ty: GgmlType, ne0: usize) -> GgmlType {
    if !ne0.is_multiple_of(ty.block_size()) {
        GgmlType::Q8_0
    } else if ty != GgmlType::Q8_0 {
        GgmlType::Q6_K
    } else {
        ty
    }
}

/// llama.cpp's `tensor_type_fallback`: K-quants need rows of a multiple of 256.
pub fn fallback(ty: GgmlType, ne0: usize) -> GgmlType {
    if ne0.is_multiple_of(ty.block_size()) {
        return ty;
    }
    let alt = match ty {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    };
    if ne0.is_multiple_of(alt.block_size()) { alt } else { GgmlType::F16 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_more_bits_matches_llama_cpp_for_22_layers() {
        // n/8 = 2, 7n/8 = 19: layers 0,1 and 19..22, plus (i-2)%3 == 2 → 4, 7, 10, 13, 16.
        let picked: Vec<usize> = (0..22).filter(|&i| use_more_bits(i, 22)).collect();
        assert_eq!(picked, vec![0, 1, 4, 7, 10, 13, 16, 19, 20, 21]);
    }

    #[test]
    fn q4_k_m_mix() {
        let mut p = Planner::new(Preset::Q4KM, 22, false, false, &[]);
        assert_eq!(p.choose("token_embd.weight", 2, 2048), GgmlType::Q4_K);
        let v: Vec<GgmlType> = (0..22).map(|i| p.choose(&format!("blk.{i}.attn_v.weight"), 2, 2048)).collect();
        let d: Vec<GgmlType> = (0..22).map(|i| p.choose(&format!("blk.{i}.ffn_down.weight"), 2, 5632)).collect();
        for i in 0..22 {
            let want = if use_more_bits(i, 22) { GgmlType::Q6_K } else { GgmlType::Q4_K };
            assert_eq!((v[i], d[i]), (want, want), "layer {i}");
        }
        assert_eq!(p.choose("blk.3.attn_q.weight", 2, 2048), GgmlType::Q4_K);
        assert_eq!(p.choose("output.weight", 2, 2048), GgmlType::Q6_K);
        assert_eq!(p.choose("blk.0.attn_norm.weight", 1, 2048), GgmlType::F32);
        assert_eq!(p.choose("blk.0.attn_lambda_q1.weight", 1, 64), GgmlType::F32);
    }

    #[test]
    fn shape_fallbacks() {
        // 1056 = 33·32 is no multiple of 256: Q4_K falls back to Q5_0, Q6_K to Q8_0.
        let mut p = Planner::new(Preset::Q4KM, 8, false, false, &[]);
        assert_eq!(p.choose("blk.0.ffn_down.weight", 2, 1056), GgmlType::Q8_0);
        assert_eq!(p.choose("blk.1.ffn_down.weight", 2, 1056), GgmlType::Q5_0);
        // 1000 is not even a multiple of 32: F16.
        assert_eq!(p.choose("blk.2.ffn_down.weight", 2, 1000), GgmlType::F16);
    }

    #[test]
    fn counters_follow_llama_cpp_order_and_skip_manual_types() {
        let names = [
            "blk.10.attn_v.weight",
            "token_embd.weight",
            "blk.2.attn_v.weight",
            "blk.1.ffn_down.weight",
            "blk.1.attn_v.weight",
            "output_norm.weight",
        ];
        let order: Vec<&str> = llama_cpp_order(&names).iter().map(|&i| names[i]).collect();
        assert_eq!(
            order,
            [
                "output_norm.weight",
                "token_embd.weight",
                "blk.1.attn_v.weight",
                "blk.1.ffn_down.weight",
                "blk.2.attn_v.weight",
                "blk.10.attn_v.weight",
            ]
        );
        // A manual type leaves the counter alone: with blk.0's attn_v overridden, blk.1's is
        // the first counted (use_more_bits(0, 2) = false), as in llama.cpp.
        let o = [Override::parse(r"blk\.0\.attn_v=q8_0").unwrap()];
        let mut p = Planner::new(Preset::Q4KM, 2, false, false, &o);
        assert_eq!(p.choose("blk.0.attn_v.weight", 2, 256), GgmlType::Q8_0);
        assert_eq!(p.choose("blk.1.attn_v.weight", 2, 256), GgmlType::Q4_K);
    }

    #[test]
    fn tied_embeddings_follow_output_and_q8_0_keeps_output() {
        let mut p = Planner::new(Preset::Q4_0, 4, true, false, &[]);
        // 576 is a multiple of Q4_0's 32, so the rule picks Q6_K, whose 256 does not divide
        // 576: the shape fallback makes it Q8_0.
        assert_eq!(p.choose("token_embd.weight", 2, 576), GgmlType::Q8_0);
        assert_eq!(p.choose("token_embd.weight", 2, 512), GgmlType::Q6_K);
        let mut q = Planner::new(Preset::Q8_0, 4, false, false, &[]);
        assert_eq!(q.choose("output.weight", 2, 576), GgmlType::Q8_0);
    }

    #[test]
    fn overrides_win_and_float_presets_ignore_mixes() {
        let o = [Override::parse(r"attn_(q|k)\.weight$=q8_0").unwrap()];
        let mut p = Planner::new(Preset::Q4KM, 8, false, false, &o);
        assert_eq!(p.choose("blk.1.attn_q.weight", 2, 256), GgmlType::Q8_0);
        assert_eq!(p.choose("blk.1.attn_output.weight", 2, 256), GgmlType::Q4_K);
        let mut f = Planner::new(Preset::F16, 8, false, false, &[]);
        assert_eq!(f.choose("output.weight", 2, 256), GgmlType::F16);
        assert!(Override::parse("nonsense").is_err());
        assert!(Override::parse("x=q3_k").is_err());
    }
}
