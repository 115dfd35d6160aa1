#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stddef.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
#include "dynamic_loader.h"

const char *modhost_object_containing(const void *address) {
    Dl_info info;
    if (dladdr(address, &info) == 0) return NULL;
    return info.dli_fname;
}

struct build_id_search {
    const void *address;
    uint8_t *out;
    size_t capacity;
    size_t length;
};

static int find_build_id(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct build_id_search *search = data;
    uintptr_t address = (uintptr_t)search->address;
    int contains = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *segment = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + segment->p_vaddr;
        if (segment->p_type == PT_LOAD && address >= start && address < start + segment->p_memsz) contains = 1;
    }
    if (!contains) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *segment = &info->dlpi_phdr[i];
        if (segment->p_type != PT_NOTE) continue;
        const uint8_t *note = (const uint8_t *)(info->dlpi_addr + segment->p_vaddr);
        const uint8_t *end = note + segment->p_memsz;
        while (note + sizeof(ElfW(Nhdr)) <= end) {
            const ElfW(Nhdr) *header = (const ElfW(Nhdr) *)note;
            const uint8_t *name = note + sizeof(ElfW(Nhdr));
            const uint8_t *desc = name + ((header->n_namesz + 3) & ~3u);
            if (desc + header->n_descsz > end) break;
            if (header->n_type == NT_GNU_BUILD_ID && header->n_namesz == 4 && memcmp(name, "GNU", 4) == 0) {
                size_t length = header->n_descsz < search->capacity ? header->n_descsz : search->capacity;
                memcpy(search->out, desc, length);
                search->length = length;
                return 1;
            }
            note = desc + ((header->n_descsz + 3) & ~3u);
        }
    }
    return 1;  /* the object has no build id */
}

size_t modhost_build_id_of_object_containing(const void *address, uint8_t *out, size_t capacity) {
    struct build_id_search search = {address, out, capacity, 0};
    dl_iterate_phdr(find_build_id, &search);
    return search.length;
}

const char *modhost_fast_object_containing(const void *address) {
    struct dl_find_object found;
    if (_dl_find_object((void *)address, &found) != 0 || found.dlfo_link_map == NULL) return NULL;
    return found.dlfo_link_map->l_name;
}

int modhost_address_in_object(const void *address, void *handle) {
    struct dl_find_object found;
    if (_dl_find_object((void *)address, &found) != 0) return -1;
    /* In glibc a dlopen handle is the object's link_map. */
    return found.dlfo_link_map == (struct link_map *)handle ? 1 : 0;
}

int modhost_pipe_cloexec(int fds[2]) { return pipe2(fds, O_CLOEXEC); }
