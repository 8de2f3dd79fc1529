//! Per-session KV caches on a worker, bounded by a memory budget (LRU eviction) and an idle timeout.
//!
//! A session is checked out for the length of one request (its `Arc` is then shared), so eviction never
//! touches a cache that a forward pass is using. The prefix claim is checked under the session's lock, in the same
//! critical section as the forward it guards ([`WorkerSession::resume`], called by the worker's model thread, which
//! holds the lock from the check to the job's last forward — `crate::batcher`): a request that was cancelled while
//! queued behind another one (a dropped pre-draft) can then never leave the next request computing on a context it
//! did not claim.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use easd_model::KvCache;

use crate::error::ServerError;
use crate::prefix::HashedTokens;

/// What a worker holds for one session: the cache and the exact tokens in it.
pub struct WorkerSession {
    pub cache: KvCache,
    pub tokens: HashedTokens,
}

/// "The session holds these `len` tokens, whose rolling hash is `hash`" (a request's prefix claim, decoded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    pub len: usize,
    pub hash: u64,
}

impl WorkerSession {
    /// Checks the claim against what the session holds and rolls the cache back to it; returns the position the
    /// next forward starts at. Call with the session locked, in the critical section of the forward.
    pub fn resume(&mut self, session_id: &str, claim: Claim) -> Result<usize, ServerError> {
        if !self.tokens.matches(claim.len, claim.hash) {
            return Err(ServerError::PrefixMismatch {
                session: session_id.to_owned(),
                claimed_len: claim.len,
                held_len: self.tokens.len(),
            });
        }
        let _span = tracing::info_span!("cache.rollback", to = claim.len, held = self.tokens.len()).entered();
        self.tokens.truncate(claim.len);
        if self.cache.len() > claim.len {
            self.cache.truncate(claim.len)?;
        }
        Ok(claim.len)
    }
}

/// A session as requests share it. The lock is tokio's for its owned guards: the model thread keeps a job's session
/// locked across the rounds of a batched draft.
pub type SharedSession = Arc<tokio::sync::Mutex<WorkerSession>>;

struct Entry {
    session: SharedSession,
    last_used: Instant,
    bytes: usize,
}

#[derive(Clone, Copy, Debug)]
pub struct SessionLimits {
    pub budget_bytes: usize,
    pub idle_timeout: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self { budget_bytes: 4 << 30, idle_timeout: Duration::from_secs(300) }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    pub sessions: usize,
    pub bytes: usize,
    pub evictions: u64,
}

pub struct SessionTable {
    entries: Mutex<HashMap<String, Entry>>,
    evictions: Mutex<u64>,
    limits: SessionLimits,
}

impl SessionTable {
    pub fn new(limits: SessionLimits) -> Self {
        Self { entries: Mutex::new(HashMap::new()), evictions: Mutex::new(0), limits }
    }

    /// Returns the session for a request: a fresh one for `full_context`, else the held one (its claim is checked
    /// later, under its lock: [`WorkerSession::resume`]).
    pub fn checkout(
        &self,
        id: &str,
        full_context: bool,
        new_cache: impl FnOnce() -> KvCache,
    ) -> Result<SharedSession, ServerError> {
        let mut entries = self.entries.lock().expect("session table poisoned");
        if full_context {
            let session = Arc::new(tokio::sync::Mutex::new(WorkerSession {
                cache: new_cache(),
                tokens: HashedTokens::default(),
            }));
            entries.insert(id.to_owned(), Entry { session: session.clone(), last_used: Instant::now(), bytes: 0 });
            return Ok(session);
        }
        let entry = entries.get_mut(id).ok_or_else(|| ServerError::SessionNotFound(id.to_owned()))?;
        entry.last_used = Instant::now();
        Ok(entry.session.clone())
    }

    /// Records the session's new size after a request and evicts least-recently-used idle sessions over budget;
    /// returns how many were evicted.
    pub fn checkin(&self, id: &str, bytes: usize) -> u64 {
        let mut entries = self.entries.lock().expect("session table poisoned");
        if let Some(entry) = entries.get_mut(id) {
            entry.bytes = bytes;
            entry.last_used = Instant::now();
        }
        let mut total: usize = entries.values().map(|e| e.bytes).sum();
        let mut evicted = 0;
        while total > self.limits.budget_bytes {
            // Only sessions nobody is using (the table holds the only reference) can go.
            let victim = entries
                .iter()
                .filter(|(key, e)| key.as_str() != id && Arc::strong_count(&e.session) == 1)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(key, _)| key.clone());
            let Some(victim) = victim else { break };
            if let Some(e) = entries.remove(&victim) {
                total -= e.bytes;
                evicted += 1;
                tracing::info!(session = %victim, bytes = e.bytes, "evicted session over memory budget");
            }
        }
        drop(entries);
        *self.evictions.lock().expect("poisoned") += evicted;
        evicted
    }

    pub fn release(&self, id: &str) -> bool {
        self.entries.lock().expect("session table poisoned").remove(id).is_some()
    }

    /// Drops sessions idle for longer than the timeout; returns how many.
    pub fn sweep_idle(&self) -> usize {
        let now = Instant::now();
        let mut entries = self.entries.lock().expect("session table poisoned");
        let before = entries.len();
        entries.retain(|_, e| {
            Arc::strong_count(&e.session) > 1 || now.duration_since(e.last_used) < self.limits.idle_timeout
        });
        let removed = before - entries.len();
        drop(entries);
        *self.evictions.lock().expect("poisoned") += removed as u64;
        removed
    }

    pub fn stats(&self) -> SessionStats {
        let entries = self.entries.lock().expect("session table poisoned");
        SessionStats {
            sessions: entries.len(),
            bytes: entries.values().map(|e| e.bytes).sum(),
            evictions: *self.evictions.lock().expect("poisoned"),
        }
    }

    pub fn contains(&self, id: &str) -> bool {
        self.entries.lock().expect("session table poisoned").contains_key(id)
    }

    pub fn limits(&self) -> SessionLimits {
        self.limits
    }
}
