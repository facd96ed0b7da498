/*
 * vla_ring.h: C ABI of the vla-ring shared-memory rings (ABI major 1).
 *
 * Two rings connect the robot firmware and the runtime, each a file (usually in
 * /dev/shm) mapped MAP_SHARED by exactly one writer and any number of readers:
 *   - the observation ring: firmware writes camera frames and state, runtime reads;
 *   - the action ring: runtime writes one action step per slot, firmware reads.
 *
 * Segment: [header, 128 bytes][slot 0]...[slot N-1], native-endian, every slot
 * slot_size bytes (a multiple of 64). The Rust side is runtime/crates/vla-ring; its
 * tests compile this header and check every number below against the Rust layout.
 *
 * Protocol (single-writer seqlock per slot; seqs start at 1 and never repeat):
 *   writer: slot word 0 = 2*seq-1 (odd, relaxed); release fence; payload words
 *           (relaxed); word 0 = 2*seq (release); header.published = seq (release).
 *   reader: w0 = word 0 (acquire) must be 2*seq; copy payload words (relaxed);
 *           acquire fence; word 0 again (relaxed) must still be w0, else retry.
 * Slots are accessed only as 64-bit atomic words (the helpers below do): the u32 pairs
 * of a slot (instruction_id, step_index/status) live in one word, low address first.
 *
 * Firmware reading actions:
 *   fd = open(path, O_RDONLY); fstat; base = mmap(NULL, st_size, PROT_READ, MAP_SHARED, fd, 0);
 *   vla_ring_reader_open(&reader, base, st_size, VLA_RING_ACTION_MAGIC, &geometry) == 0,
 *   once (VLA_RING_CHECK_INITIALIZING: retry later);
 *   every tick: vla_ring_reader_action_read_latest(&reader, &step, values) == 0 and
 *   step.status == VLA_RING_STATUS_OK and now < step.valid_until_ns -> apply; else hold
 *   (fail closed). A writer_heartbeat_ns that stops moving means the runtime died.
 *   Every writer start bumps header.writer_epoch; the reader functions re-check the
 *   header whenever it changed, address slots with the layout checked at open (never
 *   with header fields a writer may be rewriting) and copy exactly action_dims values:
 *   VLA_RING_READ_INCOMPATIBLE (reader.field names the field) means reopen; the older
 *   base-pointer functions trust the header and are for segments checked just before.
 *
 * Firmware writing observations:
 *   fd = open(path, O_RDWR | O_CREAT, 0644); flock(fd, LOCK_EX | LOCK_NB) (the kernel
 *   drops it when the process dies, so a restart after kill -9 just works);
 *   if the file's size is not vla_ring_total_size(...): unlink(path) and start over
 *   (readers of the old file keep their mapping; never shrink a mapped file);
 *   ftruncate(fd, total) if it was empty; base = mmap(..., PROT_READ | PROT_WRITE, MAP_SHARED, ...);
 *   seq = vla_ring_writer_start(base, VLA_RING_OBS_MAGIC, &geometry, slots, getpid(), now, &epoch);
 *   per frame: vla_ring_obs_publish(base, seq++, epoch, &meta, state, frames, now).
 *
 * Firmware giving instructions as text (the instruction segment, magic "VLA-TXT\0", a
 * file of its own beside the observation ring, e.g. /dev/shm/vla-instructions; same
 * header, seqlock and writer start as the rings, slots of 64 + VLA_RING_MAX_TEXT_BYTES):
 *   set up exactly as the observation writer above, with VLA_RING_TEXT_MAGIC and the
 *   same geometry (it is checked, to catch a firmware configured for another link):
 *
 *     uint64_t total = vla_ring_total_size(VLA_RING_TEXT_MAGIC, &geometry, 4);
 *     int fd = open("/dev/shm/vla-instructions", O_RDWR | O_CREAT, 0644);
 *     flock(fd, LOCK_EX | LOCK_NB);          // one writer; the kernel drops it on death
 *     ftruncate(fd, total);                  // fresh (empty) file only
 *     void *text = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
 *     uint64_t tseq = vla_ring_writer_start(text, VLA_RING_TEXT_MAGIC, &geometry, 4,
 *                                           getpid(), now, &tepoch);
 *     // a new instruction: write its text first, then name it in the observations
 *     const char *say = "put the bowl on the plate";
 *     vla_ring_text_publish(text, tseq++, tepoch, 7, say, strlen(say), now);
 *     meta.instruction_id = VLA_RING_TEXT_ID_FLAG | 7;
 *     vla_ring_obs_publish(obs, seq++, epoch, &meta, state, frames, now);
 *
 *   Give each different text its own text_id (< VLA_RING_TEXT_ID_FLAG); rewriting an id
 *   with other text makes that id wait for the new rendering. The runtime renders the
 *   newest text off its control and inference paths (it keeps a few rendered), and holds
 *   (status hold) while the observation names a text it has not rendered yet or refused
 *   (invalid UTF-8, too many tokens, special-token text: one log line each, counted in
 *   its metrics). It never publishes a step computed for another instruction than the
 *   newest observation names: switching instructions holds until the first chunk of the
 *   new one. instruction_id values without the flag are the bundle's fixed instructions.
 *
 * Fast-WAM bundles have no text encoder on the device: a text is looked up (after the
 * whitespace cleaning upstream's tokenizer applies) in the bundle's fixed instructions
 * and in the instruction packs installed for it (`vlad ota install PACK`); a text in
 * neither is refused in one log line and the runtime holds. A pack's instruction may
 * also be named directly: instruction_id = VLA_RING_PACK_ID_FLAG | n, the id its
 * pack.json lists (bit 31 clear; the bundle's fixed ids are small, so the ranges never
 * meet). An id no installed pack holds makes the runtime hold, as an unrendered text.
 */
#ifndef VLA_RING_H
#define VLA_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
#error "vla_ring.h uses C11 <stdatomic.h> _Atomic fields; include it from C"
#endif

#define VLA_RING_OBS_MAGIC UINT64_C(0x0053424F2D414C56)    /* "VLA-OBS\0" read little-endian */
#define VLA_RING_ACTION_MAGIC UINT64_C(0x005443412D414C56) /* "VLA-ACT\0" read little-endian */
#define VLA_RING_TEXT_MAGIC UINT64_C(0x005458542D414C56)   /* "VLA-TXT\0" read little-endian */
#define VLA_RING_MAX_TEXT_BYTES 1024u  /* UTF-8 bytes per instruction text slot */
#define VLA_RING_TEXT_ID_FLAG 0x80000000u /* instruction_id = flag | text_id: a text, not a fixed id */
#define VLA_RING_PACK_ID_FLAG 0x40000000u /* instruction_id = flag | n: a Fast-WAM pack's instruction */
#define VLA_RING_ABI_MAJOR 1u
#define VLA_RING_ABI_VERSION 0u
#define VLA_RING_ABI_LOWEST_COMPATIBLE 0u
#define VLA_RING_HEADER_SIZE 128u
#define VLA_RING_SLOT_ALIGN 64u
#define VLA_RING_SLOT_FIXED_SIZE 64u
#define VLA_RING_MIN_SLOTS 2u
#define VLA_RING_MAX_SLOTS 65536u
#define VLA_RING_STATE_READY 0u
#define VLA_RING_STATE_INITIALIZING 1u
/* Seqlock retries before a read gives up (a slot write is a memcpy of a few hundred KiB
 * at most, so losing this often means being lapped or a dead writer's odd slot). */
#define VLA_RING_READ_ATTEMPTS 16u

/* Action step status (slot field `status`). */
#define VLA_RING_STATUS_OK 0u
#define VLA_RING_STATUS_HOLD 1u
#define VLA_RING_STATUS_FAULT 2u

/* The robot link's shape, as configured on each side. */
struct vla_ring_geometry {
    uint32_t cameras;     /* frames per observation (0 = state only) */
    uint32_t height;      /* pixels */
    uint32_t width;       /* pixels */
    uint32_t channels;    /* bytes per pixel, 3 for RGB8 */
    uint32_t state_dims;  /* f32 state values per observation */
    uint32_t action_dims; /* f32 values per action step */
    uint32_t chunk_len;   /* steps per action chunk */
    uint32_t reserved;    /* 0 */
};

/* The geometry as stored in the header. */
struct vla_ring_geometry_shm {
    _Atomic uint32_t cameras;
    _Atomic uint32_t height;
    _Atomic uint32_t width;
    _Atomic uint32_t channels;
    _Atomic uint32_t state_dims;
    _Atomic uint32_t action_dims;
    _Atomic uint32_t chunk_len;
    _Atomic uint32_t reserved;
};

struct vla_ring_header {
    _Atomic uint64_t magic;                 /* 0: VLA_RING_*_MAGIC; 0 while a fresh file is sized */
    _Atomic uint32_t abi_major;             /* 8: reader needs equality */
    _Atomic uint32_t abi_version;           /* 12: the writer's version */
    _Atomic uint32_t abi_lowest_compatible; /* 16: reader needs its version >= this */
    _Atomic uint32_t header_size;           /* 20: VLA_RING_HEADER_SIZE; slots start here */
    _Atomic uint64_t total_size;            /* 24: header_size + slot_count * slot_size */
    _Atomic uint32_t slot_count;            /* 32 */
    _Atomic uint32_t slot_size;             /* 36: multiple of 64 */
    struct vla_ring_geometry_shm geometry;  /* 40 */
    _Atomic uint32_t initializing;          /* 72: 1 while a writer (re)writes the header */
    _Atomic uint32_t writer_pid;            /* 76 */
    _Atomic uint64_t writer_epoch;          /* 80: bumped at every writer start */
    _Atomic uint64_t writer_heartbeat_ns;   /* 88: CLOCK_MONOTONIC of last publish/heartbeat */
    _Atomic uint64_t published;             /* 96: seq of the newest complete slot, 0 = none */
    _Atomic uint64_t reserved[3];           /* 104 */
};

/* Fixed part of an observation slot. Followed by float state[state_dims] at offset 64
 * and by the camera frames (camera-major, each height*width*channels bytes, HWC) at
 * vla_ring_obs_frames_offset(). */
struct vla_ring_obs_slot {
    _Atomic uint64_t seqlock;           /* 0: 2*seq-1 while written, 2*seq when complete */
    _Atomic uint64_t seq;               /* 8 */
    _Atomic uint64_t writer_epoch;      /* 16 */
    _Atomic uint64_t capture_time_ns;   /* 24: CLOCK_MONOTONIC */
    _Atomic uint64_t seed;              /* 32: for reproducible sampling */
    _Atomic uint64_t instruction_word;  /* 40: u32 instruction_id, then u32 reserved */
    _Atomic uint64_t reserved[2];       /* 48 */
};

/* Fixed part of an action slot (one step of a chunk). Followed by
 * float values[action_dims] at offset 64. */
struct vla_ring_action_slot {
    _Atomic uint64_t seqlock;           /* 0: 2*seq-1 while written, 2*seq when complete */
    _Atomic uint64_t seq;               /* 8 */
    _Atomic uint64_t writer_epoch;      /* 16 */
    _Atomic uint64_t source_obs_seq;    /* 24: the observation the chunk came from */
    _Atomic uint64_t made_time_ns;      /* 32: CLOCK_MONOTONIC */
    _Atomic uint64_t valid_until_ns;    /* 40: CLOCK_MONOTONIC; stale after this */
    _Atomic uint64_t chunk_id;          /* 48 */
    _Atomic uint64_t step_status_word;  /* 56: u32 step_index, then u32 status */
};

/* Fixed part of an instruction text slot. Followed by `len` bytes of UTF-8 text (not
 * NUL-terminated) at offset 64, VLA_RING_MAX_TEXT_BYTES reserved. */
struct vla_ring_text_slot {
    _Atomic uint64_t seqlock;           /* 0: 2*seq-1 while written, 2*seq when complete */
    _Atomic uint64_t seq;               /* 8 */
    _Atomic uint64_t writer_epoch;      /* 16 */
    _Atomic uint64_t written_time_ns;   /* 24: CLOCK_MONOTONIC */
    _Atomic uint64_t id_len_word;       /* 32: u32 text_id, then u32 len */
    _Atomic uint64_t reserved[3];       /* 40 */
};

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free to work across processes");
_Static_assert(sizeof(_Atomic uint64_t) == 8 && _Alignof(_Atomic uint64_t) == 8, "atomic u64 is 8 bytes, 8-aligned");
_Static_assert(sizeof(_Atomic uint32_t) == 4, "atomic u32 is 4 bytes");
_Static_assert(sizeof(float) == 4, "f32 values");
_Static_assert(sizeof(struct vla_ring_geometry) == 32, "geometry size");
_Static_assert(sizeof(struct vla_ring_geometry_shm) == 32, "geometry size");
_Static_assert(sizeof(struct vla_ring_header) == VLA_RING_HEADER_SIZE, "header size");
_Static_assert(offsetof(struct vla_ring_header, magic) == 0, "header.magic");
_Static_assert(offsetof(struct vla_ring_header, abi_major) == 8, "header.abi_major");
_Static_assert(offsetof(struct vla_ring_header, abi_version) == 12, "header.abi_version");
_Static_assert(offsetof(struct vla_ring_header, abi_lowest_compatible) == 16, "header.abi_lowest_compatible");
_Static_assert(offsetof(struct vla_ring_header, header_size) == 20, "header.header_size");
_Static_assert(offsetof(struct vla_ring_header, total_size) == 24, "header.total_size");
_Static_assert(offsetof(struct vla_ring_header, slot_count) == 32, "header.slot_count");
_Static_assert(offsetof(struct vla_ring_header, slot_size) == 36, "header.slot_size");
_Static_assert(offsetof(struct vla_ring_header, geometry) == 40, "header.geometry");
_Static_assert(offsetof(struct vla_ring_header, geometry.cameras) == 40, "header.geometry.cameras");
_Static_assert(offsetof(struct vla_ring_header, geometry.height) == 44, "header.geometry.height");
_Static_assert(offsetof(struct vla_ring_header, geometry.width) == 48, "header.geometry.width");
_Static_assert(offsetof(struct vla_ring_header, geometry.channels) == 52, "header.geometry.channels");
_Static_assert(offsetof(struct vla_ring_header, geometry.state_dims) == 56, "header.geometry.state_dims");
_Static_assert(offsetof(struct vla_ring_header, geometry.action_dims) == 60, "header.geometry.action_dims");
_Static_assert(offsetof(struct vla_ring_header, geometry.chunk_len) == 64, "header.geometry.chunk_len");
_Static_assert(offsetof(struct vla_ring_header, initializing) == 72, "header.initializing");
_Static_assert(offsetof(struct vla_ring_header, writer_pid) == 76, "header.writer_pid");
_Static_assert(offsetof(struct vla_ring_header, writer_epoch) == 80, "header.writer_epoch");
_Static_assert(offsetof(struct vla_ring_header, writer_heartbeat_ns) == 88, "header.writer_heartbeat_ns");
_Static_assert(offsetof(struct vla_ring_header, published) == 96, "header.published");
_Static_assert(offsetof(struct vla_ring_header, reserved) == 104, "header.reserved");
_Static_assert(sizeof(struct vla_ring_obs_slot) == VLA_RING_SLOT_FIXED_SIZE, "obs slot fixed size");
_Static_assert(offsetof(struct vla_ring_obs_slot, seqlock) == 0, "obs.seqlock");
_Static_assert(offsetof(struct vla_ring_obs_slot, seq) == 8, "obs.seq");
_Static_assert(offsetof(struct vla_ring_obs_slot, writer_epoch) == 16, "obs.writer_epoch");
_Static_assert(offsetof(struct vla_ring_obs_slot, capture_time_ns) == 24, "obs.capture_time_ns");
_Static_assert(offsetof(struct vla_ring_obs_slot, seed) == 32, "obs.seed");
_Static_assert(offsetof(struct vla_ring_obs_slot, instruction_word) == 40, "obs.instruction_id");
_Static_assert(offsetof(struct vla_ring_obs_slot, reserved) == 48, "obs.reserved");
_Static_assert(sizeof(struct vla_ring_action_slot) == VLA_RING_SLOT_FIXED_SIZE, "action slot fixed size");
_Static_assert(offsetof(struct vla_ring_action_slot, seqlock) == 0, "action.seqlock");
_Static_assert(offsetof(struct vla_ring_action_slot, seq) == 8, "action.seq");
_Static_assert(offsetof(struct vla_ring_action_slot, writer_epoch) == 16, "action.writer_epoch");
_Static_assert(offsetof(struct vla_ring_action_slot, source_obs_seq) == 24, "action.source_obs_seq");
_Static_assert(offsetof(struct vla_ring_action_slot, made_time_ns) == 32, "action.made_time_ns");
_Static_assert(offsetof(struct vla_ring_action_slot, valid_until_ns) == 40, "action.valid_until_ns");
_Static_assert(offsetof(struct vla_ring_action_slot, chunk_id) == 48, "action.chunk_id");
_Static_assert(offsetof(struct vla_ring_action_slot, step_status_word) == 56, "action.step_index/status");
_Static_assert(sizeof(struct vla_ring_text_slot) == VLA_RING_SLOT_FIXED_SIZE, "text slot fixed size");
_Static_assert(offsetof(struct vla_ring_text_slot, written_time_ns) == 24, "text.written_time_ns");
_Static_assert(offsetof(struct vla_ring_text_slot, id_len_word) == 32, "text.text_id/len");
_Static_assert(offsetof(struct vla_ring_text_slot, reserved) == 40, "text.reserved");
_Static_assert(VLA_RING_MAX_TEXT_BYTES % VLA_RING_SLOT_ALIGN == 0, "text slots stay cache-line aligned");
_Static_assert(VLA_RING_HEADER_SIZE % VLA_RING_SLOT_ALIGN == 0, "slots start cache-line aligned");

/* ---- sizes ---------------------------------------------------------------------- */

static inline uint64_t vla_ring_round_up(uint64_t value, uint64_t to) {
    return (value + to - 1) / to * to;
}

/* Bytes of all camera frames of one observation. */
static inline uint64_t vla_ring_frame_bytes(const struct vla_ring_geometry *g) {
    return (uint64_t)g->cameras * g->height * g->width * g->channels;
}

/* Offset of float state[] / float values[] in a slot. */
static inline uint64_t vla_ring_values_offset(void) { return VLA_RING_SLOT_FIXED_SIZE; }

/* Offset of the camera frames in an observation slot. */
static inline uint64_t vla_ring_obs_frames_offset(const struct vla_ring_geometry *g) {
    return vla_ring_round_up(VLA_RING_SLOT_FIXED_SIZE + 4u * (uint64_t)g->state_dims, VLA_RING_SLOT_ALIGN);
}

static inline uint64_t vla_ring_slot_size(uint64_t magic, const struct vla_ring_geometry *g) {
    if (magic == VLA_RING_OBS_MAGIC)
        return vla_ring_round_up(vla_ring_obs_frames_offset(g) + vla_ring_frame_bytes(g), VLA_RING_SLOT_ALIGN);
    if (magic == VLA_RING_TEXT_MAGIC) return VLA_RING_SLOT_FIXED_SIZE + VLA_RING_MAX_TEXT_BYTES;
    return vla_ring_round_up(VLA_RING_SLOT_FIXED_SIZE + 4u * (uint64_t)g->action_dims, VLA_RING_SLOT_ALIGN);
}

static inline uint64_t vla_ring_total_size(uint64_t magic, const struct vla_ring_geometry *g, uint32_t slot_count) {
    return VLA_RING_HEADER_SIZE + (uint64_t)slot_count * vla_ring_slot_size(magic, g);
}

/* ---- validation ----------------------------------------------------------------- */

enum vla_ring_check_result {
    VLA_RING_CHECK_OK = 0,
    VLA_RING_CHECK_TRUNCATED = 1,    /* mapping shorter than the header or total_size */
    VLA_RING_CHECK_INITIALIZING = 2, /* a writer is starting: retry */
    VLA_RING_CHECK_MAGIC = 3,        /* not this ring (or not a ring) */
    VLA_RING_CHECK_ABI_MAJOR = 4,
    VLA_RING_CHECK_ABI_TOO_OLD = 5,  /* VLA_RING_ABI_VERSION < abi_lowest_compatible */
    VLA_RING_CHECK_MISMATCH = 6      /* a size or geometry field differs; see *field */
};

static inline uint32_t vla_ring__ld32(const _Atomic uint32_t *p) {
    return atomic_load_explicit(p, memory_order_relaxed);
}

static inline enum vla_ring_check_result vla_ring__check(const void *base, uint64_t mapped_len, uint64_t magic,
                                                         const struct vla_ring_geometry *g, const char **field,
                                                         int during_takeover) {
    const struct vla_ring_header *h = (const struct vla_ring_header *)base;
    const char *unused;
    if (!field) field = &unused;
    *field = "size";
    if (mapped_len < VLA_RING_HEADER_SIZE) return VLA_RING_CHECK_TRUNCATED;
    *field = "initializing";
    uint32_t initializing = atomic_load_explicit(&h->initializing, memory_order_acquire);
    uint64_t found_magic = atomic_load_explicit(&h->magic, memory_order_relaxed);
    if (!during_takeover && (found_magic == 0 || initializing != VLA_RING_STATE_READY))
        return VLA_RING_CHECK_INITIALIZING;
    *field = "magic";
    if (found_magic != magic) return VLA_RING_CHECK_MAGIC;
    *field = "abi_major";
    if (vla_ring__ld32(&h->abi_major) != VLA_RING_ABI_MAJOR) return VLA_RING_CHECK_ABI_MAJOR;
    *field = "abi_lowest_compatible";
    if (VLA_RING_ABI_VERSION < vla_ring__ld32(&h->abi_lowest_compatible)) return VLA_RING_CHECK_ABI_TOO_OLD;
    *field = "header_size";
    if (vla_ring__ld32(&h->header_size) != VLA_RING_HEADER_SIZE) return VLA_RING_CHECK_MISMATCH;
    const struct vla_ring_geometry_shm *s = &h->geometry;
    *field = "cameras";
    if (vla_ring__ld32(&s->cameras) != g->cameras) return VLA_RING_CHECK_MISMATCH;
    *field = "height";
    if (vla_ring__ld32(&s->height) != g->height) return VLA_RING_CHECK_MISMATCH;
    *field = "width";
    if (vla_ring__ld32(&s->width) != g->width) return VLA_RING_CHECK_MISMATCH;
    *field = "channels";
    if (vla_ring__ld32(&s->channels) != g->channels) return VLA_RING_CHECK_MISMATCH;
    *field = "state_dims";
    if (vla_ring__ld32(&s->state_dims) != g->state_dims) return VLA_RING_CHECK_MISMATCH;
    *field = "action_dims";
    if (vla_ring__ld32(&s->action_dims) != g->action_dims) return VLA_RING_CHECK_MISMATCH;
    *field = "chunk_len";
    if (vla_ring__ld32(&s->chunk_len) != g->chunk_len) return VLA_RING_CHECK_MISMATCH;
    *field = "slot_count";
    uint32_t slots = vla_ring__ld32(&h->slot_count);
    if (slots < VLA_RING_MIN_SLOTS || slots > VLA_RING_MAX_SLOTS) return VLA_RING_CHECK_MISMATCH;
    *field = "slot_size";
    if (vla_ring__ld32(&h->slot_size) != vla_ring_slot_size(magic, g)) return VLA_RING_CHECK_MISMATCH;
    *field = "total_size";
    uint64_t total = atomic_load_explicit(&h->total_size, memory_order_relaxed);
    if (total != vla_ring_total_size(magic, g, slots)) return VLA_RING_CHECK_MISMATCH;
    *field = "size";
    if (mapped_len < total) return VLA_RING_CHECK_TRUNCATED;
    *field = "";
    return VLA_RING_CHECK_OK;
}

/* Validates a mapped segment against the caller's expectations. On failure *field (if
 * not NULL) names the header field at fault. Call once after mmap. */
static inline enum vla_ring_check_result vla_ring_check(const void *base, uint64_t mapped_len, uint64_t magic,
                                                        const struct vla_ring_geometry *g, const char **field) {
    return vla_ring__check(base, mapped_len, magic, g, field, 0);
}

static inline const char *vla_ring_check_str(enum vla_ring_check_result r) {
    switch (r) {
    case VLA_RING_CHECK_OK: return "ok";
    case VLA_RING_CHECK_TRUNCATED: return "segment truncated";
    case VLA_RING_CHECK_INITIALIZING: return "writer is initializing the segment";
    case VLA_RING_CHECK_MAGIC: return "wrong magic (not this ring)";
    case VLA_RING_CHECK_ABI_MAJOR: return "ABI major version differs";
    case VLA_RING_CHECK_ABI_TOO_OLD: return "writer needs a newer reader";
    case VLA_RING_CHECK_MISMATCH: return "header field differs from the expected geometry";
    }
    return "unknown";
}

/* ---- seqlock reads -------------------------------------------------------------- */

enum vla_ring_read_result {
    VLA_RING_READ_OK = 0,
    VLA_RING_READ_EMPTY = -1,         /* nothing published yet */
    VLA_RING_READ_NOT_YET = -2,       /* seq newer than anything written */
    VLA_RING_READ_OVERWRITTEN = -3,   /* the slot holds a newer seq: reader fell behind */
    VLA_RING_READ_IN_PROGRESS = -4,   /* writer inside the slot on every attempt (or died there) */
    VLA_RING_READ_CONTENDED = -5,     /* every attempt raced the writer */
    VLA_RING_READ_BAD_STATUS = -6,    /* action status not ok/hold/fault */
    VLA_RING_READ_INCONSISTENT = -7,  /* published/seq fields contradict the seqlock: corrupt */
    VLA_RING_READ_RESTARTING = -8,    /* a writer is (re)starting on the segment: retry */
    VLA_RING_READ_INCOMPATIBLE = -9   /* a writer restarted with another layout: reopen */
};

/* A decoded action step (a private copy, not shared memory). */
struct vla_ring_action_step {
    uint64_t seq;
    uint64_t writer_epoch;
    uint64_t source_obs_seq;
    uint64_t made_time_ns;
    uint64_t valid_until_ns;
    uint64_t chunk_id;
    uint32_t step_index;
    uint32_t status; /* VLA_RING_STATUS_* */
};

static inline const _Atomic uint64_t *vla_ring__slot(const struct vla_ring_header *h, uint64_t seq) {
    uint64_t index = seq % vla_ring__ld32(&h->slot_count);
    return (const _Atomic uint64_t *)((const unsigned char *)h + VLA_RING_HEADER_SIZE +
                                      index * vla_ring__ld32(&h->slot_size));
}

/* One seqlock attempt: copies fixed words 1..7 into fixed[1..7] and `len` bytes of
 * payload from byte offset `offset` into `dst`. */
static inline int vla_ring__try_read(const _Atomic uint64_t *slot, uint64_t seq, uint64_t fixed[8],
                                     uint64_t offset, void *dst, uint64_t len) {
    uint64_t before = atomic_load_explicit(&slot[0], memory_order_acquire);
    if (before != 2 * seq) {
        if (before == 2 * seq - 1) return VLA_RING_READ_IN_PROGRESS;
        return before < 2 * seq ? VLA_RING_READ_NOT_YET : VLA_RING_READ_OVERWRITTEN;
    }
    for (unsigned i = 1; i < 8; i++) fixed[i] = atomic_load_explicit(&slot[i], memory_order_relaxed);
    const _Atomic uint64_t *words = slot + offset / 8;
    for (uint64_t done = 0; done < len; done += 8) {
        uint64_t word = atomic_load_explicit(&words[done / 8], memory_order_relaxed);
        uint64_t n = len - done < 8 ? len - done : 8;
        memcpy((unsigned char *)dst + done, &word, (size_t)n);
    }
    /* Pairs with the writer's release fence: a copy that saw any newer payload word
     * sees the newer (odd) seqlock word below. */
    atomic_thread_fence(memory_order_acquire);
    uint64_t after = atomic_load_explicit(&slot[0], memory_order_relaxed);
    return after == before ? VLA_RING_READ_OK : VLA_RING_READ_CONTENDED;
}

static inline int vla_ring__decode_action(const uint64_t fixed[8], uint64_t seq, struct vla_ring_action_step *out) {
    uint32_t pair[2];
    memcpy(pair, &fixed[7], sizeof pair);
    out->seq = fixed[1];
    out->writer_epoch = fixed[2];
    out->source_obs_seq = fixed[3];
    out->made_time_ns = fixed[4];
    out->valid_until_ns = fixed[5];
    out->chunk_id = fixed[6];
    out->step_index = pair[0];
    out->status = pair[1];
    if (out->seq != seq) return VLA_RING_READ_INCONSISTENT;
    return out->status <= VLA_RING_STATUS_FAULT ? VLA_RING_READ_OK : VLA_RING_READ_BAD_STATUS;
}

/* Copies action step `seq` into *out and values[action_dims]. On failure the contents
 * of *out and values are unspecified. */
static inline int vla_ring_action_read_seq(const void *base, uint64_t seq, struct vla_ring_action_step *out,
                                           float *values) {
    const struct vla_ring_header *h = (const struct vla_ring_header *)base;
    if (seq == 0) return VLA_RING_READ_NOT_YET;
    uint64_t len = 4u * (uint64_t)vla_ring__ld32(&h->geometry.action_dims);
    uint64_t fixed[8];
    int r = VLA_RING_READ_CONTENDED;
    for (unsigned attempt = 0; attempt < VLA_RING_READ_ATTEMPTS; attempt++) {
        r = vla_ring__try_read(vla_ring__slot(h, seq), seq, fixed, VLA_RING_SLOT_FIXED_SIZE, values, len);
        if (r == VLA_RING_READ_OK) return vla_ring__decode_action(fixed, seq, out);
        if (r == VLA_RING_READ_NOT_YET || r == VLA_RING_READ_OVERWRITTEN) return r;
    }
    return r;
}

/* Copies the newest complete action step into *out and values[action_dims]. */
static inline int vla_ring_action_read_latest(const void *base, struct vla_ring_action_step *out, float *values) {
    const struct vla_ring_header *h = (const struct vla_ring_header *)base;
    uint64_t len = 4u * (uint64_t)vla_ring__ld32(&h->geometry.action_dims);
    uint64_t fixed[8];
    for (unsigned attempt = 0; attempt < VLA_RING_READ_ATTEMPTS; attempt++) {
        uint64_t seq = atomic_load_explicit(&h->published, memory_order_acquire);
        if (seq == 0) return VLA_RING_READ_EMPTY;
        int r = vla_ring__try_read(vla_ring__slot(h, seq), seq, fixed, VLA_RING_SLOT_FIXED_SIZE, values, len);
        if (r == VLA_RING_READ_OK) return vla_ring__decode_action(fixed, seq, out);
        if (r == VLA_RING_READ_NOT_YET) return VLA_RING_READ_INCONSISTENT;
        /* in progress / overwritten / torn: the writer lapped us, reload published */
    }
    return VLA_RING_READ_CONTENDED;
}

/* ---- checked reader ------------------------------------------------------------- */

/* A reader's view of one segment: the layout checked at open and the writer epoch it
 * was checked for. Fill it with vla_ring_reader_open(); read with the functions below. */
struct vla_ring_reader {
    const void *base;
    uint64_t mapped_len;
    uint64_t magic;
    struct vla_ring_geometry geometry;
    uint32_t slot_count;
    uint32_t slot_size;
    uint64_t epoch;     /* writer epoch the header was last checked for */
    const char *field;  /* after a failed check: the header field at fault */
};

/* Checks the segment and records its layout and writer epoch. */
static inline enum vla_ring_check_result vla_ring_reader_open(struct vla_ring_reader *r, const void *base,
                                                              uint64_t mapped_len, uint64_t magic,
                                                              const struct vla_ring_geometry *g) {
    const struct vla_ring_header *h = (const struct vla_ring_header *)base;
    r->base = base;
    r->mapped_len = mapped_len;
    r->magic = magic;
    r->geometry = *g;
    r->field = "";
    if (mapped_len < VLA_RING_HEADER_SIZE) {
        r->field = "size";
        return VLA_RING_CHECK_TRUNCATED;
    }
    r->epoch = atomic_load_explicit(&h->writer_epoch, memory_order_acquire);
    enum vla_ring_check_result c = vla_ring__check(base, mapped_len, magic, g, &r->field, 0);
    if (c != VLA_RING_CHECK_OK) return c;
    r->slot_count = vla_ring__ld32(&h->slot_count);
    r->slot_size = (uint32_t)vla_ring_slot_size(magic, g);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&h->initializing, memory_order_relaxed) != VLA_RING_STATE_READY ||
        atomic_load_explicit(&h->writer_epoch, memory_order_relaxed) != r->epoch) {
        r->field = "initializing";
        return VLA_RING_CHECK_INITIALIZING;
    }
    return VLA_RING_CHECK_OK;
}

/* Before a read: 0 and the epoch, after re-checking the header if a writer started. */
static inline int vla_ring__reader_enter(struct vla_ring_reader *r, uint64_t *epoch) {
    const struct vla_ring_header *h = (const struct vla_ring_header *)r->base;
    uint64_t e = atomic_load_explicit(&h->writer_epoch, memory_order_acquire);
    if (e != r->epoch) {
        enum vla_ring_check_result c = vla_ring__check(r->base, r->mapped_len, r->magic, &r->geometry, &r->field, 0);
        if (c == VLA_RING_CHECK_INITIALIZING) return VLA_RING_READ_RESTARTING;
        if (c != VLA_RING_CHECK_OK || vla_ring__ld32(&h->slot_count) != r->slot_count) {
            if (c == VLA_RING_CHECK_OK) r->field = "slot_count";
            return VLA_RING_READ_INCOMPATIBLE;
        }
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&h->initializing, memory_order_relaxed) != VLA_RING_STATE_READY ||
            atomic_load_explicit(&h->writer_epoch, memory_order_relaxed) != e)
            return VLA_RING_READ_RESTARTING;
        r->epoch = e;
    }
    *epoch = e;
    return VLA_RING_READ_OK;
}

/* After a read: the copy is only good if no writer started while it was made. */
static inline int vla_ring__reader_leave(const struct vla_ring_reader *r, uint64_t epoch) {
    const struct vla_ring_header *h = (const struct vla_ring_header *)r->base;
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&h->initializing, memory_order_relaxed) != VLA_RING_STATE_READY ||
        atomic_load_explicit(&h->writer_epoch, memory_order_relaxed) != epoch)
        return VLA_RING_READ_RESTARTING;
    return VLA_RING_READ_OK;
}

static inline const _Atomic uint64_t *vla_ring__reader_slot(const struct vla_ring_reader *r, uint64_t seq) {
    return (const _Atomic uint64_t *)((const unsigned char *)r->base + VLA_RING_HEADER_SIZE +
                                      (seq % r->slot_count) * (uint64_t)r->slot_size);
}

/* Copies action step `seq` into *out and values[geometry.action_dims]. */
static inline int vla_ring_reader_action_read_seq(struct vla_ring_reader *r, uint64_t seq,
                                                  struct vla_ring_action_step *out, float *values) {
    uint64_t epoch;
    int r0 = vla_ring__reader_enter(r, &epoch);
    if (r0 != VLA_RING_READ_OK) return r0;
    if (seq == 0) return VLA_RING_READ_NOT_YET;
    uint64_t len = 4u * (uint64_t)r->geometry.action_dims;
    uint64_t fixed[8];
    int res = VLA_RING_READ_CONTENDED;
    for (unsigned attempt = 0; attempt < VLA_RING_READ_ATTEMPTS; attempt++) {
        res = vla_ring__try_read(vla_ring__reader_slot(r, seq), seq, fixed, VLA_RING_SLOT_FIXED_SIZE, values, len);
        if (res == VLA_RING_READ_OK) {
            int left = vla_ring__reader_leave(r, epoch);
            return left != VLA_RING_READ_OK ? left : vla_ring__decode_action(fixed, seq, out);
        }
        if (res == VLA_RING_READ_NOT_YET || res == VLA_RING_READ_OVERWRITTEN) return res;
    }
    return res;
}

/* Copies the newest complete action step into *out and values[geometry.action_dims]. */
static inline int vla_ring_reader_action_read_latest(struct vla_ring_reader *r, struct vla_ring_action_step *out,
                                                     float *values) {
    const struct vla_ring_header *h = (const struct vla_ring_header *)r->base;
    uint64_t epoch;
    int r0 = vla_ring__reader_enter(r, &epoch);
    if (r0 != VLA_RING_READ_OK) return r0;
    uint64_t len = 4u * (uint64_t)r->geometry.action_dims;
    uint64_t fixed[8];
    for (unsigned attempt = 0; attempt < VLA_RING_READ_ATTEMPTS; attempt++) {
        uint64_t seq = atomic_load_explicit(&h->published, memory_order_acquire);
        if (seq == 0) return VLA_RING_READ_EMPTY;
        int res = vla_ring__try_read(vla_ring__reader_slot(r, seq), seq, fixed, VLA_RING_SLOT_FIXED_SIZE, values, len);
        if (res == VLA_RING_READ_OK) {
            int left = vla_ring__reader_leave(r, epoch);
            return left != VLA_RING_READ_OK ? left : vla_ring__decode_action(fixed, seq, out);
        }
        if (res == VLA_RING_READ_NOT_YET) return VLA_RING_READ_INCONSISTENT;
    }
    return VLA_RING_READ_CONTENDED;
}

/* ---- single writer -------------------------------------------------------------- */

static inline void vla_ring__st32(_Atomic uint32_t *p, uint32_t v) {
    atomic_store_explicit(p, v, memory_order_relaxed);
}

static inline _Atomic uint64_t *vla_ring__slot_mut(struct vla_ring_header *h, uint64_t seq) {
    return (_Atomic uint64_t *)vla_ring__slot(h, seq);
}

static inline void vla_ring__write_static(struct vla_ring_header *h, uint64_t magic,
                                          const struct vla_ring_geometry *g, uint32_t slot_count) {
    vla_ring__st32(&h->abi_major, VLA_RING_ABI_MAJOR);
    vla_ring__st32(&h->abi_version, VLA_RING_ABI_VERSION);
    vla_ring__st32(&h->abi_lowest_compatible, VLA_RING_ABI_LOWEST_COMPATIBLE);
    vla_ring__st32(&h->header_size, VLA_RING_HEADER_SIZE);
    atomic_store_explicit(&h->total_size, vla_ring_total_size(magic, g, slot_count), memory_order_relaxed);
    vla_ring__st32(&h->slot_count, slot_count);
    vla_ring__st32(&h->slot_size, (uint32_t)vla_ring_slot_size(magic, g));
    vla_ring__st32(&h->geometry.cameras, g->cameras);
    vla_ring__st32(&h->geometry.height, g->height);
    vla_ring__st32(&h->geometry.width, g->width);
    vla_ring__st32(&h->geometry.channels, g->channels);
    vla_ring__st32(&h->geometry.state_dims, g->state_dims);
    vla_ring__st32(&h->geometry.action_dims, g->action_dims);
    vla_ring__st32(&h->geometry.chunk_len, g->chunk_len);
    vla_ring__st32(&h->geometry.reserved, 0);
}

/* Takes the writer role on a segment mapped read-write, `vla_ring_total_size()` bytes
 * long, while holding the file's flock. A segment that already has this magic, ABI
 * major and geometry (a restart, e.g. after kill -9) keeps its data: the epoch is
 * bumped and seqs continue. Anything else is initialized from scratch. Returns the seq
 * to publish next; *epoch receives the new writer epoch. */
static inline uint64_t vla_ring_writer_start(void *base, uint64_t magic, const struct vla_ring_geometry *g,
                                             uint32_t slot_count, uint32_t pid, uint64_t now_ns, uint64_t *epoch) {
    struct vla_ring_header *h = (struct vla_ring_header *)base;
    const char *field;
    uint64_t total = vla_ring_total_size(magic, g, slot_count);
    /* Looks past a predecessor that died with `initializing` set. */
    int fits = vla_ring__ld32(&h->slot_count) == slot_count &&
               vla_ring__check(base, total, magic, g, &field, 1) == VLA_RING_CHECK_OK;
    atomic_store_explicit(&h->initializing, VLA_RING_STATE_INITIALIZING, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    uint64_t next = 1;
    if (fits) {
        *epoch = atomic_load_explicit(&h->writer_epoch, memory_order_relaxed) + 1;
        next = atomic_load_explicit(&h->published, memory_order_relaxed);
        for (uint32_t i = 0; i < slot_count; i++) {
            uint64_t word = atomic_load_explicit(vla_ring__slot(h, i), memory_order_relaxed);
            uint64_t seq = (word + 1) / 2;
            if (seq > next) next = seq;
        }
        next += 1;
    } else {
        atomic_store_explicit(&h->magic, 0, memory_order_relaxed);
        _Atomic uint64_t *words = (_Atomic uint64_t *)((unsigned char *)base + VLA_RING_HEADER_SIZE);
        for (uint64_t i = 0; i < (total - VLA_RING_HEADER_SIZE) / 8; i++)
            atomic_store_explicit(&words[i], 0, memory_order_relaxed);
        atomic_store_explicit(&h->published, 0, memory_order_relaxed);
        /* Bumped here too: a reader of the old layout on this very segment (same size,
         * another geometry) must see a new epoch to know it has to re-check. */
        *epoch = atomic_load_explicit(&h->writer_epoch, memory_order_relaxed) + 1;
    }
    if (*epoch == 0) *epoch = 1;
    vla_ring__write_static(h, magic, g, slot_count);
    atomic_store_explicit(&h->writer_epoch, *epoch, memory_order_relaxed);
    vla_ring__st32(&h->writer_pid, pid);
    atomic_store_explicit(&h->writer_heartbeat_ns, now_ns, memory_order_relaxed);
    atomic_store_explicit(&h->magic, magic, memory_order_relaxed);
    atomic_store_explicit(&h->initializing, VLA_RING_STATE_READY, memory_order_release);
    return next;
}

/* Stores `len` bytes from `src` at byte offset `offset` of a slot, as whole words. */
static inline void vla_ring__store_bytes(_Atomic uint64_t *slot, uint64_t offset, const void *src, uint64_t len) {
    _Atomic uint64_t *words = slot + offset / 8;
    for (uint64_t done = 0; done < len; done += 8) {
        uint64_t word = 0;
        uint64_t n = len - done < 8 ? len - done : 8;
        memcpy(&word, (const unsigned char *)src + done, (size_t)n);
        atomic_store_explicit(&words[done / 8], word, memory_order_relaxed);
    }
}

/* Observation metadata for vla_ring_obs_publish. */
struct vla_ring_obs_meta {
    uint64_t capture_time_ns; /* CLOCK_MONOTONIC */
    uint64_t seed;
    uint32_t instruction_id;
};

/* Publishes observation `seq` (the value vla_ring_writer_start returned, then +1 per
 * call) with state[state_dims] and frames[cameras*height*width*channels]. */
static inline void vla_ring_obs_publish(void *base, uint64_t seq, uint64_t epoch, const struct vla_ring_obs_meta *meta,
                                        const float *state, const uint8_t *frames, uint64_t now_ns) {
    struct vla_ring_header *h = (struct vla_ring_header *)base;
    struct vla_ring_geometry g = {
        vla_ring__ld32(&h->geometry.cameras),    vla_ring__ld32(&h->geometry.height),
        vla_ring__ld32(&h->geometry.width),      vla_ring__ld32(&h->geometry.channels),
        vla_ring__ld32(&h->geometry.state_dims), vla_ring__ld32(&h->geometry.action_dims),
        vla_ring__ld32(&h->geometry.chunk_len),  0};
    _Atomic uint64_t *slot = vla_ring__slot_mut(h, seq);
    uint32_t instruction[2] = {meta->instruction_id, 0};
    uint64_t instruction_word;
    memcpy(&instruction_word, instruction, sizeof instruction_word);

    atomic_store_explicit(&slot[0], 2 * seq - 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&slot[1], seq, memory_order_relaxed);
    atomic_store_explicit(&slot[2], epoch, memory_order_relaxed);
    atomic_store_explicit(&slot[3], meta->capture_time_ns, memory_order_relaxed);
    atomic_store_explicit(&slot[4], meta->seed, memory_order_relaxed);
    atomic_store_explicit(&slot[5], instruction_word, memory_order_relaxed);
    vla_ring__store_bytes(slot, VLA_RING_SLOT_FIXED_SIZE, state, 4u * (uint64_t)g.state_dims);
    vla_ring__store_bytes(slot, vla_ring_obs_frames_offset(&g), frames, vla_ring_frame_bytes(&g));
    atomic_store_explicit(&slot[0], 2 * seq, memory_order_release);
    atomic_store_explicit(&h->published, seq, memory_order_release);
    atomic_store_explicit(&h->writer_heartbeat_ns, now_ns, memory_order_relaxed);
}

/* Publishes instruction text `seq` (the value vla_ring_writer_start returned for the
 * instruction segment, then +1 per call): `len` bytes of UTF-8 `text` under `text_id`
 * (< VLA_RING_TEXT_ID_FLAG). Returns 0, or -1 (nothing written) when len exceeds
 * VLA_RING_MAX_TEXT_BYTES or text_id has the flag bit. */
static inline int vla_ring_text_publish(void *base, uint64_t seq, uint64_t epoch, uint32_t text_id, const char *text,
                                        uint32_t len, uint64_t now_ns) {
    struct vla_ring_header *h = (struct vla_ring_header *)base;
    if (len > VLA_RING_MAX_TEXT_BYTES || (text_id & VLA_RING_TEXT_ID_FLAG) != 0) return -1;
    _Atomic uint64_t *slot = vla_ring__slot_mut(h, seq);
    uint32_t id_len[2] = {text_id, len};
    uint64_t id_len_word;
    memcpy(&id_len_word, id_len, sizeof id_len_word);
    unsigned char padded[VLA_RING_MAX_TEXT_BYTES];
    memset(padded, 0, sizeof padded);
    memcpy(padded, text, len);

    atomic_store_explicit(&slot[0], 2 * seq - 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&slot[1], seq, memory_order_relaxed);
    atomic_store_explicit(&slot[2], epoch, memory_order_relaxed);
    atomic_store_explicit(&slot[3], now_ns, memory_order_relaxed);
    atomic_store_explicit(&slot[4], id_len_word, memory_order_relaxed);
    for (unsigned i = 5; i < 8; i++) atomic_store_explicit(&slot[i], 0, memory_order_relaxed);
    vla_ring__store_bytes(slot, VLA_RING_SLOT_FIXED_SIZE, padded, VLA_RING_MAX_TEXT_BYTES);
    atomic_store_explicit(&slot[0], 2 * seq, memory_order_release);
    atomic_store_explicit(&h->published, seq, memory_order_release);
    atomic_store_explicit(&h->writer_heartbeat_ns, now_ns, memory_order_relaxed);
    return 0;
}

#endif /* VLA_RING_H */
