/*
 * modhost-plugin.c: the ModuleHost side of make bench's peer plugins, one C module doing
 * the same trivial work as peas-plugin.c. Compiled once per generated plugin with
 * -DPEER_PLUGIN='"Peer00001"' (the plugin's name) and -DPEER_MODULE='"peer00001"' (its
 * module's); modhost-bench embeds the manifest with objcopy, as plugin.mk does.
 *
 * Every event counts ("init" and "start" at start, "tick" when dispatched); "start" and
 * "deinit" also send the clock reading (peer-plugin.h).
 */
#include <modulehost.h>

#include "peer-plugin.h"

static void *create(const modhost_host_api *host, const char *config_json) {
    (void)config_json;
    return (void *)host;
}

static void handle_event(void *instance, const char *event, const char *payload_json) {
    (void)instance, (void)payload_json;
    peer_events++;
    if (strcmp(event, "start") == 0) peer_clock("start", PEER_MODULE);
    else if (strcmp(event, "deinit") == 0) peer_clock("stop", PEER_MODULE);
}

static void destroy(void *instance) { (void)instance; }

static const modhost_module modules[] = {{
    .struct_size = sizeof(modhost_module), .kind = MODHOST_MODULE_C,
    .name = PEER_MODULE, .version = "1.0",
    .create = create, .handle_event = handle_event, .destroy = destroy,
}};
static const modhost_plugin plugin = MODHOST_PLUGIN_INIT(PEER_PLUGIN, modules);
MODHOST_PLUGIN_ENTRY { return &plugin; }
