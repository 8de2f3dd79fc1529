//! Per-session KV caches on a worker, bounded by a memory budget (LRU eviction) and an idle timeout.
//!
//! A session is checked out for the length of one request (its `Arc` is then shared), so eviction never
//! touches a cache that a forward pass is using. The prefix claim is checked under the session's lock, in the same
//! critical section as the forward it guards ([`WorkerSession::resume`], called by the worker's model thread, which
//! holds the lock from the check to the job's last forward — `crate::batcher`): a request that was cancelled while
//! queued behind another one (a dropped pre-draft) can then never leave the next request computing on a context it
//! did not claim.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use easd_core::{DraftToken, SamplingParams};
use easd_model::KvCache;

use crate::error::ServerError;
use crate::prefix::HashedTokens;

/// What a worker holds for one session: the cache and the exact tokens in it.
pub struct WorkerSession {
    pub cache: KvCache,
    pub tokens: HashedTokens,
    /// A draft's last draws, newest last (see [`WorkerSession::resume_keeping`]).
    draws: VecDeque<KeptDraw>,
}

/// Draws a draft session keeps: the forward cut short by a closed stream, and the one a late close lets through.
const KEPT_DRAWS: usize = 2;

/// How a draft draws its proposals; a kept draw is reused only by a request that draws the same way.
#[derive(Clone, Debug, PartialEq)]
pub struct DrawSettings {
    pub params: SamplingParams,
    pub seed: u64,
    pub support: usize,
    pub top_n: usize,
}

/// A draft's draw at the position after the first `len` tokens of its session, whose hash is `hash`.
struct KeptDraw {
    len: usize,
    hash: u64,
    settings: DrawSettings,
    token: DraftToken,
}

/// "The session holds these `len` tokens, whose rolling hash is `hash`" (a request's prefix claim, decoded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    pub len: usize,
    pub hash: u64,
}

impl WorkerSession {
    pub fn new(cache: KvCache) -> Self {
        Self { cache, tokens: HashedTokens::default(), draws: VecDeque::new() }
    }

    /// Keeps a draft's draw at the position after every token the session holds, for a later
    /// [`WorkerSession::resume_keeping`].
    pub fn keep_draw(&mut self, settings: &DrawSettings, token: DraftToken) {
        if self.draws.len() == KEPT_DRAWS {
            self.draws.pop_front();
        }
        let len = self.tokens.len();
        let (hash, settings) = (self.tokens.hash_of_prefix(len), settings.clone());
        self.draws.push_back(KeptDraw { len, hash, settings, token });
    }

    /// [`WorkerSession::resume`] for a draft request that feeds `new_tokens` after the claimed prefix, keeping
    /// what the session already holds of them. A pipelined pre-draft that the coordinator cut short has fed one
    /// token more than the coordinator saw (the forward that was running when the stream closed), and the next
    /// pre-draft starts with exactly that token: it needs no second forward, and with the draw after it kept, its
    /// first proposal needs none at all. Returns how many of `new_tokens` are held (the rest is to be fed) and, when
    /// all are, the kept draw after them. Exact: a token's cache entries and logits do not depend on which forward
    /// computed them (the batch-invariant runtime, DESIGN §3.4), and a draw depends only on those logits, the
    /// settings and the position.
    pub fn resume_keeping(
        &mut self,
        session_id: &str,
        claim: Claim,
        new_tokens: &[u32],
        settings: &DrawSettings,
    ) -> Result<(usize, Option<DraftToken>), ServerError> {
        self.check_claim(session_id, claim)?;
        let beyond = &self.tokens.tokens()[claim.len..];
        let mut held = beyond.iter().zip(new_tokens).take_while(|(a, b)| a == b).count();
        let mut draw = None;
        if held == new_tokens.len() && held > 0 {
            let len = claim.len + held;
            let kept = self
                .draws
                .iter()
                .rposition(|d| d.len == len && self.tokens.matches(len, d.hash) && d.settings == *settings);
            match kept {
                // Taken out: the request sends it and keeps it again.
                Some(i) => draw = self.draws.remove(i).map(|d| d.token),
                // Without the draw after it, the last token is fed again.
                None => held -= 1,
            }
        }
        self.roll_back(claim.len + held)?;
        Ok((held, draw))
    }

    /// Checks the claim against what the session holds and rolls the cache back to it; returns the position the
    /// next forward starts at. Call with the session locked, in the critical section of the forward.
    pub fn resume(&mut self, session_id: &str, claim: Claim) -> Result<usize, ServerError> {
        self.check_claim(session_id, claim)?;
        self.roll_back(claim.len)?;
        Ok(claim.len)
    }

    fn check_claim(&self, session_id: &str, claim: Claim) -> Result<(), ServerError> {
        if !self.tokens.matches(claim.len, claim.hash) {
            return Err(ServerError::PrefixMismatch {
                session: session_id.to_owned(),
                claimed_len: claim.len,
                held_len: self.tokens.len(),
            });
        }
        Ok(())
    }

    fn roll_back(&mut self, len: usize) -> Result<(), ServerError> {
        let _span = tracing::info_span!("cache.rollback", to = len, held = self.tokens.len()).entered();
        self.tokens.truncate(len);
        if self.cache.len() > len {
            self.cache.truncate(len)?;
        }
        Ok(())
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
            let session = Arc::new(tokio::sync::Mutex::new(WorkerSession::new(new_cache())));
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

    /// Marks the sessions among `ids` as used now (a coordinator still holds them); returns how many were held.
    pub fn touch(&self, ids: &[String]) -> usize {
        let now = Instant::now();
        let mut entries = self.entries.lock().expect("session table poisoned");
        let mut held = 0;
        for id in ids {
            if let Some(entry) = entries.get_mut(id) {
                entry.last_used = now;
                held += 1;
            }
        }
        held
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
