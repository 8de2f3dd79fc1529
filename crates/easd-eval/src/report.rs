//! From scored results to the numbers the paper's reviewers asked for, and a Markdown report.
//!
//! Definitions (all aggregated over a variant's problems, never averaged over per-request ratios unless said):
//! * accuracy with a 95% Wilson interval; paired exact McNemar on the problems both variants answered, with a
//!   Holm adjustment over all pairs, and the paired difference A − B with its 95% interval (Newcombe);
//! * pre-registered comparisons ([`Report::plan`]): the same tests, Holm-adjusted over the planned family alone;
//! * speed per session only (see [`crate::speed`]): sessions are never pooled;
//! * acceptance rate = Σ accepted / Σ drafted; mean accepted length = Σ accepted / Σ blocks; tokens per target call
//!   = Σ generated / Σ target forwards;
//! * EASD trigger rate = Σ triggers / Σ generated tokens (one trigger emits one token and ends its block);
//! * draft / target / discarded tokens per problem: output tokens from accepted proposals, output tokens emitted by
//!   the target (residual, EASD resample, bonus), and drafted tokens thrown away;
//! * token identity of every `sd` variant with every `target` variant: problems whose generated token ids are equal
//!   (greedy `sd` must equal greedy `target` on the batch-invariant CPU runtime).
//!
//! Readings in words are at [`ALPHA`]: a difference whose 95% interval includes 0 — effects both ways — is "not shown
//! to differ", never "no difference" or "does not beat".

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::generator::Mode;
use crate::paired::{
    ALPHA, IdentityCheck, PairTest, PlannedTest, identity_check, pair_row, pair_test, render_identity, render_planned,
};
use crate::results::ResultRecord;
use crate::speed::{SessionInfo, SessionSpeed, render_speed, session_speeds};
use crate::stats::{Interval, Z_95, holm_adjust, wilson_interval};

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

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub variants: Vec<VariantStats>,
    pub pairs: Vec<PairTest>,
    /// Empty unless [`Report::plan`] was called.
    pub planned: Vec<PlannedTest>,
    pub sessions: Vec<SessionInfo>,
    /// One row per (variant, session): speeds are never pooled across sessions.
    pub speeds: Vec<SessionSpeed>,
    pub identity: Vec<IdentityCheck>,
}

impl Report {
    /// Sets the pre-registered comparisons `(a, b)`, primary first: each test oriented as named, Holm-adjusted over
    /// this family alone. A comparison whose variant has no results yet stays in the list without a test.
    pub fn plan(&mut self, planned: &[(String, String)]) {
        self.planned = crate::paired::plan(&self.pairs, planned);
    }
}

/// Groups records by (variant label, settings hash) — a label under several hashes becomes `label@hash` — and computes
/// every statistic. Variants are ordered by mode (draft, target, sd, easd), then label. No planned comparisons (see
/// [`Report::plan`]).
pub fn summarize(records: &[ResultRecord]) -> Report {
    let mut groups: BTreeMap<(String, String), Vec<&ResultRecord>> = BTreeMap::new();
    for r in records {
        groups.entry((r.variant.clone(), r.settings.clone())).or_default().push(r);
    }
    let mut hashes_per_label: BTreeMap<&str, usize> = BTreeMap::new();
    for (label, _) in groups.keys() {
        *hashes_per_label.entry(label).or_default() += 1;
    }
    let mut variants: Vec<(VariantStats, Vec<&ResultRecord>)> = groups
        .iter()
        .map(|((label, hash), rs)| {
            let name = if hashes_per_label[label.as_str()] > 1 { format!("{label}@{hash}") } else { label.clone() };
            (variant_stats(name, hash, rs), rs.clone())
        })
        .collect();
    variants.sort_by(|a, b| (a.0.mode, &a.0.label).cmp(&(b.0.mode, &b.0.label)));
    let mut pairs = Vec::new();
    let mut identity = Vec::new();
    for i in 0..variants.len() {
        for j in i + 1..variants.len() {
            let (a, b) = (
                (variants[i].0.label.as_str(), &variants[i].1[..]),
                (variants[j].0.label.as_str(), &variants[j].1[..]),
            );
            pairs.push(pair_test(a, b));
            match (variants[i].0.mode, variants[j].0.mode) {
                (Mode::Target, Mode::Sd) => identity.push(identity_check(a, b)),
                (Mode::Sd, Mode::Target) => identity.push(identity_check(b, a)),
                _ => {}
            }
        }
    }
    let adjusted = holm_adjust(&pairs.iter().map(|p| p.p_value).collect::<Vec<_>>());
    for (pair, p) in pairs.iter_mut().zip(adjusted) {
        pair.p_holm = p;
    }
    let groups: Vec<(String, Mode, Vec<&ResultRecord>)> =
        variants.iter().map(|(v, rs)| (v.label.clone(), v.mode, rs.clone())).collect();
    let (sessions, speeds) = session_speeds(records, &groups);
    Report {
        variants: variants.into_iter().map(|(v, _)| v).collect(),
        pairs,
        planned: Vec::new(),
        sessions,
        speeds,
        identity,
    }
}

fn variant_stats(label: String, settings: &str, rs: &[&ResultRecord]) -> VariantStats {
    let n = rs.len();
    let sum = |f: &dyn Fn(&ResultRecord) -> f64| rs.iter().map(|r| f(r)).sum::<f64>();
    let ratio = |num: f64, den: f64| (den > 0.0).then(|| num / den);
    let correct = rs.iter().filter(|r| r.correct).count();
    let generated = sum(&|r| r.summary.generated_tokens as f64);
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

/// Free text around the tables: a title, setup lines (dataset, slice, sampling, models…), plots to embed, and the
/// pre-registered comparisons.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReportContext {
    pub title: String,
    pub setup: Vec<String>,
    /// (caption, path relative to the report).
    pub plots: Vec<(String, String)>,
    /// Paragraphs appended at the end (e.g. how the entropy plot was made).
    pub notes: Vec<String>,
    /// Comparisons (A, B) fixed before the data, primary first: [`crate::write_report`] reports them with Holm over
    /// this family alone (see [`Report::plan`]).
    pub planned: Vec<(String, String)>,
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
    if !report.planned.is_empty() {
        render_planned(&mut md, &report.planned);
    }
    md.push_str("\n## Paired significance (exact McNemar), every pair\n\n");
    let _ = writeln!(
        md,
        "`only A` / `only B`: problems exactly one of the two got right. A − B: accuracy difference on the problems both \
         answered, in points, with its 95% CI (Newcombe, paired). Holm: adjusted over all pairs. Reading at α {ALPHA}: \
         \"not shown to differ\" where the CI includes effects both ways.\n"
    );
    md.push_str(
        "| A | B | problems | A correct | B correct | only A | only B | A − B | 95% CI | p (exact) | p (Holm) | reading |\n",
    );
    md.push_str("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|\n");
    for p in &report.pairs {
        pair_row(&mut md, None, p);
    }
    render_speed(&mut md, &report.sessions, &report.speeds);
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
    if !report.identity.is_empty() {
        render_identity(&mut md, &report.identity);
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
            predicted: Some(if correct { 1.0 } else { 2.0 }),
            correct,
            target_tokens: 10,
            client_wall_s: 2.0,
            summary: GenerationSummary { generated_tokens: 10, wall_s, ..GenerationSummary::default() },
            token_ids_sha256: format!("ids-{problem}"),
            settings: "h".into(),
            ..ResultRecord::example(problem, variant)
        }
    }

    /// `only_a` problems only A gets right, `only_b` only B, `both` both: A and B labelled as given.
    fn paired(a: &str, b: &str, both: usize, only_a: usize, only_b: usize, neither: usize) -> Vec<ResultRecord> {
        let mut out = Vec::new();
        let mut problem = 0;
        for (count, ra, rb) in
            [(both, true, true), (only_a, true, false), (only_b, false, true), (neither, false, false)]
        {
            for _ in 0..count {
                out.push(record(problem, a, ra, 1.0));
                out.push(record(problem, b, rb, 1.0));
                problem += 1;
            }
        }
        out
    }

    #[test]
    fn missing_server_wall_time_falls_back_to_the_harness_timing() {
        let report = summarize(&[record(0, "target", true, 0.0), record(1, "target", true, 0.5)]);
        // (10 + 10) tokens / (2.0 + 0.5) s
        assert!((report.speeds[0].tokens_per_s - 8.0).abs() < 1e-12);
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
        assert_eq!((pair.p_value, pair.difference), (1.0, 0.0));
    }

    #[test]
    fn one_label_under_two_settings_becomes_two_variants() {
        let mut other = record(0, "sd", true, 1.0);
        other.settings = "g".into();
        let report = summarize(&[record(0, "sd", true, 1.0), other]);
        let labels: Vec<&str> = report.variants.iter().map(|v| v.label.as_str()).collect();
        assert_eq!(labels, ["sd@g", "sd@h"]);
    }

    #[test]
    fn a_difference_whose_interval_includes_zero_is_not_shown_to_differ() {
        // 40 problems, 6 vs 2 discordant (the held-out check): p = 0.29, CI includes 0.
        let report = summarize(&paired("easd", "sd", 22, 6, 2, 10));
        let p = &report.pairs[0];
        assert_eq!((p.a.as_str(), p.only_a, p.only_b), ("sd", 2, 6));
        assert!((p.difference + 0.1).abs() < 1e-12);
        assert!(p.difference_interval.low < 0.0 && p.difference_interval.high > 0.0, "{p:?}");
        assert!(p.reading().starts_with("not shown to differ"), "{}", p.reading());
        // 30 vs 0 discordant: a direction, significant.
        let report = summarize(&paired("easd", "sd", 50, 30, 0, 20));
        let p = &report.pairs[0];
        assert!(p.difference_interval.high < 0.0 && p.p_holm < ALPHA, "{p:?}");
        assert_eq!(p.reading(), format!("easd higher (p (Holm) < {ALPHA})"));
    }

    #[test]
    fn planned_comparisons_are_oriented_as_named_and_holm_adjusted_among_themselves() {
        let mut records = paired("easd", "target", 50, 30, 10, 10);
        records.extend(paired("easd", "sd", 50, 30, 10, 10).into_iter().filter(|r| r.variant == "sd"));
        let mut report = summarize(&records);
        assert_eq!(report.pairs.len(), 3);
        let planned = [("easd".to_string(), "target".to_string()), ("easd".to_string(), "sd".to_string())];
        report.plan(&planned);
        let roles: Vec<&str> = report.planned.iter().map(|t| t.role.as_str()).collect();
        assert_eq!(roles, ["primary", "secondary"]);
        let primary = report.planned[0].test.as_ref().unwrap();
        assert_eq!(
            (primary.a.as_str(), primary.b.as_str(), primary.only_a, primary.only_b),
            ("easd", "target", 30, 10)
        );
        assert!((primary.difference - 0.2).abs() < 1e-12 && primary.difference_interval.low > 0.0);
        // Holm over two equal p-values: both doubled (over three pairs they would be tripled for the smallest).
        assert!((primary.p_holm - (2.0 * primary.p_value).min(1.0)).abs() < 1e-15, "{primary:?}");
        let md = render_markdown(&report, &ReportContext { planned: planned.to_vec(), ..ReportContext::default() });
        assert!(
            md.contains("## Pre-registered comparisons") && md.contains("| primary | easd | target | 100 |"),
            "{md}"
        );

        // Before the sd run: the secondary test is listed without a result and counts as p = 1 in the Holm family.
        let only_target: Vec<ResultRecord> = records.iter().filter(|r| r.variant != "sd").cloned().collect();
        let mut report = summarize(&only_target);
        report.plan(&planned);
        assert!(report.planned[1].test.is_none());
        let primary = report.planned[0].test.as_ref().unwrap();
        assert!((primary.p_holm - (2.0 * primary.p_value).min(1.0)).abs() < 1e-15);
        assert!(render_markdown(&report, &ReportContext::default()).contains("not run yet"));
    }

    #[test]
    fn token_identity_compares_every_sd_variant_with_every_target_variant() {
        let mut records = paired("target", "sd", 3, 0, 0, 0);
        records[3].token_ids_sha256 = "other".into(); // sd on problem 1
        records.push(record(3, "target", true, 1.0));
        let mut no_ids = record(3, "sd", true, 1.0);
        no_ids.token_ids_sha256.clear();
        records.push(no_ids);
        let report = summarize(&records);
        assert_eq!(report.identity.len(), 1);
        let c = &report.identity[0];
        assert_eq!(
            (c.target.as_str(), c.sd.as_str(), c.problems, c.identical, c.differing.clone(), c.without_ids),
            ("target", "sd", 3, 2, vec![1], 1)
        );
        let md = render_markdown(&report, &ReportContext::default());
        assert!(md.contains("| target | sd | 3 | 2 | 1 | 1 |"), "{md}");
        assert!(summarize(&paired("easd", "sd", 3, 0, 0, 0)).identity.is_empty());
    }
}
