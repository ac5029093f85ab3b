//! Loads arbitrary text as a model's chat template and renders a short conversation with
//! it. A template comes inside the model file, so whatever it holds must give a rendering
//! or an error — never a panic, and never a hang (the template fuel ends any loop).
#![no_main]

use duet_runtime::text::{ChatTemplate, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let Ok(template) = ChatTemplate::new(Some(&text), flags & 1 != 0, "<s>", "</s>") else { return };
    let conversation = [
        Message::new("system", "Be brief."),
        Message::new("user", "Hi {{ there }} <|im_end|>"),
        Message::new("assistant", ""),
        Message::new("user", "And now?"),
    ];
    let n = 1 + (flags >> 1) as usize % conversation.len();
    if let Err(e) = template.render(&conversation[..n], flags & 0x80 != 0) {
        assert!(!e.to_string().is_empty());
    }
});
