//! Checks on the real default pair; each test returns early (passes vacuously, with a note)
//! unless the files are in `$EASD_MODELS_DIR` or the user cache. `easd bench verify` runs the
//! longer version of the same check.

use easd_model::{
    ChatMessage, DefaultModel, LoadOptions, Model, Tokenizer, block_agreement, default_models_dir, greedy_generate,
};
use std::path::PathBuf;

fn real(which: DefaultModel) -> Option<PathBuf> {
    let path = default_models_dir().join(which.file_name());
    if path.is_file() {
        Some(path)
    } else {
        eprintln!("skipped: {} not present", path.display());
        None
    }
}

const QUESTION: &str = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?";

#[test]
fn draft_and_target_share_one_tokenizer() {
    let (Some(d), Some(t)) = (real(DefaultModel::Draft), real(DefaultModel::Target)) else {
        return;
    };
    let d = Tokenizer::from_gguf_file(&d).unwrap();
    let t = Tokenizer::from_gguf_file(&t).unwrap();
    assert_eq!(d.fingerprint(), t.fingerprint());
    // Qwen2.5's published ids.
    assert_eq!(t.encode("Hello world").unwrap(), [9707, 1879]);
    let names: Vec<String> = t.stop_token_ids().iter().map(|&i| t.token_text(i).unwrap()).collect();
    assert_eq!(names, ["<|endoftext|>", "<|im_end|>"]);
}

#[test]
fn target_answers_coherently_and_block_verify_matches_greedy() {
    let Some(path) = real(DefaultModel::Target) else {
        return;
    };
    let model = Model::load(&path, &LoadOptions::default()).unwrap();
    let tok = model.tokenizer();
    let prompt = tok.encode(&tok.apply_chat_template(&[ChatMessage::new("user", QUESTION)]).unwrap()).unwrap();
    let generated = greedy_generate(&model, &prompt, 40).unwrap();
    let text = tok.decode(&generated).unwrap();
    eprintln!("{text}");
    assert!(text.contains("Natalia") && text.contains("May"), "incoherent answer: {text:?}");
    let a = block_agreement(&model, &prompt, &generated, 8).unwrap();
    assert_eq!(a.positions, generated.len());
    // One-pass and sequential logits differ by up to ~0.5 (different kernels): a flip is only
    // acceptable at a near-tie.
    for (pos, gap) in &a.mismatches {
        assert!(*gap < 0.5, "argmax differs at {pos} with a clear top-1/top-2 gap {gap}");
    }
    assert!(a.mismatches.len() <= 1, "{:?}", a.mismatches);
}
