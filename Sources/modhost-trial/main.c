/*
 * modhost-trial: loads one plugin in a short-lived process, so that a plugin which
 * crashes on load never touches the daemon. modhostd runs it for every plugin that
 * arrives while it runs, before loading the plugin itself.
 *
 *   modhost-trial [--preload LIBRARY]... FILE PLUGIN_NAME
 *
 * It dlopens every --preload library (the SDK, the plugin's dependencies), then FILE with
 * RTLD_NOW, finds the entry symbol in FILE itself, calls it and checks the descriptor's ABI
 * and plugin name. Exit 0: it loaded (prints "ok MODULES"). Exit 1: it was refused (prints
 * one line saying why). Death by a signal: it crashed. Exit 64: usage error.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "modulehost.h"

static int refuse(const char *what, const char *detail) {
    printf("%s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    return 1;
}

int main(int argc, char **argv) {
    int index = 1;
    while (index + 1 < argc && strcmp(argv[index], "--preload") == 0) {
        if (dlopen(argv[index + 1], RTLD_NOW | RTLD_GLOBAL) == NULL) return refuse("cannot preload a dependency", dlerror());
        index += 2;
    }
    if (argc - index != 2) {
        fprintf(stderr, "usage: modhost-trial [--preload LIBRARY]... FILE PLUGIN_NAME\n");
        return 64;
    }
    const char *file = argv[index], *name = argv[index + 1];
    void *handle = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) return refuse("dlopen failed", dlerror());
    void *entry = dlsym(handle, MODHOST_ENTRY_SYMBOL);
    if (entry == NULL) return refuse("the file does not export " MODHOST_ENTRY_SYMBOL, NULL);
    Dl_info info;
    if (dladdr(entry, &info) == 0 || info.dli_fname == NULL || strcmp(info.dli_fname, file) != 0)
        return refuse(MODHOST_ENTRY_SYMBOL " resolves from another file", info.dli_fname);
    const modhost_plugin *plugin = ((modhost_plugin_entry_fn)entry)();
    if (plugin == NULL) return refuse(MODHOST_ENTRY_SYMBOL " returned NULL", NULL);
    if (plugin->abi_major != MODHOST_ABI_MAJOR) return refuse("the descriptor has another ABI major version", NULL);
    if (plugin->name == NULL || strcmp(plugin->name, name) != 0) return refuse("the descriptor names another plugin", plugin->name);
    printf("ok %u\n", plugin->module_count);
    return 0;
}
