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

#endif /* MODHOST_CFFI_SHIM_H */
