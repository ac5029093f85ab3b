//! `--calibrate`: statistics recorded and stored, and the measured importance matrix used
//! for the K-quants (bit-exact with quantizing the source under that matrix).

mod common;

use common::{TempDir, fixture};
use duet_convert::{CalibrateOptions, Conversion, Options, Preset, Quiet};
use duet_quant::GgmlType;
use duet_quant::gguf::GgufFile;
use duet_runtime::tools::calibrate::CalibrationReport;

fn text() -> std::path::PathBuf {
    duet_test_support::repo_root().join("tests/smollm2/text.txt")
}

#[test]
fn calibration_stats_are_stored_and_steer_k_quants() {
    let dir = TempDir::new("calibrate");
    let out = dir.join("cal.gguf");
    let opts = Options {
        input: fixture("diffllama-gqa"),
        preset: Preset::Q4KM,
        overrides: vec![],
        imatrix: None,
        keep_dex: false,
        threads: 2,
        name: None,
    };
    let cal = CalibrateOptions { text: text(), ctx: 128, max_tokens: 512, threads: 2 };
    let (conv, report) = Conversion::prepare_calibrated(&opts, &cal, &Quiet).unwrap();
    conv.write(&out, 2, &Quiet).unwrap();

    // The report: 512 tokens, per-head arrays of the right size, consistent order statistics.
    assert_eq!(report.tokens, 512);
    let (l, h, kv) = (2, 4, 2);
    assert_eq!(report.q.0.len(), l * h);
    assert_eq!(report.logits.1.len(), l * h);
    assert_eq!(report.k.0.len(), l * kv);
    assert_eq!(report.hidden.0.len(), l);
    for (absmax, p999) in [&report.q, &report.k, &report.v, &report.logits, &report.hidden] {
        for (a, p) in absmax.iter().zip(p999) {
            assert!(*a > 0.0 && *p > 0.0 && *p <= *a * 1.04, "p99.9 {p} vs absmax {a}");
        }
    }
    let t = report.logits_top;
    assert!(t[0] >= t[1] && t[1] >= t[2] && t[2] >= t[3] && t[3] >= t[4] && t[4] >= t[5], "{t:?}");
    assert_eq!(t[0], report.logits.0.iter().fold(0f32, |m, &x| m.max(x)), "top-1 is the largest per-head absmax");
    // Seven linears per layer plus the output.
    assert_eq!(report.imatrix.len(), 7 * l + 1);

    // Stored in the file, and read back identically.
    let file = GgufFile::open(&out).unwrap();
    let back = CalibrationReport::from_gguf(&file).unwrap().expect("calibration keys present");
    assert_eq!(back, report);

    // Every K-quant tensor equals quantizing the source with the stored importance matrix.
    let src = Conversion::prepare(&Options { preset: Preset::F32, ..opts.clone() }).unwrap();
    let f32_path = dir.join("src.f32.gguf");
    src.write(&f32_path, 2, &Quiet).unwrap();
    let f32_file = GgufFile::open(&f32_path).unwrap();
    let mut checked = 0;
    for t in file.tensors() {
        if !matches!(t.ggml_type(), GgmlType::Q4_K | GgmlType::Q6_K) {
            continue;
        }
        let source: Vec<f32> = f32_file
            .tensor_data(f32_file.tensor(t.name()).unwrap())
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let n_per_row = t.dims()[0] as usize;
        let mut want = vec![0u8; file.tensor_data(t).len()];
        let Some(imatrix) = report.imatrix.get(t.name()) else {
            // Token embeddings have no input activations, hence no importance matrix.
            assert_eq!(t.name(), "token_embd.weight");
            duet_quant::quantize(t.ggml_type(), &source, n_per_row, &mut want).unwrap();
            assert!(file.tensor_data(t) == &want[..]);
            continue;
        };
        duet_quant::quantize_with_imatrix(t.ggml_type(), &source, n_per_row, imatrix, &mut want).unwrap();
        assert!(file.tensor_data(t) == &want[..], "{} is not quantized with the calibration imatrix", t.name());
        let mut plain = vec![0u8; want.len()];
        duet_quant::quantize(t.ggml_type(), &source, n_per_row, &mut plain).unwrap();
        assert_ne!(plain, want, "{}: the imatrix changed nothing", t.name());
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} K-quant tensors checked");
}

#[test]
fn calibrate_and_imatrix_are_exclusive() {
    let opts = Options {
        input: fixture("llama-gqa"),
        preset: Preset::Q4KM,
        overrides: vec![],
        imatrix: Some("x.dat".into()),
        keep_dex: false,
        threads: 2,
        name: None,
    };
    let cal = CalibrateOptions { text: text(), ctx: 64, max_tokens: 64, threads: 2 };
    let e = Conversion::prepare_calibrated(&opts, &cal, &Quiet).err().unwrap().to_string();
    assert!(e.contains("drop --imatrix"), "{e}");
}
