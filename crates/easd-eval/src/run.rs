//! Running a benchmark through a [`Generator`]: every problem × variant, resumable, with bounded concurrency.

use std::path::PathBuf;
use std::time::Instant;

use futures::StreamExt;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::dataset::{Problem, load_problems, slice};
use crate::error::{Error, Result};
use crate::extract::{answers_match, extract_answer};
use crate::generator::{ChatMessage, EasdSettings, EvalRequest, Generator, Mode, Sampling};
use crate::progress::Progress;
use crate::results::{ResultRecord, ResultsFile, token_ids_sha256};

/// How a question becomes chat messages. `{question}` in `user` is replaced by the problem text.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PromptTemplate {
    pub system: Option<String>,
    pub user: String,
}

impl Default for PromptTemplate {
    /// Asks for step-by-step reasoning and a final "The answer is N." line, which the extractor reads first after
    /// `\boxed{}` and `####`.
    fn default() -> Self {
        PromptTemplate {
            system: None,
            user: "Solve the following math problem step by step. End your response with a line of the form \
                   \"The answer is N.\" where N is the final number.\n\nQuestion: {question}"
                .into(),
        }
    }
}

impl PromptTemplate {
    pub fn messages(&self, question: &str) -> Vec<ChatMessage> {
        let mut out = Vec::with_capacity(2);
        if let Some(system) = &self.system {
            out.push(ChatMessage { role: "system".into(), content: system.clone() });
        }
        out.push(ChatMessage { role: "user".into(), content: self.user.replace("{question}", question) });
        out
    }
}

/// One arm of a comparison: a mode with its EASD settings, under a label unique within a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Variant {
    /// "draft", "target", "sd", "easd", or a sweep point such as "easd-p90-rho0.6-n5".
    pub label: String,
    pub mode: Mode,
    /// Ignored (and not hashed) unless `mode` is `Easd`.
    pub easd: EasdSettings,
}

impl Variant {
    /// The variant of a plain mode, labelled by its name.
    pub fn of_mode(mode: Mode, easd: &EasdSettings) -> Variant {
        Variant {
            label: mode.name().to_string(),
            mode,
            easd: if mode == Mode::Easd { easd.clone() } else { EasdSettings::default() },
        }
    }

    /// Hex prefix of a SHA-256 over everything that shapes this variant's outputs: mode, EASD settings, sampling,
    /// block size, token budget and prompt template. Results with another hash are not reused.
    pub fn settings_hash(&self, config: &EvalConfig) -> String {
        #[derive(Serialize)]
        struct Hashed<'a> {
            mode: Mode,
            easd: &'a EasdSettings,
            sampling: &'a Sampling,
            k: u32,
            max_tokens: u32,
            prompt: &'a PromptTemplate,
        }
        let hashed = Hashed {
            mode: self.mode,
            easd: &self.easd,
            sampling: &config.sampling,
            k: config.k,
            max_tokens: config.max_tokens,
            prompt: &config.prompt,
        };
        // Serializing plain data to a string cannot fail.
        let json = serde_json::to_string(&hashed).unwrap_or_default();
        hex::encode(&Sha256::digest(json.as_bytes())[..8])
    }
}

/// Everything `easd eval` needs besides the backend.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalConfig {
    /// JSONL benchmark (GSM8K format).
    pub dataset: PathBuf,
    /// Results JSONL (appended; resumable).
    pub results: PathBuf,
    pub variants: Vec<Variant>,
    pub offset: usize,
    pub limit: Option<usize>,
    /// Requests in flight at once. 1 gives clean per-request wall-clock numbers; more finishes sooner.
    pub concurrency: usize,
    pub sampling: Sampling,
    /// Block size.
    pub k: u32,
    pub max_tokens: u32,
    pub prompt: PromptTemplate,
    /// Extra attempts for a failed request before the run stops (finished lines stay; rerun to resume).
    pub retries: u32,
    /// Wait before retry n: n × this.
    pub retry_backoff_ms: u64,
    /// The coordinator's EASD defaults (its `Info`), which the unset fields of an `easd` variant take. Recorded with
    /// every `easd` result; resuming refuses results made under other defaults. `None`: unknown, not checked.
    pub easd_defaults: Option<EasdSettings>,
    /// Names the lines this run writes ([`ResultRecord::session`]): reports keep speeds of different sessions apart.
    /// `None`: a new id from the start time (UTC) and the process id.
    pub session: Option<String>,
}

impl EvalConfig {
    /// Defaults: modes draft, target, sd, easd (coordinator's EASD defaults), greedy, seed 0, k 4, 1,024 tokens
    /// (DESIGN §5: fewer truncates GSM8K answers), concurrency 1, 2 retries, the default prompt, every problem.
    pub fn new(dataset: impl Into<PathBuf>, results: impl Into<PathBuf>) -> EvalConfig {
        EvalConfig {
            dataset: dataset.into(),
            results: results.into(),
            variants: Mode::ALL.iter().map(|&m| Variant::of_mode(m, &EasdSettings::default())).collect(),
            offset: 0,
            limit: None,
            concurrency: 1,
            sampling: Sampling::default(),
            k: 4,
            max_tokens: 1024,
            prompt: PromptTemplate::default(),
            retries: 2,
            retry_backoff_ms: 1000,
            easd_defaults: None,
            session: None,
        }
    }

    /// Replaces the variants by one per mode, `easd` applying to the `easd` mode.
    pub fn with_modes(mut self, modes: &[Mode], easd: &EasdSettings) -> EvalConfig {
        self.variants = modes.iter().map(|&m| Variant::of_mode(m, easd)).collect();
        self
    }

    pub fn validate(&self) -> Result<()> {
        if self.variants.is_empty() {
            return Err(Error::invalid("modes", "at least one mode is needed"));
        }
        for (i, v) in self.variants.iter().enumerate() {
            if self.variants[..i].iter().any(|w| w.label == v.label) {
                return Err(Error::invalid("variants", format!("label {:?} appears twice", v.label)));
            }
            v.easd.validate()?;
        }
        if self.concurrency == 0 {
            return Err(Error::invalid("concurrency", "must be at least 1"));
        }
        easd_core::validate_block_size(self.k as usize)?;
        if self.max_tokens == 0 {
            return Err(Error::invalid("max_tokens", "must be at least 1"));
        }
        if !self.prompt.user.contains("{question}") {
            return Err(Error::invalid("prompt", "the user template must contain {question}"));
        }
        self.sampling.validate()
    }
}

/// What a run did.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalRun {
    /// Every record of the run's problems and variants, resumed ones included, in (problem, variant) order.
    pub records: Vec<ResultRecord>,
    /// Generations made by this call.
    pub generated: usize,
    /// Generations skipped because the results file already had them.
    pub resumed: usize,
    /// Wall time of this call.
    pub elapsed_s: f64,
}

/// Runs every selected problem through every variant (problem-major, so an interrupted run leaves complete pairs
/// for most problems and drift in server load spreads over all modes), appending each scored result to
/// `config.results` as it finishes. Already-present results are skipped. Stops at the first request that still
/// fails after `config.retries` retries.
pub async fn run_eval<G: Generator>(config: &EvalConfig, generator: &G, progress: &dyn Progress) -> Result<EvalRun> {
    config.validate()?;
    let problems = slice(load_problems(&config.dataset)?, config.offset, config.limit);
    require_references(&problems)?;
    run_problems(config, &problems, generator, progress).await
}

/// Scoring needs a reference value for every problem; an empty selection is also a mistake worth naming.
pub(crate) fn require_references(problems: &[Problem]) -> Result<()> {
    if problems.is_empty() {
        return Err(Error::invalid("offset", "the selection (offset, limit) holds no problem"));
    }
    match problems.iter().find(|p| p.expected.is_none()) {
        Some(p) => Err(Error::invalid(
            "dataset",
            format!("problem {} has no `#### N` reference answer to score against", p.index),
        )),
        None => Ok(()),
    }
}

/// [`run_eval`] on problems already loaded (used by the sweep and by tests).
pub async fn run_problems<G: Generator>(
    config: &EvalConfig,
    problems: &[Problem],
    generator: &G,
    progress: &dyn Progress,
) -> Result<EvalRun> {
    config.validate()?;
    let started = Instant::now();
    let session = config.session.clone().unwrap_or_else(new_session_id);
    let mut file = ResultsFile::open(&config.results)?;
    let hashes: Vec<String> = config.variants.iter().map(|v| v.settings_hash(config)).collect();
    let mut jobs = Vec::new();
    let mut resumed = 0;
    for problem in problems {
        for (variant, hash) in config.variants.iter().zip(&hashes) {
            if let Some(stored) = file.record(problem.index, &variant.label, hash) {
                if !stored.question_hash.is_empty() && stored.question_hash != question_hash(&problem.question) {
                    return Err(Error::invalid(
                        "results",
                        format!(
                            "{} holds problem {} with another question text: it was written for another dataset",
                            config.results.display(),
                            problem.index
                        ),
                    ));
                }
                check_easd_defaults(config, variant, stored)?;
                resumed += 1;
            } else {
                jobs.push((problem, variant, hash));
            }
        }
    }
    progress.start(jobs.len() + resumed, resumed);
    let mut stream = futures::stream::iter(jobs)
        .map(|(problem, variant, hash)| run_one(config, &session, problem, variant, hash, generator))
        .buffer_unordered(config.concurrency);
    let mut generated = 0;
    while let Some(record) = stream.next().await {
        let record = record?;
        progress.advance(&record);
        file.append(record)?;
        generated += 1;
    }
    progress.finish();
    let records = selected(config, problems, &hashes, file.records());
    Ok(EvalRun { records, generated, resumed, elapsed_s: started.elapsed().as_secs_f64() })
}

/// The stored lines of `config`'s problems and variants, generating nothing (to report on a run that is incomplete or
/// spread over several invocations), and how many of the wanted lines are still missing.
pub fn stored_results(config: &EvalConfig) -> Result<(Vec<ResultRecord>, usize)> {
    config.validate()?;
    let problems = slice(load_problems(&config.dataset)?, config.offset, config.limit);
    require_references(&problems)?;
    let hashes: Vec<String> = config.variants.iter().map(|v| v.settings_hash(config)).collect();
    let stored = crate::results::read_results(&config.results)?;
    let records = selected(config, &problems, &hashes, &stored);
    let missing = problems.len() * config.variants.len() - records.len();
    Ok((records, missing))
}

/// The records of `problems` × `config.variants` (under `hashes`), in (problem, variant) order.
fn selected(
    config: &EvalConfig,
    problems: &[Problem],
    hashes: &[String],
    stored: &[ResultRecord],
) -> Vec<ResultRecord> {
    let wanted: std::collections::HashSet<(usize, &str, &str)> = problems
        .iter()
        .flat_map(|p| config.variants.iter().zip(hashes).map(move |(v, h)| (p.index, v.label.as_str(), h.as_str())))
        .collect();
    let mut records: Vec<ResultRecord> = stored
        .iter()
        .filter(|r| wanted.contains(&(r.problem, r.variant.as_str(), r.settings.as_str())))
        .cloned()
        .collect();
    let order = |label: &str| config.variants.iter().position(|v| v.label == label);
    records.sort_by_key(|r| (r.problem, order(&r.variant)));
    records
}

/// A stored `easd` result resolved its unset fields to the coordinator's defaults of that time, which the settings
/// hash does not cover: reusing it under a coordinator with other defaults would mix two settings in one variant.
fn check_easd_defaults(config: &EvalConfig, variant: &Variant, stored: &ResultRecord) -> Result<()> {
    let (Some(then), Some(now)) = (&stored.easd_defaults, &config.easd_defaults) else { return Ok(()) };
    if variant.mode != Mode::Easd || variant.easd.or(then) == variant.easd.or(now) {
        return Ok(());
    }
    Err(Error::invalid(
        "results",
        format!(
            "{} holds {} results made when the coordinator's EASD defaults were {then:?}; it now has {now:?}, which \
             the variant's unset fields would take: write to another --out, or set the EASD values explicitly",
            config.results.display(),
            variant.label
        ),
    ))
}

fn question_hash(question: &str) -> String {
    hex::encode(&Sha256::digest(question.as_bytes())[..6])
}

async fn run_one<G: Generator>(
    config: &EvalConfig,
    session: &str,
    problem: &Problem,
    variant: &Variant,
    hash: &str,
    generator: &G,
) -> Result<ResultRecord> {
    let seed = config.sampling.seed.wrapping_add(problem.index as u64);
    let request = EvalRequest {
        messages: config.prompt.messages(&problem.question),
        mode: variant.mode,
        sampling: Sampling { seed, ..config.sampling.clone() },
        k: config.k,
        easd: variant.easd.clone(),
        max_tokens: config.max_tokens,
        request_id: format!("eval-{}-{}-{hash}", problem.index, variant.label),
    };
    let mut attempt = 0;
    let (generation, client_wall_s) = loop {
        attempt += 1;
        let started = Instant::now();
        match generator.generate(&request).await {
            Ok(g) => break (g, started.elapsed().as_secs_f64()),
            Err(source) if attempt > config.retries => {
                return Err(Error::Generation {
                    problem: problem.index,
                    mode: variant.label.clone(),
                    attempts: attempt,
                    source,
                });
            }
            Err(_) => {
                let wait = config.retry_backoff_ms.saturating_mul(u64::from(attempt));
                tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
            }
        }
    };
    let answer = extract_answer(&generation.text);
    let predicted = answer.as_ref().map(|a| a.value);
    let correct = matches!((predicted, problem.expected), (Some(p), Some(e)) if answers_match(p, e));
    let (draft_tokens, target_tokens) = generation.summary.token_sources(variant.mode);
    Ok(ResultRecord {
        problem: problem.index,
        variant: variant.label.clone(),
        mode: variant.mode,
        settings: hash.to_string(),
        seed,
        question_hash: question_hash(&problem.question),
        easd: (variant.mode == Mode::Easd).then(|| variant.easd.clone()),
        easd_defaults: config.easd_defaults.clone().filter(|_| variant.mode == Mode::Easd),
        expected: problem.expected,
        predicted,
        predicted_text: answer.as_ref().map(|a| a.text.clone()),
        answer_source: answer.map(|a| a.source),
        correct,
        draft_tokens,
        target_tokens,
        client_wall_s,
        output: generation.text,
        summary: generation.summary,
        session: session.to_string(),
        concurrency: u32::try_from(config.concurrency).unwrap_or(u32::MAX),
        token_ids_sha256: token_ids_sha256(&generation.token_ids),
    })
}

/// "2026-12-03T10:15:02Z-p1234": the start of a run (UTC, seconds) and the process; a second run in the same process
/// gets a ".1", ".2"… suffix.
fn new_session_id() -> String {
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    let mut id = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z-p{}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        std::process::id()
    );
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if run > 0 {
        id.push_str(&format!(".{run}"));
    }
    id
}

/// (year, month, day) of a day count since 1970-01-01 (proleptic Gregorian; H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::error::BoxError;
    use crate::generator::{Generation, GenerationSummary};
    use crate::progress::NoProgress;

    /// Answers "What is A + B?" — right in every mode except `draft` on odd A — and fails every call after `fail_after`.
    struct Fake {
        calls: AtomicUsize,
        fail_after: usize,
        /// Fail the first attempt of every request (to exercise retries).
        flaky: bool,
        seen: Mutex<Vec<EvalRequest>>,
    }

    impl Fake {
        fn new(fail_after: usize) -> Fake {
            Fake { calls: AtomicUsize::new(0), fail_after, flaky: false, seen: Mutex::new(Vec::new()) }
        }
    }

    impl Generator for Fake {
        async fn generate(&self, request: &EvalRequest) -> Result<Generation, BoxError> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            let first_attempt = !self.seen.lock().unwrap().iter().any(|r| r.request_id == request.request_id);
            self.seen.lock().unwrap().push(request.clone());
            if call >= self.fail_after {
                return Err("coordinator unavailable".into());
            }
            if self.flaky && first_attempt {
                return Err("transient".into());
            }
            let text = &request.messages.last().unwrap().content;
            let q = text.rsplit("Question: ").next().unwrap();
            let nums: Vec<f64> = q.split(|c: char| !c.is_ascii_digit()).filter_map(|s| s.parse().ok()).collect();
            let wrong = request.mode == Mode::Draft && nums[0] as u64 % 2 == 1;
            let answer = nums.iter().sum::<f64>() + if wrong { 1.0 } else { 0.0 };
            Ok(Generation {
                text: format!("Adding them gives {answer}.\nThe answer is {answer}."),
                token_ids: answer.to_string().bytes().map(u32::from).collect(),
                summary: GenerationSummary {
                    generated_tokens: 12,
                    wall_s: 0.1,
                    finish_reason: "stop".into(),
                    ..GenerationSummary::default()
                },
            })
        }
    }

    fn setup(problems: usize) -> (tempfile::TempDir, EvalConfig) {
        let dir = tempfile::tempdir().unwrap();
        let dataset = dir.path().join("bench.jsonl");
        let lines: Vec<String> = (0..problems)
            .map(|i| {
                format!("{{\"question\": \"What is {i} + 3?\", \"answer\": \"{i} + 3 = {}\\n#### {}\"}}", i + 3, i + 3)
            })
            .collect();
        std::fs::write(&dataset, lines.join("\n") + "\n").unwrap();
        let config = EvalConfig::new(&dataset, dir.path().join("out/results.jsonl"));
        (dir, config)
    }

    #[tokio::test]
    async fn an_interrupted_run_resumes_without_repeating_work() {
        let (_dir, mut config) = setup(5);
        config.retries = 0;
        let failing = Fake::new(7);
        let err = run_eval(&config, &failing, &NoProgress).await.unwrap_err();
        assert!(err.to_string().contains("coordinator unavailable"), "{err}");
        assert_eq!(crate::results::read_results(&config.results).unwrap().len(), 7);

        let working = Fake::new(usize::MAX);
        let run = run_eval(&config, &working, &NoProgress).await.unwrap();
        assert_eq!((run.resumed, run.generated, run.records.len()), (7, 13, 20));
        assert_eq!(working.calls.load(Ordering::SeqCst), 13);
        let mut keys: Vec<_> = run.records.iter().map(|r| r.key()).collect();
        keys.dedup();
        assert_eq!(keys.len(), 20);
        // draft is wrong on odd problems (1, 3), every other mode always right.
        assert_eq!(run.records.iter().filter(|r| r.correct).count(), 18);

        let again = run_eval(&config, &working, &NoProgress).await.unwrap();
        assert_eq!((again.resumed, again.generated), (20, 0));
    }

    #[tokio::test]
    async fn each_run_stamps_its_session_concurrency_and_token_hash_on_its_lines() {
        let (_dir, mut config) = setup(2);
        config.retries = 0;
        assert!(run_eval(&config, &Fake::new(3), &NoProgress).await.is_err());
        config.session = Some("second".into());
        config.concurrency = 2;
        let run = run_eval(&config, &Fake::new(usize::MAX), &NoProgress).await.unwrap();
        let stored = crate::results::read_results(&config.results).unwrap();
        let (first, second) = stored.split_at(3);
        assert!(first.iter().all(|r| r.session == first[0].session && r.concurrency == 1));
        assert!(first[0].session.contains(&format!("Z-p{}", std::process::id())), "{}", first[0].session);
        assert!(second.iter().all(|r| r.session == "second" && r.concurrency == 2));
        // Same answer, same ids: the target and sd lines of a problem share the hash; draft is wrong on problem 1.
        let line = |p: usize, m: Mode| run.records.iter().find(|r| r.problem == p && r.mode == m).unwrap();
        for p in 0..2 {
            assert!(!line(p, Mode::Target).token_ids_sha256.is_empty());
            assert_eq!(line(p, Mode::Target).token_ids_sha256, line(p, Mode::Sd).token_ids_sha256);
        }
        assert_ne!(line(1, Mode::Target).token_ids_sha256, line(1, Mode::Draft).token_ids_sha256);
    }

    #[tokio::test]
    async fn stored_results_report_what_is_there_and_count_what_is_missing() {
        let (_dir, config) = setup(3);
        let target = config.clone().with_modes(&[Mode::Target], &EasdSettings::default());
        run_eval(&target, &Fake::new(usize::MAX), &NoProgress).await.unwrap();
        let both = config.with_modes(&[Mode::Target, Mode::Sd], &EasdSettings::default());
        let (records, missing) = stored_results(&both).unwrap();
        assert_eq!((records.len(), missing), (3, 3));
        assert!(records.iter().all(|r| r.mode == Mode::Target));
    }

    #[test]
    fn session_ids_name_the_utc_start_time() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_790), (2026, 12, 3));
        assert_ne!(new_session_id(), new_session_id());
    }

    #[tokio::test]
    async fn results_of_another_dataset_are_refused() {
        let (_dir, config) = setup(2);
        let fake = Fake::new(usize::MAX);
        run_eval(&config, &fake, &NoProgress).await.unwrap();
        std::fs::write(&config.dataset, "{\"question\": \"What is 9 + 9?\", \"answer\": \"#### 18\"}\n").unwrap();
        let err = run_eval(&config, &fake, &NoProgress).await.unwrap_err().to_string();
        assert!(err.contains("another dataset"), "{err}");
    }

    #[tokio::test]
    async fn changed_settings_are_not_taken_from_the_old_results() {
        let (_dir, mut config) = setup(2);
        let fake = Fake::new(usize::MAX);
        run_eval(&config, &fake, &NoProgress).await.unwrap();
        config.max_tokens = 2048;
        let run = run_eval(&config, &fake, &NoProgress).await.unwrap();
        assert_eq!((run.resumed, run.generated, run.records.len()), (0, 8, 8));
        assert_eq!(crate::results::read_results(&config.results).unwrap().len(), 16);
    }

    #[tokio::test]
    async fn easd_results_made_under_other_coordinator_defaults_are_refused() {
        let (_dir, mut config) = setup(2);
        let defaults =
            EasdSettings { top_n: Some(5), rho: Some(0.6), tau_draft: Some(0.81), ..EasdSettings::default() };
        config.easd_defaults = Some(defaults.clone());
        let fake = Fake::new(usize::MAX);
        run_eval(&config, &fake, &NoProgress).await.unwrap();
        let stored = crate::results::read_results(&config.results).unwrap();
        let easd = stored.iter().find(|r| r.mode == Mode::Easd).unwrap();
        assert_eq!(easd.easd_defaults.as_ref(), Some(&defaults));
        assert!(stored.iter().filter(|r| r.mode != Mode::Easd).all(|r| r.easd_defaults.is_none()));

        // Same defaults, or unknown ones: resumed.
        assert_eq!(run_eval(&config, &fake, &NoProgress).await.unwrap().resumed, 8);
        config.easd_defaults = None;
        assert_eq!(run_eval(&config, &fake, &NoProgress).await.unwrap().resumed, 8);

        // A default the variant leaves unset moved: refused, naming the file and the variant.
        config.easd_defaults = Some(EasdSettings { tau_draft: Some(0.45), ..defaults.clone() });
        let err = run_eval(&config, &fake, &NoProgress).await.unwrap_err().to_string();
        assert!(err.contains("easd results") && err.contains("0.45"), "{err}");

        // The same move under a variant that sets τ_draft itself changes nothing it used: resumed.
        let explicit = EasdSettings { tau_draft: Some(0.3), ..EasdSettings::default() };
        let mut config = config.with_modes(&[Mode::Easd], &explicit);
        config.easd_defaults = Some(defaults);
        run_eval(&config, &fake, &NoProgress).await.unwrap();
        config.easd_defaults =
            Some(EasdSettings { tau_draft: Some(0.45), top_n: Some(5), rho: Some(0.6), ..Default::default() });
        assert_eq!(run_eval(&config, &fake, &NoProgress).await.unwrap().resumed, 2);
    }

    #[tokio::test]
    async fn every_mode_gets_the_same_prompt_seed_and_sampling() {
        let (_dir, mut config) = setup(3);
        config.sampling.seed = 100;
        config.sampling.temperature = 0.7;
        config.concurrency = 4;
        config.offset = 1;
        let fake = Fake::new(usize::MAX);
        let run = run_eval(&config, &fake, &NoProgress).await.unwrap();
        assert_eq!(run.records.len(), 8);
        let seen = fake.seen.lock().unwrap();
        for problem in 1..3u64 {
            let same: Vec<&EvalRequest> = seen.iter().filter(|r| r.sampling.seed == 100 + problem).collect();
            assert_eq!(same.len(), 4);
            assert!(same.iter().all(|r| r.messages == same[0].messages && r.sampling.temperature == 0.7));
            let modes: Vec<Mode> = same.iter().map(|r| r.mode).collect();
            assert!(Mode::ALL.iter().all(|m| modes.contains(m)));
        }
        // Records come back in (problem, variant) order whatever the completion order.
        let order: Vec<(usize, Mode)> = run.records.iter().map(|r| (r.problem, r.mode)).collect();
        assert_eq!(order[..4], [(1, Mode::Draft), (1, Mode::Target), (1, Mode::Sd), (1, Mode::Easd)]);
    }

    #[tokio::test]
    async fn a_transient_failure_is_retried() {
        let (_dir, mut config) = setup(1);
        config.retries = 1;
        config.retry_backoff_ms = 0;
        let mut fake = Fake::new(usize::MAX);
        fake.flaky = true;
        let run = run_eval(&config, &fake, &NoProgress).await.unwrap();
        assert_eq!((run.generated, fake.calls.load(Ordering::SeqCst)), (4, 8));
    }

    #[test]
    fn invalid_configs_name_the_field() {
        let (dir, mut config) = setup(1);
        std::fs::write(&config.dataset, "{\"question\": \"no answer\"}\n").unwrap();
        let err = futures::executor::block_on(run_eval(&config, &Fake::new(0), &NoProgress)).unwrap_err();
        assert!(err.to_string().contains("problem 0 has no"), "{err}");
        config.offset = 5;
        let err = futures::executor::block_on(run_eval(&config, &Fake::new(0), &NoProgress)).unwrap_err();
        assert!(err.to_string().contains("no problem"), "{err}");
        drop(dir);
        let (_dir, mut config) = setup(1);
        config.concurrency = 0;
        assert!(config.validate().unwrap_err().to_string().contains("concurrency"));
        let (_dir, config) = setup(1);
        let mut config = config.with_modes(&[Mode::Sd], &EasdSettings::default());
        config.variants.push(config.variants[0].clone());
        assert!(config.validate().unwrap_err().to_string().contains("twice"));
    }
}
