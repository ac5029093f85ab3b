//! What a session will allocate, and whether the machine has it: checked before allocating,
//! so that a context too large for the memory is a clear error with the numbers rather
//! than an allocation failure (an abort) or the system's out-of-memory killer.

use crate::error::RuntimeError;
use crate::kv_cache::KvCacheSpec;
use crate::model::ModelConfig;

/// Memory the operating system can give this process now, without swapping: Linux's
/// `MemAvailable`. None where it is not known (other systems; allocations there are still
/// checked as they happen, [`zeroed`]).
pub fn available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Bytes sessions of `cache` (n_ctx positions, n_seqs sequences) run by a batch context of
/// `max_batch` rows allocate besides the weights: the K/V cache, the context's activations,
/// one row of logits per row (perplexity keeps them all) and the attention scores (one row
/// of n_ctx per thread).
pub fn session_bytes(c: &ModelConfig, cache: &KvCacheSpec, max_batch: usize, threads: usize) -> u64 {
    let b = max_batch as u64;
    let widths = 3 * c.n_embd + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.n_ff;
    cache.bytes() as u64 + 4 * b * (widths as u64 + c.n_vocab as u64) + 8 * (threads as u64) * cache.n_ctx as u64
}

/// Refuses a session that would not fit in `available` bytes, naming both numbers and the
/// largest context that fits.
pub fn check_session(
    c: &ModelConfig,
    cache: &KvCacheSpec,
    max_batch: usize,
    threads: usize,
    available: u64,
) -> Result<(), RuntimeError> {
    let need = |n_ctx: usize| session_bytes(c, &KvCacheSpec { n_ctx, ..cache.clone() }, max_batch.min(n_ctx), threads);
    if need(cache.n_ctx) <= available {
        return Ok(());
    }
    // need() grows with n_ctx: the largest context that fits, by bisection.
    let (mut lo, mut hi) = (0usize, cache.n_ctx);
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if need(mid) <= available { lo = mid } else { hi = mid }
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    Err(RuntimeError::OutOfMemory(format!(
        "a context of {} tokens needs {:.2} GiB ({:.2} GiB of {}/{} K/V cache, the rest activations), but {:.2} GiB of memory can be used; the largest context that fits is {lo} tokens (lower --ctx-size, or use a smaller cache type such as --cache-type-k q4c --cache-type-v q4r)",
        cache.n_ctx,
        gib(need(cache.n_ctx)),
        gib(cache.bytes() as u64),
        cache.k_type,
        cache.v_type,
        gib(available),
    )))
}

/// A vector of `n` zeros (`T::default()`), or an error naming `what` and the size when the
/// allocation fails — instead of aborting the process.
pub fn zeroed<T: Clone + Default>(n: usize, what: &str) -> Result<Vec<T>, RuntimeError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        RuntimeError::OutOfMemory(format!(
            "could not allocate {what} ({} bytes)",
            n.saturating_mul(std::mem::size_of::<T>())
        ))
    })?;
    v.resize(n, T::default());
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::CacheFormat;
    use crate::model::Arch;
    use crate::model_config::RopeConfig;

    #[test]
    fn too_large_a_context_names_the_largest_that_fits() {
        let rope = RopeConfig { n_rot: 16, freq_base: 10000.0, freq_scale: 1.0 };
        let c = ModelConfig {
            arch: Arch::Llama,
            n_vocab: 512,
            n_embd: 64,
            n_ff: 192,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            rms_eps: 1e-5,
            n_ctx_train: 256,
            rope,
        };
        let cache = KvCacheSpec {
            n_layers: 2,
            n_ctx: 1 << 30,
            n_seqs: 1,
            kv_dim: 32,
            head_dim: 16,
            k_type: CacheFormat::F16,
            v_type: CacheFormat::F16,
        };
        let avail = 1u64 << 30;
        let e = check_session(&c, &cache, 512, 2, avail).unwrap_err().to_string();
        assert!(e.contains("a context of 1073741824 tokens") && e.contains("1.00 GiB of memory can be used"), "{e}");
        let largest: usize =
            e.split("largest context that fits is ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        let fits = |n: usize| check_session(&c, &KvCacheSpec { n_ctx: n, ..cache.clone() }, 512, 2, avail).is_ok();
        assert!(fits(largest) && !fits(largest + 1), "largest {largest}");
    }

    #[test]
    fn failed_allocations_are_errors() {
        let e = zeroed::<u64>(usize::MAX / 4, "a test buffer").unwrap_err().to_string();
        assert!(e.contains("could not allocate a test buffer"), "{e}");
        assert_eq!(zeroed::<u8>(3, "x").unwrap(), vec![0, 0, 0]);
    }
}
