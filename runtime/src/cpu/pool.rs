//! A fork-join thread pool tuned for the CPU backend's many short parallel ops.
//!
//! Decoding one token runs a few hundred parallel ops of tens of microseconds each, so
//! waking threads must be cheap, and the pool must degrade gracefully when the machine is
//! busy with other work (a shared laptop, a CI box): a job is cut into chunks that threads
//! claim one at a time (each first from its own contiguous run of them, then from the
//! others'), and the caller waits only for chunks to be done and for workers
//! that are actually inside the job — never for a worker that has not woken up yet. An
//! idle worker spins briefly (yielding its core if anything else wants it), then sleeps.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker keeps polling before it sleeps.
const SPIN: Duration = Duration::from_micros(500);

type Job = *const (dyn Fn(usize, Range<usize>) + Sync);

struct Shared {
    /// `2·epoch + finished`: a new job bumps the epoch with `finished` clear; the caller sets
    /// `finished` once every chunk is done.
    state: AtomicU64,
    /// The current job. Written only while no worker is inside a job (`active == 0`) and
    /// before the epoch is published.
    job: UnsafeCell<Option<(Job, usize, usize)>>, // (closure, n items, chunk size)
    /// The next unclaimed chunk of each thread's run (see [`run_chunks`]).
    next: Vec<AtomicUsize>,
    done: AtomicUsize,
    /// Workers inside the current job.
    active: AtomicUsize,
    stop: AtomicBool,
    /// Workers asleep on `wake` (or about to be: counted under `sleep_lock` before they
    /// re-check the state). A new job takes the lock and notifies only when this is non-zero:
    /// a notify is a futex syscall even with nobody waiting, and a decoded token starts a few
    /// hundred jobs while the workers are still spinning.
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

impl Shared {
    fn new(n_threads: usize) -> Shared {
        Shared {
            state: AtomicU64::new(1), // epoch 0, finished
            job: UnsafeCell::new(None),
            next: (0..n_threads).map(|_| AtomicUsize::new(0)).collect(),
            done: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    /// Sets every run's next chunk to its first, for a job of `n_chunks` chunks.
    fn start_runs(&self, n_chunks: usize) {
        for (run, next) in self.next.iter().enumerate() {
            next.store(run_start(run, self.next.len(), n_chunks), Ordering::SeqCst);
        }
    }
}

// SAFETY: `job` is written by the caller only when no worker is active (see `run`) and read
// by workers only between `active += 1` and `active -= 1` after checking the state; the
// SeqCst atomics order these accesses (see `worker`).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    caller: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all: the calling thread plus `n_threads − 1` workers.
    pub fn new(n_threads: usize) -> ThreadPool {
        let shared = Arc::new(Shared::new(n_threads.max(1)));
        let workers = (1..n_threads.max(1))
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

    /// Splits `0..n` into chunks of `chunk` items, claimed dynamically by the caller and any
    /// worker that is awake, and calls `f(thread_index, range)` for each. Returns when all
    /// are done. A panic in `f` on a worker aborts the process (the job borrows the caller's
    /// stack), so `f` must not panic.
    pub fn for_chunks_tid(&self, n: usize, chunk: usize, f: &(dyn Fn(usize, Range<usize>) + Sync)) {
        let chunk = chunk.max(1);
        if n == 0 {
            return;
        }
        if n <= chunk || self.workers.is_empty() {
            f(0, 0..n);
            return;
        }
        let _guard = self.caller.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let n_chunks = n.div_ceil(chunk);
        // SAFETY: the previous job ended with `active == 0`, so no worker reads `job` now.
        // The transmute only erases the borrow's lifetime: we do not return before every
        // worker that entered the job has left it.
        unsafe {
            let ptr: Job = std::mem::transmute::<&(dyn Fn(usize, Range<usize>) + Sync), Job>(f);
            *s.job.get() = Some((ptr, n, chunk));
        }
        s.start_runs(n_chunks);
        s.done.store(0, Ordering::SeqCst);
        let epoch = s.state.load(Ordering::SeqCst) / 2 + 1;
        s.state.store(2 * epoch, Ordering::SeqCst);
        // Wake sleepers; the lock orders this after a worker's check-then-wait. A worker that
        // counts itself as a sleeper after this load comes later in the SeqCst order than the
        // store above, so its re-check sees the new epoch and it does not wait.
        if s.sleepers.load(Ordering::SeqCst) != 0 {
            let _l = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        run_chunks(s, 0, f, n, chunk);
        let mut spins = 0u32;
        while s.done.load(Ordering::SeqCst) < n_chunks {
            backoff(&mut spins);
        }
        s.state.store(2 * epoch + 1, Ordering::SeqCst);
        while s.active.load(Ordering::SeqCst) != 0 {
            backoff(&mut spins);
        }
    }

    /// [`ThreadPool::for_chunks_tid`] without the thread index.
    pub fn for_chunks(&self, n: usize, chunk: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
        self.for_chunks_tid(n, chunk, &|_, r| f(r));
    }
}

/// Claims and runs chunks until none are left. The chunks are cut into one contiguous *run*
/// per thread; a thread takes its own run's chunks in order, then helps with the others' (from
/// their next unclaimed chunk). So a thread's chunks lie one after another in memory and the
/// packed kernels' prefetch hints, which run ahead of the chunk being multiplied, fetch the
/// thread's next chunk: claimed from one shared counter, the next chunk was as often the other
/// thread's, and each of a decode matmul's 12 chunks started cold. 1.1B decode on 2 threads
/// (`duet bench -p 0 -n 32 -r 2`, 6-8 alternations, medians): AVX2 kernels Q4_0 57.5 → 60.3
/// t/s, Q4_K_M 54.5 → 57.2; AVX-512 Q4_0 61.8 → 63.2, Q4_K_M 70.2 → 76.8; prompts unchanged.
/// A thread that never wakes up leaves its run to the others, as before.
fn run_chunks(s: &Shared, tid: usize, f: &(dyn Fn(usize, Range<usize>) + Sync), n: usize, chunk: usize) {
    let (runs, n_chunks) = (s.next.len(), n.div_ceil(chunk));
    for run in (tid..tid + runs).map(|r| r % runs) {
        let end = run_start(run + 1, runs, n_chunks);
        loop {
            let c = s.next[run].fetch_add(1, Ordering::SeqCst);
            if c >= end {
                break;
            }
            f(tid, c * chunk..((c + 1) * chunk).min(n));
            s.done.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The first chunk of run `run` of `runs` over `n_chunks` chunks.
fn run_start(run: usize, runs: usize, n_chunks: usize) -> usize {
    run * n_chunks / runs
}

/// Spin a little, then give the core to anyone who wants it.
#[inline]
fn backoff(spins: &mut u32) {
    *spins = spins.wrapping_add(1);
    if (*spins).is_multiple_of(16) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _l = self.shared.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(s: Arc<Shared>, tid: usize) {
    let mut seen_epoch = 0u64;
    loop {
        // Wait for a job with a new epoch that is not finished.
        let start = Instant::now();
        let mut spins = 0u32;
        let epoch = loop {
            if s.stop.load(Ordering::SeqCst) {
                return;
            }
            let st = s.state.load(Ordering::SeqCst);
            if st / 2 != seen_epoch && st.is_multiple_of(2) {
                break st / 2;
            }
            if spins % 64 == 63 && start.elapsed() > SPIN {
                let guard = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                let st = s.state.load(Ordering::SeqCst);
                if !s.stop.load(Ordering::SeqCst) && (st / 2 == seen_epoch || st % 2 == 1) {
                    let _g = s.wake.wait_timeout(guard, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
            backoff(&mut spins);
        };
        seen_epoch = epoch;
        // Enter the job, then re-check it is still running: if the caller finished it (or
        // moved on) in between, it may already have returned and the job is gone.
        s.active.fetch_add(1, Ordering::SeqCst);
        if s.state.load(Ordering::SeqCst) == 2 * epoch {
            // SAFETY: the job of this epoch is alive until `active` drops back to zero.
            let (job, n, chunk) = unsafe { (*s.job.get()).expect("a job is set for every epoch") };
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                run_chunks(&s, tid, &*job, n, chunk)
            }));
            if run.is_err() {
                eprintln!("duet: a CPU worker thread panicked; aborting");
                std::process::abort();
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_range_exactly_once() {
        let pool = ThreadPool::new(3);
        for round in 0..300 {
            let n = 1 + round * 7 % 1001;
            let seen: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.for_chunks(n, 1 + round % 9, &|r| {
                for i in r {
                    seen[i].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1), "round {round}");
        }
    }

    /// A thread alone takes its own run's chunks in order, then the next runs' (wrapping), each
    /// in order: every chunk once, contiguous except where it moves to another run.
    #[test]
    fn a_thread_takes_its_run_in_order_then_the_others() {
        let s = Shared::new(3);
        let (n, chunk): (usize, usize) = (20, 3); // 7 chunks: runs [0, 2), [2, 4), [4, 7)
        s.start_runs(n.div_ceil(chunk));
        let order = Mutex::new(Vec::new());
        run_chunks(&s, 1, &|tid, r| order.lock().unwrap().push((tid, r)), n, chunk);
        let order = order.into_inner().unwrap();
        let starts: Vec<usize> = order.iter().map(|(_, r)| r.start).collect();
        assert_eq!(starts, [6, 9, 12, 15, 18, 0, 3], "chunks in claim order");
        assert!(order.iter().all(|(tid, _)| *tid == 1));
        assert_eq!(order[4].1, 18..20, "the last chunk ends at n");
        assert_eq!(s.done.load(Ordering::SeqCst), 7);
    }

    #[test]
    fn sleeping_workers_wake_up_and_help() {
        let pool = ThreadPool::new(2);
        // The worker goes to sleep (counted as a sleeper), so the jobs below must wake it.
        let asleep = Instant::now();
        while pool.shared.sleepers.load(Ordering::SeqCst) != 1 {
            assert!(asleep.elapsed() < Duration::from_secs(10), "the idle worker never went to sleep");
            std::thread::sleep(SPIN);
        }
        let threads_used: Vec<AtomicUsize> = (0..2).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..50 {
            pool.for_chunks_tid(64, 1, &|tid, _| {
                threads_used[tid].fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(50));
            });
        }
        assert_eq!(threads_used.iter().map(|c| c.load(Ordering::Relaxed)).sum::<usize>(), 50 * 64);
        assert!(threads_used[1].load(Ordering::Relaxed) > 0, "the worker never took a chunk");
    }
}
