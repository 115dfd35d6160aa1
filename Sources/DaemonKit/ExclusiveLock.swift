#if canImport(Glibc)
import Glibc
#endif
import CForkGuard
import Synchronization

/// An exclusive, advisory `flock` on a lock file, held until the value is released (and
/// dropped by the kernel when the process dies, however it dies), so a crashed owner
/// never leaves a stale lock behind.
///
/// - The file is opened without following a symlink, created with mode 0600 if missing,
///   and close-on-exec; a child made by `fork()` alone (code the process loaded, forking)
///   closes it at once (a `pthread_atfork` handler), so a child that outlives this
///   process does not keep the lock (a fork in the instant between the open and that
///   registration is the exception).
/// - While held, the file contains the owner's pid and a newline; a second process (or a
///   second lock in this process) gets `.held` with that pid, without waiting.
/// - With `lockingDirectory`, the directory holding the file is locked too, first: deleting
///   the lock file (taking it for a stale one) then lets no second holder in, since a
///   directory with files in it cannot be deleted the same way.
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
    /// The locked directory holding the file (`lockingDirectory`), else -1.
    private let directoryFD: Int32

    /// Takes the lock on `path` (and on its directory with `lockingDirectory`) or throws at
    /// once (never blocks).
    public init(path: String, lockingDirectory: Bool = false) throws(Failure) {
        self.path = path
        var directoryFD: Int32 = -1
        if lockingDirectory {
            let directory = PathText.parent(of: path)
            directoryFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            guard directoryFD >= 0 else { throw .system(.current("open", subject: directory)) }
            if flock(directoryFD, LOCK_EX | LOCK_NB) != 0 {
                let error = SystemError.current("flock", subject: directory)
                closeDescriptor(directoryFD)
                guard error.wouldBlock else { throw .system(error) }
                // The holder's pid, when its lock file is still there.
                let file = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
                let holder = file >= 0 ? Self.readPID(file) : nil
                if file >= 0 { closeDescriptor(file) }
                throw .held(path: path, pid: holder)
            }
        }
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else {
            let error = SystemError.current("open", subject: path)
            if directoryFD >= 0 { closeDescriptor(directoryFD) }
            throw .system(error)
        }
        if flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let error = SystemError.current("flock", subject: path)
            let holder = Self.readPID(fd)
            closeDescriptor(fd)
            if directoryFD >= 0 { closeDescriptor(directoryFD) }
            if error.wouldBlock { throw .held(path: path, pid: holder) }
            throw .system(error)
        }
        let text = Array("\(getpid())\n".utf8)
        _ = ftruncate(fd, 0)
        _ = text.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
        self.fd = fd
        self.directoryFD = directoryFD
        // A process forked from this one (by code it loaded) must not keep the lock.
        _ = modhost_fork_guard_close(fd)
        if directoryFD >= 0 { _ = modhost_fork_guard_close(directoryFD) }
    }

    private let released = Atomic<Bool>(false)

    /// Releases the lock now (closing the files drops it); later calls, and the release
    /// when the value goes, do nothing.
    public func release() {
        guard !released.exchange(true, ordering: .acquiringAndReleasing) else { return }
        modhost_fork_guard_keep(fd)
        closeDescriptor(fd)
        if directoryFD >= 0 {
            modhost_fork_guard_keep(directoryFD)
            closeDescriptor(directoryFD)
        }
    }

    /// Releases the lock, unless `release()` did.
    deinit { release() }

    private static func readPID(_ fd: Int32) -> Int32? {
        var buffer = [UInt8](repeating: 0, count: 32)
        let count = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { return nil }
        return Int32(String(decoding: buffer[..<count].prefix { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }, as: UTF8.self))
    }
}
