//! The process's kernel threads: a small pool of its own, sized once (`set_threads`, default all
//! cores), in which the calling thread takes part.
//!
//! A decode step makes a few hundred short parallel calls (every product, every attention). Handing
//! each to sleeping threads and waking the caller afterwards cost ~500 context switches per token
//! with rayon (measured: 135,648 switches for 256 target tokens). Here the workers spin on an epoch
//! counter for [`SPIN`] after their last job, which covers the gaps inside a forward, and then
//! sleep on a condition variable, so a worker process that shares its cores with another does not
//! burn them between forwards. A second caller that finds the pool busy (the draft and the verifier
//! in one process) runs its call on its own thread instead of waiting.
//!
//! Every call splits its work into independent pieces whose results do not depend on which thread
//! ran them or how many threads there are.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use crate::KernelError;

static REQUESTED: AtomicUsize = AtomicUsize::new(0);
static POOL: OnceLock<Pool> = OnceLock::new();

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_micros(500);

/// Sets the number of kernel threads (0 = all cores). Must come before the first product;
/// afterwards only the same count is accepted.
pub fn set_threads(n: usize) -> Result<(), KernelError> {
    let n = if n == 0 { default_threads() } else { n };
    if let Some(pool) = POOL.get() {
        return if pool.threads() == n {
            Ok(())
        } else {
            Err(KernelError::ThreadsAlreadySet { current: pool.threads(), requested: n })
        };
    }
    REQUESTED.store(n, Ordering::SeqCst);
    Ok(())
}

/// Threads the kernels use (the caller's included).
pub fn threads() -> usize {
    pool().threads()
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

pub(crate) fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let n = match REQUESTED.load(Ordering::SeqCst) {
            0 => default_threads(),
            n => n,
        };
        Pool::start(n)
    })
}

/// One parallel call: `run(i)` for every `i < n`, indices handed out one at a time.
struct Job<'a> {
    run: &'a (dyn Fn(usize) + Sync),
    n: usize,
    next: AtomicUsize,
    panicked: AtomicBool,
}

impl Job<'_> {
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            if catch_unwind(AssertUnwindSafe(|| (self.run)(i))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// What the caller and the workers share. `job` points at the caller's [`Job`] from the moment
/// `epoch` moves until every worker has acknowledged that epoch; the caller does not return before.
struct Shared {
    epoch: AtomicU64,
    job: AtomicPtr<Job<'static>>,
    acked: AtomicUsize,
    /// Workers asleep; the epoch moves under this lock, so none misses a wake-up.
    sleepers: Mutex<usize>,
    wake: Condvar,
}

pub(crate) struct Pool {
    workers: usize,
    shared: &'static Shared,
    /// One call at a time; a caller that finds it taken runs alone.
    busy: Mutex<()>,
}

impl Pool {
    fn start(threads: usize) -> Self {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            epoch: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            acked: AtomicUsize::new(0),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
        }));
        let workers = threads.max(1) - 1;
        for w in 0..workers {
            std::thread::Builder::new()
                .name(format!("easd-kernel-{w}"))
                .spawn(move || worker(shared))
                .expect("kernel thread");
        }
        Self { workers, shared, busy: Mutex::new(()) }
    }

    pub(crate) fn threads(&self) -> usize {
        self.workers + 1
    }

    /// Calls `run(i, item)` once for each of `items` (the `i`-th moved to whichever thread takes
    /// index `i`): the form for pieces that each own a part of an output (`chunks_mut`).
    pub(crate) fn for_each_item<T: Send>(&self, items: Vec<T>, run: &(dyn Fn(usize, T) + Sync)) {
        let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|item| Mutex::new(Some(item))).collect();
        self.for_each(slots.len(), &|i| {
            if let Some(item) = slots[i].lock().unwrap_or_else(|e| e.into_inner()).take() {
                run(i, item);
            }
        });
    }

    /// Calls `run(i)` for every `i < n`, spread over the pool's threads and the caller's; returns
    /// when all are done. A panic in `run` is re-raised here.
    pub(crate) fn for_each(&self, n: usize, run: &(dyn Fn(usize) + Sync)) {
        let busy = match self.busy.try_lock() {
            _ if n <= 1 || self.workers == 0 => None,
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        let Some(busy) = busy else {
            (0..n).for_each(run);
            return;
        };
        let job = Job { run, n, next: AtomicUsize::new(0), panicked: AtomicBool::new(false) };
        let s = self.shared;
        s.acked.store(0, Ordering::Relaxed);
        // SAFETY of the lifetime erasure: workers dereference `job` only between seeing the new
        // epoch and acknowledging it, and this function waits for every acknowledgement below.
        s.job.store(&job as *const Job<'_> as *mut Job<'static>, Ordering::Relaxed);
        {
            let sleepers = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            s.epoch.fetch_add(1, Ordering::Release);
            if *sleepers > 0 {
                s.wake.notify_all();
            }
        }
        job.work();
        let started = Instant::now();
        while s.acked.load(Ordering::Acquire) < self.workers {
            if started.elapsed() > SPIN {
                std::thread::yield_now(); // a worker is still waking up
            } else {
                std::hint::spin_loop();
            }
        }
        s.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        drop(busy);
        if job.panicked.load(Ordering::Relaxed) {
            panic!("a kernel task panicked");
        }
    }
}

fn worker(s: &'static Shared) {
    let mut seen = 0u64;
    loop {
        let idle = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && idle.elapsed() > SPIN {
                let mut sleepers = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
                *sleepers += 1;
                while s.epoch.load(Ordering::Acquire) == seen {
                    sleepers = s.wake.wait(sleepers).unwrap_or_else(|e| e.into_inner());
                }
                *sleepers -= 1;
                break;
            }
            std::hint::spin_loop();
        }
        seen = s.epoch.load(Ordering::Acquire);
        // SAFETY: the caller that moved the epoch keeps its job alive until this worker acknowledges.
        let job = unsafe { &*s.job.load(Ordering::Relaxed) };
        job.work();
        s.acked.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_once_and_panics_reach_the_caller() {
        let pool = Pool::start(3);
        for n in [0, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                pool.for_each(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50), "n = {n}");
        }
        // After the workers have gone to sleep, a call still wakes them.
        std::thread::sleep(SPIN * 4);
        let sum = AtomicUsize::new(0);
        pool.for_each(100, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
        let caught = catch_unwind(AssertUnwindSafe(|| pool.for_each(10, &|i| assert!(i != 5, "boom"))));
        assert!(caught.is_err());
        // The pool still works after a panic.
        let count = AtomicUsize::new(0);
        pool.for_each(10, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn concurrent_callers_both_finish() {
        let pool = Pool::start(2);
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    for _ in 0..200 {
                        let count = AtomicUsize::new(0);
                        pool.for_each(16, &|_| {
                            count.fetch_add(1, Ordering::Relaxed);
                        });
                        assert_eq!(count.load(Ordering::Relaxed), 16);
                    }
                });
            }
        });
    }
}
