//! Report generation from a checked-in results file: 30 problems × {draft, target, sd, easd} with known outcomes
//! (draft right on multiples of 5, target and sd on even problems, easd on even problems but 0 plus 1, 3, 5, 7, 9)
//! and known Summary numbers, so every figure in the report can be computed by hand.

use std::path::Path;

use easd_eval::{
    CalibrationConfig, CalibrationFile, PairedEntropy, ReportContext, read_results, summarize, write_report,
};

fn fixture() -> Vec<easd_eval::ResultRecord> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/results.jsonl");
    read_results(&path).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn the_summary_matches_hand_computed_figures() {
    let records = fixture();
    assert_eq!(records.len(), 120);
    let report = summarize(&records);
    let labels: Vec<&str> = report.variants.iter().map(|v| v.label.as_str()).collect();
    assert_eq!(labels, ["draft", "target", "sd", "easd"]);
    let [draft, target, sd, easd] = &report.variants[..] else { unreachable!() };
    assert_eq!((draft.correct, target.correct, sd.correct, easd.correct), (6, 15, 15, 19));
    assert_eq!((draft.no_answer, target.truncated), (1, 1));
    // One session: one speed row per variant.
    assert_eq!(report.sessions.len(), 1);
    let speed = |label: &str| report.speeds.iter().find(|s| s.variant == label).unwrap();
    assert!(close(speed("target").tokens_per_s, 50.0) && close(speed("sd").tokens_per_s, 100.0));
    assert!(close(speed("easd").tokens_per_s, 80.0) && close(speed("easd").vs_target.unwrap(), 1.6));
    assert!(close(sd.acceptance_rate.unwrap(), 0.8) && close(sd.mean_accepted_len.unwrap(), 3.2));
    assert!(close(sd.tokens_per_target_forward.unwrap(), 4.0));
    assert_eq!(target.acceptance_rate, None);
    assert_eq!((easd.easd_triggers, easd.problems_with_trigger), (60, 30));
    assert!(close(easd.trigger_rate.unwrap(), 0.02));
    assert!(close(easd.draft_tokens_per_problem, 70.0) && close(easd.target_tokens_per_problem, 30.0));
    assert!(close(easd.discarded_tokens_per_problem, 30.0));
    // Wilson 19/30 (statsmodels proportion_confint, method="wilson"): [0.455136, 0.781261]
    assert!((easd.interval.low - 0.455_136).abs() < 1e-5 && (easd.interval.high - 0.781_261).abs() < 1e-5);

    let pair = |a: &str, b: &str| report.pairs.iter().find(|p| p.a == a && p.b == b).unwrap();
    let p = pair("sd", "easd");
    assert_eq!((p.problems, p.only_a, p.only_b), (30, 1, 5));
    assert!(close(p.p_value, 0.218_75)); // 2 * (1 + 6) / 64
    // (1 − 5) / 30, Newcombe's interval by hand (Wilson 15/30 and 19/30, φ = 0.5534): [−0.28394, 0.03071].
    assert!(close(p.difference, -4.0 / 30.0));
    assert!(
        (p.difference_interval.low + 0.283_936).abs() < 1e-5 && (p.difference_interval.high - 0.030_708).abs() < 1e-5
    );
    assert!(p.reading().starts_with("not shown to differ"));
    let p = pair("draft", "target");
    assert_eq!((p.only_a, p.only_b), (3, 12));
    assert!(close(p.p_value, 0.035_156_25)); // 2 * (1 + 15 + 105 + 455) / 2^15
    assert!(close(pair("target", "sd").p_value, 1.0));
    assert_eq!(report.pairs.len(), 6);
    assert!(report.pairs.iter().all(|p| p.p_holm >= p.p_value));
}

#[test]
fn the_report_folder_has_markdown_json_and_svg_plots() {
    let dir = tempfile::tempdir().unwrap();
    let samples: Vec<PairedEntropy> = (0..500)
        .map(|i| PairedEntropy {
            draft: (i % 50) as f32 / 25.0,
            target: (i % 40) as f32 / 25.0,
            draft_top_n: vec![1, 2, 3, 4, 5],
            target_top_n: vec![1, 2, 3, 8, 9],
        })
        .collect();
    let config = CalibrationConfig::new("train.jsonl");
    let calibration = CalibrationFile::from_samples(&config, "draft", "target", 20, &samples).unwrap();
    let context = ReportContext {
        title: "GSM8K fixture".into(),
        setup: vec!["dataset: fixture, 30 problems".into()],
        ..ReportContext::default()
    };
    let files = write_report(dir.path(), &fixture(), context, Some(&calibration)).unwrap();
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    for needle in [
        "# GSM8K fixture",
        "| easd | 30 | 19 | 63.3% | [45.5%, 78.1%] | 0 | 0 |",
        "| sd | easd | 30 | 15 | 19 | 1 | 5 | -13.3 | [-28.4, +3.1] | 0.2188 |",
        "| easd | S1 | 30 | 80.00 | 80.00 | 1.60× |",
        "| S1 | `2026-11-20T09:00:00Z-p1` | 1 | 120 |",
        "not comparable",
        "| target | sd | 0 | 0 | – | 30 |",
        "| easd | 70.0% | 2.50 | 3.57 | 60 | 2.0% | 30 | 70.0 | 30.0 | 30.0 | 0 |",
        "![Accuracy per variant",
        "entropy.svg",
        "**Entropy plot.**",
    ] {
        assert!(md.contains(needle), "missing {needle:?} in\n{md}");
    }
    // The note under the entropy plot describes the calibration the "all positions" curve came from.
    assert!(md.contains(&calibration.method), "the entropy note does not name {:?}", calibration.method);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&files.json).unwrap()).unwrap();
    assert_eq!(json["variants"][3]["correct"], 19);
    assert_eq!(files.plots.len(), 2);
    for plot in &files.plots {
        let svg = std::fs::read_to_string(plot).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{}", plot.display());
    }
    let accuracy = std::fs::read_to_string(dir.path().join("accuracy.svg")).unwrap();
    assert!(accuracy.contains("\neasd\n") && accuracy.contains("\ndraft\n"));
    let entropy = std::fs::read_to_string(dir.path().join("entropy.svg")).unwrap();
    assert!(entropy.contains("EASD-triggered (n = 60)") && entropy.contains("all positions (n = 500)"));
}

#[test]
fn without_triggers_or_calibration_there_is_no_entropy_plot() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<_> = fixture().into_iter().filter(|r| r.variant != "easd").collect();
    let files = write_report(dir.path(), &records, ReportContext::default(), None).unwrap();
    assert_eq!(files.plots.len(), 1);
    assert!(!dir.path().join("entropy.svg").exists());
}
