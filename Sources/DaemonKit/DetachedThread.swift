#if canImport(Glibc)
import Glibc
#endif

/// Starts a new OS thread that runs `body` once and then ends: the one way ModuleHost's
/// code outside the tests starts a thread of its own (blocking loops on descriptors, a
/// thread that runs plugin code, a watchdog).
///
/// What it guarantees:
/// - `body` runs on a new POSIX thread of its own, created here: never on the caller's
///   thread and never on a thread of Swift concurrency's cooperative pool, so it may block
///   (`poll`, `read`, a semaphore, plugin code that never returns) without taking a thread
///   from tasks. It may start running before this function returns.
/// - The thread is detached: nothing joins it, and the system frees it when `body` returns.
///   It does not keep the process alive: `exit` ends it wherever it is.
/// - It is named `name` (what `ps -L`, `top -H`, gdb and /proc/PID/task/TID/comm show), cut
///   to the system's limit of 15 bytes, from the thread itself before `body` runs.
/// - Its stack is `stackSize` bytes when given (at least the system's minimum, or this
///   throws `EINVAL`), else the system's default (the stack limit, `ulimit -s`).
/// - It starts with the caller's signal mask, as any new thread does.
///
/// - Throws: `SystemError` naming `pthread_create` (`EAGAIN`: a limit on threads or memory
///   was reached) or `pthread_attr_setstacksize`, with `name` as its subject; `body` then
///   never runs and is released.
public func startThread(name: String, stackSize: Int? = nil, _ body: @escaping @Sendable () -> Void) throws(SystemError) {
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
    if let stackSize {
        let code = pthread_attr_setstacksize(&attributes, stackSize)
        guard code == 0 else { throw SystemError("pthread_attr_setstacksize", code: code, subject: name) }
    }
    // One retain travels to the new thread, which takes it back; it is released here if
    // the thread is never created.
    let start = Unmanaged.passRetained(ThreadStart(name: name, body: body))
    var thread = pthread_t()
    let code = pthread_create(&thread, &attributes, { context in
        let start = Unmanaged<ThreadStart>.fromOpaque(context!).takeRetainedValue()
        start.run()
        return nil
    }, start.toOpaque())
    guard code == 0 else {
        start.release()
        throw SystemError("pthread_create", code: code, subject: name)
    }
}

/// What a thread `startThread` creates runs: immutable, so handing it to that thread is safe.
private final class ThreadStart: Sendable {
    /// The system's limit on a thread's name, in bytes (without the NUL).
    static let maximumNameLength = 15

    let name: String
    let body: @Sendable () -> Void

    init(name: String, body: @escaping @Sendable () -> Void) {
        self.name = name
        self.body = body
    }

    /// Names the calling thread, then runs `body`.
    func run() {
        let bytes = name.utf8.prefix(Self.maximumNameLength).map { CChar(bitPattern: $0) } + [0]
        _ = bytes.withUnsafeBufferPointer { GNUCalls.pthreadSetName(pthread_self(), $0.baseAddress) }
        body()
    }
}
