#if canImport(Glibc)
import Glibc
#endif

/// An exclusive, advisory `flock` on a lock file, held until the value is released (and
/// dropped by the kernel when the process dies, however it dies), so a crashed owner
/// never leaves a stale lock behind.
///
/// - The file is opened without following a symlink, created with mode 0600 if missing,
///   and close-on-exec (child processes never inherit the lock).
/// - While held, the file contains the owner's pid and a newline; a second process (or a
///   second lock in this process) gets `.held` with that pid, without waiting.
public final class ExclusiveLock: Sendable {
    /// Why a lock could not be taken.
    public enum Failure: Error, Sendable, Hashable, CustomStringConvertible {
        /// Another holder has it; `pid` is what the file says (nil when unreadable).
        case held(path: String, pid: Int32?)
        /// The lock file cannot be opened or locked.
        case system(SystemError)

        /// One sentence naming the file and, when known, the holder's pid.
        public var description: String {
            switch self {
            case .held(let path, let pid): "\(path) is locked by another process\(pid.map { " (pid \($0))" } ?? "")"
            case .system(let error): "\(error)"
            }
        }
    }

    /// The lock file's path.
    public let path: String
    private let fd: Int32

    /// Takes the lock on `path` or throws at once (never blocks).
    public init(path: String) throws(Failure) {
        self.path = path
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw .system(.current("open", subject: path)) }
        if flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let error = SystemError.current("flock", subject: path)
            let holder = Self.readPID(fd)
            closeDescriptor(fd)
            if error.wouldBlock { throw .held(path: path, pid: holder) }
            throw .system(error)
        }
        let text = Array("\(getpid())\n".utf8)
        _ = ftruncate(fd, 0)
        _ = text.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
        self.fd = fd
    }

    /// Releases the lock (closing the file drops it).
    deinit { closeDescriptor(fd) }

    private static func readPID(_ fd: Int32) -> Int32? {
        var buffer = [UInt8](repeating: 0, count: 32)
        let count = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { return nil }
        return Int32(String(decoding: buffer[..<count].prefix { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }, as: UTF8.self))
    }
}
