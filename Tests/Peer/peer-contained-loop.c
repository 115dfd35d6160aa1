/*
 * peer-contained-loop: the least a host must do to deliver a synchronous event to C handlers
 * while a handler that never returns costs only its own module: the handlers run on a
 * thread the caller can leave behind, and the caller waits for them up to a deadline.
 *
 *   peer-contained-loop MODULES ROUNDS (per-call|per-event) (spin|sleep)
 *
 * MODULES trivial handlers (a counter each, called through function pointers) get ROUNDS
 * events. per-call hands each handler call to the other thread and waits for it (one round
 * trip per module, as the host does today); per-event hands the whole fan-out over at
 * once and waits for all of it (one round trip per event). spin: both threads watch a
 * shared word for their turn; sleep: both block in futex waits (no CPU while waiting).
 * Prints the nanoseconds per module per event. No deadline is checked: this is the floor
 * of the hand-over alone.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "peer-host.h"

typedef void (*handler)(void *state);

static void count(void *state) { ++*(volatile long *)state; }

static handler *handlers;
static long *states;
static int modules;
static int spinning;

/* The job the caller hands over: the first and one past the last module to call. */
static _Atomic unsigned requested, finished;
static _Atomic int first, last;

static void wait_for_change(_Atomic unsigned *word, unsigned seen) {
    while (atomic_load_explicit(word, memory_order_acquire) == seen) {
        if (!spinning) syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
    }
}

static void announce(_Atomic unsigned *word) {
    atomic_fetch_add_explicit(word, 1, memory_order_release);
    if (!spinning) syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void *calls(void *unused) {
    (void)unused;
    unsigned seen = 0;
    for (;;) {
        wait_for_change(&requested, seen);
        seen = atomic_load_explicit(&requested, memory_order_acquire);
        for (int index = first; index < last; index++) handlers[index](&states[index]);
        announce(&finished);
    }
    return NULL;
}

static void hand_over(int from, int to) {
    unsigned before = atomic_load_explicit(&finished, memory_order_acquire);
    first = from;
    last = to;
    announce(&requested);
    wait_for_change(&finished, before);
}

int main(int argc, char **argv) {
    if (argc != 5 || (strcmp(argv[3], "per-call") != 0 && strcmp(argv[3], "per-event") != 0)
        || (strcmp(argv[4], "spin") != 0 && strcmp(argv[4], "sleep") != 0)) {
        fprintf(stderr, "usage: peer-contained-loop MODULES ROUNDS (per-call|per-event) (spin|sleep)\n");
        return 64;
    }
    modules = atoi(argv[1]);
    long rounds = atol(argv[2]);
    int per_call = strcmp(argv[3], "per-call") == 0;
    spinning = strcmp(argv[4], "spin") == 0;
    if (modules <= 0 || rounds <= 0) return 64;
    handlers = calloc((size_t)modules, sizeof *handlers);
    states = calloc((size_t)modules, sizeof *states);
    if (handlers == NULL || states == NULL) return 1;
    for (int index = 0; index < modules; index++) handlers[index] = count;
    pthread_t thread;
    if (pthread_create(&thread, NULL, calls, NULL) != 0) return 1;

    for (int warm = 0; warm < 100; warm++) hand_over(0, modules);
    uint64_t start = peer_now_ns();
    for (long round = 0; round < rounds; round++) {
        if (per_call) {
            for (int index = 0; index < modules; index++) hand_over(index, index + 1);
        } else {
            hand_over(0, modules);
        }
    }
    uint64_t elapsed = peer_now_ns() - start;
    printf("%.1f\n", (double)elapsed / (double)rounds / (double)modules);
    return 0;
}
