//! The machine's memory read bandwidth, measured the way decoding reads weights: every thread
//! of the pool streams its share of a buffer far larger than the last-level cache, once.
//!
//! Decoding one token reads every weight once, so `weight bytes per token × tokens/s` can
//! approach this figure but not pass it; `duet bench --bandwidth` prints both so that a
//! decode speed can be judged against the machine rather than against another program.

use std::hint::black_box;
use std::time::Instant;

use super::pool::ThreadPool;

/// Work items of this many u64 (1 MiB), claimed dynamically like the matmul's row groups.
const CHUNK: usize = 1 << 17;

/// Best-of-`reps` read bandwidth in bytes per second of `pool`'s threads streaming a buffer of
/// `bytes` (rounded down to whole 1 MiB chunks, at least one). The buffer is written first, by
/// the pool, so that its pages exist and lie where the threads that read them first touched
/// them.
pub fn read_bandwidth(pool: &ThreadPool, bytes: usize, reps: usize) -> f64 {
    let chunks = (bytes / (CHUNK * 8)).max(1);
    let mut buf = vec![0u64; chunks * CHUNK];
    let base = buf.as_mut_ptr() as usize;
    pool.for_chunks(chunks, 1, &|range| {
        for c in range {
            // SAFETY: chunk c (CHUNK u64 at c·CHUNK) is handed to one thread only and lies in
            // `buf` (chunks·CHUNK elements).
            let s = unsafe { std::slice::from_raw_parts_mut((base as *mut u64).add(c * CHUNK), CHUNK) };
            for (i, v) in s.iter_mut().enumerate() {
                *v = (c * CHUNK + i) as u64;
            }
        }
    });
    let buf = &buf;
    let mut best = f64::MAX;
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        pool.for_chunks(chunks, 1, &|range| {
            for c in range {
                black_box(sum_chunk(&buf[c * CHUNK..(c + 1) * CHUNK]));
            }
        });
        best = best.min(t0.elapsed().as_secs_f64());
    }
    (chunks * CHUNK * 8) as f64 / best
}

/// Wrapping sum in four independent lanes (so the loads, not an add chain, set the pace; the
/// compiler turns each lane into vector adds).
fn sum_chunk(s: &[u64]) -> u64 {
    let mut acc = [0u64; 4];
    for q in s.chunks_exact(4) {
        for (a, &v) in acc.iter_mut().zip(q) {
            *a = a.wrapping_add(v);
        }
    }
    acc.iter().fold(0, |a, &b| a.wrapping_add(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_element() {
        let v: Vec<u64> = (0..CHUNK as u64).collect();
        let n = CHUNK as u64;
        assert_eq!(sum_chunk(&v), n * (n - 1) / 2);
    }

    /// A positive, finite rate that a real memory system can deliver (between 100 MB/s and
    /// 10 TB/s) for a small buffer on two threads.
    #[test]
    fn measures_a_plausible_rate() {
        let pool = ThreadPool::new(2);
        let r = read_bandwidth(&pool, 8 << 20, 2);
        assert!(r.is_finite() && (1e8..1e13).contains(&r), "{r}");
    }
}
