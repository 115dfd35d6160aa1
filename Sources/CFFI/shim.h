/*
 * shim.h: the CFFI system-library module's umbrella header (libffi from libffi-dev).
 *
 * libffi exposes its built-in type descriptors as mutable C globals (`ffi_type_sint32`,
 * ...). Swift 6 refuses to touch such globals ("not concurrency-safe"), so the accessors
 * below return their addresses. libffi never writes to these descriptors after its own
 * initialisation, so handing out their addresses from any thread is safe.
 */
#ifndef MODHOST_CFFI_SHIM_H
#define MODHOST_CFFI_SHIM_H

#include <ffi.h>
#include <stddef.h>

static inline ffi_type *modhost_ffi_type_void(void) { return &ffi_type_void; }
static inline ffi_type *modhost_ffi_type_uint8(void) { return &ffi_type_uint8; }
static inline ffi_type *modhost_ffi_type_sint8(void) { return &ffi_type_sint8; }
static inline ffi_type *modhost_ffi_type_uint16(void) { return &ffi_type_uint16; }
static inline ffi_type *modhost_ffi_type_sint16(void) { return &ffi_type_sint16; }
static inline ffi_type *modhost_ffi_type_uint32(void) { return &ffi_type_uint32; }
static inline ffi_type *modhost_ffi_type_sint32(void) { return &ffi_type_sint32; }
static inline ffi_type *modhost_ffi_type_uint64(void) { return &ffi_type_uint64; }
static inline ffi_type *modhost_ffi_type_sint64(void) { return &ffi_type_sint64; }
static inline ffi_type *modhost_ffi_type_float(void) { return &ffi_type_float; }
static inline ffi_type *modhost_ffi_type_double(void) { return &ffi_type_double; }
static inline ffi_type *modhost_ffi_type_pointer(void) { return &ffi_type_pointer; }

/* The ABI libffi uses by default on this platform (an enum constant in ffi.h). */
static inline ffi_abi modhost_ffi_default_abi(void) { return FFI_DEFAULT_ABI; }

/* sizeof(ffi_closure), for ffi_closure_alloc. */
static inline size_t modhost_ffi_closure_size(void) { return sizeof(ffi_closure); }

/*
 * dladdr1 and dlinfo are GNU extensions that Swift's Glibc module does not declare, and
 * defining _GNU_SOURCE here would make this module's copies of the libc types differ from
 * Glibc's. So they are declared under private names bound to the libc symbols with asm
 * labels, with a private copy of Dl_info (layout fixed by glibc's ABI).
 */
typedef struct modhost_dl_info {
    const char *dli_fname; /* file name of the object containing the address */
    void *dli_fbase;       /* its load address */
    const char *dli_sname; /* nearest symbol's name, or NULL */
    void *dli_saddr;       /* nearest symbol's address, or NULL */
} modhost_dl_info;

enum { MODHOST_RTLD_DL_LINKMAP = 2, MODHOST_RTLD_DI_LINKMAP = 2 };

extern int modhost_dladdr1(const void *address, modhost_dl_info *info, void **extra, int flags) __asm__("dladdr1");
extern int modhost_dlinfo(void *handle, int request, void *arg) __asm__("dlinfo");

/*
 * Which loaded object defines the symbol at `address`: its link map (the same pointer
 * modhost_handle_link_map gives for a dlopen handle) and its file name as the dynamic
 * loader recorded it. Returns 0 when no loaded object contains the address.
 */
static inline int modhost_symbol_origin(const void *address, const void **link_map, const char **file_name) {
    modhost_dl_info info;
    void *map = NULL;
    if (modhost_dladdr1(address, &info, &map, MODHOST_RTLD_DL_LINKMAP) == 0) return 0;
    *link_map = map;
    *file_name = info.dli_fname;
    return 1;
}

/* The link map of a dlopen handle, or NULL. */
static inline const void *modhost_handle_link_map(void *handle) {
    void *map = NULL;
    if (modhost_dlinfo(handle, MODHOST_RTLD_DI_LINKMAP, &map) != 0) return NULL;
    return map;
}

#endif /* MODHOST_CFFI_SHIM_H */
