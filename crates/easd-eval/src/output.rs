//! Writing a report folder: Markdown, JSON and SVG plots.

use std::path::{Path, PathBuf};

use crate::calibrate::CalibrationFile;
use crate::error::{Error, Result};
use crate::generator::Mode;
use crate::plots::{EntropyPanel, accuracy_plot, entropy_plot};
use crate::report::{Report, ReportContext, render_markdown, summarize};
use crate::results::ResultRecord;
use crate::stats::Histogram;

/// Bins of the triggered-entropy histograms; the same grid as the calibration file's, so densities compare.
const BIN_WIDTH: f32 = 0.05;
const BINS: usize = 240;
/// Plots merge 5 stored bins (0.25 nats per bar).
const PLOT_REBIN: usize = 5;

/// The files a report consists of.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportFiles {
    pub markdown: PathBuf,
    pub json: PathBuf,
    pub plots: Vec<PathBuf>,
}

/// Writes `report.md`, `report.json`, `accuracy.svg` and (when there are EASD triggers or a calibration file)
/// `entropy.svg` into `dir`.
///
/// The entropy plot compares, per model, the entropies at positions where EASD triggered (the `triggers` of every
/// `easd` record's Summary) with the distribution over all positions. The coordinator reports entropies only at
/// triggers, so "all positions" comes from the calibration file's histogram (teacher-forced on reference solutions
/// or the target's greedy answers, mostly non-triggered positions); without a calibration file only the triggered
/// curve is drawn.
pub fn write_report(
    dir: &Path,
    records: &[ResultRecord],
    mut context: ReportContext,
    calibration: Option<&CalibrationFile>,
) -> Result<ReportFiles> {
    std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
    let mut report = summarize(records);
    report.plan(&context.planned);
    let mut plots = Vec::new();
    let accuracy = dir.join("accuracy.svg");
    accuracy_plot(&accuracy, &report)?;
    context.plots.push(("Accuracy per variant with 95% Wilson intervals".into(), "accuracy.svg".into()));
    plots.push(accuracy);
    if let Some(panels) = entropy_panels(records, calibration) {
        let path = dir.join("entropy.svg");
        entropy_plot(&path, &panels)?;
        context
            .plots
            .push(("Entropy at EASD-triggered positions vs all positions (calibration)".into(), "entropy.svg".into()));
        context.notes.push(entropy_note(calibration));
        plots.push(path);
    }
    let files = write_text_files(dir, &report, &context)?;
    Ok(ReportFiles { plots, ..files })
}

/// The note under the entropy plot; the "all positions" curve is described by the calibration file's own method.
fn entropy_note(calibration: Option<&CalibrationFile>) -> String {
    let all_positions = match calibration {
        Some(file) => format!(
            " All positions: the calibration file's per-token entropy histogram ({}, temperature {}). The two come from \
             different token sequences; the comparison shows where in the entropy distribution the rule acts, not a \
             matched pair.",
            file.method, file.temperature
        ),
        None => " No calibration file was given, so only the triggered positions are drawn.".into(),
    };
    format!(
        "**Entropy plot.** Triggered positions: the draft and target entropies the coordinator reported for every EASD \
         trigger in this run.{all_positions}"
    )
}

/// Writes `report.md` and `report.json` for an already summarised report.
pub(crate) fn write_text_files(dir: &Path, report: &Report, context: &ReportContext) -> Result<ReportFiles> {
    let markdown = dir.join("report.md");
    std::fs::write(&markdown, render_markdown(report, context)).map_err(Error::io(&markdown))?;
    let json = dir.join("report.json");
    let text = serde_json::to_string_pretty(report).map_err(|source| Error::Json { path: json.clone(), source })?;
    std::fs::write(&json, text + "\n").map_err(Error::io(&json))?;
    Ok(ReportFiles { markdown, json, plots: Vec::new() })
}

/// Draft and target panels, or `None` when there is nothing to show.
fn entropy_panels(records: &[ResultRecord], calibration: Option<&CalibrationFile>) -> Option<Vec<EntropyPanel>> {
    let mut draft = Histogram::new(BIN_WIDTH, BINS);
    let mut target = Histogram::new(BIN_WIDTH, BINS);
    let easd: Vec<&ResultRecord> = records.iter().filter(|r| r.mode == Mode::Easd).collect();
    for r in &easd {
        for t in &r.summary.triggers {
            draft.push(t.draft_entropy);
            target.push(t.target_entropy);
        }
    }
    if draft.total() == 0 && calibration.is_none() {
        return None;
    }
    // The thresholds in force: the run's own when every EASD record sent the same, else the calibration's
    // recommendation (the coordinator's default when it loaded that file).
    let unique = |f: fn(&crate::generator::EasdSettings) -> Option<f32>| {
        let mut values = easd.iter().map(|r| r.easd.as_ref().and_then(f));
        let first = values.next().flatten()?;
        values.all(|v| v == Some(first)).then_some(first)
    };
    let taus = (
        unique(|e| e.tau_draft).or(calibration.map(|c| c.recommended.tau_draft)),
        unique(|e| e.tau_target).or(calibration.map(|c| c.recommended.tau_target)),
    );
    let all = |f: fn(&CalibrationFile) -> &Histogram| {
        calibration
            .map(|c| f(c).clone())
            .filter(|h| h.bin_width == BIN_WIDTH)
            .unwrap_or_else(|| Histogram::new(BIN_WIDTH, BINS))
    };
    Some(vec![
        EntropyPanel {
            title: "draft H(q̂)".into(),
            all_positions: all(|c| &c.draft.histogram).rebin(PLOT_REBIN),
            triggered: draft.rebin(PLOT_REBIN),
            tau: taus.0,
        },
        EntropyPanel {
            title: "target H(p̂)".into(),
            all_positions: all(|c| &c.target.histogram).rebin(PLOT_REBIN),
            triggered: target.rebin(PLOT_REBIN),
            tau: taus.1,
        },
    ])
}
