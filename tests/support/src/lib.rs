//! Helpers shared by the tests of every duet crate.
//!
//! Tests that need something outside the Rust toolchain (a Python with gguf-py, a
//! downloaded model, a Vulkan adapter) find it through environment variables that
//! `tests/run-all.sh` sets. When one is missing the test calls [`skip`], which prints the
//! reason and records it in `$DUET_SKIP_LOG` so the script can list every skip at the end.
//! The test command sets `DUET_REQUIRE_ORACLES=1` (a missing Python oracle or downloaded
//! asset is then a failure) and, where it installed a Vulkan driver, `DUET_REQUIRE_GPU=1`
//! (a missing adapter is then a failure): CI never passes by skipping.

pub mod devtools;
pub mod json_schema;

use std::io::Write;
use std::path::{Path, PathBuf};

/// Records that `test` was skipped and why.
pub fn skip(test: &str, reason: &str) {
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(log) = std::env::var_os("DUET_SKIP_LOG")
        && let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log)
    {
        let _ = writeln!(f, "{test}: {reason}");
    }
}

/// The Python interpreter with `gguf` (0.19), `numpy` and `openai` installed, from `$DUET_PYTHON`.
/// Returns `None` after recording a skip when it is not configured, unless
/// `$DUET_REQUIRE_ORACLES` is set, in which case it panics: CI must never silently skip.
pub fn oracle_python(test: &str) -> Option<PathBuf> {
    match std::env::var_os("DUET_PYTHON") {
        Some(p) if Path::new(&p).exists() => Some(PathBuf::from(p)),
        _ => {
            if std::env::var_os("DUET_REQUIRE_ORACLES").is_some() {
                panic!("{test}: DUET_REQUIRE_ORACLES is set but DUET_PYTHON does not name a Python with gguf-py");
            }
            skip(
                test,
                "no Python oracle (set DUET_PYTHON to a python3 with gguf==0.19 and numpy; tests/run-all.sh does)",
            );
            None
        }
    }
}

/// A path from an environment variable naming a downloaded asset (e.g. `DUET_SMOLLM2`),
/// or `None` after recording a skip — a panic under `$DUET_REQUIRE_ORACLES`.
pub fn asset(test: &str, var: &str, what: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(p) if Path::new(&p).exists() => Some(PathBuf::from(p)),
        _ => {
            let reason = format!("{what} not available (set {var}; tests/run-all.sh fetches it)");
            if std::env::var_os("DUET_REQUIRE_ORACLES").is_some() {
                panic!("{test}: DUET_REQUIRE_ORACLES is set but {reason}");
            }
            skip(test, &reason);
            None
        }
    }
}

/// A test that needs a GPU adapter found none: a panic when the test command installed a
/// driver for it (`$DUET_REQUIRE_GPU`), else a recorded skip.
pub fn no_gpu(test: &str, reason: &str) {
    if std::env::var_os("DUET_REQUIRE_GPU").is_some() {
        panic!("{test}: DUET_REQUIRE_GPU is set (a Vulkan driver was installed) but {reason}");
    }
    skip(test, reason);
}

/// A test that needs CPU `features` (named as /proc/cpuinfo's flags) found the program's
/// own detection saying no: a panic when the test command found every one of them in
/// /proc/cpuinfo (`$DUET_REQUIRE_CPU`, comma-separated flags) — then the detection is
/// wrong, not the machine, and a SIMD test must not pass by skipping — else a recorded skip.
pub fn cpu_lacks(test: &str, features: &[&str], reason: &str) {
    if let Some(flags) = std::env::var_os("DUET_REQUIRE_CPU") {
        let flags = flags.to_string_lossy();
        if features.iter().all(|f| flags.split(',').any(|x| x.trim() == *f)) {
            panic!("{test}: /proc/cpuinfo lists {} (DUET_REQUIRE_CPU) but {reason}", features.join(", "));
        }
    }
    skip(test, reason);
}

/// A test that needs something of the machine (a tmpfs mount, a kernel feature) found it
/// missing: a panic when the test command found it there (`$var` set), else a recorded skip.
pub fn machine_lacks(test: &str, var: &str, reason: &str) {
    if std::env::var_os(var).is_some() {
        panic!("{test}: {var} is set (the test command found it on this machine) but {reason}");
    }
    skip(test, reason);
}

/// An asset the repository builds (models/make_models.sh's exports) is missing: a panic
/// under `$DUET_REQUIRE_ORACLES`, else a recorded skip.
pub fn missing_asset(test: &str, reason: &str) {
    if std::env::var_os("DUET_REQUIRE_ORACLES").is_some() {
        panic!("{test}: DUET_REQUIRE_ORACLES is set but {reason}");
    }
    skip(test, reason);
}

/// A program the tests run, from `$var` (tests/run-all.sh installs it and sets the
/// variable), else `default`; `None` after a recorded skip — a panic under
/// `$DUET_REQUIRE_ORACLES`. `what` says what it is and where it comes from.
pub fn program(test: &str, var: &str, default: &str, what: &str) -> Option<PathBuf> {
    let p = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    if p.exists() {
        return Some(p);
    }
    let reason = format!("no {what} at {} (set {var}; tests/run-all.sh installs it)", p.display());
    if std::env::var_os("DUET_REQUIRE_ORACLES").is_some() {
        panic!("{test}: DUET_REQUIRE_ORACLES is set but {reason}");
    }
    skip(test, &reason);
    None
}

/// Headless Chromium for the HTML report tests: `$DUET_CHROMIUM`, else `/usr/bin/chromium`
/// (Debian's `chromium`), as [`program`].
pub fn chromium(test: &str) -> Option<PathBuf> {
    program(test, "DUET_CHROMIUM", "/usr/bin/chromium", "Chromium (Debian's chromium)")
}

/// What a page looked like in headless Chromium once loaded.
#[derive(Debug)]
pub struct PageCheck {
    /// The `<body>` tag of the DOM after load (attributes included).
    pub body_tag: String,
    /// Console messages Chromium logged (errors and warnings of the page's scripts, blocked
    /// loads), one per line.
    pub console: Vec<String>,
}

impl PageCheck {
    /// The value of attribute `name` on `<body>`.
    pub fn body_attr(&self, name: &str) -> Option<String> {
        let key = format!("{name}=\"");
        let start = self.body_tag.find(&key)? + key.len();
        let end = self.body_tag[start..].find('"')? + start;
        Some(self.body_tag[start..end].to_string())
    }
}

/// Loads `page` (a local file) in headless Chromium kept off the network (no proxy
/// lookups, background networking, component updates or sync; every host name unresolved)
/// and returns the DOM's `<body>` tag after load and the console messages.
pub fn load_in_chromium(chromium: &Path, page: &Path) -> PageCheck {
    let profile = std::env::temp_dir().join(format!(
        "duet-chromium-{}-{}",
        std::process::id(),
        page.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
    ));
    let out = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.canonicalize().expect("page exists").display()))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", chromium.display()));
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !dom.is_empty(),
        "chromium failed on {}: {}",
        page.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let body_tag =
        dom.find("<body").map(|i| dom[i..].split_inclusive('>').next().unwrap_or("").to_string()).unwrap_or_default();
    let console =
        String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.contains(":CONSOLE")).map(str::to_string).collect();
    PageCheck { body_tag, console }
}

/// Runs `cmd` with `input` on its stdin (then closed) and captures stdout and stderr, as a
/// user typing into `duet chat` and ending with Ctrl-D.
pub fn output_with_stdin(cmd: &mut std::process::Command, input: &[u8]) -> std::process::Output {
    use std::process::Stdio;
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// The repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// Runs `python script args…` and returns stdout, panicking with stderr on failure.
pub fn run_python(python: &Path, script: &Path, args: &[&std::ffi::OsStr]) -> String {
    let out = std::process::Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    if !out.status.success() {
        panic!(
            "{} {} failed ({}):\n{}",
            python.display(),
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout).expect("python printed UTF-8")
}

/// Deterministic pseudo-random numbers for tests (xorshift64*), so fixtures and tests never
/// depend on an external RNG crate's stream.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = ((self.next_u64() >> 11) as f64) / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
    pub fn normals(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normal()).collect()
    }
    /// Uniform integer in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
