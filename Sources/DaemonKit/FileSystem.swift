#if canImport(Glibc)
import Glibc
#endif

/// The few directory and path operations ModuleHost needs beyond `AtomicFile`,
/// `BoundedFile` and `PathText`, as plain system calls. Failures are thrown as
/// `SystemError` naming the call and the path; nothing is retried but `EINTR`. Every
/// function may be called from any thread.
///
/// Names and paths are read as UTF-8; a name that is not valid UTF-8 comes back with
/// U+FFFD in place of its invalid bytes (and so no longer names the file).
public enum FileSystem {
    /// The names of the entries of `directory` (`readdir`), without `.` and `..`, in the
    /// order the file system gives them.
    ///
    /// - Throws: `SystemError` for `opendir` (`ENOENT`: no such directory, `ENOTDIR`: not
    ///   a directory) or `readdir`.
    public static func names(in directory: String) throws(SystemError) -> [String] {
        guard let stream = opendir(directory) else { throw .current("opendir", subject: directory) }
        defer { closedir(stream) }
        var names: [String] = []
        while true {
            errno = 0
            guard let entry = readdir(stream) else {
                if errno != 0 { throw .current("readdir", subject: directory) }
                return names
            }
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
    }

    /// Creates directory `path` with `mode` (less the process's umask, as `mkdir` does).
    /// With `parents`, the missing directories above it are created first, with the same
    /// mode, as `mkdir -p` does. A directory (or a symlink to one) already at `path`, or at
    /// any of its parents, is left as it is and is not an error.
    ///
    /// - Throws: `SystemError` for `mkdir` (`EEXIST`: a file that is not a directory is
    ///   there; `ENOENT`: a parent is missing and `parents` is false; `EACCES`, ...).
    public static func createDirectory(_ path: String, mode: mode_t = 0o777, parents: Bool = false) throws(SystemError) {
        if mkdir(path, mode) == 0 { return }
        let error = SystemError.current("mkdir", subject: path)
        switch error.code {
        case EEXIST:
            if isDirectory(path) { return }
            throw error
        case ENOENT where parents:
            let parent = PathText.parent(of: path)
            guard parent != path, parent != "/", parent != "." else { throw error }
            try createDirectory(parent, mode: mode, parents: true)
            if mkdir(path, mode) == 0 { return }
            let retry = SystemError.current("mkdir", subject: path)
            // Created meanwhile by another process or thread.
            if retry.code == EEXIST, isDirectory(path) { return }
            throw retry
        default:
            throw error
        }
    }

    /// Whether something is at `path`, following symlinks (a dangling symlink is not).
    public static func exists(_ path: String) -> Bool {
        var status = stat()
        return stat(path, &status) == 0
    }

    /// Whether `path` is a directory, following symlinks.
    public static func isDirectory(_ path: String) -> Bool {
        var status = stat()
        return stat(path, &status) == 0 && status.st_mode & S_IFMT == S_IFDIR
    }

    /// Why a user other than root and `trustedUID` could change what the file, directory
    /// or symlink `status` describes holds or leads to, as sshd and sudo judge what they
    /// trust: one text per cause, e.g. `writable by others (mode 777)` and `owned by uid
    /// 1000, expected root (uid 0)`; empty when none. A symlink's own mode means nothing
    /// and is not judged. With `stickyAllowed`, a directory with the sticky bit (as /tmp)
    /// may be writable: others can add names to it, but not rename or remove the names
    /// they do not own.
    public static func trustProblems(_ status: stat, trustedUID: uid_t, stickyAllowed: Bool = false) -> [String] {
        var problems: [String] = []
        let type = status.st_mode & S_IFMT
        let sticky = stickyAllowed && type == S_IFDIR && status.st_mode & S_ISVTX != 0
        if type != S_IFLNK, status.st_mode & 0o022 != 0, !sticky {
            problems.append("writable by \(status.st_mode & 0o002 != 0 ? "others" : "group") (mode \(String(status.st_mode & 0o7777, radix: 8)))")
        }
        if status.st_uid != 0 && status.st_uid != trustedUID {
            problems.append("owned by uid \(status.st_uid), expected \(trustedUID == 0 ? "root (uid 0)" : "root or uid \(trustedUID)")")
        }
        return problems
    }

    /// What the symlink at `path` points to, as written in it (`readlink`); nil if `path`
    /// is not a symlink or cannot be read.
    public static func symlinkTarget(_ path: String) -> String? {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX))
        let length = buffer.withUnsafeMutableBufferPointer { raw in
            raw.withMemoryRebound(to: CChar.self) { readlink(path, $0.baseAddress!, $0.count) }
        }
        guard length >= 0 else { return nil }
        return String(decoding: buffer[..<length], as: UTF8.self)
    }

    /// The path of this process's executable (`/proc/self/exe`), nil if it cannot be read.
    public static var executablePath: String? { symlinkTarget("/proc/self/exe") }

    /// This process's working directory (`getcwd`); "/" if it cannot be read (it was
    /// removed, or its path is longer than `PATH_MAX`).
    public static var currentDirectory: String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        guard getcwd(&buffer, buffer.count) != nil else { return "/" }
        return String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// This process's environment variables.
public enum ProcessEnvironment {
    /// Every variable of the environment now (`environ`), by name. A name that appears
    /// more than once has its first value, the one `getenv` returns; an entry without `=`
    /// is left out. Read it while no thread changes the environment (`setenv`).
    public static var current: [String: String] {
        var variables: [String: String] = [:]
        // C's `environ`, read through its address as the optional it is (NULL after
        // `clearenv`), which the Glibc module's non-optional `environ` cannot express.
        guard let address = dlsym(nil, "environ"),
              var entry = address.load(as: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?.self)
        else { return variables }
        while let pointer = entry.pointee {
            let text = String(cString: pointer)
            if let equals = text.utf8.firstIndex(of: UInt8(ascii: "=")) {
                let name = String(text[..<equals])
                if variables[name] == nil { variables[name] = String(text[text.utf8.index(after: equals)...]) }
            }
            entry += 1
        }
        return variables
    }
}
