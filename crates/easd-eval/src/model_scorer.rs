//! [`EntropyScorer`] over a GGUF model run by `easd-model` (the calibration's model-driven half).

use std::path::Path;

use easd_model::{LoadOptions, Model};

use crate::calibrate::{EntropyScorer, ScoredPosition};
use crate::error::{BoxError, Error, Result};
use crate::generator::ChatMessage;

/// Tokens per forward: bounds the logits held at once (rows × vocabulary × 4 bytes: 128 × 151,936 × 4 ≈ 78 MB)
/// while keeping every forward on the batched path, which DESIGN §4 makes the reference.
const CHUNK_TOKENS: usize = 128;

/// A loaded model scored teacher-forced.
pub struct ModelScorer {
    model: Model,
}

impl ModelScorer {
    pub fn load(path: &Path, options: &LoadOptions) -> Result<ModelScorer> {
        let model = Model::load(path, options)
            .map_err(|e| Error::Scoring { question: 0, source: format!("loading {}: {e}", path.display()).into() })?;
        Ok(ModelScorer { model })
    }

    pub fn new(model: Model) -> ModelScorer {
        ModelScorer { model }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    fn prompt_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, BoxError> {
        let tokenizer = self.model.tokenizer();
        let messages: Vec<easd_model::ChatMessage> =
            messages.iter().map(|m| easd_model::ChatMessage::new(m.role.clone(), m.content.clone())).collect();
        Ok(tokenizer.encode(&tokenizer.apply_chat_template(&messages)?)?)
    }
}

impl EntropyScorer for ModelScorer {
    fn model_name(&self) -> String {
        self.model.info().name.clone()
    }

    fn score(
        &self,
        messages: &[ChatMessage],
        answer: &str,
        temperature: f32,
        top_n: usize,
    ) -> Result<Vec<ScoredPosition>, BoxError> {
        let prompt = self.prompt_ids(messages)?;
        let answer_ids = self.model.tokenizer().encode(answer)?;
        if prompt.is_empty() || answer_ids.is_empty() {
            return Ok(Vec::new());
        }
        let sequence: Vec<u32> = prompt.iter().chain(&answer_ids).copied().collect();
        // Row i of the logits predicts token i + 1: answer tokens are predicted by rows prompt-1 ..= len-2.
        let wanted = prompt.len() - 1..sequence.len() - 1;
        let mut cache = self.model.new_cache();
        let mut out = Vec::with_capacity(answer_ids.len());
        for start in (0..sequence.len() - 1).step_by(CHUNK_TOKENS) {
            let end = (start + CHUNK_TOKENS).min(sequence.len() - 1);
            let logits = self.model.forward(&mut cache, &sequence[start..end], start)?;
            for i in start.max(wanted.start)..end {
                let row = logits.row(i - start);
                out.push(ScoredPosition {
                    entropy: easd_core::entropy(row, temperature),
                    top_n: easd_core::top_n(row, top_n),
                });
            }
        }
        Ok(out)
    }

    fn greedy_answer(&self, messages: &[ChatMessage], max_tokens: usize) -> Result<String, BoxError> {
        let tokenizer = self.model.tokenizer();
        let prompt = self.prompt_ids(messages)?;
        if prompt.is_empty() {
            return Err("the chat template rendered an empty prompt".into());
        }
        let mut cache = self.model.new_cache();
        let logits = self.model.forward(&mut cache, &prompt, 0)?;
        let mut next = easd_core::argmax(logits.row(logits.rows() - 1));
        let context = self.model.info().context_length;
        let mut generated = Vec::new();
        while generated.len() < max_tokens && !tokenizer.stop_token_ids().contains(&next) {
            generated.push(next);
            let position = prompt.len() + generated.len() - 1;
            if position + 1 >= context {
                break;
            }
            let logits = self.model.forward(&mut cache, &[next], position)?;
            next = easd_core::argmax(logits.row(0));
        }
        Ok(tokenizer.decode(&generated)?)
    }
}

#[cfg(test)]
mod tests {
    use easd_model::{Device, TinySpec, write_tiny_gguf};

    use super::*;
    use crate::calibrate::{CalibrationConfig, run_calibration};

    fn tiny(dir: &Path, name: &str, spec: &TinySpec) -> ModelScorer {
        let path = dir.join(name);
        write_tiny_gguf(&path, spec).unwrap();
        let options = LoadOptions { device: Device::Cpu, requantize: true, warmup: false, head_vocab: None };
        ModelScorer::load(&path, &options).unwrap()
    }

    fn user(text: &str) -> Vec<ChatMessage> {
        vec![ChatMessage { role: "user".into(), content: text.into() }]
    }

    #[test]
    fn chunked_scoring_matches_one_forward_per_position() {
        let dir = tempfile::tempdir().unwrap();
        let scorer = tiny(dir.path(), "t.gguf", &TinySpec::qwen2(3));
        // Long enough to cross a chunk boundary.
        let answer = "Natalia sold 48 / 2 = 24 clips in May. ".repeat(8) + "The answer is 72.";
        let messages = user("How many clips?");
        let scored = scorer.score(&messages, &answer, 1.0, 5).unwrap();
        let n_answer = scorer.model().tokenizer().encode(&answer).unwrap().len();
        let n_prompt = scorer.prompt_ids(&messages).unwrap().len();
        assert!(n_prompt + n_answer > CHUNK_TOKENS + 10, "the test must cross a chunk boundary");
        assert_eq!(scored.len(), n_answer);
        let vocab = scorer.model().info().vocab_size as f32;
        assert!(scored.iter().all(|s| s.entropy >= 0.0 && s.entropy <= vocab.ln() + 1e-3 && s.top_n.len() == 5));
        // The reference: the whole sequence in one forward.
        let sequence: Vec<u32> = scorer
            .prompt_ids(&messages)
            .unwrap()
            .into_iter()
            .chain(scorer.model().tokenizer().encode(&answer).unwrap())
            .collect();
        let logits = scorer.model().forward(&mut scorer.model().new_cache(), &sequence, 0).unwrap();
        for (j, s) in scored.iter().enumerate() {
            let h = easd_core::entropy(logits.row(n_prompt - 1 + j), 1.0);
            assert!((h - s.entropy).abs() < 0.05, "position {j}: {h} vs {}", s.entropy);
        }
        // Higher temperature flattens the distribution.
        let hot = scorer.score(&messages, &answer, 2.0, 5).unwrap();
        let mean = |v: &[ScoredPosition]| v.iter().map(|s| s.entropy).sum::<f32>() / v.len() as f32;
        assert!(mean(&hot) > mean(&scored));
    }

    #[test]
    fn calibration_runs_end_to_end_on_tiny_models() {
        let dir = tempfile::tempdir().unwrap();
        let target = tiny(dir.path(), "target.gguf", &TinySpec::qwen2(5));
        let draft_spec = TinySpec { perturbation: Some((6, 0.3)), ..TinySpec::qwen2(5) };
        let draft = tiny(dir.path(), "draft.gguf", &draft_spec);
        let dataset = dir.path().join("d.jsonl");
        std::fs::write(
            &dataset,
            "{\"question\": \"What is 2 + 3?\", \"answer\": \"2 + 3 = <<2+3=5>>5\\n#### 5\"}\n{\"question\": \"Say a number.\"}\n",
        )
        .unwrap();
        let mut config = CalibrationConfig::new(&dataset);
        config.max_answer_tokens = 8;
        let file = run_calibration(&config, &draft, &target, &mut |_, _| {}).unwrap();
        assert_eq!(file.questions, 2);
        assert!(file.draft.count > 5 && file.draft.count == file.target.count);
        let p = &file.target.percentiles;
        assert!(p["p50"] <= p["p90"] && p["p90"] <= p["p99"]);
        assert_eq!(file.recommended.tau_target, file.target.quantiles[90]);
    }
}
