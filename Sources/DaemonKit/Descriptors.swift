#if canImport(Glibc)
import Glibc
#endif

// Small internal helpers shared by the watcher, the signal reader and the control socket.

/// Calls that glibc declares only under `_GNU_SOURCE`, so the Glibc module does not import
/// them; resolved once with `dlsym`. They exist in every glibc DaemonKit can run on.
enum GNUCalls {
    typealias Pipe2 = @convention(c) (UnsafeMutablePointer<Int32>?, Int32) -> Int32
    typealias Accept4 = @convention(c) (Int32, UnsafeMutablePointer<sockaddr>?, UnsafeMutablePointer<socklen_t>?, Int32) -> Int32
    typealias SetThreadName = @convention(c) (pthread_t, UnsafePointer<CChar>?) -> Int32

    static let pipe2: Pipe2 = resolve("pipe2")
    static let accept4: Accept4 = resolve("accept4")
    static let pthreadSetName: SetThreadName = resolve("pthread_setname_np")

    private static func resolve<F>(_ name: String) -> F {
        guard let symbol = dlsym(nil, name) else { fatalError("glibc has no \(name)") }
        return unsafeBitCast(symbol, to: F.self)
    }

    /// A close-on-exec pipe; `nonBlocking` applies to both ends. Returns (read, write).
    static func makePipe(nonBlocking: Bool) throws(SystemError) -> (read: Int32, write: Int32) {
        var ends: [Int32] = [-1, -1]
        let flags = O_CLOEXEC | (nonBlocking ? O_NONBLOCK : 0)
        try valueOrErrno("pipe2") { ends.withUnsafeMutableBufferPointer { pipe2($0.baseAddress, flags) } }
        return (ends[0], ends[1])
    }
}

/// A pipe used to wake threads blocked in `poll`. Once signalled its read end stays
/// readable (nobody drains it), which is what a "stop" flag needs.
final class WakeEvent: Sendable {
    /// Poll this for `POLLIN`.
    let fd: Int32
    private let writeEnd: Int32

    init() throws(SystemError) {
        (fd, writeEnd) = try GNUCalls.makePipe(nonBlocking: true)
    }

    /// Makes `fd` readable; async-signal-safe and callable from any thread, any number of times.
    func signal() {
        var one: UInt8 = 1
        _ = Glibc.write(writeEnd, &one, 1)
    }

    deinit {
        closeDescriptor(fd)
        closeDescriptor(writeEnd)
    }
}

/// Milliseconds from now until `deadline` for `poll`, clamped to `0...Int32.max`;
/// -1 (wait forever) when `deadline` is nil.
func pollTimeout(until deadline: ContinuousClock.Instant?) -> Int32 {
    guard let deadline else { return -1 }
    let remaining = ContinuousClock.now.duration(to: deadline)
    if remaining <= .zero { return 0 }
    let (seconds, attoseconds) = remaining.components
    let millis = seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
    return Int32(clamping: millis)
}

/// Polls `fds` until one is ready or `timeout` (milliseconds, -1 = forever) passes, retrying
/// `EINTR` with the remaining time. Returns the number of ready descriptors (0 on timeout).
func pollDescriptors(_ fds: inout [pollfd], timeout: Int32) throws(SystemError) -> Int32 {
    let deadline: ContinuousClock.Instant? =
        timeout < 0 ? nil : ContinuousClock.now.advanced(by: .milliseconds(Int64(timeout)))
    while true {
        let wait = timeout < 0 ? -1 : pollTimeout(until: deadline)
        let result = fds.withUnsafeMutableBufferPointer { poll($0.baseAddress, nfds_t($0.count), wait) }
        if result >= 0 { return result }
        let error = SystemError.current("poll")
        if !error.isInterrupted { throw error }
    }
}

/// Raises the soft limit on open descriptors to the hard limit, at most `ceiling`: a
/// daemon that holds one descriptor per plugin image asks for the room the system grants
/// it (systemd's default soft limit of 1024 is kept low for programs that still use
/// `select`; the hard limit is the system's grant). The soft limit in force afterwards.
@discardableResult
public func raiseDescriptorLimit(to ceiling: UInt64 = 65_536) -> UInt64 {
    var limit = rlimit()
    let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
    guard getrlimit(resource, &limit) == 0 else { return 0 }
    let wanted = min(limit.rlim_max, rlim_t(ceiling))
    if wanted > limit.rlim_cur {
        var raised = limit
        raised.rlim_cur = wanted
        if setrlimit(resource, &raised) == 0 { return UInt64(wanted) }
    }
    return UInt64(limit.rlim_cur)
}

/// The descriptors from 3 on that this process has open now (read from /proc/self/fd;
/// empty when it cannot be read).
public func openDescriptors() -> [Int32] {
    guard let directory = opendir("/proc/self/fd") else { return [] }
    let own = dirfd(directory)
    var descriptors: [Int32] = []
    while let entry = readdir(directory) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        if let fd = Int32(name), fd > 2, fd != own { descriptors.append(fd) }
    }
    closedir(directory)
    return descriptors.sorted()
}

/// Marks every open descriptor from 3 on close-on-exec but those `kept` (whose flags it
/// leaves alone): a program this process executes then holds only 0-2, `kept`, and what
/// it is given otherwise, whatever plugin code left open. False when /proc/self/fd cannot
/// be read.
public func closeOnExecAllDescriptors(except kept: Set<Int32>) -> Bool {
    guard access("/proc/self/fd", R_OK) == 0 else { return false }
    for fd in openDescriptors() where !kept.contains(fd) { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
    return true
}
