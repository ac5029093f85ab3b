//! Seeded mutations of real chat templates (the committed fixtures' and the reference
//! model's, and Hugging Face templates of the usual shapes), each loaded and rendered over
//! a few conversations: a template comes with the model file, so whatever it holds must
//! give a rendering or a clean error — never a panic, and never a hang (template fuel).
//! Stable and deterministic; `runtime/fuzz/` has the coverage-guided counterpart.

use std::time::{Duration, Instant};

use duet_runtime::text::{ChatTemplate, Message};
use duet_test_support::{Rng, repo_root};

fn templates() -> Vec<String> {
    let root = repo_root();
    let mut out = Vec::new();
    for f in ["diffllama-gqa", "diffllama-tied-llama3", "llama-dex", "llama-gqa"] {
        let p = root.join("tests/fixtures/models").join(f).join("tokenizer_config.json");
        let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        if let Some(t) = cfg.get("chat_template").and_then(|t| t.as_str()) {
            out.push(t.to_string());
        }
    }
    out.push(std::fs::read_to_string(root.join("models/diff-ref/chat_template.jinja")).unwrap());
    // Hugging Face shapes: SmolLM2's ChatML with a default system prompt; Llama 3's header
    // tokens with strip() and raise_exception; a namespace counter with a date.
    out.push("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}".into());
    out.push("{{ bos_token }}{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role') }}{% endif %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}".into());
    out.push("{% set ns = namespace(n=0) %}Today is {{ strftime_now('%d %b %Y') }}.{% for m in messages %}{% set ns.n = ns.n + 1 %}[{{ ns.n }}:{{ m.role|upper }}] {{ m.content.strip() }}{% endfor %}{{ eos_token }}".into());
    assert_eq!(out.len(), 8, "every fixture carries a template");
    out
}

/// One mutation: a character changed, inserted or deleted, a Jinja token inserted, or a
/// span duplicated or cut.
fn mutate(rng: &mut Rng, t: &mut Vec<char>) {
    const TOKENS: [&str; 16] = [
        "{%",
        "%}",
        "{{",
        "}}",
        "{#",
        " for x in ",
        " endfor ",
        " if ",
        " endif ",
        "range(99999)",
        "|",
        "(",
        ")",
        "'",
        "messages[0]",
        "loop.",
    ];
    const CHARS: [char; 10] = ['{', '}', '%', '(', ')', '[', ']', '\'', '"', '\\'];
    let n = t.len();
    let at = |rng: &mut Rng| rng.below(n + 1);
    match rng.below(6) {
        0 if n > 0 => {
            let i = rng.below(n);
            t[i] = CHARS[rng.below(CHARS.len())];
        }
        1 => {
            let i = at(rng);
            t.insert(i, CHARS[rng.below(CHARS.len())]);
        }
        2 if n > 0 => {
            t.remove(rng.below(n));
        }
        3 => {
            let i = at(rng);
            let tok: Vec<char> = TOKENS[rng.below(TOKENS.len())].chars().collect();
            t.splice(i..i, tok);
        }
        4 if n > 1 => {
            let (a, b) = (rng.below(n), rng.below(n));
            let (a, b) = (a.min(b), a.max(b));
            let span: Vec<char> = t[a..b].to_vec();
            let i = at(rng).min(t.len());
            t.splice(i..i, span);
        }
        _ if n > 1 => {
            let (a, b) = (rng.below(n), rng.below(n));
            t.drain(a.min(b)..a.max(b));
        }
        _ => {}
    }
}

fn conversation(rng: &mut Rng) -> Vec<Message> {
    let roles = ["system", "user", "assistant", "tool", ""];
    let contents = ["Hi", "", "  spaced  ", "{{ not a template }}", "naïve 🙂", "a\nb"];
    (0..rng.below(4))
        .map(|_| Message::new(roles[rng.below(roles.len())], contents[rng.below(contents.len())]))
        .collect()
}

/// What a mutant (its parse and three renderings) may take.
const MUTANT_TIME: Duration = Duration::from_secs(1);

#[test]
fn mutated_chat_templates_render_or_fail_cleanly() {
    let mut rng = Rng::new(404);
    let (mut rendered, mut refused, mut slowest) = (0usize, 0usize, Duration::ZERO);
    for original in templates() {
        let base = ChatTemplate::new(Some(&original), true, "<s>", "</s>").unwrap();
        base.render(&[Message::new("user", "Hi")], true).unwrap_or_else(|e| panic!("{original:?} as committed: {e}"));
        for _ in 0..250 {
            let mut t: Vec<char> = original.chars().collect();
            for _ in 0..1 + rng.below(3) {
                mutate(&mut rng, &mut t);
            }
            let text: String = t.into_iter().collect();
            let t0 = Instant::now();
            match ChatTemplate::new(Some(&text), rng.below(2) == 0, "<s>", "</s>") {
                Ok(ct) => {
                    for _ in 0..3 {
                        match ct.render(&conversation(&mut rng), rng.below(2) == 0) {
                            Ok(_) => rendered += 1,
                            Err(e) => {
                                refused += 1;
                                assert!(!e.to_string().is_empty());
                            }
                        }
                    }
                }
                Err(e) => {
                    refused += 1;
                    assert!(!e.to_string().is_empty());
                }
            }
            let took = t0.elapsed();
            // A runaway (a loop the fuel should end, a renderer stuck) shows as seconds; the
            // slowest mutant measured 1.2 ms (2026-11-27, 2-core AMD EPYC family 25 model 1, release build).
            assert!(took < MUTANT_TIME, "a mutant took {took:?}: {text:?}");
            slowest = slowest.max(took);
        }
    }
    eprintln!("chat templates: {rendered} renderings, {refused} refusals; slowest mutant {slowest:?}");
    assert!(rendered > 0 && refused > 0, "the mutations reach both outcomes");
}
