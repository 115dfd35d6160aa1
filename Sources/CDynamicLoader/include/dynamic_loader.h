#ifndef MODHOST_DYNAMIC_LOADER_H
#define MODHOST_DYNAMIC_LOADER_H
/* dladdr needs _GNU_SOURCE, which Swift's Glibc module is not built with. */

/* The path of the loaded object that contains `address`, or NULL. The string belongs to
 * the dynamic loader and stays valid while the object is loaded. */
const char *modhost_object_containing(const void *address);

#endif
