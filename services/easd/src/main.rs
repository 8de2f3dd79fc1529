//! `easd`: the command-line tool for people. `main` → `try_main` → one function per command,
//! each command in its own file.

mod ask;
mod bench;
mod bench_sessions;
mod eval;
mod health;
mod models;
mod proxy;
mod stack;
mod tokenize;
mod up;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "easd", version, about = "Entropy-Aware Speculative Decoding: tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run draft, verifier and coordinator locally on loopback with the default pair, until Ctrl-C.
    Up(up::UpArgs),
    /// Ask a question; the answer streams to stdout, the summary follows.
    Ask(ask::AskArgs),
    /// Check a server with the standard gRPC health protocol (exit 0 when serving).
    Health(health::HealthArgs),
    /// Measure each model's token entropies on a calibration set; write τ recommendations.
    Calibrate(eval::CalibrateArgs),
    /// Run a GSM8K-format benchmark through the coordinator in several modes; write results and a report.
    Eval(eval::EvalArgs),
    /// Sweep EASD's τ percentile, ρ and N on a development slice.
    Sweep(eval::SweepArgs),
    /// Fetch or list the default draft/target models; fetch a GGUF file of a hub repository.
    #[command(subcommand)]
    Models(models::ModelsCommand),
    /// Print the token ids of a text as a JSON list.
    Tokenize(tokenize::TokenizeArgs),
    /// Benchmarks and checks on real models.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> ExitCode {
    match try_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn try_main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Up(args) => runtime()?.block_on(up::run(args)),
        Command::Ask(args) => runtime()?.block_on(ask::run(args)),
        Command::Health(args) => runtime()?.block_on(health::run(args)),
        Command::Calibrate(args) => eval::calibrate(args),
        Command::Eval(args) => runtime()?.block_on(eval::eval(args)),
        Command::Sweep(args) => runtime()?.block_on(eval::sweep(args)),
        Command::Models(cmd) => models::run(cmd),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Bench(cmd) => bench::run(cmd),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}
