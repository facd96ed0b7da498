/* A stand-in for libcdsprpc.so's rpcmem functions, for tests on machines without
 * FastRPC: each allocation is a memfd mapped shared, so it has a real file descriptor
 * as rpcmem's dma-buf allocations do. Compiled by the tests (vla-test-support's
 * rpcmem_standin); never built into vlad or the image. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define SLOTS 256

static struct { void *p; size_t len; int fd; } slots[SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long allocations, frees;

void *rpcmem_alloc(int heapid, uint32_t flags, int size) {
    (void)heapid;
    (void)flags;
    if (size <= 0) return 0;
    int fd = memfd_create("rpcmem-standin", MFD_CLOEXEC);
    if (fd < 0) return 0;
    if (ftruncate(fd, size) != 0) { close(fd); return 0; }
    void *p = mmap(0, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { close(fd); return 0; }
    pthread_mutex_lock(&lock);
    for (int i = 0; i < SLOTS; i++) {
        if (!slots[i].p) {
            slots[i].p = p; slots[i].len = (size_t)size; slots[i].fd = fd;
            allocations++;
            pthread_mutex_unlock(&lock);
            return p;
        }
    }
    pthread_mutex_unlock(&lock);
    munmap(p, (size_t)size);
    close(fd);
    return 0;
}

int rpcmem_to_fd(void *p) {
    int fd = -1;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < SLOTS; i++) if (slots[i].p == p) fd = slots[i].fd;
    pthread_mutex_unlock(&lock);
    return fd;
}

void rpcmem_free(void *p) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < SLOTS; i++) {
        if (slots[i].p == p) {
            munmap(p, slots[i].len);
            close(slots[i].fd);
            slots[i].p = 0;
            frees++;
        }
    }
    pthread_mutex_unlock(&lock);
}

/* Not rpcmem's: how many allocations are live, for tests that check nothing leaks. */
long rpcmem_standin_live(void) {
    pthread_mutex_lock(&lock);
    long live = allocations - frees;
    pthread_mutex_unlock(&lock);
    return live;
}
