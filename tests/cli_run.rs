//! `duet run` / `chat` / `perplexity` / `bench` on bad input: a clear message naming the
//! problem, a non-zero exit, and never a panic or a backtrace.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use duet_quant::GgmlType;
use duet_quant::gguf::GgufWriter;

mod common;
use common::{rewrite_gguf, with_metadata};

fn duet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_duet")).args(args).env("RUST_BACKTRACE", "1").output().unwrap()
}

/// Runs `cmd` with `input` on its standard input; its output and status.
fn with_input(cmd: &mut Command, input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn fixture_gguf() -> PathBuf {
    // Converted once per test binary run from the committed tiny Llama fixture.
    let out = std::env::temp_dir().join(format!("duet-cli-run-{}.gguf", std::process::id()));
    if !out.exists() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/llama-gqa");
        let o = duet(&["convert", src.to_str().unwrap(), "--type", "q8_0", "-q", "-o", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    out
}

/// Fails with a message containing every needle, without panicking.
fn assert_clean_failure(o: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "expected failure, got success; stderr: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE") && !err.contains("stack backtrace"),
        "panic: {err}"
    );
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

#[test]
fn missing_model() {
    assert_clean_failure(
        &duet(&["run", "-m", "/nonexistent/model.gguf", "-p", "hi"]),
        &["/nonexistent/model.gguf", "no such"],
    );
    assert_clean_failure(&duet(&["chat", "-m", "/nonexistent/model.gguf"]), &["/nonexistent/model.gguf"]);
    assert_clean_failure(&duet(&["bench", "-m", "/nonexistent/model.gguf"]), &["/nonexistent/model.gguf"]);
}

#[test]
fn not_a_gguf_file() {
    let p = std::env::temp_dir().join(format!("duet-not-gguf-{}.gguf", std::process::id()));
    std::fs::write(&p, b"this is plain text, not a model").unwrap();
    assert_clean_failure(&duet(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]), &[p.to_str().unwrap(), "magic"]);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn unknown_architecture() {
    let p = std::env::temp_dir().join(format!("duet-mamba-{}.gguf", std::process::id()));
    let mut w = GgufWriter::new(&p);
    w.add("general.architecture", "mamba").unwrap();
    w.add_tensor("token_embd.weight", &[32, 4], GgmlType::F32).unwrap();
    let mut d = w.start().unwrap();
    d.write_tensor("token_embd.weight", &[0u8; 512]).unwrap();
    d.finish().unwrap();
    let o = duet(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]);
    assert_clean_failure(&o, &[p.to_str().unwrap(), "architecture 'mamba' is not supported"]);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn empty_prompt_and_prompt_longer_than_context() {
    let m = fixture_gguf();
    let m = m.to_str().unwrap();
    assert_clean_failure(&duet(&["run", "-m", m, "-p", ""]), &["prompt is empty"]);
    let long = "the watery part of the world ".repeat(40);
    assert_clean_failure(&duet(&["run", "-m", m, "-c", "32", "-p", &long]), &["context holds 32"]);
    // A normal run of the same model works.
    let ok = duet(&["run", "-m", m, "-p", "Call me", "-n", "4", "--temp", "0", "-q"]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
}

/// `duet chat` without -m runs the bundled DIFF model and names it; a DUET_DEFAULT_MODEL
/// that does not exist is a clean error.
#[test]
fn chat_without_model_uses_the_bundled_one() {
    let out = duet_test_support::output_with_stdin(
        Command::new(env!("CARGO_BIN_EXE_duet"))
            .args(["chat", "-n", "8", "--seed", "1", "--device", "cpu"])
            .env_remove("DUET_DEFAULT_MODEL"),
        b"Call me Ishmael.\n",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("no -m given: using duet's") && err.contains("DIFF"), "the model is not named: {err}");
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty(), "no reply");

    let o = Command::new(env!("CARGO_BIN_EXE_duet"))
        .args(["chat"])
        .env("DUET_DEFAULT_MODEL", "/nonexistent/default.gguf")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_clean_failure(&o, &["DUET_DEFAULT_MODEL", "/nonexistent/default.gguf"]);
}

/// `--attn-logits`: bad values and static scales without calibration are clean errors; a
/// valid setting runs and changes the perplexity (4-bit logits are a real perturbation).
#[test]
fn attn_logits_flag() {
    let m = fixture_gguf();
    let m = m.to_str().unwrap();
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prompt.txt");
    let ppl = |extra: &[&str]| -> f64 {
        let mut args = vec!["perplexity", "-m", m, "-f", text.to_str().unwrap(), "--device", "cpu"];
        args.extend(extra);
        let o = duet(&args);
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{err}");
        let line = out.lines().find(|l| l.starts_with("PPL = ")).unwrap_or_else(|| panic!("no PPL line: {out}"));
        line["PPL = ".len()..].split_whitespace().next().unwrap().parse().unwrap()
    };
    let (plain, quantized) = (ppl(&[]), ppl(&["--attn-logits", "4:head"]));
    assert!((plain - quantized).abs() > 1e-3 * plain, "4-bit logits left the perplexity at {plain}");
    let bad = |value: &str, needles: &[&str]| {
        assert_clean_failure(&duet(&["run", "-m", m, "-p", "hi", "--attn-logits", value]), needles);
    };
    bad("1", &["bits must be 2 to 16"]);
    bad("4:diag", &["unknown granularity 'diag'"]);
    bad("x", &["'x' is not a bit count"]);
    bad("8:static", &[m, "no attention-logit calibration", "--calibrate"]);
}

/// `--score-second-half` scores what llama-perplexity scores: per chunk of n, the
/// predictions from position n/2 on (n − n/2 − 1 of them), against n − 1 by default.
#[test]
fn perplexity_scores_the_second_half_like_llama_perplexity() {
    let m = fixture_gguf();
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prompt.txt");
    let predictions = |extra: &[&str]| -> usize {
        let mut args = vec!["perplexity", "-q", "-m", m.to_str().unwrap(), "-f", text.to_str().unwrap()];
        args.extend(["--device", "cpu", "-c", "16", "--max-tokens", "40"]);
        args.extend(extra);
        let o = duet(&args);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let after = out.split(" over ").nth(1).unwrap_or_else(|| panic!("no count: {out}"));
        after.split_whitespace().next().unwrap().parse().unwrap()
    };
    // Chunks of 16, 16 and 8 tokens.
    assert_eq!(predictions(&[]), 15 + 15 + 7);
    assert_eq!(predictions(&["--score-second-half"]), 7 + 7 + 3);
}

/// The cell of column `column` in the row of test `test` of a `duet bench` Markdown table.
fn bench_cell(table: &str, test: &str, column: &str) -> String {
    let cells = |l: &str| l.split('|').map(|c| c.trim().to_string()).collect::<Vec<_>>();
    let header = cells(table.lines().find(|l| l.starts_with("| model")).unwrap_or_else(|| panic!("no table: {table}")));
    let at = |name: &str| header.iter().position(|h| h == name).unwrap_or_else(|| panic!("no column {name}: {table}"));
    let row = table.lines().map(cells).find(|r| r.get(at("test")).is_some_and(|t| t == test));
    row.unwrap_or_else(|| panic!("no {test} row: {table}"))[at(column)].clone()
}

/// Several models (repeated -m and commas), thread counts and depths: a row each, in every
/// output format; the Markdown table's columns aligned.
#[test]
fn bench_compares_models_threads_and_depths_in_every_format() {
    let m = fixture_gguf();
    let m = m.to_str().unwrap();
    let two = format!("{m},{m}");
    let args = ["bench", "-m", &two, "-t", "1,2", "-d", "0,4", "-p", "3", "-n", "2", "-r", "1", "--device", "cpu"];
    let o = duet(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = String::from_utf8_lossy(&o.stdout);
    let table: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
    // 2 models × 2 thread counts × 2 depths × (pp3, tg2), after the header and the rule.
    assert_eq!(table.len(), 2 + 16, "{md}");
    let width = table[0].chars().count();
    assert!(table.iter().all(|l| l.chars().count() == width), "aligned columns: {md}");
    assert_eq!(bench_cell(&md, "tg2 @ d4", "threads"), "1");
    for (format, rows) in [("csv", 16), ("jsonl", 16)] {
        let o = duet(&[&args[..], &["-o", format]].concat());
        let out = String::from_utf8_lossy(&o.stdout);
        let lines: Vec<&str> = out.lines().collect();
        match format {
            "csv" => {
                assert!(lines[0].starts_with("model,size_bytes,params,backend,threads"), "{out}");
                assert_eq!(lines.len(), 1 + rows, "{out}");
            }
            _ => {
                assert_eq!(lines.len(), rows, "{out}");
                for l in lines {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    assert!(v["tps"].as_f64().unwrap() > 0.0 && v["threads"].as_u64().is_some(), "{l}");
                }
            }
        }
    }
    let o = duet(&["bench", "-m", m, "-m", m, "-p", "3", "-n", "0", "-r", "1", "--device", "cpu", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2, "repeated -m: {v}");
    assert_eq!(v[0]["test"], "pp3");
    assert_clean_failure(&duet(&["run", "-m", &two, "-p", "x"]), &["this command takes one model"]);
    assert_clean_failure(&duet(&["run", "-m", m, "-t", "1,2", "-p", "x"]), &["this command takes one thread count"]);
}

#[test]
fn bench_parallel_reports_aggregate_decode_rows_and_refuses_zero() {
    let m = fixture_gguf();
    let m = m.to_str().unwrap();
    let o = duet(&["bench", "-m", m, "--device", "cpu", "-p", "0", "-n", "4", "-r", "1", "--parallel", "3"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rate: f64 = bench_cell(&out, "tg4 ×3", "t/s (median)").parse().unwrap();
    assert!(rate > 0.0, "{out}");
    assert_clean_failure(&duet(&["bench", "-m", m, "--parallel", "0"]), &["--parallel must be at least 1"]);
}

/// Decode rows give the weight streaming rate (every tensor but an untied embedding table,
/// once per token), consistent with their tokens/s; prompt rows have none; `--bandwidth`
/// adds the machine's read bandwidth.
#[test]
fn bench_reports_weight_streaming_and_bandwidth() {
    let m = fixture_gguf();
    let file = duet_quant::gguf::GgufFile::open(&m).unwrap();
    let total: u64 = file.tensors().iter().map(|t| t.n_bytes()).sum();
    let embd =
        if file.tensor("output.weight").is_some() { file.tensor("token_embd.weight").unwrap().n_bytes() } else { 0 };
    let o =
        duet(&["bench", "-m", m.to_str().unwrap(), "--device", "cpu", "-p", "3", "-n", "4", "-r", "1", "--bandwidth"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(bench_cell(&out, "pp3", "weights GB/s"), "—");
    let rate: f64 = bench_cell(&out, "tg4", "t/s (median)").parse().unwrap();
    let gbs: f64 = bench_cell(&out, "tg4", "weights GB/s").parse().unwrap();
    let want = (total - embd) as f64 * rate / 1e9;
    assert!((gbs - want).abs() <= 0.006 + 1e-3 * want, "{gbs} GB/s printed, {want} from {rate} t/s");
    let bw: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("memory read bandwidth: "))
        .and_then(|l| l.split(' ').next())
        .unwrap_or_else(|| panic!("no bandwidth line: {out}"))
        .parse()
        .unwrap();
    assert!(bw > 0.1, "{bw}");
}

/// `--save-logits` never replaces one of the command's inputs (the text, the model, the
/// base logits) or a file that is not a regular one (a FIFO made for the test): refused
/// before any work, the input unchanged.
#[test]
fn save_logits_refuses_inputs_and_special_files() {
    let m = fixture_gguf();
    let dir = std::env::temp_dir().join(format!("duet-save-logits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("corpus.txt");
    std::fs::write(&text, "Once upon a time there was a little model that wanted to speak.").unwrap();
    let model_bytes = std::fs::read(&m).unwrap();
    let (t, ms) = (text.to_str().unwrap(), m.to_str().unwrap());
    for target in [t, ms] {
        let o = duet(&["perplexity", "-q", "-m", ms, "-f", t, "--device", "cpu", "--save-logits", target]);
        assert_clean_failure(&o, &["--save-logits", "also an input"]);
    }
    assert_eq!(
        std::fs::read_to_string(&text).unwrap(),
        "Once upon a time there was a little model that wanted to speak."
    );
    assert!(std::fs::read(&m).unwrap() == model_bytes, "the model changed");
    let fifo = dir.join("logits.fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let o = duet(&["perplexity", "-q", "-m", ms, "-f", t, "--device", "cpu", "--save-logits", fifo.to_str().unwrap()]);
    assert_clean_failure(&o, &["--save-logits", "not a regular file"]);
    // A regular target is written, and no temporary file is left beside it.
    let out = dir.join("logits.dlog");
    let o = duet(&["perplexity", "-q", "-m", ms, "-f", t, "--device", "cpu", "--save-logits", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["corpus.txt", "logits.dlog", "logits.fifo"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Non-finite logits (here from a NaN in the final norm's weight) end generation with an
/// error that says so, not a silent end of generation with exit 0.
#[test]
fn non_finite_logits_are_an_error() {
    let m = fixture_gguf();
    let p = std::env::temp_dir().join(format!("duet-nan-norm-{}.gguf", std::process::id()));
    let f = duet_quant::gguf::GgufFile::open(&m).unwrap();
    let n = f.tensor("output_norm.weight").unwrap().n_elements() as usize;
    let nan: Vec<u8> = (0..n).flat_map(|_| f32::NAN.to_le_bytes()).collect();
    rewrite_gguf(&m, &p, &[], Some(("output_norm.weight", &nan)));
    let o = duet(&["run", "-m", p.to_str().unwrap(), "-p", "hi", "-n", "4", "--device", "cpu"]);
    assert_clean_failure(&o, &["logits for generated token 1 are not finite"]);
    let _ = std::fs::remove_file(&p);
}

/// Numbers no model has, refused with the key named before anything is sized by them
/// (block_count 2^31 once made every command abort allocating 7.7 TB); absurd thread and
/// repetition counts refused instead of panicking.
#[test]
fn crafted_numbers_are_refused() {
    use duet_quant::gguf::Value;
    let m = fixture_gguf();
    let dir = std::env::temp_dir().join(format!("duet-crafted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (i, (key, value, needle)) in [
        ("llama.block_count", Value::U32(1 << 31), "block_count is 2147483648"),
        ("llama.block_count", Value::U32(1 << 26), "block_count is 67108864"),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(-1.0), "layer_norm_rms_epsilon is -1"),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(f32::NAN), "layer_norm_rms_epsilon is NaN"),
        ("llama.rope.freq_base", Value::F32(0.0), "rope.freq_base is 0"),
        ("llama.embedding_length", Value::U32(0), "embedding_length is 0"),
        // Widths whose products overflowed a 32-bit size (the browser's) or the bind check.
        ("llama.attention.head_count", Value::U32(1 << 31), "head_count × key_length is"),
        ("llama.feed_forward_length", Value::U32(1 << 30), "feed_forward_length is 1073741824, more than duet handles"),
    ]
    .into_iter()
    .enumerate()
    {
        let p = dir.join(format!("crafted-{i}.gguf"));
        with_metadata(&m, &p, &[(key, value)]);
        for cmd in [&["run", "-p", "hi", "-n", "2"][..], &["bench", "-p", "4", "-n", "2", "-r", "1"]] {
            let mut args = vec![cmd[0], "-m", p.to_str().unwrap(), "--device", "cpu"];
            args.extend(&cmd[1..]);
            assert_clean_failure(&duet(&args), &[needle]);
        }
    }
    let ms = m.to_str().unwrap();
    assert_clean_failure(&duet(&["run", "-m", ms, "-p", "hi", "-t", "100000"]), &["100000 threads", "1024"]);
    assert_clean_failure(
        &duet(&["bench", "-m", ms, "-r", "0", "--device", "cpu"]),
        &["-r/--repetitions must be at least 1"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A FIFO or a device given as a model or a prompt file is refused at once, never waited on
/// or read forever.
#[test]
fn fifos_and_devices_are_refused_without_blocking() {
    let dir = std::env::temp_dir().join(format!("duet-fifo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("model.gguf");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let m = fixture_gguf();
    let t0 = std::time::Instant::now();
    assert_clean_failure(&duet(&["run", "-m", fifo.to_str().unwrap(), "-p", "hi"]), &["not a regular file"]);
    assert_clean_failure(&duet(&["info", fifo.to_str().unwrap()]), &["not a regular file"]);
    assert_clean_failure(
        &duet(&["run", "-m", m.to_str().unwrap(), "-f", "/dev/zero", "--device", "cpu"]),
        &["/dev/zero", "not a regular file"],
    );
    assert_clean_failure(
        &duet(&["perplexity", "-m", m.to_str().unwrap(), "-f", fifo.to_str().unwrap(), "--device", "cpu"]),
        &["not a regular file"],
    );
    assert!(t0.elapsed().as_secs() < 30, "took {:?}", t0.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model whose chat template does not parse still runs plain prompts, perplexity and
/// bench (only chat needs the template, and says why it cannot); a --system prompt longer
/// than the context is refused before the first message.
#[test]
fn broken_template_and_long_system_prompt() {
    use duet_quant::gguf::Value;
    let m = fixture_gguf();
    let p = std::env::temp_dir().join(format!("duet-broken-template-{}.gguf", std::process::id()));
    with_metadata(&m, &p, &[("tokenizer.chat_template", Value::from("{% for m in messages %}{{ m.content }"))]);
    let ps = p.to_str().unwrap();
    let ok = duet(&["run", "-m", ps, "-p", "Call me", "-n", "2", "--temp", "0", "--device", "cpu"]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stderr).contains("chat template does not parse"), "a note at load");
    let ok = duet(&["bench", "-m", ps, "-p", "4", "-n", "2", "-r", "1", "--device", "cpu"]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let mut chat = Command::new(env!("CARGO_BIN_EXE_duet"));
    let chat = with_input(chat.args(["chat", "-m", ps, "--device", "cpu", "-q"]), b"hello\n");
    assert_clean_failure(&chat, &["chat template does not parse"]);
    let long = "you are a very careful assistant. ".repeat(200);
    let o = duet(&["chat", "-m", m.to_str().unwrap(), "--device", "cpu", "-c", "64", "--system", &long]);
    assert_clean_failure(&o, &["system prompt takes", "no room for a message"]);
    let _ = std::fs::remove_file(&p);
}

/// A model whose chat template doubles a string 64 times (within its fuel: fuel counts
/// steps, not bytes) fails chat with the template's memory budget named, in well under the
/// time limit; run under a 4 GB address-space limit, so that a template that escaped the
/// budget would end the program on a failed allocation (an abort, not a clean error).
#[test]
fn a_template_that_grows_without_bound_fails_chat_cleanly() {
    use duet_quant::gguf::Value;
    let m = fixture_gguf();
    let p = std::env::temp_dir().join(format!("duet-doubling-template-{}.gguf", std::process::id()));
    let doubling =
        "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}";
    with_metadata(&m, &p, &[("tokenizer.chat_template", Value::from(doubling))]);
    let t0 = std::time::Instant::now();
    let mut chat = Command::new("sh");
    chat.args(["-c", "ulimit -v 4000000 && exec \"$0\" \"$@\"", env!("CARGO_BIN_EXE_duet")]).args([
        "chat",
        "-m",
        p.to_str().unwrap(),
        "--device",
        "cpu",
        "-q",
    ]);
    let chat = with_input(&mut chat, b"hello\n");
    assert_clean_failure(&chat, &["chat template needed more than 256 MiB of memory"]);
    assert!(t0.elapsed().as_secs() < 20, "took {:?}", t0.elapsed());
    let _ = std::fs::remove_file(&p);
}

/// The environment variables `duet --help` lists choose kernels through the CLI (no library
/// reads them): a chosen set shows in the load line, a value that cannot be used is an error
/// naming the variable.
#[test]
fn environment_settings_are_read_by_the_cli_and_checked() {
    let model = fixture_gguf();
    let m = model.to_str().unwrap();
    let run = |vars: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_duet"));
        cmd.args(["run", "-m", m, "-p", "Hello", "-n", "2", "--device", "cpu"]).env("RUST_BACKTRACE", "1");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let o = run(&[("DUET_GEMM", "portable"), ("DUET_FORCE_SCALAR", "1")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("portable packed / scalar kernels"), "{err}");
    let o = run(&[("DUET_GEMM", "off")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && !err.contains("packed"), "{err}");
    assert_clean_failure(&run(&[("DUET_GEMM", "bogus")]), &["DUET_GEMM", "no packed matmul kernels named \"bogus\""]);
    assert_clean_failure(&run(&[("DUET_KV_JITTER", "2")]), &["DUET_KV_JITTER=2: expected a relative size in [0, 1)"]);
    assert_clean_failure(&run(&[("DUET_ATTN_SIMD", "sse")]), &["DUET_ATTN_SIMD=sse"]);
    assert_clean_failure(&run(&[("DUET_GPU_F16", "maybe")]), &["DUET_GPU_F16=maybe: expected 0 or 1"]);
    let help = String::from_utf8_lossy(&duet(&["--help"]).stdout).into_owned();
    for var in
        ["DUET_DEFAULT_MODEL", "DUET_FORCE_SCALAR", "DUET_GEMM", "DUET_ATTN_SIMD", "DUET_KV_JITTER", "DUET_GPU_F16"]
    {
        assert!(help.contains(var), "--help lacks {var}");
    }
}

/// llama.cpp's spellings: `-ngl N` (0: the CPU, else the GPU) and `-s` for the seed; a
/// `-ngl` that disagrees with `--device` is an error, not a silent choice.
#[test]
fn llama_cpp_flag_spellings() {
    let m = fixture_gguf();
    let ms = m.to_str().unwrap();
    let sampled = |extra: &[&str]| {
        let mut args = vec!["run", "-m", ms, "-p", "Call me", "-n", "6", "--temp", "1.5"];
        args.extend(extra);
        let o = duet(&args);
        assert!(o.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&o.stderr));
        (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (a, err) = sampled(&["-ngl", "0", "-s", "7"]);
    assert!(err.contains("CPU"), "-ngl 0 runs on the CPU: {err}");
    let (b, _) = sampled(&["--n-gpu-layers=0", "--seed", "7"]);
    assert_eq!(a, b, "-s is --seed");
    let seeds: Vec<String> = (8..12).map(|s| sampled(&["-ngl", "0", "-s", &s.to_string()]).0).collect();
    assert!(seeds.iter().any(|o| o != &a), "other seeds, other samples: {a:?} {seeds:?}");
    assert_clean_failure(&duet(&["run", "-m", ms, "-p", "x", "-ngl", "99", "--device", "cpu"]), &["disagree"]);
}
