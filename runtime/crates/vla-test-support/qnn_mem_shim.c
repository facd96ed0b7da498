/* A test-only libQnnHtp.so in front of the real one (the x86_64 HTP emulator), adding
 * what the emulator lacks: memRegister / memDeRegister of HTP SHARED_BUFFER descriptors.
 * Every other function is the real library's. A registration maps the descriptor's fd
 * (a memfd from the rpcmem stand-in) and checks the tensor fits at its offset; graphExecute
 * hands the real library each MEMHANDLE tensor as a client buffer at that mapping, so the
 * emulator computes on exactly the bytes the caller registered. It checks the caller's
 * plumbing (descriptors, handles in tensors, lifetimes) end to end; it says nothing of
 * what the NPU's own registration does. Built by the tests (vla-test-support's
 * qnn_mem_shim), never into vlad or the image.
 *
 * The real libraries' directory is read from `real-lib-dir` beside this file, which is
 * also the directory's libQnnSystem.so: QnnSystemInterface_getProviders forwards to the
 * real libQnnSystem.so, opened by its own path so its $ORIGIN dependencies resolve. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef uint64_t E;
enum { HEADER = 40, SLOTS = 71, MEM_REGISTER = 35, MEM_DEREGISTER = 36, GRAPH_EXECUTE = 21 };
enum { TENSOR = 144, MAX_TENSORS = 64 };
/* QnnMem.h / QnnHtpMem.h layouts (checked in vla-qnn's ffi.rs). */
typedef struct { uint32_t num_dim; uint32_t *dims; const char *config; uint32_t data_type; uint32_t mem_type; void *custom; } MemDesc;
typedef struct { uint32_t type; uint64_t size; int32_t fd; uint64_t offset; } HtpDesc;
typedef struct { uint8_t *map; uint64_t map_len; uint64_t offset; uint64_t bytes; } Handle;

static unsigned char provider[HEADER + 8 * SLOTS];
static const void *provider_list[1] = { provider };
static E (*real_execute)(void *, const void *, uint32_t, void *, uint32_t, void *, void *);
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long live;
/* memRegister calls left before the shim refuses one (-1: never), set by tests. */
static long calls_left = -1;

static uint64_t bytes_of(uint32_t data_type, uint32_t rank, const uint32_t *dims) {
    uint32_t bits = ((data_type >> 4) & 0xf) * 10 + (data_type & 0xf);
    uint64_t n = bits / 8;
    for (uint32_t i = 0; i < rank; i++) n *= dims[i];
    return n;
}

static E mem_register(void *context, const MemDesc *d, uint32_t n, Handle **out) {
    (void)context;
    if (!d || !out) return 8000;
    for (uint32_t i = 0; i < n; i++) out[i] = 0;
    pthread_mutex_lock(&lock);
    int refuse = calls_left == 0;
    if (calls_left > 0) calls_left--;
    pthread_mutex_unlock(&lock);
    if (refuse) return 1000;
    for (uint32_t i = 0; i < n; i++) {
        const HtpDesc *h = d[i].custom;
        if (d[i].mem_type != 2 || !h || h->type != 1 || h->fd < 0) return 8005;
        uint64_t bytes = bytes_of(d[i].data_type, d[i].num_dim, d[i].dims);
        if (h->offset > h->size || bytes > h->size - h->offset) return 8004;
        uint8_t *map = mmap(0, h->size, PROT_READ | PROT_WRITE, MAP_SHARED, h->fd, 0);
        if (map == MAP_FAILED) return 8003;
        Handle *r = malloc(sizeof *r);
        *r = (Handle){ map, h->size, h->offset, bytes };
        out[i] = r;
        pthread_mutex_lock(&lock);
        live++;
        pthread_mutex_unlock(&lock);
    }
    return 0;
}

static E mem_deregister(Handle *const *handles, uint32_t n) {
    if (!handles) return 8000;
    for (uint32_t i = 0; i < n; i++) {
        Handle *r = handles[i];
        if (!r) return 8001;
        munmap(r->map, r->map_len);
        free(r);
        pthread_mutex_lock(&lock);
        live--;
        pthread_mutex_unlock(&lock);
    }
    return 0;
}

/* MEMHANDLE tensors of `t` rewritten in `copy` as client buffers at their registration. */
static int unwrap(const unsigned char *t, uint32_t n, unsigned char *copy) {
    if (n > MAX_TENSORS) return -1;
    memcpy(copy, t, (size_t)n * TENSOR);
    for (uint32_t i = 0; i < n; i++) {
        unsigned char *v1 = copy + (size_t)i * TENSOR + 8;
        uint32_t mem_type;
        memcpy(&mem_type, v1 + 88, 4);
        if (mem_type != 1) continue;
        Handle *r;
        memcpy(&r, v1 + 96, 8);
        if (!r) return -1;
        void *data = r->map + r->offset;
        uint32_t size = (uint32_t)r->bytes, raw = 0;
        memcpy(v1 + 88, &raw, 4);
        memcpy(v1 + 96, &data, 8);
        memcpy(v1 + 104, &size, 4);
    }
    return 0;
}

static E graph_execute(void *graph, const unsigned char *in, uint32_t n_in, unsigned char *out,
                       uint32_t n_out, void *profile, void *signal) {
    unsigned char ins[MAX_TENSORS * TENSOR], outs[MAX_TENSORS * TENSOR];
    if (unwrap(in, n_in, ins) || unwrap(out, n_out, outs)) return 6004;
    return real_execute(graph, ins, n_in, outs, n_out, profile, signal);
}

/* The real library `name`'s path (`real-lib-dir` in this library's directory, then
 * `/name`), into `path`. */
static int real_path(const char *name, char *path, size_t len) {
    Dl_info self;
    if (!dladdr((void *)&live, &self) || !self.dli_fname) return -1;
    const char *slash = strrchr(self.dli_fname, '/');
    if (!slash) return -1;
    char file[4096];
    snprintf(file, sizeof file, "%.*s/real-lib-dir", (int)(slash - self.dli_fname), self.dli_fname);
    FILE *f = fopen(file, "r");
    if (!f) return -1;
    char dir[2048];
    size_t n = fread(dir, 1, sizeof dir - 1, f);
    fclose(f);
    while (n && (dir[n - 1] == '\n' || dir[n - 1] == ' ')) n--;
    dir[n] = 0;
    if (!n) return -1;
    snprintf(path, len, "%s/%s", dir, name);
    return 0;
}

typedef E (*GetProviders)(const void ***, uint32_t *);

/* `symbol` of the real library `name`, loaded by its own path. */
static GetProviders real_entry(const char *name, const char *symbol) {
    char path[4096];
    void *real = real_path(name, path, sizeof path) == 0 ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : 0;
    return real ? (GetProviders)dlsym(real, symbol) : 0;
}

E QnnSystemInterface_getProviders(const void ***list, uint32_t *count) {
    GetProviders get = real_entry("libQnnSystem.so", "QnnSystemInterface_getProviders");
    return get ? get(list, count) : 1003;
}

E QnnInterface_getProviders(const void ***list, uint32_t *count) {
    GetProviders get = real_entry("libQnnHtp.so", "QnnInterface_getProviders");
    const void **real_list = 0;
    uint32_t n = 0;
    if (!get || get(&real_list, &n) != 0 || n == 0) return 1003;
    memcpy(provider, real_list[0], sizeof provider);
    void **table = (void **)(provider + HEADER);
    real_execute = table[GRAPH_EXECUTE];
    table[MEM_REGISTER] = (void *)mem_register;
    table[MEM_DEREGISTER] = (void *)mem_deregister;
    table[GRAPH_EXECUTE] = (void *)graph_execute;
    *list = provider_list;
    *count = 1;
    return 0;
}

/* Not QNN's: registrations not yet deregistered, for tests that check nothing leaks. */
long qnn_mem_shim_live(void) {
    pthread_mutex_lock(&lock);
    long n = live;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Not QNN's: the memRegister call after the next `n` is refused with 1000, as the bare
 * emulator refuses every one (n < 0: none is), for tests of a registration failing
 * part-way through a chain. */
void qnn_mem_shim_refuse_after(long n) {
    pthread_mutex_lock(&lock);
    calls_left = n < 0 ? -1 : n;
    pthread_mutex_unlock(&lock);
}
