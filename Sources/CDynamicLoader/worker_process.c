#define _GNU_SOURCE
#include "worker_process.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

int modhost_worker_set_parent_death_signal(int signal) { return prctl(PR_SET_PDEATHSIG, signal, 0, 0, 0); }

int modhost_worker_use_one_malloc_arena(void) { return mallopt(M_ARENA_MAX, 1); }

int modhost_worker_redirect_output(int read_ends[2]) {
    int result = 0;
    /* A daemon started with 1 or 2 closed: hold them (with 0, /dev/null), so that no pipe
     * end lands on them. */
    for (int target = 1; target <= 2; target++) {
        if (fcntl(target, F_GETFD) < 0) dup2(0, target);
    }
    for (int target = 1; target <= 2; target++) {
        int ends[2];
        read_ends[target - 1] = -1;
        if (pipe2(ends, O_CLOEXEC) == 0) {
            dup2(ends[1], target);
            close(ends[1]);
            read_ends[target - 1] = ends[0];
        } else {
            int saved = errno;
            int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
            if (null >= 0) { dup2(null, target); close(null); }
            errno = saved;
            result = -1;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    return result;
}

int modhost_worker_set_no_new_privileges(void) { return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); }

int modhost_worker_close_from(int first) {
#ifdef SYS_close_range
    if (syscall(SYS_close_range, (unsigned)first, ~0U, 0) == 0) return 0;
#endif
    DIR *dir = opendir("/proc/self/fd");
    if (!dir) return -1;
    int own = dirfd(dir);
    int fds[1024];
    int count = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL && count < 1024) {
        char *end;
        long fd = strtol(entry->d_name, &end, 10);
        if (*end == 0 && end != entry->d_name && fd >= first && fd != own) fds[count++] = (int)fd;
    }
    closedir(dir);
    for (int i = 0; i < count; i++) close(fds[i]);
    return 0;
}

pid_t modhost_worker_peer_pid(int fd) {
    struct ucred credentials;
    socklen_t size = sizeof credentials;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) return -1;
    return credentials.pid;
}

int modhost_worker_socketpair(int fds[2]) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return -1;
    // The worker's end above 9: the dup2s onto 3, 4 and 5 in the child never overwrite
    // another end they still have to copy.
    int high = fcntl(fds[1], F_DUPFD_CLOEXEC, 10);
    if (high < 0) {
        int saved = errno;
        close(fds[0]);
        close(fds[1]);
        errno = saved;
        return -1;
    }
    close(fds[1]);
    fds[1] = high;
    return 0;
}

int modhost_worker_set_limit(int which, uint64_t value) {
    static const int resources[] = {RLIMIT_AS, RLIMIT_NOFILE, RLIMIT_CPU, RLIMIT_NPROC};
    if (which < 0 || which > 3) {
        errno = EINVAL;
        return -1;
    }
    /* CPU time: SIGXCPU at the limit and SIGKILL a second later (a hard limit equal to the
     * soft one would be SIGKILL at once). */
    struct rlimit limit = {(rlim_t)value, (rlim_t)value + (which == 2 ? 1 : 0)};
    return setrlimit(resources[which], &limit);
}

int modhost_memory_file(const char *name) {
    unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
#ifdef MFD_EXEC
    /* Executable on purpose (it is mapped as code), and saying so keeps kernels that warn
     * about memory files without MFD_EXEC or MFD_NOEXEC_SEAL quiet; older ones refuse it. */
    int file = memfd_create(name, flags | MFD_EXEC);
    if (file < 0 && errno == EINVAL) file = memfd_create(name, flags);
    return file;
#else
    return memfd_create(name, flags);
#endif
}

int modhost_process_is_dumpable(void) { return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1; }

int modhost_seal_memory_file(int file) {
    return fcntl(file, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
}

int modhost_worker_memory_copy(const char *path, const char *name) {
    int source = open(path, O_RDONLY | O_CLOEXEC);
    if (source < 0) return -1;
    int copy = modhost_memory_file(name);
    if (copy < 0) {
        int error = errno;
        close(source);
        errno = error;
        return -1;
    }
    for (;;) {
        ssize_t sent = sendfile(copy, source, NULL, 1 << 20);
        if (sent == 0) break;
        if (sent < 0 && errno == EINTR) continue;
        if (sent < 0) {
            int error = errno;
            close(source);
            close(copy);
            errno = error;
            return -1;
        }
    }
    close(source);
    if (modhost_seal_memory_file(copy) != 0) {
        int error = errno;
        close(copy);
        errno = error;
        return -1;
    }
    return copy;
}

int modhost_worker_pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

int modhost_worker_wake_pipe(int fds[2]) { return pipe2(fds, O_CLOEXEC | O_NONBLOCK); }
