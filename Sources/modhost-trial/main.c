/*
 * modhost-trial: loads one plugin in a short-lived process, so that a plugin which
 * crashes on load never touches the daemon. modhostd runs it for every plugin that
 * arrives while it runs, before loading the plugin itself.
 *
 *   modhost-trial [--preload LIBRARY]... FILE PLUGIN_NAME
 *
 * It dlopens every --preload library (the SDK, the plugin's dependencies), then FILE with
 * RTLD_NOW, finds the entry symbol in FILE itself, calls it and checks the descriptor's ABI
 * and plugin name. Exit 0: it loaded; it prints "ok COUNT" and then the descriptor's module
 * names, one a line (while they fit in the verdict), which the daemon compares with the
 * manifest. Exit 1: it was refused; it prints one line "CAUSE: DETAIL", CAUSE one of
 * preload, dlopen, entry-missing, entry-foreign, entry-nowhere, entry-null, descriptor,
 * plugin-name (the daemon words the refusal and its fix, as its own loader does). Exit 3:
 * the load left a process behind, which was killed (one line). Death by a signal: it
 * crashed. Exit 64: usage error.
 *
 * The verdict goes to standard output and nothing else does: what the plugin's load-time
 * code prints to standard output goes to standard error. The loader leads its own
 * process group and is the subreaper of everything the plugin's load-time code forks: a
 * process still alive after the load (even one in a new session) is killed, and the
 * plugin refused, since loading it into the daemon would leave such a process there.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stddef.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "modulehost.h"
#include "symbol_ownership.h"

static int reply_fd = 1;
/* Below a pipe's capacity (64 KiB), so writing it never waits for the reader. */
static char verdict[16384];

static int refuse(const char *what, const char *detail) {
    snprintf(verdict, sizeof verdict, "%s%s%s", what, detail ? ": " : "", detail ? detail : "");
    return 1;
}

/* Kills every process left under this one (children, and orphans adopted as subreaper);
 * returns the first one's pid, or 0 when there was none. Once the exited children are
 * reaped, ECHILD means there is no child left: a descendant whose parent exited was
 * reparented here before that parent could be reaped, so nothing is left anywhere below,
 * and /proc need not be read (the common case, a plugin that starts no process). */
static pid_t kill_descendants(void) {
    pid_t first = 0, self = getpid();
    for (int round = 0; round < 100; round++) {
        pid_t reaped;
        while ((reaped = waitpid(-1, NULL, WNOHANG)) > 0) {}
        if (reaped < 0 && errno == ECHILD) break;
        int found = 0;
        DIR *proc = opendir("/proc");
        if (proc == NULL) return first;
        struct dirent *entry;
        while ((entry = readdir(proc)) != NULL) {
            char *end;
            long pid = strtol(entry->d_name, &end, 10);
            if (*end != '\0' || pid <= 0 || pid == self) continue;
            char path[64], text[512];
            snprintf(path, sizeof path, "/proc/%ld/stat", pid);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) continue;
            ssize_t length = read(fd, text, sizeof text - 1);
            close(fd);
            if (length <= 0) continue;
            text[length] = '\0';
            char *close_paren = strrchr(text, ')'), state;
            long parent;
            if (close_paren == NULL || sscanf(close_paren + 1, " %c %ld", &state, &parent) != 2 || parent != self) continue;
            if (state == 'Z') continue;
            if (first == 0) first = (pid_t)pid;
            kill((pid_t)pid, SIGKILL);
            found = 1;
        }
        closedir(proc);
        if (!found) break;
        while (waitpid(-1, NULL, 0) > 0) {}  /* the killed ones; their children come to us */
    }
    return first;
}

static int load(int argc, char **argv);

int main(int argc, char **argv) {
    /* The daemon starts it as a group leader already; this covers a manual run. */
    setpgid(0, 0);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    reply_fd = fcntl(1, F_DUPFD_CLOEXEC, 3);
    if (reply_fd < 0) reply_fd = 1;
    else dup2(2, 1);
    int status = load(argc, argv);
    if (status == 64) return status;
    pid_t leftover = kill_descendants();
    if (leftover != 0) {
        snprintf(verdict, sizeof verdict,
                 "its load-time code started a process that outlived the load (pid %d, killed): a plugin must not start processes when it is loaded",
                 (int)leftover);
        status = 3; /* the daemon's TrialProcess.leftoverProcessStatus */
    }
    dprintf(reply_fd, "%s\n", verdict);
    return status;
}

static int load(int argc, char **argv) {
    int index = 1;
    while (index + 1 < argc && strcmp(argv[index], "--preload") == 0) {
        if (dlopen(argv[index + 1], RTLD_NOW | RTLD_GLOBAL) == NULL) return refuse("preload", dlerror());
        index += 2;
    }
    if (argc - index != 2) {
        fprintf(stderr, "usage: modhost-trial [--preload LIBRARY]... FILE PLUGIN_NAME\n");
        return 64;
    }
    const char *file = argv[index], *name = argv[index + 1];
    void *handle = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) return refuse("dlopen", dlerror());
    void *entry = dlsym(handle, MODHOST_ENTRY_SYMBOL);
    if (entry == NULL) return refuse("entry-missing", MODHOST_ENTRY_SYMBOL);
    const char *owner = NULL;
    switch (modhost_symbol_owner(handle, entry, &owner)) {
    case MODHOST_SYMBOL_OWNER_SELF: break;
    case MODHOST_SYMBOL_OWNER_OTHER: return refuse("entry-foreign", owner ? owner : "another file");
    default: return refuse("entry-nowhere", MODHOST_ENTRY_SYMBOL);
    }
    const modhost_plugin *plugin = ((modhost_plugin_entry_fn)entry)();
    if (plugin == NULL) return refuse("entry-null", MODHOST_ENTRY_SYMBOL);
    /* Only fields within the struct_size the plugin compiled in are read (docs/abi.md,
     * "Versioning policy"); the daemon's loader then checks the descriptor in full. */
    if (plugin->struct_size < offsetof(modhost_plugin, modules) + sizeof plugin->modules) {
        snprintf(verdict, sizeof verdict, "descriptor: the plugin descriptor's struct_size is %u bytes, smaller than ABI %d.0's", plugin->struct_size, MODHOST_ABI_MAJOR);
        return 1;
    }
    if (plugin->abi_major != MODHOST_ABI_MAJOR) {
        snprintf(verdict, sizeof verdict, "descriptor: the plugin descriptor has ABI major version %u, this host %d", plugin->abi_major, MODHOST_ABI_MAJOR);
        return 1;
    }
    if (plugin->name == NULL) return refuse("descriptor", "the plugin descriptor has no name");
    if (strcmp(plugin->name, name) != 0) return refuse("plugin-name", plugin->name);
    /* The module names, for the daemon to compare with the manifest: as many whole lines as
     * fit (the count says whether all did). A module's struct_size bounds what is read. */
    size_t used = (size_t)snprintf(verdict, sizeof verdict, "ok %u", plugin->module_count);
    const unsigned char *module = (const unsigned char *)plugin->modules;
    /* The first descriptor's struct_size is the array's stride, as the daemon reads it; one
     * it would refuse stops the list here (the daemon's loader then says why). */
    uint32_t stride = module != NULL && plugin->module_count > 0 ? ((const modhost_module *)module)->struct_size : 0;
    if (stride < offsetof(modhost_module, name) + sizeof(const char *) || stride > sizeof(modhost_module)) module = NULL;
    /* Every module's version as the daemon's loader requires it (VersionText: at most 64
     * bytes), before the list, which may stop when the verdict is full. */
    for (uint32_t i = 0; module != NULL && i < plugin->module_count && stride >= offsetof(modhost_module, version) + sizeof(const char *); i++) {
        const modhost_module *described = (const modhost_module *)(module + (size_t)i * stride);
        if (described->name == NULL) break;
        if (described->version == NULL || strnlen(described->version, 65) > 64) {
            snprintf(verdict, sizeof verdict, "descriptor: module %.64s's version is %s", described->name,
                     described->version == NULL ? "NULL" : "longer than 64 bytes (versions are at most 64 bytes)");
            return 1;
        }
    }
    for (uint32_t i = 0; module != NULL && i < plugin->module_count; i++, module += stride) {
        const char *module_name = ((const modhost_module *)module)->name;
        if (module_name == NULL) break;
        size_t length = strnlen(module_name, 256);
        if (used + 1 + length + 1 > sizeof verdict) break;
        verdict[used++] = '\n';
        memcpy(verdict + used, module_name, length);
        used += length;
        verdict[used] = '\0';
    }
    return 0;
}
