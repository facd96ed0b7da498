/* ring_peer: a C firmware stand-in built against runtime/include/vla_ring.h and the C ring
 * client library (runtime/ring-c: the open, flock, size and mmap steps and the writers).
 *
 *   ring_peer read-action PATH CAMERAS HEIGHT WIDTH CHANNELS STATE_DIMS ACTION_DIMS CHUNK_LEN
 *       prints the newest action step as one "key=value ..." line
 *   ring_peer write-obs PATH CAMERAS HEIGHT WIDTH CHANNELS STATE_DIMS ACTION_DIMS CHUNK_LEN SLOTS COUNT
 *       publishes COUNT observations whose payload is derived from their seq
 *   ring_peer write-text PATH CAMERAS HEIGHT WIDTH CHANNELS STATE_DIMS ACTION_DIMS CHUNK_LEN SLOTS TEXT_ID HEX
 *       starts (or restarts) the writer of the instruction segment PATH and publishes one
 *       text: TEXT_ID and the bytes HEX spells (any bytes, also invalid UTF-8);
 *       prints "epoch=E seq=S written_ns=T"
 *   ring_peer restart-action PATH <7 geometry numbers A> <7 geometry numbers B>
 *       opens PATH as a reader of geometry A, reads the newest step, then (on the same
 *       mapping) starts a writer of geometry B on it and reads again as the A reader:
 *       prints "epoch_before=E1 epoch_after=E2 read_after=R field=F"
 *
 * Exit status: 0 ok, 2 usage, 3 system error, 4 segment rejected, 5 read failed.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "vla_ring_client.h"

static int parse_geometry(char **argv, struct vla_ring_geometry *g) {
    uint32_t *fields[] = {&g->cameras, &g->height, &g->width, &g->channels,
                          &g->state_dims, &g->action_dims, &g->chunk_len};
    for (unsigned i = 0; i < 7; i++) {
        char *end;
        unsigned long v = strtoul(argv[i], &end, 10);
        if (*end != '\0') return -1;
        *fields[i] = (uint32_t)v;
    }
    g->reserved = 0;
    return 0;
}

/* Exit status of a failed map: the file's own state (not sized) is a rejected segment. */
static int map_failed(enum vlr_open_result r, const char *err) {
    fprintf(stderr, "%s\n", err);
    return r == VLR_OPEN_NOT_READY || r == VLR_OPEN_REFUSED ? 4 : 3;
}

static int read_action(const char *path, const struct vla_ring_geometry *g) {
    char err[512];
    struct vlr_mapping map;
    enum vlr_open_result opened = vlr_map_existing(&map, path, VLA_RING_ACTION_MAGIC, 0, err, sizeof err);
    if (opened != VLR_OPEN_OK) return map_failed(opened, err);
    struct vla_ring_reader reader;
    enum vla_ring_check_result check = vla_ring_reader_open(&reader, map.base, map.len, VLA_RING_ACTION_MAGIC, g);
    if (check != VLA_RING_CHECK_OK) {
        fprintf(stderr, "%s: field %s: %s\n", path, reader.field, vla_ring_check_str(check));
        return 4;
    }
    float *values = calloc(g->action_dims, sizeof *values);
    struct vla_ring_action_step step;
    int r = values ? vla_ring_reader_action_read_latest(&reader, &step, values) : VLA_RING_READ_CONTENDED;
    if (r != VLA_RING_READ_OK) {
        fprintf(stderr, "%s: read failed: %d\n", path, r);
        free(values);
        return 5;
    }
    printf("seq=%llu epoch=%llu source_obs_seq=%llu made_time_ns=%llu valid_until_ns=%llu chunk_id=%llu "
           "step_index=%u status=%u values=",
           (unsigned long long)step.seq, (unsigned long long)step.writer_epoch,
           (unsigned long long)step.source_obs_seq, (unsigned long long)step.made_time_ns,
           (unsigned long long)step.valid_until_ns, (unsigned long long)step.chunk_id, step.step_index,
           step.status);
    for (uint32_t i = 0; i < g->action_dims; i++) printf("%s%.9g", i ? "," : "", (double)values[i]);
    printf("\n");
    free(values);
    vlr_unmap(&map);
    return 0;
}

static int write_obs(const char *path, const struct vla_ring_geometry *g, uint32_t slots, uint64_t count) {
    char err[512];
    struct vlr_writer *w = vlr_writer_open(path, g, slots, err, sizeof err);
    if (!w) {
        fprintf(stderr, "%s\n", err);
        return 3;
    }
    float *state = calloc(g->state_dims ? g->state_dims : 1, sizeof *state);
    uint64_t frame_bytes = vla_ring_frame_bytes(g);
    uint8_t *frames = malloc(frame_bytes ? frame_bytes : 1);
    if (!state || !frames) return 3;
    for (uint64_t n = 0; n < count; n++) {
        uint64_t seq = vlr_writer_next_seq(w);
        for (uint32_t i = 0; i < g->state_dims; i++) state[i] = (float)seq * 10.0f + (float)i;
        for (uint64_t j = 0; j < frame_bytes; j++) frames[j] = (uint8_t)(seq * 7u + j);
        if (vlr_writer_publish(w, 42u, seq * 1000u + 1u, vlr_now_ns(), state, g->state_dims, frames, frame_bytes,
                               err, sizeof err) != seq) {
            fprintf(stderr, "%s\n", err);
            return 3;
        }
    }
    printf("epoch=%llu next_seq=%llu\n", (unsigned long long)vlr_writer_epoch(w),
           (unsigned long long)vlr_writer_next_seq(w));
    free(state);
    free(frames);
    vlr_writer_close(w);
    return 0;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static int write_text(const char *path, const struct vla_ring_geometry *g, uint32_t slots, uint32_t text_id,
                      const char *hex) {
    size_t hex_len = strlen(hex);
    if (hex_len % 2 != 0 || hex_len / 2 > VLA_RING_MAX_TEXT_BYTES) {
        fprintf(stderr, "text: %zu hex digits, at most %u bytes\n", hex_len, VLA_RING_MAX_TEXT_BYTES);
        return 2;
    }
    char text[VLA_RING_MAX_TEXT_BYTES];
    for (size_t i = 0; i < hex_len / 2; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return 2;
        text[i] = (char)(hi * 16 + lo);
    }
    char err[512];
    struct vlr_writer *w = vlr_text_writer_open(path, g, slots, err, sizeof err);
    if (!w) {
        fprintf(stderr, "%s\n", err);
        return 3;
    }
    uint64_t written = vlr_now_ns();
    uint64_t seq = vlr_text_publish(w, text_id, text, (uint32_t)(hex_len / 2), written, err, sizeof err);
    if (seq == 0) {
        fprintf(stderr, "%s\n", err);
        vlr_writer_close(w);
        return 2;
    }
    printf("epoch=%llu seq=%llu written_ns=%llu\n", (unsigned long long)vlr_writer_epoch(w),
           (unsigned long long)seq, (unsigned long long)written);
    vlr_writer_close(w);
    return 0;
}

static int restart_action(const char *path, const struct vla_ring_geometry *a, const struct vla_ring_geometry *b) {
    char err[512];
    struct vlr_mapping map;
    enum vlr_open_result opened = vlr_map_existing(&map, path, VLA_RING_ACTION_MAGIC, 1, err, sizeof err);
    if (opened != VLR_OPEN_OK) return map_failed(opened, err);
    struct vla_ring_reader reader;
    enum vla_ring_check_result check = vla_ring_reader_open(&reader, map.base, map.len, VLA_RING_ACTION_MAGIC, a);
    if (check != VLA_RING_CHECK_OK) {
        fprintf(stderr, "%s: field %s: %s\n", path, reader.field, vla_ring_check_str(check));
        return 4;
    }
    float *values = calloc(a->action_dims, sizeof *values);
    struct vla_ring_action_step step;
    if (!values || vla_ring_reader_action_read_latest(&reader, &step, values) != VLA_RING_READ_OK) return 5;
    uint64_t before = reader.epoch;
    /* A new writer of geometry B takes the same-size segment over. */
    enum vlr_open_result locked = vlr_lock(&map, path, VLA_RING_ACTION_MAGIC, err, sizeof err);
    if (locked != VLR_OPEN_OK) return map_failed(locked, err);
    const struct vla_ring_header *h = (const struct vla_ring_header *)map.base;
    uint32_t slots = atomic_load_explicit(&h->slot_count, memory_order_relaxed);
    if (vla_ring_total_size(VLA_RING_ACTION_MAGIC, b, slots) != map.len) {
        fprintf(stderr, "geometry B does not have the size of A\n");
        return 2;
    }
    uint64_t epoch;
    vla_ring_writer_start(map.base, VLA_RING_ACTION_MAGIC, b, slots, (uint32_t)getpid(), vlr_now_ns(), &epoch);
    int r = vla_ring_reader_action_read_latest(&reader, &step, values);
    printf("epoch_before=%llu epoch_after=%llu read_after=%d field=%s\n", (unsigned long long)before,
           (unsigned long long)epoch, r, r == VLA_RING_READ_INCOMPATIBLE ? reader.field : "-");
    free(values);
    vlr_unmap(&map);
    return 0;
}

int main(int argc, char **argv) {
    struct vla_ring_geometry g;
    if (argc == 10 && strcmp(argv[1], "read-action") == 0 && parse_geometry(argv + 3, &g) == 0)
        return read_action(argv[2], &g);
    if (argc == 12 && strcmp(argv[1], "write-obs") == 0 && parse_geometry(argv + 3, &g) == 0)
        return write_obs(argv[2], &g, (uint32_t)strtoul(argv[10], NULL, 10), strtoull(argv[11], NULL, 10));
    struct vla_ring_geometry g2;
    if (argc == 13 && strcmp(argv[1], "write-text") == 0 && parse_geometry(argv + 3, &g) == 0)
        return write_text(argv[2], &g, (uint32_t)strtoul(argv[10], NULL, 10), (uint32_t)strtoul(argv[11], NULL, 10),
                          argv[12]);
    if (argc == 17 && strcmp(argv[1], "restart-action") == 0 && parse_geometry(argv + 3, &g) == 0 &&
        parse_geometry(argv + 10, &g2) == 0)
        return restart_action(argv[2], &g, &g2);
    fprintf(stderr, "usage: ring_peer read-action PATH <7 geometry numbers> | write-obs PATH <7 geometry numbers> SLOTS COUNT\n");
    return 2;
}
