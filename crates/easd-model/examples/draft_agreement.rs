//! Where the draft agrees with the target's greedy answer: for each question, the target's greedy continuation and,
//! at every generated position, whether the draft's argmax given the correct prefix is that token, with the draft's
//! entropy there. Greedy `sd` accepts exactly these positions whatever its blocks are, so this one pass is the input
//! of an offline model of block policies (timings aside).
//!
//! `cargo run --release -p easd-model --example draft_agreement -- DRAFT TARGET MAX_NEW QUESTION...` prints one JSON
//! object per question: `{"question", "tokens", "agree": [0|1…], "draft_entropy": […]}`.

use easd_model::{ChatMessage, LoadOptions, Model, ModelSources, greedy_generate, resolve_model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [draft, target, max_new, questions @ ..] = args.as_slice() else {
        return Err("usage: DRAFT TARGET MAX_NEW QUESTION...".into());
    };
    let sources = ModelSources::from_env(None);
    let draft = Model::load(&resolve_model(draft, &sources, false)?, &LoadOptions::default())?;
    let target = Model::load(&resolve_model(target, &sources, false)?, &LoadOptions::default())?;
    for question in questions {
        let text = target.tokenizer().apply_chat_template(&[ChatMessage::new("user", question.clone())])?;
        let prompt = target.tokenizer().encode(&text)?;
        let answer = greedy_generate(&target, &prompt, max_new.parse()?)?;
        // The draft's logits at the last prompt position and after each answer token but the last.
        let mut context = prompt.clone();
        context.extend_from_slice(&answer[..answer.len() - 1]);
        let mut cache = draft.new_cache();
        let logits = draft.forward_last(&mut cache, &context, 0, answer.len())?;
        let mut agree = Vec::with_capacity(answer.len());
        let mut entropy = Vec::with_capacity(answer.len());
        for (i, &token) in answer.iter().enumerate() {
            agree.push(u8::from(logits.argmax(i) == token));
            entropy.push(softmax_entropy(logits.row(i)));
        }
        let line = serde_json::json!({
            "question": question, "tokens": answer.len(), "agree": agree, "draft_entropy": entropy,
        });
        println!("{line}");
    }
    Ok(())
}

/// Entropy in nats of the softmax of `logits`.
fn softmax_entropy(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits
        .iter()
        .map(|&l| {
            let p = (l as f64 - max).exp() / z;
            if p > 0.0 { -p * p.ln() } else { 0.0 }
        })
        .sum()
}
