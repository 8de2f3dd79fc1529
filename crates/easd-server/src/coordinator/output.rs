//! Text for the client: UTF-8-safe deltas, with stop strings held back until they can no longer match.

/// Accumulates generated text and decides how much of it may be sent.
#[derive(Debug, Default)]
pub struct StopFilter {
    stop: Vec<String>,
    text: String,
    sent: usize,
}

/// What a new piece of text releases.
#[derive(Debug, PartialEq, Eq)]
pub struct Release {
    pub text: String,
    /// A stop string was found: the text is cut before it and generation ends.
    pub stopped: bool,
}

impl StopFilter {
    pub fn new(stop: Vec<String>) -> Self {
        Self { stop, ..Self::default() }
    }

    /// Adds decoded text; returns what can be sent now.
    pub fn push(&mut self, piece: &str) -> Release {
        self.text.push_str(piece);
        // A match can only start within the last (longest stop - 1) bytes of what was already sent.
        let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
        let mut search_from = self.sent.saturating_sub(longest.saturating_sub(1));
        while !self.text.is_char_boundary(search_from) {
            search_from -= 1;
        }
        let first_match =
            self.stop.iter().filter_map(|s| self.text[search_from..].find(s.as_str()).map(|i| search_from + i)).min();
        if let Some(at) = first_match {
            let end = at.max(self.sent);
            let text = self.text[self.sent..end].to_owned();
            self.sent = end;
            return Release { text, stopped: true };
        }
        let safe_end = self.text.len() - self.held_suffix_len();
        let end = safe_end.max(self.sent);
        let text = self.text[self.sent..end].to_owned();
        self.sent = end;
        Release { text, stopped: false }
    }

    /// Text held back because it may begin a stop string; released when generation ends without a match.
    pub fn flush(&mut self) -> String {
        let text = self.text[self.sent..].to_owned();
        self.sent = self.text.len();
        text
    }

    /// Everything sent so far.
    pub fn sent_text(&self) -> &str {
        &self.text[..self.sent]
    }

    /// Length of the longest suffix of the text that is a proper prefix of a stop string.
    fn held_suffix_len(&self) -> usize {
        self.stop
            .iter()
            .flat_map(|s| (1..s.len()).rev().filter(|&l| s.is_char_boundary(l)).map(move |l| &s[..l]))
            .filter(|prefix| self.text.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stop: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut f = StopFilter::new(stop.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let r = f.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&f.flush());
        (out, false)
    }

    #[test]
    fn text_without_stop_strings_passes_through() {
        assert_eq!(run(&[], &["a", "b c"]), ("ab c".into(), false));
    }

    #[test]
    fn a_stop_string_split_across_pieces_is_never_sent() {
        let mut f = StopFilter::new(vec!["\n\nQ:".into()]);
        assert_eq!(f.push("answer\n").text, "answer");
        assert_eq!(f.push("\nQ").text, "");
        let r = f.push(":more");
        assert_eq!(r, Release { text: String::new(), stopped: true });
        assert_eq!(f.sent_text(), "answer");
    }

    #[test]
    fn a_partial_match_that_fails_is_released() {
        assert_eq!(run(&["STOP"], &["ST", "OP", "x"]), (String::new(), true));
        assert_eq!(run(&["STOP"], &["ST", "ay"]), ("STay".into(), false));
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        assert_eq!(run(&["world", "lo"], &["hello world"]), ("hel".into(), true));
    }

    #[test]
    fn multibyte_stop_strings_respect_char_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".into(), true));
        assert_eq!(run(&["é!"], &["café", "?"]), ("café?".into(), false));
    }
}
