/* vla-ring-bridge: the robot's two ring ends of the ring client library (vla_ring_client.h)
 * on the board, driven over stdin/stdout, so that `ssh board vla-ring-bridge
 * ...` carries a simulator's observations in and the actions out. Native byte order; one
 * request, one reply:
 *   'O' u32 instruction, u64 seed, u64 state_len, u64 frames_len, f32 state[], u8 frames[]
 *       -> u64 seq, u64 capture_ns (the board's clock, stamped here); seq 0: u32 n, message
 *   'H' -> 'k' (heartbeat)
 *   'P' -> u8 state (0 not there yet, 1 open, 2 refused: u32 n, message), u64 published
 *   'R' u64 seq -> i32 code, u64 now_ns, struct vla_ring_action_step, f32 values[action_dims]
 * Arguments: OBS_PATH ACT_PATH cameras height width state_dims action_dims chunk_len. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>

#include "vla_ring_client.h"

static int get(void *p, size_t n) { return fread(p, 1, n, stdin) == n; }
static void put(const void *p, size_t n) { fwrite(p, 1, n, stdout); }

static void put_msg(const char *m) {
    uint32_t n = (uint32_t)strlen(m);
    put(&n, 4);
    put(m, n);
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: vla-ring-bridge OBS_PATH ACT_PATH cameras height width state_dims action_dims "
                        "chunk_len\n");
        return 2;
    }
    struct vla_ring_geometry g = {(uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]), (uint32_t)atoi(argv[5]), 3,
                                  (uint32_t)atoi(argv[6]), (uint32_t)atoi(argv[7]), (uint32_t)atoi(argv[8]), 0};
    char err[512];
    struct vlr_writer *w = vlr_writer_open(argv[1], &g, 8, err, sizeof err);
    if (!w) {
        fprintf(stderr, "vla-ring-bridge: %s\n", err);
        return 1;
    }
    struct vlr_reader *r = NULL;
    uint64_t frame_bytes = vla_ring_frame_bytes(&g);
    float *state = calloc(g.state_dims + 1, sizeof *state);
    uint8_t *frames = malloc(frame_bytes + 1);
    float *values = calloc(g.action_dims + 1, sizeof *values);
    if (!state || !frames || !values) return 1;
    int op;
    while ((op = getchar()) != EOF) {
        if (op == 'O') {
            uint32_t instruction;
            uint64_t seed, state_len, frames_len;
            if (!get(&instruction, 4) || !get(&seed, 8) || !get(&state_len, 8) || !get(&frames_len, 8)) return 1;
            /* Lengths the ring does not take are read off the stream and refused by the ring end. */
            float *s = state_len == g.state_dims ? state : malloc(4 * state_len + 1);
            uint8_t *f = frames_len == frame_bytes ? frames : malloc(frames_len + 1);
            if (!s || !f || !get(s, 4 * state_len) || !get(f, frames_len)) return 1;
            uint64_t capture = vlr_now_ns();
            uint64_t seq = vlr_writer_publish(w, instruction, seed, capture, s, state_len, f, frames_len, err,
                                              sizeof err);
            if (s != state) free(s);
            if (f != frames) free(f);
            put(&seq, 8);
            put(&capture, 8);
            if (seq == 0) put_msg(err);
        } else if (op == 'H') {
            vlr_writer_heartbeat(w);
            putchar('k');
        } else if (op == 'P') {
            uint8_t st = 1;
            uint64_t published = 0;
            if (!r) {
                int retry = 0;
                r = vlr_reader_open(argv[2], &g, &retry, err, sizeof err);
                st = r ? 1 : retry ? 0 : 2;
            }
            if (r) published = vlr_reader_published(r);
            put(&st, 1);
            put(&published, 8);
            if (st == 2) put_msg(err);
        } else if (op == 'R') {
            uint64_t seq;
            if (!get(&seq, 8)) return 1;
            struct vla_ring_action_step step;
            memset(&step, 0, sizeof step);
            int32_t code = r ? vlr_reader_read_seq(r, seq, &step, values) : VLA_RING_READ_EMPTY;
            uint64_t now = vlr_now_ns();
            put(&code, 4);
            put(&now, 8);
            put(&step, sizeof step);
            put(values, 4u * g.action_dims);
        } else {
            fprintf(stderr, "vla-ring-bridge: unknown request %d\n", op);
            return 1;
        }
        fflush(stdout);
    }
    return 0;
}
