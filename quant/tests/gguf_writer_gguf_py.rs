//! Our writer against an independent reader: gguf-py's GGUFReader must see exactly the
//! metadata, tensor infos and bytes we wrote. Needs `$DUET_PYTHON` (gguf==0.19 + numpy);
//! skipped without it, a failure under `$DUET_REQUIRE_ORACLES`.

mod common;

use common::{fixtures_dir, fresh_dir, hex, metadata_json, sample_writer};
use duet_quant::gguf::{GgufFile, GgufWriter};
use duet_test_support::{oracle_python, run_python};
use serde_json::{Value as Json, json};

fn read_with_gguf_py(python: &std::path::Path, file: &std::path::Path) -> Json {
    let script = fixtures_dir().join("check_with_gguf_py.py");
    let out = run_python(python, &script, &[file.as_os_str()]);
    serde_json::from_str(&out).expect("check_with_gguf_py.py prints JSON")
}

#[test]
fn gguf_py_reads_what_we_write() {
    let Some(python) = oracle_python("gguf_py_reads_what_we_write") else {
        return;
    };
    let dir = fresh_dir("gguf_py_reads_what_we_write");
    for alignment in [32, 64] {
        let path = dir.join(format!("ours-{alignment}.gguf"));
        let (w, data) = sample_writer(&path, alignment, 99);
        let meta = metadata_json(w.metadata());
        let specs = w.tensors().to_vec();
        w.write_tensors_from(&data).unwrap();

        let got = read_with_gguf_py(&python, &path);
        assert_eq!(got["version"], 3);
        assert_eq!(got["alignment"], alignment);
        assert_eq!(got["metadata"], meta, "alignment {alignment}");
        assert_eq!(got["data_offset"], GgufFile::open(&path).unwrap().data_offset());
        let want: Vec<Json> = specs
            .iter()
            .zip(&data)
            .map(|(t, bytes)| {
                json!({
                    "name": t.name(),
                    "type": t.ggml_type().name(),
                    "dims": t.dims(),
                    "offset": t.offset(),
                    "n_bytes": t.n_bytes(),
                    "hex": hex(bytes),
                })
            })
            .collect();
        assert_eq!(got["tensors"], Json::Array(want), "alignment {alignment}");
    }
}

#[test]
fn gguf_py_reads_a_file_without_tensors() {
    let Some(python) = oracle_python("gguf_py_reads_a_file_without_tensors") else {
        return;
    };
    let dir = fresh_dir("gguf_py_reads_a_file_without_tensors");
    let path = dir.join("empty.gguf");
    let mut w = GgufWriter::new(&path);
    w.add("general.architecture", "diffllama").unwrap();
    w.add("tokenizer.ggml.tokens", vec!["a", "b"]).unwrap();
    let meta = metadata_json(w.metadata());
    w.start().unwrap().finish().unwrap();
    let got = read_with_gguf_py(&python, &path);
    assert_eq!(got["metadata"], meta);
    assert_eq!(got["tensors"], json!([]));
}
