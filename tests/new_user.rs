//! What a new user ran into, one test each (issue: "Tried as a new user would"): a context
//! too large for the memory, or longer than the model was trained for; loader noise on the
//! terminal; a chat line that is not UTF-8; sampling values out of range; `--device gpu`
//! when the GPU cannot hold the model; a model whose token embedding is 1-D.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use duet_quant::GgmlType;
use duet_quant::gguf::GgufWriter;
use duet_test_support::output_with_stdin;

fn duet() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_duet"));
    c.env("RUST_BACKTRACE", "1");
    c
}

fn run(args: &[&str]) -> Output {
    duet().args(args).output().unwrap()
}

/// The committed tiny Llama fixture (context 256) as Q8_0, converted once per run.
fn model() -> PathBuf {
    let out = std::env::temp_dir().join(format!("duet-new-user-{}.gguf", std::process::id()));
    if !out.exists() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/llama-gqa");
        let o = run(&["convert", src.to_str().unwrap(), "--type", "q8_0", "-q", "-o", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails cleanly (no panic, no backtrace) with every needle in the message.
fn clean_failure(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected a failure: {err}");
    assert!(!err.contains("panicked") && !err.contains("backtrace") && !err.contains("memory allocation of"), "{err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

/// A context far beyond the memory is refused before anything is allocated, with the sizes
/// and the largest context that fits (it aborted with "memory allocation of … failed").
#[test]
fn a_context_too_large_for_the_memory_is_a_clear_error() {
    let m = model();
    let o = run(&["run", "-m", m.to_str().unwrap(), "--device", "cpu", "-c", "4000000000", "-p", "hi"]);
    clean_failure(&o, &["a context of 4000000000 tokens needs", "GiB", "the largest context that fits is"]);
}

/// A context longer than the model's training context works but warns.
#[test]
fn a_context_past_the_training_length_warns() {
    let m = model();
    let o =
        run(&["run", "-m", m.to_str().unwrap(), "--device", "cpu", "-c", "1000", "-p", "hi", "-n", "2", "--temp", "0"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("warning: a context of 1000 tokens is longer than the model's training context of 256"),
        "{err}"
    );
}

/// No loader noise: without XDG_RUNTIME_DIR, probing for a GPU printed "error:
/// XDG_RUNTIME_DIR is invalid or not set in the environment." twice before anything else.
/// (Meaningful where a Vulkan driver is installed, as the test command installs lavapipe.)
#[test]
fn probing_for_a_gpu_prints_no_loader_noise() {
    let m = model();
    let o = duet()
        .args(["run", "-m", m.to_str().unwrap(), "-p", "hi", "-n", "2", "--temp", "0"])
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("XDG_RUNTIME_DIR"), "{err}");
    assert!(!err.lines().any(|l| l.starts_with("error")), "{err}");
}

/// A chat line with bytes that are not UTF-8 becomes U+FFFD with a warning; the
/// conversation goes on (it ended with "stream did not contain valid UTF-8").
#[test]
fn chat_reads_invalid_utf8_lossily_and_goes_on() {
    let m = model();
    let mut cmd = duet();
    cmd.args(["chat", "-m", m.to_str().unwrap(), "--device", "cpu", "-n", "3", "--temp", "0", "-q"]);
    let o = output_with_stdin(&mut cmd, b"hello\n\xff\xfe caf\xe9\nbye\n");
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.matches("warning: that line was not valid UTF-8").count(), 1, "{err}");
    assert!(!err.contains("stream did not contain valid UTF-8"), "{err}");
    // Three replies, one per line.
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 3, "{}", String::from_utf8_lossy(&o.stdout));
}

/// Sampling values out of range are refused with the valid range (`--top-p 7` was taken).
#[test]
fn sampling_values_are_checked() {
    let m = model();
    let m = m.to_str().unwrap();
    for (flag, value, range) in [
        ("--top-p", "7", "(0, 1]"),
        ("--top-p", "0", "(0, 1]"),
        ("--min-p", "-0.1", "[0, 1]"),
        ("--temp", "-1", "[0, "),
        ("--repeat-penalty", "0", "(0, "),
        ("--temp", "hot", "is not a number"),
    ] {
        let o = run(&["run", "-m", m, "-p", "hi", &format!("{flag}={value}")]);
        clean_failure(&o, &[flag, range]);
    }
    let o =
        run(&["run", "-m", m, "--device", "cpu", "-p", "hi", "-n", "1", "--top-p", "1", "--min-p", "0", "--temp", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `--device gpu` means the GPU or an error: a cache whose layers exceed what the adapter
/// binds at once ran on the CPU instead. 70 M positions of this fixture's 32-wide f16 K are
/// 4.48 GB per layer, over the 2 GiB duet binds at most on any adapter (lavapipe: 128 MiB),
/// so this fails everywhere (3 M positions fit an H200's binding and ran).
#[test]
fn device_gpu_does_not_fall_back_to_the_cpu() {
    let m = model();
    let o = run(&["run", "-m", m.to_str().unwrap(), "--device", "gpu", "-c", "70000000", "-p", "hi", "-n", "1"]);
    let err = stderr(&o);
    assert!(!err.contains("falling back to the CPU"), "{err}");
    clean_failure(&o, &["--device gpu"]);
}

/// A token embedding with one dimension is a bad model, not an index panic.
#[test]
fn a_one_dimensional_token_embedding_is_refused() {
    let p = std::env::temp_dir().join(format!("duet-1d-embd-{}.gguf", std::process::id()));
    let mut w = GgufWriter::new(&p);
    w.add("general.architecture", "llama").unwrap();
    for (k, v) in [("llama.embedding_length", 8u32), ("llama.attention.head_count", 2), ("llama.block_count", 1)] {
        w.add(k, v).unwrap();
    }
    w.add_tensor("token_embd.weight", &[64], GgmlType::F32).unwrap();
    let mut d = w.start().unwrap();
    d.write_tensor("token_embd.weight", &[0u8; 256]).unwrap();
    d.finish().unwrap();
    let o = run(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]);
    clean_failure(&o, &[p.to_str().unwrap(), "token_embd.weight has shape [64]"]);
    std::fs::remove_file(&p).unwrap();
}
