#ifndef MODHOST_CRASH_RECORDER_H
#define MODHOST_CRASH_RECORDER_H
/* Attributing a fatal signal, or a call of exit(), to the plugin whose code was running.
 *
 * The daemon tells the recorder about every plugin image it loads, with the record text
 * to write if that plugin brings the process down (prepared in advance, so that nothing
 * has to be allocated or formatted after the crash). The signal handler finds the plugin
 * from the interrupted instruction, or else from the nearest return address on the
 * crashing thread's stack that lies in a plugin's code, writes that plugin's record to a
 * file opened in advance, puts back the handler that was there before (the Swift
 * runtime's backtracer, or the default action) and lets the signal kill the process.
 * Everything the handler does is async-signal-safe: reads of memory the recorder owns,
 * process_vm_readv, clock_gettime, pwrite, sigaction. */

#include <stddef.h>

/* Installs the handler for SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT, writing to `fd`
 * (kept open; the record is written at offset 0). Gives the calling thread an alternate
 * signal stack when it has none, so a stack overflow can be recorded too. Returns 0, or
 * -1 with errno set. Calling it again only replaces the file. */
int modhost_crash_recorder_install(int fd);

/* Remembers a loaded plugin image: `handle` from dlopen, and the record text for it: a
 * JSON object without its closing brace (the recorder adds the phase, the cause and the
 * time). The text is copied. Images are never forgotten (they are never unmapped, and a
 * retired plugin's threads may still run). Returns 0, or -1 when the image is unknown to
 * the dynamic loader or memory is short. */
int modhost_crash_recorder_add(void *handle, const char *record);

/* The image holding `code` (a function of a plugin image added before), as a token for
 * modhost_crash_recorder_enter; NULL when no image added holds it. A linear search of
 * the images: look it up once, not per call. */
const void *modhost_crash_recorder_image_of(const void *code);

/* Marks the calling thread as running the code of `image` (a token from
 * modhost_crash_recorder_image_of; NULL: none) from now on, and returns what it was marked
 * with before, to be put back when the call returns. A fatal signal on this thread that
 * neither the instruction nor a return address pins on a plugin is pinned on this one
 * (a jump through a bad pointer). A thread-local store: cheap enough for every call. */
const void *modhost_crash_recorder_enter(const void *image);

/* The plugin whose code called exit(): the nearest frame of the calling thread's stack
 * that lies in a plugin's code. Returns an opaque token for modhost_crash_recorder_write
 * and the record text in `*record`, or NULL when no plugin code is on the stack. Not
 * async-signal-safe (it uses backtrace); call it from an exit handler. */
const void *modhost_crash_recorder_caller(const char **record);

/* Writes `plugin`'s record (a token from modhost_crash_recorder_caller) with `phase` and
 * `cause` (plain ASCII without quotes or backslashes) to the recorder's file. */
void modhost_crash_recorder_write(const void *plugin, const char *phase, const char *cause);

/* Lets SIGABRT reach the calling thread (once per thread; later calls cost a thread-local
 * read). libdispatch blocks it on its threads, and the threads plugin code starts from
 * them inherit that: a plugin's raise(SIGABRT) there would stay pending, and the process
 * go on, where abort() (which unblocks it) ends it. Called before plugin code runs on a
 * worker's thread. */
void modhost_crash_recorder_allow_abort(void);

#endif
