//! Instructions given as text by the robot over the instruction segment
//! (`rings.instruction_path`). A non-real-time thread (`vla-text`) follows the segment and
//! renders each new text with the policy's [`TextRenderer`] (Fast-WAM: looks it up in the
//! bundle's fixed list and instruction packs); it hands the result to the
//! inference thread through a bounded channel. The inference thread ([`TextLink`], inside
//! the engine) only takes what arrived, installs it into one of the policy's text slots
//! (no allocation: their room is reserved at load) and sends what that replaced back to
//! be freed here; it says whether the instruction an observation names is ready. The
//! tokenizer, the template and the embedding gather never run on the inference thread.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vla_control::Health;
use vla_policy::{Policy, RenderedText, TextRenderer, TextSlot, TEXT_SLOTS};
use vla_ring::{text_id_of, InstructionReader, InstructionText, ReadError};

/// Messages in flight at most (text thread -> inference thread).
const CHANNEL: usize = 2 * TEXT_SLOTS;
/// Texts whose state (pending, ready, refused) the inference thread remembers: the
/// rendered slots and as many pending or refused ids again.
const ENTRIES: usize = 2 * TEXT_SLOTS;

enum Message {
    /// A text is being rendered under this id: until it is ready, the id is not.
    Pending {
        generation: u64,
        text_id: u32,
    },
    Ready {
        generation: u64,
        text_id: u32,
        /// The text, kept by the policy's slot (empty for an instruction it holds already).
        text: Vec<u8>,
        instruction: RenderedText,
    },
    Refused {
        generation: u64,
        text_id: u32,
    },
}

/// What an id stands for on the inference thread.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Pending,
    Refused,
    /// Rendered into the policy's instruction id.
    Ready(u32),
}

#[derive(Clone, Copy)]
struct Entry {
    text_id: u32,
    state: State,
    /// Order of the last change, to reuse the oldest entry.
    stamp: u64,
}

/// Both threads' shared view of which policy renders: bumped at every reload, so renders
/// made for the policy that ran before are never installed in the new one.
struct Shared {
    generation: AtomicU64,
    renderer: Mutex<Option<TextRenderer>>,
}

/// The inference thread's end: lives in the engine.
pub(super) struct TextLink {
    rx: Receiver<Message>,
    retire: SyncSender<TextSlot>,
    entries: [Entry; ENTRIES],
    stamp: u64,
    shared: Arc<Shared>,
}

/// The text thread, to be started once the loop runs.
pub(super) struct TextThread {
    path: PathBuf,
    geometry: vla_ring::Geometry,
    tx: SyncSender<Message>,
    retired: Receiver<TextSlot>,
    shared: Arc<Shared>,
}

/// The two ends for a policy (its renderer may be `None`: every text is then refused).
pub(super) fn link(
    path: PathBuf,
    geometry: vla_ring::Geometry,
    policy: &Policy,
) -> (TextLink, TextThread) {
    let (tx, rx) = sync_channel(CHANNEL);
    let (retire, retired) = sync_channel(CHANNEL);
    let shared = Arc::new(Shared {
        generation: AtomicU64::new(1),
        renderer: Mutex::new(policy.text_renderer()),
    });
    let free = Entry {
        text_id: 0,
        state: State::Free,
        stamp: 0,
    };
    (
        TextLink {
            rx,
            retire,
            entries: [free; ENTRIES],
            stamp: 0,
            shared: shared.clone(),
        },
        TextThread {
            path,
            geometry,
            tx,
            retired,
            shared,
        },
    )
}

impl TextLink {
    /// The policy changed (a reload): forget every text and have the newest one rendered
    /// again by the new policy's renderer. Not on the critical path (a reload loads a
    /// bundle; the lock is the text thread's only for a clone).
    pub(super) fn reset(&mut self, policy: Option<&Policy>) {
        let renderer = policy.and_then(Policy::text_renderer);
        *self
            .shared
            .renderer
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = renderer;
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        for e in &mut self.entries {
            e.state = State::Free;
        }
    }

    fn entry_for(&mut self, text_id: u32) -> &mut Entry {
        let i = self
            .entries
            .iter()
            .position(|e| e.state != State::Free && e.text_id == text_id)
            .or_else(|| self.entries.iter().position(|e| e.state == State::Free))
            .unwrap_or_else(|| {
                // All in use: the oldest that is not a rendered slot (there are at most
                // TEXT_SLOTS of those among 2 * TEXT_SLOTS entries).
                (0..ENTRIES)
                    .filter(|&i| !matches!(self.entries[i].state, State::Ready(_)))
                    .min_by_key(|&i| self.entries[i].stamp)
                    .unwrap_or(0)
            });
        self.stamp += 1;
        let e = &mut self.entries[i];
        e.text_id = text_id;
        e.stamp = self.stamp;
        e
    }

    /// Takes what the text thread sent and installs rendered texts into `policy`. No
    /// allocation; frees nothing here (replaced instructions go back to the text thread).
    pub(super) fn take(&mut self, policy: Option<&mut Policy>) {
        let generation = self.shared.generation.load(Ordering::Acquire);
        let mut policy = policy;
        loop {
            let message = match self.rx.try_recv() {
                Ok(m) => m,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return,
            };
            match message {
                Message::Pending {
                    generation: g,
                    text_id,
                } if g == generation => self.entry_for(text_id).state = State::Pending,
                Message::Refused {
                    generation: g,
                    text_id,
                } if g == generation => self.entry_for(text_id).state = State::Refused,
                Message::Ready {
                    generation: g,
                    text_id,
                    text,
                    instruction,
                } if g == generation => {
                    let Some(installed) = policy
                        .as_deref_mut()
                        .and_then(|p| p.install_text(text, instruction))
                    else {
                        self.entry_for(text_id).state = State::Refused;
                        continue;
                    };
                    let (id, replaced) = installed;
                    // A text slot's previous text (another id) is gone from the policy; an
                    // id the policy held already (Fast-WAM) may stand for several texts.
                    if id & vla_policy::TEXT_INSTRUCTION_FLAG != 0 {
                        for e in &mut self.entries {
                            if e.state == State::Ready(id) {
                                e.state = State::Free;
                            }
                        }
                    }
                    self.entry_for(text_id).state = State::Ready(id);
                    if let Some(old) = replaced {
                        self.retire_later(old);
                    }
                }
                Message::Ready {
                    text,
                    instruction: RenderedText::Prompt(instruction),
                    ..
                } => self.retire_later((text, instruction)),
                Message::Ready { .. } => {}
                Message::Pending { .. } | Message::Refused { .. } => {}
            }
        }
    }

    fn retire_later(&self, old: TextSlot) {
        // Bounded: when full (the text thread is stopping), it is freed here after all.
        if let Err(TrySendError::Full(old) | TrySendError::Disconnected(old)) =
            self.retire.try_send(old)
        {
            drop(old);
        }
    }

    /// The policy's instruction id for an observation's `instruction_id`: plain ids as
    /// they are (the policy takes them only below its fixed count: never a text slot), a
    /// text id when its text is rendered (the policy's flagged slot id); `None` while it is
    /// pending, refused or unknown.
    pub(super) fn resolve(&self, instruction_id: u32) -> Option<u32> {
        let Some(text_id) = text_id_of(instruction_id) else {
            return Some(instruction_id);
        };
        self.entries.iter().find_map(|e| match e.state {
            State::Ready(id) if e.text_id == text_id => Some(id),
            _ => None,
        })
    }
}

impl TextThread {
    /// Starts following the instruction segment; `health` counts renders and refusals.
    pub(super) fn start(
        self,
        health: Arc<Health>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("vla-text".into())
            .spawn(move || self.run(&health, &stop))
    }

    fn run(self, health: &Health, stop: &AtomicBool) {
        vla_control::block_signals();
        let mut reader: Option<InstructionReader> = None;
        let mut last_error = String::new();
        let mut generation = 0;
        let mut renderer: Option<TextRenderer> = None;
        // (writer epoch, seq) of the last text taken.
        let mut last = (0u64, 0u64);
        let mut buf = InstructionText::new();
        while !stop.load(Ordering::Acquire) {
            while self.retired.try_recv().is_ok() {}
            let g = self.shared.generation.load(Ordering::Acquire);
            if g != generation {
                generation = g;
                renderer = self
                    .shared
                    .renderer
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                // The new policy has none of the texts: the newest is rendered again.
                last.1 = last.1.saturating_sub(1);
            }
            let Some(ring) = &reader else {
                match InstructionReader::open(&self.path, self.geometry) {
                    Ok(r) => {
                        log::info!("instruction segment {} open", self.path.display());
                        reader = Some(r);
                        // Another file may start its epochs and seqs over: take its newest.
                        last = (0, 0);
                        last_error.clear();
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        if msg != last_error {
                            log::info!("waiting for the instruction segment: {msg}");
                            last_error = msg;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                continue;
            };
            let epoch = ring.writer_epoch();
            let published = ring.published();
            if epoch != last.0 {
                // A restarted writer continues the seqs: take its newest text.
                last = (epoch, published.saturating_sub(1));
            }
            if published <= last.1 {
                if matches!(ring.is_replaced(), Ok(true)) || ring.is_truncated() {
                    log::warn!(
                        "instruction segment {} was replaced or truncated; reopening",
                        self.path.display()
                    );
                    reader = None;
                }
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            // Every text written since the last look, oldest first (those the writer
            // lapped are gone: the firmware names only its newest anyway).
            let slots = u64::from(ring.layout().slot_count);
            for seq in (last.1 + 1).max(published.saturating_sub(slots - 1))..=published {
                match ring.read_seq(seq, &mut buf) {
                    Ok(()) => self.render(&buf, generation, renderer.as_ref(), health, stop),
                    Err(e @ ReadError::Incompatible { .. }) => {
                        log::warn!("instruction segment: {e}; reopening");
                        reader = None;
                        break;
                    }
                    Err(e) => log::debug!("instruction text {seq}: {e}"),
                }
            }
            last = (epoch, published);
        }
    }

    fn send(&self, mut message: Message, stop: &AtomicBool) {
        // The inference thread takes messages before each inference: wait for room
        // (this thread is not real-time), unless the loop stops.
        loop {
            match self.tx.try_send(message) {
                Ok(()) => return,
                Err(TrySendError::Disconnected(_)) => return,
                Err(TrySendError::Full(m)) => {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    while self.retired.try_recv().is_ok() {}
                    message = m;
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }

    fn render(
        &self,
        text: &InstructionText,
        generation: u64,
        renderer: Option<&TextRenderer>,
        health: &Health,
        stop: &AtomicBool,
    ) {
        let text_id = text.text_id;
        self.send(
            Message::Pending {
                generation,
                text_id,
            },
            stop,
        );
        let start = Instant::now();
        let result = match renderer {
            Some(r) => r.render(text.bytes()).map_err(|e| e.to_string()),
            None => Err(format!(
                "instruction {:?}: this bundle takes only its fixed instructions",
                String::from_utf8_lossy(text.bytes())
            )),
        };
        match result {
            Ok(instruction) => {
                Health::bump(&health.instruction_texts_rendered);
                log::info!(
                    "instruction text {text_id} rendered in {:.1} ms ({} bytes)",
                    start.elapsed().as_secs_f64() * 1e3,
                    text.bytes().len()
                );
                // Only a rendered prompt keeps its text (in a slot): nothing to free on
                // the inference thread otherwise.
                let bytes = match &instruction {
                    RenderedText::Prompt(_) => text.bytes().to_vec(),
                    RenderedText::Existing(_) => Vec::new(),
                };
                self.send(
                    Message::Ready {
                        generation,
                        text_id,
                        text: bytes,
                        instruction,
                    },
                    stop,
                );
            }
            Err(reason) => {
                Health::bump(&health.instruction_texts_refused);
                // One line: the text (quoted) and the reason; the robot holds meanwhile.
                log::warn!(
                    "instruction text {text_id}: {reason}; holding while the robot names it"
                );
                self.send(
                    Message::Refused {
                        generation,
                        text_id,
                    },
                    stop,
                );
            }
        }
    }
}
