//! Parses arbitrary bytes as GGUF. Whatever the input, parsing must return (never panic,
//! overflow or allocate without bound), and whatever it accepts must keep the reader's
//! promises: every tensor view inside the file, offsets sequential, lookups consistent.
#![no_main]

use duet_quant::gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data) else { return };
    let size = file.file_size();
    assert_eq!(size, data.len() as u64);

    for (key, value) in file.metadata() {
        assert!(file.get(key).is_some_and(|v| std::ptr::eq(v, value)));
        std::hint::black_box(value.summary(8, 64).to_string());
        // Typed getters answer every key, of any type, without panicking.
        let _ = std::hint::black_box((
            file.get_u32_opt(key),
            file.get_f32_opt(key),
            file.get_str_opt(key),
            file.get_bool_opt(key),
            file.get_string_array_opt(key).map(|a| a.map(|a| a.iter().map(str::len).sum::<usize>())),
            file.get_f32_array_opt(key),
            file.get_i32_array_opt(key),
        ));
    }

    let alignment = u64::from(file.alignment());
    assert!(alignment.is_power_of_two());
    let mut expected = 0u64;
    for t in file.tensors() {
        assert!(t.name().len() < 64 && t.n_dims() <= 4);
        assert_eq!(t.offset(), expected);
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.n_bytes());
        assert!(t.file_offset() + t.n_bytes() <= size);
        assert_eq!(t.file_offset(), file.data_offset() + t.offset());
        std::hint::black_box(bytes.iter().fold(0u8, |a, &b| a ^ b));
        assert!(file.tensor(t.name()).is_some_and(|u| std::ptr::eq(u, t)));
        expected = t.offset() + t.n_bytes().next_multiple_of(alignment);
    }
});
