//! A small fork-join thread pool tuned for the CPU backend's many short parallel ops.
//!
//! Decoding one token runs a few hundred parallel ops of tens of microseconds each, so the
//! cost of waking threads matters more than anything else here. Workers spin on an epoch
//! counter for a while after each job (a new job starts within nanoseconds) and only then
//! block on a condition variable, so an idle chat session does not burn CPU.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_millis(2);

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// Incremented once per job; workers run each epoch exactly once.
    epoch: AtomicUsize,
    /// The current job. Written by the caller before `epoch` is bumped (Release) and read by
    /// workers after they observe the new epoch (Acquire).
    job: UnsafeCell<Option<Job>>,
    /// Workers that have not finished the current job.
    remaining: AtomicUsize,
    stop: AtomicBool,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only written while no worker can read it (all workers finished the previous
// epoch, `remaining == 0`), and only read between an epoch bump and the worker's decrement of
// `remaining`; the atomics order those accesses.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises `run` calls from different threads.
    caller: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all: the calling thread plus `n_threads − 1` workers.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            remaining: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|idx| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("duet-cpu-{idx}"))
                    .spawn(move || worker(shared, idx))
                    .expect("spawning a CPU worker thread")
            })
            .collect();
        ThreadPool { shared, workers, caller: Mutex::new(()) }
    }

    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(thread_index)` on every thread of the pool (index 0 is the caller) and returns
    /// when all have finished. A panic in `f` on a worker aborts the process (the job's
    /// borrowed data must not outlive this call), so `f` must not panic.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            f(0);
            return;
        }
        let _guard = self.caller.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: the previous job is over (remaining == 0, see the wait below), so no worker
        // reads `job` now. The transmute only erases the borrow's lifetime: this function does
        // not return before every worker is done with `f`.
        unsafe {
            let ptr: Job = std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f);
            *s.job.get() = Some(ptr);
        }
        s.remaining.store(self.workers.len(), Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::Release);
        {
            // Wake sleepers. Taking the lock orders this after any worker's check-then-wait.
            let _l = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        f(0);
        let mut spins = 0u32;
        while s.remaining.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Splits `0..n` into chunks of `chunk` items handed out dynamically, calling
    /// `f(start..end)` for each: balanced even when some threads are slower.
    pub fn for_chunks(&self, n: usize, chunk: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
        self.for_chunks_tid(n, chunk, &|_, r| f(r));
    }

    /// [`ThreadPool::for_chunks`] that also passes the thread index (for per-thread scratch).
    pub fn for_chunks_tid(&self, n: usize, chunk: usize, f: &(dyn Fn(usize, std::ops::Range<usize>) + Sync)) {
        let chunk = chunk.max(1);
        if n <= chunk || self.workers.is_empty() {
            if n > 0 {
                f(0, 0..n);
            }
            return;
        }
        let next = AtomicUsize::new(0);
        self.run(&|tid| {
            loop {
                let start = next.fetch_add(chunk, Ordering::Relaxed);
                if start >= n {
                    break;
                }
                f(tid, start..(start + chunk).min(n));
            }
        });
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.epoch.fetch_add(1, Ordering::Release);
        {
            let _l = self.shared.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(s: Arc<Shared>, idx: usize) {
    let mut seen = 0usize;
    loop {
        // Spin, then sleep, until a new epoch starts.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 && start.elapsed() > SPIN {
                let guard = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
                if s.epoch.load(Ordering::Acquire) == seen {
                    let _g = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
            } else {
                std::hint::spin_loop();
            }
        }
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: the caller stored the job before bumping the epoch we just observed and
        // keeps it alive until `remaining` reaches zero.
        let job = unsafe { (*s.job.get()).expect("a job is set for every epoch") };
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (*job)(idx) }));
        if run.is_err() {
            // The job borrows the caller's stack; unwinding past it is unsound.
            eprintln!("duet: a CPU worker thread panicked; aborting");
            std::process::abort();
        }
        s.remaining.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_each_job_once() {
        let pool = ThreadPool::new(3);
        for round in 0..200 {
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), 1, "round {round}");
            }
        }
    }

    #[test]
    fn chunks_cover_the_range_exactly_once() {
        let pool = ThreadPool::new(2);
        let n = 1001;
        let seen: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        pool.for_chunks(n, 7, &|r| {
            for i in r {
                seen[i].fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn sleeping_workers_wake_up() {
        let pool = ThreadPool::new(2);
        std::thread::sleep(SPIN * 5);
        let count = AtomicUsize::new(0);
        pool.run(&|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }
}
