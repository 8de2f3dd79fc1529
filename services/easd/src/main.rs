//! `easd`: the command-line tool for people. `main` → `try_main` → one function per command,
//! each command in its own file.

mod bench;
mod models;
mod tokenize;

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
    /// Fetch or list the default draft/target models.
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
        Command::Models(cmd) => models::run(cmd),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Bench(cmd) => bench::run(cmd),
    }
}
