//! Benchmark files: JSONL with a `question` and (for scoring) a GSM8K-style `answer` ending in `#### N`.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::extract::reference_answer;

/// One benchmark problem.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    /// 0-based line index of the problem in its file (blank lines not counted): the key results are stored under.
    pub index: usize,
    pub question: String,
    /// The dataset's full answer text (the worked solution), when present.
    pub answer: Option<String>,
    /// The reference value after `####`, when present.
    pub expected: Option<f64>,
}

#[derive(Deserialize)]
struct Line {
    question: String,
    #[serde(default)]
    answer: Option<String>,
}

/// Reads every problem of a JSONL file. A line without `question`, or that is not JSON, is an error naming the line.
pub fn load_problems(path: &Path) -> Result<Vec<Problem>> {
    let text = std::fs::read_to_string(path).map_err(Error::io(path))?;
    let mut out = Vec::new();
    for (line_no, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Line = serde_json::from_str(line).map_err(|e| Error::Dataset {
            path: path.to_path_buf(),
            line: line_no + 1,
            reason: e.to_string(),
        })?;
        let expected = parsed.answer.as_deref().and_then(reference_answer);
        out.push(Problem { index: out.len(), question: parsed.question, answer: parsed.answer, expected });
    }
    Ok(out)
}

/// The problems `offset..offset + limit` (all from `offset` when `limit` is `None`).
pub fn slice(problems: Vec<Problem>, offset: usize, limit: Option<usize>) -> Vec<Problem> {
    let take = limit.unwrap_or(usize::MAX);
    problems.into_iter().skip(offset).take(take).collect()
}

/// A GSM8K worked solution as natural text: calculator annotations `<<48/2=24>>` removed and the final `#### N`
/// turned into "The answer is N." — what a model's answer looks like, for teacher-forced calibration.
pub fn solution_text(answer: &str) -> String {
    let mut out = String::with_capacity(answer.len());
    let mut rest = answer;
    while let Some(start) = rest.find("<<") {
        match rest[start..].find(">>") {
            Some(end) => {
                out.push_str(&rest[..start]);
                rest = &rest[start + end + 2..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    match out.rfind("####") {
        Some(i) => {
            let value = out[i + 4..].trim().to_string();
            out.truncate(i);
            format!("{}\nThe answer is {value}.", out.trim_end())
        }
        None => out,
    }
}

/// `count` distinct indices from `0..n` chosen by a seeded shuffle (SplitMix64), in ascending order.
pub fn sample_indices(n: usize, count: usize, seed: u64) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    let mut state = seed;
    let count = count.min(n);
    for i in 0..count {
        let r = splitmix64(&mut state);
        let j = i + (r % (n - i) as u64) as usize;
        all.swap(i, j);
    }
    let mut chosen = all[..count].to_vec();
    chosen.sort_unstable();
    chosen
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gsm8k_lines_load_with_their_reference_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.jsonl");
        std::fs::write(
            &path,
            "{\"question\": \"q1\", \"answer\": \"a <<1+1=2>>2\\n#### 2\"}\n\n{\"question\": \"q2\"}\n",
        )
        .unwrap();
        let problems = load_problems(&path).unwrap();
        assert_eq!(problems.len(), 2);
        assert_eq!(problems[0].expected, Some(2.0));
        assert_eq!((problems[1].index, problems[1].expected), (1, None));
        assert_eq!(slice(problems, 1, Some(5)).len(), 1);
    }

    #[test]
    fn a_bad_line_is_reported_with_its_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.jsonl");
        std::fs::write(&path, "{\"question\": \"q1\"}\n{\"answer\": \"x\"}\n").unwrap();
        let err = load_problems(&path).unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("question"), "{err}");
    }

    #[test]
    fn solutions_lose_calculator_annotations_and_end_in_a_sentence() {
        let text = solution_text("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72");
        assert_eq!(text, "Natalia sold 48/2 = 24 clips in May.\nThe answer is 72.");
    }

    #[test]
    fn samples_are_distinct_sorted_and_reproducible() {
        let a = sample_indices(100, 10, 7);
        assert_eq!(a, sample_indices(100, 10, 7));
        assert_ne!(a, sample_indices(100, 10, 8));
        assert!(a.windows(2).all(|w| w[0] < w[1]) && a.len() == 10 && a[9] < 100);
        assert_eq!(sample_indices(3, 10, 1), vec![0, 1, 2]);
    }
}
