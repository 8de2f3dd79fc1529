//! Final-answer extraction from free-form model output (GSM8K style).
//!
//! Order of preference, each taking its *last* occurrence: a LaTeX `\boxed{…}`, a GSM8K-style `#### N`, an answer
//! phrase ("the answer is", "final answer", "answer:"), and finally the last number anywhere in the text (what the
//! usual "flexible" GSM8K scoring does). Numbers may carry a sign, a currency sign, thousands separators
//! (`1,234` — a comma followed by exactly three digits) and decimals; trailing units are ignored. Values are compared
//! numerically, so `42`, `42.0` and `$42.00` all match a reference of `42`.

use serde::{Deserialize, Serialize};

/// Where in the output the answer was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerSource {
    Boxed,
    Hashes,
    Phrase,
    LastNumber,
}

/// A numeric answer found in a model's output.
#[derive(Clone, Debug, PartialEq)]
pub struct ExtractedAnswer {
    pub value: f64,
    /// The number as written (sign, digits, separators), for the results file and debugging.
    pub text: String,
    pub source: AnswerSource,
}

/// Phrases after which the final answer follows, lower case.
const ANSWER_PHRASES: [&str; 4] = ["answer is", "final answer", "answer:", "answer ="];

/// Finds the final numeric answer in `output`, or `None` when it contains no number at all.
pub fn extract_answer(output: &str) -> Option<ExtractedAnswer> {
    // LaTeX thousands separators (`1{,}234`) would otherwise split the number.
    let text = output.replace("{,}", ",");
    let found = |source, hit: Option<NumberHit>| hit.map(|h| ExtractedAnswer { value: h.value, text: h.text, source });
    found(AnswerSource::Boxed, boxed(&text))
        .or_else(|| found(AnswerSource::Hashes, after_hashes(&text)))
        .or_else(|| found(AnswerSource::Phrase, after_phrase(&text)))
        .or_else(|| found(AnswerSource::LastNumber, numbers(&text).pop()))
}

/// The reference value of a GSM8K `answer` field: the number after its last `####`.
pub fn reference_answer(answer_field: &str) -> Option<f64> {
    after_hashes(answer_field).map(|h| h.value)
}

/// Numeric equality with a relative tolerance of 1e-6 (so `42 == 42.0`, and `0.1 + 0.2` matches `0.3`).
pub fn answers_match(predicted: f64, reference: f64) -> bool {
    (predicted - reference).abs() <= 1e-6 * reference.abs().max(1.0)
}

/// The first number in `s`.
pub fn parse_number(s: &str) -> Option<f64> {
    numbers(s).into_iter().next().map(|h| h.value)
}

#[derive(Clone, Debug, PartialEq)]
struct NumberHit {
    value: f64,
    text: String,
}

/// The content of the last `\boxed{…}` (braces matched) that holds a number; fractions `\frac{a}{b}` and `a/b` count.
fn boxed(text: &str) -> Option<NumberHit> {
    let mut best = None;
    let mut from = 0;
    while let Some(i) = text[from..].find("\\boxed{") {
        let start = from + i + "\\boxed{".len();
        from = start;
        let mut depth = 1usize;
        let mut end = None;
        for (j, c) in text[start..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(start + j);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        let content = &text[start..end];
        if let Some(hit) = fraction(content).or_else(|| numbers(content).pop()) {
            best = Some(hit);
        }
    }
    best
}

/// `\frac{a}{b}` / `\dfrac{a}{b}` / `a/b` as the whole answer.
fn fraction(content: &str) -> Option<NumberHit> {
    let stripped: String = content.chars().filter(|c| !c.is_whitespace()).collect();
    let (num, den) = if let Some(rest) = stripped.strip_prefix("\\frac{").or_else(|| stripped.strip_prefix("\\dfrac{"))
    {
        let (a, b) = rest.split_once("}{")?;
        (a.to_string(), b.strip_suffix('}')?.to_string())
    } else {
        let (a, b) = stripped.split_once('/')?;
        (a.to_string(), b.to_string())
    };
    let (a, b) = (single_number(&num)?, single_number(&den)?);
    (b != 0.0).then(|| NumberHit { value: a / b, text: format!("{num}/{den}") })
}

/// `s` must be exactly one number (nothing else but `$`).
fn single_number(s: &str) -> Option<f64> {
    let hits = numbers(s);
    let [hit] = hits.as_slice() else { return None };
    (hit.text == s.replace('$', "")).then_some(hit.value)
}

/// The first number after the last `####` that is followed by one.
fn after_hashes(text: &str) -> Option<NumberHit> {
    text.rmatch_indices("####").find_map(|(i, _)| first_number_on_line(&text[i + 4..]))
}

/// The number after the last answer phrase that is followed by one (same line, or the next non-empty line when the
/// phrase ends its line, as in "The final answer is:\n\n$$18$$").
fn after_phrase(text: &str) -> Option<NumberHit> {
    let lower = text.to_lowercase();
    // Lowercasing can change byte lengths for some scripts; fall back to the original when it does.
    let haystack = if lower.len() == text.len() { &lower } else { text };
    let mut hits: Vec<usize> =
        ANSWER_PHRASES.iter().flat_map(|p| haystack.match_indices(p).map(|(i, m)| i + m.len())).collect();
    hits.sort_unstable();
    hits.into_iter().rev().find_map(|end| first_number_on_line(&text[end..]))
}

/// The first number on the first non-empty line of `s`.
fn first_number_on_line(s: &str) -> Option<NumberHit> {
    let line = s.split('\n').find(|l| l.chars().any(|c| c.is_alphanumeric()))?;
    numbers(line).into_iter().next()
}

/// Every number in `s`, in order.
fn numbers(s: &str) -> Vec<NumberHit> {
    let chars: Vec<(usize, char)> = s.char_indices().collect();
    let at = |k: usize| chars.get(k).map(|&(_, c)| c);
    let digit_at = |k: usize| at(k).is_some_and(|c| c.is_ascii_digit());
    let mut out = Vec::new();
    let mut k = 0;
    while k < chars.len() {
        let prev = k.checked_sub(1).and_then(at);
        // A number never starts in the middle of a word or another number ("x2"; in "10-4" there is no -4).
        let boundary = prev.is_none_or(|p| !(p.is_alphanumeric() || p == '.' || p == ')'));
        let (negative, mut j) = match at(k) {
            Some('-' | '−') if boundary => (true, k + 1),
            Some('$') => (false, k + 1),
            Some(_) if boundary => (false, k),
            _ => (false, usize::MAX),
        };
        if negative && at(j) == Some('$') {
            j += 1;
        }
        if j == usize::MAX || !(digit_at(j) || (at(j) == Some('.') && digit_at(j + 1))) {
            k += 1;
            continue;
        }
        let first = j;
        let mut digits = String::new();
        while digit_at(j) {
            digits.push(chars[j].1);
            j += 1;
        }
        // Thousands groups: a comma followed by exactly three digits.
        while at(j) == Some(',') && (1..=3).all(|d| digit_at(j + d)) && !digit_at(j + 4) && !digits.is_empty() {
            for d in 1..=3 {
                digits.push(chars[j + d].1);
            }
            j += 4;
        }
        if at(j) == Some('.') && digit_at(j + 1) {
            digits.push('.');
            j += 1;
            while digit_at(j) {
                digits.push(chars[j].1);
                j += 1;
            }
        }
        if let Ok(v) = digits.parse::<f64>() {
            let end = chars.get(j).map_or(s.len(), |&(b, _)| b);
            let sign = if negative { "-" } else { "" };
            out.push(NumberHit {
                value: if negative { -v } else { v },
                text: format!("{sign}{}", &s[chars[first].0..end]),
            });
        }
        k = j.max(k + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outputs in the shapes the Qwen2.5 instruct models (and others) produce on GSM8K, with the value a grader
    /// should read. `None`: no number at all.
    const TABLE: &[(&str, Option<f64>, AnswerSource)] = &[
        ("Natalia sold 48/2 = 24 clips in May.\nAltogether 48 + 24 = 72.\n#### 72", Some(72.0), AnswerSource::Hashes),
        ("So the total is $1,234.50.\n\nThe answer is $1,234.50.", Some(1234.5), AnswerSource::Phrase),
        (
            "Step 1: 3 * 4 = 12\nStep 2: 12 + 6 = 18\n\nThe final answer is $\\boxed{18}$.",
            Some(18.0),
            AnswerSource::Boxed,
        ),
        ("Therefore, Weng earned \\(\\boxed{\\$10}\\).", Some(10.0), AnswerSource::Boxed),
        ("The temperature dropped to -5 degrees, so the answer is -5.", Some(-5.0), AnswerSource::Phrase),
        ("She has 5 apples and buys 3 more, so she has 8 apples.", Some(8.0), AnswerSource::LastNumber),
        ("I cannot determine this from the information given.", None, AnswerSource::LastNumber),
        ("**Answer:** 42 km", Some(42.0), AnswerSource::Phrase),
        ("The final answer is:\n\n$$\n\\boxed{1{,}080}\n$$", Some(1080.0), AnswerSource::Boxed),
        ("Total cost: 3 x $2.50 = $7.50\nChange: $10 - $7.50 = $2.50", Some(2.5), AnswerSource::LastNumber),
        ("The answer is 0.75, i.e. 75% of the cake.", Some(0.75), AnswerSource::Phrase),
        ("She needs \\boxed{\\frac{3}{4}} of a cup.", Some(0.75), AnswerSource::Boxed),
        ("10-4 = 6 so 6 remain. #### 6", Some(6.0), AnswerSource::Hashes),
        ("First answer: 12 was wrong; recomputing, 3 * 5 = 15.\nThe answer is 15.", Some(15.0), AnswerSource::Phrase),
        ("It takes 1,000,000 steps.", Some(1_000_000.0), AnswerSource::LastNumber),
        ("Numbers 1, 234 and 5 add to 240.", Some(240.0), AnswerSource::LastNumber),
        ("The answer is: \\boxed{}.\nSo 7 in total.", Some(7.0), AnswerSource::LastNumber),
        ("```python\nprint(3*4)\n```\nOutput: 12\n\nSo the answer is 12 dollars.", Some(12.0), AnswerSource::Phrase),
        ("x = −3 after the drop", Some(-3.0), AnswerSource::LastNumber),
        ("He pays .5 dollars per pen", Some(0.5), AnswerSource::LastNumber),
    ];

    /// Qwen2.5-Coder-1.5B-Instruct (Q4_K_M), greedy, default prompt, on GSM8K train problem 0 (reference 72).
    const REAL_TARGET_PROBLEM_0: &str = "To solve this problem, we need to follow these steps:\n\n1. Determine how many clips Natalia sold in May.\n2. Add the number of clips sold in April to the number of clips sold in May to get the total.\n\nFirst, we know that Natalia sold 48 clips in April. In May, she sold half as many clips as she did in April. Therefore, we calculate the number of clips sold in May as follows:\n\\[\n\\text{Clips sold in May} = \\frac{48}{2} = 24\n\\]\n\nNext, we add the number of clips sold in April to the number of clips sold in May to find the total number of clips sold:\n\\[\n\\text{Total clips sold} = 48 + 24 = 72\n\\]\n\nThe answer is \\(\\boxed{72}\\).";

    /// Same model, problem 1 (reference 10): a code block containing the prompt's own "The answer is N" template.
    const REAL_TARGET_PROBLEM_1: &str = "To solve this problem, we need to follow these steps:\n\n1. Convert the time Weng babysat from minutes to hours.\n2. Multiply the time in hours by her hourly wage to find out how much she earned.\n\nLet's do this step by step using Python code.\n```python\n# Step 1: Convert minutes to hours\ntime_minutes = 50\ntime_hours = time_minutes / 60\n\n# Step 2: Calculate the earnings\nhourly_wage = 12\nearnings = time_hours * hourly_wage\n\n# The answer is N\nprint(earnings)\n```\n```output\n10.0\n```\nWeng earned \\(\\boxed{10}\\) dollars.";

    /// Same model, problem 2 (reference 5): a wrong answer, which must be read as written (55).
    const REAL_TARGET_PROBLEM_2: &str = "To determine how much more money Betty needs to buy the wallet, we will follow these steps:\n\n1. Calculate the total amount of money Betty's parents gave her.\n2. Calculate the total amount of money Betty's grandparents gave her.\n3. Add the amounts given by her parents and grandparents to find the total amount of money Betty has now.\n4. Subtract the total amount of money Betty has from the cost of the wallet to find out how much more money she needs.\n\nLet's start with the first step:\n\n1. Betty's parents gave her $15.\n2. Betty's grandparents gave her twice as much as her parents, so we calculate:\n   \\[\n   2 \\times 15 = 30\n   \\]\n3. Now, we add the amounts given by her parents and grandparents to find the total amount of money Betty has:\n   \\[\n   15 + 30 = 45\n   \\]\n4. The cost of the wallet is $100. To find out how much more money Betty needs, we subtract the total amount of money she has from the cost of the wallet:\n   \\[\n   100 - 45 = 55\n   \\]\n\nTherefore, the answer is \\(\\boxed{55}\\).";

    #[test]
    fn real_model_outputs_are_read() {
        for (output, value) in
            [(REAL_TARGET_PROBLEM_0, 72.0), (REAL_TARGET_PROBLEM_1, 10.0), (REAL_TARGET_PROBLEM_2, 55.0)]
        {
            let got = extract_answer(output).unwrap();
            assert_eq!((got.value, got.source), (value, AnswerSource::Boxed));
        }
        // Without the box, problem 1's phrase "The answer is N" (no number) must not capture the code's numbers.
        let unboxed = REAL_TARGET_PROBLEM_1.replace("\\(\\boxed{10}\\)", "10");
        let got = extract_answer(&unboxed).unwrap();
        assert_eq!((got.value, got.source), (10.0, AnswerSource::LastNumber));
    }

    #[test]
    fn the_extractor_reads_every_answer_in_the_table() {
        for (output, expected, source) in TABLE {
            let got = extract_answer(output);
            match expected {
                None => assert_eq!(got, None, "output {output:?}"),
                Some(v) => {
                    let got = got.unwrap_or_else(|| panic!("no answer in {output:?}"));
                    assert!(answers_match(got.value, *v), "output {output:?}: got {got:?}, want {v}");
                    assert_eq!(got.source, *source, "output {output:?}");
                }
            }
        }
    }

    #[test]
    fn reference_answers_come_from_after_the_last_hashes() {
        assert_eq!(reference_answer("48/2 = <<48/2=24>>24\n#### 72"), Some(72.0));
        assert_eq!(reference_answer("so\n#### 1,600"), Some(1600.0));
        assert_eq!(reference_answer("#### -3"), Some(-3.0));
        assert_eq!(reference_answer("no marker 12"), None);
    }

    #[test]
    fn answers_are_compared_numerically() {
        assert!(answers_match(42.0, 42.0));
        assert!(answers_match(0.1 + 0.2, 0.3));
        assert!(answers_match(1_000_000.0000001, 1_000_000.0));
        assert!(!answers_match(41.0, 42.0));
        assert!(!answers_match(0.5, 0.55));
    }

    #[test]
    fn number_text_keeps_sign_and_separators() {
        let hits = numbers("a -$1,234.5 b 7, 8");
        let texts: Vec<&str> = hits.iter().map(|h| h.text.as_str()).collect();
        assert_eq!(texts, ["-1,234.5", "7", "8"]);
        assert_eq!(parse_number("costs $3.25 each"), Some(3.25));
    }
}
