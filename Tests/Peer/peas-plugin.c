/*
 * peas-plugin.c: the libpeas side of make bench's peer plugins, a C libpeas 1.34 plugin
 * doing the same trivial work as modhost-plugin.c: a GObject implementing PeasActivatable.
 * Compiled once per generated plugin with -DPEER_MODULE='"peer00001"', the Module= of its
 * PEER_MODULE.plugin key file (libpeas loads libPEER_MODULE.so).
 *
 * activate (the host's init + start) counts two events, update_state (one dispatched call)
 * one; activate and deactivate also send the clock reading (peer-plugin.h).
 */
#include <libpeas/peas.h>

#include "peer-plugin.h"

typedef struct {
    GObject parent;
    GObject *object;
} PeerExtension;

typedef struct {
    GObjectClass parent_class;
} PeerExtensionClass;

enum { PROP_0, PROP_OBJECT };

static void activate(PeasActivatable *activatable) {
    (void)activatable;
    peer_events += 2;
    peer_clock("start", PEER_MODULE);
}

static void deactivate(PeasActivatable *activatable) {
    (void)activatable;
    peer_events++;
    peer_clock("stop", PEER_MODULE);
}

static void update_state(PeasActivatable *activatable) {
    (void)activatable;
    peer_events++;
}

/* PeasActivatable's construct-only "object" property: the object the host extends. */
static void set_property(GObject *object, guint id, const GValue *value, GParamSpec *spec) {
    if (id == PROP_OBJECT) ((PeerExtension *)object)->object = g_value_get_object(value);
    else G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, spec);
}

static void get_property(GObject *object, guint id, GValue *value, GParamSpec *spec) {
    if (id == PROP_OBJECT) g_value_set_object(value, ((PeerExtension *)object)->object);
    else G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, spec);
}

static void class_init(gpointer klass, gpointer data) {
    (void)data;
    GObjectClass *object_class = klass;
    object_class->set_property = set_property;
    object_class->get_property = get_property;
    g_object_class_override_property(object_class, PROP_OBJECT, "object");
}

static void activatable_init(gpointer iface, gpointer data) {
    (void)data;
    PeasActivatableInterface *activatable = iface;
    activatable->activate = activate;
    activatable->deactivate = deactivate;
    activatable->update_state = update_state;
}

G_MODULE_EXPORT void peas_register_types(PeasObjectModule *module) {
    static const GTypeInfo type_info = {
        .class_size = sizeof(PeerExtensionClass), .class_init = class_init, .instance_size = sizeof(PeerExtension),
    };
    static const GInterfaceInfo activatable_info = {.interface_init = activatable_init};
    GType type =
        g_type_module_register_type(G_TYPE_MODULE(module), G_TYPE_OBJECT, "PeerExtension_" PEER_MODULE, &type_info, 0);
    g_type_module_add_interface(G_TYPE_MODULE(module), type, PEAS_TYPE_ACTIVATABLE, &activatable_info);
    peas_object_module_register_extension_type(module, PEAS_TYPE_ACTIVATABLE, type);
}
