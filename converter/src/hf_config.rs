//! config.json of a Hugging Face Llama / DiffLlama checkpoint (with an optional DEX section),
//! or of duet's DIFF V2 checkpoint format (`"model_type": "diffllama_v2"`, see docs/gguf-format.md).
//!
//! Both RoPE layouts are accepted: top-level `rope_theta` + `rope_scaling` (transformers 4)
//! and `rope_parameters` (transformers 5).

use std::path::Path;

use serde_json::Value;

use crate::error::ConvertError;

/// The architecture, as the runtime names it in GGUF (one table: `duet_runtime::gguf_names`).
pub use duet_runtime::model::Arch;

/// RoPE frequency scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// Llama 3.1 style: per-frequency factors, stored in GGUF as `rope_freqs.weight`.
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_context: f32 },
    /// Positions divided by `factor`.
    Linear { factor: f32 },
}

/// DEX adaptation of a Llama model (duet's checkpoint format, see docs/gguf-format.md): per layer, the
/// heads it applies to. The matrices W_D and λ are tensors of the checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct DexConfig {
    /// `heads[layer]` = the attention heads (0-based, < n_heads) adapted in that layer.
    pub heads: Vec<Vec<usize>>,
}

#[derive(Clone, Debug)]
pub struct HfConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub rope_theta: f32,
    pub rope_scaling: Option<RopeScaling>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub dex: Option<DexConfig>,
    /// `_name_or_path` or the directory name, for general.name.
    pub name: String,
}

impl HfConfig {
    pub fn load(dir: &Path) -> Result<HfConfig, ConvertError> {
        let path = dir.join("config.json");
        let text =
            duet_quant::input::read_text(&path, duet_quant::input::MAX_JSON_BYTES).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => {
                    ConvertError::missing(&path, "not found (a Hugging Face model directory needs config.json)")
                }
                _ => ConvertError::io(&path, e),
            })?;
        let json: Value =
            serde_json::from_str(&text).map_err(|e| ConvertError::corrupt(&path, format!("not valid JSON: {e}")))?;
        let fallback_name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        HfConfig::from_json(&json, &fallback_name).map_err(|msg| ConvertError::config(&path, msg))
    }

    /// Parses and validates. Errors are plain messages; [`HfConfig::load`] adds the path.
    pub fn from_json(json: &Value, fallback_name: &str) -> Result<HfConfig, String> {
        let model_type = json.get("model_type").and_then(Value::as_str).ok_or("no \"model_type\"")?;
        let arch = match model_type {
            "llama" => Arch::Llama,
            "diffllama" => Arch::DiffLlama,
            "diffllama_v2" => Arch::DiffLlamaV2,
            other => {
                return Err(format!(
                    "model_type \"{other}\" is not supported (duet converts \"llama\", \"diffllama\" and \"diffllama_v2\" checkpoints)"
                ));
            }
        };
        // Sizes go into GGUF's 32-bit fields: a larger value is refused, never truncated
        // (max_position_embeddings 2^63 once became a context of 0).
        let fits = |k: &str, v: u64| -> Result<usize, String> {
            if v > u64::from(u32::MAX) {
                return Err(format!("\"{k}\" is {v}, more than GGUF's 32-bit field holds"));
            }
            Ok(v as usize)
        };
        let usize_field = |k: &str| -> Result<usize, String> {
            let v = json
                .get(k)
                .and_then(Value::as_u64)
                .ok_or_else(|| format!("\"{k}\" is missing or not a non-negative integer"))?;
            fits(k, v)
        };
        let opt_usize = |k: &str| -> Result<Option<usize>, String> {
            match json.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => {
                    fits(k, v.as_u64().ok_or_else(|| format!("\"{k}\" is not a non-negative integer"))?).map(Some)
                }
            }
        };
        // A float that must be finite and positive when given (a string such as "NaN" is not
        // a number: refused, not replaced by the default).
        let positive = |k: &str, v: Option<&Value>, default: f64| -> Result<f32, String> {
            let x = match v {
                None | Some(Value::Null) => default,
                Some(v) => v.as_f64().ok_or_else(|| format!("\"{k}\" is not a number"))?,
            };
            if !(x.is_finite() && x > 0.0 && (x as f32).is_normal()) {
                return Err(format!("\"{k}\" is {x}: it must be a finite number above 0"));
            }
            Ok(x as f32)
        };
        let bool_field = |k: &str, default: bool| -> Result<bool, String> {
            match json.get(k) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_bool().ok_or_else(|| format!("\"{k}\" is not true/false")),
            }
        };
        let hidden_size = usize_field("hidden_size")?;
        let n_heads = usize_field("num_attention_heads")?;
        let n_kv_heads = opt_usize("num_key_value_heads")?.unwrap_or(n_heads);
        if arch == Arch::DiffLlamaV2 && n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads != 0 {
            return Err(format!(
                "diffllama_v2: num_attention_heads ({n_heads}, the number of head pairs) must be a multiple of num_key_value_heads ({n_kv_heads}) so that both heads of a pair share a KV head"
            ));
        }
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(format!(
                "num_attention_heads ({n_heads}) must be a positive multiple of num_key_value_heads ({n_kv_heads})"
            ));
        }
        let head_dim = match opt_usize("head_dim")? {
            Some(d) => d,
            None if hidden_size % n_heads == 0 => hidden_size / n_heads,
            None => {
                return Err(format!(
                    "hidden_size {hidden_size} is not divisible by {n_heads} heads and no head_dim is given"
                ));
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(format!("head_dim {head_dim} must be even for RoPE"));
        }
        if arch == Arch::DiffLlama && (n_heads % 2 != 0 || n_kv_heads % 2 != 0) {
            return Err(format!(
                "diffllama needs even head counts (query heads pair up as i and i+H/2); got num_attention_heads = {n_heads}, num_key_value_heads = {n_kv_heads}"
            ));
        }
        let (rope_theta, rope_scaling) = parse_rope(json)?;
        let eos_token_ids = match json.get("eos_token_id") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => a.iter().filter_map(|v| v.as_u64().map(|v| v as u32)).collect(),
            Some(v) => v.as_u64().map(|v| vec![v as u32]).ok_or("\"eos_token_id\" is not an integer")?,
        };
        let cfg = HfConfig {
            arch,
            vocab_size: usize_field("vocab_size")?,
            hidden_size,
            intermediate_size: usize_field("intermediate_size")?,
            n_layers: usize_field("num_hidden_layers")?,
            n_heads,
            n_kv_heads,
            head_dim,
            rms_norm_eps: positive("rms_norm_eps", json.get("rms_norm_eps"), 1e-6)?,
            max_position_embeddings: opt_usize("max_position_embeddings")?.unwrap_or(2048),
            tie_word_embeddings: bool_field("tie_word_embeddings", false)?,
            attention_bias: bool_field("attention_bias", false)?,
            mlp_bias: bool_field("mlp_bias", false)?,
            rope_theta,
            rope_scaling,
            bos_token_id: json.get("bos_token_id").and_then(Value::as_u64).map(|v| v as u32),
            eos_token_ids,
            dex: parse_dex(json, n_heads)?,
            name: json
                .get("_name_or_path")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(|s| s.rsplit('/').next().unwrap_or(s).to_string())
                .unwrap_or_else(|| fallback_name.to_string()),
        };
        if cfg.n_layers == 0 || cfg.vocab_size == 0 || cfg.hidden_size == 0 || cfg.intermediate_size == 0 {
            return Err("vocab_size, hidden_size, intermediate_size and num_hidden_layers must be positive".into());
        }
        if cfg.dex.is_some() && cfg.arch != Arch::Llama {
            return Err(format!("\"dex\" adapts llama checkpoints; this one is {model_type}"));
        }
        if let Some(dex) = &cfg.dex
            && dex.heads.len() != cfg.n_layers
        {
            return Err(format!("dex.heads lists {} layers, the model has {}", dex.heads.len(), cfg.n_layers));
        }
        Ok(cfg)
    }
}

impl HfConfig {
    /// Query heads: V2 has two per output head.
    pub fn q_heads(&self) -> usize {
        match self.arch {
            Arch::DiffLlamaV2 => 2 * self.n_heads,
            Arch::Llama | Arch::DiffLlama => self.n_heads,
        }
    }
}

fn parse_rope(json: &Value) -> Result<(f32, Option<RopeScaling>), String> {
    // transformers 5 nests everything in rope_parameters; older files use top-level keys.
    let params = json.get("rope_parameters").filter(|v| v.is_object());
    let theta = match params.and_then(|p| p.get("rope_theta")).or_else(|| json.get("rope_theta")) {
        None | Some(Value::Null) => 10000.0,
        Some(v) => v.as_f64().ok_or("\"rope_theta\" is not a number")?,
    };
    if !(theta.is_finite() && theta > 0.0) {
        return Err(format!("\"rope_theta\" is {theta}: it must be a finite number above 0"));
    }
    let theta = theta as f32;
    let scaling = params.or_else(|| json.get("rope_scaling").filter(|v| v.is_object()));
    let Some(s) = scaling else {
        return Ok((theta, None));
    };
    let rope_type = s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str).unwrap_or("default");
    let num = |k: &str| s.get(k).and_then(Value::as_f64).filter(|v| v.is_finite() && *v > 0.0).map(|v| v as f32);
    let scaling = match rope_type {
        "default" => None,
        "linear" => {
            Some(RopeScaling::Linear { factor: num("factor").ok_or("linear rope scaling without \"factor\"")? })
        }
        "llama3" => Some(RopeScaling::Llama3 {
            factor: num("factor").ok_or("llama3 rope scaling without \"factor\"")?,
            low_freq_factor: num("low_freq_factor").unwrap_or(1.0),
            high_freq_factor: num("high_freq_factor").unwrap_or(4.0),
            original_context: num("original_max_position_embeddings").unwrap_or(8192.0),
        }),
        other => {
            return Err(format!("rope type \"{other}\" is not supported (default, linear and llama3 are)"));
        }
    };
    if let Some(RopeScaling::Llama3 { low_freq_factor, high_freq_factor, .. }) = scaling
        && high_freq_factor <= low_freq_factor
    {
        return Err("llama3 rope scaling needs high_freq_factor > low_freq_factor".into());
    }
    Ok((theta, scaling))
}

fn parse_dex(json: &Value, n_heads: usize) -> Result<Option<DexConfig>, String> {
    let Some(dex) = json.get("dex").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let layers = dex
        .get("heads")
        .and_then(Value::as_array)
        .ok_or("\"dex\" needs a \"heads\" list (one list of head indices per layer)")?;
    let mut heads = Vec::with_capacity(layers.len());
    for (i, layer) in layers.iter().enumerate() {
        let list = layer.as_array().ok_or_else(|| format!("dex.heads[{i}] is not a list"))?;
        let mut hs = Vec::with_capacity(list.len());
        for h in list {
            let h = h
                .as_u64()
                .map(|h| h as usize)
                .filter(|&h| h < n_heads)
                .ok_or_else(|| format!("dex.heads[{i}] holds {h}, which is not a head index below {n_heads}"))?;
            hs.push(h);
        }
        hs.sort_unstable();
        hs.dedup();
        heads.push(hs);
    }
    Ok(Some(DexConfig { heads }))
}

/// Per-frequency RoPE factors for llama3 scaling, exactly as llama.cpp's converter computes
/// them (the runtime divides each base frequency by its factor).
pub fn llama3_rope_factors(theta: f32, head_dim: usize, s: RopeScaling) -> Vec<f32> {
    let RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } = s else {
        return vec![1.0; head_dim / 2];
    };
    let low_freq_wavelen = original_context / low_freq_factor;
    let high_freq_wavelen = original_context / high_freq_factor;
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f32 / head_dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_freq_wavelen {
                1.0
            } else if wavelen > low_freq_wavelen {
                factor
            } else {
                let smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "model_type": "diffllama", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0
        })
    }

    #[test]
    fn parses_both_rope_layouts() {
        let mut old = base();
        old["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
        let a = HfConfig::from_json(&old, "x").unwrap();
        let mut new = base();
        new.as_object_mut().unwrap().remove("rope_theta");
        new["rope_parameters"] = json!({"rope_theta": 10000.0, "rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
        let b = HfConfig::from_json(&new, "x").unwrap();
        assert_eq!(a.rope_scaling, b.rope_scaling);
        assert_eq!(a.rope_theta, b.rope_theta);
        assert_eq!(a.head_dim, 64);
    }

    #[test]
    fn rejects_odd_heads_and_unknown_types() {
        let mut odd = base();
        odd["num_attention_heads"] = json!(3);
        odd["num_key_value_heads"] = json!(3);
        odd["hidden_size"] = json!(192);
        let e = HfConfig::from_json(&odd, "x").unwrap_err();
        assert!(e.contains("even head counts"), "{e}");
        let mut t = base();
        t["model_type"] = json!("mistral");
        assert!(HfConfig::from_json(&t, "x").unwrap_err().contains("\"mistral\" is not supported"));
    }

    #[test]
    fn llama3_factors_span_one_to_factor() {
        let f = llama3_rope_factors(
            500000.0,
            64,
            RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 8192.0 },
        );
        assert_eq!(f[0], 1.0); // highest frequency untouched
        assert_eq!(*f.last().unwrap(), 8.0); // lowest frequency fully scaled
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
    }
}
