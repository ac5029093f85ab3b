//! Reads arbitrary bytes as tokenizer.json (with and without a tokenizer_config.json that
//! names special tokens) for a vocabulary the input also picks. Whatever the input, the
//! read must return (never panic, overflow or allocate without bound), and what it accepts
//! must only name end-of-generation ids inside the vocabulary.
#![no_main]

use std::path::PathBuf;

use duet_convert::tokenizer::{TokenizerFiles, from_files};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let vocab = [0usize, 1, 32, 256, 49152, 1 << 20][pick as usize % 6];
    let tokenizer_config = (pick & 0x80 != 0)
        .then(|| json!({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": true}));
    let files = TokenizerFiles {
        tokenizer_json: (PathBuf::from("tokenizer.json"), String::from_utf8_lossy(rest).into_owned()),
        tokenizer_config,
        generation_config: None,
        chat_template_jinja: None,
    };
    if let Ok(meta) = from_files(files, vocab, Some(1), &[2]) {
        assert!(meta.eog_ids.iter().all(|&id| (id as usize) < vocab));
    }
});
