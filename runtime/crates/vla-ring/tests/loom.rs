//! Model check of the seqlock protocol in `src/seqlock.rs` (the very code the rings run)
//! under loom's C11 memory model: every interleaving and every value a relaxed load may
//! legally return is explored.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p vla-ring --release --test loom`
#![cfg(loom)]

use std::sync::atomic::{AtomicBool, Ordering as StdOrdering};

use loom::sync::Arc;
use loom::thread;
use vla_ring::seqlock::{AtomicU64, LatestMiss, Ordering, RingCore, SlotMiss};

/// Seqlock word + two payload words per slot.
const SLOT_WORDS: usize = 3;

struct Shared {
    published: AtomicU64,
    words: Vec<AtomicU64>,
}

impl Shared {
    fn new(slots: usize) -> Arc<Shared> {
        Arc::new(Shared {
            published: AtomicU64::new(0),
            words: (0..slots * SLOT_WORDS).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn ring(&self) -> RingCore<'_> {
        RingCore::new(&self.published, &self.words, SLOT_WORDS)
    }
}

/// Both payload words are derived from the seq, so a mix of two writes is detectable.
fn write_pattern(shared: &Shared, seq: u64) {
    shared.ring().publish(seq, |w| {
        w.store_u64(8, seq * 11);
        w.store_u64(16, seq * 13);
    });
}

fn copy(r: &vla_ring::seqlock::PayloadReader<'_>) -> (u64, u64) {
    (r.load_u64(8), r.load_u64(16))
}

fn assert_untorn(seq: u64, (a, b): (u64, u64)) {
    assert_eq!(
        (a, b),
        (seq * 11, seq * 13),
        "torn copy accepted for seq {seq}"
    );
}

#[test]
fn read_latest_never_accepts_a_torn_slot_when_the_writer_laps_it() {
    // One slot: the writer overwrites exactly the slot the reader copies.
    loom::model(|| {
        let shared = Shared::new(1);
        let writer = {
            let shared = shared.clone();
            thread::spawn(move || {
                write_pattern(&shared, 1);
                write_pattern(&shared, 2);
            })
        };
        match shared.ring().read_latest(2, copy) {
            Ok((seq, payload)) => assert_untorn(seq, payload),
            Err(LatestMiss::Empty | LatestMiss::Contended) => {}
            Err(e @ LatestMiss::Inconsistent { .. }) => panic!("{e:?}"),
        }
        writer.join().unwrap();
        let (seq, payload) = shared.ring().read_latest(1, copy).unwrap();
        assert_eq!(seq, 2);
        assert_untorn(seq, payload);
    });
}

#[test]
fn published_always_leads_to_a_complete_slot() {
    // Two slots, three writes: seq 3 reuses seq 1's slot while the reader may be on it.
    loom::model(|| {
        let shared = Shared::new(2);
        let writer = {
            let shared = shared.clone();
            thread::spawn(move || {
                for seq in 1..=3 {
                    write_pattern(&shared, seq);
                }
            })
        };
        let ring = shared.ring();
        let published = ring.published();
        if published > 0 {
            // Acquiring `published` makes its slot's completion visible: the seqlock word
            // can be newer (lapped), never older.
            match ring.read_seq(published, 1, copy) {
                Ok(payload) => assert_untorn(published, payload),
                Err(SlotMiss::Overwritten { .. } | SlotMiss::InProgress | SlotMiss::Torn) => {}
                Err(SlotMiss::NotYetWritten) => panic!("published {published} not yet written"),
            }
        }
        writer.join().unwrap();
    });
}

#[test]
fn read_seq_reports_every_state_of_a_reused_slot_without_tearing() {
    loom::model(|| {
        let shared = Shared::new(1);
        let writer = {
            let shared = shared.clone();
            thread::spawn(move || {
                write_pattern(&shared, 1);
                write_pattern(&shared, 2);
            })
        };
        match shared.ring().read_seq(1, 2, copy) {
            Ok(payload) => assert_untorn(1, payload),
            Err(SlotMiss::NotYetWritten)
            | Err(SlotMiss::InProgress)
            | Err(SlotMiss::Torn)
            | Err(SlotMiss::Overwritten { by: 2 }) => {}
            Err(other) => panic!("{other:?}"),
        }
        writer.join().unwrap();
    });
}

/// Guards the model itself: a reader that skips the closing seqlock check must be caught
/// copying a torn slot in some execution, or the tests above would prove nothing.
#[test]
fn the_model_catches_a_reader_without_the_closing_check() {
    static TORN_SEEN: AtomicBool = AtomicBool::new(false);
    loom::model(|| {
        let shared = Shared::new(1);
        let writer = {
            let shared = shared.clone();
            thread::spawn(move || {
                write_pattern(&shared, 1);
                write_pattern(&shared, 2);
            })
        };
        let lock = shared.words[0].load(Ordering::Acquire);
        if lock != 0 && lock % 2 == 0 {
            let seq = lock / 2;
            let a = shared.words[1].load(Ordering::Relaxed);
            let b = shared.words[2].load(Ordering::Relaxed);
            if (a, b) != (seq * 11, seq * 13) {
                TORN_SEEN.store(true, StdOrdering::Relaxed);
            }
        }
        writer.join().unwrap();
    });
    assert!(
        TORN_SEEN.load(StdOrdering::Relaxed),
        "loom never produced a torn copy for a broken reader"
    );
}
