//! Parses arbitrary bytes as a safetensors file. Whatever the input, the parse must return
//! (never panic, overflow or allocate without bound), and every tensor it accepts must lie
//! inside the data after the header and hold exactly the bytes its shape and dtype need.
#![no_main]

use std::path::Path;

use duet_convert::safetensors::parse_header_bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(tensors) = parse_header_bytes(Path::new("fuzz.safetensors"), data) else { return };
    let header_end = 8 + u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;
    for (name, t) in &tensors {
        assert!(header_end <= t.start && t.start <= t.end && t.end <= data.len(), "{name}: {}..{}", t.start, t.end);
        let numel: usize = t.shape.iter().product();
        assert_eq!(t.end - t.start, numel * t.dtype.size(), "{name}");
    }
});
