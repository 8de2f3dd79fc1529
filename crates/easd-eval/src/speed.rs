//! Wall-clock speed, per session.
//!
//! A session is one `easd eval` / `easd sweep` invocation ([`ResultRecord::session`]). Machine load, concurrency and
//! what else ran differ between sessions (the same build ran the target at ~6 tok/s in one session and ~10–11 in the
//! next), so a speed is only ever computed over one session's lines and compared with rows of the same session: two
//! variants run in different sessions get two rows, never one pooled figure or a ratio across sessions. Lines written
//! before sessions were recorded carry no id; they are grouped under `?` and compared with nothing.
//!
//! Definitions: tokens/s = Σ generated tokens / Σ server wall seconds (wall clock, not forward time; the harness's own
//! timing where the server sent none); the per-request median too; "vs target" = tokens/s over the tokens/s of a
//! `target` variant in the same session.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::generator::Mode;
use crate::results::ResultRecord;
use crate::stats::percentile_sorted;

/// The tag of lines without a session id.
pub const UNRECORDED_SESSION: &str = "?";

/// One session that contributed lines to a report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SessionInfo {
    /// "S1", "S2"… in order of first appearance in the results; [`UNRECORDED_SESSION`] for lines without an id.
    pub tag: String,
    /// The recorded id (UTC start time and process), empty when not recorded.
    pub id: String,
    /// Requests in flight at once (0: not recorded).
    pub concurrency: u32,
    pub lines: usize,
}

/// The speed of one variant within one session.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SessionSpeed {
    pub variant: String,
    pub mode: Mode,
    /// [`SessionInfo::tag`].
    pub session: String,
    pub problems: usize,
    pub generated_tokens: u64,
    pub mean_generated_tokens: f64,
    pub wall_s: f64,
    pub tokens_per_s: f64,
    pub median_tokens_per_s: f64,
    pub mean_time_to_first_token_s: f64,
    pub draft_forward_s: f64,
    pub target_forward_s: f64,
    pub overhead_s: f64,
    /// `tokens_per_s` over the first `target` variant's in the same recorded session; `None` without one.
    pub vs_target: Option<f64>,
}

/// Sessions (tagged in order of first appearance in `records`) and per-(variant, session) speeds of `groups` —
/// (variant name, mode, its records), in report order.
pub(crate) fn session_speeds(
    records: &[ResultRecord],
    groups: &[(String, Mode, Vec<&ResultRecord>)],
) -> (Vec<SessionInfo>, Vec<SessionSpeed>) {
    let mut sessions: Vec<SessionInfo> = Vec::new();
    let mut unrecorded = SessionInfo { tag: UNRECORDED_SESSION.into(), id: String::new(), concurrency: 0, lines: 0 };
    let mut tag_of: BTreeMap<&str, String> = BTreeMap::new();
    for r in records {
        if r.session.is_empty() {
            unrecorded.lines += 1;
            continue;
        }
        match tag_of.get(r.session.as_str()) {
            Some(tag) => {
                if let Some(s) = sessions.iter_mut().find(|s| &s.tag == tag) {
                    s.lines += 1;
                }
            }
            None => {
                let tag = format!("S{}", sessions.len() + 1);
                tag_of.insert(&r.session, tag.clone());
                sessions.push(SessionInfo { tag, id: r.session.clone(), concurrency: r.concurrency, lines: 1 });
            }
        }
    }
    if unrecorded.lines > 0 {
        sessions.push(unrecorded);
    }
    let tag = |r: &ResultRecord| tag_of.get(r.session.as_str()).cloned().unwrap_or_else(|| UNRECORDED_SESSION.into());
    let mut speeds = Vec::new();
    for (variant, mode, rs) in groups {
        for session in &sessions {
            let mine: Vec<&ResultRecord> = rs.iter().copied().filter(|r| tag(r) == session.tag).collect();
            if !mine.is_empty() {
                speeds.push(speed(variant, *mode, &session.tag, &mine));
            }
        }
    }
    let target_speed =
        |session: &str| speeds.iter().find(|s| s.mode == Mode::Target && s.session == session).map(|s| s.tokens_per_s);
    let ratios: Vec<Option<f64>> = speeds
        .iter()
        .map(|s| match target_speed(&s.session) {
            Some(t) if t > 0.0 && s.session != UNRECORDED_SESSION => Some(s.tokens_per_s / t),
            _ => None,
        })
        .collect();
    for (s, ratio) in speeds.iter_mut().zip(ratios) {
        s.vs_target = ratio;
    }
    (sessions, speeds)
}

fn speed(variant: &str, mode: Mode, session: &str, rs: &[&ResultRecord]) -> SessionSpeed {
    let n = rs.len();
    let sum = |f: &dyn Fn(&ResultRecord) -> f64| rs.iter().map(|r| f(r)).sum::<f64>();
    let generated = sum(&|r| f64::from(r.summary.generated_tokens));
    let wall = sum(&wall_s);
    let mut per_request: Vec<f64> =
        rs.iter().filter(|r| wall_s(r) > 0.0).map(|r| f64::from(r.summary.generated_tokens) / wall_s(r)).collect();
    per_request.sort_by(f64::total_cmp);
    SessionSpeed {
        variant: variant.to_string(),
        mode,
        session: session.to_string(),
        problems: n,
        generated_tokens: generated as u64,
        mean_generated_tokens: generated / n.max(1) as f64,
        wall_s: wall,
        tokens_per_s: if wall > 0.0 { generated / wall } else { 0.0 },
        median_tokens_per_s: percentile_sorted(&per_request, 50.0).unwrap_or(0.0),
        mean_time_to_first_token_s: sum(&|r| r.summary.time_to_first_token_s) / n.max(1) as f64,
        draft_forward_s: sum(&|r| r.summary.draft_forward_s),
        target_forward_s: sum(&|r| r.summary.target_forward_s),
        overhead_s: sum(&|r| r.summary.overhead_s),
        vs_target: None,
    }
}

/// The coordinator's wall time of a request, or the harness's own measurement when the server sent none.
fn wall_s(r: &ResultRecord) -> f64 {
    if r.summary.wall_s > 0.0 { r.summary.wall_s } else { r.client_wall_s }
}

/// A table cell with every session's tokens/s of `variant`, each labelled: "8.98 (S1)", "4.62 (S1), 5.10 (S2)".
pub(crate) fn speeds_cell(speeds: &[SessionSpeed], variant: &str) -> String {
    let cells: Vec<String> = speeds
        .iter()
        .filter(|s| s.variant == variant)
        .map(|s| format!("{:.2} ({})", s.tokens_per_s, s.session))
        .collect();
    if cells.is_empty() { "–".into() } else { cells.join(", ") }
}

/// The Markdown speed section: the sessions, then one row per (variant, session).
pub(crate) fn render_speed(md: &mut String, sessions: &[SessionInfo], speeds: &[SessionSpeed]) {
    md.push_str("\n## Speed (wall clock, per session)\n\n");
    md.push_str(
        "Each row is one variant within one session (one `easd eval` / `easd sweep` run). Sessions ran under different \
         machine load and concurrency, so **speeds of different sessions are not comparable** and are never pooled; \
         \"vs target\" divides by `target`'s speed in the same session.\n\n",
    );
    md.push_str("| session | id | concurrency | lines |\n|---|---|---:|---:|\n");
    for s in sessions {
        let id = if s.id.is_empty() { "not recorded".to_string() } else { format!("`{}`", s.id) };
        let concurrency = if s.concurrency == 0 { "–".to_string() } else { s.concurrency.to_string() };
        let _ = writeln!(md, "| {} | {id} | {concurrency} | {} |", s.tag, s.lines);
    }
    if sessions.iter().any(|s| s.tag == UNRECORDED_SESSION) {
        md.push_str(
            "\nLines under `?` were written before sessions were recorded: they may come from several sessions, so \
             their speeds are not comparable with each other or with any other row, and get no \"vs target\".\n",
        );
    }
    md.push_str("\n| variant | session | problems | tokens/s | median tokens/s per request | vs target (same session) | mean tokens | mean TTFT s | time in draft / target forwards / other |\n");
    md.push_str("|---|---|---:|---:|---:|---:|---:|---:|---|\n");
    for s in speeds {
        let total = s.draft_forward_s + s.target_forward_s + s.overhead_s;
        let shares = if total > 0.0 {
            format!(
                "{:.0}% / {:.0}% / {:.0}%",
                100.0 * s.draft_forward_s / total,
                100.0 * s.target_forward_s / total,
                100.0 * s.overhead_s / total
            )
        } else {
            "–".into()
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.2} | {} | {:.1} | {:.3} | {shares} |",
            s.variant,
            s.session,
            s.problems,
            s.tokens_per_s,
            s.median_tokens_per_s,
            s.vs_target.map_or_else(|| "–".into(), |r| format!("{r:.2}×")),
            s.mean_generated_tokens,
            s.mean_time_to_first_token_s,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::GenerationSummary;

    fn line(problem: usize, variant: &str, mode: Mode, session: &str, tokens: u32, wall_s: f64) -> ResultRecord {
        ResultRecord {
            mode,
            target_tokens: tokens,
            client_wall_s: wall_s,
            summary: GenerationSummary { generated_tokens: tokens, wall_s, ..GenerationSummary::default() },
            session: session.into(),
            concurrency: if session.is_empty() { 0 } else { 4 },
            ..ResultRecord::example(problem, variant)
        }
    }

    /// The sweep report's old failure: sd from a slow session beside easd from a fast one, as if comparable.
    #[test]
    fn speeds_of_different_sessions_are_never_pooled_or_divided() {
        let records = [
            line(0, "target", Mode::Target, "a", 10, 2.0),
            line(0, "sd", Mode::Sd, "a", 10, 1.0),
            line(1, "target", Mode::Target, "b", 10, 1.0),
            line(1, "sd", Mode::Sd, "b", 30, 1.0),
            line(2, "easd", Mode::Easd, "b", 20, 1.0),
        ];
        let groups = vec![
            ("target".to_string(), Mode::Target, vec![&records[0], &records[2]]),
            ("sd".to_string(), Mode::Sd, vec![&records[1], &records[3]]),
            ("easd".to_string(), Mode::Easd, vec![&records[4]]),
        ];
        let (sessions, speeds) = session_speeds(&records, &groups);
        let tags: Vec<(&str, &str, usize)> =
            sessions.iter().map(|s| (s.tag.as_str(), s.id.as_str(), s.lines)).collect();
        assert_eq!(tags, [("S1", "a", 2), ("S2", "b", 3)]);
        let rows: Vec<(&str, &str, f64, Option<f64>)> =
            speeds.iter().map(|s| (s.variant.as_str(), s.session.as_str(), s.tokens_per_s, s.vs_target)).collect();
        assert_eq!(
            rows,
            [
                ("target", "S1", 5.0, Some(1.0)),
                ("target", "S2", 10.0, Some(1.0)),
                ("sd", "S1", 10.0, Some(2.0)),
                ("sd", "S2", 30.0, Some(3.0)),
                ("easd", "S2", 20.0, Some(2.0)),
            ]
        );
        assert_eq!(speeds_cell(&speeds, "sd"), "10.00 (S1), 30.00 (S2)");
        let mut md = String::new();
        render_speed(&mut md, &sessions, &speeds);
        assert!(md.contains("not comparable"), "{md}");
        assert!(md.contains("| S2 | `b` | 4 | 3 |"), "{md}");
        assert!(md.contains("| sd | S2 | 1 | 30.00 | 30.00 | 3.00× |"), "{md}");
    }

    #[test]
    fn lines_without_a_session_are_grouped_apart_and_compared_with_nothing() {
        let records = [
            line(0, "target", Mode::Target, "", 10, 1.0),
            line(0, "sd", Mode::Sd, "", 10, 1.0),
            line(1, "sd", Mode::Sd, "s", 20, 1.0),
        ];
        let groups = vec![
            ("target".to_string(), Mode::Target, vec![&records[0]]),
            ("sd".to_string(), Mode::Sd, vec![&records[1], &records[2]]),
        ];
        let (sessions, speeds) = session_speeds(&records, &groups);
        assert_eq!(sessions.iter().map(|s| s.tag.as_str()).collect::<Vec<_>>(), ["S1", "?"]);
        assert!(speeds.iter().all(|s| s.vs_target.is_none()), "{speeds:?}");
        let mut md = String::new();
        render_speed(&mut md, &sessions, &speeds);
        assert!(md.contains("| ? | not recorded | – | 2 |") && md.contains("before sessions were recorded"), "{md}");
    }
}
