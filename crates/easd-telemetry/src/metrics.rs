//! Prometheus metrics of the coordinator and of the workers (draft, verifier).
//!
//! Each struct owns its registry; handles are cheap clones sharing the same counters, so a
//! service creates one, clones it into its handlers and serves [`CoordinatorMetrics::registry`]
//! with [`crate::serve_metrics`]. Counter names get the `_total` suffix on the wire.

use std::borrow::Cow;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    mode: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PositionLabels {
    position: usize,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplicaLabels {
    replica: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BatchLabels {
    batch_len: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// 1 ms … 16 s: one speculative step (draft + verify + decide).
fn step_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// 10 ms … 20 s: time to first token includes prefill of the prompt on both models.
fn ttft_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 12))
}

/// 0.5 ms … 16 s: one model forward, from a single decode token to a long prefill.
fn forward_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// 1, 2, 4, … 128 sessions in one forward.
fn batch_sessions_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 8))
}

/// 50 µs … 1.6 s waiting for the model thread.
fn queue_wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

fn mode(mode: &str) -> ModeLabels {
    ModeLabels { mode: mode.to_owned() }
}

/// Metrics of the coordinator: requests, tokens, acceptance, recovery and latency.
#[derive(Clone, Debug)]
pub struct CoordinatorMetrics {
    registry: Arc<Registry>,
    requests: Family<RequestLabels, Counter>,
    generated_tokens: Family<ModeLabels, Counter>,
    blocks: Family<ModeLabels, Counter>,
    drafted_tokens: Family<ModeLabels, Counter>,
    accepted_tokens: Family<ModeLabels, Counter>,
    easd_triggers: Family<ModeLabels, Counter>,
    block_positions: Family<PositionLabels, Counter>,
    failovers: Counter,
    retries: Family<TargetLabels, Counter>,
    step_seconds: HistogramFamily<ModeLabels>,
    ttft_seconds: HistogramFamily<ModeLabels>,
    live_sessions: Family<ReplicaLabels, Gauge>,
}

impl Default for CoordinatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl CoordinatorMetrics {
    /// A fresh registry with every coordinator metric (prefix `easd_coordinator_`).
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("easd_coordinator");
        let metrics = Self {
            registry: Arc::new(Registry::default()),
            requests: Family::default(),
            generated_tokens: Family::default(),
            blocks: Family::default(),
            drafted_tokens: Family::default(),
            accepted_tokens: Family::default(),
            easd_triggers: Family::default(),
            block_positions: Family::default(),
            failovers: Counter::default(),
            retries: Family::default(),
            step_seconds: Family::new_with_constructor(step_histogram),
            ttft_seconds: Family::new_with_constructor(ttft_histogram),
            live_sessions: Family::default(),
        };
        registry.register(
            "requests",
            "Finished generation requests by mode and final status (ok or a gRPC code name)",
            metrics.requests.clone(),
        );
        registry.register(
            "generated_tokens",
            "Tokens committed and returned to clients",
            metrics.generated_tokens.clone(),
        );
        registry.register("blocks", "Draft blocks verified", metrics.blocks.clone());
        registry.register("drafted_tokens", "Tokens proposed by the draft model", metrics.drafted_tokens.clone());
        registry.register(
            "accepted_tokens",
            "Drafted tokens accepted by verification",
            metrics.accepted_tokens.clone(),
        );
        registry.register(
            "easd_triggers",
            "Positions where the EASD entropy rule rejected a token that standard verification accepted",
            metrics.easd_triggers.clone(),
        );
        registry.register(
            "block_position_outcomes",
            "Verification outcomes per 1-based block position (acceptance at j = accepted / (accepted + rejected))",
            metrics.block_positions.clone(),
        );
        registry.register("failovers", "Sessions moved to another verifier replica", metrics.failovers.clone());
        registry.register("retries", "Retried calls by target service (draft, verifier)", metrics.retries.clone());
        registry.register(
            "step_seconds",
            "Latency of one speculative step (draft, verify, decide, commit)",
            metrics.step_seconds.clone(),
        );
        registry.register(
            "ttft_seconds",
            "Time from request arrival to the first token streamed",
            metrics.ttft_seconds.clone(),
        );
        registry.register(
            "live_sessions",
            "Sessions currently pinned to each verifier replica",
            metrics.live_sessions.clone(),
        );
        Self { registry: Arc::new(registry), ..metrics }
    }

    /// The registry to serve or encode.
    pub fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }

    /// The current values in the Prometheus/OpenMetrics text format.
    pub fn encode(&self) -> String {
        crate::encode_metrics(&self.registry)
    }

    /// One finished request. `status` is `ok` or the gRPC code name of the failure.
    pub fn record_request(&self, mode: &str, status: &str) {
        let labels = RequestLabels { mode: mode.to_owned(), status: status.to_owned() };
        self.requests.get_or_create(&labels).inc();
    }

    /// `n` tokens committed and sent to the client.
    pub fn add_generated_tokens(&self, mode: &str, n: u64) {
        self.generated_tokens.get_or_create(&self::mode(mode)).inc_by(n);
    }

    /// One verified block: `drafted` proposals, `accepted` of them kept, `triggers` EASD
    /// rejections (positions the entropy rule rejected).
    pub fn observe_block(&self, mode: &str, drafted: u64, accepted: u64, triggers: u64) {
        let labels = self::mode(mode);
        self.blocks.get_or_create(&labels).inc();
        self.drafted_tokens.get_or_create(&labels).inc_by(drafted);
        self.accepted_tokens.get_or_create(&labels).inc_by(accepted);
        self.easd_triggers.get_or_create(&labels).inc_by(triggers);
    }

    /// The outcome at 1-based block `position` (DESIGN §2's j). Record only positions that were
    /// actually evaluated (up to and including the first rejection).
    pub fn observe_acceptance_position(&self, position: usize, accepted: bool) {
        let labels = PositionLabels { position, outcome: if accepted { "accepted" } else { "rejected" } };
        self.block_positions.get_or_create(&labels).inc();
    }

    /// A session moved to another verifier replica.
    pub fn inc_failover(&self) {
        self.failovers.inc();
    }

    /// A call to `target` (`draft` or `verifier`) is being retried.
    pub fn inc_retry(&self, target: &str) {
        let labels = TargetLabels { target: target.to_owned() };
        self.retries.get_or_create(&labels).inc();
    }

    /// Latency of one speculative step.
    pub fn observe_step_seconds(&self, mode: &str, seconds: f64) {
        self.step_seconds.get_or_create(&self::mode(mode)).observe(seconds);
    }

    /// Time to first token of a request.
    pub fn observe_ttft_seconds(&self, mode: &str, seconds: f64) {
        self.ttft_seconds.get_or_create(&self::mode(mode)).observe(seconds);
    }

    /// Sessions pinned to `replica` (its address) right now.
    pub fn set_live_sessions(&self, replica: &str, sessions: usize) {
        let labels = ReplicaLabels { replica: replica.to_owned() };
        self.live_sessions.get_or_create(&labels).set(i64::try_from(sessions).unwrap_or(i64::MAX));
    }

    /// Drops the gauge of a replica that left (DNS no longer lists it), so it stops reporting.
    pub fn remove_replica(&self, replica: &str) {
        self.live_sessions.remove(&ReplicaLabels { replica: replica.to_owned() });
    }
}

/// Metrics of a model worker (draft or verifier): forward latency, batching and KV cache use.
#[derive(Clone, Debug)]
pub struct WorkerMetrics {
    registry: Arc<Registry>,
    forward_seconds: HistogramFamily<BatchLabels>,
    batch_sessions: Histogram,
    queue_wait_seconds: Histogram,
    kv_cache_bytes: Gauge,
    kv_cache_sessions: Gauge,
    evictions: Counter,
}

impl WorkerMetrics {
    /// A fresh registry (prefix `easd_worker_`, constant label `role`, e.g. `draft` or
    /// `verifier`) with every worker metric.
    pub fn new(role: &str) -> Self {
        let labels = [(Cow::Borrowed("role"), Cow::Owned(role.to_owned()))];
        let mut registry = Registry::with_prefix_and_labels("easd_worker", labels.into_iter());
        let forward_seconds: HistogramFamily<BatchLabels> = Family::new_with_constructor(forward_histogram);
        let batch_sessions = batch_sessions_histogram();
        let queue_wait_seconds = queue_wait_histogram();
        let kv_cache_bytes = Gauge::default();
        let kv_cache_sessions = Gauge::default();
        let evictions = Counter::default();
        registry.register(
            "forward_seconds",
            "Latency of one model forward by number of tokens in it, all sessions' rows together (bucketed)",
            forward_seconds.clone(),
        );
        registry.register(
            "batch_sessions",
            "Sessions whose rows one forward computed (cross-session batching)",
            batch_sessions.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time a request waited for the model thread, from arrival to its first forward's start",
            queue_wait_seconds.clone(),
        );
        registry.register("kv_cache_bytes", "Bytes held by per-session KV caches", kv_cache_bytes.clone());
        registry.register("kv_cache_sessions", "Sessions with a KV cache", kv_cache_sessions.clone());
        registry.register("evictions", "KV caches evicted (memory budget or idle timeout)", evictions.clone());
        Self {
            registry: Arc::new(registry),
            forward_seconds,
            batch_sessions,
            queue_wait_seconds,
            kv_cache_bytes,
            kv_cache_sessions,
            evictions,
        }
    }

    /// The registry to serve or encode.
    pub fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }

    /// The current values in the Prometheus/OpenMetrics text format.
    pub fn encode(&self) -> String {
        crate::encode_metrics(&self.registry)
    }

    /// One forward over `batch_len` tokens (see [`batch_len_label`] for the label).
    pub fn observe_forward_seconds(&self, batch_len: usize, seconds: f64) {
        let labels = BatchLabels { batch_len: batch_len_label(batch_len) };
        self.forward_seconds.get_or_create(&labels).observe(seconds);
    }

    /// One forward computed rows of `sessions` sessions.
    pub fn observe_batch_sessions(&self, sessions: usize) {
        self.batch_sessions.observe(sessions as f64);
    }

    /// A request waited `seconds` for the model thread before its first forward.
    pub fn observe_queue_wait_seconds(&self, seconds: f64) {
        self.queue_wait_seconds.observe(seconds);
    }

    /// Current KV cache use.
    pub fn set_kv_cache(&self, bytes: u64, sessions: usize) {
        self.kv_cache_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.kv_cache_sessions.set(i64::try_from(sessions).unwrap_or(i64::MAX));
    }

    /// `n` caches evicted.
    pub fn inc_evictions(&self, n: u64) {
        self.evictions.inc_by(n);
    }
}

/// The `batch_len` label of a forward over `len` tokens: power-of-two ranges (`1`, `2`,
/// `3-4`, `5-8`, …, `257-512`, `513+`), so prefills of any length keep the label set small.
pub fn batch_len_label(len: usize) -> &'static str {
    const LABELS: [&str; 10] = ["1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", "65-128", "129-256", "257-512"];
    match len {
        0 | 1 => LABELS[0],
        513.. => "513+",
        // ceil(log2(len)) indexes the range whose upper bound is the next power of two.
        _ => LABELS[len.next_power_of_two().trailing_zeros() as usize],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample line `name{labels} value` in `text`.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')).and_then(|value| value.parse().ok())
    }

    #[test]
    fn coordinator_counters_show_up_in_the_text_format_with_their_labels() {
        let metrics = CoordinatorMetrics::new();
        metrics.record_request("easd", "ok");
        metrics.record_request("easd", "ok");
        metrics.record_request("sd", "unavailable");
        metrics.add_generated_tokens("easd", 12);
        metrics.observe_block("easd", 4, 3, 1);
        metrics.observe_block("easd", 4, 4, 0);
        metrics.observe_acceptance_position(1, true);
        metrics.observe_acceptance_position(2, false);
        metrics.inc_failover();
        metrics.inc_retry("verifier");
        metrics.observe_step_seconds("easd", 0.003);
        metrics.observe_ttft_seconds("easd", 0.25);
        metrics.set_live_sessions("10.0.0.7:50052", 3);

        let text = metrics.encode();
        let expect = [
            (r#"easd_coordinator_requests_total{mode="easd",status="ok"}"#, 2.0),
            (r#"easd_coordinator_requests_total{mode="sd",status="unavailable"}"#, 1.0),
            (r#"easd_coordinator_generated_tokens_total{mode="easd"}"#, 12.0),
            (r#"easd_coordinator_blocks_total{mode="easd"}"#, 2.0),
            (r#"easd_coordinator_drafted_tokens_total{mode="easd"}"#, 8.0),
            (r#"easd_coordinator_accepted_tokens_total{mode="easd"}"#, 7.0),
            (r#"easd_coordinator_easd_triggers_total{mode="easd"}"#, 1.0),
            (r#"easd_coordinator_block_position_outcomes_total{position="1",outcome="accepted"}"#, 1.0),
            (r#"easd_coordinator_block_position_outcomes_total{position="2",outcome="rejected"}"#, 1.0),
            ("easd_coordinator_failovers_total", 1.0),
            (r#"easd_coordinator_retries_total{target="verifier"}"#, 1.0),
            (r#"easd_coordinator_step_seconds_count{mode="easd"}"#, 1.0),
            (r#"easd_coordinator_step_seconds_sum{mode="easd"}"#, 0.003),
            (r#"easd_coordinator_ttft_seconds_bucket{le="0.32",mode="easd"}"#, 1.0),
            (r#"easd_coordinator_ttft_seconds_bucket{le="0.16",mode="easd"}"#, 0.0),
            (r#"easd_coordinator_live_sessions{replica="10.0.0.7:50052"}"#, 3.0),
        ];
        for (series, value) in expect {
            assert_eq!(sample(&text, series), Some(value), "{series} in:\n{text}");
        }
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }

    #[test]
    fn a_removed_replica_stops_reporting_live_sessions() {
        let metrics = CoordinatorMetrics::new();
        metrics.set_live_sessions("a:1", 2);
        metrics.set_live_sessions("b:1", 5);
        metrics.remove_replica("a:1");
        let text = metrics.encode();
        assert_eq!(sample(&text, r#"easd_coordinator_live_sessions{replica="a:1"}"#), None);
        assert_eq!(sample(&text, r#"easd_coordinator_live_sessions{replica="b:1"}"#), Some(5.0));
    }

    #[test]
    fn worker_metrics_carry_the_role_and_bucket_the_batch_length() {
        let metrics = WorkerMetrics::new("verifier");
        metrics.observe_forward_seconds(5, 0.02);
        metrics.observe_forward_seconds(8, 0.04);
        metrics.observe_forward_seconds(1, 0.001);
        metrics.set_kv_cache(3 << 20, 2);
        metrics.inc_evictions(3);
        metrics.observe_batch_sessions(1);
        metrics.observe_batch_sessions(3);
        metrics.observe_batch_sessions(8);
        metrics.observe_queue_wait_seconds(0.0003);

        let text = metrics.encode();
        let expect = [
            (r#"easd_worker_forward_seconds_count{role="verifier",batch_len="5-8"}"#, 2.0),
            (r#"easd_worker_forward_seconds_count{role="verifier",batch_len="1"}"#, 1.0),
            (r#"easd_worker_kv_cache_bytes{role="verifier"}"#, 3_145_728.0),
            (r#"easd_worker_kv_cache_sessions{role="verifier"}"#, 2.0),
            (r#"easd_worker_evictions_total{role="verifier"}"#, 3.0),
            (r#"easd_worker_batch_sessions_count{role="verifier"}"#, 3.0),
            (r#"easd_worker_batch_sessions_sum{role="verifier"}"#, 12.0),
            (r#"easd_worker_batch_sessions_bucket{role="verifier",le="1.0"}"#, 1.0),
            (r#"easd_worker_batch_sessions_bucket{role="verifier",le="2.0"}"#, 1.0),
            (r#"easd_worker_batch_sessions_bucket{role="verifier",le="4.0"}"#, 2.0),
            (r#"easd_worker_queue_wait_seconds_count{role="verifier"}"#, 1.0),
        ];
        for (series, value) in expect {
            assert_eq!(sample(&text, series), Some(value), "{series} in:\n{text}");
        }
    }

    #[test]
    fn batch_lengths_map_to_power_of_two_ranges() {
        let cases = [
            (0, "1"),
            (1, "1"),
            (2, "2"),
            (3, "3-4"),
            (4, "3-4"),
            (5, "5-8"),
            (9, "9-16"),
            (64, "33-64"),
            (65, "65-128"),
            (512, "257-512"),
            (513, "513+"),
            (100_000, "513+"),
        ];
        for (len, label) in cases {
            assert_eq!(batch_len_label(len), label, "len {len}");
        }
    }
}
