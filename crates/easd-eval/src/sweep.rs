//! Parameter sweeps (`easd sweep`): EASD over a grid of τ percentile × ρ × N on a development slice, next to
//! baselines, to choose defaults without touching held-out problems.
//!
//! Slices of the GSM8K train file (7,473 lines) used by the defaults: calibration samples lines 0..2,000, sweeps run
//! on lines 2,000..4,000, and lines 4,000.. are held out for the final `easd eval`. A sweep refuses to reach into the
//! held-out lines unless told to.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::calibrate::CalibrationFile;
use crate::dataset::{load_problems, slice};
use crate::error::{Error, Result};
use crate::generator::{EasdSettings, Generator, Mode};
use crate::output::{ReportFiles, write_text_files};
use crate::plots::{SweepPlotPoint, SweepSeries, accuracy_plot, sweep_plot};
use crate::progress::Progress;
use crate::report::{ReportContext, summarize};
use crate::run::{EvalConfig, EvalRun, Variant, run_problems};
use crate::speed::speeds_cell;

pub const CALIBRATION_LINES: std::ops::Range<usize> = 0..2000;
pub const DEVELOPMENT_LINES: std::ops::Range<usize> = 2000..4000;
pub const HELD_OUT_FROM: usize = 4000;

/// The grid: every combination is one `easd` variant.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepGrid {
    /// Percentiles of each model's calibrated entropy distribution, giving τ_draft and τ_target together.
    pub tau_percentiles: Vec<f64>,
    pub rhos: Vec<f32>,
    pub top_ns: Vec<u32>,
}

impl Default for SweepGrid {
    /// p80 / p90 / p95 (the range DESIGN §2.2 measured: ~20% / ~7% / ~3% token cost) × ρ 0.6, 0.8 × N 5.
    fn default() -> Self {
        SweepGrid { tau_percentiles: vec![80.0, 90.0, 95.0], rhos: vec![0.6, 0.8], top_ns: vec![5] }
    }
}

/// The parameters of one sweep variant.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepPoint {
    pub label: String,
    pub tau_percentile: f64,
    pub tau_draft: f32,
    pub tau_target: f32,
    pub rho: f32,
    pub top_n: u32,
}

/// A sweep: the evaluation settings (its `variants` are replaced), the grid and the baseline modes.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepConfig {
    pub eval: EvalConfig,
    pub grid: SweepGrid,
    /// Plain modes run next to the grid; the first is the plot's dashed baseline. Default: `sd`.
    pub baselines: Vec<Mode>,
    /// Allow the slice to include lines at or after [`HELD_OUT_FROM`].
    pub allow_held_out: bool,
}

impl SweepConfig {
    /// Development slice (the first 200 lines of [`DEVELOPMENT_LINES`]), default grid, `sd` baseline.
    pub fn new(mut eval: EvalConfig) -> SweepConfig {
        eval.offset = DEVELOPMENT_LINES.start;
        eval.limit = Some(200);
        SweepConfig { eval, grid: SweepGrid::default(), baselines: vec![Mode::Sd], allow_held_out: false }
    }
}

/// The grid's variants, τ from the calibration file at each percentile; other EASD fields from `base`.
pub fn sweep_points(
    grid: &SweepGrid,
    calibration: &CalibrationFile,
    base: &EasdSettings,
) -> Result<Vec<(Variant, SweepPoint)>> {
    if grid.tau_percentiles.is_empty() || grid.rhos.is_empty() || grid.top_ns.is_empty() {
        return Err(Error::invalid("grid", "every axis needs at least one value"));
    }
    let mut out = Vec::new();
    for &p in &grid.tau_percentiles {
        let (tau_draft, tau_target) = calibration
            .taus_at(p)
            .ok_or_else(|| Error::invalid("tau_percentiles", format!("{p} is outside [0, 100]")))?;
        for &rho in &grid.rhos {
            for &top_n in &grid.top_ns {
                let label = format!("easd-p{p}-rho{rho}-n{top_n}");
                let easd = EasdSettings {
                    top_n: Some(top_n),
                    rho: Some(rho),
                    tau_draft: Some(tau_draft),
                    tau_target: Some(tau_target),
                    ..base.clone()
                };
                easd.validate()?;
                let variant = Variant { label: label.clone(), mode: Mode::Easd, easd };
                out.push((variant, SweepPoint { label, tau_percentile: p, tau_draft, tau_target, rho, top_n }));
            }
        }
    }
    Ok(out)
}

/// A sweep plot's x-axis: the first grid axis with more than one value, so a sweep of ρ alone (one τ percentile,
/// one N) plots accuracy against ρ rather than a single column of points at one τ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepAxis {
    TauPercentile,
    Rho,
    TopN,
}

impl SweepAxis {
    /// The axis the points vary along (τ percentile when none varies).
    pub fn of(points: &[SweepPoint]) -> SweepAxis {
        let varies = |axis: SweepAxis| points.iter().any(|p| axis.value(p) != axis.value(&points[0]));
        [SweepAxis::TauPercentile, SweepAxis::Rho, SweepAxis::TopN]
            .into_iter()
            .find(|&axis| !points.is_empty() && varies(axis))
            .unwrap_or(SweepAxis::TauPercentile)
    }

    pub fn value(self, point: &SweepPoint) -> f64 {
        match self {
            SweepAxis::TauPercentile => point.tau_percentile,
            SweepAxis::Rho => f64::from(point.rho),
            SweepAxis::TopN => f64::from(point.top_n),
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            SweepAxis::TauPercentile => "τ percentile",
            SweepAxis::Rho => "ρ (overlap threshold)",
            SweepAxis::TopN => "N (top-N overlap)",
        }
    }

    /// The plot line a point belongs to: its values on the two other axes.
    fn series_name(self, point: &SweepPoint) -> String {
        match self {
            SweepAxis::TauPercentile => format!("ρ = {}, N = {}", point.rho, point.top_n),
            SweepAxis::Rho => format!("τ p{}, N = {}", point.tau_percentile, point.top_n),
            SweepAxis::TopN => format!("τ p{}, ρ = {}", point.tau_percentile, point.rho),
        }
    }
}

/// A finished sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepRun {
    pub run: EvalRun,
    pub points: Vec<SweepPoint>,
    /// Labels of the baseline variants.
    pub baselines: Vec<String>,
}

/// Runs the baselines and every grid point on the configured slice (resumable like [`crate::run_eval`]).
pub async fn run_sweep<G: Generator>(
    config: &SweepConfig,
    calibration: &CalibrationFile,
    generator: &G,
    progress: &dyn Progress,
) -> Result<SweepRun> {
    let end = config.eval.limit.map_or(usize::MAX, |l| config.eval.offset.saturating_add(l));
    if !config.allow_held_out && end > HELD_OUT_FROM {
        return Err(Error::invalid(
            "slice",
            format!(
                "lines {}..{} reach the held-out lines ({HELD_OUT_FROM}..); sweep on the development slice {}..{} \
                 or allow it explicitly",
                config.eval.offset,
                if end == usize::MAX { "end".to_string() } else { end.to_string() },
                DEVELOPMENT_LINES.start,
                DEVELOPMENT_LINES.end
            ),
        ));
    }
    let base = config.eval.variants.iter().find(|v| v.mode == Mode::Easd).map(|v| v.easd.clone()).unwrap_or_default();
    let grid = sweep_points(&config.grid, calibration, &base)?;
    let mut eval = config.eval.clone();
    eval.variants = config.baselines.iter().map(|&m| Variant::of_mode(m, &base)).collect();
    let baselines = eval.variants.iter().map(|v| v.label.clone()).collect();
    eval.variants.extend(grid.iter().map(|(v, _)| v.clone()));
    let problems = slice(load_problems(&eval.dataset)?, eval.offset, eval.limit);
    crate::run::require_references(&problems)?;
    let run = run_problems(&eval, &problems, generator, progress).await?;
    Ok(SweepRun { run, points: grid.into_iter().map(|(_, p)| p).collect(), baselines })
}

/// Writes the sweep report into `dir`: the standard tables for every variant, a sweep table, `accuracy.svg` and
/// `sweep.svg` (accuracy and trigger rate vs the swept axis — see [`SweepAxis`] — one line per setting of the other
/// axes, the first baseline dashed).
pub fn write_sweep_report(dir: &Path, sweep: &SweepRun, mut context: ReportContext) -> Result<ReportFiles> {
    std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
    let report = summarize(&sweep.run.records);
    let stats = |label: &str| report.variants.iter().find(|v| v.label == label);
    let baseline = sweep.baselines.first().and_then(|b| stats(b));
    let mut series: Vec<SweepSeries> = Vec::new();
    let axis = SweepAxis::of(&sweep.points);
    let mut table = String::from(
        "## Sweep\n\n| variant | τ percentile | τ_draft | τ_target | ρ | N | accuracy | 95% CI | trigger rate | tokens/s (session) | p vs baseline |\n|---|---:|---:|---:|---:|---:|---:|---|---:|---|---:|\n",
    );
    for point in &sweep.points {
        let Some(v) = stats(&point.label) else { continue };
        let p_vs_base = baseline
            .and_then(|b| {
                report.pairs.iter().find(|p| (p.a == b.label && p.b == v.label) || (p.b == b.label && p.a == v.label))
            })
            .map_or("–".to_string(), |p| format!("{:.4}", p.p_value));
        let _ = writeln!(
            table,
            "| {} | {} | {:.3} | {:.3} | {} | {} | {:.1}% | [{:.1}%, {:.1}%] | {} | {} | {} |",
            v.label,
            point.tau_percentile,
            point.tau_draft,
            point.tau_target,
            point.rho,
            point.top_n,
            100.0 * v.accuracy,
            100.0 * v.interval.low,
            100.0 * v.interval.high,
            v.trigger_rate.map_or("–".into(), |r| format!("{:.2}%", 100.0 * r)),
            speeds_cell(&report.speeds, &v.label),
            p_vs_base
        );
        let name = axis.series_name(point);
        let entry = SweepPlotPoint {
            x: axis.value(point),
            accuracy: v.accuracy,
            interval: v.interval,
            trigger_rate: v.trigger_rate.unwrap_or(0.0),
        };
        match series.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push(entry),
            None => series.push(SweepSeries { name, points: vec![entry] }),
        }
    }
    table.push_str(
        "\nThe sweep picks defaults on development problems only; with this many variants, treat the best point as a \
         hypothesis to confirm on held-out problems, not a result (see the Holm-adjusted p-values above). Speeds are \
         labelled with their session (see the speed section): compare them only within one session.",
    );
    let accuracy = dir.join("accuracy.svg");
    accuracy_plot(&accuracy, &report)?;
    let sweep_svg = dir.join("sweep.svg");
    sweep_plot(&sweep_svg, axis.description(), &series, baseline.map(|b| (b.label.as_str(), b.accuracy)))?;
    context.plots.push(("Accuracy per variant with 95% Wilson intervals".into(), "accuracy.svg".into()));
    context.plots.push((
        format!(
            "Accuracy (dashed: baseline) and EASD trigger rate vs {}, one line per other setting",
            axis.description()
        ),
        "sweep.svg".into(),
    ));
    context.notes.insert(0, table);
    let files = write_text_files(dir, &report, &context)?;
    Ok(ReportFiles { plots: vec![accuracy, sweep_svg], ..files })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::{CalibrationConfig, PairedEntropy};
    use crate::error::BoxError;
    use crate::generator::{EvalRequest, Generation, GenerationSummary};
    use crate::progress::NoProgress;

    fn calibration() -> CalibrationFile {
        let samples: Vec<PairedEntropy> = (0..101)
            .map(|i| PairedEntropy {
                draft: i as f32 / 100.0,
                target: i as f32 / 200.0,
                draft_top_n: vec![1, 2, 3, 4, 5],
                target_top_n: vec![1, 2, 3, 8, 9],
            })
            .collect();
        CalibrationFile::from_samples(&CalibrationConfig::new("c.jsonl"), "d", "t", 5, &samples).unwrap()
    }

    /// Right on every problem, except EASD with ρ ≥ 0.8 on even problems; reports one trigger per EASD request.
    struct Fake;

    impl crate::generator::Generator for Fake {
        async fn generate(&self, request: &EvalRequest) -> Result<Generation, BoxError> {
            let problem = request.sampling.seed;
            let wrong =
                request.mode == Mode::Easd && request.easd.rho.unwrap_or(0.0) >= 0.8 && problem.is_multiple_of(2);
            let easd = request.mode == Mode::Easd;
            Ok(Generation {
                text: format!("The answer is {}.", if wrong { 0 } else { 7 }),
                token_ids: Vec::new(),
                summary: GenerationSummary {
                    generated_tokens: 10,
                    wall_s: 0.5,
                    easd_triggers: u32::from(easd),
                    ..GenerationSummary::default()
                },
            })
        }
    }

    /// A default sweep config over `problems` copies of a "#### 7" problem in a temporary folder.
    fn sweep_config(problems: usize) -> (tempfile::TempDir, SweepConfig) {
        let dir = tempfile::tempdir().unwrap();
        let dataset = dir.path().join("dev.jsonl");
        std::fs::write(&dataset, "{\"question\": \"q\", \"answer\": \"#### 7\"}\n".repeat(problems)).unwrap();
        let config = SweepConfig::new(EvalConfig::new(&dataset, dir.path().join("sweep.jsonl")));
        (dir, config)
    }

    #[test]
    fn grid_points_take_their_thresholds_from_the_calibration() {
        let points = sweep_points(&SweepGrid::default(), &calibration(), &EasdSettings::default()).unwrap();
        assert_eq!(points.len(), 6);
        let (variant, point) = &points[2];
        assert_eq!(point.label, "easd-p90-rho0.6-n5");
        assert_eq!(variant.mode, Mode::Easd);
        assert!((point.tau_draft - 0.9).abs() < 1e-6 && (point.tau_target - 0.45).abs() < 1e-6);
        assert_eq!(variant.easd.tau_draft, Some(point.tau_draft));
        let empty = SweepGrid { rhos: vec![], ..SweepGrid::default() };
        assert!(sweep_points(&empty, &calibration(), &EasdSettings::default()).is_err());
        let bad = SweepGrid { tau_percentiles: vec![120.0], ..SweepGrid::default() };
        assert!(sweep_points(&bad, &calibration(), &EasdSettings::default()).is_err());
    }

    #[test]
    fn the_plot_axis_is_the_first_axis_that_varies() {
        let points = |grid: SweepGrid| -> Vec<SweepPoint> {
            sweep_points(&grid, &calibration(), &EasdSettings::default()).unwrap().into_iter().map(|(_, p)| p).collect()
        };
        let rho_only = SweepGrid { tau_percentiles: vec![80.0], rhos: vec![0.4, 0.6, 0.8], top_ns: vec![5] };
        let axis = SweepAxis::of(&points(rho_only.clone()));
        assert_eq!(axis, SweepAxis::Rho);
        assert_eq!(
            points(rho_only).iter().map(|p| axis.value(p)).collect::<Vec<_>>(),
            [0.4f32, 0.6, 0.8].map(f64::from)
        );
        let n_only = SweepGrid { tau_percentiles: vec![80.0], rhos: vec![0.6], top_ns: vec![3, 5, 10] };
        assert_eq!(SweepAxis::of(&points(n_only)), SweepAxis::TopN);
        assert_eq!(SweepAxis::of(&points(SweepGrid::default())), SweepAxis::TauPercentile);
        let single = SweepGrid { tau_percentiles: vec![90.0], rhos: vec![0.6], top_ns: vec![5] };
        assert_eq!(SweepAxis::of(&points(single)), SweepAxis::TauPercentile);
    }

    #[tokio::test]
    async fn a_rho_sweep_plots_accuracy_against_rho() {
        let (dir, mut config) = sweep_config(2);
        (config.eval.offset, config.eval.limit) = (0, Some(2));
        config.grid = SweepGrid { tau_percentiles: vec![80.0], rhos: vec![0.4, 0.8], top_ns: vec![5] };
        let sweep = run_sweep(&config, &calibration(), &Fake, &NoProgress).await.unwrap();
        let files = write_sweep_report(&dir.path().join("report"), &sweep, ReportContext::default()).unwrap();
        let svg = std::fs::read_to_string(dir.path().join("report/sweep.svg")).unwrap();
        assert!(svg.contains("Accuracy vs ρ (overlap threshold)") && svg.contains("τ p80, N = 5"), "{svg}");
        let md = std::fs::read_to_string(&files.markdown).unwrap();
        assert!(md.contains("trigger rate vs ρ (overlap threshold)"), "{md}");
    }

    #[tokio::test]
    async fn a_sweep_runs_the_grid_with_its_baseline_and_writes_a_report() {
        let (dir, mut config) = sweep_config(4);
        assert_eq!((config.eval.offset, config.eval.limit), (2000, Some(200)));
        config.eval.offset = 0;
        config.eval.limit = None;
        let err = run_sweep(&config, &calibration(), &Fake, &NoProgress).await.unwrap_err();
        assert!(err.to_string().contains("held-out"), "{err}");
        config.eval.limit = Some(4);
        let sweep = run_sweep(&config, &calibration(), &Fake, &NoProgress).await.unwrap();
        assert_eq!(sweep.baselines, ["sd"]);
        assert_eq!(sweep.run.records.len(), 4 * 7);
        let files = write_sweep_report(&dir.path().join("report"), &sweep, ReportContext::default()).unwrap();
        let md = std::fs::read_to_string(&files.markdown).unwrap();
        assert!(md.contains("| easd-p90-rho0.6-n5 | 90 | 0.900 | 0.450 | 0.6 | 5 | 100.0% |"), "{md}");
        assert!(md.contains("| easd-p90-rho0.8-n5 | 90 | 0.900 | 0.450 | 0.8 | 5 | 50.0% |"), "{md}");
        // Speeds carry their session: 10 tokens in 0.5 s, all in this run's session.
        assert!(md.contains("| 20.00 (S1) |") && md.contains("compare them only within one session"), "{md}");
        let svg = std::fs::read_to_string(dir.path().join("report/sweep.svg")).unwrap();
        assert!(svg.contains("ρ = 0.8, N = 5") && svg.contains("sd (baseline)"));
        assert!(svg.contains("EASD trigger rate vs τ percentile"), "no trigger-rate panel");
    }
}
