//! The architecture the README's Layout section describes, checked: the runtime's core names
//! none of its tools, the Backend trait's file imports neither the model nor a tool nor a
//! backend, no library reads the environment (the CLI passes settings as options), and the
//! converter builds without wgpu.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_runtime_core_imports_no_tool() {
    let src = root().join("runtime/src");
    let tools = src.join("tools");
    let mut offenders = Vec::new();
    for f in sources(&src).into_iter().filter(|f| !f.starts_with(&tools)) {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.contains("crate::tools") || line.contains("super::tools") {
                offenders.push(format!("{}:{}: {line}", f.display(), i + 1));
            }
        }
    }
    assert!(offenders.is_empty(), "the core names a tool:\n{}", offenders.join("\n"));
    assert!(sources(&tools).len() > 10, "the tools are under runtime/src/tools");
}

#[test]
fn the_backend_trait_imports_neither_model_nor_tools_nor_a_backend() {
    let text = std::fs::read_to_string(root().join("runtime/src/backend.rs")).unwrap();
    for banned in ["crate::model::", "crate::tools", "crate::gpu", "crate::cpu", "calibrate"] {
        assert!(!text.contains(banned), "runtime/src/backend.rs names {banned}");
    }
    // Nor does a backend match tensor names: it receives roles.
    for backend in ["runtime/src/cpu", "runtime/src/gpu"] {
        for f in sources(&root().join(backend)) {
            let text = std::fs::read_to_string(&f).unwrap();
            for name in ["token_embd", "attn_dex", "output.weight", "_norm.weight"] {
                assert!(!text.contains(name), "{} matches the tensor name {name}", f.display());
            }
        }
    }
}

/// Libraries take their settings as options; only `src/` (the CLI) reads the environment.
/// The one exception prepares the Vulkan loader's environment before `main` starts threads.
#[test]
fn no_library_reads_the_environment() {
    let mut offenders = Vec::new();
    for dir in ["quant/src", "runtime/src", "shaders/src", "converter/src"] {
        for f in sources(&root().join(dir)) {
            let text = std::fs::read_to_string(&f).unwrap();
            for (i, line) in text.lines().enumerate() {
                let reads = line.contains("env::var") || line.contains("var_os(");
                if reads && !line.contains("\"XDG_RUNTIME_DIR\"") {
                    offenders.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(offenders.is_empty(), "library code reads the environment:\n{}", offenders.join("\n"));
}

#[test]
fn the_converter_builds_without_wgpu() {
    let o = std::process::Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-p", "duet-convert", "-e", "normal", "--prefix", "none"])
        .current_dir(root())
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&o.stderr));
    assert!(tree.contains("duet-runtime"), "{tree}");
    for gpu in ["wgpu", "naga", "duet-shaders"] {
        assert!(!tree.lines().any(|l| l.starts_with(gpu)), "duet-convert depends on {gpu}:\n{tree}");
    }
}

/// Files stay a few hundred lines; one past ~600 says at its top why it is one file, with
/// its length ("(~680 lines)").
#[test]
fn long_library_files_say_why() {
    let mut offenders = Vec::new();
    for dir in ["src", "quant/src", "runtime/src", "shaders/src", "converter/src"] {
        for f in sources(&root().join(dir)) {
            let text = std::fs::read_to_string(&f).unwrap();
            let lines = text.lines().count();
            let top: String = text.lines().take(25).collect::<Vec<_>>().join("\n");
            let says = top.contains("(~") && top.contains(" lines)");
            if lines > 620 && !says {
                offenders.push(format!("{} ({lines} lines)", f.display()));
            }
        }
    }
    assert!(offenders.is_empty(), "long files without a reason at their top:\n{}", offenders.join("\n"));
}
