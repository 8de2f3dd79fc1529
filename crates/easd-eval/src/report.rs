//! From scored results to the numbers the paper's reviewers asked for, and a Markdown report.
//!
//! Definitions (all aggregated over a variant's problems, never averaged over per-request ratios unless said):
//! * accuracy with a 95% Wilson interval; paired exact McNemar on the problems both variants answered, with a
//!   Holm adjustment over all pairs;
//! * tokens/s = Σ generated tokens / Σ server wall seconds (wall clock, not forward time; the harness's own timing
//!   where the server sent none); the per-request median too;
//! * acceptance rate = Σ accepted / Σ drafted; mean accepted length = Σ accepted / Σ blocks; tokens per target call
//!   = Σ generated / Σ target forwards;
//! * EASD trigger rate = Σ triggers / Σ generated tokens (one trigger emits one token and ends its block);
//! * draft / target / discarded tokens per problem: output tokens from accepted proposals, output tokens emitted by
//!   the target (residual, EASD resample, bonus), and drafted tokens thrown away.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::generator::Mode;
use crate::results::ResultRecord;
use crate::stats::{Interval, Z_95, holm_adjust, mcnemar_exact, wilson_interval};

/// Aggregates of one variant.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VariantStats {
    pub label: String,
    pub mode: Mode,
    pub settings: String,
    pub problems: usize,
    pub correct: usize,
    pub accuracy: f64,
    pub interval: Interval,
    /// Outputs with no number in them.
    pub no_answer: usize,
    /// Outputs cut by `max_tokens` or the context window.
    pub truncated: usize,
    pub generated_tokens: u64,
    pub mean_generated_tokens: f64,
    pub wall_s: f64,
    pub tokens_per_s: f64,
    pub median_tokens_per_s: f64,
    pub mean_time_to_first_token_s: f64,
    pub draft_forward_s: f64,
    pub target_forward_s: f64,
    pub overhead_s: f64,
    pub acceptance_rate: Option<f64>,
    pub mean_accepted_len: Option<f64>,
    pub tokens_per_target_forward: Option<f64>,
    pub easd_triggers: u64,
    pub trigger_rate: Option<f64>,
    pub problems_with_trigger: usize,
    pub draft_tokens_per_problem: f64,
    pub target_tokens_per_problem: f64,
    pub discarded_tokens_per_problem: f64,
    pub failovers: u64,
}

/// Paired comparison of two variants on the problems both have.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PairTest {
    pub a: String,
    pub b: String,
    pub problems: usize,
    pub a_correct: usize,
    pub b_correct: usize,
    /// Problems only `a` got right (McNemar's b) and only `b` got right (c).
    pub only_a: usize,
    pub only_b: usize,
    pub p_value: f64,
    /// Holm-adjusted over every pair in the report.
    pub p_holm: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub variants: Vec<VariantStats>,
    pub pairs: Vec<PairTest>,
}

/// Groups records by (variant label, settings hash) — a label under several hashes becomes `label@hash` — and computes
/// every statistic. Variants are ordered by mode (draft, target, sd, easd), then label.
pub fn summarize(records: &[ResultRecord]) -> Report {
    let mut groups: BTreeMap<(String, String), Vec<&ResultRecord>> = BTreeMap::new();
    for r in records {
        groups.entry((r.variant.clone(), r.settings.clone())).or_default().push(r);
    }
    let mut hashes_per_label: BTreeMap<&str, usize> = BTreeMap::new();
    for (label, _) in groups.keys() {
        *hashes_per_label.entry(label).or_default() += 1;
    }
    let mut variants: Vec<(VariantStats, BTreeMap<usize, bool>)> = groups
        .iter()
        .map(|((label, hash), rs)| {
            let name = if hashes_per_label[label.as_str()] > 1 { format!("{label}@{hash}") } else { label.clone() };
            let outcomes = rs.iter().map(|r| (r.problem, r.correct)).collect();
            (variant_stats(name, hash, rs), outcomes)
        })
        .collect();
    variants.sort_by(|a, b| (a.0.mode, &a.0.label).cmp(&(b.0.mode, &b.0.label)));
    let mut pairs = Vec::new();
    for i in 0..variants.len() {
        for j in i + 1..variants.len() {
            pairs.push(pair_test(&variants[i], &variants[j]));
        }
    }
    let adjusted = holm_adjust(&pairs.iter().map(|p| p.p_value).collect::<Vec<_>>());
    for (pair, p) in pairs.iter_mut().zip(adjusted) {
        pair.p_holm = p;
    }
    Report { variants: variants.into_iter().map(|(v, _)| v).collect(), pairs }
}

fn variant_stats(label: String, settings: &str, rs: &[&ResultRecord]) -> VariantStats {
    let n = rs.len();
    let sum = |f: &dyn Fn(&ResultRecord) -> f64| rs.iter().map(|r| f(r)).sum::<f64>();
    let ratio = |num: f64, den: f64| (den > 0.0).then(|| num / den);
    let correct = rs.iter().filter(|r| r.correct).count();
    let generated = sum(&|r| r.summary.generated_tokens as f64);
    let wall = sum(&wall_s);
    let mut per_request: Vec<f64> =
        rs.iter().filter(|r| wall_s(r) > 0.0).map(|r| r.summary.generated_tokens as f64 / wall_s(r)).collect();
    per_request.sort_by(f64::total_cmp);
    let speculative = matches!(rs.first().map(|r| r.mode), Some(Mode::Sd | Mode::Easd));
    let per_problem = |total: f64| if n == 0 { 0.0 } else { total / n as f64 };
    VariantStats {
        label,
        mode: rs.first().map_or(Mode::Sd, |r| r.mode),
        settings: settings.to_string(),
        problems: n,
        correct,
        accuracy: per_problem(correct as f64),
        interval: wilson_interval(correct as u64, n as u64, Z_95),
        no_answer: rs.iter().filter(|r| r.predicted.is_none()).count(),
        truncated: rs.iter().filter(|r| matches!(r.summary.finish_reason.as_str(), "length" | "context")).count(),
        generated_tokens: generated as u64,
        mean_generated_tokens: per_problem(generated),
        wall_s: wall,
        tokens_per_s: ratio(generated, wall).unwrap_or(0.0),
        median_tokens_per_s: median(&per_request),
        mean_time_to_first_token_s: per_problem(sum(&|r| r.summary.time_to_first_token_s)),
        draft_forward_s: sum(&|r| r.summary.draft_forward_s),
        target_forward_s: sum(&|r| r.summary.target_forward_s),
        overhead_s: sum(&|r| r.summary.overhead_s),
        acceptance_rate: speculative
            .then(|| ratio(sum(&|r| r.summary.accepted_tokens as f64), sum(&|r| r.summary.drafted_tokens as f64)))
            .flatten(),
        mean_accepted_len: speculative
            .then(|| ratio(sum(&|r| r.summary.accepted_tokens as f64), sum(&|r| r.summary.blocks as f64)))
            .flatten(),
        tokens_per_target_forward: ratio(generated, sum(&|r| r.summary.target_forwards as f64)),
        easd_triggers: sum(&|r| r.summary.easd_triggers as f64) as u64,
        trigger_rate: ratio(sum(&|r| r.summary.easd_triggers as f64), generated),
        problems_with_trigger: rs.iter().filter(|r| r.summary.easd_triggers > 0).count(),
        draft_tokens_per_problem: per_problem(sum(&|r| r.draft_tokens as f64)),
        target_tokens_per_problem: per_problem(sum(&|r| r.target_tokens as f64)),
        discarded_tokens_per_problem: per_problem(sum(&|r| r.summary.discarded_tokens as f64)),
        failovers: sum(&|r| r.summary.failovers as f64) as u64,
    }
}

/// The coordinator's wall time of a request, or the harness's own measurement when the server sent none.
fn wall_s(r: &ResultRecord) -> f64 {
    if r.summary.wall_s > 0.0 { r.summary.wall_s } else { r.client_wall_s }
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn pair_test(a: &(VariantStats, BTreeMap<usize, bool>), b: &(VariantStats, BTreeMap<usize, bool>)) -> PairTest {
    let (mut problems, mut a_correct, mut b_correct, mut only_a, mut only_b) = (0, 0, 0, 0, 0);
    for (problem, &ca) in &a.1 {
        let Some(&cb) = b.1.get(problem) else { continue };
        problems += 1;
        a_correct += usize::from(ca);
        b_correct += usize::from(cb);
        only_a += usize::from(ca && !cb);
        only_b += usize::from(cb && !ca);
    }
    PairTest {
        a: a.0.label.clone(),
        b: b.0.label.clone(),
        problems,
        a_correct,
        b_correct,
        only_a,
        only_b,
        p_value: mcnemar_exact(only_a as u64, only_b as u64),
        p_holm: 1.0,
    }
}

/// Free text around the tables: a title, setup lines (dataset, slice, sampling, models…) and plots to embed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReportContext {
    pub title: String,
    pub setup: Vec<String>,
    /// (caption, path relative to the report).
    pub plots: Vec<(String, String)>,
    /// Paragraphs appended at the end (e.g. how the entropy plot was made).
    pub notes: Vec<String>,
}

/// Renders the report as Markdown.
pub fn render_markdown(report: &Report, context: &ReportContext) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# {}\n", context.title);
    for line in &context.setup {
        let _ = writeln!(md, "* {line}");
    }
    md.push_str(
        "\n## Accuracy\n\n| variant | problems | correct | accuracy | 95% Wilson CI | no answer | truncated |\n",
    );
    md.push_str("|---|---:|---:|---:|---|---:|---:|\n");
    for v in &report.variants {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.1}% | [{:.1}%, {:.1}%] | {} | {} |",
            v.label,
            v.problems,
            v.correct,
            100.0 * v.accuracy,
            100.0 * v.interval.low,
            100.0 * v.interval.high,
            v.no_answer,
            v.truncated
        );
    }
    md.push_str("\n## Paired significance (exact McNemar)\n\n");
    md.push_str("`only A` / `only B`: problems exactly one of the two got right. Holm: adjusted over all pairs.\n\n");
    md.push_str("| A | B | problems | A correct | B correct | only A | only B | p (exact) | p (Holm) |\n");
    md.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for p in &report.pairs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.a,
            p.b,
            p.problems,
            p.a_correct,
            p.b_correct,
            p.only_a,
            p.only_b,
            fmt_p(p.p_value),
            fmt_p(p.p_holm)
        );
    }
    let target_speed = report.variants.iter().find(|v| v.mode == Mode::Target).map(|v| v.tokens_per_s);
    md.push_str("\n## Speed (wall clock)\n\n");
    md.push_str("| variant | tokens/s | median tokens/s per request | vs target | mean tokens | mean TTFT s | time in draft / target forwards / other |\n");
    md.push_str("|---|---:|---:|---:|---:|---:|---|\n");
    for v in &report.variants {
        let vs_target = match target_speed {
            Some(t) if t > 0.0 => format!("{:.2}×", v.tokens_per_s / t),
            _ => "–".into(),
        };
        let total = v.draft_forward_s + v.target_forward_s + v.overhead_s;
        let shares = if total > 0.0 {
            format!(
                "{:.0}% / {:.0}% / {:.0}%",
                100.0 * v.draft_forward_s / total,
                100.0 * v.target_forward_s / total,
                100.0 * v.overhead_s / total
            )
        } else {
            "–".into()
        };
        let _ = writeln!(
            md,
            "| {} | {:.2} | {:.2} | {} | {:.1} | {:.3} | {} |",
            v.label,
            v.tokens_per_s,
            v.median_tokens_per_s,
            vs_target,
            v.mean_generated_tokens,
            v.mean_time_to_first_token_s,
            shares
        );
    }
    md.push_str("\n## Speculation and EASD triggers\n\n");
    md.push_str("| variant | acceptance | mean accepted / block | tokens / target call | EASD triggers | trigger rate (per token) | problems with a trigger | draft tok / problem | target tok / problem | discarded tok / problem | failovers |\n");
    md.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for v in &report.variants {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} |",
            v.label,
            opt_pct(v.acceptance_rate),
            opt(v.mean_accepted_len, 2),
            opt(v.tokens_per_target_forward, 2),
            v.easd_triggers,
            opt_pct(v.trigger_rate),
            v.problems_with_trigger,
            v.draft_tokens_per_problem,
            v.target_tokens_per_problem,
            v.discarded_tokens_per_problem,
            v.failovers
        );
    }
    if !context.plots.is_empty() {
        md.push_str("\n## Plots\n");
        for (caption, path) in &context.plots {
            let _ = writeln!(md, "\n![{caption}]({path})\n\n*{caption}*");
        }
    }
    for note in &context.notes {
        let _ = writeln!(md, "\n{note}");
    }
    md
}

fn fmt_p(p: f64) -> String {
    if p < 1e-4 { format!("{p:.2e}") } else { format!("{p:.4}") }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".into(), |x| format!("{x:.digits$}"))
}

fn opt_pct(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |x| format!("{:.1}%", 100.0 * x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::GenerationSummary;

    fn record(problem: usize, variant: &str, correct: bool, wall_s: f64) -> ResultRecord {
        ResultRecord {
            problem,
            variant: variant.into(),
            mode: if variant == "target" { Mode::Target } else { Mode::Sd },
            settings: "h".into(),
            seed: 0,
            question_hash: String::new(),
            easd: None,
            easd_defaults: None,
            expected: Some(1.0),
            predicted: Some(if correct { 1.0 } else { 2.0 }),
            predicted_text: None,
            answer_source: None,
            correct,
            draft_tokens: 0,
            target_tokens: 10,
            client_wall_s: 2.0,
            output: String::new(),
            summary: GenerationSummary { generated_tokens: 10, wall_s, ..GenerationSummary::default() },
        }
    }

    #[test]
    fn missing_server_wall_time_falls_back_to_the_harness_timing() {
        let report = summarize(&[record(0, "target", true, 0.0), record(1, "target", true, 0.5)]);
        // (10 + 10) tokens / (2.0 + 0.5) s
        assert!((report.variants[0].tokens_per_s - 8.0).abs() < 1e-12);
    }

    #[test]
    fn pairs_use_only_problems_both_variants_answered() {
        let records = [
            record(0, "target", true, 1.0),
            record(1, "target", false, 1.0),
            record(2, "target", true, 1.0),
            record(0, "sd", false, 1.0),
            record(1, "sd", true, 1.0),
        ];
        let report = summarize(&records);
        let pair = &report.pairs[0];
        assert_eq!((pair.a.as_str(), pair.b.as_str()), ("target", "sd"));
        assert_eq!((pair.problems, pair.only_a, pair.only_b), (2, 1, 1));
        assert_eq!(pair.p_value, 1.0);
    }

    #[test]
    fn one_label_under_two_settings_becomes_two_variants() {
        let mut other = record(0, "sd", true, 1.0);
        other.settings = "g".into();
        let report = summarize(&[record(0, "sd", true, 1.0), other]);
        let labels: Vec<&str> = report.variants.iter().map(|v| v.label.as_str()).collect();
        assert_eq!(labels, ["sd@g", "sd@h"]);
    }
}
