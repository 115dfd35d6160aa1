/*
 * peer-floor-host: the least a C program must do to start ModuleHost's C plugins while
 * keeping the promises modhostd keeps at a start, the floor make bench's
 * peer.start_to_ready_vs_floor rows compare modhostd with.
 *
 *   peer-floor-host STATE DIR   start every plugin of DIR, keeping the in-flight record
 *                               in the directory STATE, send READY=1 to NOTIFY_SOCKET and
 *                               run until SIGTERM
 *
 * What it does for each plugin, in file name order, and why modhostd must too:
 *   - open without following a symlink, fstat: a regular file, owned by root or this
 *     user, not writable by group or others (and the same of DIR, once);
 *   - read the whole file once (bounded to 64 MiB): the bytes checked are the bytes
 *     loaded, and they are hashed (FNV-1a, as the crash guard keys its records);
 *   - check the ELF header, every program header and section header inside the file
 *     (overflow-checked), no interpreter, the .modhost.manifest section present, and the
 *     entry symbol defined in .dynsym while no ModuleKit symbol is (the ownership check);
 *     the manifest's JSON is not parsed, so the floor is lower than the work required;
 *   - copy the bytes into a sealed memory file and dlopen it as /proc/self/fd/N, so that
 *     an overwrite of the plugin file cannot change the code that runs;
 *   - register the image with the crash recorder modhostd uses (crash_recorder.c, linked
 *     in), with the record text it would write;
 *   - write the in-flight record before and blank it after each phase that reads a
 *     plugin's bytes or runs its code: validation and load (with create) per plugin, init
 *     and start once for all (the recorder names the plugin whose code crashed);
 *   - run plugin code (dlopen with its constructors, the entry point and create; then
 *     init to every module, then start to every module) on a second thread, the caller
 *     waiting with a deadline, so that a hung plugin could not wedge the host: one
 *     hand-over per plugin, one for all inits and one for all starts.
 * No logging, no configuration, no control socket, no Swift runtime.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "crash_recorder.h"
#include "peer-host.h"
#include "peer-modhost.h"

enum { MAX_FILE = 64 << 20, DEADLINE_SECONDS = 5 };

static int record_fd = -1;

static void fail(const char *path, const char *problem) {
    fprintf(stderr, "peer-floor-host: %s: %s\n", path, problem);
    exit(1);
}

/* The in-flight record: written before a phase, blanked after it. */
static size_t record_length;
static void begin(const char *path, const char *phase, uint64_t hash) {
    char text[4096 + 128];
    int length = snprintf(text, sizeof text, "{\"file\":\"%s\",\"hash\":\"%016llx\",\"phase\":\"%s\"}", path,
                          (unsigned long long)hash, phase);
    if (length < 0 || (size_t)length >= sizeof text) fail(path, "record too long");
    if (pwrite(record_fd, text, (size_t)length, 0) != length) fail(path, "cannot write the in-flight record");
    record_length = (size_t)length;
}
static void end(void) {
    static const char blank[4096 + 128] = {[0 ... 4096 + 127] = ' '};
    if (pwrite(record_fd, blank, record_length, 0) != (ssize_t)record_length) fail("record", "cannot blank it");
}

/* A range [offset, offset + size) inside a file of `length` bytes, without overflow. */
static bool inside(uint64_t offset, uint64_t size, uint64_t length) { return offset <= length && size <= length - offset; }

/* The checks on the bytes before dlopen. */
static void check_elf(const char *path, const unsigned char *bytes, uint64_t length) {
    if (length < sizeof(Elf64_Ehdr)) fail(path, "shorter than an ELF header");
    const Elf64_Ehdr *header = (const Elf64_Ehdr *)bytes;
    if (memcmp(header->e_ident, ELFMAG, SELFMAG) != 0 || header->e_ident[EI_CLASS] != ELFCLASS64 ||
        header->e_ident[EI_DATA] != ELFDATA2LSB || header->e_type != ET_DYN || header->e_machine != EM_X86_64)
        fail(path, "not a 64-bit little-endian x86-64 shared object");
    if (header->e_phentsize != sizeof(Elf64_Phdr) || !inside(header->e_phoff, (uint64_t)header->e_phnum * sizeof(Elf64_Phdr), length))
        fail(path, "program headers out of the file");
    const Elf64_Phdr *segments = (const Elf64_Phdr *)(bytes + header->e_phoff);
    for (int i = 0; i < header->e_phnum; i++) {
        if (segments[i].p_type == PT_INTERP) fail(path, "an executable");
        if (segments[i].p_type == PT_LOAD && !inside(segments[i].p_offset, segments[i].p_filesz, length))
            fail(path, "a loadable segment past the end");
    }
    if (header->e_shentsize != sizeof(Elf64_Shdr) || !inside(header->e_shoff, (uint64_t)header->e_shnum * sizeof(Elf64_Shdr), length) ||
        header->e_shstrndx >= header->e_shnum)
        fail(path, "section headers out of the file");
    const Elf64_Shdr *sections = (const Elf64_Shdr *)(bytes + header->e_shoff);
    const Elf64_Shdr *names = &sections[header->e_shstrndx], *symbols = NULL, *manifest = NULL;
    for (int i = 0; i < header->e_shnum; i++) {
        if (!inside(sections[i].sh_offset, sections[i].sh_type == SHT_NOBITS ? 0 : sections[i].sh_size, length) ||
            !inside(names->sh_offset, names->sh_size, length) || sections[i].sh_name >= names->sh_size)
            fail(path, "a section out of the file");
        const char *name = (const char *)bytes + names->sh_offset + sections[i].sh_name;
        if (memchr(name, 0, names->sh_size - sections[i].sh_name) == NULL) fail(path, "a section name without its end");
        if (sections[i].sh_type == SHT_DYNSYM) symbols = &sections[i];
        if (strcmp(name, ".modhost.manifest") == 0 && sections[i].sh_size > 0) manifest = &sections[i];
    }
    if (manifest == NULL) fail(path, "no .modhost.manifest");
    if (symbols == NULL || symbols->sh_link >= header->e_shnum || symbols->sh_entsize != sizeof(Elf64_Sym)) fail(path, "no .dynsym");
    const Elf64_Shdr *strings = &sections[symbols->sh_link];
    bool entry = false;
    for (uint64_t i = 1; i < symbols->sh_size / sizeof(Elf64_Sym); i++) {
        const Elf64_Sym *symbol = (const Elf64_Sym *)(bytes + symbols->sh_offset) + i;
        if (symbol->st_shndx == SHN_UNDEF) continue;
        if (symbol->st_name >= strings->sh_size) fail(path, "a symbol name out of .dynstr");
        const char *name = (const char *)bytes + strings->sh_offset + symbol->st_name;
        if (memchr(name, 0, strings->sh_size - symbol->st_name) == NULL) fail(path, "a symbol name without its end");
        if (strcmp(name, MODHOST_ENTRY_SYMBOL) == 0) entry = true;
        if (strncmp(name, "$s9ModuleKit", 12) == 0) fail(path, "defines a ModuleKit symbol");
    }
    if (!entry) fail(path, "no entry symbol");
}

static void check_owner(const char *path, const struct stat *status) {
    if (status->st_mode & 022) fail(path, "writable by group or others");
    if (status->st_uid != 0 && status->st_uid != geteuid()) fail(path, "owned by another user");
}

/* The thread plugin code runs on, and the caller's deadline-bounded wait for it. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed;
static void (*job)(void *);
static void *job_argument;
static bool job_done = true;

static void *plugin_thread(void *unused) {
    (void)unused;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (job_done) pthread_cond_wait(&changed, &lock);
        pthread_mutex_unlock(&lock);
        job(job_argument);
        pthread_mutex_lock(&lock);
        job_done = true;
        pthread_cond_broadcast(&changed);
    }
    return NULL;
}

static void run(void (*work)(void *), void *argument, const char *what) {
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += DEADLINE_SECONDS;
    pthread_mutex_lock(&lock);
    job = work, job_argument = argument, job_done = false;
    pthread_cond_broadcast(&changed);
    while (!job_done)
        if (pthread_cond_timedwait(&changed, &lock, &deadline) == ETIMEDOUT) fail(what, "plugin code passed its deadline");
    pthread_mutex_unlock(&lock);
}

typedef struct {
    const char *path, *image;
    const modhost_plugin *plugin;
    void *handle;
    /* Why the load failed; dlerror's text is the loading thread's own. */
    const char *problem;
} loading;

static void load(void *argument) {
    loading *load = argument;
    load->handle = dlopen(load->image, RTLD_NOW | RTLD_LOCAL);
    modhost_plugin_entry_fn entry = load->handle ? (modhost_plugin_entry_fn)dlsym(load->handle, MODHOST_ENTRY_SYMBOL) : NULL;
    load->plugin = entry ? entry() : NULL;
    if (load->plugin == NULL) {
        const char *error = dlerror();
        load->problem = error ? strdup(error) : entry ? "the entry point returned NULL" : "no entry point";
        return;
    }
    running_module *grown = realloc(modules, (module_count + load->plugin->module_count) * sizeof *modules);
    if (grown == NULL) fail(load->path, "out of memory");
    modules = grown;
    for (uint32_t m = 0; m < load->plugin->module_count; m++) {
        const modhost_module *module = &load->plugin->modules[m];
        modules[module_count++] = (running_module){module, module->create(&peer_host_api, "{}")};
    }
}

static void send_to_all(void *event) { peer_send_to_all(event); }

static int is_plugin(const struct dirent *entry) {
    size_t length = strlen(entry->d_name);
    return entry->d_name[0] != '.' && length > 3 && strcmp(entry->d_name + length - 3, ".so") == 0;
}

static void start_plugins(const char *directory) {
    struct stat status;
    if (stat(directory, &status) != 0) fail(directory, strerror(errno));
    check_owner(directory, &status);
    struct dirent **names;
    int count = scandir(directory, &names, is_plugin, alphasort);
    if (count < 0) fail(directory, strerror(errno));
    unsigned char *bytes = malloc(MAX_FILE);
    if (bytes == NULL) fail(directory, "out of memory");
    for (int index = 0; index < count; index++) {
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", directory, names[index]->d_name) >= sizeof path) fail(directory, "path too long");
        begin(path, "validation", 0);
        int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &status) != 0) fail(path, strerror(errno));
        if (!S_ISREG(status.st_mode)) fail(path, "not a regular file");
        check_owner(path, &status);
        if (status.st_size > MAX_FILE) fail(path, "too large");
        uint64_t length = 0;
        while (length < (uint64_t)status.st_size) {
            ssize_t got = pread(fd, bytes + length, (size_t)status.st_size - length, (off_t)length);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) fail(path, "cannot read it");
            length += (uint64_t)got;
        }
        close(fd);
        uint64_t hash = 0xcbf29ce484222325u;
        for (uint64_t i = 0; i < length; i++) hash = (hash ^ bytes[i]) * 0x100000001b3u;
        check_elf(path, bytes, length);
        end();

        int image = memfd_create(names[index]->d_name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (image < 0 || write(image, bytes, length) != (ssize_t)length ||
            fcntl(image, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) != 0)
            fail(path, "cannot make its memory image");
        char image_path[64];
        snprintf(image_path, sizeof image_path, "/proc/self/fd/%d", image);
        loading plugin = {.path = path, .image = image_path};
        begin(path, "load", hash);
        run(load, &plugin, path);
        end();
        if (plugin.plugin == NULL) fail(path, plugin.problem);
        char record[4096 + 64];
        snprintf(record, sizeof record, "{\"file\":\"%s\",\"hash\":\"%016llx\"", path, (unsigned long long)hash);
        if (modhost_crash_recorder_add(plugin.handle, record) != 0) fail(path, "the crash recorder does not know the image");
        free(names[index]);
    }
    free(names);
    free(bytes);
    begin(directory, "init", 0);
    run(send_to_all, "init", "init");
    end();
    begin(directory, "start", 0);
    run(send_to_all, "start", "start");
    end();
}

int main(int argc, char **argv) {
    if (argc != 3 || argv[1][0] == '-') {
        fprintf(stderr, "usage: peer-floor-host STATE DIR\n");
        return 64;
    }
    char record[4096];
    if ((size_t)snprintf(record, sizeof record, "%s/inflight.json", argv[1]) >= sizeof record) fail(argv[1], "path too long");
    record_fd = open(record, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    int crashes = open(argv[1], O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
    if (record_fd < 0 || crashes < 0 || modhost_crash_recorder_install(crashes) != 0) fail(argv[1], strerror(errno));

    pthread_condattr_t clock;
    pthread_condattr_init(&clock);
    pthread_condattr_setclock(&clock, CLOCK_MONOTONIC);
    pthread_cond_init(&changed, &clock);
    sigset_t terminate;
    sigemptyset(&terminate);
    sigaddset(&terminate, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &terminate, NULL);
    pthread_t thread;
    if (pthread_create(&thread, NULL, plugin_thread, NULL) != 0) fail("thread", "cannot start it");
    start_plugins(argv[2]);
    peer_notify_ready();
    int signal;
    sigwait(&terminate, &signal);
    return 0;
}
