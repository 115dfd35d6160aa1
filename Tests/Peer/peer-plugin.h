/*
 * peer-plugin.h: what every generated plugin of make bench's peer rows shares, ModuleHost's
 * (modhost-plugin.c) and libpeas's (peas-plugin.c) alike: an event counter, and the clock
 * reading a plugin sends when it starts or stops, by which the bench times hot add,
 * replace and remove from inside the plugin itself.
 */
#ifndef PEER_PLUGIN_H
#define PEER_PLUGIN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* The plugin's trivial work: events counted. Not static, so the compiler keeps every count. */
unsigned long peer_events;

/* Sends "WHAT NAME NS" (NS: CLOCK_MONOTONIC now) as one datagram to the unix socket at the
 * path in MODHOST_PEER_CLOCK; nothing when it is unset. */
static void peer_clock(const char *what, const char *name) {
    const char *path = getenv("MODHOST_PEER_CLOCK");
    if (path == NULL || strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    char message[128];
    long long ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    int length = snprintf(message, sizeof message, "%s %s %lld", what, name, ns);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strcpy(address.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    sendto(fd, message, (size_t)length, 0, (struct sockaddr *)&address, sizeof address);
    close(fd);
}

#endif
