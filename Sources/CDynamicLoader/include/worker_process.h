#ifndef MODHOST_WORKER_PROCESS_H
#define MODHOST_WORKER_PROCESS_H

#include <stdint.h>
#include <sys/types.h>

/* What modhost-worker does to itself before it loads any plugin code (docs/isolation.md).
 * prctl and close_range are variadic or undeclared for Swift, hence plain C. */

/* prctl(PR_SET_PDEATHSIG, signal): the worker gets `signal` when the daemon thread that
 * started it ends. 0 on success, -1 with errno. */
int modhost_worker_set_parent_death_signal(int signal);

/* mallopt(M_ARENA_MAX, 1): every thread allocates from the one main arena. glibc reserves
 * 64 MiB of address space for each further arena, which RLIMIT_AS counts. 1 on success. */
int modhost_worker_use_one_malloc_arena(void);

/* mallopt(M_MMAP_THRESHOLD, bytes), for modhostd: every block of `bytes` or more gets a
 * mapping of its own, returned to the system when freed. Set, the threshold stays put:
 * otherwise glibc raises it to the size of each larger block freed (up to 32 MiB, and the
 * trim threshold to twice that), and blocks that large are then carved from heaps that
 * keep their memory once they are freed. 1 on success. */
int modhost_malloc_map_blocks_from(int bytes);

/* Puts a pipe on each of descriptors 1 and 2 (standard output and error) and stores their
 * read ends (close-on-exec) in read_ends[0] and [1]; what was on 1 and 2 (the daemon's own
 * standard error) is closed. A pipe that cannot be made leaves -1 and /dev/null on that
 * descriptor. Makes C's stdout line-buffered, as on a terminal. 0 on success, -1 with
 * errno when either pipe could not be made. */
int modhost_worker_redirect_output(int read_ends[2]);

/* prctl(PR_SET_NO_NEW_PRIVS, 1): no exec the worker does gains privileges. */
int modhost_worker_set_no_new_privileges(void);

/* Closes every descriptor from `first` on (close_range, else one by one through
 * /proc/self/fd). 0 on success, -1 with errno. */
int modhost_worker_close_from(int first);

/* The pid of the process at the other end of UNIX socket `fd` (SO_PEERCRED), -1 with
 * errno when `fd` is no connected UNIX socket; 0 when that process is outside this
 * process's PID namespace. */
pid_t modhost_worker_peer_pid(int fd);

/* 1 when the other end of socket `fd` has been closed (poll: POLLHUP or POLLRDHUP, without
 * waiting), 0 while it is open. */
int modhost_worker_peer_closed(int fd);

/* socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC): the daemon's end and the worker's
 * (which modhost_worker_spawn moves to descriptor 3, 4 or 5, clearing close-on-exec
 * there). The worker's end is above 9. */
int modhost_worker_socketpair(int fds[2]);

/* setrlimit(resource, {value, value}) for the limits a worker takes (RLIMIT_AS,
 * RLIMIT_NOFILE, RLIMIT_CPU, RLIMIT_NPROC: 0..3 in that order); for RLIMIT_CPU the hard
 * limit is one second more, so that SIGXCPU comes first. */
int modhost_worker_set_limit(int which, uint64_t value);

/* A new memory file named `name` (memfd_create, close-on-exec, sealable, executable
 * where the kernel asks to be told): the descriptor, or -1 with errno. */
int modhost_memory_file(const char *name);

/* 1 when this process is dumpable (PR_GET_DUMPABLE): only then may other processes of its
 * user open its descriptors by /proc/PID/fd/N. */
int modhost_process_is_dumpable(void);

/* Seals memory file `file` against any change of its size or bytes (F_ADD_SEALS): 0, or
 * -1 with errno. */
int modhost_seal_memory_file(int file);

/* A sealed, read-only copy of file `path` in a new memory file named `name`
 * (memfd_create, close-on-exec): the descriptor, or -1 with errno. A worker that takes
 * another user copies the daemon's private images (in a directory only the daemon's user
 * may enter) while it still can, and loads them as /proc/self/fd/N. */
int modhost_worker_memory_copy(const char *path, const char *name);

/* pidfd_open(pid, 0): a close-on-exec descriptor that polls readable once process `pid`
 * (a child not yet reaped) has ended, so that one thread can wait for the ends of every
 * worker at once. -1 with errno (ENOSYS before Linux 5.3). */
int modhost_worker_pidfd_open(pid_t pid);

/* Descriptor 6 of a worker's namespace init: the status pipe to the daemon. */
#define MODHOST_WORKER_STATUS_FD 6

/* What modhost_worker_spawn started. */
typedef struct {
    /* The process the daemon signals, waits for and reaps: the init of the worker's PID
     * namespace, or the worker itself when it has none. */
    pid_t supervised;
    /* The worker process (as this process sees it). */
    pid_t worker;
    /* The daemon's end of the status pipe (close-on-exec), where the init writes how the
     * worker ended before it ends itself (modhost_worker_ending_status); -1 without an init. */
    int status_fd;
    /* The errno with which the kernel refused the namespaces (0 when it made them). */
    int refusal;
} modhost_worker_spawned;

/* Starts a worker: in a new PID namespace (and, when this process is not root, a new user
 * namespace, which a PID namespace then needs, mapping its uid and gid to this
 * process's), `path` runs with `init_argv` as process 1, the namespace's init
 * (modhost_worker_run_init), which forks the worker, reaps every process of the
 * namespace and ends with the worker: then the kernel kills every process left in the
 * namespace, whatever group, session, descriptors or environment it took. When the kernel
 * refuses the namespaces (EPERM, EINVAL, ENOSPC, EUSERS), `path` runs with `argv` as the
 * worker itself, and `refusal` says why. Either way: standard input /dev/null,
 * sockets[0..2] (each above 9) on descriptors 3, 4 and 5, a process group of its own, no
 * signal blocked and every signal at its default, `envp`. Returns 0, or the errno of what
 * failed (clone, the exec, which the child reports through a close-on-exec pipe, or the
 * init, which must say the worker's pid within 10 s). */
int modhost_worker_spawn(const char *path, char *const argv[], char *const init_argv[], char *const envp[],
                         const int sockets[3], modhost_worker_spawned *spawned);

/* How the worker of a namespace ended (a wait status), as its init wrote it on `status_fd`
 * before it ended: 0 and *status, or -1 when the init ended without writing it (killed). */
int modhost_worker_ending_status(int status_fd, int *status);

/* The namespace init's program (modhost-worker run with the init argument, descriptors
 * 3-5 the worker's sockets and 6 the status pipe): forks the worker, which writes its pid
 * as the daemon sees it on 6 and runs /proc/self/exe with `worker_argv`; closes the
 * sockets; reaps every child, and when the worker ends writes its wait status on 6 and
 * exits. Never returns. */
void modhost_worker_run_init(char *const worker_argv[]) __attribute__((noreturn));

/* pipe2(fds, O_CLOEXEC | O_NONBLOCK): a pipe that wakes a thread blocked in poll and that
 * it drains without blocking. */
int modhost_worker_wake_pipe(int fds[2]);

#endif
