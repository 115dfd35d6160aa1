/*
 * modulehost.h: the C ABI between the ModuleHost daemon and its plugins.
 *
 * A plugin is a shared object that exports one function, MODHOST_ENTRY_SYMBOL, returning a
 * description of the modules it provides. This header is the whole contract: a plugin
 * written in plain C includes it and nothing else from ModuleHost. docs/abi.md explains
 * ownership, threading and the versioning policy in prose; the comments below are the
 * normative summary.
 *
 * Versioning: MODHOST_ABI_MAJOR changes when a struct field is removed, reordered or
 * changes meaning, or when the entry symbol changes; the host refuses a plugin whose major
 * differs from its own. MODHOST_ABI_MINOR grows when fields are appended at the end of a
 * struct; every struct starts with `struct_size`, so a newer host reads only the fields an
 * older plugin knows and treats the rest as absent (NULL / 0).
 *
 * History: 1.0, the first version. 1.1 appended modhost_module.receive (with
 * modhost_event_kind): a C module may learn the kind of each event it receives.
 */
#ifndef MODULEHOST_H
#define MODULEHOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MODHOST_ABI_MAJOR 1
#define MODHOST_ABI_MINOR 1

/* The symbol every plugin exports; the _v1 suffix follows MODHOST_ABI_MAJOR. */
#define MODHOST_ENTRY_SYMBOL "modhost_plugin_entry_v1"
/* The ELF section holding the plugin's JSON manifest (added by plugin.mk). */
#define MODHOST_MANIFEST_SECTION ".modhost.manifest"

/* Nullability annotations are a clang feature; other compilers see nothing. */
#if defined(__has_feature)
#if __has_feature(nullability)
#define MODHOST_HAS_NULLABILITY 1
#endif
#endif
#ifndef MODHOST_HAS_NULLABILITY
#define _Nonnull
#define _Nullable
#endif

/* Log levels accepted by modhost_host_api.log. */
typedef enum modhost_log_level {
    MODHOST_LOG_DEBUG = 0,
    MODHOST_LOG_INFO = 1,
    MODHOST_LOG_WARNING = 2,
    MODHOST_LOG_ERROR = 3,
} modhost_log_level;

/* How the host creates a module. */
typedef enum modhost_module_kind {
    /* create / handle_event / destroy below are plain C functions. */
    MODHOST_MODULE_C = 1,
    /* swift_type is a value made by ModuleKit's PluginExport; C code never sets it. */
    MODHOST_MODULE_SWIFT = 2,
} modhost_module_kind;

/*
 * ABI 1.1: the kind of an event a module receives through modhost_module.receive. The host
 * passes only the kinds this header defines.
 */
typedef enum modhost_event_kind {
    /* From the host itself: "init", "start", "configurationChanged", "willUnload",
     * "willTerminate", "deinit". No custom event or notification ever carries these names. */
    MODHOST_EVENT_LIFECYCLE = 1,
    /* An event sent directly to modules (modhostctl send, a host application's
     * HostInstance.send), whether the module listens to its name or not. */
    MODHOST_EVENT_CUSTOM = 2,
    /* A notification the module listens to (listed in `notifications`), posted by a module
     * (post_notification), the host application or an operator (modhostctl post). */
    MODHOST_EVENT_NOTIFICATION = 3,
} modhost_event_kind;

/*
 * Services the host offers a C module. The host passes one table per module instance
 * to `create`; every function is bound to that module (log lines carry its name), so no
 * context argument is needed. The table and its functions stay valid until `destroy`
 * returns. All functions may be called from any thread.
 */
typedef struct modhost_host_api {
    uint32_t struct_size;
    uint32_t abi_minor;
    /* Log one line attributed to this module. `message` is copied before returning. */
    void (*_Nonnull log)(int32_t level, const char *_Nonnull message);
    /* Post a notification to every module of this host that listens to `name`.
     * Delivery is asynchronous, on the host's serial context. Both strings are copied;
     * payload_json may be NULL (no payload) or a JSON text. */
    void (*_Nonnull post_notification)(const char *_Nonnull name, const char *_Nullable payload_json);
    /* True when a module called `name` is currently running in this host. */
    bool (*_Nonnull has_module)(const char *_Nonnull name);
} modhost_host_api;

/*
 * One module a plugin provides. Descriptors and every string they point to are owned by
 * the plugin and must stay valid for the life of the process (static storage): the host
 * keeps pointers to them and never unloads a plugin.
 */
typedef struct modhost_module {
    uint32_t struct_size;              /* sizeof(modhost_module) as the plugin compiled it */
    uint32_t kind;                     /* a modhost_module_kind */
    const char *_Nonnull name;         /* unique within the host; must be listed in the manifest */
    const char *_Nonnull version;      /* free-form, e.g. "1.2.0" */
    /* NULL-terminated list of extra notification names the module listens to, or NULL. */
    const char *_Nullable const *_Nullable notifications;

    /* MODHOST_MODULE_C only. Create an instance. `config_json` is the module's
     * configuration object as JSON text ("{}" when none), valid only during the call.
     * Return an opaque instance pointer, or NULL to report failure (the module is
     * then refused with that reason). */
    void *_Nullable (*_Nullable create)(const modhost_host_api *_Nonnull host, const char *_Nonnull config_json);
    /* MODHOST_MODULE_C only (unless `receive` is set). Deliver an event: "init", "start", "deinit",
     * "configurationChanged" (payload: the new configuration), "willUnload",
     * "willTerminate", or a host-defined event or notification name. The strings are
     * valid only during the call; payload_json may be NULL. Called on the module
     * instance's own worker (a host thread for plugin code, not always the same one),
     * one call at a time, like create and destroy; calls
     * into different modules overlap only after one overran its deadline (docs/abi.md,
     * "Threading"). */
    void (*_Nullable handle_event)(void *_Nullable instance, const char *_Nonnull event, const char *_Nullable payload_json);
    /* MODHOST_MODULE_C only. Release the instance; called once, after "deinit". */
    void (*_Nullable destroy)(void *_Nullable instance);

    /* MODHOST_MODULE_SWIFT only: produced by ModuleKit, opaque to C. */
    const void *_Nullable swift_type;

    /* ABI 1.1. MODHOST_MODULE_C only, optional: handle_event with the kind of the event (a
     * modhost_event_kind) first. When set, the host calls it for every event instead of
     * handle_event, which may then be NULL; the same rules apply (strings valid during the
     * call, on the module's own worker, one call at a time). A plugin built against ABI
     * 1.0 has no such field: its handle_event gets every event, as before. */
    void (*_Nullable receive)(void *_Nullable instance, uint32_t kind, const char *_Nonnull event,
                              const char *_Nullable payload_json);
} modhost_module;

/* What the entry symbol returns. Static storage, like the module descriptors. */
typedef struct modhost_plugin {
    uint32_t struct_size;            /* sizeof(modhost_plugin) as the plugin compiled it */
    uint32_t abi_major;              /* MODHOST_ABI_MAJOR the plugin was compiled with */
    uint32_t abi_minor;              /* MODHOST_ABI_MINOR the plugin was compiled with */
    uint32_t module_count;           /* number of entries in `modules` */
    const char *_Nonnull name;       /* the plugin's name, equal to the manifest's */
    const modhost_module *_Nonnull modules;
} modhost_plugin;

/* Signature of MODHOST_ENTRY_SYMBOL. Called once per load, on the host's loader thread.
 * Return NULL to refuse loading. */
typedef const modhost_plugin *_Nullable (*modhost_plugin_entry_fn)(void);

/* Marks a function the host may find by name: one listed in plugin.json's "exports"
 * (docs/calling.md). plugin.mk compiles with -fvisibility=hidden, so a function without it
 * is left out of the dynamic symbol table, and plugin.mk stops with an error naming it:
 *     MODHOST_EXPORT int32_t calc_add(int32_t a, int32_t b) { return a + b; } */
#define MODHOST_EXPORT __attribute__((visibility("default")))

/* Declare the entry point in a C plugin:  MODHOST_PLUGIN_ENTRY { return &my_plugin; } */
#define MODHOST_PLUGIN_ENTRY \
    MODHOST_EXPORT const modhost_plugin *modhost_plugin_entry_v1(void); \
    MODHOST_EXPORT const modhost_plugin *modhost_plugin_entry_v1(void)

/* Initializer helpers so a C plugin writes no struct_size or ABI numbers by hand. */
#define MODHOST_PLUGIN_INIT(plugin_name, module_array) \
    { sizeof(modhost_plugin), MODHOST_ABI_MAJOR, MODHOST_ABI_MINOR, \
      (uint32_t)(sizeof(module_array) / sizeof((module_array)[0])), (plugin_name), (module_array) }

/* Host side: 1 when a plugin descriptor's ABI can be used by this header's host. */
int modhost_abi_compatible(const modhost_plugin *_Nonnull plugin);

#ifdef __cplusplus
}
#endif

#endif /* MODULEHOST_H */
