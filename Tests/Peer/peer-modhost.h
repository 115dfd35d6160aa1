/*
 * peer-modhost.h: what the C hosts of ModuleHost plugins (peer-bare-host, peer-floor-host)
 * share: the host services they give every module (warnings and errors to stderr,
 * notifications dropped, no module known by name) and the list of running modules.
 */
#ifndef PEER_MODHOST_H
#define PEER_MODHOST_H

#include <stdbool.h>
#include <stdio.h>

#include <modulehost.h>

static void peer_host_log(int32_t level, const char *message) {
    if (level >= MODHOST_LOG_WARNING) fprintf(stderr, "plugin log: %s\n", message);
}
static void peer_host_post_notification(const char *name, const char *payload_json) { (void)name, (void)payload_json; }
static bool peer_host_has_module(const char *name) { (void)name; return false; }

static const modhost_host_api peer_host_api = {
    .struct_size = sizeof(modhost_host_api), .abi_minor = MODHOST_ABI_MINOR,
    .log = peer_host_log, .post_notification = peer_host_post_notification, .has_module = peer_host_has_module,
};

typedef struct {
    const modhost_module *module;
    void *instance;
} running_module;

static running_module *modules;
static size_t module_count;

/* One event to every module, in order. */
static void peer_send_to_all(const char *event) {
    for (size_t index = 0; index < module_count; index++) modules[index].module->handle_event(modules[index].instance, event, NULL);
}

#endif
