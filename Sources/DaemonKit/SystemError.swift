#if canImport(Glibc)
import Glibc
#endif

/// A failed system call: which call, on what, and the `errno` it left.
///
/// Every DaemonKit function that calls the OS throws this type (or returns it inside a more
/// specific error), so a log line can always say `bind(/run/modhostd.sock): Address already
/// in use (errno 98)`. Values are immutable and `Sendable`.
public struct SystemError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The name of the call that failed, e.g. `"inotify_add_watch"`.
    public var syscall: String
    /// The `errno` value the call left, e.g. `EACCES`.
    public var code: Int32
    /// What the call was applied to (a path, a socket name), or `nil`.
    public var subject: String?

    /// Creates an error from explicit values; `code` is an `errno` value.
    public init(_ syscall: String, code: Int32, subject: String? = nil) {
        self.syscall = syscall
        self.code = code
        self.subject = subject
    }

    /// Captures the calling thread's current `errno`. Call it right after the failing call,
    /// before anything else can overwrite `errno`.
    public static func current(_ syscall: String, subject: String? = nil) -> SystemError {
        SystemError(syscall, code: Glibc.errno, subject: subject)
    }

    /// The C library's text for `code` (`strerror_r`), e.g. "Permission denied".
    public var message: String { SystemError.describe(code) }

    /// `syscall(subject): message (errno N)`.
    public var description: String {
        let target = subject.map { "(\($0))" } ?? ""
        return "\(syscall)\(target): \(message) (errno \(code))"
    }

    /// `strerror_r` text for an `errno` value; thread-safe.
    public static func describe(_ code: Int32) -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        // Glibc imports the XSI strerror_r: 0 on success, the text in `buffer`.
        let status = buffer.withUnsafeMutableBufferPointer { strerror_r(code, $0.baseAddress!, $0.count) }
        guard status == 0 else { return "Unknown error \(code)" }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// True for `EINTR`.
    public var isInterrupted: Bool { code == EINTR }
    /// True for `EAGAIN` / `EWOULDBLOCK`.
    public var wouldBlock: Bool { code == EAGAIN || code == EWOULDBLOCK }
}

/// Runs a C call that reports failure by returning -1 and setting `errno`, and turns that
/// into a thrown `SystemError` naming `syscall` (and `subject`).
///
/// With `retryOnInterrupt` (the default) an `EINTR` failure is retried, so callers never
/// see one. Any other negative result throws; a non-negative result is returned as is.
@discardableResult
@inlinable
public func valueOrErrno<Result: FixedWidthInteger & SignedInteger>(
    _ syscall: String, subject: String? = nil, retryOnInterrupt: Bool = true,
    _ body: () -> Result
) throws(SystemError) -> Result {
    while true {
        let result = body()
        if result >= 0 { return result }
        let error = SystemError.current(syscall, subject: subject)
        if retryOnInterrupt && error.isInterrupted { continue }
        throw error
    }
}

/// Closes a descriptor, ignoring `EINTR` (on Linux the descriptor is released even then,
/// so retrying would close someone else's descriptor).
func closeDescriptor(_ fd: Int32) {
    if fd >= 0 { _ = Glibc.close(fd) }
}
