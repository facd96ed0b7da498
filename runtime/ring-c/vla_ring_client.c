/* The robot's two ring ends for the LIBERO tool, built on runtime/include/vla_ring.h
 * exactly as its header comment tells firmware to use it (open, flock, size, mmap,
 * vla_ring_writer_start / vla_ring_obs_publish; vla_ring_reader_open /
 * vla_ring_reader_action_read_seq). Compiled into a shared object at set-up
 * (scripts/setup_libero.sh) and loaded with ctypes: Python never sees the layout. */
#define _GNU_SOURCE
#include "vla_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t vlr_now_ns(void) { return now_ns(); }

/* ---- observation writer --------------------------------------------------------- */

struct vlr_writer {
    int fd;
    void *base;
    uint64_t len;
    uint64_t next_seq;
    uint64_t epoch;
    struct vla_ring_geometry g;
};

/* Opens (creating or resizing) the observation ring at `path` as its one writer.
 * Returns NULL with a message in err[err_len] on failure. */
struct vlr_writer *vlr_writer_open(const char *path, const struct vla_ring_geometry *g, uint32_t slots, char *err,
                                   size_t err_len) {
    uint64_t total = vla_ring_total_size(VLA_RING_OBS_MAGIC, g, slots);
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            snprintf(err, err_len, "observation ring %s: open: %s", path, strerror(errno));
            return NULL;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            snprintf(err, err_len, "observation ring %s: another writer holds it (flock: %s)", path, strerror(errno));
            close(fd);
            return NULL;
        }
        struct stat st;
        if (fstat(fd, &st) != 0) {
            snprintf(err, err_len, "observation ring %s: fstat: %s", path, strerror(errno));
            close(fd);
            return NULL;
        }
        if (st.st_size != 0 && (uint64_t)st.st_size != total) {
            /* Another geometry: start over on a new file (readers keep the old mapping). */
            unlink(path);
            close(fd);
            continue;
        }
        if (st.st_size == 0 && ftruncate(fd, (off_t)total) != 0) {
            snprintf(err, err_len, "observation ring %s: ftruncate: %s", path, strerror(errno));
            close(fd);
            return NULL;
        }
        void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) {
            snprintf(err, err_len, "observation ring %s: mmap: %s", path, strerror(errno));
            close(fd);
            return NULL;
        }
        struct vlr_writer *w = calloc(1, sizeof *w);
        if (!w) {
            munmap(base, total);
            close(fd);
            snprintf(err, err_len, "observation ring %s: out of memory", path);
            return NULL;
        }
        w->fd = fd;
        w->base = base;
        w->len = total;
        w->g = *g;
        w->next_seq = vla_ring_writer_start(base, VLA_RING_OBS_MAGIC, g, slots, (uint32_t)getpid(), now_ns(), &w->epoch);
        return w;
    }
    snprintf(err, err_len, "observation ring %s: resized by someone else while opening", path);
    return NULL;
}

/* Publishes one observation; the lengths are checked against the ring's geometry first
 * (a frame of another size or a state of another length is refused, nothing written).
 * Returns the seq (>= 1), or 0 with err filled. */
uint64_t vlr_writer_publish(struct vlr_writer *w, uint32_t instruction_id, uint64_t seed, uint64_t capture_ns,
                            const float *state, uint64_t state_len, const uint8_t *frames, uint64_t frames_len,
                            char *err, size_t err_len) {
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
    vla_ring_obs_publish(w->base, seq, w->epoch, &meta, state, frames, now_ns());
    return seq;
}

/* The heartbeat alone (header field writer_heartbeat_ns, "last publish/heartbeat"): the
 * robot is alive while it steps the simulation between observations. */
void vlr_writer_heartbeat(struct vlr_writer *w) {
    struct vla_ring_header *h = (struct vla_ring_header *)w->base;
    atomic_store_explicit(&h->writer_heartbeat_ns, now_ns(), memory_order_relaxed);
}

void vlr_writer_close(struct vlr_writer *w) {
    if (!w) return;
    munmap(w->base, w->len);
    close(w->fd); /* drops the flock */
    free(w);
}

/* ---- action reader -------------------------------------------------------------- */

struct vlr_reader {
    int fd;
    void *base;
    uint64_t len;
    struct vla_ring_reader r;
};

/* Opens the action ring read-only and checks it against the geometry. Returns NULL with
 * err filled; *retry is 1 when the ring is not there yet or its writer is starting. */
struct vlr_reader *vlr_reader_open(const char *path, const struct vla_ring_geometry *g, int *retry, char *err,
                                   size_t err_len) {
    *retry = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *retry = errno == ENOENT;
        snprintf(err, err_len, "action ring %s: open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)VLA_RING_HEADER_SIZE) {
        *retry = 1;
        snprintf(err, err_len, "action ring %s: not sized yet", path);
        close(fd);
        return NULL;
    }
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        snprintf(err, err_len, "action ring %s: mmap: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    struct vlr_reader *rd = calloc(1, sizeof *rd);
    if (!rd) {
        munmap(base, (size_t)st.st_size);
        close(fd);
        snprintf(err, err_len, "action ring %s: out of memory", path);
        return NULL;
    }
    rd->fd = fd;
    rd->base = base;
    rd->len = (uint64_t)st.st_size;
    enum vla_ring_check_result c = vla_ring_reader_open(&rd->r, base, rd->len, VLA_RING_ACTION_MAGIC, g);
    if (c != VLA_RING_CHECK_OK) {
        *retry = c == VLA_RING_CHECK_INITIALIZING;
        snprintf(err, err_len, "action ring %s refused: %s (field %s)", path, vla_ring_check_str(c), rd->r.field);
        munmap(base, (size_t)rd->len);
        close(fd);
        free(rd);
        return NULL;
    }
    return rd;
}

/* The newest published seq (0: none yet). */
uint64_t vlr_reader_published(const struct vlr_reader *rd) {
    const struct vla_ring_header *h = (const struct vla_ring_header *)rd->base;
    return atomic_load_explicit(&h->published, memory_order_acquire);
}

/* Action step `seq` into *out and values[action_dims]: a VLA_RING_READ_* code. */
int vlr_reader_read_seq(struct vlr_reader *rd, uint64_t seq, struct vla_ring_action_step *out, float *values) {
    return vla_ring_reader_action_read_seq(&rd->r, seq, out, values);
}

void vlr_reader_close(struct vlr_reader *rd) {
    if (!rd) return;
    munmap(rd->base, (size_t)rd->len);
    close(rd->fd);
    free(rd);
}
