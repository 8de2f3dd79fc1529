//! Cross-session batching on a worker (DESIGN §3.4): many sessions, one weight read.
//!
//! Each worker has one model thread, and every forward of the worker runs there, one at a time, over the rows of
//! every session that has work: CPU decode is memory-bound, so a forward over 8 sessions' rows costs little more
//! than one over a single session's, and parallel forwards would only fight over the cores.
//!
//! * A request submits a [`Job`] for its session into a bounded queue (when full, the request waits for room).
//! * The model thread takes what is queued, first come first served: jobs are admitted while the batch has fewer
//!   than `max_rows` input rows, and a job whose session is still busy with an earlier job (a pre-draft being
//!   cancelled) waits without holding up the others.
//! * Chunked prefill: a long round (a prompt, a draft catching up) beside other jobs' rounds is fed in pieces of
//!   what the row budget leaves — it counts as at most a quarter of `max_rows` for admission — so the sessions
//!   already decoding keep getting a token per forward instead of waiting out a whole prefill; alone, it runs
//!   whole up to `max_piece` tokens. Its logits come with its last piece, bitwise those of one whole forward (batch
//!   invariance).
//! * Bounded forwards: even alone, no forward feeds more than `max_piece` tokens of one round, so a long prefill
//!   reports progress after each piece ([`Job::fed`]), and a job whose client went away stops before its next piece —
//!   what it fed stays in its session for the retry to claim.
//! * A job runs in rounds, each one forward with the other admitted jobs ([`easd_model::Model::forward_batch`]:
//!   its own KV cache and positions, bitwise the logits it would get alone). A verify is one round; a draft's
//!   k-token proposal is k rounds, one row each after the first, so concurrent drafts advance in lock step and
//!   new ones join between rounds.
//! * The window: when the worker is idle — no session other than the queued ones was served in the last second
//!   — a batch starts at once. Otherwise (and when no rounds are under way) it is held open up to `window` for
//!   those sessions' requests, closing early once they are all queued or the rows are full.
//! * Exactness and claims: a job takes its session's lock when admitted and keeps it until its last round, checks
//!   the prefix claim (rolling the cache back) under it ([`Job::start`]), and a job whose client went away before
//!   it was admitted is dropped without touching the session — a cancelled pre-draft never rolls back what a later
//!   request built; a draft whose client leaves stops before its next round, freeing its place.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use easd_model::{BatchItem, Logits, Model};
use easd_telemetry::WorkerMetrics;
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

use crate::error::ServerError;
use crate::sessions::{SharedSession, WorkerSession};
use crate::worker::Worker;

/// Sessions served within this long count as active: the batch window waits only for them.
const ACTIVE_HORIZON: Duration = Duration::from_secs(1);

/// How a worker batches the forwards of concurrent sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchOptions {
    /// How long a batch is held open for other active sessions' requests (never when the worker is idle).
    /// Zero: batch only what is already queued when the model is free.
    pub window: Duration,
    /// Most input rows (tokens) in one forward; a longer round is fed in pieces beside other jobs and runs whole
    /// when alone. 1 turns batching off.
    pub max_rows: usize,
    /// Most requests waiting for the model thread; more wait for room (at least 1).
    pub queue: usize,
    /// Most tokens of one round fed in one forward, even alone (at least 1): a forward's time stays bounded, so a
    /// prefill reports progress and a cancelled one stops within a piece.
    pub max_piece: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        Self { window: Duration::from_millis(2), max_rows: 64, queue: 256, max_piece: DEFAULT_MAX_PIECE }
    }
}

/// 256 tokens: on two cores the 1.5B target feeds them in ~5 s at the start of a context and ~20 s deep in a 32k one,
/// well inside a call deadline, and a product of 256 rows is as fast per row as a longer one.
pub const DEFAULT_MAX_PIECE: usize = 256;

/// Input of one round of a job: `tokens` fed at the session's next position, logits for the last `rows` of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Round {
    pub tokens: Vec<u32>,
    pub rows: usize,
}

/// What a request asks of the model thread for its session. Called on the model thread, with the session locked.
pub trait Job: Send {
    /// The client went away: a job not started yet is dropped, a started one ends before its next round.
    fn cancelled(&self) -> bool;
    /// Checks the prefix claim (rolling the cache back) and returns the first round, or None when the job is done
    /// without a forward (a draft asked for one token that its session had already drawn).
    fn start(&mut self, session: &mut WorkerSession) -> Result<Option<Round>, ServerError>;
    /// Takes a round's logits (the session already holds the round's tokens) and returns the next round, or None
    /// when the job is done. `forward_seconds`: the batched forward's wall time.
    fn step(&mut self, session: &mut WorkerSession, logits: Logits, forward_seconds: f32) -> Option<Round>;
    /// Ends the job with an error for its client.
    fn fail(&mut self, error: ServerError);
    /// Part of a round was fed by a forward of `forward_seconds`: the session now holds `held` tokens (a prefill
    /// reports its progress here).
    fn fed(&mut self, _held: usize, _forward_seconds: f32) {}
}

/// A job with what the batcher needs to schedule it.
pub struct Ticket {
    session: SharedSession,
    session_id: String,
    /// The request's span: the claim check and the forwards are traced under it.
    span: tracing::Span,
    /// Input rows of the first round (known before the claim check), for the row budget.
    rows: usize,
    submitted: Instant,
    permit: Option<OwnedSemaphorePermit>,
    job: Box<dyn Job>,
}

impl Ticket {
    pub fn new(session: SharedSession, session_id: &str, rows: usize, job: Box<dyn Job>) -> Self {
        Self {
            session,
            session_id: session_id.to_owned(),
            span: tracing::Span::current(),
            rows,
            submitted: Instant::now(),
            permit: None,
            job,
        }
    }
}

struct Queue {
    tickets: VecDeque<Ticket>,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl Shared {
    /// Refuses new jobs and drops the queued ones (their requests see the worker gone).
    fn close(&self) {
        let dropped = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.closed = true;
            std::mem::take(&mut q.tickets)
        };
        drop(dropped);
        self.ready.notify_one();
    }

    /// Moves what is queued to `pending`; waits for something first (until `deadline`, or forever when None)
    /// if nothing is queued. False when the batcher is closed and nothing was taken.
    fn take(&self, pending: &mut VecDeque<Ticket>, deadline: Option<Instant>) -> bool {
        let mut q = self.queue.lock().expect("batch queue poisoned");
        loop {
            if !q.tickets.is_empty() {
                pending.extend(q.tickets.drain(..));
                return true;
            }
            if q.closed {
                return false;
            }
            q = match deadline {
                None => self.ready.wait(q).expect("batch queue poisoned"),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return true;
                    }
                    self.ready.wait_timeout(q, d - now).expect("batch queue poisoned").0
                }
            };
        }
    }
}

/// A worker's batcher: the queue and its model thread (which ends when the batcher is dropped).
pub struct Batcher {
    shared: Arc<Shared>,
    room: Arc<Semaphore>,
    forwards: Arc<AtomicU64>,
}

impl Batcher {
    /// Starts the model thread. `worker` is the worker owning this batcher (for check-ins after each job).
    pub fn start(
        model: Arc<Model>,
        options: BatchOptions,
        metrics: WorkerMetrics,
        worker: Weak<Worker>,
        role: &str,
    ) -> Self {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue { tickets: VecDeque::new(), closed: false }),
            ready: Condvar::new(),
        });
        let options = BatchOptions {
            max_rows: options.max_rows.max(1),
            queue: options.queue.max(1),
            max_piece: options.max_piece.max(1),
            ..options
        };
        let forwards = Arc::new(AtomicU64::new(0));
        let thread = ModelThread {
            forwards: forwards.clone(),
            shared: shared.clone(),
            model,
            options,
            metrics,
            worker,
            pending: VecDeque::new(),
            running: Vec::new(),
            recent: HashMap::new(),
        };
        std::thread::Builder::new()
            .name(format!("easd-{role}-model"))
            .spawn(move || thread.run())
            .expect("spawning the model thread");
        Self { shared, room: Arc::new(Semaphore::new(options.queue)), forwards }
    }

    /// Forwards the model thread has finished: a worker whose count moves is making progress.
    pub fn forwards_done(&self) -> u64 {
        self.forwards.load(Ordering::Relaxed)
    }

    /// Queues a job, waiting for room when the queue is full. Cancel-safe: a caller dropped while waiting leaves
    /// nothing queued.
    pub async fn submit(&self, mut ticket: Ticket) -> Result<(), ServerError> {
        let closed = || ServerError::Unavailable("the worker is shutting down".into());
        ticket.permit = Some(self.room.clone().acquire_owned().await.map_err(|_| closed())?);
        let mut q = self.shared.queue.lock().expect("batch queue poisoned");
        if q.closed {
            return Err(closed());
        }
        q.tickets.push_back(ticket);
        drop(q);
        self.shared.ready.notify_one();
        Ok(())
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        // No join: the last reference to the worker may be dropped on the model thread itself.
        self.room.close();
        self.shared.close();
    }
}

/// Closes the queue when the model thread ends, also by a panic: requests then fail at once instead of waiting.
struct CloseOnExit(Arc<Shared>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!("the model thread panicked; the worker refuses further requests");
        }
        self.0.close();
    }
}

/// An admitted job: its session stays locked until the job ends.
struct Running {
    ticket: Ticket,
    session: OwnedMutexGuard<WorkerSession>,
    round: Round,
    /// Whether a forward ran for it (the session then needs a check-in).
    forwarded: bool,
    /// Part of its round has been fed (a prompt in pieces): the rest is what `round` holds.
    partial: bool,
}

/// Tokens of each round that one forward feeds, in the running jobs' order (`rounds`: input tokens and logits
/// rows). Whole rounds while they fit in `max_rows`, or when only one job runs; otherwise the rounds that cannot
/// be split (all their tokens want logits) go whole, and the others take what the budget leaves, first come first
/// served, stopping short of their logits rows until their last piece (0: it sits this forward out). Either way a
/// round that can be split feeds at most `max_piece` tokens.
fn plan_pieces(rounds: &[(usize, usize)], max_rows: usize, max_piece: usize) -> Vec<usize> {
    let splittable = |(len, rows): (usize, usize)| len > rows;
    let cap = |(len, rows): (usize, usize), piece: usize| {
        if splittable((len, rows)) && piece > max_piece { max_piece.min(len - rows) } else { piece }
    };
    let total: usize = rounds.iter().map(|r| r.0).sum();
    if rounds.len() <= 1 || total <= max_rows {
        return rounds.iter().map(|&r| cap(r, r.0)).collect();
    }
    let whole: usize = rounds.iter().filter(|r| !splittable(**r)).map(|r| r.0).sum();
    let mut left = max_rows.saturating_sub(whole);
    rounds
        .iter()
        .map(|&(len, rows)| {
            if !splittable((len, rows)) {
                return len;
            }
            let piece = cap((len, rows), if len <= left { len } else { left.min(len - rows) });
            left -= piece;
            piece
        })
        .collect()
}

/// Rows a job with a `rows`-token round counts for admission: a long round takes what is left in pieces, so it
/// holds back at most a quarter of the budget from the jobs that come after it.
fn admission_rows(rows: usize, max_rows: usize) -> usize {
    rows.min((max_rows / 4).max(1))
}

struct ModelThread {
    shared: Arc<Shared>,
    forwards: Arc<AtomicU64>,
    model: Arc<Model>,
    options: BatchOptions,
    metrics: WorkerMetrics,
    worker: Weak<Worker>,
    /// Taken from the queue, not admitted yet (arrival order).
    pending: VecDeque<Ticket>,
    running: Vec<Running>,
    /// Sessions served recently, when (the window waits only for them).
    recent: HashMap<String, Instant>,
}

impl ModelThread {
    fn run(mut self) {
        let _close = CloseOnExit(self.shared.clone());
        loop {
            let idle = self.running.is_empty() && self.pending.is_empty();
            // Closed: what was taken still runs to its end; the thread ends once idle.
            if !self.shared.take(&mut self.pending, if idle { None } else { Some(Instant::now()) }) && idle {
                break;
            }
            // A prompt fed in pieces holds the batch open too: the sessions decoding beside it come back for their
            // next token within the window.
            if self.running.iter().all(|r| r.partial) && !self.options.window.is_zero() {
                self.hold_open();
            }
            self.admit();
            if self.running.is_empty() {
                if !self.pending.is_empty() {
                    // Everything pending waits for a busy session (not expected: only jobs lock sessions).
                    let pause = Duration::from_millis(1);
                    if !self.shared.take(&mut self.pending, Some(Instant::now() + pause)) {
                        std::thread::sleep(pause);
                    }
                }
                continue;
            }
            self.forward();
        }
    }

    /// Holds the batch open up to the window while other recently active sessions may still send requests.
    fn hold_open(&mut self) {
        let deadline = Instant::now() + self.options.window;
        while self.pending_rows() < self.options.max_rows && self.others_expected() && Instant::now() < deadline {
            if !self.shared.take(&mut self.pending, Some(deadline)) {
                return;
            }
        }
    }

    fn pending_rows(&self) -> usize {
        self.pending.iter().map(|t| t.rows).sum()
    }

    /// Whether a session served recently (and not released since) has no request queued.
    fn others_expected(&mut self) -> bool {
        let now = Instant::now();
        self.recent.retain(|_, seen| now.duration_since(*seen) < ACTIVE_HORIZON);
        let Some(worker) = self.worker.upgrade() else { return false };
        let waiting = |id: &String| {
            self.pending.iter().any(|t| &t.session_id == id) || self.running.iter().any(|r| &r.ticket.session_id == id)
        };
        self.recent.keys().any(|id| !waiting(id) && worker.sessions.contains(id))
    }

    /// Admits pending jobs in arrival order while the rows fit: locks each one's session and starts it.
    fn admit(&mut self) {
        let max_rows = self.options.max_rows;
        let mut rows: usize = self.running.iter().map(|r| admission_rows(r.round.tokens.len(), max_rows)).sum();
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].job.cancelled() {
                // Never started: the session is untouched.
                self.pending.remove(i);
                continue;
            }
            let Ok(session) = self.pending[i].session.clone().try_lock_owned() else {
                i += 1; // its session is busy with an earlier job of the same session
                continue;
            };
            if rows > 0 && rows + admission_rows(self.pending[i].rows, max_rows) > max_rows {
                break; // first come, first served: it leads the next batch
            }
            let mut ticket = self.pending.remove(i).expect("index checked");
            ticket.permit = None;
            self.metrics.observe_queue_wait_seconds(ticket.submitted.elapsed().as_secs_f64());
            let mut session = session;
            let started = ticket.span.in_scope(|| ticket.job.start(&mut session));
            match started {
                Ok(Some(round)) => {
                    rows += admission_rows(round.tokens.len(), max_rows);
                    self.running.push(Running { ticket, session, round, forwarded: false, partial: false });
                }
                Ok(None) => {}
                Err(e) => ticket.job.fail(e),
            }
        }
    }

    /// One forward over the current round of every running job, then each job's next step.
    fn forward(&mut self) {
        // A job whose client left ends before its next round; a bad input fails alone, not the batch.
        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            let check = self.model.check_item(&r.session.cache, &r.round.tokens, r.session.tokens.len(), r.round.rows);
            if r.ticket.job.cancelled() {
                self.finish(i);
            } else if let Err(e) = check {
                self.running[i].ticket.job.fail(e.into());
                self.finish(i);
            } else {
                i += 1;
            }
        }
        if self.running.is_empty() {
            return;
        }
        let rounds: Vec<(usize, usize)> = self.running.iter().map(|r| (r.round.tokens.len(), r.round.rows)).collect();
        let pieces = plan_pieces(&rounds, self.options.max_rows, self.options.max_piece);
        // A piece short of its round feeds one logits row nobody reads: the model always returns at least one.
        let logit_rows = |i: usize| if pieces[i] == rounds[i].0 { rounds[i].1 } else { 1 };
        let fed: Vec<usize> = (0..pieces.len()).filter(|&i| pieces[i] > 0).collect();
        let (sessions, rows) = (fed.len(), pieces.iter().sum::<usize>());
        let spans: Vec<tracing::Span> = fed
            .iter()
            .map(|&i| {
                let r = &self.running[i];
                tracing::info_span!(
                    parent: &r.ticket.span,
                    "forward",
                    batch_len = pieces[i],
                    pos = r.session.tokens.len(),
                    batch_sessions = sessions,
                    batch_rows = rows
                )
            })
            .collect();
        let started = Instant::now();
        let result = {
            let mut items: Vec<BatchItem<'_>> = self
                .running
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| pieces[*i] > 0)
                .map(|(i, r)| {
                    let session = &mut *r.session;
                    let start_pos = session.tokens.len();
                    BatchItem {
                        cache: &mut session.cache,
                        tokens: &r.round.tokens[..pieces[i]],
                        start_pos,
                        n_rows: logit_rows(i),
                    }
                })
                .collect();
            self.model.forward_batch(&mut items)
        };
        let seconds = started.elapsed().as_secs_f64();
        self.forwards.fetch_add(1, Ordering::Relaxed);
        drop(spans);
        self.metrics.observe_forward_seconds(rows, seconds);
        self.metrics.observe_batch_sessions(sessions);
        let logits = match result {
            Ok(logits) => logits,
            Err(e) => {
                tracing::error!(error = %e, sessions, rows, "batched forward failed");
                while !self.running.is_empty() {
                    let r = &mut self.running[0];
                    r.ticket.job.fail(ServerError::Internal(format!("forward failed: {e}")));
                    self.finish(0);
                }
                return;
            }
        };
        let now = Instant::now();
        let mut logits = logits.into_iter();
        let mut next = Vec::with_capacity(self.running.len());
        for (i, mut r) in std::mem::take(&mut self.running).into_iter().enumerate() {
            if pieces[i] == 0 {
                next.push(r);
                continue;
            }
            let logits = logits.next().expect("one logits per fed job");
            r.forwarded = true;
            self.recent.insert(r.ticket.session_id.clone(), now);
            r.session.tokens.extend(&r.round.tokens[..pieces[i]]);
            r.round.tokens.drain(..pieces[i]);
            // The rest of a round fed in pieces waits for the next forward; the job sees only its last piece's logits.
            r.partial = !r.round.tokens.is_empty();
            if r.partial {
                let held = r.session.tokens.len();
                r.ticket.span.in_scope(|| r.ticket.job.fed(held, seconds as f32));
                next.push(r);
                continue;
            }
            let session = &mut *r.session;
            let step = r.ticket.span.in_scope(|| r.ticket.job.step(session, logits, seconds as f32));
            match step {
                Some(round) => {
                    r.round = round;
                    next.push(r);
                }
                None => self.check_in(r),
            }
        }
        self.running = next;
    }

    /// Ends running job `i`: unlocks its session and checks it in.
    fn finish(&mut self, i: usize) {
        let r = self.running.remove(i);
        self.check_in(r);
    }

    fn check_in(&self, r: Running) {
        let Running { ticket, session, forwarded, .. } = r;
        let bytes = session.cache.bytes();
        drop(session);
        if forwarded && let Some(worker) = self.worker.upgrade() {
            worker.checkin(&ticket.session_id, bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc as std_mpsc;

    use easd_model::{LoadOptions, TinySpec, write_tiny_gguf};
    use futures::FutureExt;
    use tokio::sync::oneshot;

    use super::*;
    use crate::sessions::SessionLimits;

    fn tiny_worker(batch: BatchOptions) -> (tempfile::TempDir, Arc<Worker>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_tiny_gguf(&path, &TinySpec::qwen2(7)).unwrap();
        let model = Arc::new(Model::load(&path, &LoadOptions { warmup: false, ..LoadOptions::default() }).unwrap());
        (dir, Worker::with_batching(model, SessionLimits::default(), batch, "verifier"))
    }

    /// No window: what is queued when the model is free is the batch (deterministic for these tests).
    fn no_window() -> BatchOptions {
        BatchOptions { window: Duration::ZERO, ..BatchOptions::default() }
    }

    type Log = Arc<Mutex<Vec<String>>>;

    /// A scripted request: one-token rounds, logging each start (with the session's length) and step.
    struct Probe {
        name: &'static str,
        rounds: usize,
        log: Log,
        cancel: Arc<AtomicBool>,
        /// Its own client leaves during this step (a dropped pre-draft).
        leave_at_step: Option<usize>,
        /// Rolls the session back to this length at start (as a prefix claim does).
        claim: Option<usize>,
        /// Holds the model thread in its first step: says it is there, then waits to be let go.
        gate: Option<(oneshot::Sender<()>, std_mpsc::Receiver<()>)>,
        done: Option<oneshot::Sender<()>>,
        steps: usize,
    }

    impl Probe {
        fn new(name: &'static str, rounds: usize, log: &Log) -> (Self, oneshot::Receiver<()>) {
            let (done, finished) = oneshot::channel();
            let probe = Probe {
                name,
                rounds,
                log: log.clone(),
                cancel: Arc::new(AtomicBool::new(false)),
                leave_at_step: None,
                claim: None,
                gate: None,
                done: Some(done),
                steps: 0,
            };
            (probe, finished)
        }
    }

    impl Job for Probe {
        fn cancelled(&self) -> bool {
            self.cancel.load(Ordering::SeqCst)
        }

        fn start(&mut self, session: &mut WorkerSession) -> Result<Option<Round>, ServerError> {
            if let Some(len) = self.claim {
                session.tokens.truncate(len);
                session.cache.truncate(len)?;
            }
            self.log.lock().unwrap().push(format!("{} start at {}", self.name, session.tokens.len()));
            Ok(Some(Round { tokens: vec![1], rows: 1 }))
        }

        fn step(&mut self, _: &mut WorkerSession, logits: Logits, _: f32) -> Option<Round> {
            assert_eq!(logits.rows(), 1);
            if let Some((entered, release)) = self.gate.take() {
                entered.send(()).unwrap();
                release.recv().unwrap();
            }
            self.steps += 1;
            self.log.lock().unwrap().push(format!("{} step", self.name));
            if self.leave_at_step == Some(self.steps) {
                self.cancel.store(true, Ordering::SeqCst);
            }
            if self.steps == self.rounds {
                let _ = self.done.take().unwrap().send(());
                return None;
            }
            Some(Round { tokens: vec![2], rows: 1 })
        }

        fn fail(&mut self, error: ServerError) {
            self.log.lock().unwrap().push(format!("{} failed: {error}", self.name));
        }
    }

    fn session(worker: &Worker, id: &str) -> SharedSession {
        worker.sessions.checkout(id, true, || worker.model.new_cache()).unwrap()
    }

    async fn submit(worker: &Worker, id: &str, probe: Probe) {
        worker.submit(Ticket::new(session_of(worker, id), id, 1, Box::new(probe))).await.unwrap();
    }

    /// The session `id`, created on first use.
    fn session_of(worker: &Worker, id: &str) -> SharedSession {
        if worker.sessions.contains(id) {
            worker.sessions.checkout(id, false, || unreachable!()).unwrap()
        } else {
            session(worker, id)
        }
    }

    /// Queues a probe that holds the model thread in its step until the returned sender is dropped or used.
    async fn hold_model_thread(worker: &Worker, log: &Log) -> (std_mpsc::Sender<()>, oneshot::Receiver<()>) {
        let (mut gate, finished) = Probe::new("gate", 1, log);
        let (entered, is_in) = oneshot::channel();
        let (release, wait) = std_mpsc::channel();
        gate.gate = Some((entered, wait));
        submit(worker, "gate", gate).await;
        is_in.await.unwrap();
        (release, finished)
    }

    /// (forwards, sessions summed over forwards) from the batch-size histogram.
    fn batch_stats(worker: &Worker) -> (f64, f64) {
        let text = worker.metrics().encode();
        let value = |series: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("{series} in\n{text}"))
        };
        (
            value(r#"easd_worker_batch_sessions_count{role="verifier"}"#),
            value(r#"easd_worker_batch_sessions_sum{role="verifier"}"#),
        )
    }

    fn entries(log: &Log) -> Vec<String> {
        log.lock().unwrap().iter().filter(|e| !e.starts_with("gate")).cloned().collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_jobs_advance_in_lock_step_one_forward_per_round() {
        let (_d, worker) = tiny_worker(no_window());
        let log = Log::default();
        let (release, gate_done) = hold_model_thread(&worker, &log).await;
        let mut done = Vec::new();
        for name in ["a", "b", "c", "d"] {
            let (probe, finished) = Probe::new(name, 3, &log);
            submit(&worker, name, probe).await;
            done.push(finished);
        }
        release.send(()).unwrap();
        gate_done.await.unwrap();
        for d in done {
            d.await.unwrap();
        }
        // The gate alone, then three rounds of all four sessions.
        assert_eq!(batch_stats(&worker), (4.0, 13.0));
        let round = |what: &str| ["a", "b", "c", "d"].map(|n| format!("{n} {what}"));
        let expected: Vec<String> =
            [round("start at 0"), round("step"), round("step"), round("step")].into_iter().flatten().collect();
        assert_eq!(entries(&log), expected);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_keeps_to_its_rows_first_come_first_served() {
        let (_d, worker) = tiny_worker(BatchOptions { max_rows: 2, ..no_window() });
        let log = Log::default();
        let (release, _gate_done) = hold_model_thread(&worker, &log).await;
        let mut done = Vec::new();
        for name in ["a", "b", "c", "d", "e"] {
            let (probe, finished) = Probe::new(name, 1, &log);
            submit(&worker, name, probe).await;
            done.push(finished);
        }
        release.send(()).unwrap();
        for d in done {
            d.await.unwrap();
        }
        // The gate, then a+b, c+d, e.
        assert_eq!(batch_stats(&worker), (4.0, 6.0));
        let starts: Vec<String> = entries(&log).into_iter().filter(|e| e.contains("start")).collect();
        assert_eq!(starts, ["a", "b", "c", "d", "e"].map(|n| format!("{n} start at 0")));
    }

    /// A one-round job over a whole prompt, logits for its last token: it records them.
    struct Prompt {
        tokens: Vec<u32>,
        logits: Arc<Mutex<Option<Vec<f32>>>>,
        done: Option<oneshot::Sender<()>>,
    }

    impl Job for Prompt {
        fn cancelled(&self) -> bool {
            false
        }

        fn start(&mut self, _: &mut WorkerSession) -> Result<Option<Round>, ServerError> {
            Ok(Some(Round { tokens: self.tokens.clone(), rows: 1 }))
        }

        fn step(&mut self, session: &mut WorkerSession, logits: Logits, _: f32) -> Option<Round> {
            assert_eq!(session.tokens.tokens(), self.tokens, "the session holds the whole prompt");
            assert_eq!(logits.rows(), 1);
            *self.logits.lock().unwrap() = Some(logits.row(0).to_vec());
            let _ = self.done.take().unwrap().send(());
            None
        }

        fn fail(&mut self, error: ServerError) {
            panic!("prompt failed: {error}");
        }
    }

    /// Queues the prompt `tokens` for session `id`; resolves to its last token's logits.
    async fn submit_prompt(worker: &Worker, id: &str, tokens: &[u32]) -> impl Future<Output = Vec<f32>> + use<> {
        let (done, finished) = oneshot::channel();
        let logits = Arc::new(Mutex::new(None));
        let job = Prompt { tokens: tokens.to_vec(), logits: logits.clone(), done: Some(done) };
        worker.submit(Ticket::new(session_of(worker, id), id, tokens.len(), Box::new(job))).await.unwrap();
        async move {
            finished.await.unwrap();
            logits.lock().unwrap().take().unwrap()
        }
    }

    #[test]
    fn long_rounds_take_what_the_row_budget_leaves_stopping_short_of_their_logits_rows() {
        // Alone, or all fitting: whole.
        assert_eq!(plan_pieces(&[(100, 1)], 8, 512), [100]);
        assert_eq!(plan_pieces(&[(5, 1), (1, 1), (2, 2)], 8, 512), [5, 1, 2]);
        // Rounds that want logits for every token go whole; the long ones share the rest in arrival order.
        assert_eq!(plan_pieces(&[(20, 1), (1, 1), (1, 1)], 8, 512), [6, 1, 1]);
        assert_eq!(plan_pieces(&[(1, 1), (20, 1), (20, 1), (5, 5)], 16, 512), [1, 10, 0, 5]);
        // A piece never reaches into the last `rows` tokens unless it is the whole round.
        assert_eq!(plan_pieces(&[(1, 1), (9, 4)], 8, 512), [1, 5]);
        assert_eq!(plan_pieces(&[(1, 1), (8, 4)], 8, 512), [1, 4]);
        assert_eq!(plan_pieces(&[(1, 1), (7, 4)], 8, 512), [1, 7]);
        // Nothing left over: the long round sits the forward out.
        assert_eq!(plan_pieces(&[(8, 8), (9, 1)], 8, 512), [8, 0]);
        // Alone or not, a long round feeds at most `max_piece` tokens, short of its logits rows until its last piece.
        assert_eq!(plan_pieces(&[(100, 1)], 8, 32), [32]);
        assert_eq!(plan_pieces(&[(34, 4)], 8, 32), [30]);
        assert_eq!(plan_pieces(&[(30, 4)], 8, 32), [30]);
        assert_eq!(plan_pieces(&[(5, 5), (100, 1)], 64, 32), [5, 32]);
        assert_eq!(plan_pieces(&[(40, 40)], 8, 32), [40], "a round that wants every row's logits is never split");
        // For admission a long round counts as at most a quarter of the budget.
        assert_eq!(admission_rows(125, 64), 16);
        assert_eq!(admission_rows(5, 64), 5);
        assert_eq!(admission_rows(125, 1), 1);
    }

    /// A prompt whose client leaves once `leave_after` tokens are fed; reports what it was told and when it ended.
    struct Leaver {
        tokens: Vec<u32>,
        leave_after: usize,
        left: bool,
        fed: Arc<Mutex<Vec<usize>>>,
        ended: Option<oneshot::Sender<()>>,
    }

    impl Job for Leaver {
        fn cancelled(&self) -> bool {
            self.left
        }

        fn start(&mut self, _: &mut WorkerSession) -> Result<Option<Round>, ServerError> {
            Ok(Some(Round { tokens: self.tokens.clone(), rows: 1 }))
        }

        fn fed(&mut self, held: usize, _: f32) {
            self.fed.lock().unwrap().push(held);
            self.left = held >= self.leave_after;
        }

        fn step(&mut self, _: &mut WorkerSession, _: Logits, _: f32) -> Option<Round> {
            None
        }

        fn fail(&mut self, error: ServerError) {
            panic!("prompt failed: {error}");
        }
    }

    impl Drop for Leaver {
        fn drop(&mut self) {
            let _ = self.ended.take().map(|e| e.send(()));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_prompt_alone_is_fed_in_pieces_of_max_piece_with_the_logits_of_one_forward() {
        let prompt: Vec<u32> = (1..=9).collect();
        let (_d, whole_worker) = tiny_worker(no_window());
        let whole = submit_prompt(&whole_worker, "p", &prompt).await.await;
        let (_d2, worker) = tiny_worker(BatchOptions { max_piece: 4, ..no_window() });
        let pieces = submit_prompt(&worker, "p", &prompt).await.await;
        assert_eq!(batch_stats(&worker), (3.0, 3.0), "pieces of 4, 4 and 1 tokens");
        assert_eq!(pieces, whole, "bitwise the logits of one forward");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prompt_whose_client_leaves_stops_within_a_piece_and_keeps_what_it_fed() {
        let (_d, worker) = tiny_worker(BatchOptions { max_piece: 4, ..no_window() });
        let (ended, has_ended) = oneshot::channel();
        let fed = Arc::new(Mutex::new(Vec::new()));
        let job =
            Leaver { tokens: (1..=20).collect(), leave_after: 8, left: false, fed: fed.clone(), ended: Some(ended) };
        worker.submit(Ticket::new(session_of(&worker, "p"), "p", 20, Box::new(job))).await.unwrap();
        has_ended.await.unwrap();
        assert_eq!(*fed.lock().unwrap(), [4, 8], "progress after each piece, none after the client left");
        assert_eq!(batch_stats(&worker), (2.0, 2.0), "no forward after the client left");
        let session = session_of(&worker, "p");
        let held = session.lock().await;
        assert_eq!(held.tokens.tokens(), &(1..=8).collect::<Vec<u32>>()[..], "the fed pieces stay for a retry");
        assert_eq!(held.cache.len(), 8);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prompt_beside_a_decoding_session_is_fed_in_pieces_with_the_logits_it_gets_alone() {
        let options = BatchOptions { max_rows: 4, ..no_window() };
        let prompt: Vec<u32> = (1..=9).collect();
        let (_d, alone_worker) = tiny_worker(options);
        let alone = submit_prompt(&alone_worker, "p", &prompt).await.await;
        assert_eq!(batch_stats(&alone_worker), (1.0, 1.0), "alone, a prompt runs whole");

        let (_d2, worker) = tiny_worker(options);
        let log = Log::default();
        let (release, _gate_done) = hold_model_thread(&worker, &log).await;
        let (decoder, decoded) = Probe::new("a", 3, &log);
        submit(&worker, "a", decoder).await;
        let beside = submit_prompt(&worker, "p", &prompt).await;
        release.send(()).unwrap();
        let beside = beside.await;
        decoded.await.unwrap();
        // The gate; then three forwards of a's token and three of the prompt's: a never waited for the prefill.
        assert_eq!(batch_stats(&worker), (4.0, 7.0));
        assert_eq!(entries(&log), ["a start at 0", "a step", "a step", "a step"]);
        assert!(alone.iter().zip(&beside).all(|(x, y)| x.to_bits() == y.to_bits()), "pieces change no bit");
    }

    /// A later job of the same session waits for the earlier one's last round (the lock is held across rounds)
    /// without holding up other sessions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_of_one_session_never_interleave() {
        let (_d, worker) = tiny_worker(no_window());
        let log = Log::default();
        let (release, _gate_done) = hold_model_thread(&worker, &log).await;
        let (first, first_done) = Probe::new("s1", 3, &log);
        let (second, second_done) = Probe::new("s2", 1, &log);
        let (other, other_done) = Probe::new("t", 1, &log);
        submit(&worker, "s", first).await;
        submit(&worker, "s", second).await;
        submit(&worker, "t", other).await;
        release.send(()).unwrap();
        for d in [first_done, second_done, other_done] {
            d.await.unwrap();
        }
        let expected = ["s1 start at 0", "t start at 0", "s1 step", "t step", "s1 step", "s1 step", "s2 start at 3"];
        assert_eq!(entries(&log)[..expected.len()], expected);
    }

    /// A request cancelled while queued (a dropped pre-draft) never runs: its claim would roll back what a later
    /// request of the session builds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_cancelled_before_admission_never_touches_its_session() {
        let (_d, worker) = tiny_worker(no_window());
        let log = Log::default();
        let (build, built) = Probe::new("build", 4, &log);
        submit(&worker, "s", build).await;
        built.await.unwrap();
        let (release, _gate_done) = hold_model_thread(&worker, &log).await;
        let (mut dropped, _never) = Probe::new("dropped", 1, &log);
        dropped.claim = Some(0);
        let cancel = dropped.cancel.clone();
        submit(&worker, "s", dropped).await;
        cancel.store(true, Ordering::SeqCst);
        let (next, next_done) = Probe::new("next", 1, &log);
        submit(&worker, "s", next).await;
        release.send(()).unwrap();
        next_done.await.unwrap();
        assert!(!entries(&log).iter().any(|e| e.starts_with("dropped")), "{:?}", entries(&log));
        assert!(entries(&log).contains(&"next start at 4".to_owned()), "{:?}", entries(&log));
    }

    /// A draft whose client leaves stops before its next round and frees its session for the next request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_running_job_whose_client_left_stops_before_its_next_round() {
        let (_d, worker) = tiny_worker(no_window());
        let log = Log::default();
        let (mut leaving, _never) = Probe::new("leaving", 10, &log);
        leaving.leave_at_step = Some(2);
        submit(&worker, "s", leaving).await;
        let (next, next_done) = Probe::new("next", 1, &log);
        submit(&worker, "s", next).await;
        next_done.await.unwrap();
        let steps = entries(&log).iter().filter(|e| *e == "leaving step").count();
        assert_eq!(steps, 2);
        assert!(entries(&log).contains(&"next start at 2".to_owned()), "{:?}", entries(&log));
    }

    /// Beyond the queue's room a request waits; one dropped while waiting leaves nothing behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_queue_is_bounded_and_a_request_waiting_for_room_can_be_cancelled() {
        let (_d, worker) = tiny_worker(BatchOptions { queue: 1, ..no_window() });
        let log = Log::default();
        let (release, _gate_done) = hold_model_thread(&worker, &log).await;
        let (queued, queued_done) = Probe::new("queued", 1, &log);
        submit(&worker, "a", queued).await;
        let (waiting, _never) = Probe::new("waiting", 1, &log);
        let ticket = Ticket::new(session_of(&worker, "b"), "b", 1, Box::new(waiting));
        let mut wait_for_room = Box::pin(worker.submit(ticket));
        assert!((&mut wait_for_room).now_or_never().is_none(), "no room while one request is queued");
        drop(wait_for_room);
        release.send(()).unwrap();
        queued_done.await.unwrap();
        let (later, later_done) = Probe::new("later", 1, &log);
        submit(&worker, "c", later).await;
        later_done.await.unwrap();
        assert_eq!(entries(&log), ["queued start at 0", "queued step", "later start at 0", "later step"]);
    }

    /// No wait when no other session is active; with one active, the batch waits for its request (and closes as
    /// soon as it is queued, well before the window ends); a released session is not waited for.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_window_waits_only_for_other_active_sessions() {
        let window = Duration::from_secs(3);
        let (_d, worker) = tiny_worker(BatchOptions { window, ..BatchOptions::default() });
        let log = Log::default();
        let timed = async |id: &'static str| {
            let (probe, done) = Probe::new(id, 1, &log);
            let started = Instant::now();
            submit(&worker, id, probe).await;
            (started, done)
        };
        let (started, done) = timed("a").await;
        done.await.unwrap();
        assert!(started.elapsed() < window / 2, "an idle worker starts at once: {:?}", started.elapsed());
        assert_eq!(batch_stats(&worker), (1.0, 1.0));

        // "a" was just served: "b" waits for it, and the two share a forward.
        let (started, b_done) = timed("b").await;
        let (_, a_done) = timed("a").await;
        b_done.await.unwrap();
        a_done.await.unwrap();
        assert!(started.elapsed() < window / 2, "closed once every active session was queued");
        assert_eq!(batch_stats(&worker), (2.0, 3.0));

        // Both released: nobody to wait for.
        worker.sessions.release("a");
        worker.sessions.release("b");
        let (started, done) = timed("c").await;
        done.await.unwrap();
        assert!(started.elapsed() < window / 2, "released sessions are not waited for: {:?}", started.elapsed());
    }
}
