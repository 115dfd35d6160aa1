#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include "dynamic_loader.h"

const char *modhost_object_containing(const void *address) {
    Dl_info info;
    if (dladdr(address, &info) == 0) return NULL;
    return info.dli_fname;
}
