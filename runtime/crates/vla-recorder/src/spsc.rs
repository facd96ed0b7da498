//! A bounded single-producer single-consumer queue of preallocated slots, without
//! `unsafe`: each slot sits behind its own mutex, which the producer only ever
//! `try_lock`s. Producer and consumer never touch the same slot at the same time (the
//! producer writes slot `head`, the consumer reads slots below it), so the locks are
//! uncontended; they are there so the sharing is sound in safe Rust. A full queue (the
//! consumer fell behind) drops the new record and counts it: the producer never waits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub(crate) struct Spsc<T> {
    slots: Box<[Mutex<T>]>,
    head: AtomicU64,
    tail: AtomicU64,
    dropped: AtomicU64,
}

impl<T> Spsc<T> {
    pub fn new(capacity: usize, mut make: impl FnMut() -> T) -> Self {
        Self {
            slots: (0..capacity.max(1)).map(|_| Mutex::new(make())).collect(),
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    fn capacity(&self) -> u64 {
        self.slots.len() as u64
    }

    /// Producer side: fills the next slot with `fill`, or drops and counts when full.
    /// Never blocks, never allocates (unless `fill` does).
    pub fn push(&self, fill: impl FnOnce(&mut T)) -> bool {
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        if head - tail >= self.capacity() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        match self.slots[(head % self.capacity()) as usize].try_lock() {
            Ok(mut slot) => fill(&mut slot),
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
        self.head.store(head + 1, Ordering::Release);
        true
    }

    /// Consumer side: hands the oldest record to `take`; false when empty.
    pub fn pop(&self, take: impl FnOnce(&T)) -> bool {
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Acquire);
        if tail == head {
            return false;
        }
        {
            let slot = self.slots[(tail % self.capacity()) as usize]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            take(&slot);
        }
        self.tail.store(tail + 1, Ordering::Release);
        true
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_and_counts_when_full_and_keeps_order() {
        let q = Spsc::new(2, || 0u32);
        assert!(q.push(|v| *v = 1));
        assert!(q.push(|v| *v = 2));
        assert!(!q.push(|v| *v = 3), "full: dropped");
        assert_eq!(q.dropped(), 1);
        let mut got = Vec::new();
        while q.pop(|v| got.push(*v)) {}
        assert_eq!(got, [1, 2]);
        assert!(q.push(|v| *v = 4));
        assert!(q.pop(|v| got.push(*v)));
        assert_eq!(got, [1, 2, 4]);
    }
}
