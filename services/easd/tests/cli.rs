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
