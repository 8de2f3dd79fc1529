//! The process's kernel threads: one rayon pool, sized once (`set_threads`, default all cores).
//!
//! rayon's idle workers spin only briefly (a few dozen yields) before sleeping on a condition
//! variable, so a worker process that shares its cores with another does not burn them between
//! forwards. Every product and attention call splits its work into independent pieces whose
//! results do not depend on which thread ran them or how many threads there are.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::KernelError;

static REQUESTED: AtomicUsize = AtomicUsize::new(0);
static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();

/// Sets the number of kernel threads (0 = all cores). Must come before the first product;
/// afterwards only the same count is accepted.
pub fn set_threads(n: usize) -> Result<(), KernelError> {
    let n = if n == 0 { default_threads() } else { n };
    if let Some(pool) = POOL.get() {
        return if pool.current_num_threads() == n {
            Ok(())
        } else {
            Err(KernelError::ThreadsAlreadySet { current: pool.current_num_threads(), requested: n })
        };
    }
    REQUESTED.store(n, Ordering::SeqCst);
    Ok(())
}

/// Threads the kernels use.
pub fn threads() -> usize {
    pool().current_num_threads()
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

pub(crate) fn pool() -> &'static rayon::ThreadPool {
    POOL.get_or_init(|| {
        let n = match REQUESTED.load(Ordering::SeqCst) {
            0 => default_threads(),
            n => n,
        };
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("easd-kernel-{i}"))
            .build()
            .expect("kernel thread pool")
    })
}
