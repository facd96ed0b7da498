//! The single-writer seqlock protocol over slots of atomic 64-bit words, and the
//! `published` counter that makes the newest complete slot findable.
//!
//! Word 0 of a slot is its seqlock word: `2*seq - 1` (odd) while `seq` is being written,
//! `2*seq` once it is complete. Sequence numbers start at 1 and only grow, also across
//! writer restarts, so a slot's word only grows and a reader can tell "not yet written",
//! "in progress", "complete" and "overwritten" apart from one load.
//!
//! Orderings follow the standard seqlock (Boehm, "Can seqlocks get along with programming
//! language memory models?", 2012):
//! - writer: `lock = odd` (relaxed), release fence, payload stores (relaxed),
//!   `lock = even` (release), then `published = seq` (release);
//! - reader: `before = lock` (acquire), payload loads (relaxed), acquire fence,
//!   `after = lock` (relaxed); the copy is accepted only if `before == after == 2*seq`.
//!
//! Payload is copied with atomic word loads and stores only: a racing plain or volatile
//! copy would be undefined behaviour, while relaxed atomic word accesses compile to plain
//! loads and stores on x86-64 and aarch64.
//!
//! Under `--cfg loom` the atomics are loom's, and `tests/loom.rs` model-checks this
//! exact code.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU64, Ordering};

#[cfg(not(loom))]
pub use core::sync::atomic::{fence, AtomicU64, Ordering};

/// Why a slot did not yield the requested sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotMiss {
    /// The slot still holds an older seq (or nothing): `seq` was not published yet.
    NotYetWritten,
    /// The writer is writing `seq` right now (or died while writing it).
    InProgress,
    /// The slot was reused for the newer seq `by`.
    Overwritten {
        /// The seq the slot now holds.
        by: u64,
    },
    /// Every attempt overlapped a write.
    Torn,
}

/// Why `read_latest` found no complete slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatestMiss {
    /// Nothing was ever published.
    Empty,
    /// Every attempt raced the writer lapping the ring.
    Contended,
    /// `published` names a seq that its slot never reached: the segment is corrupt.
    Inconsistent {
        /// The header's `published` seq.
        published: u64,
        /// The seqlock word its slot holds instead of `2 * published` or later.
        lock_word: u64,
    },
}

/// Stores into the payload of a slot being written; offsets are bytes from slot start.
pub struct PayloadWriter<'a> {
    words: &'a [AtomicU64],
}

/// Loads from the payload of a slot being read; offsets are bytes from slot start.
pub struct PayloadReader<'a> {
    words: &'a [AtomicU64],
}

fn word_index(offset: usize) -> usize {
    debug_assert!(offset % 8 == 0, "payload offsets are 8-byte aligned");
    debug_assert!(offset >= 8, "word 0 is the seqlock word");
    offset / 8
}

impl PayloadWriter<'_> {
    /// Stores one 8-byte-aligned u64 at `offset` (never 0: that is the seqlock word).
    pub fn store_u64(&self, offset: usize, value: u64) {
        self.words[word_index(offset)].store(value, Ordering::Relaxed);
    }

    /// Stores `low` at `offset` and `high` at `offset + 4`, as a C struct with two
    /// consecutive u32 fields has them, whatever the byte order.
    pub fn store_u32_pair(&self, offset: usize, low: u32, high: u32) {
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&low.to_ne_bytes());
        bytes[4..].copy_from_slice(&high.to_ne_bytes());
        self.store_u64(offset, u64::from_ne_bytes(bytes));
    }

    /// Stores `bytes` from `offset` on; the tail of the last word is zero-filled.
    pub fn store_bytes(&self, offset: usize, bytes: &[u8]) {
        let first = word_index(offset);
        let mut chunks = bytes.chunks_exact(8);
        for (word, chunk) in self.words[first..].iter().zip(&mut chunks) {
            let mut tmp = [0u8; 8];
            tmp.copy_from_slice(chunk);
            word.store(u64::from_ne_bytes(tmp), Ordering::Relaxed);
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            let mut tmp = [0u8; 8];
            tmp[..tail.len()].copy_from_slice(tail);
            self.words[first + bytes.len() / 8].store(u64::from_ne_bytes(tmp), Ordering::Relaxed);
        }
    }

    /// Stores `values` as consecutive native-endian f32 from `offset` on.
    pub fn store_f32s(&self, offset: usize, values: &[f32]) {
        let first = word_index(offset);
        let mut pairs = values.chunks_exact(2);
        for (word, pair) in self.words[first..].iter().zip(&mut pairs) {
            let mut tmp = [0u8; 8];
            tmp[..4].copy_from_slice(&pair[0].to_ne_bytes());
            tmp[4..].copy_from_slice(&pair[1].to_ne_bytes());
            word.store(u64::from_ne_bytes(tmp), Ordering::Relaxed);
        }
        if let [last] = pairs.remainder() {
            let mut tmp = [0u8; 8];
            tmp[..4].copy_from_slice(&last.to_ne_bytes());
            self.words[first + values.len() / 2].store(u64::from_ne_bytes(tmp), Ordering::Relaxed);
        }
    }
}

impl PayloadReader<'_> {
    /// Loads the u64 at `offset` (8-byte aligned, never 0: that is the seqlock word).
    pub fn load_u64(&self, offset: usize) -> u64 {
        self.words[word_index(offset)].load(Ordering::Relaxed)
    }

    /// The two u32 at `offset` and `offset + 4`.
    pub fn load_u32_pair(&self, offset: usize) -> (u32, u32) {
        let bytes = self.load_u64(offset).to_ne_bytes();
        let low = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let high = u32::from_ne_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        (low, high)
    }

    /// Fills `out` from the bytes at `offset` on, whole words at a time.
    pub fn load_bytes(&self, offset: usize, out: &mut [u8]) {
        let first = word_index(offset);
        let full = out.len() / 8;
        let mut chunks = out.chunks_exact_mut(8);
        for (word, chunk) in self.words[first..].iter().zip(&mut chunks) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let bytes = self.words[first + full]
                .load(Ordering::Relaxed)
                .to_ne_bytes();
            let len = tail.len();
            tail.copy_from_slice(&bytes[..len]);
        }
    }

    /// Fills `out` with consecutive native-endian f32 from `offset` on.
    pub fn load_f32s(&self, offset: usize, out: &mut [f32]) {
        let first = word_index(offset);
        let full = out.len() / 2;
        let mut pairs = out.chunks_exact_mut(2);
        for (word, pair) in self.words[first..].iter().zip(&mut pairs) {
            let b = word.load(Ordering::Relaxed).to_ne_bytes();
            pair[0] = f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            pair[1] = f32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
        }
        if let [last] = pairs.into_remainder() {
            let b = self.words[first + full]
                .load(Ordering::Relaxed)
                .to_ne_bytes();
            *last = f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
}

/// One slot: `words[0]` is the seqlock word, the rest is payload.
#[derive(Clone, Copy)]
pub struct Slot<'a> {
    words: &'a [AtomicU64],
}

/// Largest sequence number: a slot's seqlock word holds `2*seq`, which must fit in a u64.
/// A writer publishing a billion times a second gets there after 292 years, so a larger
/// seq in `published` or a slot word only comes from a corrupt or foreign segment.
pub const MAX_SEQ: u64 = u64::MAX / 2;

/// What a seqlock word says about `seq`.
fn classify(lock_word: u64, seq: u64) -> Result<(), SlotMiss> {
    // Seq 0 is never written and no seq above MAX_SEQ can be: the words below would wrap.
    if seq == 0 || seq > MAX_SEQ {
        return Err(SlotMiss::NotYetWritten);
    }
    let complete = 2 * seq;
    if lock_word == complete {
        Ok(())
    } else if lock_word == complete - 1 {
        Err(SlotMiss::InProgress)
    } else if lock_word < complete {
        Err(SlotMiss::NotYetWritten)
    } else {
        Err(SlotMiss::Overwritten {
            by: lock_word.div_ceil(2),
        })
    }
}

fn backoff(attempt: u32) {
    #[cfg(loom)]
    {
        let _ = attempt;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    for _ in 0..(1u32 << attempt.min(10)) {
        core::hint::spin_loop();
    }
}

impl<'a> Slot<'a> {
    /// `words` must hold at least the seqlock word.
    pub fn new(words: &'a [AtomicU64]) -> Self {
        assert!(!words.is_empty(), "a slot needs its seqlock word");
        Slot { words }
    }

    /// The raw seqlock word (acquire).
    pub fn lock_word(&self) -> u64 {
        self.words[0].load(Ordering::Acquire)
    }

    /// Writes `seq` (>= 1) into the slot. Only the ring's single writer may call this, with
    /// seqs larger than any the slot held before.
    pub fn write(&self, seq: u64, fill: impl FnOnce(&PayloadWriter<'_>)) {
        debug_assert!(seq >= 1);
        let lock = &self.words[0];
        lock.store(2 * seq - 1, Ordering::Relaxed);
        // Orders the odd word before every payload store: a reader whose relaxed load saw
        // any new payload word then sees the odd (or a later) lock word after its own
        // acquire fence, and rejects the copy.
        fence(Ordering::Release);
        fill(&PayloadWriter { words: self.words });
        lock.store(2 * seq, Ordering::Release);
    }

    /// Copies `seq` out of the slot with `copy`, retrying up to `attempts` times while the
    /// writer is inside the slot. `copy` may run several times; only the result of a copy
    /// that no write overlapped is returned.
    pub fn read<R>(
        &self,
        seq: u64,
        attempts: u32,
        mut copy: impl FnMut(&PayloadReader<'_>) -> R,
    ) -> Result<R, SlotMiss> {
        let lock = &self.words[0];
        let mut last = SlotMiss::Torn;
        for attempt in 0..attempts {
            let before = lock.load(Ordering::Acquire);
            match classify(before, seq) {
                Ok(()) => {}
                Err(SlotMiss::InProgress) => {
                    last = SlotMiss::InProgress;
                    backoff(attempt);
                    continue;
                }
                Err(miss) => return Err(miss),
            }
            let result = copy(&PayloadReader { words: self.words });
            // Pairs with the writer's release fence: if any payload load above saw a store
            // of a later write, the load below sees that write's odd lock word.
            fence(Ordering::Acquire);
            let after = lock.load(Ordering::Relaxed);
            if after == before {
                return Ok(result);
            }
            last = SlotMiss::Torn;
            backoff(attempt);
        }
        Err(last)
    }
}

/// A ring of equally sized slots plus its `published` counter.
pub struct RingCore<'a> {
    published: &'a AtomicU64,
    slots: &'a [AtomicU64],
    slot_words: usize,
    slot_count: u64,
}

impl<'a> RingCore<'a> {
    /// `slots` is `slot_count * slot_words` words, slot after slot.
    pub fn new(published: &'a AtomicU64, slots: &'a [AtomicU64], slot_words: usize) -> Self {
        assert!(slot_words >= 1 && !slots.is_empty() && slots.len() % slot_words == 0);
        RingCore {
            published,
            slots,
            slot_words,
            slot_count: (slots.len() / slot_words) as u64,
        }
    }

    /// The slot that holds `seq` (and every seq congruent to it).
    pub fn slot_for(&self, seq: u64) -> Slot<'a> {
        let index = (seq % self.slot_count) as usize;
        Slot::new(&self.slots[index * self.slot_words..(index + 1) * self.slot_words])
    }

    /// Seq of the newest complete slot, 0 if none.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// Writes `seq` and then makes it the newest published one.
    pub fn publish(&self, seq: u64, fill: impl FnOnce(&PayloadWriter<'_>)) {
        self.slot_for(seq).write(seq, fill);
        self.published.store(seq, Ordering::Release);
    }

    /// The newest seq that `published` or any slot names, complete or not. Above
    /// [`MAX_SEQ`] only in a corrupt segment, which a writer must not continue.
    pub fn newest_seq(&self) -> u64 {
        let newest_in_slots = (0..self.slot_count)
            .map(|i| self.slots[i as usize * self.slot_words].load(Ordering::Acquire))
            .map(|word| word.div_ceil(2))
            .max()
            .unwrap_or(0);
        newest_in_slots.max(self.published())
    }

    /// The seq a writer taking over this ring must continue with: past every seq that any
    /// slot ever held or started to hold, so slot words keep growing and a seq a reader
    /// already saw is never reused for different data (saturating: see [`Self::newest_seq`]).
    pub fn next_seq_after_restart(&self) -> u64 {
        self.newest_seq().saturating_add(1)
    }

    /// Copies slot `seq` through `copy`, retrying a torn copy up to `attempts` times; `Err`
    /// says why no complete copy of `seq` was made (seq 0 is never written).
    pub fn read_seq<R>(
        &self,
        seq: u64,
        attempts: u32,
        copy: impl FnMut(&PayloadReader<'_>) -> R,
    ) -> Result<R, SlotMiss> {
        if seq == 0 {
            return Err(SlotMiss::NotYetWritten);
        }
        self.slot_for(seq).read(seq, attempts, copy)
    }

    /// Copies the newest complete slot; returns its seq with the copy. Each attempt
    /// re-reads `published`, so a reader lapped by the writer moves on to the newer slot.
    pub fn read_latest<R>(
        &self,
        attempts: u32,
        mut copy: impl FnMut(&PayloadReader<'_>) -> R,
    ) -> Result<(u64, R), LatestMiss> {
        for attempt in 0..attempts {
            let seq = self.published();
            if seq == 0 {
                return Err(LatestMiss::Empty);
            }
            let slot = self.slot_for(seq);
            match slot.read(seq, 1, &mut copy) {
                Ok(result) => return Ok((seq, result)),
                Err(SlotMiss::NotYetWritten) => {
                    return Err(LatestMiss::Inconsistent {
                        published: seq,
                        lock_word: slot.lock_word(),
                    })
                }
                Err(SlotMiss::InProgress | SlotMiss::Overwritten { .. } | SlotMiss::Torn) => {
                    backoff(attempt)
                }
            }
        }
        Err(LatestMiss::Contended)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn words(n: usize) -> Vec<AtomicU64> {
        (0..n).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn classify_covers_every_state_of_a_slot_word() {
        assert_eq!(classify(0, 1), Err(SlotMiss::NotYetWritten));
        assert_eq!(classify(1, 1), Err(SlotMiss::InProgress));
        assert_eq!(classify(2, 1), Ok(()));
        assert_eq!(classify(9, 1), Err(SlotMiss::Overwritten { by: 5 }));
        assert_eq!(classify(10, 1), Err(SlotMiss::Overwritten { by: 5 }));
        assert_eq!(classify(2, 3), Err(SlotMiss::NotYetWritten));
    }

    #[test]
    fn bytes_and_floats_round_trip_with_odd_lengths() {
        let w = words(8);
        let slot = Slot::new(&w);
        let bytes: Vec<u8> = (0..21).collect();
        let floats = [1.5f32, -2.25, 3.0];
        slot.write(1, |p| {
            p.store_bytes(8, &bytes);
            p.store_f32s(32, &floats);
            p.store_u32_pair(48, 7, 9);
        });
        let mut got_bytes = [0u8; 21];
        let mut got_floats = [0f32; 3];
        let pair = slot
            .read(1, 1, |r| {
                r.load_bytes(8, &mut got_bytes);
                r.load_f32s(32, &mut got_floats);
                r.load_u32_pair(48)
            })
            .unwrap();
        assert_eq!(&got_bytes[..], &bytes[..]);
        assert_eq!(got_floats, floats);
        assert_eq!(pair, (7, 9));
    }

    #[test]
    fn slot_left_odd_is_reported_in_progress_after_bounded_attempts() {
        let w = words(2);
        w[0].store(5, Ordering::Relaxed);
        let slot = Slot::new(&w);
        assert_eq!(slot.read(3, 4, |_| ()), Err(SlotMiss::InProgress));
    }

    #[test]
    fn latest_skips_a_slot_left_odd_by_a_dead_writer() {
        let w = words(3 * 2);
        let published = AtomicU64::new(0);
        let ring = RingCore::new(&published, &w, 2);
        assert_eq!(ring.read_latest(4, |_| ()), Err(LatestMiss::Empty));
        for seq in 1..=4 {
            ring.publish(seq, |p| p.store_u64(8, seq * 100));
        }
        // A writer killed while writing seq 5: odd word, payload half new, published at 4.
        ring.slot_for(5).words[0].store(9, Ordering::Relaxed);
        ring.slot_for(5).words[1].store(12345, Ordering::Relaxed);
        let (seq, value) = ring.read_latest(4, |r| r.load_u64(8)).unwrap();
        assert_eq!((seq, value), (4, 400));
        assert_eq!(ring.read_seq(5, 2, |_| ()), Err(SlotMiss::InProgress));
        assert_eq!(
            ring.read_seq(2, 2, |_| ()),
            Err(SlotMiss::Overwritten { by: 5 })
        );
        assert_eq!(ring.next_seq_after_restart(), 6);
    }

    #[test]
    fn seqs_no_seqlock_word_can_hold_are_never_written() {
        for word in [0, 1, 2, u64::MAX - 1, u64::MAX] {
            assert_eq!(classify(word, 0), Err(SlotMiss::NotYetWritten));
            assert_eq!(classify(word, MAX_SEQ + 1), Err(SlotMiss::NotYetWritten));
            assert_eq!(classify(word, u64::MAX), Err(SlotMiss::NotYetWritten));
        }
        assert_eq!(classify(u64::MAX - 1, MAX_SEQ), Ok(()));

        // A corrupt `published` is reported, not read; the restart seq saturates.
        let w = words(2 * 2);
        let published = AtomicU64::new(u64::MAX);
        let ring = RingCore::new(&published, &w, 2);
        assert!(matches!(
            ring.read_latest(4, |_| ()),
            Err(LatestMiss::Inconsistent {
                published: u64::MAX,
                ..
            })
        ));
        assert_eq!(
            ring.read_seq(u64::MAX, 4, |_| ()),
            Err(SlotMiss::NotYetWritten)
        );
        assert_eq!(ring.next_seq_after_restart(), u64::MAX);
        w[0].store(u64::MAX, Ordering::Relaxed);
        published.store(0, Ordering::Relaxed);
        assert_eq!(ring.newest_seq(), MAX_SEQ + 1);
        assert_eq!(ring.next_seq_after_restart(), MAX_SEQ + 2);
    }
}
