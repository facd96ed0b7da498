/*
 * vla_ring_client.h: the C ring client library, the set-up around runtime/include/vla_ring.h
 * that every C client of the rings needs once: open, flock, size check and mmap, as the
 * header's comment tells firmware to do, and the robot's ring ends built on them (the
 * observation writer, the instruction segment's writer, the action reader).
 *
 * Built by runtime/ring-c/Makefile, once per architecture, into libvla_ring_client.a and
 * libvla_ring_client.so (the LIBERO robot loads the latter with ctypes); vla-ring-bridge
 * (vla_ring_bridge.c) is its stdin/stdout front end for a board. Every function that can
 * fail writes one line naming the ring file into err[err_len].
 */
#ifndef VLA_RING_CLIENT_H
#define VLA_RING_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "vla_ring.h"

/* How opening a ring file ended. */
enum vlr_open_result {
    VLR_OPEN_OK = 0,
    VLR_OPEN_ABSENT = 1,    /* no such file: its writer has not created it yet (retry later) */
    VLR_OPEN_NOT_READY = 2, /* shorter than a ring header, or its writer is starting (retry later) */
    VLR_OPEN_REFUSED = 3,   /* another kind of segment, ABI or geometry (the message names the field) */
    VLR_OPEN_BUSY = 4,      /* another writer holds the file's flock */
    VLR_OPEN_SYSTEM = 5     /* a system call failed (the message has errno's text) */
};

/* A ring file mapped MAP_SHARED. The descriptor stays open while mapped: a writer's flock
 * lives on it and the kernel drops it when the process dies. */
struct vlr_mapping {
    int fd;
    void *base;
    uint64_t len;
};

/* CLOCK_MONOTONIC in ns, the clock of every time in the rings. */
uint64_t vlr_now_ns(void);

/* "observation ring", "action ring" or "instruction segment" (the name in messages). */
const char *vlr_ring_name(uint64_t magic);

/* The writer's set-up: open (creating it 0644), flock(LOCK_EX | LOCK_NB), a file of another
 * size unlinked and started afresh (readers keep their mapping of the old one; a mapped file
 * is never shrunk), ftruncate to vla_ring_total_size() when empty, mmap read-write. The
 * caller then takes the writer role with vla_ring_writer_start(). */
enum vlr_open_result vlr_map_writer(struct vlr_mapping *m, const char *path, uint64_t magic,
                                    const struct vla_ring_geometry *g, uint32_t slots, char *err, size_t err_len);

/* A reader's set-up: open an existing file, check it holds at least a header, mmap all of it
 * read-only (read-write when `writable`, for a writer taking an existing segment over with
 * vlr_lock()). `magic` only names the ring in messages: vla_ring_reader_open() checks it. */
enum vlr_open_result vlr_map_existing(struct vlr_mapping *m, const char *path, uint64_t magic, int writable,
                                      char *err, size_t err_len);

/* flock(LOCK_EX | LOCK_NB) on the mapping's file: the one writer's lock. */
enum vlr_open_result vlr_lock(const struct vlr_mapping *m, const char *path, uint64_t magic, char *err,
                              size_t err_len);

/* Unmaps and closes (dropping a writer's flock). */
void vlr_unmap(struct vlr_mapping *m);

/* ---- the writers: observation ring and instruction segment ----------------------------- */

struct vlr_writer;

/* The observation ring at `path` as its one writer (vlr_map_writer, then
 * vla_ring_writer_start). NULL with err filled on failure. */
struct vlr_writer *vlr_writer_open(const char *path, const struct vla_ring_geometry *g, uint32_t slots, char *err,
                                   size_t err_len);

/* The instruction segment (VLA-TXT) at `path` as its one writer, with the observation
 * ring's geometry (the header checks it, to catch a firmware configured for another link). */
struct vlr_writer *vlr_text_writer_open(const char *path, const struct vla_ring_geometry *g, uint32_t slots,
                                        char *err, size_t err_len);

/* The writer epoch this writer started with, and the seq it publishes next. */
uint64_t vlr_writer_epoch(const struct vlr_writer *w);
uint64_t vlr_writer_next_seq(const struct vlr_writer *w);

/* Publishes one observation; the lengths are checked against the ring's geometry first (a
 * frame of another size or a state of another length is refused, nothing written).
 * Returns the seq (>= 1), or 0 with err filled. */
uint64_t vlr_writer_publish(struct vlr_writer *w, uint32_t instruction_id, uint64_t seed, uint64_t capture_ns,
                            const float *state, uint64_t state_len, const uint8_t *frames, uint64_t frames_len,
                            char *err, size_t err_len);

/* Publishes `len` bytes of instruction text under `text_id` (< VLA_RING_TEXT_ID_FLAG) on an
 * instruction segment's writer. Returns the seq (>= 1), or 0 with err filled (nothing
 * written: a text longer than VLA_RING_MAX_TEXT_BYTES, an id with the flag bit). */
uint64_t vlr_text_publish(struct vlr_writer *w, uint32_t text_id, const char *text, uint32_t len,
                          uint64_t written_ns, char *err, size_t err_len);

/* The heartbeat alone (header field writer_heartbeat_ns, "last publish/heartbeat"): the
 * robot is alive while it steps a simulation between observations. */
void vlr_writer_heartbeat(struct vlr_writer *w);

void vlr_writer_close(struct vlr_writer *w);

/* ---- the action reader ------------------------------------------------------------------ */

struct vlr_reader;

/* Opens the action ring read-only and checks it against the geometry. Returns NULL with err
 * filled; *retry is 1 when the ring is not there yet or its writer is starting. */
struct vlr_reader *vlr_reader_open(const char *path, const struct vla_ring_geometry *g, int *retry, char *err,
                                   size_t err_len);

/* The newest published seq (0: none yet). */
uint64_t vlr_reader_published(const struct vlr_reader *rd);

/* Action step `seq` into *out and values[action_dims]: a VLA_RING_READ_* code. */
int vlr_reader_read_seq(struct vlr_reader *rd, uint64_t seq, struct vla_ring_action_step *out, float *values);

void vlr_reader_close(struct vlr_reader *rd);

#endif /* VLA_RING_CLIENT_H */
