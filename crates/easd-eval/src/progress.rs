//! Progress reporting for long runs: a trait so the library stays quiet in tests, and a terminal bar with ETA.

use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};

use crate::results::ResultRecord;

/// Told about a run as it goes. Called from one task; implementations need only be `Sync` to be shared.
pub trait Progress: Sync {
    /// `total` generations in the run, of which `done` were already in the results file.
    fn start(&self, total: usize, done: usize);
    /// One generation finished.
    fn advance(&self, record: &ResultRecord);
    fn finish(&self);
}

/// Reports nothing.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _total: usize, _done: usize) {}
    fn advance(&self, _record: &ResultRecord) {}
    fn finish(&self) {}
}

/// A terminal progress bar (stderr) with rate, ETA and the running accuracy of this call's generations.
pub struct BarProgress {
    bar: ProgressBar,
    /// (correct, finished) in this call.
    tally: Mutex<(usize, usize)>,
}

impl BarProgress {
    pub fn new() -> BarProgress {
        let bar = ProgressBar::new(0);
        let style = ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {pos}/{len} {per_sec} ETA {eta_precise} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        BarProgress { bar, tally: Mutex::new((0, 0)) }
    }
}

impl Default for BarProgress {
    fn default() -> Self {
        BarProgress::new()
    }
}

impl Progress for BarProgress {
    fn start(&self, total: usize, done: usize) {
        self.bar.set_length(total as u64);
        self.bar.set_position(done as u64);
        // The ETA must come from this call's pace, not from the resumed lines.
        self.bar.reset_eta();
    }

    fn advance(&self, record: &ResultRecord) {
        let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        tally.0 += usize::from(record.correct);
        tally.1 += 1;
        self.bar.set_message(format!("correct {}/{} (last: {} #{})", tally.0, tally.1, record.variant, record.problem));
        self.bar.inc(1);
    }

    fn finish(&self) {
        self.bar.finish();
    }
}
