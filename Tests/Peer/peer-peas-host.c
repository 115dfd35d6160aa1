/*
 * peer-peas-host: a libpeas 1.34 host, written the way GNOME applications use libpeas, that
 * make bench's peer rows compare modhostd with on the same work.
 *
 *   peer-peas-host DIR                    load every plugin of DIR and activate each, send
 *                                         READY=1 to NOTIFY_SOCKET, run until SIGTERM
 *   peer-peas-host --watch DIR            the same, following DIR (below)
 *   peer-peas-host --dispatch ROUNDS DIR  load and activate, then time ROUNDS calls of
 *                                         peas_extension_set_foreach calling update_state on
 *                                         every extension; print nanoseconds per extension
 *                                         per call, and exit
 *
 * Loading: peas_engine_add_search_path, peas_engine_load_plugin for each plugin of
 * peas_engine_get_plugin_list, then one PeasExtensionSet of PeasActivatable whose
 * extensions are activated (peas_extension_set_foreach) and, later, activated and
 * deactivated as plugins are loaded and unloaded (extension-added, extension-removed).
 *
 * --watch: a GFileMonitor on DIR. Each plugin whose NAME.plugin or libNAME.so appears, is
 * renamed in or out, changes or disappears is unloaded if it is loaded (deactivate), then,
 * after peas_engine_rescan_plugins, loaded (activate) if both files are there. The changes
 * of one batch of monitor events are applied together, from an idle callback.
 * libpeas keeps a C plugin's module resident once loaded: a plugin loaded again runs the
 * code it was first loaded with.
 */
#include <glib-unix.h>
#include <libpeas/peas.h>

#include "peer-host.h"

static PeasEngine *engine;
static PeasExtensionSet *extensions;
static const char *directory;

static void activate(PeasExtensionSet *set, PeasPluginInfo *info, PeasExtension *extension, gpointer data) {
    (void)set, (void)info, (void)data;
    peas_activatable_activate(PEAS_ACTIVATABLE(extension));
}

static void deactivate(PeasExtensionSet *set, PeasPluginInfo *info, PeasExtension *extension, gpointer data) {
    (void)set, (void)info, (void)data;
    peas_activatable_deactivate(PEAS_ACTIVATABLE(extension));
}

static void update_state(PeasExtensionSet *set, PeasPluginInfo *info, PeasExtension *extension, gpointer data) {
    (void)set, (void)info, (void)data;
    peas_activatable_update_state(PEAS_ACTIVATABLE(extension));
}

static void count(PeasExtensionSet *set, PeasPluginInfo *info, PeasExtension *extension, gpointer data) {
    (void)set, (void)info, (void)extension;
    (*(guint *)data)++;
}

static void load_plugins(void) {
    engine = peas_engine_new();
    peas_engine_add_search_path(engine, directory, NULL);
    for (const GList *item = peas_engine_get_plugin_list(engine); item != NULL; item = item->next) {
        if (!peas_engine_load_plugin(engine, item->data)) {
            fprintf(stderr, "peer-peas-host: cannot load %s\n", peas_plugin_info_get_module_name(item->data));
            exit(1);
        }
    }
    extensions = peas_extension_set_new(engine, PEAS_TYPE_ACTIVATABLE, NULL);
    peas_extension_set_foreach(extensions, activate, NULL);
    g_signal_connect(extensions, "extension-added", G_CALLBACK(activate), NULL);
    g_signal_connect(extensions, "extension-removed", G_CALLBACK(deactivate), NULL);
}

/* --watch */

static GHashTable *changed; /* names of the plugins whose files changed */
static guint apply_source;

static gboolean has_files(const char *name) {
    char *info = g_strdup_printf("%s/%s.plugin", directory, name);
    char *module = g_strdup_printf("%s/lib%s.so", directory, name);
    gboolean both = g_file_test(info, G_FILE_TEST_EXISTS) && g_file_test(module, G_FILE_TEST_EXISTS);
    g_free(info), g_free(module);
    return both;
}

static gboolean apply_changes(gpointer data) {
    (void)data;
    GHashTableIter names;
    gpointer name;
    g_hash_table_iter_init(&names, changed);
    while (g_hash_table_iter_next(&names, &name, NULL)) {
        PeasPluginInfo *info = peas_engine_get_plugin_info(engine, name);
        if (info != NULL && peas_plugin_info_is_loaded(info)) peas_engine_unload_plugin(engine, info);
    }
    peas_engine_rescan_plugins(engine);
    g_hash_table_iter_init(&names, changed);
    while (g_hash_table_iter_next(&names, &name, NULL)) {
        PeasPluginInfo *info = peas_engine_get_plugin_info(engine, name);
        if (info != NULL && has_files(name) && !peas_engine_load_plugin(engine, info))
            fprintf(stderr, "peer-peas-host: cannot load %s\n", (char *)name);
    }
    g_hash_table_remove_all(changed);
    apply_source = 0;
    return G_SOURCE_REMOVE;
}

/* Notes the plugin a file of DIR belongs to: NAME.plugin or libNAME.so (not a dotfile). */
static void note(GFile *file) {
    char *base = g_file_get_basename(file);
    char *name = NULL;
    if (g_str_has_suffix(base, ".plugin")) name = g_strndup(base, strlen(base) - strlen(".plugin"));
    else if (g_str_has_prefix(base, "lib") && g_str_has_suffix(base, ".so"))
        name = g_strndup(base + strlen("lib"), strlen(base) - strlen("lib.so"));
    if (name != NULL && base[0] != '.') {
        g_hash_table_add(changed, name);
        if (apply_source == 0) apply_source = g_idle_add(apply_changes, NULL);
    } else {
        g_free(name);
    }
    g_free(base);
}

static void on_change(GFileMonitor *monitor, GFile *file, GFile *other, GFileMonitorEvent event, gpointer data) {
    (void)monitor, (void)data;
    switch (event) {
    case G_FILE_MONITOR_EVENT_CREATED:
    case G_FILE_MONITOR_EVENT_CHANGES_DONE_HINT:
    case G_FILE_MONITOR_EVENT_DELETED:
    case G_FILE_MONITOR_EVENT_MOVED_IN:
    case G_FILE_MONITOR_EVENT_MOVED_OUT:
    case G_FILE_MONITOR_EVENT_RENAMED:
        note(file);
        if (other != NULL) note(other);
        break;
    default:
        break;
    }
}

static GFileMonitor *watch(void) {
    GError *error = NULL;
    GFile *file = g_file_new_for_path(directory);
    GFileMonitor *monitor = g_file_monitor_directory(file, G_FILE_MONITOR_WATCH_MOVES, NULL, &error);
    if (monitor == NULL) {
        fprintf(stderr, "peer-peas-host: cannot watch %s: %s\n", directory, error->message);
        exit(1);
    }
    changed = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_signal_connect(monitor, "changed", G_CALLBACK(on_change), NULL);
    g_object_unref(file);
    return monitor;
}

static gboolean quit(gpointer loop) {
    g_main_loop_quit(loop);
    return G_SOURCE_REMOVE;
}

int main(int argc, char **argv) {
    long rounds = 0;
    gboolean watching = FALSE;
    if (argc == 4 && strcmp(argv[1], "--dispatch") == 0) rounds = atol(argv[2]);
    else if (argc == 3 && strcmp(argv[1], "--watch") == 0) watching = TRUE;
    else if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: peer-peas-host [--watch | --dispatch ROUNDS] DIR\n");
        return 64;
    }
    directory = argv[argc - 1];
    GFileMonitor *monitor = watching ? watch() : NULL;
    load_plugins();

    if (rounds > 0) {
        guint extension_count = 0;
        peas_extension_set_foreach(extensions, count, &extension_count);
        if (extension_count == 0) {
            fprintf(stderr, "peer-peas-host: no extension to dispatch to\n");
            return 1;
        }
        uint64_t start = peer_now_ns();
        for (long round = 0; round < rounds; round++) peas_extension_set_foreach(extensions, update_state, NULL);
        printf("%.3f\n", (double)(peer_now_ns() - start) / (double)rounds / (double)extension_count);
        return 0;
    }

    /* SIGTERM ends the main loop (unblocked: a parent may have left it blocked). */
    sigset_t terminate;
    sigemptyset(&terminate);
    sigaddset(&terminate, SIGTERM);
    sigprocmask(SIG_UNBLOCK, &terminate, NULL);
    GMainLoop *loop = g_main_loop_new(NULL, FALSE);
    g_unix_signal_add(SIGTERM, quit, loop);
    peer_notify_ready();
    g_main_loop_run(loop);
    g_clear_object(&monitor);
    return 0;
}
