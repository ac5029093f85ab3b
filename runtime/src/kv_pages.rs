//! The paged K/V cache's bookkeeping, shared by the backends: a cache holds `n_pages`
//! pages of [`PAGE`] positions (every layer, K and V, in the cache's formats) and `n_slots`
//! sequence slots. A sequence owns a slot (its f16 window in a per-channel cache, its
//! page-table row on the GPU) and a page table: position p is row p mod PAGE of page
//! `pages[p / PAGE]`. Pages are taken when positions are written and given back when a
//! sequence is truncated or ends, so sequences of different lengths share one allocation;
//! a page full of a prefix that two sequences have in common is held by both (counted
//! references) and never written again while shared.
//!
//! A page is as long as a per-channel group ([`duet_quant::kv::channel::GROUP`]): a full
//! page of a per-channel cache is one quantized group, and the positions of a page not yet
//! full are in the sequence's window, which is why only full pages are shared. The page
//! holding a sequence's positions 0.. also owns one of `n_slots` sinks (a per-channel
//! cache's f16 copy of the sequence's first positions, [`duet_quant::kv::channel::SINK`]):
//! sequences sharing the page share it, and it comes free with the page. A shared page
//! keeps its index in every sequence holding it, so a page owning a sink is the first page
//! of each of them, and no more sinks are in use than sequence slots.

use crate::error::RuntimeError;

/// Positions per page.
pub const PAGE: usize = duet_quant::kv::channel::GROUP;

/// Where one sequence's positions lie in a paged cache.
#[derive(Clone, Copy, Debug)]
pub struct SeqPages<'a> {
    /// Position p is row p mod [`PAGE`] of page `pages[p / PAGE]`.
    pub pages: &'a [u32],
    /// The sequence's slot (its window in a per-channel cache).
    pub slot: usize,
    /// The sink of the sequence's first page ([`PagePool::sink`]; 0 while it has none).
    pub sink: usize,
}

impl SeqPages<'_> {
    /// The cache row (page · PAGE + offset) holding position `p`.
    pub fn row(&self, p: usize) -> usize {
        self.pages[p / PAGE] as usize * PAGE + p % PAGE
    }

    /// Positions `start..end` as runs of consecutive cache rows. Pages taken in order are
    /// adjacent, so a sequence alone is one run.
    pub fn runs(&self, start: usize, end: usize) -> Vec<Run> {
        let mut runs: Vec<Run> = Vec::new();
        let mut p = start;
        while p < end {
            let len = (PAGE - p % PAGE).min(end - p);
            let row = self.row(p);
            match runs.last_mut() {
                Some(r) if r.row + r.len == row => r.len += len,
                _ => runs.push(Run { pos: p, row, len }),
            }
            p += len;
        }
        runs
    }
}

/// Positions `pos..pos + len` of a sequence in cache rows `row..row + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub pos: usize,
    pub row: usize,
    pub len: usize,
}

impl Run {
    /// The part of the run before position `end`, if any.
    pub fn before(self, end: usize) -> Option<Run> {
        (self.pos < end).then(|| Run { len: self.len.min(end - self.pos), ..self })
    }
}

/// Pages needed for `n` positions.
pub fn pages_for(n: usize) -> usize {
    n.div_ceil(PAGE)
}

/// Which pages and slots of a cache are in use.
#[derive(Debug)]
pub struct PagePool {
    /// References to each page (0: free).
    refs: Vec<u32>,
    /// Free pages, the next one to take last (so pages are taken in increasing order).
    free: Vec<u32>,
    free_slots: Vec<usize>,
    /// The sink each page owns ([`NO_SINK`]: none), and the sinks no page owns.
    sink_of: Vec<u32>,
    free_sinks: Vec<u32>,
}

const NO_SINK: u32 = u32::MAX;

impl PagePool {
    pub fn new(n_pages: usize, n_slots: usize) -> PagePool {
        PagePool {
            refs: vec![0; n_pages],
            free: (0..n_pages as u32).rev().collect(),
            free_slots: (0..n_slots).rev().collect(),
            sink_of: vec![NO_SINK; n_pages],
            free_sinks: (0..n_slots as u32).rev().collect(),
        }
    }

    pub fn n_pages(&self) -> usize {
        self.refs.len()
    }

    /// Pages held by at least one sequence.
    pub fn pages_in_use(&self) -> usize {
        self.refs.len() - self.free.len()
    }

    /// A free slot for a new sequence.
    pub fn take_slot(&mut self) -> Option<usize> {
        self.free_slots.pop()
    }

    /// Gives back a sequence's slot and its pages.
    pub fn release(&mut self, slot: usize, pages: &mut Vec<u32>) {
        self.shrink(pages, 0);
        debug_assert!(!self.free_slots.contains(&slot), "slot {slot} given back twice");
        self.free_slots.push(slot);
    }

    /// Takes pages until `pages` covers `n` positions; an error (nothing taken) when not
    /// enough are free.
    pub fn grow(&mut self, pages: &mut Vec<u32>, n: usize) -> Result<(), RuntimeError> {
        let need = pages_for(n).saturating_sub(pages.len());
        if need > 0 && pages.is_empty() && self.free_sinks.is_empty() {
            return Err(RuntimeError::Usage(
                "the K/V cache has no sink left for a new sequence: every one of its sequence slots' sinks is in use"
                    .into(),
            ));
        }
        if need > self.free.len() {
            return Err(RuntimeError::OutOfMemory(format!(
                "the K/V cache has no room for {n} positions of this sequence: {need} more pages of {PAGE} positions needed, {} of {} free",
                self.free.len(),
                self.refs.len()
            )));
        }
        for _ in 0..need {
            let p = self.free.pop().expect("counted above");
            self.refs[p as usize] = 1;
            if pages.is_empty() {
                self.sink_of[p as usize] = self.free_sinks.pop().expect("checked above");
            }
            pages.push(p);
        }
        Ok(())
    }

    /// The sink owned by the first of `pages` (0 when there is none).
    pub fn sink(&self, pages: &[u32]) -> usize {
        match pages.first().map(|&p| self.sink_of[p as usize]) {
            Some(s) if s != NO_SINK => s as usize,
            _ => 0,
        }
    }

    /// Gives back the pages past the first `n` positions.
    pub fn shrink(&mut self, pages: &mut Vec<u32>, n: usize) {
        for p in pages.drain(pages_for(n).min(pages.len())..).rev() {
            let r = &mut self.refs[p as usize];
            debug_assert!(*r > 0, "page {p} given back while free");
            *r -= 1;
            if *r == 0 {
                self.free.push(p);
                let sink = std::mem::replace(&mut self.sink_of[p as usize], NO_SINK);
                if sink != NO_SINK {
                    self.free_sinks.push(sink);
                }
            }
        }
    }

    /// Whether another sequence holds page `p` too (it must not be written).
    pub fn shared(&self, p: u32) -> bool {
        self.refs[p as usize] > 1
    }

    /// The first `n_pages` of `from` for another sequence, which then holds them too.
    pub fn share(&mut self, from: &[u32], n_pages: usize) -> Vec<u32> {
        let pages = from[..n_pages].to_vec();
        for &p in &pages {
            self.refs[p as usize] += 1;
        }
        pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_adjacent_pages() {
        let pages = [0, 1, 5, 2, 3];
        let s = SeqPages { pages: &pages, slot: 0, sink: 0 };
        assert_eq!(s.row(33), 33);
        assert_eq!(s.row(70), 5 * PAGE + 6);
        let run = |pos, row, len| Run { pos, row, len };
        assert_eq!(s.runs(3, 150), vec![run(3, 3, 61), run(64, 160, 32), run(96, 64, 54)]);
        assert_eq!(s.runs(40, 40), vec![]);
        assert_eq!(s.runs(96, 97), vec![run(96, 64, 1)]);
        assert_eq!(run(64, 160, 32).before(70), Some(run(64, 160, 6)));
        assert_eq!(run(64, 160, 32).before(64), None);
    }

    #[test]
    fn pages_are_reused_after_release_and_shared_pages_stay() {
        let mut pool = PagePool::new(6, 2);
        let (a_slot, b_slot) = (pool.take_slot().unwrap(), pool.take_slot().unwrap());
        assert_eq!((a_slot, b_slot), (0, 1));
        assert!(pool.take_slot().is_none());
        let mut a = Vec::new();
        pool.grow(&mut a, 70).unwrap();
        assert_eq!(a, [0, 1, 2]);
        assert_eq!(pool.sink(&a), 0);
        // b shares a's first two (full) pages, so its sink too, and takes its own third.
        let mut b = pool.share(&a, 2);
        assert_eq!(pool.sink(&b), 0);
        assert!(pool.shared(0) && pool.shared(1) && !pool.shared(2));
        pool.grow(&mut b, 80).unwrap();
        assert_eq!(b, [0, 1, 3]);
        assert_eq!(pool.pages_in_use(), 4);
        // Too many positions: refused, nothing taken.
        let before = b.clone();
        assert!(pool.grow(&mut b, 7 * PAGE).is_err());
        assert_eq!((b.clone(), pool.pages_in_use()), (before, 4));
        // a ends: its own page comes free, the shared ones stay with b.
        pool.release(a_slot, &mut a);
        assert!(a.is_empty() && !pool.shared(0));
        assert_eq!(pool.pages_in_use(), 3);
        // A new sequence gets the freed slot and page, and the other sink: b still has the first.
        let slot = pool.take_slot().unwrap();
        assert_eq!(slot, a_slot);
        let mut c = Vec::new();
        pool.grow(&mut c, 1).unwrap();
        assert_eq!((c.clone(), pool.sink(&c), pool.sink(&b)), (vec![2], 1, 0));
        pool.shrink(&mut b, 33);
        assert_eq!(b, [0, 1]);
        pool.release(b_slot, &mut b);
        // b's first page is free and its sink with it: the next first page gets it.
        let d_slot = pool.take_slot().unwrap();
        let mut d = Vec::new();
        pool.grow(&mut d, 1).unwrap();
        assert_eq!(pool.sink(&d), 0);
        pool.release(d_slot, &mut d);
        pool.release(slot, &mut c);
        assert_eq!(pool.pages_in_use(), 0);
        assert_eq!(pool.free_sinks.len(), 2);
    }
}
