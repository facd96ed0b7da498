//! The records the taps copy out of the loop: fixed-size once built, so copying one into
//! another (queue slot to history slot) never allocates.

use vla_control::Decision;
use vla_ring::Geometry;

/// What the recorder keeps of the camera frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frames {
    /// Metadata only.
    Off,
    /// Every `factor`-th pixel of every `factor`-th row (nearest, no filtering): for a look
    /// in Foxglove, not for replay.
    Downscaled(u32),
    /// As the policy saw them: what `vlad replay` needs.
    Full,
}

impl Frames {
    /// The subsampling factor: the downscale factor (at least 1), else 1.
    pub fn factor(self) -> u32 {
        match self {
            Frames::Downscaled(f) => f.max(1),
            _ => 1,
        }
    }

    /// (height, width) of one recorded frame.
    pub fn size(self, g: &Geometry) -> (u32, u32) {
        match self {
            Frames::Off => (0, 0),
            _ => (
                g.height.div_ceil(self.factor()),
                g.width.div_ceil(self.factor()),
            ),
        }
    }

    /// Bytes of all recorded frames of one observation (0 when off).
    pub fn bytes(self, g: &Geometry) -> usize {
        let (h, w) = self.size(g);
        g.cameras as usize * h as usize * w as usize * g.channels as usize
    }

    /// Lower-case name as in the config (`off`, `downscaled`, `full`).
    pub fn name(self) -> &'static str {
        match self {
            Frames::Off => "off",
            Frames::Downscaled(_) => "downscaled",
            Frames::Full => "full",
        }
    }
}

/// One inference and the observation it ran on.
#[derive(Clone, Debug, Default)]
pub struct ChunkRecord {
    pub chunk_id: u64,
    pub ok: bool,
    pub prefixed: bool,
    pub obs_seq: u64,
    pub writer_epoch: u64,
    pub capture_ns: u64,
    pub seed: u64,
    pub instruction_id: u32,
    pub started_ns: u64,
    pub done_ns: u64,
    pub components_ns: Vec<u64>,
    pub components: usize,
    pub state: Vec<f32>,
    pub frames: Vec<u8>,
    pub actions: Vec<f32>,
}

impl ChunkRecord {
    pub fn for_geometry(g: &Geometry, frames: Frames, components: usize) -> Self {
        Self {
            components_ns: vec![0; components],
            state: vec![0.0; g.state_dims as usize],
            frames: vec![0; frames.bytes(g)],
            actions: vec![0.0; (g.chunk_len * g.action_dims) as usize],
            ..Self::default()
        }
    }

    /// Copies `other` in place (same geometry: no allocation).
    pub fn copy_from(&mut self, o: &ChunkRecord) {
        self.chunk_id = o.chunk_id;
        self.ok = o.ok;
        self.prefixed = o.prefixed;
        self.obs_seq = o.obs_seq;
        self.writer_epoch = o.writer_epoch;
        self.capture_ns = o.capture_ns;
        self.seed = o.seed;
        self.instruction_id = o.instruction_id;
        self.started_ns = o.started_ns;
        self.done_ns = o.done_ns;
        self.components = o.components;
        self.components_ns.copy_from_slice(&o.components_ns);
        self.state.copy_from_slice(&o.state);
        self.frames.copy_from_slice(&o.frames);
        self.actions.copy_from_slice(&o.actions);
    }
}

/// Copies `src` (the ring's frames, `cameras x h x w x c`) into `dst` at `frames`' size.
pub fn copy_frames(g: &Geometry, frames: Frames, src: &[u8], dst: &mut [u8]) {
    match frames {
        Frames::Off => {}
        Frames::Full => dst.copy_from_slice(src),
        Frames::Downscaled(_) => {
            let f = frames.factor() as usize;
            let (h, w, c) = (g.height as usize, g.width as usize, g.channels as usize);
            let (oh, ow) = frames.size(g);
            let (oh, ow) = (oh as usize, ow as usize);
            let mut o = 0;
            for cam in 0..g.cameras as usize {
                let base = cam * h * w * c;
                for y in 0..oh {
                    let row = base + y * f * w * c;
                    for x in 0..ow {
                        let p = row + x * f * c;
                        dst[o..o + c].copy_from_slice(&src[p..p + c]);
                        o += c;
                    }
                }
            }
        }
    }
}

/// One publisher tick.
#[derive(Clone, Debug, Default)]
pub struct TickRecord {
    pub now_ns: u64,
    pub decision: u8,
    pub step: u32,
    pub status: u8,
    pub chunk_id: u64,
    pub source_obs_seq: u64,
    pub made_time_ns: u64,
    pub valid_until_ns: u64,
    pub robot_alive: bool,
    pub missed: u64,
    pub values: Vec<f32>,
}

pub const DECISION_STEP: u8 = 0;
pub const DECISION_HOLD_LAST: u8 = 1;
pub const DECISION_HOLD: u8 = 2;
pub const DECISION_FAULT: u8 = 3;

pub fn decision_code(d: Decision) -> (u8, u32) {
    match d {
        Decision::Step(s) => (DECISION_STEP, s),
        Decision::HoldLast => (DECISION_HOLD_LAST, 0),
        Decision::Hold => (DECISION_HOLD, 0),
        Decision::Fault => (DECISION_FAULT, 0),
    }
}

pub fn decision_name(code: u8) -> &'static str {
    match code {
        DECISION_STEP => "step",
        DECISION_HOLD_LAST => "hold_last",
        DECISION_HOLD => "hold",
        _ => "fault",
    }
}

impl TickRecord {
    pub fn for_geometry(g: &Geometry) -> Self {
        Self {
            values: vec![0.0; g.action_dims as usize],
            ..Self::default()
        }
    }

    pub fn copy_from(&mut self, o: &TickRecord) {
        self.now_ns = o.now_ns;
        self.decision = o.decision;
        self.step = o.step;
        self.status = o.status;
        self.chunk_id = o.chunk_id;
        self.source_obs_seq = o.source_obs_seq;
        self.made_time_ns = o.made_time_ns;
        self.valid_until_ns = o.valid_until_ns;
        self.robot_alive = o.robot_alive;
        self.missed = o.missed;
        self.values.copy_from_slice(&o.values);
    }
}

/// A fixed-capacity history that overwrites its oldest record; slots built once.
pub(crate) struct History<T> {
    slots: Vec<T>,
    next: usize,
    len: usize,
}

impl<T> History<T> {
    pub fn new(capacity: usize, make: impl FnMut() -> T) -> Self {
        let mut make = make;
        Self {
            slots: (0..capacity.max(1)).map(|_| make()).collect(),
            next: 0,
            len: 0,
        }
    }

    /// The slot to overwrite with the newest record.
    pub fn push_slot(&mut self) -> &mut T {
        let i = self.next;
        self.next = (self.next + 1) % self.slots.len();
        self.len = (self.len + 1).min(self.slots.len());
        &mut self.slots[i]
    }

    /// Oldest to newest.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        let n = self.slots.len();
        let start = (self.next + n - self.len) % n;
        (0..self.len).map(move |k| &self.slots[(start + k) % n])
    }
}
