//! `easd ask` refuses an invalid request with the coordinator's own message before any model loads.

use std::path::Path;
use std::process::{Command, Output};

use easd_model::{TinySpec, write_tiny_gguf};

fn easd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_easd")).args(args).env_remove("EASD_THREADS").output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn negative_numbers_get_the_range_message_before_any_model_is_resolved() {
    let missing = "/nonexistent/model.gguf";
    let local = ["--draft-model", missing, "--target-model", missing];
    for flags in [&["--temperature", "-1"][..], &["--temperature=-1"][..]] {
        let out = easd(&[&["ask"][..], flags, &local[..], &["What is 2+2?"][..]].concat());
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(err.contains("error: invalid temperature: must be in [0, 2], got -1"), "{flags:?}: {err}");
        assert!(!err.contains("resolving"), "validated before the models are looked at: {err}");
    }
    let out = easd(&[&["ask", "--rho", "-0.5"][..], &local[..], &["hi"][..]].concat());
    assert!(stderr(&out).contains("error: invalid easd.rho:"), "{}", stderr(&out));
    // An unsigned flag given a negative number: clap's value error, not "unexpected argument".
    let out = easd(&["ask", "-k", "-1", "hi"]);
    let err = stderr(&out);
    assert!(err.contains("invalid value '-1'") && !err.contains("unexpected argument"), "{err}");
}

fn tiny_pair(dir: &Path) -> (String, String) {
    let (draft, target) = (dir.join("draft.gguf"), dir.join("target.gguf"));
    write_tiny_gguf(&draft, &TinySpec { perturbation: Some((8, 0.3)), ..TinySpec::qwen2(7) }).unwrap();
    write_tiny_gguf(&target, &TinySpec::qwen2(7)).unwrap();
    (draft.display().to_string(), target.display().to_string())
}

#[test]
fn a_prompt_too_long_for_the_context_is_refused_before_the_models_load() {
    let dir = tempfile::tempdir().unwrap();
    let (draft, target) = tiny_pair(dir.path());
    let local = ["--draft-model", draft.as_str(), "--target-model", target.as_str(), "--threads", "1"];
    let long: String = (0..400).map(|i| format!("{i} ")).collect();

    let out = easd(&[&["ask", "--max-tokens", "16"][..], &local[..], &[long.as_str()][..]].concat());
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("error: context length exceeded: the prompt has "), "{err}");
    assert!(err.contains("max_tokens is 16, more than the context length of 512 tokens"), "{err}");
    assert!(!err.contains("loading"), "refused before any weights load: {err}");

    let out = easd(&[&["ask", "--max-tokens", "512"][..], &local[..], &["hi"][..]].concat());
    assert!(stderr(&out).contains("error: invalid max_tokens: must be less than the context length 512"));

    // A valid request goes through the same checks and is answered.
    let out = easd(&[&["ask", "--max-tokens", "4", "--json"][..], &local[..], &["hi"][..]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(answer["generated_tokens"].as_u64().is_some_and(|n| (1..=4).contains(&n)), "{answer}");
}

/// The study's pipeline on the tiny pair: two modes run in separate invocations (two sessions) into one folder, then
/// `--report-only` writes the combined report — pre-registered comparison, per-session speeds, and greedy sd ≡ target
/// token identity over real gRPC.
#[test]
fn modes_run_one_at_a_time_are_reported_together_with_the_planned_test_and_token_identity() {
    let dir = tempfile::tempdir().unwrap();
    let (draft, target) = tiny_pair(dir.path());
    let dataset = dir.path().join("bench.jsonl");
    let lines: Vec<String> =
        (0..3).map(|i| format!("{{\"question\": \"What is {i} + 3?\", \"answer\": \"#### {}\"}}", i + 3)).collect();
    std::fs::write(&dataset, lines.join("\n") + "\n").unwrap();
    let out_dir = dir.path().join("study");
    let common = [
        "eval",
        "--dataset",
        dataset.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
        "--offset",
        "1",
        "--limit",
        "2",
        "--max-tokens",
        "6",
        "--temperature",
        "0",
        "--draft-model",
        draft.as_str(),
        "--target-model",
        target.as_str(),
        "--threads",
        "1",
    ];
    for mode in ["target", "sd"] {
        let out = easd(&[&common[..], &["--modes", mode]].concat());
        assert!(out.status.success(), "{mode}: {}", stderr(&out));
    }
    // A comparison of a mode that is not run is refused before anything loads.
    let out = easd(&[&common[..], &["--modes", "target,sd", "--compare", "easd:sd", "--report-only"]].concat());
    assert!(stderr(&out).contains("easd is not among --modes"), "{}", stderr(&out));

    let out = easd(&[&common[..], &["--modes", "target,sd", "--compare", "sd:target", "--report-only"]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("loading"), "report-only loads no model: {}", stderr(&out));
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    for needle in [
        "report only: 4 lines present, 0 not yet run",
        "## Pre-registered comparisons",
        "| primary | sd | target | 2 |",
        "| S1 | `",
        "| S2 | `",
        "| target | sd | 2 | 2 | – | 0 |",
    ] {
        assert!(md.contains(needle), "missing {needle:?} in\n{md}");
    }
    // Two sessions, one mode each: sd's speed is never divided by the other session's target speed.
    let sd_row = md.lines().find(|l| l.starts_with("| sd | S2 | 2 |")).expect("an sd row for session S2");
    assert_eq!(sd_row.split('|').nth(6).map(str::trim), Some("–"), "{sd_row}");
}
