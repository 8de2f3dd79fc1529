//! Evaluation harness for EASD: the paper's comparison, with the statistics its reviewers asked for.
//!
//! * [`run_eval`] runs a GSM8K-format JSONL benchmark through a [`Generator`] (the coordinator over gRPC, or a fake)
//!   for several variants — `draft`, `target`, `sd`, `easd` by default — with the same prompts, seeds and sampling,
//!   extracts the final number ([`extract_answer`]) and appends one scored line per problem × variant to a results
//!   file that a rerun resumes ([`ResultsFile`]).
//! * [`summarize`] / [`write_report`] turn results into accuracy with 95% Wilson intervals, exact McNemar p-values
//!   for every pair of variants (Holm-adjusted too) with the paired difference and its 95% interval, pre-registered
//!   comparisons Holm-adjusted among themselves, wall-clock tokens/s per session (never pooled across sessions),
//!   acceptance, EASD trigger statistics, draft / target / discarded token counts and the `sd` ≡ `target` token
//!   identity check, as Markdown, JSON and SVG plots.
//! * [`run_calibration`] measures per-token entropies of both models (teacher-forced on reference solutions) and
//!   writes a [`CalibrationFile`] with percentiles and recommended thresholds.
//! * [`run_sweep`] evaluates a grid of EASD parameters (τ percentile × ρ × N) on a development slice.
//!
//! The statistics are pure functions in [`stats`], checked against known values.

mod calibrate;
mod dataset;
mod error;
mod extract;
mod generator;
mod grpc;
mod model_scorer;
mod output;
mod paired;
mod plots;
mod progress;
mod report;
mod results;
mod run;
mod speed;
pub mod stats;
mod sweep;

pub use calibrate::{
    CALIBRATION_FORMAT, CalibrationConfig, CalibrationFile, CalibrationText, EntropyScorer, GateRate, ModelEntropy,
    PERCENTILES, PairedEntropy, Recommendation, ScoredPosition, run_calibration,
};
pub use dataset::{Problem, load_problems, sample_indices, slice, solution_text};
pub use error::{BoxError, Error, Result};
pub use extract::{AnswerSource, ExtractedAnswer, answers_match, extract_answer, parse_number, reference_answer};
pub use generator::{
    ChatMessage, EasdOrder, EasdSettings, EvalRequest, Generation, GenerationSummary, Generator, Mode, Sampling,
    Trigger,
};
pub use grpc::{CoordinatorDescription, CoordinatorGenerator};
pub use model_scorer::ModelScorer;
pub use output::{ReportFiles, write_report};
pub use paired::{ALPHA, IdentityCheck, PairTest, PlannedTest};
pub use plots::{EntropyPanel, SweepPlotPoint, SweepSeries, accuracy_plot, entropy_plot, sweep_plot};
pub use progress::{BarProgress, NoProgress, Progress};
pub use report::{Report, ReportContext, VariantStats, render_markdown, summarize};
pub use results::{ResultRecord, ResultsFile, read_results, token_ids_sha256};
pub use run::{EvalConfig, EvalRun, PromptTemplate, Variant, run_eval, run_problems, stored_results};
pub use speed::{SessionInfo, SessionSpeed, UNRECORDED_SESSION};
pub use sweep::{
    CALIBRATION_LINES, DEVELOPMENT_LINES, HELD_OUT_FROM, SweepAxis, SweepConfig, SweepGrid, SweepPoint, SweepRun,
    run_sweep, sweep_points, write_sweep_report,
};
