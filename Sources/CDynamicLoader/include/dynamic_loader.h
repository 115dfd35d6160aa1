#ifndef MODHOST_DYNAMIC_LOADER_H
#define MODHOST_DYNAMIC_LOADER_H
/* dladdr needs _GNU_SOURCE, which Swift's Glibc module is not built with. */

/* The path of the loaded object that contains `address`, or NULL. The string belongs to
 * the dynamic loader and stays valid while the object is loaded. */
const char *modhost_object_containing(const void *address);


#include <stddef.h>
#include <stdint.h>

/* The path of the loaded object that contains `address`, as the dynamic loader names it,
 * found with _dl_find_object (a lookup that does not walk every loaded object, unlike
 * dladdr); NULL when no object contains it. */
const char *modhost_fast_object_containing(const void *address);

/* 1 when `address` lies in the object `handle` (from dlopen) names, 0 when it lies in
 * another object, -1 when no loaded object contains it. */
int modhost_address_in_object(const void *address, void *handle);

/* pipe2(fds, O_CLOEXEC), which Swift's Glibc module does not declare: a pipe no child
 * started by another thread inherits. */
int modhost_pipe_cloexec(int fds[2]);

#include "crash_recorder.h"
#include "worker_process.h"

#endif
