//! A memory budget for work that a file controls and no other limit bounds: a model's chat
//! template can double a string 64 times within its instruction budget (fuel counts steps,
//! not bytes), and neither minijinja nor Rust lets an allocation fail softly.
//!
//! [`BudgetAlloc`] (the program's global allocator; `duet` installs it) counts the bytes a
//! thread holds while it runs [`run_with_budget`]'s work, and checks each allocation against
//! the budget *before* making it. An allocation that would pass the budget cannot return an
//! error (Rust aborts on a null pointer) and must not unwind out of the allocator, so the
//! thread is stopped there instead: it raises its flag and sleeps for good, holding at most
//! the budget. [`run_with_budget`] runs the work on such a thread and reports the overrun
//! (or a time limit) as an error; its caller keeps the error, so that a template that
//! overran once is not run again (one parked thread per template at most). The same check
//! bounds the work's stack depth: a recursion without end (a template formatting a
//! namespace stored inside itself) would overflow the stack, which aborts the program; it
//! allocates at every level, so the allocator stops it at [`STACK_LIMIT`] of its 32 MiB
//! stack. The work must
//! take no lock that other threads need (a parked thread keeps it): minijinja's rendering
//! takes none; a panic's own allocations (its message, a backtrace) are let through.

// In a browser the work runs inline (run_with_budget): the thread's machinery is unused there.
#![cfg_attr(target_arch = "wasm32", allow(dead_code, unused_imports))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// The system allocator, counting what a budgeted thread allocates.
pub struct BudgetAlloc;

/// Set by the first allocation through [`BudgetAlloc`]: whether budgets hold in this program.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// What a budgeted thread's flag says: still within its budget, or stopped for which reason.
const RUNNING: u8 = 0;
const PAST_MEMORY: u8 = 1;
const PAST_DEPTH: u8 = 2;

/// The stack of a budgeted thread, and how deep its work may reach into it: a value that
/// contains itself (a template's namespace stored inside itself) is formatted by recursion
/// without end, and a stack overflow aborts the whole program. Each level of such a
/// recursion allocates, so the allocator sees the depth before the guard page is reached.
const STACK: usize = 32 << 20;
const STACK_LIMIT: usize = 24 << 20;

thread_local! {
    /// (bytes held, limit) of this thread's budget; limit 0: none.
    static HELD: Cell<(isize, isize)> = const { Cell::new((0, 0)) };
    /// The flag this thread raises when it overruns its budget ([`PAST_MEMORY`], [`PAST_DEPTH`]).
    static OVERRUN: Cell<*const AtomicU8> = const { Cell::new(std::ptr::null()) };
    /// The stack pointer where the budgeted work started (0: not budgeted).
    static STACK_TOP: Cell<usize> = const { Cell::new(0) };
}

/// The stack pointer (the real one: a local's address may lie on AddressSanitizer's fake
/// stack instead).
#[inline(always)]
fn stack_pointer() -> usize {
    let sp: usize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads a register.
    unsafe {
        std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: reads a register.
    unsafe {
        std::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let local = 0u8;
        sp = std::hint::black_box(&local) as *const u8 as usize;
    }
    sp
}

/// Notes that allocations go through [`BudgetAlloc`] (read first: a store on every
/// allocation would bounce the flag's cache line between threads).
fn mark_installed() {
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

/// Charges `delta` bytes to this thread's budget; past it, stops the thread for good.
fn charge(delta: isize) {
    let Ok((held, limit)) = HELD.try_with(Cell::get) else { return };
    if limit == 0 {
        return;
    }
    let now = held.saturating_add(delta);
    let top = STACK_TOP.try_with(Cell::get).unwrap_or(0);
    let too_deep = delta > 0 && top != 0 && top.saturating_sub(stack_pointer()) > STACK_LIMIT;
    // A panicking thread is ending its work anyway; stopping it while it formats its
    // message (a backtrace takes megabytes) would park it holding stderr's lock.
    if delta > 0 && (now > limit || too_deep) && !std::thread::panicking() {
        stop(limit, too_deep);
    }
    let _ = HELD.try_with(|h| h.set((now, limit)));
}

/// Stops the thread that would pass its budget of `limit` bytes (or its stack depth), before
/// the allocation: raises its flag (no allocation), then sleeps without end (nanosleep
/// allocates nothing); the thread's memory stays held, within the budget.
#[cfg(not(target_arch = "wasm32"))]
fn stop(_limit: isize, too_deep: bool) -> ! {
    if let Ok(flag) = OVERRUN.try_with(Cell::get)
        && !flag.is_null()
    {
        // SAFETY: run_with_budget keeps the flag's Arc alive inside this thread's closure.
        unsafe { (*flag).store(if too_deep { PAST_DEPTH } else { PAST_MEMORY }, Ordering::Release) };
    }
    loop {
        std::thread::sleep(Duration::from_secs(1 << 20));
    }
}

/// In a browser there is no thread to park: the work ran inline, and the wasm instance stops
/// here (a panic aborts there) — at the budget rather than at the tab's memory limit; the
/// page reports the trap, and a reload brings the runtime back.
#[cfg(target_arch = "wasm32")]
fn stop(limit: isize, _too_deep: bool) -> ! {
    // The panic's own allocations are not charged.
    let _ = HELD.try_with(|h| h.set((0, 0)));
    panic!("work bounded to {limit} bytes (a model's chat template) would have held more: the runtime stops");
}

// SAFETY: every call forwards to System with the same arguments; the bookkeeping touches
// only const-initialised thread-locals without destructors.
unsafe impl GlobalAlloc for BudgetAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        mark_installed();
        charge(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        mark_installed();
        charge(layout.size() as isize);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        charge(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        charge(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Whether this program's allocations go through [`BudgetAlloc`] (else [`run_with_budget`]
/// bounds only time).
pub fn installed() -> bool {
    // An allocation first, so that the answer does not depend on none having happened yet.
    drop(std::hint::black_box(Box::new(0u8)));
    INSTALLED.load(Ordering::Relaxed)
}

/// Why budgeted work did not finish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Overrun {
    /// It would have held more than this many bytes at once.
    Memory(usize),
    /// It recursed deeper than its stack allows (e.g. formatting a value that contains
    /// itself).
    Depth,
    /// It ran longer than this.
    Time(Duration),
    /// It panicked.
    Panic,
}

/// Runs `work` on a thread of its own, holding at most `bytes` at once (where
/// [`BudgetAlloc`] is installed) and for at most `time`. On an overrun the thread is left
/// behind (stopped, or finishing its work unobserved) and this returns at once.
///
/// In a browser (wasm32) there are no threads: the work runs where it is called, bounded by
/// its own limits (a template's fuel and output cap) and, where [`BudgetAlloc`] is installed
/// (duet-web installs it), by `bytes`: past them the wasm instance stops (a panic, which
/// aborts there) instead of growing the tab's memory to its limit. `time` is not enforced.
pub fn run_with_budget<T: Send + 'static>(
    bytes: usize,
    time: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Overrun> {
    #[cfg(target_arch = "wasm32")]
    {
        let _ = time;
        HELD.with(|h| h.set((0, bytes.min(isize::MAX as usize) as isize)));
        let out = work();
        // The result's memory is the caller's from here.
        HELD.with(|h| h.set((0, 0)));
        return Ok(out);
    }
    #[cfg(not(target_arch = "wasm32"))]
    run_on_budgeted_thread(bytes, time, work)
}

#[cfg(not(target_arch = "wasm32"))]
fn run_on_budgeted_thread<T: Send + 'static>(
    bytes: usize,
    time: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Overrun> {
    let flag = Arc::new(AtomicU8::new(RUNNING));
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let thread_flag = Arc::clone(&flag);
    let spawned = std::thread::Builder::new().name("duet budgeted work".into()).stack_size(STACK).spawn(move || {
        OVERRUN.with(|f| f.set(Arc::as_ptr(&thread_flag)));
        HELD.with(|h| h.set((0, bytes.min(isize::MAX as usize) as isize)));
        STACK_TOP.with(|t| t.set(stack_pointer()));
        let out = work();
        // The result may be dropped by a caller that gave up: its memory is not charged here.
        HELD.with(|h| h.set((0, 0)));
        STACK_TOP.with(|t| t.set(0));
        let _ = tx.send(out);
        drop(thread_flag);
    });
    if spawned.is_err() {
        return Err(Overrun::Panic);
    }
    let start = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(5)) {
            Ok(out) => return Ok(out),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Err(Overrun::Panic),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        match flag.load(Ordering::Acquire) {
            PAST_MEMORY => return Err(Overrun::Memory(bytes)),
            PAST_DEPTH => return Err(Overrun::Depth),
            _ => {}
        }
        if start.elapsed() > time {
            return Err(Overrun::Time(time));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_within_its_budget_returns_its_value_and_work_past_it_stops() {
        assert!(installed(), "the unit tests install the budgeting allocator");
        let mb = 1 << 20;
        let v = run_with_budget(16 * mb, Duration::from_secs(10), move || vec![1u8; 8 * mb].len());
        assert_eq!(v, Ok(8 * mb));
        // Growing past 16 MiB stops the thread at the allocation that would pass it.
        let grow = run_with_budget(16 * mb, Duration::from_secs(10), move || {
            let mut v: Vec<u8> = Vec::new();
            for _ in 0..64 {
                v.extend(std::iter::repeat_n(7u8, mb));
            }
            v.len()
        });
        assert_eq!(grow, Err(Overrun::Memory(16 * mb)));
        // Memory freed counts back: 64 MiB in all, never more than 1 MiB at once.
        let churn = run_with_budget(2 * mb, Duration::from_secs(10), move || {
            (0..64).map(|_| std::hint::black_box(vec![0u8; mb]).len()).sum::<usize>()
        });
        assert_eq!(churn, Ok(64 * mb));
    }

    /// Recursion that allocates at every level stops at the depth budget, before the
    /// thread's stack overflows (which would abort the program).
    #[test]
    fn work_recursing_without_end_stops_at_its_depth_budget() {
        assert!(installed(), "the unit tests install the budgeting allocator");
        fn down(n: u64) -> u64 {
            let v = std::hint::black_box(vec![n; 4]);
            if v[0] == u64::MAX { 0 } else { down(v[0] + 1) + v[1] }
        }
        let r = run_with_budget(1 << 30, Duration::from_secs(30), || down(0));
        assert_eq!(r, Err(Overrun::Depth));
        // A deep but bounded recursion (a few MiB of stack) is within it.
        fn bounded(n: u64) -> u64 {
            let v = std::hint::black_box(vec![n; 4]);
            if n == 20_000 { v[0] } else { bounded(n + 1) + v[1] - n }
        }
        assert_eq!(run_with_budget(1 << 30, Duration::from_secs(30), || bounded(0)), Ok(20_000));
    }

    #[test]
    fn work_past_its_time_or_that_panics_is_an_error() {
        let slow = run_with_budget(1 << 20, Duration::from_millis(50), || std::thread::sleep(Duration::from_secs(2)));
        assert_eq!(slow, Err(Overrun::Time(Duration::from_millis(50))));
        let bad = run_with_budget(1 << 20, Duration::from_secs(10), || -> u32 { panic!("on purpose") });
        assert_eq!(bad, Err(Overrun::Panic));
    }
}
