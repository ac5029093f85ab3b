//! Runs a future that native backends complete at once.
//!
//! The model's step is written once, as an async fn ([`crate::model::Model::decode_async`]),
//! so that a browser's GPU (wgpu's WebGPU backend, where a readback completes only after the
//! page's event loop has run) can await its results. On native backends every await inside
//! it is ready when first polled — the CPU computes in place, and the native GPU readback
//! waits for the device before it returns its future (`gpu::record::Recorder::read_async`)
//! — so the synchronous entry points drive it here, without an executor or a thread.

use std::future::Future;
use std::task::{Context, Poll, Waker};

/// `f`'s output, polling it until ready. Native backends' futures are ready at the first
/// poll; should one not be, this yields the thread between polls instead of blocking. In a
/// browser a pending future can only complete once the page's event loop runs, which this
/// would never let happen: there it is a programming error, said as such.
pub fn finish<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        #[cfg(target_arch = "wasm32")]
        panic!("a synchronous duet call waited for the browser's GPU: in a browser use its async form");
        #[cfg(not(target_arch = "wasm32"))]
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_future_and_one_pending_once_both_finish() {
        assert_eq!(finish(async { 7 }), 7);
        let mut first = true;
        let pending_once =
            std::future::poll_fn(move |_| if std::mem::take(&mut first) { Poll::Pending } else { Poll::Ready(3) });
        assert_eq!(finish(pending_once), 3);
    }
}
