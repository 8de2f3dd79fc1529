//! Paired comparisons of two variants on the same problems: exact McNemar, the accuracy difference with its 95%
//! interval, a reading in words, pre-registered comparisons with their own Holm family, and the `sd` ≡ `target`
//! token-identity check.
//!
//! Readings are at [`ALPHA`]: a difference whose 95% interval includes 0 — effects both ways — is "not shown to
//! differ", never "no difference" or "does not beat".

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::results::ResultRecord;
use crate::stats::{Interval, Z_95, holm_adjust, mcnemar_exact, paired_difference_interval};

/// Significance level of the report's readings (the pre-registered α).
pub const ALPHA: f64 = 0.05;

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
    /// Accuracy of `a` minus accuracy of `b` on these problems.
    pub difference: f64,
    /// 95% interval of `difference` (Newcombe's hybrid score method for paired proportions).
    pub difference_interval: Interval,
    /// Exact two-sided McNemar.
    pub p_value: f64,
    /// Holm-adjusted over every pair in the report (over the planned family alone in [`PlannedTest`]).
    pub p_holm: f64,
}

impl PairTest {
    /// The result in words at [`ALPHA`]. "not shown to differ" when the 95% interval of A − B includes 0 (it holds
    /// effects both ways); a direction only when the interval excludes 0, with significance taken from the
    /// Holm-adjusted exact McNemar p.
    pub fn reading(&self) -> String {
        let i = self.difference_interval;
        if i.low <= 0.0 && i.high >= 0.0 {
            return "not shown to differ (the 95% CI includes effects both ways)".into();
        }
        let higher = if i.low > 0.0 { &self.a } else { &self.b };
        if self.p_holm < ALPHA {
            format!("{higher} higher (p (Holm) < {ALPHA})")
        } else {
            format!("the 95% CI favours {higher}, but not significant after Holm")
        }
    }

    /// The same test with `a` and `b` swapped.
    fn swapped(&self) -> PairTest {
        PairTest {
            a: self.b.clone(),
            b: self.a.clone(),
            a_correct: self.b_correct,
            b_correct: self.a_correct,
            only_a: self.only_b,
            only_b: self.only_a,
            difference: -self.difference,
            difference_interval: Interval { low: -self.difference_interval.high, high: -self.difference_interval.low },
            ..self.clone()
        }
    }
}

/// A comparison named before the data (e.g. docs/STUDY-PROTOCOL.md), in the order given: primary first.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlannedTest {
    /// "primary", "secondary", "tertiary", then "planned N".
    pub role: String,
    pub a: String,
    pub b: String,
    /// Oriented as (a, b), `p_holm` over the planned family alone (a missing test counts as p = 1); `None` while
    /// either variant has no results.
    pub test: Option<PairTest>,
}

/// Whether an `sd` variant emitted the same token ids as a `target` variant, problem by problem.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IdentityCheck {
    /// The `target` and the `sd` variant.
    pub target: String,
    pub sd: String,
    /// Problems both have, with token ids recorded for both.
    pub problems: usize,
    pub identical: usize,
    /// Problems whose ids differ (at most the first 20).
    pub differing: Vec<usize>,
    /// Problems both have where either line has no token ids (results from before ids were recorded).
    pub without_ids: usize,
}

/// The pre-registered comparisons `(a, b)` among `pairs`, primary first: each test oriented as named, Holm-adjusted
/// over this family alone. A comparison whose variant has no results yet stays in the list without a test.
pub(crate) fn plan(pairs: &[PairTest], planned: &[(String, String)]) -> Vec<PlannedTest> {
    let found: Vec<Option<PairTest>> = planned
        .iter()
        .map(|(a, b)| {
            pairs.iter().find_map(|p| {
                if (&p.a, &p.b) == (a, b) {
                    Some(p.clone())
                } else if (&p.a, &p.b) == (b, a) {
                    Some(p.swapped())
                } else {
                    None
                }
            })
        })
        .collect();
    let adjusted = holm_adjust(&found.iter().map(|t| t.as_ref().map_or(1.0, |t| t.p_value)).collect::<Vec<_>>());
    const ROLES: [&str; 3] = ["primary", "secondary", "tertiary"];
    planned
        .iter()
        .zip(found)
        .zip(adjusted)
        .enumerate()
        .map(|(i, (((a, b), test), p_holm))| PlannedTest {
            role: ROLES.get(i).map_or_else(|| format!("planned {}", i + 1), |r| r.to_string()),
            a: a.clone(),
            b: b.clone(),
            test: test.map(|t| PairTest { p_holm, ..t }),
        })
        .collect()
}

/// The paired test of variant `a` against `b`: `(label, records)` each, on the problems both have.
pub(crate) fn pair_test(a: (&str, &[&ResultRecord]), b: (&str, &[&ResultRecord])) -> PairTest {
    let b_outcomes: BTreeMap<usize, bool> = b.1.iter().map(|r| (r.problem, r.correct)).collect();
    let (mut both, mut neither, mut only_a, mut only_b) = (0, 0, 0, 0);
    for r in a.1 {
        let Some(&cb) = b_outcomes.get(&r.problem) else { continue };
        match (r.correct, cb) {
            (true, true) => both += 1,
            (false, false) => neither += 1,
            (true, false) => only_a += 1,
            (false, true) => only_b += 1,
        }
    }
    let problems = both + neither + only_a + only_b;
    PairTest {
        a: a.0.to_string(),
        b: b.0.to_string(),
        problems,
        a_correct: both + only_a,
        b_correct: both + only_b,
        only_a,
        only_b,
        difference: if problems == 0 { 0.0 } else { (only_a as f64 - only_b as f64) / problems as f64 },
        difference_interval: paired_difference_interval(
            both as u64,
            only_a as u64,
            only_b as u64,
            neither as u64,
            Z_95,
        ),
        p_value: mcnemar_exact(only_a as u64, only_b as u64),
        p_holm: 1.0,
    }
}

/// Token identity of an `sd` variant with a `target` variant: `(label, records)` each.
pub(crate) fn identity_check(target: (&str, &[&ResultRecord]), sd: (&str, &[&ResultRecord])) -> IdentityCheck {
    let sd_ids: BTreeMap<usize, &str> = sd.1.iter().map(|r| (r.problem, r.token_ids_sha256.as_str())).collect();
    let mut check = IdentityCheck {
        target: target.0.to_string(),
        sd: sd.0.to_string(),
        problems: 0,
        identical: 0,
        differing: Vec::new(),
        without_ids: 0,
    };
    let mut target_lines: Vec<&ResultRecord> = target.1.to_vec();
    target_lines.sort_by_key(|r| r.problem);
    for r in target_lines {
        let Some(&other) = sd_ids.get(&r.problem) else { continue };
        if r.token_ids_sha256.is_empty() || other.is_empty() {
            check.without_ids += 1;
            continue;
        }
        check.problems += 1;
        if r.token_ids_sha256 == other {
            check.identical += 1;
        } else if check.differing.len() < 20 {
            check.differing.push(r.problem);
        }
    }
    check
}

pub(crate) fn pair_row(md: &mut String, role: Option<&str>, p: &PairTest) {
    let role = role.map_or_else(String::new, |r| format!("{r} | "));
    let _ = writeln!(
        md,
        "| {role}{} | {} | {} | {} | {} | {} | {} | {:+.1} | [{:+.1}, {:+.1}] | {} | {} | {} |",
        p.a,
        p.b,
        p.problems,
        p.a_correct,
        p.b_correct,
        p.only_a,
        p.only_b,
        100.0 * p.difference,
        100.0 * p.difference_interval.low,
        100.0 * p.difference_interval.high,
        fmt_p(p.p_value),
        fmt_p(p.p_holm),
        p.reading()
    );
}

pub(crate) fn render_planned(md: &mut String, planned: &[PlannedTest]) {
    md.push_str("\n## Pre-registered comparisons\n\n");
    let _ = writeln!(
        md,
        "Fixed before the data: exact two-sided McNemar, Holm over these {} comparisons alone, α {ALPHA}. A − B in \
         points with its 95% CI (Newcombe, paired).\n",
        planned.len()
    );
    md.push_str(
        "| test | A | B | problems | A correct | B correct | only A | only B | A − B | 95% CI | p (exact) | p (Holm) | reading |\n",
    );
    md.push_str("|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|\n");
    for t in planned {
        match &t.test {
            Some(p) => pair_row(md, Some(&t.role), p),
            None => {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | – | – | – | – | – | – | – | – | – | not run yet: no results for both |",
                    t.role, t.a, t.b
                );
            }
        }
    }
}

pub(crate) fn render_identity(md: &mut String, checks: &[IdentityCheck]) {
    md.push_str("\n## Token identity: `sd` vs `target`\n\n");
    md.push_str(
        "Greedy `sd` is lossless and the CPU runtime is batch-invariant, so greedy `sd` must emit exactly greedy \
         `target`'s token ids on every problem: the check that the runtime is exact at scale. (Sampled runs share a \
         distribution, not tokens.)\n\n",
    );
    md.push_str("| target | sd | problems with ids | identical | differing (first 20) | without ids |\n");
    md.push_str("|---|---|---:|---:|---|---:|\n");
    for c in checks {
        let differing = if c.differing.is_empty() {
            "–".to_string()
        } else {
            c.differing.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {differing} | {} |",
            c.target, c.sd, c.problems, c.identical, c.without_ids
        );
    }
}

fn fmt_p(p: f64) -> String {
    if p < 1e-4 { format!("{p:.2e}") } else { format!("{p:.4}") }
}
