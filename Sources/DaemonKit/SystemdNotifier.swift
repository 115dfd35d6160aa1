#if canImport(Glibc)
import Glibc
#endif

/// Sends `sd_notify` messages (`READY=1`, `RELOADING=1`, `STOPPING=1`, `STATUS=...`) to the
/// service manager named by `$NOTIFY_SOCKET`.
///
/// - When `NOTIFY_SOCKET` is unset or empty every method does nothing and succeeds, so a
///   daemon runs the same with and without systemd.
/// - The socket may be a filesystem path (`/run/systemd/notify`) or an abstract name
///   (`@name`). Each message is one datagram sent on a fresh close-on-exec socket, so the
///   value is `Sendable` and safe to use from any thread concurrently.
/// - Failures are thrown as `SystemError` (`sendto`, ...); a daemon usually logs them
///   and carries on.
public struct SystemdNotifier: Sendable, Equatable {
    /// The socket address from `NOTIFY_SOCKET`, or nil when notification is disabled.
    public let socketPath: String?

    /// Reads `NOTIFY_SOCKET` from `environment` (default: this process's environment).
    public init(environment: [String: String] = ProcessEnvironment.current) {
        self.init(socketPath: environment["NOTIFY_SOCKET"])
    }

    /// Uses `socketPath` (a path or `@abstract` name); nil or empty disables notification.
    public init(socketPath: String?) {
        self.socketPath = (socketPath?.isEmpty ?? true) ? nil : socketPath
    }

    /// True when a socket is configured and messages are actually sent.
    public var isEnabled: Bool { socketPath != nil }

    /// `READY=1` (plus `STATUS=`): startup or a reload is complete.
    public func ready(status: String? = nil) throws(SystemError) {
        try send(["READY=1"] + Self.statusLine(status))
    }

    /// `RELOADING=1` with `MONOTONIC_USEC=<CLOCK_MONOTONIC now>` (plus `STATUS=`), as
    /// `Type=notify-reload` requires; follow it with `ready()` when the reload is done.
    public func reloading(status: String? = nil) throws(SystemError) {
        try send(["RELOADING=1", "MONOTONIC_USEC=\(Self.monotonicMicroseconds())"] + Self.statusLine(status))
    }

    /// `STOPPING=1` (plus `STATUS=`): shutdown has begun.
    public func stopping(status: String? = nil) throws(SystemError) {
        try send(["STOPPING=1"] + Self.statusLine(status))
    }

    /// `STATUS=text`: a one-line, human-readable state shown by `systemctl status`.
    /// Newlines in `text` are replaced by spaces.
    public func status(_ text: String) throws(SystemError) {
        try send(Self.statusLine(text))
    }

    /// `WATCHDOG=1`: keep-alive for `WatchdogSec=`.
    public func watchdog() throws(SystemError) {
        try send(["WATCHDOG=1"])
    }

    /// How often the service manager wants `WATCHDOG=1` from this process: half of
    /// `WATCHDOG_USEC` (systemd's advice), when it is a positive whole number of
    /// microseconds, notification is enabled and `WATCHDOG_PID` is unset or this process's
    /// pid; nil otherwise.
    public static func watchdogInterval(environment: [String: String] = ProcessEnvironment.current,
                                        pid: pid_t = getpid()) -> Duration? {
        guard environment["NOTIFY_SOCKET"].map({ !$0.isEmpty }) ?? false,
              let text = environment["WATCHDOG_USEC"], let microseconds = UInt64(text), microseconds > 0,
              microseconds <= 365 * 24 * 3600 * 1_000_000 else { return nil }
        if let owner = environment["WATCHDOG_PID"], pid_t(owner) != pid { return nil }
        return .microseconds(Int64(microseconds / 2))
    }

    /// Whether standard error is the journal: `JOURNAL_STREAM` (`DEVICE:INODE`, which
    /// systemd sets for a service whose output goes to journald) names the file on
    /// descriptor 2. Then a line may start with a `<N>` syslog priority, which journald
    /// takes as the line's priority.
    public static func standardErrorIsJournal(environment: [String: String] = ProcessEnvironment.current) -> Bool {
        guard let stream = environment["JOURNAL_STREAM"] else { return false }
        let parts = stream.split(separator: ":")
        guard parts.count == 2, let device = UInt64(parts[0]), let inode = UInt64(parts[1]) else { return false }
        var status = stat()
        guard fstat(2, &status) == 0 else { return false }
        return UInt64(status.st_dev) == device && UInt64(status.st_ino) == inode
    }

    /// Sends `assignments` (`KEY=value` each, no newlines inside) as one datagram, joined by
    /// newlines. Does nothing when disabled.
    public func send(_ assignments: [String]) throws(SystemError) {
        guard let socketPath, !assignments.isEmpty else { return }
        let message = assignments.joined(separator: "\n") + "\n"
        try Self.sendDatagram(Array(message.utf8), to: socketPath)
    }

    /// `CLOCK_MONOTONIC` in microseconds, the clock systemd compares `MONOTONIC_USEC` with.
    public static func monotonicMicroseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000
    }

    private static func statusLine(_ status: String?) -> [String] {
        guard let status else { return [] }
        // "\r\n" is one Character; a lone "\r" is kept.
        let flat = String(status.map { $0 == "\n" || $0 == "\r\n" ? " " : $0 })
        return ["STATUS=\(flat)"]
    }

    private static func sendDatagram(_ bytes: [UInt8], to socketPath: String) throws(SystemError) {
        var (address, length) = try UnixSocketAddress.make(socketPath)
        let fd = try valueOrErrno("socket", subject: socketPath) {
            socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        }
        defer { closeDescriptor(fd) }
        try valueOrErrno("sendto", subject: socketPath) {
            bytes.withUnsafeBytes { buffer in
                withUnsafePointer(to: &address) { pointer in
                    pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        sendto(fd, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL), $0, length)
                    }
                }
            }
        }
    }
}

/// Building `sockaddr_un` for filesystem paths and `@abstract` names.
public enum UnixSocketAddress {
    /// The most bytes a path may have (without its NUL).
    static let maximumPathLength = MemoryLayout.size(ofValue: sockaddr_un().sun_path) - 1

    /// Why `path` (a file path, or `@name` for an abstract address) cannot be a Unix
    /// socket's address: a `PathText` problem, or longer than `sockaddr_un` holds. Nil when
    /// it can; `make` then succeeds.
    public static func problem(with path: String) -> String? {
        if let problem = PathText.problem(with: path) { return problem }
        let limit = path.hasPrefix("@") ? maximumPathLength + 1 : maximumPathLength
        guard path.utf8.count <= limit else { return "is \(path.utf8.count) bytes long; a Unix socket address holds at most \(limit)" }
        return nil
    }

    /// The address and its length. A leading `@` makes an abstract address (the `@` becomes a
    /// NUL byte and the length covers exactly the name). Throws `ENAMETOOLONG` for a path
    /// that does not fit `sun_path`.
    static func make(_ path: String) throws(SystemError) -> (sockaddr_un, socklen_t) {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(path.utf8)
        let abstract = bytes.first == UInt8(ascii: "@")
        if abstract { bytes[0] = 0 }
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard !bytes.isEmpty, bytes.count <= (abstract ? capacity : capacity - 1) else {
            throw SystemError("sockaddr_un", code: ENAMETOOLONG, subject: path)
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
        }
        let pathOffset = MemoryLayout<sockaddr_un>.offset(of: \sockaddr_un.sun_path)!
        // Paths: include the terminating NUL; abstract names: exactly their bytes.
        let length = pathOffset + bytes.count + (abstract ? 0 : 1)
        return (address, socklen_t(length))
    }

    /// The address socket `fd` is bound to, in `make`'s spelling (a path, or `@name`).
    static func boundPath(of fd: Int32) -> Result<String, SystemError> {
        var address = sockaddr_un()
        var length = socklen_t(MemoryLayout<sockaddr_un>.size)
        let status = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard status == 0 else { return .failure(.current("getsockname")) }
        let pathOffset = MemoryLayout<sockaddr_un>.offset(of: \sockaddr_un.sun_path)!
        guard address.sun_family == sa_family_t(AF_UNIX), Int(length) > pathOffset else {
            return .failure(SystemError("getsockname", code: EAFNOSUPPORT))
        }
        let count = min(Int(length) - pathOffset, MemoryLayout.size(ofValue: address.sun_path))
        var bytes = withUnsafeBytes(of: address.sun_path) { Array($0.prefix(count)) }
        if bytes.first == 0 {
            bytes[0] = UInt8(ascii: "@")
        } else if let end = bytes.firstIndex(of: 0) {
            bytes.removeSubrange(end...)
        }
        return .success(String(decoding: bytes, as: UTF8.self))
    }
}
