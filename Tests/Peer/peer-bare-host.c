/*
 * peer-bare-host: the least a C program must do to run ModuleHost's C plugins, the floor
 * make bench's peer rows compare modhostd with. No checks, no private copies, no threads.
 *
 *   peer-bare-host DIR                    start every plugin of DIR, send READY=1 to
 *                                         NOTIFY_SOCKET, run until SIGTERM
 *   peer-bare-host --dispatch ROUNDS DIR  start them, then time ROUNDS rounds of one direct
 *                                         handle_event call ("tick") on every module; print
 *                                         nanoseconds per module per call, and exit
 *
 * Starting a plugin: dlopen(RTLD_NOW) and dlsym of its entry point, in file name order; the
 * entry point, each module's create, then "init" to every module and "start" to every module.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdbool.h>

#include "peer-host.h"
#include "peer-modhost.h"

static int is_plugin(const struct dirent *entry) {
    size_t length = strlen(entry->d_name);
    return entry->d_name[0] != '.' && length > 3 && strcmp(entry->d_name + length - 3, ".so") == 0;
}

static void start_plugins(const char *directory) {
    struct dirent **names;
    int count = scandir(directory, &names, is_plugin, alphasort);
    if (count < 0) {
        perror(directory);
        exit(1);
    }
    for (int index = 0; index < count; index++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", directory, names[index]->d_name);
        void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        modhost_plugin_entry_fn entry = handle ? (modhost_plugin_entry_fn)dlsym(handle, MODHOST_ENTRY_SYMBOL) : NULL;
        const modhost_plugin *plugin = entry ? entry() : NULL;
        if (plugin == NULL) {
            fprintf(stderr, "peer-bare-host: cannot load %s: %s\n", path, handle ? "no plugin" : dlerror());
            exit(1);
        }
        modules = realloc(modules, (module_count + plugin->module_count) * sizeof *modules);
        for (uint32_t m = 0; m < plugin->module_count; m++) {
            const modhost_module *module = &plugin->modules[m];
            modules[module_count++] = (running_module){module, module->create(&peer_host_api, "{}")};
        }
        free(names[index]);
    }
    free(names);
    peer_send_to_all("init");
    peer_send_to_all("start");
}

int main(int argc, char **argv) {
    long rounds = 0;
    if (argc == 4 && strcmp(argv[1], "--dispatch") == 0) {
        rounds = atol(argv[2]);
    } else if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: peer-bare-host [--dispatch ROUNDS] DIR\n");
        return 64;
    }
    start_plugins(argv[argc - 1]);

    if (rounds > 0) {
        if (module_count == 0) {
            fprintf(stderr, "peer-bare-host: no module to dispatch to\n");
            return 1;
        }
        uint64_t start = peer_now_ns();
        for (long round = 0; round < rounds; round++) peer_send_to_all("tick");
        printf("%.3f\n", (double)(peer_now_ns() - start) / (double)rounds / (double)module_count);
        return 0;
    }

    sigset_t terminate;
    sigemptyset(&terminate);
    sigaddset(&terminate, SIGTERM);
    sigprocmask(SIG_BLOCK, &terminate, NULL);
    peer_notify_ready();
    int signal;
    sigwait(&terminate, &signal);
    return 0;
}
