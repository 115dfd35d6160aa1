#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
#include "dynamic_loader.h"

const char *modhost_object_containing(const void *address) {
    Dl_info info;
    if (dladdr(address, &info) == 0) return NULL;
    return info.dli_fname;
}

const char *modhost_fast_object_containing(const void *address) {
    struct dl_find_object found;
    if (_dl_find_object((void *)address, &found) != 0 || found.dlfo_link_map == NULL) return NULL;
    return found.dlfo_link_map->l_name;
}

int modhost_address_in_object(const void *address, void *handle) {
    struct dl_find_object found;
    if (_dl_find_object((void *)address, &found) != 0) return -1;
    /* In glibc a dlopen handle is the object's link_map. */
    return found.dlfo_link_map == (struct link_map *)handle ? 1 : 0;
}

int modhost_pipe_cloexec(int fds[2]) { return pipe2(fds, O_CLOEXEC); }
