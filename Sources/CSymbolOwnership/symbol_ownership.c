#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include "symbol_ownership.h"

modhost_symbol_owner_kind modhost_symbol_owner(void *handle, const void *address, const char **owner_file) {
    if (owner_file != NULL) *owner_file = NULL;
    struct dl_find_object found;
    if (address == NULL || _dl_find_object((void *)address, &found) != 0 || found.dlfo_link_map == NULL)
        return MODHOST_SYMBOL_OWNER_NONE;
    if (owner_file != NULL) *owner_file = found.dlfo_link_map->l_name;
    struct link_map *map = NULL;
    if (handle == NULL || dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == NULL) return MODHOST_SYMBOL_OWNER_OTHER;
    return found.dlfo_link_map == map ? MODHOST_SYMBOL_OWNER_SELF : MODHOST_SYMBOL_OWNER_OTHER;
}
