#ifndef MODHOST_FORK_GUARD_H
#define MODHOST_FORK_GUARD_H

/* Descriptors a process made by fork() alone, without exec (plugin code forking; the host
 * starts its own processes with posix_spawn, which runs no fork handlers), must not keep:
 * a lock it held would outlive the host. A handler registered with pthread_atfork closes
 * them in such a child (once: not again in a child of that child), and unblocks SIGTERM,
 * SIGINT, SIGHUP and SIGQUIT there. */

/* Closes `fd` in every child forked from now on. 0, or -1 when the table is full. */
int modhost_fork_guard_close(int fd);

/* No longer closes `fd` in forked children (call before closing it). */
void modhost_fork_guard_keep(int fd);

#endif
