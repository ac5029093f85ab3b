//! Server counters, shared between the engine thread (which updates them every step) and the
//! HTTP side (which renders them for `GET /metrics` in Prometheus' text format).

use std::fmt::Write;

#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Requests queued since the start.
    pub requests_total: u64,
    /// Requests that ended with a full reply.
    pub requests_finished: u64,
    /// Requests whose client went away before the end.
    pub requests_cancelled: u64,
    /// Requests that ended with an error (theirs alone, or the device's for all).
    pub requests_failed: u64,
    /// Requests refused: the queue was full.
    pub requests_rejected: u64,
    /// Waiting for a slot.
    pub queue_length: usize,
    /// In a slot (prompt or decode).
    pub active: usize,
    pub slots: usize,
    pub prompt_tokens_total: u64,
    /// Prompt tokens found in a slot's cache and not evaluated again.
    pub prompt_tokens_reused: u64,
    /// Of those, tokens whose cache pages another slot held and now shares.
    pub prompt_tokens_shared: u64,
    /// Pages of the K/V cache held by some slot, and all of them.
    pub kv_pages_used: usize,
    pub kv_pages_total: usize,
    pub generated_tokens_total: u64,
    /// Seconds spent in decode steps, and the tokens they produced.
    pub decode_seconds_total: f64,
    /// Generated tokens per second over the most recent decode steps (all streams).
    pub tokens_per_second: f64,
}

impl Metrics {
    /// Records one decode step that produced `tokens` tokens in `seconds`.
    pub fn decode_step(&mut self, tokens: usize, seconds: f64) {
        self.decode_seconds_total += seconds;
        if seconds > 0.0 {
            let rate = tokens as f64 / seconds;
            // An exponential average over roughly the last 16 steps.
            self.tokens_per_second = if self.tokens_per_second == 0.0 {
                rate
            } else {
                self.tokens_per_second + (rate - self.tokens_per_second) / 16.0
            };
        }
    }

    /// Prometheus text exposition format.
    pub fn to_prometheus(&self) -> String {
        let mut s = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(s, "# HELP duet_{name} {help}\n# TYPE duet_{name} {kind}\nduet_{name} {value}");
        };
        metric("requests_total", "counter", "Requests accepted into the queue.", self.requests_total.to_string());
        metric(
            "requests_finished_total",
            "counter",
            "Requests answered to the end.",
            self.requests_finished.to_string(),
        );
        metric(
            "requests_cancelled_total",
            "counter",
            "Requests whose client disconnected before the end (their slot freed).",
            self.requests_cancelled.to_string(),
        );
        metric(
            "requests_failed_total",
            "counter",
            "Requests that ended with an error event instead of a reply.",
            self.requests_failed.to_string(),
        );
        metric(
            "requests_rejected_total",
            "counter",
            "Requests refused because the queue was full.",
            self.requests_rejected.to_string(),
        );
        metric("queue_length", "gauge", "Requests waiting for a slot.", self.queue_length.to_string());
        metric("requests_active", "gauge", "Requests in a slot (prompt or decode).", self.active.to_string());
        metric("slots", "gauge", "Sequences decoded together at most (--parallel).", self.slots.to_string());
        metric("prompt_tokens_total", "counter", "Prompt tokens evaluated.", self.prompt_tokens_total.to_string());
        metric(
            "prompt_tokens_reused_total",
            "counter",
            "Prompt tokens found cached in a slot (a shared prefix) and not evaluated again.",
            self.prompt_tokens_reused.to_string(),
        );
        metric(
            "prompt_tokens_shared_total",
            "counter",
            "Cached prompt tokens whose K/V cache pages another slot held, shared with a new request.",
            self.prompt_tokens_shared.to_string(),
        );
        metric(
            "kv_cache_pages_used",
            "gauge",
            "Pages of the K/V cache held by a slot (finished requests keep theirs for prefix reuse).",
            self.kv_pages_used.to_string(),
        );
        metric("kv_cache_pages", "gauge", "Pages of the K/V cache in all.", self.kv_pages_total.to_string());
        metric("generated_tokens_total", "counter", "Tokens generated.", self.generated_tokens_total.to_string());
        metric(
            "decode_seconds_total",
            "counter",
            "Seconds spent in decode steps.",
            format!("{:.6}", self.decode_seconds_total),
        );
        metric(
            "tokens_per_second",
            "gauge",
            "Generated tokens per second of all streams, recent decode steps.",
            format!("{:.3}", self.tokens_per_second),
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_has_help_type_and_value_per_metric() {
        let m = Metrics { requests_total: 3, queue_length: 2, ..Default::default() };
        let t = m.to_prometheus();
        assert!(t.contains("# TYPE duet_requests_total counter\nduet_requests_total 3\n"), "{t}");
        assert!(t.contains("duet_queue_length 2\n"));
        assert_eq!(t.matches("# HELP").count(), t.matches("# TYPE").count());
    }
}
