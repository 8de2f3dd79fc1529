//! Entropy calibration (`easd calibrate`): per-token entropies of the draft and the target on reasoning text, their
//! percentiles, and the EASD thresholds τ_draft / τ_target at a chosen percentile (the paper's offline calibration).
//!
//! Method, teacher-forced: each calibration question is rendered with the evaluation prompt and chat template, the
//! dataset's reference solution (calculator annotations removed, `#### N` → "The answer is N.") is appended as the
//! assistant's turn, and each model runs **one forward over the whole sequence**; the entropies (at the evaluation
//! temperature, 1 for greedy) and top-N sets are read at every position that predicts a solution token. Both models
//! see identical token sequences, so positions pair up and the joint gate rate and the top-N overlap can be measured
//! too. This costs one forward per model per question instead of a full generation; lines without a reference
//! solution fall back to the target's own greedy answer ([`EntropyScorer::greedy_answer`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use easd_core::{EasdParams, easd_rule, percentile_sorted};
use serde::{Deserialize, Serialize};

use crate::dataset::{load_problems, sample_indices, solution_text};
use crate::error::{BoxError, Error, Result};
use crate::generator::{ChatMessage, EasdSettings};
use crate::run::PromptTemplate;
use crate::stats::{Histogram, pearson};

/// Percentiles named in the file.
pub const PERCENTILES: [u32; 6] = [50, 75, 80, 90, 95, 99];
/// Version tag of the file format.
pub const CALIBRATION_FORMAT: &str = "easd-calibration/1";
/// Histogram bins stored per model: 0.05 nats wide up to 12 nats (Qwen's vocabulary caps entropy at ln 151,936 ≈ 11.9).
const HIST_BIN_WIDTH: f32 = 0.05;
const HIST_BINS: usize = 240;

/// What a model reports at one teacher-forced position.
#[derive(Clone, Debug, PartialEq)]
pub struct ScoredPosition {
    /// H of the full softmax at the requested temperature, nats.
    pub entropy: f32,
    /// Ids of the N most likely tokens.
    pub top_n: Vec<u32>,
}

/// A model that can be scored teacher-forced; [`crate::ModelScorer`] runs a GGUF model, tests use a fake.
pub trait EntropyScorer {
    fn model_name(&self) -> String;
    /// Renders `messages` with the chat template, appends `answer`, runs one forward, and returns one entry per
    /// answer token: the distribution that predicted it.
    fn score(
        &self,
        messages: &[ChatMessage],
        answer: &str,
        temperature: f32,
        top_n: usize,
    ) -> Result<Vec<ScoredPosition>, BoxError>;
    /// The model's greedy answer to `messages` (at most `max_tokens`), for questions without a reference solution.
    fn greedy_answer(&self, messages: &[ChatMessage], max_tokens: usize) -> Result<String, BoxError>;
}

/// One position scored by both models: what the EASD rule reads there.
#[derive(Clone, Debug, PartialEq)]
pub struct PairedEntropy {
    /// H(q̂), nats.
    pub draft: f32,
    /// H(p̂), nats.
    pub target: f32,
    /// TopN(q̂) and TopN(p̂) as the scorers returned them (the rule counts the first N of each).
    pub draft_top_n: Vec<u32>,
    pub target_top_n: Vec<u32>,
}

/// Which text the models are teacher-forced on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CalibrationText {
    /// The dataset's reference solution (one forward per model; the target's greedy answer where a line has none).
    Reference,
    /// The target's own greedy answer (one extra generation per question): the text EASD actually sees, so its
    /// percentiles match generation time. On the default pair, reference text gives roughly twice the entropy
    /// percentiles of the target's own answers (see docs/EVAL.md).
    TargetGreedy,
}

/// Settings of a calibration run.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationConfig {
    /// JSONL with a `question` field (and a GSM8K `answer` for teacher forcing).
    pub dataset: PathBuf,
    /// Questions to sample.
    pub questions: usize,
    /// Sample from lines `range.0..range.1` (clamped to the file): keep calibration apart from the development and
    /// held-out slices.
    pub range: (usize, usize),
    pub seed: u64,
    /// Temperature the entropies are measured at: the evaluation temperature, 1 for greedy.
    pub temperature: f32,
    /// EASD N and ρ used for the overlap and the predicted trigger rates.
    pub top_n: u32,
    pub rho: f32,
    /// Percentile the recommended thresholds are taken at.
    pub percentile: f64,
    pub prompt: PromptTemplate,
    pub text: CalibrationText,
    /// Token budget of a greedy answer.
    pub max_answer_tokens: usize,
}

impl CalibrationConfig {
    /// 100 questions from the first 2,000 lines, seed 0, temperature 1, N 5, ρ 0.6, recommendation at p90 (DESIGN §2.2).
    pub fn new(dataset: impl Into<PathBuf>) -> CalibrationConfig {
        CalibrationConfig {
            dataset: dataset.into(),
            questions: 100,
            range: (0, 2000),
            seed: 0,
            temperature: 1.0,
            top_n: 5,
            rho: 0.6,
            percentile: 90.0,
            prompt: PromptTemplate::default(),
            text: CalibrationText::Reference,
            max_answer_tokens: 1024,
        }
    }

    pub fn validate(&self) -> Result<()> {
        if self.questions == 0 {
            return Err(Error::invalid("questions", "must be at least 1"));
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(Error::invalid("temperature", format!("must be > 0, got {}", self.temperature)));
        }
        if !(0.0..=100.0).contains(&self.percentile) {
            return Err(Error::invalid("percentile", format!("must be in [0, 100], got {}", self.percentile)));
        }
        EasdSettings { top_n: Some(self.top_n), rho: Some(self.rho), ..EasdSettings::default() }.validate()
    }
}

/// Entropy statistics of one model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelEntropy {
    pub model: String,
    pub count: u64,
    pub mean: f64,
    /// "p50", "p75", "p80", "p90", "p95", "p99" → nats.
    pub percentiles: BTreeMap<String, f32>,
    /// Every integer percentile 0..=100 (101 values), so a sweep can use any percentile.
    pub quantiles: Vec<f32>,
    pub histogram: Histogram,
}

/// The recommended thresholds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    pub percentile: f64,
    pub tau_draft: f32,
    pub tau_target: f32,
}

/// How often the EASD gates would open on the calibration text with both thresholds at one percentile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GateRate {
    pub percentile: u32,
    pub tau_draft: f32,
    pub tau_target: f32,
    /// Fraction of positions with H_q ≥ τ_draft and H_p ≥ τ_target.
    pub both_uncertain: f64,
    /// … and overlap ≥ ρ: the rule's firing rate if every position were drafted and accepted.
    pub fires: f64,
}

/// The calibration file (JSON). The coordinator takes `recommended.tau_draft` / `recommended.tau_target` as its
/// default EASD thresholds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationFile {
    pub format: String,
    pub method: String,
    pub dataset: String,
    pub questions: usize,
    pub temperature: f32,
    pub top_n: u32,
    pub rho: f32,
    pub draft: ModelEntropy,
    pub target: ModelEntropy,
    /// Pearson correlation of H_q and H_p over paired positions.
    pub correlation: Option<f64>,
    pub recommended: Recommendation,
    pub gate_rates: Vec<GateRate>,
}

impl CalibrationFile {
    pub fn load(path: &Path) -> Result<CalibrationFile> {
        let text = std::fs::read_to_string(path).map_err(Error::io(path))?;
        let file: CalibrationFile =
            serde_json::from_str(&text).map_err(|source| Error::Json { path: path.to_path_buf(), source })?;
        if file.format != CALIBRATION_FORMAT {
            return Err(Error::invalid(
                "format",
                format!("{}: expected {CALIBRATION_FORMAT}, got {:?}", path.display(), file.format),
            ));
        }
        if file.draft.quantiles.len() != 101 || file.target.quantiles.len() != 101 {
            return Err(Error::invalid("quantiles", format!("{}: need 101 values per model", path.display())));
        }
        Ok(file)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(Error::io(parent))?;
        }
        let json =
            serde_json::to_string_pretty(self).map_err(|source| Error::Json { path: path.to_path_buf(), source })?;
        std::fs::write(path, json + "\n").map_err(Error::io(path))
    }

    /// (τ_draft, τ_target) at any percentile in [0, 100], interpolated between the stored integer percentiles.
    pub fn taus_at(&self, percentile: f64) -> Option<(f32, f32)> {
        Some((quantile_at(&self.draft.quantiles, percentile)?, quantile_at(&self.target.quantiles, percentile)?))
    }

    /// The recommended thresholds as EASD settings (other fields unset: the coordinator's defaults).
    pub fn easd_settings(&self) -> EasdSettings {
        EasdSettings {
            tau_draft: Some(self.recommended.tau_draft),
            tau_target: Some(self.recommended.tau_target),
            ..EasdSettings::default()
        }
    }

    /// Builds the file from paired samples (pure: the statistics part of [`run_calibration`]).
    pub fn from_samples(
        config: &CalibrationConfig,
        draft_model: &str,
        target_model: &str,
        questions: usize,
        samples: &[PairedEntropy],
    ) -> Result<CalibrationFile> {
        if samples.is_empty() {
            return Err(Error::invalid("samples", "no scored positions: nothing to calibrate on"));
        }
        let draft: Vec<f32> = samples.iter().map(|s| s.draft).collect();
        let target: Vec<f32> = samples.iter().map(|s| s.target).collect();
        let draft_stats = model_entropy(draft_model, &draft);
        let target_stats = model_entropy(target_model, &target);
        // The coordinator's own rule (easd-core) at each position; with ρ = 0 only the entropy gates remain.
        let gate = |tau_draft: f32, tau_target: f32| {
            let params = EasdParams {
                top_n: config.top_n as usize,
                rho: config.rho,
                tau_draft,
                tau_target,
                ..EasdParams::default()
            };
            let gates_only = EasdParams { rho: 0.0, ..params.clone() };
            let rate = |params: &EasdParams| {
                let fired = samples
                    .iter()
                    .filter(|s| easd_rule(params, s.draft, s.target, &s.draft_top_n, &s.target_top_n).is_some())
                    .count();
                fired as f64 / samples.len() as f64
            };
            (rate(&gates_only), rate(&params))
        };
        let gate_rates = PERCENTILES
            .iter()
            .map(|&p| {
                let (td, tt) = (draft_stats.quantiles[p as usize], target_stats.quantiles[p as usize]);
                let (both_uncertain, fires) = gate(td, tt);
                GateRate { percentile: p, tau_draft: td, tau_target: tt, both_uncertain, fires }
            })
            .collect();
        let mut file = CalibrationFile {
            format: CALIBRATION_FORMAT.into(),
            method: match config.text {
                CalibrationText::Reference => {
                    "teacher-forced on reference solutions (target's greedy answer where none): one forward per model, entropies at answer positions"
                }
                CalibrationText::TargetGreedy => {
                    "teacher-forced on the target's greedy answers: one forward per model, entropies at answer positions"
                }
            }
            .into(),
            dataset: config.dataset.display().to_string(),
            questions,
            temperature: config.temperature,
            top_n: config.top_n,
            rho: config.rho,
            draft: draft_stats,
            target: target_stats,
            correlation: pearson(&draft, &target),
            recommended: Recommendation {
                percentile: config.percentile,
                tau_draft: 0.0,
                tau_target: 0.0,
            },
            gate_rates,
        };
        let (tau_draft, tau_target) = file
            .taus_at(config.percentile)
            .ok_or_else(|| Error::invalid("percentile", format!("{} is outside [0, 100]", config.percentile)))?;
        file.recommended.tau_draft = tau_draft;
        file.recommended.tau_target = tau_target;
        Ok(file)
    }
}

fn quantile_at(quantiles: &[f32], percentile: f64) -> Option<f32> {
    if quantiles.len() != 101 {
        return None;
    }
    percentile_sorted(quantiles, percentile).map(|q| q as f32)
}

fn model_entropy(model: &str, values: &[f32]) -> ModelEntropy {
    let mut sorted: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f32::total_cmp);
    let q = |p: f64| percentile_sorted(&sorted, p).map_or(0.0, |q| q as f32);
    let mut histogram = Histogram::new(HIST_BIN_WIDTH, HIST_BINS);
    for &v in &sorted {
        histogram.push(v);
    }
    ModelEntropy {
        model: model.to_string(),
        count: sorted.len() as u64,
        mean: sorted.iter().map(|&v| v as f64).sum::<f64>() / sorted.len().max(1) as f64,
        percentiles: PERCENTILES.iter().map(|&p| (format!("p{p}"), q(p as f64))).collect(),
        quantiles: (0..=100).map(|p| q(p as f64)).collect(),
        histogram,
    }
}

/// Scores a sample of questions with both models and builds the calibration file. `progress(done, total)` is
/// called after each question.
pub fn run_calibration(
    config: &CalibrationConfig,
    draft: &dyn EntropyScorer,
    target: &dyn EntropyScorer,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<CalibrationFile> {
    config.validate()?;
    let problems = load_problems(&config.dataset)?;
    let end = config.range.1.min(problems.len());
    let start = config.range.0.min(end);
    if start == end {
        return Err(Error::invalid(
            "range",
            format!(
                "{}..{} holds no line of {} ({} lines)",
                config.range.0,
                config.range.1,
                config.dataset.display(),
                problems.len()
            ),
        ));
    }
    let chosen = sample_indices(end - start, config.questions, config.seed);
    let top_n = config.top_n as usize;
    let mut samples = Vec::new();
    for (done, &offset) in chosen.iter().enumerate() {
        let problem = &problems[start + offset];
        let scoring = |source| Error::Scoring { question: problem.index, source };
        let messages = config.prompt.messages(&problem.question);
        let answer = match (&problem.answer, config.text) {
            (Some(a), CalibrationText::Reference) => solution_text(a),
            _ => target.greedy_answer(&messages, config.max_answer_tokens).map_err(scoring)?,
        };
        let d = draft.score(&messages, &answer, config.temperature, top_n).map_err(scoring)?;
        let t = target.score(&messages, &answer, config.temperature, top_n).map_err(scoring)?;
        if d.len() != t.len() {
            return Err(scoring(
                format!("draft scored {} positions, target {}: the models must share a tokenizer", d.len(), t.len())
                    .into(),
            ));
        }
        samples.extend(d.into_iter().zip(t).map(|(d, t)| PairedEntropy {
            draft: d.entropy,
            target: t.entropy,
            draft_top_n: d.top_n,
            target_top_n: t.top_n,
        }));
        progress(done + 1, chosen.len());
    }
    CalibrationFile::from_samples(config, &draft.model_name(), &target.model_name(), chosen.len(), &samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores one position per answer byte: entropy from the byte, so the numbers are known in advance.
    struct FakeScorer {
        scale: f32,
        shared_top: usize,
        greedy: &'static str,
    }

    impl EntropyScorer for FakeScorer {
        fn model_name(&self) -> String {
            format!("fake-{}", self.scale)
        }

        fn score(
            &self,
            _: &[ChatMessage],
            answer: &str,
            temperature: f32,
            n: usize,
        ) -> Result<Vec<ScoredPosition>, BoxError> {
            Ok(answer
                .bytes()
                .map(|b| ScoredPosition {
                    entropy: self.scale * temperature * f32::from(b % 10),
                    top_n: (0..n as u32)
                        .map(|i| if (i as usize) < self.shared_top { i } else { (self.scale * 1000.0) as u32 + i })
                        .collect(),
                })
                .collect())
        }

        fn greedy_answer(&self, _: &[ChatMessage], _: usize) -> Result<String, BoxError> {
            Ok(self.greedy.to_string())
        }
    }

    fn dataset(dir: &Path) -> PathBuf {
        let path = dir.join("cal.jsonl");
        // Solution texts become "The answer is N." after `solution_text`; the last line has no answer field.
        std::fs::write(
            &path,
            "{\"question\": \"a\", \"answer\": \"x <<1+1=2>>2\\n#### 2\"}\n{\"question\": \"b\", \"answer\": \"#### 7\"}\n{\"question\": \"c\"}\n",
        )
        .unwrap();
        path
    }

    #[test]
    fn calibration_pairs_positions_and_recommends_the_chosen_percentile() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = CalibrationConfig::new(dataset(dir.path()));
        config.percentile = 80.0;
        let draft = FakeScorer { scale: 1.0, shared_top: 3, greedy: "unused" };
        let target = FakeScorer { scale: 0.5, shared_top: 3, greedy: "0123456789" };
        let mut calls = Vec::new();
        let file = run_calibration(&config, &draft, &target, &mut |d, t| calls.push((d, t))).unwrap();
        assert_eq!(calls, vec![(1, 3), (2, 3), (3, 3)]);
        let texts = [solution_text("x <<1+1=2>>2\n#### 2"), solution_text("#### 7"), "0123456789".to_string()];
        let mut expected: Vec<f32> = texts.iter().flat_map(|t| t.bytes().map(|b| f32::from(b % 10))).collect();
        assert_eq!(file.draft.count as usize, expected.len());
        expected.sort_by(f32::total_cmp);
        let p80 = percentile_sorted(&expected, 80.0).unwrap() as f32;
        assert_eq!(file.recommended.tau_draft, p80);
        assert!((file.recommended.tau_target - 0.5 * p80).abs() < 1e-6);
        assert_eq!(file.draft.percentiles["p80"], p80);
        // Target entropy is exactly half the draft's: perfectly correlated.
        assert!((file.correlation.unwrap() - 1.0).abs() < 1e-9);
        // Overlap is 3/5 = 0.6 >= rho everywhere, so the rule fires wherever both gates open.
        for g in &file.gate_rates {
            assert_eq!(g.both_uncertain, g.fires);
        }
        assert!(file.gate_rates.windows(2).all(|w| w[0].fires >= w[1].fires));
        assert!(file.gate_rates[0].fires > 0.3, "{:?}", file.gate_rates[0]);
        assert_eq!(file.questions, 3);
    }

    #[test]
    fn target_greedy_text_scores_the_targets_own_answers() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = CalibrationConfig::new(dataset(dir.path()));
        config.text = CalibrationText::TargetGreedy;
        let draft = FakeScorer { scale: 1.0, shared_top: 3, greedy: "unused" };
        let target = FakeScorer { scale: 0.5, shared_top: 3, greedy: "0123456789" };
        let file = run_calibration(&config, &draft, &target, &mut |_, _| {}).unwrap();
        // Three questions, ten positions each, entropies 0..9 for the draft.
        assert_eq!(file.draft.count, 30);
        assert_eq!(file.draft.percentiles["p50"], 4.5);
        assert!(file.method.contains("greedy answers"));
    }

    #[test]
    fn low_overlap_suppresses_predicted_triggers() {
        let dir = tempfile::tempdir().unwrap();
        let config = CalibrationConfig::new(dataset(dir.path()));
        let draft = FakeScorer { scale: 1.0, shared_top: 1, greedy: "" };
        let target = FakeScorer { scale: 2.0, shared_top: 1, greedy: "42" };
        let file = run_calibration(&config, &draft, &target, &mut |_, _| {}).unwrap();
        assert!(file.gate_rates.iter().all(|g| g.fires == 0.0));
        assert!(file.gate_rates.iter().any(|g| g.both_uncertain > 0.0));
    }

    /// A scorer may return more ids than the N it was asked for; the rule counts only the first N of each list. (The
    /// calibration once counted every shared id, predicting triggers here that the coordinator would never fire.)
    #[test]
    fn ids_beyond_n_do_not_count_towards_the_overlap() {
        struct Long(u32);
        impl EntropyScorer for Long {
            fn model_name(&self) -> String {
                format!("long-{}", self.0)
            }
            fn score(
                &self,
                _: &[ChatMessage],
                answer: &str,
                _: f32,
                n: usize,
            ) -> Result<Vec<ScoredPosition>, BoxError> {
                // The first N ids: id 0 shared, the rest this model's own (overlap 1/N); then N ids both share.
                let n = n as u32;
                let top_n: Vec<u32> =
                    std::iter::once(0).chain((1..n).map(|i| self.0 + i)).chain(100..100 + n).collect();
                Ok(answer.bytes().map(|_| ScoredPosition { entropy: 5.0, top_n: top_n.clone() }).collect())
            }
            fn greedy_answer(&self, _: &[ChatMessage], _: usize) -> Result<String, BoxError> {
                Ok("42".into())
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let config = CalibrationConfig::new(dataset(dir.path()));
        assert_eq!((config.top_n, config.rho), (5, 0.6));
        let file = run_calibration(&config, &Long(1000), &Long(2000), &mut |_, _| {}).unwrap();
        // Every position is uncertain for both models (entropy 5 at every percentile) but agrees on 1 of 5 ids.
        for g in &file.gate_rates {
            assert_eq!((g.both_uncertain, g.fires), (1.0, 0.0), "{g:?}");
        }
    }

    #[test]
    fn files_round_trip_and_wrong_formats_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let config = CalibrationConfig::new(dataset(dir.path()));
        let samples: Vec<PairedEntropy> = (0..200)
            .map(|i| PairedEntropy {
                draft: i as f32 / 100.0,
                target: i as f32 / 200.0,
                draft_top_n: vec![1, 2, 3, 4, 5],
                target_top_n: vec![1, 2, 3, 4, 9],
            })
            .collect();
        let file = CalibrationFile::from_samples(&config, "d", "t", 10, &samples).unwrap();
        let path = dir.path().join("out/calibration.json");
        file.save(&path).unwrap();
        let back = CalibrationFile::load(&path).unwrap();
        assert_eq!(back, file);
        // numpy.percentile(np.arange(200) / 100, 90) = 1.791
        assert!((back.recommended.tau_draft - 1.791).abs() < 1e-5);
        let (d, t) = back.taus_at(95.5).unwrap();
        assert!((d - 1.90045).abs() < 1e-4 && (t - d / 2.0).abs() < 1e-4, "{d} {t}");
        assert_eq!(back.easd_settings().tau_draft, Some(back.recommended.tau_draft));
        std::fs::write(&path, serde_json::to_string(&CalibrationFile { format: "other".into(), ..file }).unwrap())
            .unwrap();
        assert!(CalibrationFile::load(&path).unwrap_err().to_string().contains("format"));
    }

    #[test]
    fn mismatched_tokenizations_and_empty_ranges_are_errors() {
        struct OneShort(FakeScorer);
        impl EntropyScorer for OneShort {
            fn model_name(&self) -> String {
                self.0.model_name()
            }
            fn score(&self, m: &[ChatMessage], a: &str, t: f32, n: usize) -> Result<Vec<ScoredPosition>, BoxError> {
                let mut v = self.0.score(m, a, t, n)?;
                v.pop();
                Ok(v)
            }
            fn greedy_answer(&self, m: &[ChatMessage], n: usize) -> Result<String, BoxError> {
                self.0.greedy_answer(m, n)
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let mut config = CalibrationConfig::new(dataset(dir.path()));
        let draft = FakeScorer { scale: 1.0, shared_top: 3, greedy: "" };
        let short = OneShort(FakeScorer { scale: 1.0, shared_top: 3, greedy: "" });
        let err = run_calibration(&config, &draft, &short, &mut |_, _| {}).unwrap_err().to_string();
        assert!(err.contains("share a tokenizer"), "{err}");
        config.range = (10, 20);
        let err = run_calibration(&config, &draft, &draft, &mut |_, _| {}).unwrap_err().to_string();
        assert!(err.contains("range"), "{err}");
        assert!(CalibrationFile::from_samples(&config, "d", "t", 0, &[]).is_err());
    }
}
