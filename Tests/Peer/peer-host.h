/*
 * peer-host.h: what the peer hosts (peer-peas-host, peer-bare-host) share: the monotonic
 * clock and the systemd readiness message that peer-timer waits for.
 */
#ifndef PEER_HOST_H
#define PEER_HOST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static inline uint64_t peer_now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

/* Sends READY=1 to the unix datagram socket at the path NOTIFY_SOCKET names, as sd_notify
 * does (without NOTIFY_SOCKET: nothing; peer-timer gives a path, never an abstract name). */
static inline void peer_notify_ready(void) {
    const char *path = getenv("NOTIFY_SOCKET");
    if (path == NULL || path[0] == '\0' || strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) return;
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strcpy(address.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    if (sendto(fd, "READY=1", 7, 0, (struct sockaddr *)&address, sizeof address) < 0) perror("READY=1");
    close(fd);
}

#endif
