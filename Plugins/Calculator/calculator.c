/* Calculator: a C plugin whose functions the host calls by name through libffi.
 * Each function below is listed with its signature in plugin.json's "exports" and marked
 * MODHOST_EXPORT, which keeps it visible under plugin.mk's -fvisibility=hidden. */
#include <modulehost.h>
#include <math.h>
#include <string.h>

MODHOST_EXPORT int32_t calc_add(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
MODHOST_EXPORT int64_t calc_mul64(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
MODHOST_EXPORT double calc_hypot(double a, double b) { return sqrt(a * a + b * b); }
MODHOST_EXPORT bool calc_is_even(uint32_t n) { return n % 2 == 0; }
MODHOST_EXPORT uint64_t calc_length(const char *text) { return text ? strlen(text) : 0; }

/* Adler-32 of a byte buffer: `buf` arrives as a pointer and a length. */
MODHOST_EXPORT uint32_t calc_checksum(const uint8_t *bytes, size_t length) {
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < length; i++) {
        a = (a + bytes[i]) % 65521;
        b = (b + a) % 65521;
    }
    return (b << 16) | a;
}

/* The module itself only reports that the functions are available. */
static void *calculator_create(const modhost_host_api *host, const char *config_json) {
    (void)config_json;
    host->log(MODHOST_LOG_INFO, "calculator functions available: calc_add, calc_mul64, calc_hypot, calc_is_even, calc_length, calc_checksum");
    return (void *)host;
}
static void calculator_handle_event(void *instance, const char *event, const char *payload_json) {
    (void)instance; (void)event; (void)payload_json;
}
static void calculator_destroy(void *instance) { (void)instance; }

static const modhost_module calculator_modules[] = {{
    .struct_size = sizeof(modhost_module),
    .kind = MODHOST_MODULE_C,
    .name = "calculator",
    .version = "1.0.0",
    .create = calculator_create,
    .handle_event = calculator_handle_event,
    .destroy = calculator_destroy,
}};

static const modhost_plugin calculator_plugin = MODHOST_PLUGIN_INIT("Calculator", calculator_modules);

MODHOST_PLUGIN_ENTRY { return &calculator_plugin; }
