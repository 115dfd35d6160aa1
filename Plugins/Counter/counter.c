/* Counter: a ModuleHost plugin in plain C. It needs nothing but modulehost.h. */
#include <modulehost.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct counter {
    const modhost_host_api *host; /* valid until destroy */
    long events;
} counter;

static void *counter_create(const modhost_host_api *host, const char *config_json) {
    counter *self = calloc(1, sizeof *self);
    if (self == NULL) return NULL;
    self->host = host;
    char line[512];
    snprintf(line, sizeof line, "created with configuration %s", config_json);
    host->log(MODHOST_LOG_INFO, line);
    return self;
}

static void counter_handle_event(void *instance, const char *event, const char *payload_json) {
    counter *self = instance;
    self->events++;
    char line[512];
    snprintf(line, sizeof line, "event %s #%ld payload %s", event, self->events, payload_json ? payload_json : "none");
    self->host->log(MODHOST_LOG_INFO, line);
}

static void counter_destroy(void *instance) { free(instance); }

/* Besides lifecycle events, the module listens to the "tick" notification. */
static const char *const counter_notifications[] = {"tick", NULL};

static const modhost_module counter_modules[] = {{
    .struct_size = sizeof(modhost_module),
    .kind = MODHOST_MODULE_C,
    .name = "counter",
    .version = "1.0.0",
    .notifications = counter_notifications,
    .create = counter_create,
    .handle_event = counter_handle_event,
    .destroy = counter_destroy,
}};

static const modhost_plugin counter_plugin = MODHOST_PLUGIN_INIT("Counter", counter_modules);

MODHOST_PLUGIN_ENTRY { return &counter_plugin; }
