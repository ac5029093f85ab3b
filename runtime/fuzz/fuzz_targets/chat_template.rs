//! Loads arbitrary text as a model's chat template and renders a short conversation with
//! it. A template comes inside the model file, so whatever it holds must give a rendering
//! or an error — never a panic, and never a hang (the template fuel ends any loop).
//!
//! duet's limits but for fuel and memory: 2M instructions (a thousand times what real
//! templates take) end a loop within libFuzzer's 10 s under AddressSanitizer, where 20M may
//! not, and a 16 MiB memory budget keeps the threads parked by overruns small
//! (`chat_template_budget.rs` checks the budgets themselves).
#![no_main]

use std::time::Duration;

use duet_runtime::mem_budget::BudgetAlloc;
use duet_runtime::text::{ChatTemplate, Message, TemplateLimits};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: BudgetAlloc = BudgetAlloc;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let limits = TemplateLimits { fuel: 2_000_000, memory: 16 << 20, time: Duration::from_secs(8), ..Default::default() };
    let Ok(template) = ChatTemplate::with_limits(Some(&text), flags & 1 != 0, "<s>", "</s>", limits) else { return };
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
