//! `duet convert` as users run it (the binary: exit status, stderr, files left behind).
//!
//! Acceptance #6: every bad input is refused with a message that names the problem, a
//! non-zero exit status and no panic or backtrace, and leaves no output file and no temporary
//! file behind: missing directory / config.json / tokenizer.json / weights / shard, corrupt
//! safetensors (truncated, header length past the end), unknown model_type, config/shape
//! mismatches, odd diffllama head counts, DIFF V2 checkpoints whose pairs, lambda_proj or
//! q_proj do not fit, an unsupported dtype, an output path that is one
//! of the inputs (refused, input untouched) and a full disk (a 64 KiB tmpfs when root may
//! mount one, and always RLIMIT_FSIZE).
//! Also: --dry-run prints the plan and the exact size of the file a real run writes, and
//! --tensor-type overrides apply.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use duet_quant::gguf::GgufFile;

const DUET: &str = env!("CARGO_BIN_EXE_duet");

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models").join(name)
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "duet-cli-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A copy of a fixture directory (files only) at `dst`.
fn copy_fixture(name: &str, dst: &Path) -> PathBuf {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    dst.to_path_buf()
}

/// Every entry of `dir` (hidden ones included) with its size, sorted. An entry that is
/// gone by the time its size is read is left out: `signals_leave_no_file` lists TMPDIR
/// while the converter is still creating and removing its files there (it failed once on
/// such a race, NotFound from the size of a file read_dir had just listed).
fn listing(dir: &Path) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let len = match e.metadata() {
                Ok(m) => m.len(),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => return None,
                Err(err) => panic!("{}: {err}", e.path().display()),
            };
            Some((e.file_name().to_string_lossy().into_owned(), len))
        })
        .collect();
    v.sort();
    v
}

fn duet<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(DUET).args(args).env_remove("RUST_BACKTRACE").output().expect("run duet")
}

/// `duet convert INPUT -q ARGS… -o OUTPUT`.
fn convert(input: &Path, args: &[&str], output: &Path) -> Output {
    duet(
        [OsStr::new("convert"), input.as_os_str(), OsStr::new("-q")]
            .into_iter()
            .chain(args.iter().map(OsStr::new))
            .chain([OsStr::new("-o"), output.as_os_str()]),
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A refusal as users see it: exit status 1, every `needle` in stderr, no panic.
fn assert_refused(what: &str, out: &Output, needles: &[&str]) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: exit status; stderr:\n{err}");
    for n in needles {
        assert!(err.contains(n), "{what}: stderr lacks {n:?}:\n{err}");
    }
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE"] {
        assert!(!err.contains(bad), "{what}: {bad} in stderr:\n{err}");
    }
    assert!(err.starts_with("error: "), "{what}: one error report:\n{err}");
    err
}

/// Converts `input` into an empty directory, expects a refusal naming `needles`, and checks
/// that the directory is still empty (no output, no temporary file) and the input unchanged.
fn refused(what: &str, input: &Path, needles: &[&str]) -> String {
    let out_dir = TempDir::new("out");
    let before = if input.is_dir() { listing(input) } else { vec![] };
    let out = convert(input, &["--type", "q4_k_m"], &out_dir.join("out.gguf"));
    let err = assert_refused(what, &out, needles);
    assert!(listing(&out_dir.0).is_empty(), "{what}: left {:?}", listing(&out_dir.0));
    if input.is_dir() {
        assert_eq!(listing(input), before, "{what}: the input directory changed");
    }
    err
}

/// Rewrites `dir/config.json` replacing `from` (which must occur) by `to`.
fn edit_config(dir: &Path, from: &str, to: &str) {
    let p = dir.join("config.json");
    let s = std::fs::read_to_string(&p).unwrap();
    assert!(s.contains(from), "config.json has no {from:?}");
    std::fs::write(&p, s.replace(from, to)).unwrap();
}

#[test]
fn missing_inputs_are_named() {
    let t = TempDir::new("missing");
    let gone = t.join("no-such-model");
    refused("missing directory", &gone, &["no-such-model", "no such file or directory"]);

    let d = copy_fixture("diffllama-gqa", &t.join("no-config"));
    std::fs::remove_file(d.join("config.json")).unwrap();
    refused("missing config.json", &d, &["config.json", "not found"]);

    let d = copy_fixture("diffllama-gqa", &t.join("no-tokenizer"));
    std::fs::remove_file(d.join("tokenizer.json")).unwrap();
    refused("missing tokenizer.json", &d, &["tokenizer.json", "not found"]);

    let d = copy_fixture("diffllama-gqa", &t.join("no-weights"));
    std::fs::remove_file(d.join("model.safetensors")).unwrap();
    refused("missing weights", &d, &["no model.safetensors or model.safetensors.index.json"]);

    let d = copy_fixture("diffllama-gqa", &t.join("missing-shard"));
    std::fs::rename(d.join("model.safetensors"), d.join("model-00001-of-00002.safetensors")).unwrap();
    std::fs::write(
        d.join("model.safetensors.index.json"),
        r#"{"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors",
                            "lm_head.weight": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    refused("missing shard", &d, &["model-00002-of-00002.safetensors", "No such file"]);
}

#[test]
fn corrupt_safetensors_are_refused() {
    let t = TempDir::new("corrupt");
    let st = std::fs::read(fixture("diffllama-gqa").join("model.safetensors")).unwrap();

    let d = copy_fixture("diffllama-gqa", &t.join("truncated"));
    std::fs::write(d.join("model.safetensors"), &st[..st.len() * 2 / 3]).unwrap();
    refused("truncated safetensors", &d, &["model.safetensors", "lies outside the"]);

    let d = copy_fixture("diffllama-gqa", &t.join("header-past-eof"));
    let mut b = st.clone();
    b[..8].copy_from_slice(&(st.len() as u64 + 100).to_le_bytes());
    std::fs::write(d.join("model.safetensors"), &b).unwrap();
    refused("header length past EOF", &d, &["model.safetensors", "header length", "runs past the end of the file"]);

    let d = copy_fixture("diffllama-gqa", &t.join("stub"));
    std::fs::write(d.join("model.safetensors"), b"\x10\0\0").unwrap();
    refused("3-byte safetensors", &d, &["model.safetensors", "too short for a safetensors header"]);

    let d = copy_fixture("diffllama-gqa", &t.join("header-not-json"));
    let mut b = st.clone();
    b[8] = b'#';
    std::fs::write(d.join("model.safetensors"), &b).unwrap();
    refused("header not JSON", &d, &["model.safetensors", "header is not valid JSON"]);
}

#[test]
fn corrupt_gguf_inputs_are_refused() {
    let t = TempDir::new("corrupt-gguf");
    let g = t.join("good.gguf");
    let out = convert(&fixture("llama-gqa"), &["--type", "q8_0"], &g);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bytes = std::fs::read(&g).unwrap();
    let header_cut = t.join("header-cut.gguf");
    std::fs::write(&header_cut, &bytes[..2000]).unwrap();
    refused("GGUF cut inside its header", &header_cut, &["header-cut.gguf", "bytes left in the file"]);
    let data_cut = t.join("data-cut.gguf");
    std::fs::write(&data_cut, &bytes[..bytes.len() - 1000]).unwrap();
    refused("GGUF cut inside its data", &data_cut, &["data-cut.gguf", "ends past the end of the file"]);
    // A file that is neither a directory nor a checkpoint part is read as GGUF and its magic
    // checked (a lone .safetensors file has its own message, tested above).
    let not_gguf = t.join("weights.bin");
    std::fs::copy(fixture("llama-gqa").join("model.safetensors"), &not_gguf).unwrap();
    refused("a safetensors file under another name", &not_gguf, &["weights.bin", "not a GGUF file"]);
}

#[test]
fn config_problems_are_refused() {
    let t = TempDir::new("config");

    let d = copy_fixture("diffllama-gqa", &t.join("mistral"));
    edit_config(&d, r#""model_type": "diffllama""#, r#""model_type": "mistral""#);
    refused("unknown model_type", &d, &["config.json", r#"model_type "mistral" is not supported"#]);

    let d = copy_fixture("diffllama-gqa", &t.join("hidden"));
    edit_config(&d, r#""hidden_size": 256"#, r#""hidden_size": 128"#);
    refused(
        "hidden_size edited",
        &d,
        &["model.embed_tokens.weight", "has shape [320, 256] but config.json implies [320, 128]"],
    );

    let d = copy_fixture("diffllama-gqa", &t.join("more-layers"));
    edit_config(&d, r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 3"#);
    refused("num_hidden_layers + 1", &d, &["no tensor 'model.layers.2.", "which config.json implies"]);

    let d = copy_fixture("diffllama-gqa", &t.join("fewer-layers"));
    edit_config(&d, r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 1"#);
    refused("num_hidden_layers - 1", &d, &["does not explain", "model.layers.1.", "refusing to drop weights"]);

    let d = copy_fixture("diffllama-gqa", &t.join("odd-heads"));
    edit_config(&d, r#""num_attention_heads": 4"#, r#""num_attention_heads": 3"#);
    edit_config(&d, r#""num_key_value_heads": 2"#, r#""num_key_value_heads": 3"#);
    refused("odd diffllama heads", &d, &["config.json", "diffllama needs even head counts", "num_attention_heads = 3"]);

    let d = copy_fixture("diffllama-gqa", &t.join("config-not-json"));
    std::fs::write(d.join("config.json"), "{\"model_type\": ").unwrap();
    refused("config.json not JSON", &d, &["config.json", "not valid JSON"]);

    let d = copy_fixture("diffllama-gqa", &t.join("vocab"));
    edit_config(&d, r#""vocab_size": 320"#, r#""vocab_size": 300"#);
    // The tensors are checked against config.json before the tokenizer is read (a vocabulary
    // the tensors do not bound is never trusted), so the embedding's shape is what disagrees.
    refused("vocab_size below the tensors'", &d, &["model.safetensors", "config.json implies [300, 256]"]);

    // Values no model has are refused, never truncated or replaced by a default.
    for (i, (from, to, needles)) in [
        (r#""rms_norm_eps": 1e-05"#, r#""rms_norm_eps": -1"#, &[r#""rms_norm_eps" is -1"#][..]),
        (r#""rms_norm_eps": 1e-05"#, r#""rms_norm_eps": "NaN""#, &[r#""rms_norm_eps" is not a number"#]),
        (r#""rope_theta": 10000.0"#, r#""rope_theta": 0"#, &[r#""rope_theta" is 0"#]),
        (
            r#""max_position_embeddings": 256"#,
            r#""max_position_embeddings": 9223372036854775808"#,
            &[r#""max_position_embeddings" is 9223372036854775808, more than GGUF's 32-bit field holds"#],
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let d = copy_fixture("diffllama-gqa", &t.join(format!("values-{i}")));
        edit_config(&d, from, to);
        refused(to, &d, needles);
    }
}

/// A checkpoint holding a NaN or an infinity is refused with the tensor, row and column
/// named, not converted into a silently broken model.
#[test]
fn non_finite_weights_are_refused() {
    let t = TempDir::new("nan");
    for (i, bad) in ["nan", "inf"].into_iter().enumerate() {
        let d = copy_fixture("diffllama-gqa", &t.join(format!("ckpt-{i}")));
        let p = d.join("model.safetensors");
        let mut b = std::fs::read(&p).unwrap();
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
        let meta = &header["model.layers.1.mlp.down_proj.weight"];
        let start = 8 + n + meta["data_offsets"][0].as_u64().unwrap() as usize;
        let cols = meta["shape"][1].as_u64().unwrap() as usize;
        // Row 2, column 5 of the tensor, in its dtype.
        let (bits, size): (u32, usize) = match (meta["dtype"].as_str().unwrap(), bad) {
            ("F32", "nan") => (0x7fc0_0000, 4),
            ("F32", _) => (0x7f80_0000, 4),
            ("BF16", "nan") => (0x7fc0, 2),
            ("BF16", _) => (0x7f80, 2),
            ("F16", "nan") => (0x7e00, 2),
            (_, _) => (0x7c00, 2),
        };
        let at = start + (2 * cols + 5) * size;
        b[at..at + size].copy_from_slice(&bits.to_le_bytes()[..size]);
        std::fs::write(&p, &b).unwrap();
        refused(bad, &d, &["blk.1.ffn_down.weight", "row 2, column 5", "not finite"]);
    }
}

/// DIFF V2 (duet's `diffllama_v2` checkpoint format): pairs that cannot share a KV head, a
/// missing lambda_proj and a q_proj that is not 2h·head_dim rows are refused by name.
#[test]
fn v2_checkpoint_problems_are_refused() {
    let t = TempDir::new("v2");

    let d = copy_fixture("diffllama-v2-gqa", &t.join("pairs-kv"));
    edit_config(&d, r#""num_key_value_heads": 2"#, r#""num_key_value_heads": 3"#);
    refused(
        "h not a multiple of h_kv",
        &d,
        &["config.json", "diffllama_v2", "num_attention_heads (4", "multiple of num_key_value_heads (3)"],
    );

    // Renaming layer 1's lambda_proj in the safetensors header (same length, so every
    // offset stays valid) makes it missing.
    let d = copy_fixture("diffllama-v2-gqa", &t.join("no-lambda"));
    let st = d.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    let (from, to) = (b"layers.1.self_attn.lambda_proj", b"layers.1.self_attn.lambda_prox");
    let at = bytes.windows(from.len()).position(|w| w == from).expect("lambda_proj in the header");
    let mut edited = bytes.clone();
    edited[at..at + to.len()].copy_from_slice(to);
    std::fs::write(&st, edited).unwrap();
    refused("no lambda_proj", &d, &["no tensor 'model.layers.1.self_attn.lambda_proj.weight'"]);

    // h = 2 pairs in config.json, but q_proj holds 8 query heads of 32 (2h·d = 128 ≠ 256).
    let d = copy_fixture("diffllama-v2-gqa", &t.join("q-rows"));
    edit_config(&d, r#""num_attention_heads": 4"#, r#""num_attention_heads": 2"#);
    refused(
        "q_proj not 2h·d rows",
        &d,
        &["model.layers.0.self_attn.q_proj.weight", "has shape [256, 256] but config.json implies [128, 256]"],
    );
}

/// Every preset of a DIFF V2 checkpoint, read back by gguf-py: the architecture and head
/// counts, lambda_proj kept F32, every tensor's shape, and gguf-py's dequantization of every
/// tensor against the checkpoint's values. A b-bit block quantizer on these Gaussian weights
/// has a relative RMS error of about 1.2–1.4·2^−b (measured: Q8_0 5.4e-3, Q6_K 1.8e-2,
/// Q5_K 3.6e-2, Q4_K 7.2e-2, Q4_0 8.6e-2); the bound is 2.5·2^−b, F32 and BF16 exact.
#[test]
fn v2_every_preset_reads_back_in_gguf_py() {
    let test = "v2_every_preset_reads_back_in_gguf_py";
    let Some(python) = duet_test_support::oracle_python(test) else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/check_gguf_against_checkpoint.py");
    let t = TempDir::new("v2-presets");
    let input = fixture("diffllama-v2-gqa");
    for preset in duet_convert::Preset::ALL {
        let target = t.join(format!("{}.gguf", preset.name()));
        let out = convert(&input, &["--type", preset.name()], &target);
        assert!(out.status.success(), "{}: {}", preset.name(), text(&out.stderr));
        let report = duet_test_support::run_python(&python, &script, &[target.as_os_str(), input.as_os_str()]);
        let lines: Vec<Vec<&str>> = report.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[0], ["arch", "diffllama_v2"], "{}", preset.name());
        assert_eq!(lines[1], ["heads", "8", "2"], "{}: 2h query heads, h_kv KV heads", preset.name());
        let tensors: Vec<&Vec<&str>> = lines.iter().filter(|l| l[0] == "tensor").collect();
        assert_eq!(tensors.len(), GgufFile::open(&target).unwrap().tensors().len(), "{}", preset.name());
        assert_eq!(tensors.len(), 23, "{}: 2 layers × 11 + embeddings, norm, output", preset.name());
        for l in &tensors {
            let (name, ty, dims, err) = (l[1], l[2], l[3], l[4].parse::<f64>().unwrap());
            let what = format!("{} {name} ({ty})", preset.name());
            if name.ends_with("attn_lambda.weight") {
                assert_eq!((ty, dims), ("F32", "256x4"), "{what}: lambda_proj is hidden → h, kept F32");
            }
            if name.ends_with("attn_q.weight") {
                assert_eq!(dims, "256x256", "{what}: 2h·d = 8·32 rows");
            }
            if name.ends_with("attn_output.weight") {
                assert_eq!(dims, "128x256", "{what}: reads h·d = 4·32");
            }
            let bits = match ty {
                "F32" | "BF16" => None,
                "F16" => Some(10),
                "Q8_0" => Some(8),
                "Q6_K" => Some(6),
                "Q5_K" | "Q5_0" | "Q5_1" => Some(5),
                "Q4_K" | "Q4_0" | "Q4_1" => Some(4),
                other => panic!("{what}: unexpected type {other}"),
            };
            let bound = bits.map_or(0.0, |b| 2.5 * 2f64.powi(-b));
            assert!(err <= bound, "{what}: gguf-py reads values {err:.2e} from the checkpoint's (bound {bound:.1e})");
        }
    }
}

#[test]
fn unsupported_dtype_is_refused() {
    let t = TempDir::new("dtype");
    let d = copy_fixture("llama-gqa", &t.join("i64"));
    // Append an I64 tensor (as some checkpoints carry position_ids) to the safetensors file.
    let st = std::fs::read(d.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&st[8..8 + n]).unwrap().trim_end();
    let data = &st[8 + n..];
    let entry = format!(
        r#","model.position_ids":{{"dtype":"I64","shape":[4],"data_offsets":[{},{}]}}}}"#,
        data.len(),
        data.len() + 32
    );
    let header = format!("{}{}", header.strip_suffix('}').unwrap(), entry);
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&[0u8; 32]);
    std::fs::write(d.join("model.safetensors"), out).unwrap();
    refused("I64 tensor", &d, &["model.safetensors", "'model.position_ids' has dtype I64", "only F32, F16 and BF16"]);
}

#[test]
fn output_path_equal_to_an_input_is_refused() {
    let t = TempDir::new("overwrite");
    let d = copy_fixture("llama-gqa", &t.join("llama-gqa"));
    let before: Vec<(String, Vec<u8>)> =
        listing(&d).into_iter().map(|(n, _)| (n.clone(), std::fs::read(d.join(&n)).unwrap())).collect();
    let spelled_otherwise = d.join("..").join("llama-gqa").join("tokenizer.json");
    for target in [d.join("model.safetensors"), d.join("config.json"), spelled_otherwise] {
        let out = convert(&d, &[], &target);
        assert_refused("output = an input file", &out, &["refusing to overwrite the input file"]);
        let after: Vec<(String, Vec<u8>)> =
            listing(&d).into_iter().map(|(n, _)| (n.clone(), std::fs::read(d.join(&n)).unwrap())).collect();
        assert!(after == before, "{}: the input directory changed", target.display());
    }
    // The directory itself.
    let out = convert(&d, &[], &d);
    assert_refused("output = the input directory", &out, &["is a directory"]);
    assert_eq!(listing(&d).len(), before.len());

    // A GGUF converted in place.
    let g = t.join("model.gguf");
    let out = convert(&d, &["--type", "q8_0"], &g);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let gguf = std::fs::read(&g).unwrap();
    let out = convert(&g, &["--type", "q4_0"], &g);
    assert_refused("GGUF output = its input", &out, &["refusing to overwrite the input file"]);
    assert!(std::fs::read(&g).unwrap() == gguf, "the input GGUF changed");

    // The importance matrix is an input too (a llama.cpp legacy .dat with one entry).
    let im = t.join("imatrix.dat");
    let mut dat = 1i32.to_le_bytes().to_vec();
    let name = b"blk.0.attn_q.weight";
    dat.extend((name.len() as i32).to_le_bytes());
    dat.extend(name);
    dat.extend(1i32.to_le_bytes()); // ncall
    dat.extend(64i32.to_le_bytes()); // nval = hidden size of llama-gqa
    dat.extend((0..64).flat_map(|i| (1.0f32 + i as f32).to_le_bytes()));
    std::fs::write(&im, &dat).unwrap();
    let out = convert(&d, &["--type", "q4_0", "--imatrix", im.to_str().unwrap()], &im);
    assert_refused("output = the imatrix", &out, &["refusing to overwrite the input file", "imatrix.dat"]);
    assert!(std::fs::read(&im).unwrap() == dat, "the imatrix changed");

    let names: Vec<String> = listing(&t.0).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["imatrix.dat", "llama-gqa", "model.gguf"], "no temporary file is left");
}

/// A target that is not a regular file is never replaced (`-o /dev/null` once turned the
/// device into an 11 MB file when run as root): a FIFO made for the test, a symbolic link
/// to a file, a directory. Each refusal names the target and leaves it as it was, and no
/// temporary file behind.
#[test]
fn special_targets_are_refused() {
    let t = TempDir::new("special");
    let fifo = t.join("out.gguf");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success(), "mkfifo failed");
    let out = convert(&fixture("llama-gqa"), &["--type", "q8_0"], &fifo);
    assert_refused("output = a FIFO", &out, &["out.gguf", "not a regular file"]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
        let target = t.join("real.gguf");
        std::fs::write(&target, b"keep").unwrap();
        let link = t.join("link.gguf");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let out = convert(&fixture("llama-gqa"), &["--type", "q8_0"], &link);
        assert_refused("output = a symbolic link", &out, &["link.gguf", "symbolic link"]);
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link was replaced");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }
    let names: Vec<String> = listing(&t.0).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["link.gguf", "out.gguf", "real.gguf"], "no temporary file is left");
}

/// An interrupted conversion (SIGINT, SIGTERM or SIGHUP) leaves nothing: not its output's
/// temporary file, not calibration's temporary F16 model in TMPDIR.
#[cfg(unix)]
#[test]
fn signals_leave_no_file() {
    let t = TempDir::new("signal");
    let tmp = t.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out_dir = t.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    // A long calibration text keeps the command busy after its temporary model exists.
    let text = t.join("calib.txt");
    std::fs::write(&text, "the quick brown fox jumps over the lazy dog. ".repeat(20_000)).unwrap();
    for signal in ["INT", "TERM", "HUP"] {
        let mut child = Command::new(DUET)
            .args(["convert", "-q", "--type", "q4_k_m", "--calibrate"])
            .arg(&text)
            .arg(fixture("llama-gqa"))
            .arg("-o")
            .arg(out_dir.join("out.gguf"))
            .env("TMPDIR", &tmp)
            .env("XDG_RUNTIME_DIR", &t.0)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run duet");
        // Wait (up to 60 s) for calibration's temporary model, then signal.
        let t0 = std::time::Instant::now();
        while listing(&tmp).is_empty() && t0.elapsed().as_secs() < 60 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!listing(&tmp).is_empty(), "SIG{signal}: no temporary model appeared");
        let sent = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status().unwrap();
        assert!(sent.success());
        let status = child.wait().unwrap();
        assert!(!status.success(), "SIG{signal}: the conversion finished before the signal");
        assert!(listing(&tmp).is_empty(), "SIG{signal}: left {:?} in TMPDIR", listing(&tmp));
        assert!(listing(&out_dir).is_empty(), "SIG{signal}: left {:?} beside the output", listing(&out_dir));
    }
}

/// Runs a conversion whose writes fail, and checks the report and that `out_dir` stays empty.
fn full_disk_case(what: &str, out: Output, out_dir: &Path, needle: &str) {
    assert_refused(what, &out, &[needle, "out.gguf"]);
    assert!(listing(out_dir).is_empty(), "{what}: left {:?}", listing(out_dir));
}

#[test]
fn full_disk_leaves_no_file() {
    let input = fixture("diffllama-gqa");
    // RLIMIT_FSIZE (16 blocks): every write past it fails with EFBIG instead of killing us.
    let t = TempDir::new("fsize");
    let target = t.join("out.gguf");
    let out = Command::new("sh")
        .args(["-c", r#"trap '' XFSZ; ulimit -f 16; exec "$0" "$@""#, DUET, "convert"])
        .arg(&input)
        .args(["-q", "--type", "f32", "-o"])
        .arg(&target)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    full_disk_case("RLIMIT_FSIZE", out, &t.0, "File too large");

    // A real full file system, where root may mount one.
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| text(&o.stdout).trim() == "0");
    let m = TempDir::new("tmpfs");
    let mounted = is_root
        && Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(&m.0)
            .output()
            .is_ok_and(|o| o.status.success());
    if !mounted {
        duet_test_support::machine_lacks(
            "full_disk (tmpfs case)",
            "DUET_REQUIRE_TMPFS",
            "no tmpfs (not root, or mounting is not permitted): RLIMIT_FSIZE covered the full disk",
        );
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _guard = Unmount(&m.0);
    let out = convert(&input, &["--type", "q8_0"], &m.join("out.gguf"));
    full_disk_case("64 KiB tmpfs", out, &m.0, "No space left on device");
}

/// `duet convert --dry-run` output: (tensor name → type name, file size in bytes).
fn dry_run(input: &Path, preset: &str, extra: &[&str], out_dir: &Path) -> (Vec<(String, String)>, u64) {
    let mut args: Vec<&OsStr> = vec![
        OsStr::new("convert"),
        input.as_os_str(),
        OsStr::new("--dry-run"),
        OsStr::new("--type"),
        OsStr::new(preset),
    ];
    args.extend(extra.iter().map(OsStr::new));
    let target = out_dir.join("dry.gguf");
    args.extend([OsStr::new("-o"), target.as_os_str()]);
    let out = duet(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!target.exists() && listing(out_dir).is_empty(), "a dry run writes nothing");
    let stdout = text(&out.stdout);
    let size_line = stdout.lines().find(|l| l.starts_with("file size: ")).expect("a file size line");
    let bytes: u64 = size_line.split('(').nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    let plan = stdout
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (name, ty) = (w.next()?, w.next()?);
            (name.contains('.') && name.ends_with("weight") || name.ends_with("bias"))
                .then(|| (name.to_string(), ty.to_string()))
        })
        .collect();
    (plan, bytes)
}

#[test]
fn dry_run_prints_the_plan_and_the_exact_size() {
    let t = TempDir::new("dry");
    let smol = duet_test_support::asset(
        "dry_run_prints_the_plan_and_the_exact_size",
        "DUET_SMOLLM2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    );
    let mut cases: Vec<(PathBuf, &str, Vec<&str>)> = vec![
        (fixture("diffllama-gqa"), "q4_k_m", vec![]),
        (fixture("diffllama-gqa"), "q4_k_s", vec!["--tensor-type", r"attn_q=q8_0"]),
        (fixture("diffllama-tied-llama3"), "q5_k_m", vec![]),
        (fixture("llama-dex"), "q6_k", vec!["--keep-dex"]),
        (fixture("llama-gqa"), "bf16", vec![]),
    ];
    if let Some(s) = &smol {
        cases.push((s.clone(), "q4_k_m", vec![]));
    }
    for (input, preset, extra) in &cases {
        let what = format!("{} {preset} {extra:?}", input.display());
        let (plan, bytes) = dry_run(input, preset, extra, &t.0);
        let target = t.join("real.gguf");
        let mut args: Vec<&OsStr> =
            vec![OsStr::new("convert"), input.as_os_str(), OsStr::new("-q"), OsStr::new("--type"), OsStr::new(preset)];
        args.extend(extra.iter().map(OsStr::new));
        args.extend([OsStr::new("-o"), target.as_os_str()]);
        let out = duet(&args);
        assert!(out.status.success(), "{what}: {}", text(&out.stderr));
        assert_eq!(std::fs::metadata(&target).unwrap().len(), bytes, "{what}: dry-run size");
        let f = GgufFile::open(&target).unwrap();
        assert_eq!(plan.len(), f.tensors().len(), "{what}: one plan line per tensor");
        for (name, ty) in &plan {
            assert_eq!(f.tensor(name).map(|i| i.ggml_type().name()), Some(ty.as_str()), "{what}: {name}");
        }
        std::fs::remove_file(&target).unwrap();
    }
}

/// Runs `duet args…` and samples its peak resident memory (VmHWM) until it exits: KiB.
#[cfg(target_os = "linux")]
fn peak_rss_kib(args: &[&OsStr]) -> u64 {
    let mut child = Command::new(DUET).args(args).spawn().unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    loop {
        // VmHWM is the high-water mark: the last reading before exit is (nearly) the peak.
        if let Ok(s) = std::fs::read_to_string(&status)
            && let Some(kb) = s.lines().find_map(|l| l.strip_prefix("VmHWM:"))
        {
            peak = peak.max(kb.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0));
        }
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "duet {args:?} failed");
            return peak;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The converter streams: peak memory follows the largest tensor, not the model, for
/// safetensors and for GGUF inputs alike (each source tensor's pages are released after use).
#[cfg(target_os = "linux")]
#[test]
fn memory_stays_bounded_by_the_largest_tensor() {
    let t = TempDir::new("rss");
    let d = t.join("wide-llama");
    std::fs::create_dir_all(&d).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture("llama-gqa").join(f), d.join(f)).unwrap();
    }
    let (hidden, layers, vocab) = (1024usize, 5usize, 1024usize);
    std::fs::write(
        d.join("config.json"),
        format!(
            r#"{{"model_type": "llama", "hidden_size": {hidden}, "intermediate_size": {hidden},
                "num_hidden_layers": {layers}, "num_attention_heads": 8, "num_key_value_heads": 8,
                "vocab_size": {vocab}, "rms_norm_eps": 1e-5, "tie_word_embeddings": false}}"#
        ),
    )
    .unwrap();
    // 37 F32 matrices of 4 MiB (148 MiB): every one far smaller than the file.
    let mut names: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![vocab, hidden])];
    for l in 0..layers {
        for m in [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ] {
            names.push((format!("model.layers.{l}.{m}.weight"), vec![hidden, hidden]));
        }
        for n in ["input_layernorm", "post_attention_layernorm"] {
            names.push((format!("model.layers.{l}.{n}.weight"), vec![hidden]));
        }
    }
    names.push(("model.norm.weight".into(), vec![hidden]));
    names.push(("lm_head.weight".into(), vec![vocab, hidden]));
    let mut header = String::from("{");
    let mut offset = 0usize;
    for (i, (n, shape)) in names.iter().enumerate() {
        let len = shape.iter().product::<usize>() * 4;
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header += &format!(
            r#"{}"{n}":{{"dtype":"F32","shape":[{}],"data_offsets":[{offset},{}]}}"#,
            if i > 0 { "," } else { "" },
            dims.join(","),
            offset + len
        );
        offset += len;
    }
    header.push('}');
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(d.join("model.safetensors")).unwrap());
        f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
        f.write_all(header.as_bytes()).unwrap();
        let mut x = 0x2545_F491u32;
        for _ in 0..offset / 4 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            f.write_all(&((x >> 8) as f32 / (1 << 24) as f32 - 0.5).to_le_bytes()).unwrap();
        }
    }
    let file_mib = offset as u64 >> 20;
    assert!(file_mib >= 140);
    let limit_kib = 64 * 1024;

    let gguf = t.join("wide-f32.gguf");
    let hf = peak_rss_kib(&[
        OsStr::new("convert"),
        d.as_os_str(),
        OsStr::new("-q"),
        OsStr::new("--type"),
        OsStr::new("f32"),
        OsStr::new("-o"),
        gguf.as_os_str(),
    ]);
    assert!(hf < limit_kib, "safetensors input: peak RSS {hf} KiB for a {file_mib} MiB checkpoint of 4 MiB tensors");
    let q = t.join("wide-q8_0.gguf");
    let gg = peak_rss_kib(&[
        OsStr::new("convert"),
        gguf.as_os_str(),
        OsStr::new("-q"),
        OsStr::new("--type"),
        OsStr::new("q8_0"),
        OsStr::new("-o"),
        q.as_os_str(),
    ]);
    assert!(gg < limit_kib, "GGUF input: peak RSS {gg} KiB for a {file_mib} MiB GGUF of 4 MiB tensors");
    eprintln!("peak RSS: {hf} KiB from safetensors, {gg} KiB from GGUF ({file_mib} MiB inputs)");
}

#[test]
fn tensor_type_overrides_apply() {
    let t = TempDir::new("overrides");
    let target = t.join("o.gguf");
    let out = convert(
        &fixture("diffllama-gqa"),
        &[
            "--type",
            "q4_k_m",
            "--tensor-type",
            r"attn_v\.weight=q8_0",
            "--tensor-type",
            r"ffn_(up|gate)=q5_1",
            "--tensor-type",
            r"ffn_up=q4_0",
        ],
        &target,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let f = GgufFile::open(&target).unwrap();
    let ty = |n: &str| f.tensor(n).unwrap().ggml_type().name();
    for l in 0..2 {
        assert_eq!(ty(&format!("blk.{l}.attn_v.weight")), "Q8_0");
        assert_eq!(ty(&format!("blk.{l}.ffn_gate.weight")), "Q5_1");
        assert_eq!(ty(&format!("blk.{l}.ffn_up.weight")), "Q5_1", "the first matching rule wins");
        assert_eq!(ty(&format!("blk.{l}.attn_q.weight")), "Q4_K");
    }
    assert_eq!(ty("blk.1.ffn_down.weight"), "Q6_K", "unmatched tensors keep the preset's mix");
    assert_eq!(ty("blk.0.attn_norm.weight"), "F32", "norms are never quantized");

    // Malformed rules are usage errors (exit status 2), reported before anything is read.
    for (rule, needle) in [
        ("attn_v", "is not REGEX=TYPE"),
        ("attn_v=q3_k", "'q3_k' is not a type duet can write"),
        ("(=q8_0", "bad regex"),
    ] {
        let out = convert(&fixture("diffllama-gqa"), &["--tensor-type", rule], &target);
        assert_eq!(out.status.code(), Some(2), "{rule}");
        assert!(text(&out.stderr).contains(needle), "{rule}: {}", text(&out.stderr));
    }
}

#[test]
fn ctrl_c_leaves_no_file() {
    let Some(smol) = duet_test_support::asset("convert Ctrl-C", "DUET_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    else {
        return;
    };
    let dir = TempDir::new("ctrl-c");
    let out = dir.join("interrupted.gguf");
    let child = Command::new(env!("CARGO_BIN_EXE_duet"))
        .args([OsStr::new("convert"), smol.as_os_str(), OsStr::new("--type"), OsStr::new("q4_k_m"), OsStr::new("-o")])
        .arg(&out)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt once the temporary file exists (the conversion is under way).
    let started = std::time::Instant::now();
    while listing(&dir.0).is_empty() && started.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!listing(&dir.0).is_empty(), "the conversion never started writing");
    let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let outcome = child.wait_with_output().unwrap();
    assert_eq!(outcome.status.code(), Some(130), "{}", text(&outcome.stderr));
    assert!(text(&outcome.stderr).contains("interrupted"), "{}", text(&outcome.stderr));
    assert!(listing(&dir.0).is_empty(), "left behind: {:?}", listing(&dir.0));
}

#[test]
fn a_safetensors_file_asks_for_its_directory() {
    let st = fixture("llama-gqa").join("model.safetensors");
    let out = duet([OsStr::new("convert"), st.as_os_str(), OsStr::new("--dry-run")]);
    assert_refused("safetensors file", &out, &["pass the model directory"]);
}

/// generation_config.json's sampling values become llama.cpp's general.sampling.* keys, and
/// `duet run` takes them as its defaults (a flag overrides each).
#[test]
fn generation_config_sampling_becomes_the_run_defaults() {
    let t = TempDir::new("sampling");
    let src = copy_fixture("llama-gqa", &t.join("src"));
    std::fs::write(
        src.join("generation_config.json"),
        r#"{"do_sample": true, "temperature": 0.25, "top_k": 7, "top_p": 0.5, "min_p": 0.1, "repetition_penalty": 1.2, "eos_token_id": 2}"#,
    )
    .unwrap();
    let g = t.join("s.gguf");
    let out = convert(&src, &["--type", "f32"], &g);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let f = duet_quant::gguf::GgufFile::open(&g).unwrap();
    use duet_runtime::gguf_names::sampling as k;
    assert_eq!(f.get_f32(k::TEMP).unwrap(), 0.25);
    assert_eq!(f.get_i32(k::TOP_K).unwrap(), 7);
    assert_eq!((f.get_f32(k::TOP_P).unwrap(), f.get_f32(k::MIN_P).unwrap()), (0.5, 0.1));
    assert_eq!(f.get_f32(k::PENALTY_REPEAT).unwrap(), 1.2);
    // Re-quantizing keeps them.
    let q = t.join("q.gguf");
    assert!(convert(&g, &["--type", "q8_0"], &q).status.success());
    assert_eq!(duet_quant::gguf::GgufFile::open(&q).unwrap().get_i32(k::TOP_K).unwrap(), 7);
    let run = duet(["run", "-m", g.to_str().unwrap(), "-p", "hi", "-n", "2", "--device", "cpu", "--top-k", "3"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(
        text(&run.stderr).contains("sampling defaults from the model (general.sampling.*): temp 0.25, top-k 7, top-p 0.5, min-p 0.1, repeat-penalty 1.2"),
        "{}",
        text(&run.stderr)
    );
}
