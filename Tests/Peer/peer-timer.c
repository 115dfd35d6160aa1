/*
 * peer-timer: how long a service takes from its start to READY=1, as systemd (Type=notify)
 * sees it. Measures modhostd and the peer hosts alike for make bench's peer rows.
 *
 *   peer-timer [--rss] -- PROGRAM ARGS...
 *
 * Binds a unix datagram socket in a new private directory under /tmp, starts PROGRAM with
 * NOTIFY_SOCKET naming it (fork + exec, with no signal blocked; the program's standard
 * output goes to standard error), and once a datagram containing READY=1 arrives prints
 * one line:
 *
 *   ready_ns=N cpu_ns=N [hwm_kib=N]
 *
 * ready_ns: CLOCK_MONOTONIC from just before fork to the datagram's arrival; cpu_ns: the
 * program's CPU time at that moment (user + system, all its threads: what utime + stime of
 * /proc/PID/stat count, to the nanosecond); hwm_kib (with --rss): its peak resident memory
 * so far (VmHWM of /proc/PID/status).
 * Then it sends SIGTERM and reaps the program (SIGKILL after 60 s). Exits 1 with a message
 * when the program ends first or sends no READY=1 within 60 s.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const uint64_t timeout_ns = 60ull * 1000000000u;

static uint64_t now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

static char directory[] = "/tmp/peer-timer.XXXXXX";
static char socket_path[64];

static void clean_up(void) {
    unlink(socket_path);
    rmdir(directory);
}

static void fail(const char *message) {
    fprintf(stderr, "peer-timer: %s\n", message);
    clean_up();
    exit(1);
}

/* The CPU time of process `pid` so far, in nanoseconds. */
static uint64_t cpu_ns(pid_t pid) {
    clockid_t clock;
    struct timespec spent;
    if (clock_getcpuclockid(pid, &clock) != 0 || clock_gettime(clock, &spent) != 0)
        fail("cannot read the program's CPU time");
    return (uint64_t)spent.tv_sec * 1000000000u + (uint64_t)spent.tv_nsec;
}

/* VmHWM of process `pid` in KiB. */
static long peak_rss_kib(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *status = fopen(path, "r");
    if (status == NULL) fail("cannot open the program's /proc/PID/status");
    long kib = -1;
    while (fgets(line, sizeof line, status) != NULL) {
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
    }
    fclose(status);
    if (kib < 0) fail("no VmHWM in the program's /proc/PID/status");
    return kib;
}

/* SIGTERM, then waits up to 60 s for the program to end (SIGKILL after that). */
static void stop(pid_t pid) {
    kill(pid, SIGTERM);
    uint64_t deadline = now_ns() + timeout_ns;
    while (waitpid(pid, NULL, WNOHANG) == 0) {
        if (now_ns() > deadline) {
            fprintf(stderr, "peer-timer: the program did not end within 60 s of SIGTERM; killed\n");
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return;
        }
        usleep(1000);
    }
}

int main(int argc, char **argv) {
    int rss = 0, first = 1;
    if (first < argc && strcmp(argv[first], "--rss") == 0) rss = 1, first++;
    if (first + 1 >= argc || strcmp(argv[first], "--") != 0) {
        fprintf(stderr, "usage: peer-timer [--rss] -- PROGRAM ARGS...\n");
        return 64;
    }
    char **program = argv + first + 1;

    if (mkdtemp(directory) == NULL) fail("cannot create a directory in /tmp");
    snprintf(socket_path, sizeof socket_path, "%s/notify", directory);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strcpy(address.sun_path, socket_path);
    if (fd < 0 || bind(fd, (struct sockaddr *)&address, sizeof address) != 0) fail("cannot bind the notify socket");
    setenv("NOTIFY_SOCKET", socket_path, 1);

    uint64_t start = now_ns();
    pid_t pid = fork();
    if (pid < 0) fail("fork failed");
    if (pid == 0) {
        /* As systemd starts a service: no signal blocked, whatever this process inherited. */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(STDERR_FILENO, STDOUT_FILENO);
        execvp(program[0], program);
        fprintf(stderr, "peer-timer: cannot run %s: %s\n", program[0], strerror(errno));
        _exit(127);
    }

    char message[4096];
    for (;;) {
        uint64_t now = now_ns();
        if (now - start > timeout_ns) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            fail("no READY=1 within 60 s; the program was killed");
        }
        struct pollfd ready = {.fd = fd, .events = POLLIN};
        if (poll(&ready, 1, 100) > 0) {
            ssize_t length = recv(fd, message, sizeof message - 1, 0);
            if (length > 0) {
                uint64_t arrived = now_ns();
                message[length] = '\0';
                if (strstr(message, "READY=1") == NULL) continue;
                uint64_t cpu = cpu_ns(pid);
                long kib = rss ? peak_rss_kib(pid) : 0;
                printf("ready_ns=%llu cpu_ns=%llu", (unsigned long long)(arrived - start), (unsigned long long)cpu);
                if (rss) printf(" hwm_kib=%ld", kib);
                printf("\n");
                fflush(stdout);
                break;
            }
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            char reason[96];
            if (WIFEXITED(status)) snprintf(reason, sizeof reason, "the program exited (status %d) before READY=1", WEXITSTATUS(status));
            else snprintf(reason, sizeof reason, "the program ended by signal %d before READY=1", WTERMSIG(status));
            fail(reason);
        }
    }
    stop(pid);
    clean_up();
    return 0;
}
