//! `duet web` in headless Chromium: the browser build of the runtime (runtime/web, built by
//! runtime/web/build.sh; tests/run-all.sh builds it and sets `DUET_WEB_PKG`) runs the bundled
//! DIFF model, tiny DIFF V2, DEX and Llama fixtures and SmolLM2-135M on WebGPU — Chromium's
//! SwiftShader adapter, on the CPU — and its greedy tokens are the CPU backend's (`duet run
//! --device cpu --temp 0`'s), or first differ at a near-tie ([`NEAR_TIE`]); bad input (a file
//! that is not GGUF, a model too large for the adapter, a prompt longer than the context) is
//! a message in the page.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{convert, temp_dir};
use duet_convert::Preset;
use duet_runtime::cpu::CpuBackend;
use duet_runtime::engine::{Engine, EngineOptions};
use duet_runtime::kv_cache::CacheFormat;
use duet_runtime::sampler::{Sampler, SamplerConfig};
use duet_runtime::text::Message;
use duet_test_support::devtools::{Browser, base64_decode};
use duet_test_support::{asset, chromium, program, repo_root};
use serde_json::{Value, json};

/// WebGPU on SwiftShader in headless Chromium (../shared/docs/resources.md).
const WEBGPU_FLAGS: [&str; 7] = [
    "--enable-unsafe-webgpu",
    "--enable-features=Vulkan",
    "--use-vulkan=swiftshader",
    "--use-webgpu-adapter=swiftshader",
    "--enable-unsafe-swiftshader",
    "--disable-vulkan-surface",
    "--window-size=1000,760",
];

const PROMPT: &str = "The capital of France is";
const MAX_NEW: usize = 12;

/// `duet web` on a free loopback port; killed on drop.
struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server(models: &[&Path], pkg: &Path) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_duet"));
    cmd.args(["web", "--port", "0", "--pkg"]).arg(pkg);
    for m in models {
        cmd.arg("-m").arg(m);
    }
    let mut server = Server(cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("start duet web"), 0);
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().expect("piped")).read_line(&mut line).expect("duet web's first line");
    let port = line
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in duet web's first line: {line}"));
    server.1 = port;
    server
}

/// The CPU backend's greedy reply to `PROMPT` (what `duet run --device cpu --temp 0` runs),
/// or with `chat` to a user's message of it rendered by the model's chat template (as `duet
/// chat` renders it); the engine is kept to score a divergence.
struct CpuReply {
    engine: Engine<CpuBackend>,
    prompt: Vec<u32>,
    tokens: Vec<u32>,
}

fn cpu_reply(model: &Path, chat: bool, cache: &str) -> CpuReply {
    let (k, v) = cache.split_once('/').expect("K/V");
    let (k_type, v_type) = (CacheFormat::parse(k).expect("a K type"), CacheFormat::parse(v).expect("a V type"));
    let opts = EngineOptions { k_type, v_type, ..EngineOptions::default() };
    let mut engine = Engine::load(CpuBackend::new(2), model, &opts).expect("load on the CPU");
    let prompt = if chat {
        let text = engine.template.render(&[Message::new("user", PROMPT)], true).expect("render");
        engine.tokenizer.encode_rendered(&text).expect("tokenize")
    } else {
        engine.tokenizer.encode(PROMPT, engine.tokenizer.add_bos).expect("tokenize")
    };
    let (tokens, _) =
        engine.generate(&prompt, MAX_NEW, &mut Sampler::new(SamplerConfig::greedy()), &mut |_| true).expect("generate");
    CpuReply { engine, prompt, tokens }
}

/// How far below the CPU's top logit the page's token may be where the two replies first
/// differ: the page computes in f32 on WebGPU, the CPU with its two-level 8-bit activations
/// (their logits differ by ~1e-3 to 1e-2 here), so a near-tie may go either way; after it the
/// replies continue different texts and are not compared.
const NEAR_TIE: f32 = 0.05;

/// The page's tokens equal the CPU's, or first differ at a near-tie ([`NEAR_TIE`]).
fn check_tokens(cpu: &mut CpuReply, got: &[u32], what: &str) {
    let k = got.iter().zip(&cpu.tokens).take_while(|(a, b)| a == b).count();
    if k == got.len() && k == cpu.tokens.len() {
        return;
    }
    assert!(
        k < got.len() && k < cpu.tokens.len(),
        "{what}: one reply ended where the other went on: the page's {got:?}, the CPU's {:?}",
        cpu.tokens
    );
    let context = [&cpu.prompt[..], &cpu.tokens[..k]].concat();
    let (logits, _) = cpu.engine.prefill(&context).expect("the CPU's logits at the divergence");
    let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let margin = top - logits[got[k] as usize];
    eprintln!("{what}: the replies first differ at token {k}: the page's {} is {margin} below the CPU's top", got[k]);
    assert!(
        margin <= NEAR_TIE,
        "{what}: at token {k} the page chose {} where the CPU's {} leads it by {margin} (a near-tie is ≤ {NEAR_TIE}): the page's {got:?}, the CPU's {:?}",
        got[k],
        cpu.tokens[k],
        cpu.tokens
    );
}

/// Messages the page logged as errors: console errors, uncaught exceptions, and the
/// browser's own error entries (a shader WebGPU refused, a failed load).
fn errors(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e["method"].as_str()? {
            "Runtime.consoleAPICalled" if e["params"]["type"] == "error" => Some(e["params"]["args"].to_string()),
            "Runtime.exceptionThrown" => Some(e["params"]["exceptionDetails"].to_string()),
            "Log.entryAdded" if e["params"]["entry"]["level"] == "error" => Some(e["params"]["entry"].to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn web_page_generates_the_cpu_backends_tokens() {
    let test = "web_page_generates_the_cpu_backends_tokens";
    let Some(chromium) = chromium(test) else { return };
    let Some(pkg) = program(
        test,
        "DUET_WEB_PKG",
        &repo_root().join("target/web/pkg").to_string_lossy(),
        "browser build of the runtime (bash runtime/web/build.sh)",
    ) else {
        return;
    };
    let Some(smollm2) = asset(test, "DUET_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let diff = repo_root().join("models/duet-diff-ref.q8_0.gguf");
    // The other attention variants from the committed tiny fixtures: DIFF V2, Llama with its
    // DEX matrices kept (not folded into attn_output), plain Llama (GQA), converted to F16
    // and moved into a folder removed on drop.
    let dir = temp_dir("fixtures");
    let fixtures: Vec<PathBuf> = [("diffllama-v2-gqa", false), ("llama-dex", true), ("llama-gqa", false)]
        .iter()
        .map(|&(name, keep_dex)| {
            let converted = convert(name, Preset::F16, keep_dex);
            let out = dir.0.join(format!("{name}.f16.gguf"));
            std::fs::rename(&converted, &out).expect("move the converted fixture");
            out
        })
        .collect();
    let mut models = vec![diff.as_path()];
    models.extend(fixtures.iter().map(PathBuf::as_path));
    models.push(smollm2.as_path());
    // Served too, last: a file that is not GGUF (bad input, below).
    let junk = dir.0.join("notes.gguf");
    std::fs::write(&junk, "These are notes, not a model.\n".repeat(1000)).expect("write the junk file");
    // And the DIFF model with a chat template that doubles a string 64 times.
    let doubling = dir.0.join("doubling-template.gguf");
    let template =
        "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}";
    common::with_metadata(&diff, &doubling, &[("tokenizer.chat_template", duet_quant::gguf::Value::from(template))]);
    let mut served = models.clone();
    served.extend([junk.as_path(), doubling.as_path()]);
    let server = start_server(&served, &pkg);
    let browser = Browser::launch(&chromium, &WEBGPU_FLAGS);
    let mut page = browser.page();
    let minute = Duration::from_secs(60);
    for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
        page.call(domain, json!({}), minute);
    }
    bad_input_is_a_message_in_the_page(&mut page, server.1, models.len());
    let local = a_local_file_answers_in_the_page(&mut page, server.1, &diff);
    let shot: PathBuf = repo_root().join("target/web/duet-web.png");
    // Each model continuing the prompt with the f16 cache, the DIFF model with the 4- and
    // 3-bit caches too, then SmolLM2 answering it as a chat message.
    let mut runs: Vec<(usize, bool, &str)> = (0..models.len()).map(|i| (i, false, "f16/f16")).collect();
    runs.splice(1..1, [(0, false, "q4c/q4r"), (0, false, "q3c/q3r")]);
    runs.push((models.len() - 1, true, "f16/f16"));
    for (n, &(i, chat, cache)) in runs.iter().enumerate() {
        let model = models[i];
        let mut cpu = cpu_reply(model, chat, cache);
        page.events.clear();
        let url = format!(
            "http://127.0.0.1:{}/?model={i}&max={MAX_NEW}&chat={}&cache={cache}&prompt={}",
            server.1,
            u8::from(chat),
            PROMPT.replace(' ', "%20")
        );
        page.call("Page.navigate", json!({ "url": url }), minute);
        page.wait_for("Page.loadEventFired", minute);
        let t0 = std::time::Instant::now();
        let r = page.call(
            "Runtime.evaluate",
            json!({ "expression": "window.duetResult.then(r => JSON.stringify(r))", "awaitPromise": true, "returnByValue": true }),
            Duration::from_secs(900),
        );
        let errs = errors(&page.events);
        assert!(errs.is_empty(), "{}: the page logged errors:\n{}", model.display(), errs.join("\n"));
        let value = r["result"]["value"].as_str().unwrap_or_else(|| panic!("{}: no result: {r}", model.display()));
        let got: Value = serde_json::from_str(value).expect("the page's result is JSON");
        let adapter = got["adapter"].as_str().unwrap_or_default();
        let tokens: Vec<u32> =
            got["tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().expect("a token id") as u32).collect();
        eprintln!(
            "{test}: {}{} ({cache}): {} tokens in {:.1} s on {adapter}: {:?} (text {:?})",
            model.display(),
            if chat { " (chat)" } else { "" },
            tokens.len(),
            t0.elapsed().as_secs_f64(),
            tokens,
            got["text"]
        );
        assert!(adapter.contains("BrowserWebGpu"), "the page ran on WebGPU: {adapter}");
        if n == 0 {
            // The same model picked from the disk, asked through the page's form.
            assert_eq!(
                Some(local.as_str()),
                got["text"].as_str(),
                "the local file's reply differs from the served one's"
            );
        }
        // The file streams into the GPU a part at a time: the runtime's memory (which never
        // shrinks: its peak) stays below half the file's size where the file is big enough to
        // tell (SmolLM2, 94 MiB: 39–43 MB measured — its tokenizer and 17.7 MB token table;
        // 69 MB while uploads were staged in wasm memory, twice the file before streaming).
        let wasm_bytes = got["wasmBytes"].as_u64().expect("the runtime's memory size");
        let file_bytes = std::fs::metadata(model).expect("the model's size").len();
        eprintln!("{test}: the runtime's memory reached {wasm_bytes} bytes for a file of {file_bytes}");
        if file_bytes > 64 << 20 {
            assert!(
                wasm_bytes < file_bytes / 2,
                "{}: the runtime held {wasm_bytes} bytes for a file of {file_bytes}",
                model.display()
            );
        }
        assert!(!cpu.tokens.is_empty(), "{}: the comparison needs a reply of at least one token", model.display());
        check_tokens(&mut cpu, &tokens, &format!("{} ({cache}{})", model.display(), if chat { ", chat" } else { "" }));
        if n + 1 == runs.len() {
            let png = page.call("Page.captureScreenshot", json!({ "format": "png" }), minute);
            let bytes = base64_decode(png["data"].as_str().expect("screenshot data"));
            assert!(bytes.starts_with(b"\x89PNG"), "a PNG screenshot");
            std::fs::create_dir_all(shot.parent().expect("a folder")).expect("target/web");
            std::fs::write(&shot, bytes).expect("write the screenshot");
            eprintln!("{test}: screenshot {}", shot.display());
        }
    }
}

/// Evaluates `expression` in the page once `ready` (a JavaScript condition) holds, polled
/// every 100 ms for at most `timeout`.
fn when(page: &mut duet_test_support::devtools::DevTools, ready: &str, expression: &str, timeout: Duration) -> Value {
    let poll = format!(
        "new Promise(done => {{ const t = setInterval(() => {{ if ({ready}) {{ clearInterval(t); done({expression}); }} }}, 100); }})"
    );
    let r = page.call(
        "Runtime.evaluate",
        json!({ "expression": poll, "awaitPromise": true, "returnByValue": true }),
        timeout,
    );
    r["result"]["value"].clone()
}

/// The page's own controls, as a visitor uses them: `model` chosen with "or a file" (set
/// through DevTools, as a file dialog would), then the prompt typed and sent as plain text
/// at temperature 0 (up to the page's 256 tokens); returns the reply's text. No error
/// logged.
fn a_local_file_answers_in_the_page(
    page: &mut duet_test_support::devtools::DevTools,
    port: u16,
    model: &Path,
) -> String {
    let minute = Duration::from_secs(60);
    page.events.clear();
    page.call("Page.navigate", json!({ "url": format!("http://127.0.0.1:{port}/") }), minute);
    page.wait_for("Page.loadEventFired", minute);
    when(page, "document.getElementById('status').textContent.startsWith('Choose')", "true", minute);
    let root = page.call("DOM.getDocument", json!({}), minute)["root"]["nodeId"].clone();
    let input =
        page.call("DOM.querySelector", json!({ "nodeId": root, "selector": "#file" }), minute)["nodeId"].clone();
    let path = model.canonicalize().expect("the model's path");
    page.call("DOM.setFileInputFiles", json!({ "nodeId": input, "files": [path.to_string_lossy()] }), minute);
    let status = when(
        page,
        "document.getElementById('status').textContent.endsWith(' is ready.') || document.getElementById('status').className === 'error'",
        "document.getElementById('status').textContent",
        Duration::from_secs(300),
    );
    let name = model.file_name().expect("a file name").to_string_lossy().into_owned();
    assert_eq!(status.as_str(), Some(format!("{name} is ready.").as_str()), "loading the local file");
    page.call(
        "Runtime.evaluate",
        json!({ "expression": "document.getElementById('chat').checked = false; document.getElementById('temp').value = 0; document.getElementById('prompt').value = 'The capital of France is'; document.getElementById('send').click()" }),
        minute,
    );
    let reply = when(
        page,
        "!document.getElementById('send').disabled && document.querySelectorAll('.turn.model').length > 0",
        "[...document.querySelectorAll('.turn.model')].pop().textContent",
        Duration::from_secs(300),
    );
    let errs = errors(&page.events);
    assert!(errs.is_empty(), "the local file's run logged errors:\n{}", errs.join("\n"));
    let reply = reply.as_str().expect("the reply's text").to_owned();
    eprintln!("a local file ({name}) in the page's form: {reply:?}");
    reply
}

/// Bad input in the page — a file that is not GGUF (served as model `junk`), a model larger
/// than the adapter binds (`maxBinding` caps it below one row of the DIFF model's logits, as
/// an adapter with 16 KiB buffers would), a prompt longer than the context, a negative
/// temperature — each a message in the page's status line and no other error, after which
/// the same tab loads a model and generates; and a model whose chat template doubles a
/// string 64 times (served as model `junk + 1`): its memory budget stops the runtime, the
/// page says so (the panic's message in the console), and a reload generates again.
fn bad_input_is_a_message_in_the_page(page: &mut duet_test_support::devtools::DevTools, port: u16, junk: usize) {
    let minute = Duration::from_secs(60);
    let long_prompt = "the capital of France is Paris, ".repeat(8);
    let doubling = junk + 1;
    // (query, the page's message, another console error it may log, whether the tab goes on)
    let cases = [
        (format!("model={junk}&max=4&prompt=Hello"), "notes.gguf: not a GGUF file", None, true),
        ("model=0&max=4&maxBinding=16384&prompt=Hello".to_owned(), "the model does not fit this device", None, true),
        (
            format!("model=0&max=4&ctx=16&prompt={}", long_prompt.replace(' ', "%20")),
            "and the context holds 16",
            None,
            true,
        ),
        ("model=0&max=4&temp=-1&prompt=Hello".to_owned(), "the temperature must be 0 (greedy) or more", None, true),
        (
            format!("model={doubling}&max=4&chat=1&prompt=Hello"),
            "The runtime stopped",
            Some("work bounded to 268435456 bytes (a model's chat template) would have held more"),
            false,
        ),
    ];
    let run_again = |page: &mut duet_test_support::devtools::DevTools, query: &str, reload: bool| {
        page.events.clear();
        let expression = if reload {
            page.call("Page.navigate", json!({ "url": format!("http://127.0.0.1:{port}/?model=0&max=3&prompt=The%20capital%20of%20France%20is") }), minute);
            page.wait_for("Page.loadEventFired", minute);
            "window.duetResult.then(r => r.tokens.length)"
        } else {
            "window.duetRun(0, 'The capital of France is', 3, false, { ctx: 0, maxBinding: 0 }).then(r => r.tokens.length)"
        };
        let again = page.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "awaitPromise": true, "returnByValue": true }),
            Duration::from_secs(300),
        );
        assert_eq!(again["result"]["value"].as_u64(), Some(3), "?{query}: after the error no more tokens: {again}");
        let errs = errors(&page.events);
        assert!(errs.is_empty(), "?{query}: the run after the error logged errors:\n{}", errs.join("\n"));
    };
    for (query, want, also, goes_on) in cases {
        page.events.clear();
        page.call("Page.navigate", json!({ "url": format!("http://127.0.0.1:{port}/?{query}") }), minute);
        page.wait_for("Page.loadEventFired", minute);
        let r = page.call(
            "Runtime.evaluate",
            json!({ "expression": "window.duetResult.then(() => 'no error', e => String(e))", "awaitPromise": true, "returnByValue": true }),
            Duration::from_secs(300),
        );
        let thrown = r["result"]["value"].as_str().unwrap_or_default().to_owned();
        let shown = page.call(
            "Runtime.evaluate",
            json!({ "expression": "document.getElementById('status').textContent", "returnByValue": true }),
            minute,
        )["result"]["value"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        eprintln!("bad input ?{query}: the page says: {shown} (the call: {thrown})");
        assert!(
            thrown != "no error" && shown.contains(want),
            "?{query}: want '{want}', the page says '{shown}' ({thrown})"
        );
        if goes_on {
            assert!(thrown.contains(want), "?{query}: the call's error is '{thrown}'");
        }
        let errs = errors(&page.events);
        for e in &errs {
            let expected = e.contains(want) || also.is_some_and(|a| e.contains(a));
            assert!(expected, "?{query}: an error besides the message: {e}");
            assert!(also.is_some() || !e.contains("panicked"), "?{query}: a panic: {e}");
        }
        if let Some(a) = also {
            assert!(
                errs.iter().any(|e| e.contains(a)),
                "?{query}: the console does not say '{a}':\n{}",
                errs.join("\n")
            );
        }
        // The tab lives on (after a stop of the runtime, once reloaded).
        run_again(page, &query, !goes_on);
    }
}

/// `duet web`'s refusals: a host other than loopback, a missing browser build, a missing
/// model — each an error naming the problem, before anything listens.
#[test]
fn web_refuses_a_remote_host_a_missing_build_and_a_missing_model() {
    let diff = repo_root().join("models/duet-diff-ref.q8_0.gguf");
    let pkg_dir = temp_dir("pkg");
    let pkg = &pkg_dir.0;
    let run = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(env!("CARGO_BIN_EXE_duet")).arg("web").args(args).output().unwrap();
        assert!(!out.status.success(), "duet web {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(&["--host".as_ref(), "0.0.0.0".as_ref(), "-m".as_ref(), diff.as_os_str()]);
    assert!(e.contains("loopback only") && e.contains("0.0.0.0"), "{e}");
    let e = run(&["--pkg".as_ref(), pkg.as_os_str(), "-m".as_ref(), diff.as_os_str()]);
    assert!(e.contains("duet_web.js is missing") && e.contains("runtime/web/build.sh"), "{e}");
    for f in ["duet_web.js", "duet_web_bg.wasm"] {
        std::fs::write(pkg.join(f), b"").unwrap();
    }
    let e = run(&["--pkg".as_ref(), pkg.as_os_str(), "-m".as_ref(), "no-such-model.gguf".as_ref()]);
    assert!(e.contains("cannot read the model no-such-model.gguf"), "{e}");
    assert!(!e.contains("panicked") && !e.contains("RUST_BACKTRACE"), "{e}");
}
