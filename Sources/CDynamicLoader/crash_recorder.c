#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <execinfo.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include "crash_recorder.h"

/* One loaded plugin image: where its code is, and what to write when it crashes. */
enum { MAX_RANGES = 4 };
struct plugin_image {
    struct plugin_image *next;
    uintptr_t start[MAX_RANGES], end[MAX_RANGES];
    int ranges;
    char *record;
    size_t length;
};

/* Published with release stores and read with acquire loads: the handler may run on any
 * thread while another adds an image. Nodes are never freed. */
static _Atomic(struct plugin_image *) images;
static atomic_int record_fd = -1;
static atomic_int recorded;
static atomic_int installed;
/* The process the record is about: a child forked from it (by plugin code) that crashes
 * did not crash the host, and writes nothing. */
static atomic_int recorder_pid;
static int stack_readable;  /* process_vm_readv works here (probed at install) */
static struct sigaction previous[NSIG];
/* The plugin whose code the calling thread runs now, as the host marked it
 * (modhost_crash_recorder_enter): the last resort of the signal handler. */
static __thread const struct plugin_image *running_image;
static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

static const struct plugin_image *image_containing(uintptr_t address, int *range) {
    for (const struct plugin_image *image = atomic_load_explicit(&images, memory_order_acquire); image; image = image->next)
        for (int i = 0; i < image->ranges; i++)
            if (address >= image->start[i] && address < image->end[i]) {
                if (range) *range = i;
                return image;
            }
    return NULL;
}

/* Whether the instruction before `address` (in `image`'s code range `range`) is a call,
 * which makes `address` a return address rather than a stray pointer into the code. */
static int follows_call(const struct plugin_image *image, int range, uintptr_t address) {
#if defined(__x86_64__)
    if (address < image->start[range] + 7) return 0;
    const uint8_t *code = (const uint8_t *)address;
    if (code[-5] == 0xE8) return 1;                                   /* call rel32 */
    for (int back = 2; back <= 7; back++)                             /* call r/m64 */
        if (code[-back] == 0xFF && ((code[-back + 1] >> 3) & 7) == 2) return 1;
    return 0;
#else
    (void)image; (void)range; (void)address;
    return 1;
#endif
}

/* The plugin owning the nearest return address on the stack above `sp`, reading the
 * stack with process_vm_readv so that its end (an unmapped page) ends the scan instead
 * of faulting. At most 64 KiB. */
static const struct plugin_image *scan_stack(uintptr_t sp) {
    if (!stack_readable || sp == 0) return NULL;
    uintptr_t words[512];
    pid_t self = getpid();
    for (int chunk = 0; chunk < 16; chunk++) {
        struct iovec local = {words, sizeof words};
        struct iovec remote = {(void *)(sp + chunk * sizeof words), sizeof words};
        ssize_t got = process_vm_readv(self, &local, 1, &remote, 1, 0);
        if (got <= 0) return NULL;
        for (size_t i = 0; i < (size_t)got / sizeof(uintptr_t); i++) {
            int range;
            const struct plugin_image *image = image_containing(words[i], &range);
            if (image && follows_call(image, range, words[i])) return image;
        }
        if ((size_t)got < sizeof words) return NULL;
    }
    return NULL;
}

static size_t append(char *out, size_t at, size_t capacity, const char *text) {
    while (*text && at < capacity) out[at++] = *text++;
    return at;
}

static size_t append_number(char *out, size_t at, size_t capacity, long value, int width) {
    char digits[24];
    int count = 0;
    do {
        digits[count++] = (char)('0' + value % 10);
        value /= 10;
    } while (value > 0 && count < 20);
    while (count < width) digits[count++] = '0';
    while (count > 0 && at < capacity) out[at++] = digits[--count];
    return at;
}

/* Now as seconds since the epoch: the daemon formats it (UTCTimestamp) when it reads the
 * record, so the signal handler does no date arithmetic. */
static size_t append_epoch(char *out, size_t at, size_t capacity) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return append_number(out, at, capacity, (long)now.tv_sec, 1);
}

void modhost_crash_recorder_write(const void *plugin, const char *phase, const char *cause) {
    const struct plugin_image *image = plugin;
    int fd = atomic_load(&record_fd);
    if (image == NULL || fd < 0 || getpid() != atomic_load(&recorder_pid) || atomic_exchange(&recorded, 1)) return;
    char tail[192];
    size_t length = append(tail, 0, sizeof tail, ",\"phase\":\"");
    length = append(tail, length, sizeof tail, phase);
    length = append(tail, length, sizeof tail, "\",\"cause\":\"");
    length = append(tail, length, sizeof tail, cause);
    length = append(tail, length, sizeof tail, "\",\"epoch\":");
    length = append_epoch(tail, length, sizeof tail);
    length = append(tail, length, sizeof tail, "}\n");
    if (pwrite(fd, image->record, image->length, 0) == (ssize_t)image->length)
        (void)pwrite(fd, tail, length, (off_t)image->length);
}

static const char *signal_name(int sig) {
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return "a fatal signal";
    }
}

static void on_fatal_signal(int sig, siginfo_t *info, void *context) {
    int saved = errno;
    /* raise(), abort() or pthread_kill() in this process: the kernel lets no other process
     * send a signal with these codes and this pid. */
    int raised_here = (info->si_code == SI_USER || info->si_code == SI_TKILL) && info->si_pid == getpid();
    /* Sent by another process (kill, sigqueue): nothing crashed here, so nothing is
     * recorded or backtraced, and the signal ends the process by its default action. */
    if (info->si_code <= 0 && !raised_here) {
        signal(sig, SIG_DFL);
        raise(sig);
        errno = saved;
        return;
    }
    /* A fault of this process (si_code > 0), or raised in it. */
    const ucontext_t *state = context;
    uintptr_t pc = 0, sp = 0;
#if defined(__x86_64__)
    pc = (uintptr_t)state->uc_mcontext.gregs[REG_RIP];
    sp = (uintptr_t)state->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
    pc = (uintptr_t)state->uc_mcontext.pc;
    sp = (uintptr_t)state->uc_mcontext.sp;
#else
    (void)state;
#endif
    const struct plugin_image *image = image_containing(pc, NULL);
    if (image == NULL) image = scan_stack(sp);
    /* A jump through a bad pointer leaves neither the instruction nor a return address in
     * the plugin's code: the plugin the host was calling on this thread is the one. */
    if (image == NULL) image = running_image;
    modhost_crash_recorder_write(image, "run", signal_name(sig));
    if (info->si_code > 0) {
        /* The handler that was there before (the Swift runtime's backtracer, or the default
         * action) gets the signal: a fault repeats when this returns. */
        sigaction(sig, &previous[sig], NULL);
    } else if (sig == SIGABRT) {
        /* abort(), raise(SIGABRT) or pthread_kill: the handler that was there before (the
         * backtracer, which prints the stack) runs now, then the default action ends the
         * process, as abort() does once the handlers have returned; raise() alone would let
         * the process go on after the backtracer returned. */
        sigaction(sig, &previous[sig], NULL);
        sigset_t unblocked;
        sigemptyset(&unblocked);
        sigaddset(&unblocked, sig);
        pthread_sigmask(SIG_UNBLOCK, &unblocked, NULL);
        raise(sig);
        signal(sig, SIG_DFL);
        raise(sig);
    } else {
        /* Raised otherwise (raise(SIGSEGV), pthread_kill): the backtracer, handed a signal
         * that is no fault, would print a crash and let the process go on; the default
         * action ends it once this handler returns (the signal is blocked until then). */
        signal(sig, SIG_DFL);
        raise(sig);
    }
    errno = saved;
}

void modhost_crash_recorder_allow_abort(void) {
    static __thread int allowed;
    if (allowed) return;
    allowed = 1;
    sigset_t abort_only;
    sigemptyset(&abort_only);
    sigaddset(&abort_only, SIGABRT);
    /* A SIGABRT other code raised on this thread while it was blocked (a Swift module on a
     * Dispatch thread, which the docs say does nothing) is discarded: unblocked, it would
     * end the process now, blamed on whatever plugin runs here next. */
    sigset_t pending;
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGABRT)) {
        struct timespec now = {0, 0};
        while (sigtimedwait(&abort_only, NULL, &now) == SIGABRT) {}
    }
    pthread_sigmask(SIG_UNBLOCK, &abort_only, NULL);
}

int modhost_crash_recorder_install(int fd) {
    atomic_store(&recorder_pid, getpid());
    int old = atomic_exchange(&record_fd, fd);
    if (old >= 0 && old != fd) close(old);
    if (atomic_exchange(&installed, 1)) return 0;
    uintptr_t probe = 1, copy = 0;
    struct iovec local = {&copy, sizeof copy}, remote = {&probe, sizeof probe};
    stack_readable = process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == sizeof copy && copy == probe;
    stack_t current;
    if (sigaltstack(NULL, &current) == 0 && (current.ss_flags & SS_DISABLE)) {
        size_t size = 64 * 1024;
        void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (memory != MAP_FAILED) {
            stack_t alternate = {.ss_sp = memory, .ss_size = size, .ss_flags = 0};
            sigaltstack(&alternate, NULL);
        }
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_fatal_signal;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++)
        if (sigaction(fatal_signals[i], &action, &previous[fatal_signals[i]]) != 0) return -1;
    return 0;
}

struct range_search {
    const char *name;
    uintptr_t base;
    struct plugin_image *image;
};

static int collect_code_ranges(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct range_search *search = data;
    if (info->dlpi_addr != search->base || info->dlpi_name == NULL || strcmp(info->dlpi_name, search->name) != 0) return 0;
    for (int i = 0; i < info->dlpi_phnum && search->image->ranges < MAX_RANGES; i++) {
        const ElfW(Phdr) *segment = &info->dlpi_phdr[i];
        if (segment->p_type != PT_LOAD || !(segment->p_flags & PF_X)) continue;
        search->image->start[search->image->ranges] = info->dlpi_addr + segment->p_vaddr;
        search->image->end[search->image->ranges] = info->dlpi_addr + segment->p_vaddr + segment->p_memsz;
        search->image->ranges++;
    }
    return 1;
}

int modhost_crash_recorder_add(void *handle, const char *record) {
    struct link_map *map = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == NULL || map->l_name == NULL) return -1;
    struct plugin_image *image = calloc(1, sizeof *image);
    if (image == NULL) return -1;
    struct range_search search = {map->l_name, map->l_addr, image};
    dl_iterate_phdr(collect_code_ranges, &search);
    image->length = strlen(record);
    image->record = malloc(image->length + 1);
    if (image->ranges == 0 || image->record == NULL) {
        free(image->record);
        free(image);
        return -1;
    }
    memcpy(image->record, record, image->length + 1);
    struct plugin_image *head = atomic_load_explicit(&images, memory_order_relaxed);
    do image->next = head;
    while (!atomic_compare_exchange_weak_explicit(&images, &head, image, memory_order_release, memory_order_relaxed));
    return 0;
}

const void *modhost_crash_recorder_image_of(const void *code) {
    return image_containing((uintptr_t)code, NULL);
}

const void *modhost_crash_recorder_enter(const void *image) {
    const void *before = running_image;
    running_image = image;
    return before;
}

const void *modhost_crash_recorder_caller(const char **record) {
    void *frames[64];
    int count = backtrace(frames, 64);
    const struct plugin_image *image = NULL;
    for (int i = 1; i < count && image == NULL; i++) image = image_containing((uintptr_t)frames[i], NULL);
    if (image == NULL) {
        uintptr_t here = (uintptr_t)&count;
        image = scan_stack(here);
    }
    if (image && record) *record = image->record;
    return image;
}
