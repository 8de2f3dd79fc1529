//! The results file: one JSON line per (problem, variant), appended as each generation finishes.
//!
//! Resumable: a line is keyed by (problem index, variant label, settings hash) and a rerun skips keys already present.
//! A crash mid-write leaves at most a partial last line (no trailing newline); opening the file for appending cuts it
//! off, so the next line starts clean. Any other unreadable line is an error naming it — silently dropping results
//! would bias the report.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::extract::AnswerSource;
use crate::generator::{EasdSettings, GenerationSummary, Mode};

/// One generation, scored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultRecord {
    /// Index of the problem in the benchmark file.
    pub problem: usize,
    /// Variant label: the mode name, or a sweep point such as `easd-p90-rho0.6-n5`.
    pub variant: String,
    pub mode: Mode,
    /// Hash of everything that shapes the output (see [`crate::run::Variant::settings_hash`]).
    pub settings: String,
    pub seed: u64,
    /// Hex prefix of the SHA-256 of the question text: guards against reusing results of another dataset.
    #[serde(default)]
    pub question_hash: String,
    /// The EASD settings sent (`easd` mode only; unset fields took the coordinator's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub easd: Option<EasdSettings>,
    /// The coordinator's EASD defaults when this ran (`easd` mode, when known): what the unset fields of `easd` took.
    /// The settings hash covers only `easd`, so resuming checks these against the coordinator's current defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub easd_defaults: Option<EasdSettings>,
    pub expected: Option<f64>,
    pub predicted: Option<f64>,
    /// The number as written in the output.
    pub predicted_text: Option<String>,
    pub answer_source: Option<AnswerSource>,
    pub correct: bool,
    /// Tokens from the draft / from the target (see [`GenerationSummary::token_sources`]).
    pub draft_tokens: u32,
    pub target_tokens: u32,
    /// Wall time measured by the harness around the whole call (includes the network), seconds.
    pub client_wall_s: f64,
    /// The full output, kept so answers can be re-extracted without regenerating.
    pub output: String,
    pub summary: GenerationSummary,
    /// The run (one `easd eval` / `easd sweep` invocation, see [`crate::EvalConfig::session`]) that made this line.
    /// Speeds are comparable only within one session: machine load differs between them. Empty in files written
    /// before sessions were recorded.
    #[serde(default)]
    pub session: String,
    /// Requests in flight at once in that session (0: not recorded).
    #[serde(default)]
    pub concurrency: u32,
    /// Hex of the first 16 bytes of the SHA-256 of the generated token ids (little-endian u32 each): two lines with
    /// the same value emitted the same tokens. Empty when the backend sent no ids.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token_ids_sha256: String,
}

/// The value of [`ResultRecord::token_ids_sha256`] for `ids`; empty for no ids.
pub fn token_ids_sha256(ids: &[u32]) -> String {
    if ids.is_empty() {
        return String::new();
    }
    let mut hasher = Sha256::new();
    for id in ids {
        hasher.update(id.to_le_bytes());
    }
    hex::encode(&hasher.finalize()[..16])
}

impl ResultRecord {
    pub fn key(&self) -> (usize, String, String) {
        (self.problem, self.variant.clone(), self.settings.clone())
    }
}

/// Reads every complete record of a results file; a missing file is an empty list. A partial last line is ignored.
pub fn read_results(path: &Path) -> Result<Vec<ResultRecord>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(path)(e)),
    };
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    let mut records = Vec::new();
    for (i, line) in complete.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(line).map_err(|e| Error::Dataset {
            path: path.to_path_buf(),
            line: i + 1,
            reason: format!("unreadable result record: {e}"),
        })?;
        records.push(record);
    }
    Ok(records)
}

/// An open results file: what is already done, and an appender for new records.
pub struct ResultsFile {
    path: PathBuf,
    file: File,
    /// Key → index in `records` of the done records.
    done: HashMap<(usize, String, String), usize>,
    records: Vec<ResultRecord>,
}

impl ResultsFile {
    /// Opens (creating parent folders and the file if needed) and loads the done set, cutting a partial last line.
    pub fn open(path: &Path) -> Result<ResultsFile> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(Error::io(parent))?;
        }
        let records = read_results(path)?;
        let file = OpenOptions::new().create(true).read(true).append(true).open(path).map_err(Error::io(path))?;
        let len = file.metadata().map_err(Error::io(path))?.len();
        let complete_len = complete_prefix_len(path)?;
        if complete_len < len {
            file.set_len(complete_len).map_err(Error::io(path))?;
        }
        let done = records.iter().enumerate().map(|(i, r)| (r.key(), i)).collect();
        Ok(ResultsFile { path: path.to_path_buf(), file, done, records })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_done(&self, problem: usize, variant: &str, settings: &str) -> bool {
        self.done.contains_key(&(problem, variant.to_string(), settings.to_string()))
    }

    /// The record stored under a done key.
    pub fn record(&self, problem: usize, variant: &str, settings: &str) -> Option<&ResultRecord> {
        self.done.get(&(problem, variant.to_string(), settings.to_string())).map(|&i| &self.records[i])
    }

    /// Every record in the file (loaded and appended).
    pub fn records(&self) -> &[ResultRecord] {
        &self.records
    }

    /// Appends one record as one line and flushes it, so an interruption loses at most the line being written.
    pub fn append(&mut self, record: ResultRecord) -> Result<()> {
        let mut line =
            serde_json::to_string(&record).map_err(|source| Error::Json { path: self.path.clone(), source })?;
        line.push('\n');
        self.file.write_all(line.as_bytes()).and_then(|()| self.file.flush()).map_err(Error::io(&self.path))?;
        self.done.insert(record.key(), self.records.len());
        self.records.push(record);
        Ok(())
    }
}

/// Length of the file up to and including its last newline.
fn complete_prefix_len(path: &Path) -> Result<u64> {
    let bytes = std::fs::read(path).map_err(Error::io(path))?;
    Ok(bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i as u64 + 1))
}

#[cfg(test)]
impl ResultRecord {
    /// A correct answer ("1") to `problem` by `variant` (its mode read from the name: target, easd, else sd) in
    /// session "s", for the crate's tests to adjust.
    pub(crate) fn example(problem: usize, variant: &str) -> ResultRecord {
        ResultRecord {
            problem,
            variant: variant.to_string(),
            mode: match variant {
                "target" => Mode::Target,
                "easd" => Mode::Easd,
                _ => Mode::Sd,
            },
            settings: "abc".into(),
            seed: problem as u64,
            question_hash: "q".into(),
            easd: None,
            easd_defaults: None,
            expected: Some(1.0),
            predicted: Some(1.0),
            predicted_text: Some("1".into()),
            answer_source: Some(AnswerSource::Phrase),
            correct: true,
            draft_tokens: 3,
            target_tokens: 1,
            client_wall_s: 0.5,
            output: "The answer is 1.".into(),
            summary: GenerationSummary::default(),
            session: "s".into(),
            concurrency: 1,
            token_ids_sha256: token_ids_sha256(&[1, 2, 3]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(problem: usize, variant: &str) -> ResultRecord {
        ResultRecord { mode: Mode::Sd, ..ResultRecord::example(problem, variant) }
    }

    #[test]
    fn token_hashes_tell_equal_id_sequences_from_different_ones() {
        let h = token_ids_sha256(&[1, 2, 3]);
        assert_eq!(h.len(), 32);
        assert_eq!(h, token_ids_sha256(&[1, 2, 3]));
        assert_ne!(h, token_ids_sha256(&[1, 2, 4]));
        assert_ne!(h, token_ids_sha256(&[1, 2]));
        // Not a hash of the text: ids 1 and 256 differ in their bytes, not only in value.
        assert_ne!(token_ids_sha256(&[256]), token_ids_sha256(&[1, 0]));
        assert_eq!(token_ids_sha256(&[]), "");
    }

    #[test]
    fn lines_written_before_sessions_were_recorded_still_read() {
        let mut value = serde_json::to_value(record(0, "sd")).unwrap();
        let object = value.as_object_mut().unwrap();
        for field in ["session", "concurrency", "token_ids_sha256"] {
            object.remove(field);
        }
        let old: ResultRecord = serde_json::from_value(value).unwrap();
        assert_eq!((old.session.as_str(), old.concurrency, old.token_ids_sha256.as_str()), ("", 0, ""));
    }

    #[test]
    fn appended_records_read_back_and_count_as_done() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/results.jsonl");
        let mut file = ResultsFile::open(&path).unwrap();
        file.append(record(0, "sd")).unwrap();
        file.append(record(1, "sd")).unwrap();
        drop(file);
        let file = ResultsFile::open(&path).unwrap();
        assert!(file.is_done(1, "sd", "abc"));
        assert!(!file.is_done(1, "sd", "other-settings"));
        assert!(!file.is_done(2, "sd", "abc"));
        assert_eq!(read_results(&path).unwrap(), vec![record(0, "sd"), record(1, "sd")]);
    }

    #[test]
    fn a_partial_last_line_is_ignored_and_cut_before_appending() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.jsonl");
        let full = serde_json::to_string(&record(0, "sd")).unwrap();
        let partial = &serde_json::to_string(&record(1, "sd")).unwrap()[..40];
        std::fs::write(&path, format!("{full}\n{partial}")).unwrap();
        assert_eq!(read_results(&path).unwrap().len(), 1);
        let mut file = ResultsFile::open(&path).unwrap();
        assert!(!file.is_done(1, "sd", "abc"));
        file.append(record(1, "sd")).unwrap();
        assert_eq!(read_results(&path).unwrap(), vec![record(0, "sd"), record(1, "sd")]);
    }

    #[test]
    fn a_corrupt_line_in_the_middle_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.jsonl");
        let full = serde_json::to_string(&record(0, "sd")).unwrap();
        std::fs::write(&path, format!("{full}\nnot json\n{full}\n")).unwrap();
        let err = read_results(&path).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
    }
}
