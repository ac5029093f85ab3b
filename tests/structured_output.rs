//! Structured output (runtime/src/grammar): token bytes that spell what the tokenizer
//! encodes, replies of the bundled 10 M DIFF model held to a JSON schema and to GBNF and Lark
//! grammars (a model far too small to follow them by itself), and schemas and grammars that
//! cannot constrain a reply refused with the reason before any generation.
//! (The server's side, through the `openai` client: tests/serve_http.rs.)

use std::path::{Path, PathBuf};
use std::sync::Arc;

use duet_quant::gguf::GgufFile;
use duet_runtime::cpu::CpuBackend;
use duet_runtime::engine::{Engine, EngineOptions, StopReason};
use duet_runtime::grammar::{GrammarSpec, Grammars, MAX_GRAMMAR_BYTES};
use duet_runtime::sampler::{Sampler, SamplerConfig};
use duet_runtime::text::Tokenizer;
use duet_runtime::text::token_bytes::{SPECIAL_MARKER, token_bytes};
use duet_test_support::asset;
use duet_test_support::json_schema::validate;
use serde_json::Value;

fn bundled() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/duet-diff-ref.q8_0.gguf")
}

fn person_schema() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/structured/person.schema.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn engine() -> Engine<CpuBackend> {
    Engine::load(CpuBackend::new(2), &bundled(), &EngineOptions::default()).unwrap()
}

fn grammars(e: &Engine<CpuBackend>) -> Grammars {
    Grammars::new(Arc::new(e.tokenizer.clone()), e.model.config.n_vocab)
}

/// Generates after `prompt` under `spec` at temperature 1 with `seed`: (text, stop).
fn generate(
    e: &mut Engine<CpuBackend>,
    g: &Grammars,
    spec: &GrammarSpec,
    prompt: &str,
    seed: u64,
) -> (String, StopReason) {
    let constraint = g.compile(spec).unwrap();
    let cfg = SamplerConfig { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed, ..SamplerConfig::default() };
    let mut sampler = Sampler::new(cfg).with_constraint(Some(constraint));
    let tokens = e.tokenizer.encode(prompt, e.tokenizer.add_bos).unwrap();
    let mut text = String::new();
    let (_, stats) = e
        .generate(&tokens, 400, &mut sampler, &mut |t| {
            text.push_str(t);
            true
        })
        .unwrap();
    (text, stats.stop)
}

/// The bytes of the tokens of a text are the text: what the mask is computed from matches
/// what the tokenizer makes and the detokenizer prints (byte-level BPE of the bundled
/// model's tokenizer.json and of SmolLM2's GGUF vocabulary; control tokens marked).
#[test]
fn token_bytes_spell_the_text_the_tokenizer_encodes() {
    let mut files = vec![bundled()];
    files.extend(asset(
        "token_bytes_spell_the_text_the_tokenizer_encodes",
        "DUET_SMOLLM2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    ));
    for path in files {
        let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        let n = tok.vocab_size();
        let bytes = token_bytes(&tok, n + 3).unwrap();
        assert_eq!(bytes.len(), n + 3);
        assert!(bytes[n..].iter().all(Vec::is_empty), "ids past the vocabulary stand for nothing");
        for text in
            ["Hello, world!", " ünïcödé — 東京 🐉 tabs\tand\nlines", "{\"a\": [1, 2.5e-3, null]}", "   spaces  "]
        {
            let ids = tok.encode_literal(text).unwrap();
            let spelled: Vec<u8> = ids.iter().flat_map(|&i| bytes[i as usize].iter().copied()).collect();
            assert_eq!(String::from_utf8_lossy(&spelled), text, "{}", path.display());
        }
        for &eog in &tok.eog {
            assert_eq!(bytes[eog as usize].first(), Some(&SPECIAL_MARKER), "{}: eog {eog}", path.display());
        }
        // The tokenizer's own table (grammars and log probabilities read it) is this one,
        // made once and shared, clones included; another vocabulary size gets its own.
        let shared = tok.id_bytes(n + 3).unwrap();
        assert_eq!(*shared, bytes);
        assert!(std::sync::Arc::ptr_eq(&shared, &tok.clone().id_bytes(n + 3).unwrap()), "made twice");
        assert_eq!(tok.id_bytes(n).unwrap().len(), n);
    }
}

/// The acceptance's 50 seeded replies at temperature 1 through `Engine::generate` (what
/// `duet run --json-schema` and `duet chat` use), each valid under the schema and ended by
/// the grammar or the model, never by the token limit.
#[test]
fn json_schema_replies_of_the_bundled_model_validate() {
    let mut e = engine();
    let g = grammars(&e);
    let schema = person_schema();
    let spec = GrammarSpec::JsonSchema(schema.clone());
    for seed in 0..50 {
        let (text, stop) = generate(&mut e, &g, &spec, "Describe a person:", seed);
        assert!(
            matches!(stop, StopReason::GrammarComplete | StopReason::EndOfGeneration),
            "seed {seed}: {stop:?}: {text}"
        );
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|err| panic!("seed {seed}: {err}: {text}"));
        validate(&v, &schema).unwrap_or_else(|err| panic!("seed {seed}: {err}: {text}"));
        // Compact, as documented: ", " and ": " and no other whitespace between tokens.
        assert_eq!(serde_json::to_string(&v).unwrap().len() + count_separators(&v), text.len(), "seed {seed}: {text}");
    }
}

/// The spaces `", "` and `": "` add to serde_json's compact form.
fn count_separators(v: &Value) -> usize {
    match v {
        Value::Array(a) => a.len().saturating_sub(1) + a.iter().map(count_separators).sum::<usize>(),
        Value::Object(o) => o.len().saturating_sub(1) + o.len() + o.values().map(count_separators).sum::<usize>(),
        _ => 0,
    }
}

#[test]
fn json_object_gbnf_and_lark_replies_follow_their_grammar() {
    let mut e = engine();
    let g = grammars(&e);
    let mut complete = 0;
    for seed in 0..10 {
        // Any object: its strings are unbounded, so a reply may meet the token limit; it is
        // then a cut-off object (serde_json finds the end of input, not a wrong character).
        let (text, stop) = generate(&mut e, &g, &GrammarSpec::JsonObject, "JSON:", seed);
        match serde_json::from_str::<Value>(&text) {
            Ok(v) => {
                assert!(v.is_object() && stop != StopReason::Limit, "{stop:?}: {text}");
                complete += 1;
            }
            Err(err) => assert!(err.is_eof() && stop == StopReason::Limit && text.starts_with('{'), "{err}: {text}"),
        }

        let gbnf = "root ::= (\"yes\" | \"no\") \", because \" word (\" \" word){0,3} \".\"\nword ::= [a-z]{1,8}\n";
        let (text, stop) = generate(&mut e, &g, &GrammarSpec::Gbnf(gbnf.into()), "Q:", seed);
        let rest = text
            .strip_prefix("yes, because ")
            .or(text.strip_prefix("no, because "))
            .unwrap_or_else(|| panic!("{text}"));
        let words = rest.strip_suffix('.').unwrap_or_else(|| panic!("{text}"));
        let words: Vec<&str> = words.split(' ').collect();
        assert!((1..=4).contains(&words.len()), "{text}");
        assert!(
            words.iter().all(|w| (1..=8).contains(&w.len()) && w.bytes().all(|b| b.is_ascii_lowercase())),
            "{text}"
        );
        assert_eq!(stop, StopReason::GrammarComplete, "{text}");

        let lark = "%llguidance {}\nstart: NUM (\",\" NUM){2}\nNUM: /[1-9][0-9]?/\n";
        let (text, _) = generate(&mut e, &g, &GrammarSpec::grammar(lark.into(), false), "Numbers:", seed);
        let nums: Vec<u32> = text.split(',').map(|n| n.parse().unwrap_or_else(|_| panic!("{text}"))).collect();
        assert!(nums.len() == 3 && nums.iter().all(|n| (1..100).contains(n)), "{text}");
    }
    assert!(complete >= 5, "{complete} of 10 objects complete within 400 tokens");
}

/// Everything that cannot constrain a reply is found by `compile`, with the reason.
#[test]
fn schemas_and_grammars_that_cannot_constrain_are_refused_with_the_reason() {
    let e = engine();
    let g = grammars(&e);
    let big = format!("root ::= \"{}\"", "a".repeat(MAX_GRAMMAR_BYTES));
    let schema = |s: &str| GrammarSpec::JsonSchema(serde_json::from_str(s).unwrap());
    for (spec, reason) in [
        (GrammarSpec::Gbnf("root ::= x".into()), "rule 'x' is used but never defined"),
        (GrammarSpec::Gbnf("root ::= \"a\" root".into()), "admits no string"),
        (GrammarSpec::Gbnf(big), &format!("at most {MAX_GRAMMAR_BYTES} bytes")),
        (GrammarSpec::Lark("start: /[^\\x00-\\x{10FFFF}]/".into()), "admits no string"),
        (GrammarSpec::Lark("start: (".into()), "Expected token ')'"),
        (schema(r#"{"type": "integer", "minimum": 5, "maximum": 3}"#), "minimum (5) is greater than maximum (3)"),
        (
            schema(r#"{"type": "string", "minLength": 3, "maxLength": 2}"#),
            "minLength (3) is greater than maxLength (2)",
        ),
        (schema("false"), "Unsatisfiable"),
        (schema(r#"{"$ref": "https://example.invalid/s.json"}"#), "ref"),
        (schema("[1]"), "must be an object or a boolean"),
    ] {
        let err = match g.compile(&spec) {
            Ok(_) => panic!("{spec:?} compiled"),
            Err(e) => e,
        };
        assert!(err.contains(reason), "{spec:?}: {err}");
        assert!(!err.contains('\n') && err.len() < 600, "one line of reason: {err}");
    }
}

/// Every tool-call family's grammar compiles with a real tokenizer (Mistral's names its
/// marker by a token id), for `auto` and `required`.
#[test]
fn every_tool_call_grammar_compiles() {
    use duet_runtime::tools::serve::tool_calls::{Format, grammar, parse_tools};
    let e = engine();
    let g = grammars(&e);
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    for choice in ["auto", "required"] {
        let t = parse_tools(Some(&tools), Some(&serde_json::json!(choice)), None).unwrap().unwrap();
        for (format, marker) in [
            (Format::Hermes, None),
            (Format::Generic, None),
            (Format::Llama3, None),
            (Format::Mistral, Some(3)),
            (Format::Mistral, None),
        ] {
            let spec = grammar(&t, format, marker).unwrap();
            g.compile(&spec).unwrap_or_else(|err| panic!("{format:?} {choice}: {err}: {spec:?}"));
        }
    }
}

/// The byte-fallback path: a SentencePiece vocabulary rebuilt from `tokenizer.ggml.*`
/// (`<0xHH>` pieces, `▁` for spaces, control tokens): each id's bytes, and the bytes of a
/// text's tokens spell the text as the normalizer wrote it (a leading space, `é` from two
/// byte pieces).
#[test]
fn token_bytes_of_a_sentencepiece_vocabulary() {
    use duet_quant::gguf::GgufWriter;
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types: Vec<i32> = vec![2, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for piece in ["▁", "a", "b", "▁a", "▁b", "ab", "▁ab"] {
        tokens.push(piece.into());
        types.push(1);
    }
    let scores: Vec<f32> = (0..tokens.len()).map(|i| i as f32).collect();
    let path = std::env::temp_dir().join(format!("duet-sp-vocab-{}.gguf", std::process::id()));
    let mut w = GgufWriter::new(&path);
    w.add("general.architecture", "llama").unwrap();
    w.add("tokenizer.ggml.model", "llama").unwrap();
    w.add("tokenizer.ggml.tokens", tokens.iter().map(String::as_str).collect::<Vec<&str>>()).unwrap();
    w.add("tokenizer.ggml.scores", scores).unwrap();
    w.add("tokenizer.ggml.token_type", types).unwrap();
    w.add("tokenizer.ggml.bos_token_id", 1u32).unwrap();
    w.add("tokenizer.ggml.eos_token_id", 2u32).unwrap();
    w.start().unwrap().finish().unwrap();
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let bytes = token_bytes(&tok, tokens.len()).unwrap();
    let id = |t: &str| tokens.iter().position(|x| x == t).unwrap();
    assert_eq!(bytes[id("<0xE2>")], [0xE2]);
    assert_eq!(bytes[id("▁ab")], b" ab");
    assert_eq!(bytes[id("</s>")].first(), Some(&SPECIAL_MARKER));
    let text = "ab a é";
    let ids = tok.encode_literal(text).unwrap();
    let spelled: Vec<u8> = ids.iter().flat_map(|&i| bytes[i as usize].iter().copied()).collect();
    assert_eq!(String::from_utf8(spelled).unwrap(), format!(" {text}"), "{ids:?}");
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
}
