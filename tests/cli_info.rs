//! `duet info` on a real llama.cpp GGUF (SmolLM2-135M-Instruct, fetched by
//! tests/run-all.sh) against what gguf-py reads from the same file: every metadata key with
//! its value (long arrays by their length), every tensor with its index, type and shape.

use std::path::Path;
use std::process::Command;

use duet_test_support::{asset, oracle_python, run_python};

#[test]
fn info_matches_gguf_py_on_smollm2() {
    let test = "info_matches_gguf_py_on_smollm2";
    let Some(model) = asset(test, "DUET_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let Some(python) = oracle_python(test) else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/info/dump_gguf.py");
    let oracle = run_python(&python, &script, &[model.as_os_str()]);
    let out = Command::new(env!("CARGO_BIN_EXE_duet")).arg("info").arg(&model).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let info = String::from_utf8(out.stdout).unwrap();
    // The metadata line of a key: "  KEY   TYPE   VALUE".
    let line_of = |key: &str| -> &str {
        info.lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("duet info does not show {key}"))
    };
    let (mut n_kv, mut n_tensors) = (0, 0);
    for l in oracle.lines() {
        let mut f = l.splitn(3, ' ');
        match (f.next(), f.next(), f.next()) {
            (Some("kv"), Some(key), Some(want)) => {
                n_kv += 1;
                let line = line_of(key);
                if let Ok(x) = want.parse::<f64>() {
                    // The value is the first token after the key and the type name.
                    let got = line.split_whitespace().nth(2).unwrap().parse::<f64>().unwrap();
                    assert!(got == x || ((got - x) / x).abs() < 1e-6, "{key}: duet shows {got}, gguf-py reads {x}");
                } else if want == "True" || want == "False" {
                    assert!(line.ends_with(&want.to_lowercase()), "{key}: {line}");
                } else {
                    // Strings are quoted and escaped (the oracle escapes them the same way);
                    // long ones are cut, so compare their start.
                    let head: String = want.chars().take(40).collect();
                    let shown = line.split_once('"').map(|(_, s)| s).unwrap_or_default();
                    assert!(shown.starts_with(&head), "{key}: duet shows {line:?}, gguf-py reads {want:?}");
                }
            }
            (Some("arr"), Some(key), Some(len)) => {
                n_kv += 1;
                let line = line_of(key);
                let len: usize = len.parse().unwrap();
                assert!(line.contains("array of"), "{key}: {line}");
                if len > 8 {
                    assert!(line.contains(&format!("{len} items")), "{key}: {len} items expected: {line}");
                }
            }
            (Some("t"), Some(idx), Some(rest)) => {
                n_tensors += 1;
                let v: Vec<&str> = rest.split(' ').collect();
                let (name, ty, dims) = (v[0], v[1], v[2].replace(',', ", "));
                let want = [idx, name, ty, &format!("[{dims}]")];
                let found = info.lines().any(|l| {
                    let toks: Vec<&str> = l.split_whitespace().collect();
                    toks.len() >= 4
                        && toks[0] == want[0]
                        && toks[1] == want[1]
                        && toks[2] == want[2]
                        && l.contains(want[3])
                });
                assert!(found, "duet info lacks tensor {want:?}");
            }
            _ => panic!("unexpected oracle line {l:?}"),
        }
    }
    let header = info.lines().next().unwrap();
    assert!(header.contains(&format!("{n_kv} metadata keys, {n_tensors} tensors")), "{header}");
    assert_eq!(n_tensors, 272);
}
