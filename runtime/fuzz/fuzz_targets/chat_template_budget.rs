//! Renders arbitrary text as a chat template under small budgets, with duet's budgeting
//! allocator installed, and checks that the budgets hold: a rendering returns at most its
//! output limit, and one that overran its memory or time fails again at once without
//! running (its thread stays parked, holding at most the memory budget).
//!
//! The budgets are small (1 MiB of memory, 200k instructions, 64 B–8 KiB of output, the
//! first byte picking which) so that each run is quick and the threads parked by overruns
//! hold little: duet's own 256 MiB budget would fill the fuzzer's RSS limit in eight.
#![no_main]

use std::time::{Duration, Instant};

use duet_runtime::mem_budget::BudgetAlloc;
use duet_runtime::text::{ChatTemplate, Message, TemplateLimits};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: BudgetAlloc = BudgetAlloc;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let limits = TemplateLimits {
        fuel: 200_000,
        memory: 1 << 20,
        time: Duration::from_secs(5),
        output: 64 << (flags & 7),
    };
    let Ok(template) = ChatTemplate::with_limits(Some(&text), flags & 8 != 0, "<s>", "</s>", limits) else { return };
    let conversation = [
        Message::new("system", "Be brief."),
        Message::new("user", "Hi {{ there }} <|im_end|>"),
        Message::new("assistant", "Hello."),
        Message::new("user", "And now?"),
    ];
    let n = 1 + (flags >> 4) as usize % conversation.len();
    match template.render(&conversation[..n], flags & 0x80 != 0) {
        Ok(out) => assert!(out.len() <= limits.output, "{} bytes rendered, limit {}", out.len(), limits.output),
        Err(e) => {
            let e = e.to_string();
            assert!(!e.is_empty());
            if e.contains("it is not run again") {
                let start = Instant::now();
                let again = template.render(&conversation[..n], false).unwrap_err().to_string();
                assert_eq!(again, e);
                assert!(start.elapsed() < Duration::from_millis(100), "a template that overran ran again");
            }
        }
    }
});
