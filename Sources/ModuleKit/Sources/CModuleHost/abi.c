#include "modulehost.h"

int modhost_abi_compatible(const modhost_plugin *plugin) {
    /* Fields up to and including `modules` exist since 1.0. */
    size_t minimum = offsetof(modhost_plugin, modules) + sizeof(plugin->modules);
    return plugin->abi_major == MODHOST_ABI_MAJOR && plugin->struct_size >= minimum;
}
