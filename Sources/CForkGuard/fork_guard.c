#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>
#include "fork_guard.h"

/* Slots hold a descriptor, or -1. Atomics: the child handler takes no lock (a lock another
 * thread held at the fork would never be released in the child). */
enum { SLOTS = 32 };
static atomic_int slots[SLOTS] = {[0 ... SLOTS - 1] = -1};
static pthread_once_t registered = PTHREAD_ONCE_INIT;

/* The slots are emptied too: the child's next descriptors reuse those numbers, and a child
 * of the child must not close them. Also unblocks the signals that end a process: the
 * child has only the forking thread, whose mask the host set for its own threads (a
 * plugin's worker thread blocks SIGTERM, say), and a SIGTERM sent to the child would
 * otherwise stay pending for ever. Other signals keep the mask the forking code chose. */
static void in_child(void) {
    for (int i = 0; i < SLOTS; i++) {
        int fd = atomic_exchange(&slots[i], -1);
        if (fd >= 0) close(fd);
    }
    sigset_t ending;
    sigemptyset(&ending);
    sigaddset(&ending, SIGTERM);
    sigaddset(&ending, SIGINT);
    sigaddset(&ending, SIGHUP);
    sigaddset(&ending, SIGQUIT);
    pthread_sigmask(SIG_UNBLOCK, &ending, NULL);
}

static void register_handler(void) { pthread_atfork(NULL, NULL, in_child); }

int modhost_fork_guard_close(int fd) {
    pthread_once(&registered, register_handler);
    for (int i = 0; i < SLOTS; i++) {
        int empty = -1;
        if (atomic_compare_exchange_strong(&slots[i], &empty, fd)) return 0;
    }
    return -1;
}

void modhost_fork_guard_keep(int fd) {
    for (int i = 0; i < SLOTS; i++) {
        int expected = fd;
        if (atomic_compare_exchange_strong(&slots[i], &expected, -1)) return;
    }
}
