#ifndef MODHOST_SYMBOL_OWNERSHIP_H
#define MODHOST_SYMBOL_OWNERSHIP_H
/*
 * The one rule for "is this symbol a plugin's own?", shared by the loader (ModuleHost),
 * calls by name (PluginCall) and the trial loader (modhost-trial, plain C).
 *
 * dlsym(handle, name) also searches the handle's dependencies, so a plugin that lacks a
 * symbol can borrow another library's. A symbol is the plugin's own when the object that
 * contains its address (asked of the dynamic loader with _dl_find_object) is the object
 * `handle` names (its link map, from dlinfo). Objects are compared, never file names: two
 * paths can name one file, and one file can be mapped twice.
 *
 * Needs only libc (glibc 2.35 or later). Safe to call from any thread.
 */

/* What modhost_symbol_owner found. */
typedef enum modhost_symbol_owner_kind {
    /* No loaded object contains the address (an absolute symbol, or a bad address). */
    MODHOST_SYMBOL_OWNER_NONE = -1,
    /* Another loaded object contains it: the symbol comes from a dependency. */
    MODHOST_SYMBOL_OWNER_OTHER = 0,
    /* The object `handle` names contains it. */
    MODHOST_SYMBOL_OWNER_SELF = 1,
} modhost_symbol_owner_kind;

/* Which object defines the code or data at `address`, relative to `handle` (from dlopen).
 * When `owner_file` is not NULL it receives the containing object's name as the dynamic
 * loader recorded it (the path it was opened by; "" for the main program), or NULL for
 * MODHOST_SYMBOL_OWNER_NONE. The string belongs to the dynamic loader and stays valid while
 * the object is loaded (plugins never are unloaded). */
modhost_symbol_owner_kind modhost_symbol_owner(void *handle, const void *address, const char **owner_file);

#endif
