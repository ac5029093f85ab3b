//! The `duet` command line: argument parsing and wiring only. Model logic lives in the
//! workspace crates (quant, runtime, converter).

mod cmd;

// Bounds what a model's chat template may allocate (duet_runtime::mem_budget).
#[global_allocator]
static ALLOC: duet_runtime::mem_budget::BudgetAlloc = duet_runtime::mem_budget::BudgetAlloc;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "duet",
    version,
    about = "Run and convert Differential Transformer (DIFF) language models",
    long_about = "duet converts DiffLlama, Llama and DEX checkpoints to GGUF at 4, 6 and 8 bits and runs \
                  them (and llama.cpp's Llama GGUFs) on a CPU or any Vulkan/Metal/DX12 GPU, including \
                  differential attention with low-bit K/V cache and attention logits.",
    after_long_help = cmd::environment::HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Accuracy of low-bit attention (4/6/8-bit logits, K and V) against 16-bit, per model
    AttnBench(cmd::attn_bench::Args),
    /// Heatmaps of the attention of each layer and head over a prompt (DIFF: A1, A2, A1 − λ·A2)
    AttnMap(cmd::attn_map::Args),
    /// Measure prompt-processing and decode speed (tokens/s), like llama-bench
    Bench(cmd::bench::Args),
    /// Chat with a model in the terminal (without -m: the bundled DIFF model)
    Chat(cmd::chat::Args),
    /// Convert a Hugging Face DiffLlama/Llama/DEX checkpoint (or a GGUF) to GGUF at 4-8 bits
    Convert(cmd::convert::Args),
    /// Show a GGUF file's metadata and tensors (like gguf-dump, but readable)
    Info(cmd::info::Args),
    /// Key-information retrieval: attention to a hidden needle vs noise, per model and depth
    Needle(cmd::needle::Args),
    /// Perplexity over a text file; save logits or compare against saved ones (KL divergence)
    Perplexity(cmd::perplexity::Args),
    /// Complete a prompt, streaming the text
    Run(cmd::run::Args),
    /// An OpenAI-compatible HTTP server (chat/completions, completions, models, metrics)
    Serve(cmd::serve::Args),
    /// A chat page that runs models in the browser on WebGPU (served on loopback)
    Web(cmd::web::Args),
}

fn main() -> ExitCode {
    // SAFETY: first thing in main, before any thread exists.
    unsafe { duet_runtime::gpu::device::prepare_loader_environment() };
    // llama.cpp spells --n-gpu-layers `-ngl`, which clap would read as -n gl.
    let argv = std::env::args_os().map(|a| match a.to_str() {
        Some("-ngl") => "--n-gpu-layers".into(),
        Some(s) if s.starts_with("-ngl=") => format!("--n-gpu-layers={}", &s[5..]).into(),
        _ => a,
    });
    let mut cli = Cli::parse_from(argv);
    let settled = match &mut cli.command {
        Command::AttnMap(a) => a.model.settle_device(),
        Command::Bench(a) => a.model.settle_device(),
        Command::Chat(a) => a.model.settle_device(),
        Command::Perplexity(a) => a.model.settle_device(),
        Command::Run(a) => a.model.settle_device(),
        Command::Serve(a) => a.model.settle_device(),
        Command::AttnBench(_) | Command::Convert(_) | Command::Info(_) | Command::Needle(_) | Command::Web(_) => Ok(()),
    };
    let result = settled.and_then(|()| cmd::environment::init()).and_then(|()| match cli.command {
        Command::AttnBench(args) => cmd::attn_bench::run(args),
        Command::AttnMap(args) => cmd::attn_map::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Chat(args) => cmd::chat::run(args),
        Command::Convert(args) => cmd::convert::run(args),
        Command::Info(args) => cmd::info::run(args),
        Command::Needle(args) => cmd::needle::run(args),
        Command::Perplexity(args) => cmd::perplexity::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Web(args) => cmd::web::run(args),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line per cause, no backtrace: errors here are for users.
            eprintln!("error: {err}");
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}
