/* The C ring client library (vla_ring_client.h): the open, flock, size and mmap steps
 * runtime/include/vla_ring.h tells firmware to take, written once, and the robot's ring
 * ends on top of them (vla_ring_writer_start / vla_ring_obs_publish / vla_ring_text_publish;
 * vla_ring_reader_open / vla_ring_reader_action_read_seq). No layout lives here: the
 * header owns it. */
#define _GNU_SOURCE
#include "vla_ring_client.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

uint64_t vlr_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

const char *vlr_ring_name(uint64_t magic) {
    if (magic == VLA_RING_OBS_MAGIC) return "observation ring";
    if (magic == VLA_RING_ACTION_MAGIC) return "action ring";
    if (magic == VLA_RING_TEXT_MAGIC) return "instruction segment";
    return "ring";
}

/* ---- mapping a ring file ---------------------------------------------------------------- */

static enum vlr_open_result fail(int fd, enum vlr_open_result r, char *err, size_t err_len, uint64_t magic,
                                 const char *path, const char *what) {
    snprintf(err, err_len, "%s %s: %s: %s", vlr_ring_name(magic), path, what, strerror(errno));
    if (fd >= 0) close(fd);
    return r;
}

enum vlr_open_result vlr_lock(const struct vlr_mapping *m, const char *path, uint64_t magic, char *err,
                              size_t err_len) {
    if (flock(m->fd, LOCK_EX | LOCK_NB) == 0) return VLR_OPEN_OK;
    int e = errno;
    snprintf(err, err_len, "%s %s: another writer holds it (flock: %s)", vlr_ring_name(magic), path, strerror(e));
    return e == EWOULDBLOCK ? VLR_OPEN_BUSY : VLR_OPEN_SYSTEM;
}

enum vlr_open_result vlr_map_writer(struct vlr_mapping *m, const char *path, uint64_t magic,
                                    const struct vla_ring_geometry *g, uint32_t slots, char *err, size_t err_len) {
    uint64_t total = vla_ring_total_size(magic, g, slots);
    m->fd = -1;
    m->base = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return fail(-1, VLR_OPEN_SYSTEM, err, err_len, magic, path, "open");
        m->fd = fd;
        enum vlr_open_result locked = vlr_lock(m, path, magic, err, err_len);
        if (locked != VLR_OPEN_OK) {
            close(fd);
            return locked;
        }
        struct stat st;
        if (fstat(fd, &st) != 0) return fail(fd, VLR_OPEN_SYSTEM, err, err_len, magic, path, "fstat");
        if (st.st_size != 0 && (uint64_t)st.st_size != total) {
            /* Another geometry: start over on a new file (readers keep the old mapping). */
            unlink(path);
            close(fd);
            continue;
        }
        if (st.st_size == 0 && ftruncate(fd, (off_t)total) != 0)
            return fail(fd, VLR_OPEN_SYSTEM, err, err_len, magic, path, "ftruncate");
        void *base = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) return fail(fd, VLR_OPEN_SYSTEM, err, err_len, magic, path, "mmap");
        m->base = base;
        m->len = total;
        return VLR_OPEN_OK;
    }
    snprintf(err, err_len, "%s %s: resized by someone else while opening", vlr_ring_name(magic), path);
    return VLR_OPEN_BUSY;
}

enum vlr_open_result vlr_map_existing(struct vlr_mapping *m, const char *path, uint64_t magic, int writable,
                                      char *err, size_t err_len) {
    m->fd = -1;
    m->base = NULL;
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return fail(-1, errno == ENOENT ? VLR_OPEN_ABSENT : VLR_OPEN_SYSTEM, err, err_len, magic, path, "open");
    struct stat st;
    if (fstat(fd, &st) != 0) return fail(fd, VLR_OPEN_SYSTEM, err, err_len, magic, path, "fstat");
    if (st.st_size < (off_t)VLA_RING_HEADER_SIZE) {
        snprintf(err, err_len, "%s %s: not sized yet (%lld bytes, less than a ring header)", vlr_ring_name(magic),
                 path, (long long)st.st_size);
        close(fd);
        return VLR_OPEN_NOT_READY;
    }
    void *base = mmap(NULL, (size_t)st.st_size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return fail(fd, VLR_OPEN_SYSTEM, err, err_len, magic, path, "mmap");
    m->fd = fd;
    m->base = base;
    m->len = (uint64_t)st.st_size;
    return VLR_OPEN_OK;
}

void vlr_unmap(struct vlr_mapping *m) {
    if (m->base) munmap(m->base, (size_t)m->len);
    if (m->fd >= 0) close(m->fd);
    m->base = NULL;
    m->fd = -1;
}

/* ---- writers ---------------------------------------------------------------------------- */

struct vlr_writer {
    struct vlr_mapping map;
    uint64_t magic;
    uint64_t next_seq;
    uint64_t epoch;
    struct vla_ring_geometry g;
};

static struct vlr_writer *writer_open(const char *path, uint64_t magic, const struct vla_ring_geometry *g,
                                      uint32_t slots, char *err, size_t err_len) {
    struct vlr_writer *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, err_len, "%s %s: out of memory", vlr_ring_name(magic), path);
        return NULL;
    }
    if (vlr_map_writer(&w->map, path, magic, g, slots, err, err_len) != VLR_OPEN_OK) {
        free(w);
        return NULL;
    }
    w->magic = magic;
    w->g = *g;
    w->next_seq = vla_ring_writer_start(w->map.base, magic, g, slots, (uint32_t)getpid(), vlr_now_ns(), &w->epoch);
    return w;
}

struct vlr_writer *vlr_writer_open(const char *path, const struct vla_ring_geometry *g, uint32_t slots, char *err,
                                   size_t err_len) {
    return writer_open(path, VLA_RING_OBS_MAGIC, g, slots, err, err_len);
}

struct vlr_writer *vlr_text_writer_open(const char *path, const struct vla_ring_geometry *g, uint32_t slots,
                                        char *err, size_t err_len) {
    return writer_open(path, VLA_RING_TEXT_MAGIC, g, slots, err, err_len);
}

uint64_t vlr_writer_epoch(const struct vlr_writer *w) { return w->epoch; }

uint64_t vlr_writer_next_seq(const struct vlr_writer *w) { return w->next_seq; }

uint64_t vlr_writer_publish(struct vlr_writer *w, uint32_t instruction_id, uint64_t seed, uint64_t capture_ns,
                            const float *state, uint64_t state_len, const uint8_t *frames, uint64_t frames_len,
                            char *err, size_t err_len) {
    if (w->magic != VLA_RING_OBS_MAGIC) {
        snprintf(err, err_len, "observation refused: this writer's segment is the %s", vlr_ring_name(w->magic));
        return 0;
    }
    if (state_len != w->g.state_dims) {
        snprintf(err, err_len, "observation refused: state has %llu values, the ring's state_dims is %u",
                 (unsigned long long)state_len, w->g.state_dims);
        return 0;
    }
    if (frames_len != vla_ring_frame_bytes(&w->g)) {
        snprintf(err, err_len,
                 "observation refused: frames are %llu bytes, the ring takes %u cameras of %ux%ux%u = %llu bytes",
                 (unsigned long long)frames_len, w->g.cameras, w->g.height, w->g.width, w->g.channels,
                 (unsigned long long)vla_ring_frame_bytes(&w->g));
        return 0;
    }
    struct vla_ring_obs_meta meta = {capture_ns, seed, instruction_id};
    uint64_t seq = w->next_seq++;
    vla_ring_obs_publish(w->map.base, seq, w->epoch, &meta, state, frames, vlr_now_ns());
    return seq;
}

uint64_t vlr_text_publish(struct vlr_writer *w, uint32_t text_id, const char *text, uint32_t len,
                          uint64_t written_ns, char *err, size_t err_len) {
    if (w->magic != VLA_RING_TEXT_MAGIC) {
        snprintf(err, err_len, "text refused: this writer's segment is the %s", vlr_ring_name(w->magic));
        return 0;
    }
    if (vla_ring_text_publish(w->map.base, w->next_seq, w->epoch, text_id, text, len, written_ns) != 0) {
        snprintf(err, err_len, "text refused: %u bytes under id %u (at most %u bytes, ids below %u)", len, text_id,
                 VLA_RING_MAX_TEXT_BYTES, VLA_RING_TEXT_ID_FLAG);
        return 0;
    }
    return w->next_seq++;
}

void vlr_writer_heartbeat(struct vlr_writer *w) {
    struct vla_ring_header *h = (struct vla_ring_header *)w->map.base;
    atomic_store_explicit(&h->writer_heartbeat_ns, vlr_now_ns(), memory_order_relaxed);
}

void vlr_writer_close(struct vlr_writer *w) {
    if (!w) return;
    vlr_unmap(&w->map); /* drops the flock */
    free(w);
}

/* ---- action reader ---------------------------------------------------------------------- */

struct vlr_reader {
    struct vlr_mapping map;
    struct vla_ring_reader r;
};

struct vlr_reader *vlr_reader_open(const char *path, const struct vla_ring_geometry *g, int *retry, char *err,
                                   size_t err_len) {
    *retry = 0;
    struct vlr_reader *rd = calloc(1, sizeof *rd);
    if (!rd) {
        snprintf(err, err_len, "action ring %s: out of memory", path);
        return NULL;
    }
    enum vlr_open_result opened = vlr_map_existing(&rd->map, path, VLA_RING_ACTION_MAGIC, 0, err, err_len);
    if (opened != VLR_OPEN_OK) {
        *retry = opened == VLR_OPEN_ABSENT || opened == VLR_OPEN_NOT_READY;
        free(rd);
        return NULL;
    }
    enum vla_ring_check_result c = vla_ring_reader_open(&rd->r, rd->map.base, rd->map.len, VLA_RING_ACTION_MAGIC, g);
    if (c != VLA_RING_CHECK_OK) {
        *retry = c == VLA_RING_CHECK_INITIALIZING;
        snprintf(err, err_len, "action ring %s refused: %s (field %s)", path, vla_ring_check_str(c), rd->r.field);
        vlr_reader_close(rd);
        return NULL;
    }
    return rd;
}

uint64_t vlr_reader_published(const struct vlr_reader *rd) {
    const struct vla_ring_header *h = (const struct vla_ring_header *)rd->map.base;
    return atomic_load_explicit(&h->published, memory_order_acquire);
}

int vlr_reader_read_seq(struct vlr_reader *rd, uint64_t seq, struct vla_ring_action_step *out, float *values) {
    return vla_ring_reader_action_read_seq(&rd->r, seq, out, values);
}

void vlr_reader_close(struct vlr_reader *rd) {
    if (!rd) return;
    vlr_unmap(&rd->map);
    free(rd);
}
