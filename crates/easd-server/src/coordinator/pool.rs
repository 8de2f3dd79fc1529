//! Replica pools (the draft workers, the verifier replicas): discovery (static list or a DNS name re-resolved
//! periodically), gRPC health checks that take replicas out of rotation and back, the tokenizer-compatibility
//! check, load-aware choice (power of two choices) and bounded admission (DESIGN §3.3).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use easd_proto::v1::{self as pb, draft_client::DraftClient, verifier_client::VerifierClient};
use easd_telemetry::CoordinatorMetrics;
use tokio::sync::Notify;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

use super::policy::{Candidate, power_of_two};
use super::retry::Backoff;
use crate::error::{ServerError, error_reason};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Draft,
    Verifier,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Self::Draft => "draft",
            Self::Verifier => "verifier",
        }
    }
}

#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Deadline of every call to a worker; for a prefill, of each progress report (see [`PinnedWorker::call`]).
    ///
    /// [`PinnedWorker::call`]: super::pinned::PinnedWorker::call
    pub call_timeout: Duration,
    /// A call carrying more new tokens than this first feeds them with `Prefill`, in pieces with progress reports.
    pub prefill_above_tokens: usize,
    pub connect_timeout: Duration,
    /// Period of the health checks (and of DNS re-resolution).
    pub health_interval: Duration,
    /// Sessions a replica serves at once; more wait in the admission queue.
    pub max_sessions_per_replica: usize,
    /// Sessions that may wait for a free replica; more get RESOURCE_EXHAUSTED.
    pub max_queue: usize,
    /// Retries of a failed call, and of admission while no replica is healthy.
    pub backoff: Backoff,
    /// How often the sessions pinned to each replica are kept from its idle sweep (`KeepAlive`): well below the
    /// workers' `--idle-timeout-s` (300 s by default), checked every health interval.
    pub keepalive_interval: Duration,
    pub tls: Option<ClientTlsConfig>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(60),
            prefill_above_tokens: crate::batcher::DEFAULT_MAX_PIECE,
            connect_timeout: Duration::from_secs(3),
            health_interval: Duration::from_secs(2),
            max_sessions_per_replica: 64,
            max_queue: 256,
            backoff: Backoff::default(),
            keepalive_interval: Duration::from_secs(60),
            tls: None,
        }
    }
}

pub struct Replica {
    pub url: String,
    channel: Channel,
    live_sessions: AtomicUsize,
    healthy: AtomicBool,
    /// Set until the replica's tokenizer has been compared with ours, and again after it was unreachable
    /// (a restarted worker may serve another model).
    needs_check: AtomicBool,
    /// The worker session ids of this coordinator's sessions pinned here, kept alive on the worker.
    pinned: Mutex<HashSet<String>>,
}

/// A session's entry in its replica's pinned set, removed when dropped.
pub struct SessionPin {
    pub replica: Arc<Replica>,
    id: String,
}

impl SessionPin {
    pub fn new(replica: Arc<Replica>, id: &str) -> Self {
        replica.pinned.lock().expect("pinned sessions poisoned").insert(id.to_owned());
        Self { replica, id: id.to_owned() }
    }
}

impl Drop for SessionPin {
    fn drop(&mut self) {
        self.replica.pinned.lock().expect("pinned sessions poisoned").remove(&self.id);
    }
}

impl Replica {
    pub fn draft(&self) -> DraftClient<Channel> {
        DraftClient::new(self.channel.clone())
    }

    pub fn verifier(&self) -> VerifierClient<Channel> {
        VerifierClient::new(self.channel.clone())
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn live_sessions(&self) -> usize {
        self.live_sessions.load(Ordering::Relaxed)
    }

    /// Takes the replica out of rotation after a failed call; the health checker brings it back.
    pub fn mark_failed(&self) {
        self.healthy.store(false, Ordering::Relaxed);
        self.needs_check.store(true, Ordering::Relaxed);
    }
}

/// A session's hold on a replica; releases the slot when dropped.
pub struct Lease {
    pub replica: Arc<Replica>,
    pool: Weak<Pool>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.replica.live_sessions.fetch_sub(1, Ordering::Relaxed);
        if let Some(pool) = self.pool.upgrade() {
            // A replica that left (DNS) no longer reports.
            if pool.replicas().iter().any(|r| Arc::ptr_eq(r, &self.replica)) {
                pool.report_live_sessions(&self.replica);
            }
            pool.capacity_freed.notify_waiters();
        }
    }
}

pub struct Pool {
    pub role: Role,
    replicas: RwLock<Vec<Arc<Replica>>>,
    dns_name: Option<String>,
    fingerprint: String,
    pub config: PoolConfig,
    capacity_freed: Notify,
    queued: AtomicUsize,
    /// Where live sessions per replica are reported (the verifier pool's gauge).
    metrics: Option<CoordinatorMetrics>,
}

impl Pool {
    /// A pool over a static list of URLs; `metrics` receives its replicas' live sessions.
    pub fn new(
        role: Role,
        urls: &[String],
        fingerprint: &str,
        config: PoolConfig,
        metrics: Option<CoordinatorMetrics>,
    ) -> Result<Arc<Self>, ServerError> {
        let pool = Self::empty(role, None, fingerprint, config, metrics);
        for url in urls {
            pool.add(url)?;
        }
        Ok(Arc::new(pool))
    }

    /// A pool over the addresses `host:port` resolves to, re-resolved every health interval
    /// (how a Kubernetes headless service is consumed).
    pub async fn from_dns(
        role: Role,
        name: &str,
        fingerprint: &str,
        config: PoolConfig,
        metrics: Option<CoordinatorMetrics>,
    ) -> Result<Arc<Self>, ServerError> {
        let pool = Arc::new(Self::empty(role, Some(name.to_owned()), fingerprint, config, metrics));
        pool.refresh_dns().await?;
        Ok(pool)
    }

    fn empty(
        role: Role,
        dns_name: Option<String>,
        fingerprint: &str,
        config: PoolConfig,
        metrics: Option<CoordinatorMetrics>,
    ) -> Self {
        Self {
            role,
            replicas: RwLock::new(Vec::new()),
            dns_name,
            fingerprint: fingerprint.to_owned(),
            config,
            capacity_freed: Notify::new(),
            queued: AtomicUsize::new(0),
            metrics,
        }
    }

    /// `https` when the pool talks TLS to its workers (`--worker-ca`), else `http`.
    fn scheme(&self) -> &'static str {
        if self.config.tls.is_some() { "https" } else { "http" }
    }

    fn add(&self, url: &str) -> Result<(), ServerError> {
        let url = if url.contains("://") { url.to_owned() } else { format!("{}://{url}", self.scheme()) };
        if self.config.tls.is_some() && url.starts_with("http://") {
            return Err(ServerError::invalid(
                self.role.name(),
                format!("{url} is plaintext but the workers are configured for TLS (--worker-ca): use https://"),
            ));
        }
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| ServerError::invalid(self.role.name(), format!("bad URL {url}: {e}")))?
            .connect_timeout(self.config.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        if let Some(tls) = &self.config.tls {
            endpoint =
                endpoint.tls_config(tls.clone()).map_err(|e| ServerError::invalid("tls", format!("{url}: {e}")))?;
        }
        let replica = Arc::new(Replica {
            url,
            channel: endpoint.connect_lazy(),
            live_sessions: AtomicUsize::new(0),
            healthy: AtomicBool::new(false),
            needs_check: AtomicBool::new(true),
            pinned: Mutex::default(),
        });
        self.report_live_sessions(&replica);
        self.replicas.write().expect("pool poisoned").push(replica);
        Ok(())
    }

    fn report_live_sessions(&self, replica: &Replica) {
        if let Some(metrics) = &self.metrics {
            metrics.set_live_sessions(&replica.url, replica.live_sessions());
        }
    }

    async fn refresh_dns(&self) -> Result<(), ServerError> {
        let Some(name) = &self.dns_name else { return Ok(()) };
        let addrs: Vec<String> = tokio::net::lookup_host(name)
            .await
            .map_err(|e| ServerError::Unavailable(format!("cannot resolve {name}: {e}")))?
            .map(|a| format!("{}://{a}", self.scheme()))
            .collect();
        let known: Vec<String> = self.replicas().iter().map(|r| r.url.clone()).collect();
        for a in addrs.iter().filter(|a| !known.contains(a)) {
            tracing::info!(role = self.role.name(), url = %a, "replica discovered");
            self.add(a)?;
        }
        // Sessions pinned to a vanished replica keep their Arc and fail over on their next error.
        self.replicas.write().expect("pool poisoned").retain(|r| {
            let keep = addrs.contains(&r.url);
            if let (false, Some(metrics)) = (keep, &self.metrics) {
                metrics.remove_replica(&r.url);
            }
            keep
        });
        Ok(())
    }

    pub fn replicas(&self) -> Vec<Arc<Replica>> {
        self.replicas.read().expect("pool poisoned").clone()
    }

    /// Asks a replica for its model and checks its tokenizer against ours.
    pub async fn info(&self, replica: &Replica) -> Result<pb::ModelInfo, ServerError> {
        let mut req = tonic::Request::new(pb::InfoRequest {});
        req.set_timeout(self.config.call_timeout.min(Duration::from_secs(10)));
        let result = match self.role {
            Role::Draft => replica.draft().info(req).await,
            Role::Verifier => replica.verifier().info(req).await,
        };
        let info = result.map_err(|s| call_error(&replica.url, s))?.into_inner();
        if info.tokenizer_fingerprint != self.fingerprint {
            replica.mark_failed();
            return Err(ServerError::Incompatible(format!(
                "{} {} serves {} whose tokenizer fingerprint {} differs from the coordinator's {}: draft and target must share a tokenizer",
                self.role.name(),
                replica.url,
                info.name,
                short(&info.tokenizer_fingerprint),
                short(&self.fingerprint)
            )));
        }
        replica.needs_check.store(false, Ordering::Relaxed);
        replica.healthy.store(true, Ordering::Relaxed);
        Ok(info)
    }

    /// Checks the replica's tokenizer if it was never checked or was unreachable since.
    pub async fn ensure_checked(&self, replica: &Replica) -> Result<(), ServerError> {
        if replica.needs_check.load(Ordering::Relaxed) {
            self.info(replica).await?;
        }
        Ok(())
    }

    /// Infos of the replicas that answer; fails on any incompatible one. Waits until at least one answers.
    pub async fn connect(&self, timeout: Duration) -> Result<Vec<pb::ModelInfo>, ServerError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut wait = Duration::from_millis(50);
        loop {
            let mut infos = Vec::new();
            let mut last_error = None;
            for r in self.replicas() {
                match self.info(&r).await {
                    Ok(info) => infos.push(info),
                    Err(e @ ServerError::Incompatible(_)) => return Err(e),
                    Err(e) => last_error = Some(e),
                }
            }
            if !infos.is_empty() {
                return Ok(infos);
            }
            if tokio::time::Instant::now() + wait >= deadline {
                return Err(last_error.unwrap_or_else(|| {
                    ServerError::Unavailable(format!("no {} replica is configured", self.role.name()))
                }));
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
            if self.dns_name.is_some() {
                let _ = self.refresh_dns().await;
            }
        }
    }

    /// A lease on the healthy replica chosen by power of two choices, ignoring `exclude`.
    /// `respect_capacity: false` for failover, which must not wait behind new sessions.
    pub fn try_lease(self: &Arc<Self>, exclude: &[String], respect_capacity: bool) -> Option<Lease> {
        let replicas: Vec<Arc<Replica>> =
            self.replicas().into_iter().filter(|r| r.is_healthy() && !exclude.contains(&r.url)).collect();
        let capacity = if respect_capacity { self.config.max_sessions_per_replica } else { usize::MAX };
        let candidates: Vec<Candidate> =
            replicas.iter().map(|r| Candidate { live_sessions: r.live_sessions(), capacity }).collect();
        let i = power_of_two(&candidates, rand::random(), rand::random())?;
        let replica = replicas[i].clone();
        replica.live_sessions.fetch_add(1, Ordering::Relaxed);
        self.report_live_sessions(&replica);
        Some(Lease { replica, pool: Arc::downgrade(self) })
    }

    /// Admission for a new session: a replica with room now, else a bounded wait in the queue.
    pub async fn admit(self: &Arc<Self>) -> Result<Lease, ServerError> {
        let mut attempt = 0;
        loop {
            let notified = self.capacity_freed.notified();
            if let Some(lease) = self.try_lease(&[], true) {
                return Ok(lease);
            }
            let any_healthy = self.replicas().iter().any(|r| r.is_healthy());
            if !any_healthy {
                attempt += 1;
                if !self.config.backoff.allows_retry_after(attempt) {
                    return Err(ServerError::Unavailable(format!(
                        "no {} replica is available (tried for {attempt} attempts)",
                        self.role.name()
                    )));
                }
                self.probe_all().await;
                self.config.backoff.wait(attempt).await;
                continue;
            }
            // All healthy replicas are full: queue, boundedly.
            if self.queued.fetch_add(1, Ordering::AcqRel) >= self.config.max_queue {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                return Err(ServerError::ResourceExhausted(format!(
                    "all {} replicas are at their session limit ({}) and the queue is full ({} waiting)",
                    self.role.name(),
                    self.config.max_sessions_per_replica,
                    self.config.max_queue
                )));
            }
            let _ = tokio::time::timeout(self.config.health_interval, notified).await;
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// One round of health checks; returns how many replicas are healthy.
    pub async fn probe_all(&self) -> usize {
        if self.dns_name.is_some()
            && let Err(e) = self.refresh_dns().await
        {
            tracing::warn!(error = %e, "DNS refresh failed; keeping the known replicas");
        }
        let mut healthy = 0;
        for r in self.replicas() {
            let was = r.is_healthy();
            let now = self.probe(&r).await;
            if now != was {
                tracing::info!(role = self.role.name(), url = %r.url, healthy = now, "replica health changed");
                if now {
                    self.capacity_freed.notify_waiters();
                }
            }
            healthy += usize::from(now);
        }
        healthy
    }

    async fn probe(&self, r: &Replica) -> bool {
        let mut client = HealthClient::new(r.channel.clone());
        let mut req = tonic::Request::new(HealthCheckRequest { service: String::new() });
        req.set_timeout(self.config.health_interval.max(Duration::from_millis(500)));
        let serving =
            matches!(client.check(req).await.map(|resp| resp.into_inner().status()), Ok(ServingStatus::Serving));
        if !serving {
            r.mark_failed();
            return false;
        }
        // Back (or new): compare tokenizers before taking it into rotation.
        if r.needs_check.load(Ordering::Relaxed) {
            match self.info(r).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::error!(error = %e, "replica kept out of rotation");
                    r.mark_failed();
                    false
                }
            }
        } else {
            r.healthy.store(true, Ordering::Relaxed);
            true
        }
    }

    /// Periodic health checks until the pool is dropped.
    pub fn spawn_health_checker(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let period = self.config.health_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut kept_alive = Instant::now();
            loop {
                tick.tick().await;
                let Some(pool) = weak.upgrade() else { break };
                pool.probe_all().await;
                if kept_alive.elapsed() >= pool.config.keepalive_interval {
                    kept_alive = Instant::now();
                    pool.keep_alive().await;
                }
            }
        });
    }

    /// Tells each healthy replica which of its sessions this coordinator still holds, so that a session waiting on
    /// the other side's long call is not swept as idle. Best effort: a replica that does not answer is probed anyway.
    pub async fn keep_alive(&self) {
        let timeout = self.config.call_timeout.min(Duration::from_secs(5));
        for r in self.replicas().into_iter().filter(|r| r.is_healthy()) {
            let ids: Vec<String> = r.pinned.lock().expect("pinned sessions poisoned").iter().cloned().collect();
            for chunk in ids.chunks(crate::worker::Worker::MAX_KEEPALIVE_IDS) {
                let mut req = tonic::Request::new(pb::KeepAliveRequest { session_ids: chunk.to_vec() });
                req.set_timeout(timeout);
                let result = match self.role {
                    Role::Draft => r.draft().keep_alive(req).await,
                    Role::Verifier => r.verifier().keep_alive(req).await,
                };
                if let Err(status) = result {
                    tracing::debug!(role = self.role.name(), url = %r.url, error = %status, "keep-alive failed");
                }
            }
        }
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}

/// Maps a failed call to a worker; transport-level failures are what failover handles.
pub fn call_error(url: &str, status: tonic::Status) -> ServerError {
    use tonic::Code;
    match status.code() {
        // tonic's answer when the grpc-timeout the caller set (the call timeout) ran out on the worker.
        Code::Cancelled if status.message() == "Timeout expired" => ServerError::DeadlineExceeded(format!(
            "{url} did not answer within the coordinator's call timeout (--call-timeout-s)"
        )),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Aborted => {
            ServerError::Unavailable(format!("{url} is unavailable: {}", status.message()))
        }
        Code::DeadlineExceeded => ServerError::DeadlineExceeded(format!(
            "{url} did not answer within the coordinator's call timeout (--call-timeout-s)"
        )),
        _ if error_reason(&status) == pb::ErrorReason::IncompatibleModels => {
            ServerError::Incompatible(format!("{url}: {}", status.message()))
        }
        _ => ServerError::Worker(status),
    }
}

/// Whether a failed call may be retried elsewhere (the request is idempotent thanks to prefix claims and
/// position-keyed randomness).
pub fn is_transport_failure(e: &ServerError) -> bool {
    matches!(e, ServerError::Unavailable(_) | ServerError::DeadlineExceeded(_))
}

fn short(fingerprint: &str) -> &str {
    &fingerprint[..fingerprint.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live_sessions(metrics: &CoordinatorMetrics, url: &str) -> Option<String> {
        let series = format!("easd_coordinator_live_sessions{{replica=\"{url}\"}} ");
        metrics.encode().lines().find_map(|line| line.strip_prefix(&series).map(str::to_owned))
    }

    #[tokio::test]
    async fn a_tls_pool_refuses_plaintext_urls_and_discovers_https_ones() {
        let tls = PoolConfig { tls: Some(ClientTlsConfig::new()), ..PoolConfig::default() };
        let plain = ["http://127.0.0.1:1".to_owned()];
        let Err(error) = Pool::new(Role::Verifier, &plain, "fp", tls.clone(), None) else {
            panic!("plaintext accepted")
        };
        assert!(error.to_string().contains("http://127.0.0.1:1 is plaintext"), "{error}");
        assert!(error.to_string().contains("--worker-ca"), "{error}");
        let bare = ["127.0.0.1:1".to_owned()];
        let pool = Pool::new(Role::Verifier, &bare, "fp", tls.clone(), None).unwrap();
        assert_eq!(pool.replicas()[0].url, "https://127.0.0.1:1");
        let pool = Pool::from_dns(Role::Verifier, "127.0.0.1:1", "fp", tls, None).await.unwrap();
        assert_eq!(pool.replicas()[0].url, "https://127.0.0.1:1", "DNS discovery speaks TLS when the pool does");
        let pool = Pool::from_dns(Role::Verifier, "127.0.0.1:1", "fp", PoolConfig::default(), None).await.unwrap();
        assert_eq!(pool.replicas()[0].url, "http://127.0.0.1:1");
    }

    #[tokio::test]
    async fn leases_move_the_live_sessions_gauge_of_their_replica() {
        let metrics = CoordinatorMetrics::new();
        let urls = ["127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
        let pool = Pool::new(Role::Verifier, &urls, "fp", PoolConfig::default(), Some(metrics.clone())).unwrap();
        let (one, two) = ("http://127.0.0.1:1", "http://127.0.0.1:2");
        assert_eq!(live_sessions(&metrics, one).as_deref(), Some("0"), "known replicas report from the start");
        for replica in pool.replicas() {
            replica.healthy.store(true, Ordering::Relaxed);
        }
        let first = pool.try_lease(&[two.to_owned()], true).unwrap();
        let second = pool.try_lease(&[two.to_owned()], true).unwrap();
        assert_eq!(live_sessions(&metrics, one).as_deref(), Some("2"));
        assert_eq!(live_sessions(&metrics, two).as_deref(), Some("0"));
        drop(first);
        assert_eq!(live_sessions(&metrics, one).as_deref(), Some("1"));
        drop(second);
        assert_eq!(live_sessions(&metrics, one).as_deref(), Some("0"));
    }

    #[tokio::test]
    async fn admission_queues_boundedly_and_refuses_beyond_the_queue() {
        let urls = ["127.0.0.1:1".to_owned()];
        let config = PoolConfig { max_sessions_per_replica: 1, max_queue: 1, ..PoolConfig::default() };
        let pool = Pool::new(Role::Verifier, &urls, "fp", config, None).unwrap();
        pool.replicas()[0].healthy.store(true, Ordering::Relaxed);
        let running = pool.admit().await.unwrap();
        // The replica is full: the next session waits in the queue…
        let waiting = tokio::spawn({
            let pool = pool.clone();
            async move { pool.admit().await.map(|lease| lease.replica.url.clone()) }
        });
        while pool.queued() == 0 {
            tokio::task::yield_now().await;
        }
        // …and one more finds the queue full.
        match pool.admit().await {
            Err(ServerError::ResourceExhausted(msg)) => assert!(msg.contains("queue is full"), "{msg}"),
            other => panic!("expected RESOURCE_EXHAUSTED, got {:?}", other.map(|l| l.replica.url.clone())),
        }
        // When the running session ends, the queued one gets the slot.
        drop(running);
        assert_eq!(waiting.await.unwrap().unwrap(), "http://127.0.0.1:1");
        assert_eq!(pool.queued(), 0);
    }
}
