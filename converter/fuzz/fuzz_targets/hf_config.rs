//! Reads arbitrary bytes as a Hugging Face config.json. Whatever the input, reading must
//! return (never panic or overflow), and a config it accepts must describe a model whose
//! shapes can be computed: query heads a whole multiple of K/V heads, an even head width
//! (RoPE rotates pairs), and for DiffLlama an even number of each (heads come in pairs).
#![no_main]

use duet_convert::hf_config::{Arch, HfConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let Ok(cfg) = HfConfig::from_json(&json, "fuzz") else { return };
    assert!(cfg.n_heads > 0 && cfg.n_kv_heads > 0 && cfg.n_heads % cfg.n_kv_heads == 0);
    assert!(cfg.head_dim > 0 && cfg.head_dim % 2 == 0);
    if cfg.arch == Arch::DiffLlama {
        assert!(cfg.n_heads % 2 == 0 && cfg.n_kv_heads % 2 == 0);
    }
    std::hint::black_box(format!("{cfg:?}"));
});
