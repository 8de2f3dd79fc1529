//! `easd calibrate`, `easd eval`, `easd sweep`: the evaluation harness (crate `easd-eval`) on the command line.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use easd_eval::{
    BarProgress, CalibrationConfig, CalibrationFile, CalibrationText, CoordinatorDescription, CoordinatorGenerator,
    EasdOrder, EasdSettings, EvalConfig, Mode, ModelScorer, ReportContext, Sampling, SweepConfig, run_calibration,
    run_eval, run_sweep, stored_results, write_report, write_sweep_report,
};
use easd_model::{ModelSources, resolve_model};
use easd_server::local::LocalOptions;

use crate::ask::{EasdArgs, OrderArg};
use crate::stack::{DeviceArgs, LocalArgs};

const DEFAULT_DATASET: &str = "../shared/data/gsm8k/train.jsonl";

/// Sampling and decoding settings shared by eval and sweep.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// GSM8K-format JSONL (question, answer ending in "#### N").
    #[arg(long, default_value = DEFAULT_DATASET, env = "EASD_DATASET")]
    pub dataset: PathBuf,
    /// Results and report directory (results.jsonl is appended to and resumed from).
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 0)]
    pub offset: usize,
    #[arg(long)]
    pub limit: Option<usize>,
    /// Requests in flight at once (1 gives clean per-request wall-clock figures).
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub top_k: u32,
    /// Base seed; problem i uses seed + i in every mode.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub seed: u64,
    #[arg(short = 'k', long, default_value_t = 4, allow_negative_numbers = true)]
    pub k: u32,
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true)]
    pub max_tokens: u32,
    /// Calibration file: its entropy distribution goes into the report's entropy plot.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Coordinator URL; without it the whole stack starts in this process.
    #[arg(long)]
    pub coordinator: Option<String>,
    #[command(flatten)]
    pub local: LocalArgs,
}

impl RunArgs {
    fn eval_config(&self) -> EvalConfig {
        let mut config = EvalConfig::new(&self.dataset, self.out.join("results.jsonl"));
        config.offset = self.offset;
        config.limit = self.limit;
        config.concurrency = self.concurrency;
        config.sampling =
            Sampling { temperature: self.temperature, top_k: self.top_k, top_p: self.top_p, seed: self.seed };
        config.k = self.k;
        config.max_tokens = self.max_tokens;
        config
    }

    /// The report's setup lines; `config` is the run as executed (a sweep moves the slice to the development lines),
    /// `coordinator` what the coordinator said about itself (its models and the EASD values unset fields took).
    fn setup(&self, command: &str, config: &EvalConfig, coordinator: Option<&CoordinatorDescription>) -> Vec<String> {
        let limit = config.limit.map_or_else(|| "all".to_string(), |n| n.to_string());
        let mut lines = vec![
            format!("command: `{command}`"),
            format!(
                "dataset {} (offset {}, limit {limit}); temperature {}, top_p {}, top_k {}, seed {}, k {}, max_tokens {}",
                self.dataset.display(),
                config.offset,
                self.temperature,
                self.top_p,
                self.top_k,
                self.seed,
                self.k,
                self.max_tokens
            ),
        ];
        lines.extend(coordinator.map(coordinator_line));
        lines
    }

    /// Connects to the coordinator, or starts one here; the stack (if any) must outlive the run.
    async fn generator(&self) -> anyhow::Result<(CoordinatorGenerator, Option<easd_server::local::LocalStack>)> {
        let (url, stack) = match &self.coordinator {
            Some(url) => (url.clone(), None),
            None => {
                let stack = self.local.start(LocalOptions::default()).await?;
                (stack.coordinator_url.clone(), Some(stack))
            }
        };
        let generator = CoordinatorGenerator::connect(&url, Duration::from_secs(3600)).await?;
        Ok((generator, stack))
    }
}

/// The models and the EASD defaults in force: a variant's unset EASD fields took these values, which the settings
/// hash does not cover, so the report names them (and resuming checks them, see `EvalConfig::easd_defaults`).
fn coordinator_line(c: &CoordinatorDescription) -> String {
    let show = |v: Option<String>| v.unwrap_or_else(|| "?".into());
    let d = &c.default_easd;
    format!(
        "coordinator: draft {}, target {}; EASD defaults for unset fields: τ_draft {}, τ_target {}, ρ {}, N {}, order \
         {}, {}",
        show(c.draft_model.clone()),
        if c.target_models.is_empty() { "?".into() } else { c.target_models.join(", ") },
        show(d.tau_draft.map(|t| format!("{t:.3}"))),
        show(d.tau_target.map(|t| format!("{t:.3}"))),
        show(d.rho.map(|r| r.to_string())),
        show(d.top_n.map(|n| n.to_string())),
        show(d.order.map(|o| match o {
            EasdOrder::AfterSd => "after_sd".to_string(),
            EasdOrder::Gate => "gate".to_string(),
        })),
        d.penalty_alpha.map_or_else(|| "mask".to_string(), |a| format!("penalty α {a}"))
    )
}

fn easd_settings(args: &EasdArgs) -> EasdSettings {
    EasdSettings {
        top_n: args.top_n,
        rho: args.rho,
        tau_draft: args.tau_draft,
        tau_target: args.tau_target,
        order: args.order.map(|o| match o {
            OrderArg::AfterSd => EasdOrder::AfterSd,
            OrderArg::Gate => EasdOrder::Gate,
        }),
        penalty_alpha: args.penalty_alpha,
    }
}

fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// Modes to compare, comma-separated.
    #[arg(long, default_value = "draft,target,sd,easd")]
    pub modes: String,
    /// Pre-registered comparisons A:B, comma-separated, primary first (e.g. `easd:target,easd:sd`): reported in
    /// their own table, Holm-adjusted over these alone.
    #[arg(long, value_delimiter = ',')]
    pub compare: Vec<String>,
    /// Write the report from the results already in --out, generating nothing and loading no model (e.g. over modes
    /// run one at a time); the report's setup line says how many lines are still missing.
    #[arg(long)]
    pub report_only: bool,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub easd: EasdArgs,
}

pub async fn eval(args: EvalArgs) -> anyhow::Result<()> {
    let modes = Mode::parse_list(&args.modes)?;
    let planned = planned_comparisons(&args.compare, &modes)?;
    let mut config = args.run.eval_config().with_modes(&modes, &easd_settings(&args.easd));
    let (records, coordinator, status) = if args.report_only {
        let (records, missing) = stored_results(&config)?;
        eprintln!("{} lines in {}, {missing} missing", records.len(), config.results.display());
        let status = format!("report only: {} lines present, {missing} not yet run", records.len());
        (records, None, status)
    } else {
        let (generator, stack) = args.run.generator().await?;
        let coordinator = generator.describe().await.ok();
        config.easd_defaults = coordinator.as_ref().map(|c| c.default_easd.clone());
        let result = run_eval(&config, &generator, &BarProgress::new()).await;
        if let Some(stack) = stack {
            stack.shutdown().await;
        }
        let run = result?;
        eprintln!("{} generated, {} resumed, {:.0} s", run.generated, run.resumed, run.elapsed_s);
        let status = format!("this run: {} generated, {} resumed", run.generated, run.resumed);
        (run.records, coordinator, status)
    };
    let calibration = args.run.calibration.as_deref().map(CalibrationFile::load).transpose()?;
    let mut setup = args.run.setup(&command_line(), &config, coordinator.as_ref());
    setup.push(status);
    let context = ReportContext { title: "EASD evaluation".into(), setup, planned, ..Default::default() };
    let files = write_report(&args.run.out, &records, context, calibration.as_ref())?;
    println!("report: {}", files.markdown.display());
    Ok(())
}

/// `A:B` pairs of mode names, each among `modes`; checked before anything loads.
fn planned_comparisons(compare: &[String], modes: &[Mode]) -> anyhow::Result<Vec<(String, String)>> {
    compare
        .iter()
        .map(|pair| {
            let (a, b) = pair
                .split_once(':')
                .with_context(|| format!("invalid --compare {pair:?}: expected A:B, e.g. easd:target"))?;
            let (a, b) = (a.trim().parse::<Mode>()?, b.trim().parse::<Mode>()?);
            anyhow::ensure!(a != b, "invalid --compare {pair:?}: compares {a} with itself");
            for m in [a, b] {
                anyhow::ensure!(modes.contains(&m), "invalid --compare {pair:?}: {m} is not among --modes");
            }
            Ok((a.to_string(), b.to_string()))
        })
        .collect()
}

#[derive(clap::Args, Debug)]
pub struct SweepArgs {
    /// Calibration file giving τ at each percentile.
    #[arg(long)]
    pub tau_calibration: PathBuf,
    /// Entropy percentiles for τ_draft/τ_target, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "80,90,95")]
    pub percentiles: Vec<f64>,
    #[arg(long, value_delimiter = ',', default_value = "0.6,0.8")]
    pub rhos: Vec<f32>,
    #[arg(long, value_delimiter = ',', default_value = "5")]
    pub top_ns: Vec<u32>,
    /// Allow the slice to reach into the held-out lines.
    #[arg(long)]
    pub allow_held_out: bool,
    #[command(flatten)]
    pub run: RunArgs,
}

pub async fn sweep(args: SweepArgs) -> anyhow::Result<()> {
    let calibration = CalibrationFile::load(&args.tau_calibration)?;
    let mut config = SweepConfig::new(args.run.eval_config());
    // SweepConfig::new picks the development slice; explicit flags win.
    if args.run.offset != 0 {
        config.eval.offset = args.run.offset;
    }
    if args.run.limit.is_some() {
        config.eval.limit = args.run.limit;
    }
    config.grid.tau_percentiles = args.percentiles.clone();
    config.grid.rhos = args.rhos.clone();
    config.grid.top_ns = args.top_ns.clone();
    config.allow_held_out = args.allow_held_out;
    let (generator, stack) = args.run.generator().await?;
    let coordinator = generator.describe().await.ok();
    config.eval.easd_defaults = coordinator.as_ref().map(|c| c.default_easd.clone());
    let result = run_sweep(&config, &calibration, &generator, &BarProgress::new()).await;
    if let Some(stack) = stack {
        stack.shutdown().await;
    }
    let sweep = result?;
    let context = ReportContext {
        title: "EASD sweep".into(),
        setup: args.run.setup(&command_line(), &config.eval, coordinator.as_ref()),
        ..Default::default()
    };
    let files = write_sweep_report(&args.run.out, &sweep, context)?;
    println!("report: {}", files.markdown.display());
    Ok(())
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum TextArg {
    Reference,
    TargetGreedy,
}

#[derive(clap::Args, Debug)]
pub struct CalibrateArgs {
    /// JSONL with a question field (GSM8K format for teacher forcing on the reference answer).
    #[arg(long, default_value = DEFAULT_DATASET, env = "EASD_DATASET")]
    pub dataset: PathBuf,
    /// Where to write the calibration file (JSON).
    #[arg(long, default_value = "calibration.json")]
    pub out: PathBuf,
    #[arg(long, default_value_t = 100)]
    pub questions: usize,
    /// Percentile of each model's entropy distribution recommended as τ.
    #[arg(long, default_value_t = 90.0, allow_negative_numbers = true)]
    pub percentile: f64,
    /// The evaluation temperature (entropies are measured at it; 0 means greedy, measured at 1).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Text the models are teacher-forced on: the dataset's reference solution, or the target's own greedy answer
    /// (one generation per question, slower; its entropies are the ones EASD sees at generation time).
    #[arg(long, value_enum, default_value_t = TextArg::Reference)]
    pub text: TextArg,
    #[arg(long, default_value = "draft")]
    pub draft_model: String,
    #[arg(long, default_value = "target")]
    pub target_model: String,
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    #[command(flatten)]
    pub devices: DeviceArgs,
}

pub fn calibrate(args: CalibrateArgs) -> anyhow::Result<()> {
    let sources = ModelSources::from_env(args.models_dir.clone());
    let load = args.devices.load_options(false)?;
    let draft_path = resolve_model(&args.draft_model, &sources, true)?;
    let target_path = resolve_model(&args.target_model, &sources, true)?;
    let draft = ModelScorer::load(&draft_path, &load.draft).context("loading the draft")?;
    let target = ModelScorer::load(&target_path, &load.target).context("loading the target")?;
    let mut config = CalibrationConfig::new(&args.dataset);
    config.questions = args.questions;
    config.percentile = args.percentile;
    config.temperature = if args.temperature == 0.0 { 1.0 } else { args.temperature };
    config.seed = args.seed;
    config.text = match args.text {
        TextArg::Reference => CalibrationText::Reference,
        TextArg::TargetGreedy => CalibrationText::TargetGreedy,
    };
    let bar = indicatif::ProgressBar::new(args.questions as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} questions [{elapsed_precise} < {eta_precise}]")
            .expect("valid template"),
    );
    let file = run_calibration(&config, &draft, &target, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish();
    file.save(&args.out)?;
    let r = &file.recommended;
    println!(
        "wrote {}: τ_draft {:.3}, τ_target {:.3} (p{})",
        args.out.display(),
        r.tau_draft,
        r.tau_target,
        r.percentile
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setup_names_the_easd_values_unset_fields_took() {
        let coordinator = CoordinatorDescription {
            draft_model: Some("d".into()),
            target_models: vec!["t".into()],
            default_easd: EasdSettings {
                top_n: Some(5),
                rho: Some(0.6),
                tau_draft: Some(0.81),
                tau_target: Some(0.68),
                order: Some(EasdOrder::AfterSd),
                penalty_alpha: None,
            },
        };
        assert_eq!(
            coordinator_line(&coordinator),
            "coordinator: draft d, target t; EASD defaults for unset fields: τ_draft 0.810, τ_target 0.680, ρ 0.6, \
             N 5, order after_sd, mask"
        );
        let unknown = CoordinatorDescription {
            draft_model: None,
            target_models: vec![],
            default_easd: EasdSettings { penalty_alpha: Some(0.5), ..EasdSettings::default() },
        };
        assert!(coordinator_line(&unknown).ends_with("τ_draft ?, τ_target ?, ρ ?, N ?, order ?, penalty α 0.5"));
    }

    #[test]
    fn planned_comparisons_name_two_of_the_modes_run() {
        let modes = [Mode::Target, Mode::Sd, Mode::Easd];
        let planned = planned_comparisons(&["easd:target".into(), " easd : SD ".into()], &modes).unwrap();
        assert_eq!(planned, [("easd".into(), "target".into()), ("easd".into(), "sd".into())]);
        for (bad, why) in
            [("easd", "expected A:B"), ("easd:draft", "not among --modes"), ("sd:sd", "itself"), ("easd:fast", "fast")]
        {
            let err = planned_comparisons(&[bad.into()], &modes).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
