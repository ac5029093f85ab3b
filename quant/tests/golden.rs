//! Bit-exactness against ggml itself.
//!
//! `golden/golden.bin` holds deterministic inputs and the bytes ggml's own quantizers made of
//! them (`golden/harness.c` linked against libggml-base of llama.cpp 0c1e57098; regenerate
//! with `golden/make_golden.sh`, see `golden/README.md`). Every expected byte and float here
//! comes from ggml; none is derived from this crate.
//!
//! * `q/<TYPE>/<case>`: `quantize_row_<t>_ref` (= `quantize_<t>(…, NULL)` =
//!   `ggml_quantize_chunk(…, NULL)`, what llama-quantize writes without an imatrix)
//! * `qi/<TYPE>/<case>`: `quantize_<t>(…, imatrix)` (= `ggml_quantize_chunk(…, imatrix)`)
//! * `dq/<TYPE>/<case>`, `dqr/<TYPE>`: `dequantize_row_<t>` of ggml's bytes / random blocks
//! * `bulk/<case>` with `hq/`, `hqi/`, `hdq/`, and `hrb/<TYPE>`: large inputs that are not
//!   stored but regenerated here from a seed (checked against a stored hash), with 64-bit
//!   hashes of what ggml made of them

#[path = "golden/golden_file.rs"]
mod golden_file;

use duet_quant::{GgmlType, dequantize};
use golden_file::*;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Ref,
    Imatrix,
}

/// Compares our quantization of every applicable case with ggml's, block by block.
fn check_quantize(ty: GgmlType, mode: Mode) {
    let g = golden();
    let (blck, tsize) = (ty.block_size(), ty.type_size());
    let prefix = match mode {
        Mode::Ref => "q",
        Mode::Imatrix => "qi",
    };
    let mut mismatches = Vec::new();
    let mut bad_blocks = 0usize;
    let mut cases_checked = Vec::new();
    let mut blocks_checked = 0usize;
    for case in &g.cases {
        let key = format!("{prefix}/{}/{}", ty.name(), case.name);
        let Some(want) = g.entries.get(&key) else {
            // Absent only where ggml has no such path: float-only cases for quantized
            // types, imatrix runs of cases without an imatrix.
            let expected_absent = (case.float_only && !matches!(ty, GgmlType::F16 | GgmlType::BF16))
                || (mode == Mode::Imatrix && case.imatrix.is_none());
            assert!(expected_absent, "golden.bin lacks {key}");
            continue;
        };
        let imatrix = match mode {
            Mode::Ref => None,
            Mode::Imatrix => Some(case.imatrix.as_deref().expect("imatrix case")),
        };
        let got = ours(ty, &case.x, case.n_per_row, imatrix);
        assert_eq!(got.len(), want.len(), "{key}: size");
        let blocks_per_row = case.n_per_row / blck;
        for (bi, (a, b)) in got.chunks_exact(tsize).zip(want.chunks_exact(tsize)).enumerate() {
            blocks_checked += 1;
            if a != b {
                bad_blocks += 1;
                if mismatches.len() < 12 {
                    let (row, blk) = (bi / blocks_per_row, bi % blocks_per_row);
                    let first = a.iter().zip(b).position(|(p, q)| p != q).unwrap();
                    mismatches.push(format!(
                        "{ty} {mode:?} case {} row {row} block {blk} (values {}..{}), first differing byte {first}:\n  ours {}\n  ggml {}",
                        case.name,
                        blk * blck,
                        (blk + 1) * blck,
                        hex(a),
                        hex(b)
                    ));
                }
            }
        }
        cases_checked.push(case.name.as_str());
        assert_eq!(case.x.len(), case.n_per_row * case.nrows);
    }
    // Bulk cases: only a hash of ggml's bytes is stored.
    let mut bulk_checked = 0;
    let mut bulk_values = 0;
    for case in &g.bulk {
        let key = format!("h{prefix}/{}/{}", ty.name(), case.name);
        let Some(want) = g.entries.get(&key) else {
            let expected_absent = (case.float_only && !matches!(ty, GgmlType::F16 | GgmlType::BF16))
                || (mode == Mode::Imatrix && case.imatrix.is_none());
            assert!(expected_absent, "golden.bin lacks {key}");
            continue;
        };
        let imatrix = match mode {
            Mode::Ref => None,
            Mode::Imatrix => Some(case.imatrix.as_deref().expect("imatrix case")),
        };
        let got = fnv64(&ours(ty, &case.x, case.n_per_row, imatrix));
        let want = u64::from_le_bytes(want[..8].try_into().unwrap());
        if got != want {
            mismatches.push(format!(
                "{ty} {mode:?} bulk case {} ({} values): hash of our bytes {got:#018x}, of ggml's {want:#018x} \
                 (only hashes are stored; run the harness on the regenerated input to see blocks)",
                case.name,
                case.x.len()
            ));
        }
        bulk_checked += 1;
        bulk_values += case.x.len();
    }
    assert!(
        mismatches.is_empty(),
        "{ty} {mode:?}: {bad_blocks} of {blocks_checked} blocks differ from ggml:\n{}",
        mismatches.join("\n")
    );
    let min_bulk = match mode {
        Mode::Ref if matches!(ty, GgmlType::F16 | GgmlType::BF16) => 4,
        Mode::Ref => 3,
        Mode::Imatrix => 1,
    };
    assert!(bulk_checked >= min_bulk, "{ty} {mode:?}: only {bulk_checked} bulk cases in golden.bin");
    // Guard against a vacuous pass (a truncated or mislabelled golden file).
    let min_cases = match mode {
        Mode::Ref if matches!(ty, GgmlType::F16 | GgmlType::BF16) => 25,
        Mode::Ref => 24,
        Mode::Imatrix => 8,
    };
    assert!(cases_checked.len() >= min_cases, "{ty} {mode:?}: only {} cases in golden.bin", cases_checked.len());
    eprintln!(
        "{ty} {mode:?}: {blocks_checked} blocks in {} cases and {bulk_values} values in {bulk_checked} bulk cases bit-exact with ggml",
        cases_checked.len()
    );
}

/// Our dequantization of ggml's bytes (and of random blocks) against ggml's, bit for bit.
fn check_dequantize(ty: GgmlType) {
    let g = golden();
    let (blck, tsize) = (ty.block_size(), ty.type_size());
    let mut sources: Vec<(String, &[u8], &[u8])> = Vec::new();
    for (key, want) in &g.entries {
        let parts: Vec<&str> = key.split('/').collect();
        match parts.as_slice() {
            ["dq", t, case] if *t == ty.name() => {
                let q = &g.entries[&format!("q/{t}/{case}")];
                sources.push((key.clone(), &q[..DQ_ELEMS / blck * tsize], want));
            }
            ["dqr", t] if *t == ty.name() => sources.push((key.clone(), &g.entries[&format!("rb/{t}")], want)),
            _ => {}
        }
    }
    let needed = if matches!(ty, GgmlType::F16 | GgmlType::BF16) { 1 } else { 10 };
    assert!(sources.len() >= needed, "{ty}: only {} dequantization goldens", sources.len());
    let mut report = Vec::new();
    let mut values = 0usize;
    for (key, q, want) in &sources {
        let want = f32s(want);
        let mut got = vec![0f32; want.len()];
        dequantize(ty, q, &mut got).unwrap_or_else(|e| panic!("{key}: {e}"));
        values += want.len();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            if a.to_bits() != b.to_bits() && report.len() < 12 {
                let blk = i / blck;
                report.push(format!(
                    "{key} value {i} (block {blk}): ours {a:e} ({:#010x}), ggml {b:e} ({:#010x}); block bytes {}",
                    a.to_bits(),
                    b.to_bits(),
                    hex(&q[blk * tsize..(blk + 1) * tsize])
                ));
            }
        }
    }
    // Bulk: ggml's dequantization of ggml's bytes for each bulk case (hashed). We only have a
    // hash of ggml's bytes, so this needs our quantization to match first (the *_ref tests).
    for case in &g.bulk {
        let Some(want) = g.entries.get(&format!("hdq/{}/{}", ty.name(), case.name)) else {
            continue;
        };
        let q = ours(ty, &case.x, case.n_per_row, None);
        let q_want = &g.entries[&format!("hq/{}/{}", ty.name(), case.name)];
        if fnv64(&q) != u64::from_le_bytes(q_want[..8].try_into().unwrap()) {
            report.push(format!("bulk {}: cannot check, our quantization already differs (see {ty} Ref)", case.name));
            continue;
        }
        let mut got = vec![0f32; case.x.len()];
        dequantize(ty, &q, &mut got).unwrap();
        values += got.len();
        if fnv64(&f32_bytes(&got)) != u64::from_le_bytes(want[..8].try_into().unwrap()) {
            report.push(format!("bulk {}: hash of our dequantization differs from ggml's", case.name));
        }
    }
    // Bulk random blocks (all 65536 patterns for F16/BF16), regenerated from the seed.
    let hrb = &g.entries[&format!("hrb/{}", ty.name())];
    let seed = u64::from_le_bytes(hrb[0..8].try_into().unwrap());
    let n_blocks = le_u32(hrb, 8) as usize;
    let (bytes_hash, out_hash) =
        (u64::from_le_bytes(hrb[12..20].try_into().unwrap()), u64::from_le_bytes(hrb[20..28].try_into().unwrap()));
    let rb = if matches!(ty, GgmlType::F16 | GgmlType::BF16) {
        (0..=u16::MAX).flat_map(u16::to_le_bytes).collect()
    } else {
        random_blocks(&mut Rng(seed), ty, n_blocks)
    };
    assert_eq!(fnv64(&rb), bytes_hash, "hrb/{ty}: regenerated blocks differ from make_golden.py's");
    let mut got = vec![0f32; n_blocks * blck];
    dequantize(ty, &rb, &mut got).unwrap();
    values += got.len();
    if fnv64(&f32_bytes(&got)) != out_hash {
        report.push(format!("hrb/{ty}: hash of our dequantization of {n_blocks} random blocks differs from ggml's"));
    }
    assert!(report.is_empty(), "{ty}: dequantization differs from ggml:\n{}", report.join("\n"));
    eprintln!("{ty}: {values} dequantized values bit-exact with ggml");
}

macro_rules! quantize_tests {
    ($($name:ident: $ty:ident $mode:ident;)*) => {$(
        #[test]
        fn $name() {
            check_quantize(GgmlType::$ty, Mode::$mode);
        }
    )*};
}

quantize_tests! {
    q4_0_ref: Q4_0 Ref;
    q4_1_ref: Q4_1 Ref;
    q5_0_ref: Q5_0 Ref;
    q5_1_ref: Q5_1 Ref;
    q8_0_ref: Q8_0 Ref;
    q8_1_ref: Q8_1 Ref;
    q4_k_ref: Q4_K Ref;
    q5_k_ref: Q5_K Ref;
    q6_k_ref: Q6_K Ref;
    q8_k_ref: Q8_K Ref;
    f16_ref: F16 Ref;
    bf16_ref: BF16 Ref;
    q4_0_imatrix: Q4_0 Imatrix;
    q4_1_imatrix: Q4_1 Imatrix;
    q5_0_imatrix: Q5_0 Imatrix;
    q5_1_imatrix: Q5_1 Imatrix;
    q8_0_imatrix_is_ignored: Q8_0 Imatrix;
    q4_k_imatrix: Q4_K Imatrix;
    q5_k_imatrix: Q5_K Imatrix;
    q6_k_imatrix: Q6_K Imatrix;
}

macro_rules! dequantize_tests {
    ($($name:ident: $ty:ident;)*) => {$(
        #[test]
        fn $name() {
            check_dequantize(GgmlType::$ty);
        }
    )*};
}

dequantize_tests! {
    dequantize_q4_0: Q4_0;
    dequantize_q4_1: Q4_1;
    dequantize_q5_0: Q5_0;
    dequantize_q5_1: Q5_1;
    dequantize_q8_0: Q8_0;
    dequantize_q4_k: Q4_K;
    dequantize_q5_k: Q5_K;
    dequantize_q6_k: Q6_K;
    dequantize_q8_k: Q8_K;
    dequantize_f16: F16;
    dequantize_bf16: BF16;
}

/// Every entry of golden.bin is one the tests above read: nothing ggml produced goes unchecked.
#[test]
fn every_golden_entry_is_checked() {
    let g = golden();
    let quantized = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "F16", "BF16"];
    let imatrix = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"];
    let dequantized = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "F16", "BF16"];
    for key in g.entries.keys() {
        let parts: Vec<&str> = key.split('/').collect();
        let ok = match parts.as_slice() {
            ["meta"] | ["case", _] => true,
            ["q", t, _] => quantized.contains(t),
            ["qi", t, _] => imatrix.contains(t),
            ["dq", t, _] | ["dqr", t] | ["rb", t] | ["hdq", t, _] | ["hrb", t] => dequantized.contains(t),
            ["bulk", _] => true,
            ["hq", t, _] => quantized.contains(t),
            ["hqi", t, _] => imatrix.contains(t),
            _ => false,
        };
        assert!(ok, "golden.bin entry {key} is not checked by any test");
    }
    let meta = std::str::from_utf8(&g.entries["meta"]).unwrap();
    assert!(meta.contains("0c1e57098"), "meta does not name the llama.cpp commit:\n{meta}");
}
