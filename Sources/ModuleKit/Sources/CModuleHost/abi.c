#include "modulehost.h"

int modhost_abi_compatible(const modhost_plugin *plugin) {
    /* Each field is read only when the plugin's struct_size holds it. Fields up to and
     * including `modules` exist since 1.0; a plugin of a newer minor is not compatible. */
    if (plugin->struct_size < offsetof(modhost_plugin, abi_minor) + sizeof(plugin->abi_minor)) return 0;
    size_t minimum = offsetof(modhost_plugin, modules) + sizeof(plugin->modules);
    return plugin->abi_major == MODHOST_ABI_MAJOR && plugin->abi_minor <= MODHOST_ABI_MINOR
        && plugin->struct_size >= minimum && plugin->struct_size <= sizeof(modhost_plugin);
}
