#define _GNU_SOURCE
#include "worker_process.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int modhost_worker_set_parent_death_signal(int signal) { return prctl(PR_SET_PDEATHSIG, signal, 0, 0, 0); }

int modhost_worker_use_one_malloc_arena(void) { return mallopt(M_ARENA_MAX, 1); }

int modhost_malloc_map_blocks_from(int bytes) { return mallopt(M_MMAP_THRESHOLD, bytes); }

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

int modhost_worker_peer_closed(int fd) {
    struct pollfd entry = {fd, POLLRDHUP, 0};
    int ready;
    while ((ready = poll(&entry, 1, 0)) < 0 && errno == EINTR) {}
    return ready > 0 && (entry.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0;
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

/* What the child of modhost_worker_spawn needs: everything is ready before the clone, so
 * that the child (a copy of a multithreaded process) calls only async-signal-safe
 * functions. */
struct spawn_child {
    const char *path;
    char *const *argv;
    char *const *envp;
    const int *sockets;
    int report; /* close-on-exec, above 9: the child writes its errno there if the exec fails */
    int status; /* above 9, or -1: the init's end of the status pipe, moved to descriptor 6 */
};

static int spawn_child(void *raw) {
    const struct spawn_child *child = raw;
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    struct sigaction defaults;
    memset(&defaults, 0, sizeof defaults);
    defaults.sa_handler = SIG_DFL;
    for (int signal = 1; signal < NSIG; signal++) sigaction(signal, &defaults, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int null = -1;
    if (setpgid(0, 0) == 0 && (null = open("/dev/null", O_RDONLY)) >= 0 && (null == 0 || dup2(null, 0) == 0)) {
        if (null != 0) close(null);
        int moved = 0;
        while (moved < 3 && dup2(child->sockets[moved], 3 + moved) == 3 + moved) moved++;
        if (moved == 3 && (child->status < 0 || dup2(child->status, MODHOST_WORKER_STATUS_FD) == MODHOST_WORKER_STATUS_FD)) {
            execve(child->path, child->argv, child->envp);
        }
    }
    int error = errno;
    while (write(child->report, &error, sizeof error) < 0 && errno == EINTR) {}
    _exit(127);
}

/* Writes `text` to file `path` (a /proc file of a new user namespace). */
static void write_proc_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    if (write(fd, text, strlen(text)) < 0) {}
    close(fd);
}

/* Maps the uid and gid of process `pid`'s new user namespace to this process's. Without a
 * map they would read as the overflow ids (65534); the worker behaves the same either way,
 * so a map the kernel refuses is left out. */
static void map_own_ids(pid_t pid) {
    char path[64], text[64];
    snprintf(path, sizeof path, "/proc/%d/setgroups", (int)pid);
    write_proc_file(path, "deny");
    snprintf(path, sizeof path, "/proc/%d/uid_map", (int)pid);
    snprintf(text, sizeof text, "%u %u 1\n", (unsigned)geteuid(), (unsigned)geteuid());
    write_proc_file(path, text);
    snprintf(path, sizeof path, "/proc/%d/gid_map", (int)pid);
    snprintf(text, sizeof text, "%u %u 1\n", (unsigned)getegid(), (unsigned)getegid());
    write_proc_file(path, text);
}

/* Reads 4 bytes from `fd` within `milliseconds`: 0, or -1 with errno (ETIMEDOUT, or EPIPE
 * when the writer closed it first). */
static int read_int_within(int fd, int32_t *value, int milliseconds) {
    struct pollfd entry = {fd, POLLIN, 0};
    int ready;
    while ((ready = poll(&entry, 1, milliseconds)) < 0 && errno == EINTR) {}
    if (ready == 0) {
        errno = ETIMEDOUT;
        return -1;
    }
    ssize_t got;
    while ((got = read(fd, value, sizeof *value)) < 0 && errno == EINTR) {}
    if (got == (ssize_t)sizeof *value) return 0;
    if (got >= 0) errno = EPIPE;
    return -1;
}

/* A pipe (close-on-exec) whose write end is above 9; 0, or -1 with errno. */
static int high_pipe(int ends[2]) {
    if (pipe2(ends, O_CLOEXEC) != 0) return -1;
    int high = fcntl(ends[1], F_DUPFD_CLOEXEC, 10);
    int error = errno;
    close(ends[1]);
    if (high < 0) {
        close(ends[0]);
        errno = error;
        return -1;
    }
    ends[1] = high;
    return 0;
}

int modhost_worker_spawn(const char *path, char *const argv[], char *const init_argv[], char *const envp[],
                         const int sockets[3], modhost_worker_spawned *spawned) {
    memset(spawned, 0, sizeof *spawned);
    spawned->status_fd = -1;
    int report[2], status[2];
    if (high_pipe(report) != 0) return errno;
    if (high_pipe(status) != 0) {
        int error = errno;
        close(report[0]);
        close(report[1]);
        return error;
    }
    /* The child runs on a private copy of this stack (no CLONE_VM) until it execs. */
    const size_t size = 256 * 1024;
    char *stack = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    int error = stack == MAP_FAILED ? errno : 0;
    pid_t started = -1;
    int flags = CLONE_NEWPID | (geteuid() == 0 ? 0 : CLONE_NEWUSER);
    if (error == 0) {
        struct spawn_child child = {path, init_argv, envp, sockets, report[1], status[1]};
        started = clone(spawn_child, stack + size, flags | SIGCHLD, &child);
        if (started < 0 && (errno == EPERM || errno == EINVAL || errno == ENOSPC || errno == EUSERS)) {
            spawned->refusal = errno;
            flags = 0;
            struct spawn_child alone = {path, argv, envp, sockets, report[1], -1};
            started = clone(spawn_child, stack + size, SIGCHLD, &alone);
        }
        error = started < 0 ? errno : 0;
        munmap(stack, size);
    }
    close(report[1]);
    close(status[1]);
    if (started > 0) {
        int32_t failure = 0;
        ssize_t got;
        while ((got = read(report[0], &failure, sizeof failure)) < 0 && errno == EINTR) {}
        if (got == (ssize_t)sizeof failure) error = failure;
    }
    close(report[0]);
    int32_t worker = started;
    if (error == 0 && flags != 0) {
        /* The init forks the worker, which says its pid as this process sees it. */
        if (flags & CLONE_NEWUSER) map_own_ids(started);
        if (read_int_within(status[0], &worker, 10000) != 0) {
            error = errno;
        } else if (worker <= 0) {
            error = EAGAIN; /* the init could not fork the worker */
        }
    }
    if (error != 0) {
        close(status[0]);
        if (started > 0) {
            kill(started, SIGKILL);
            int ignored;
            while (waitpid(started, &ignored, 0) < 0 && errno == EINTR) {}
        }
        return error;
    }
    spawned->supervised = started;
    spawned->worker = worker;
    if (flags != 0) {
        spawned->status_fd = status[0];
    } else {
        close(status[0]);
    }
    return 0;
}

int modhost_worker_ending_status(int status_fd, int *status) {
    int32_t value = 0;
    int flags = fcntl(status_fd, F_GETFL);
    if (flags >= 0) fcntl(status_fd, F_SETFL, flags | O_NONBLOCK);
    ssize_t got;
    while ((got = read(status_fd, &value, sizeof value)) < 0 && errno == EINTR) {}
    if (got != (ssize_t)sizeof value) return -1;
    *status = value;
    return 0;
}

void modhost_worker_run_init(char *const worker_argv[]) {
    /* Nothing but the sockets (3-5, the worker's) and the status pipe (6). */
    modhost_worker_close_from(MODHOST_WORKER_STATUS_FD + 1);
    pid_t worker = fork();
    if (worker == 0) {
        /* The worker: its pid as the daemon sees it (the /proc mounted is the daemon's),
         * then the worker program. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        char self[32] = {0};
        int32_t outer = readlink("/proc/self", self, sizeof self - 1) > 0 ? (int32_t)atoi(self) : 0;
        if (write(MODHOST_WORKER_STATUS_FD, &outer, sizeof outer) < 0) {}
        close(MODHOST_WORKER_STATUS_FD);
        execv("/proc/self/exe", worker_argv);
        _exit(127);
    }
    close(3);
    close(4);
    close(5);
    if (worker < 0) {
        int32_t none = 0;
        if (write(MODHOST_WORKER_STATUS_FD, &none, sizeof none) < 0) {}
        _exit(71);
    }
    /* Reaps every process of the namespace that ends as its child (the worker, and any
     * process of the plugin whose parent ended), and ends with the worker, after saying
     * how it ended. */
    for (;;) {
        int status = 0;
        pid_t ended = wait(&status);
        if (ended == worker) {
            int32_t value = status;
            if (write(MODHOST_WORKER_STATUS_FD, &value, sizeof value) < 0) {}
            _exit(0);
        }
        if (ended < 0 && errno == ECHILD) _exit(0);
    }
}
