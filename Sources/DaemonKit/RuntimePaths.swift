#if canImport(Glibc)
import Glibc
#endif

/// The conventional locations of modhostd's socket, state and configuration, for root
/// (a system service) and for an ordinary user (XDG Base Directory specification).
///
/// Pure functions of the environment and uid passed in (defaults: this process's), so
/// `modhostd` and `modhostctl` compute the same paths and tests can check every branch.
/// XDG variables that are unset, empty or relative are ignored, as the specification says.
public struct RuntimePaths: Sendable, Hashable {
    /// The control socket: `/run/modhostd/modhostd.sock` as root (where the systemd unit
    /// puts it too, in its runtime directory), else
    /// `$XDG_RUNTIME_DIR/modhostd.sock`, else `/tmp/modhostd-<uid>/modhostd.sock`, inside
    /// the private directory `privateRuntimeDirectory` (never directly in a directory
    /// others can write).
    public var socketPath: String
    /// The private directory holding the socket when there is no `XDG_RUNTIME_DIR`:
    /// `/tmp/modhostd-<uid>`; nil otherwise. Check it with `checkPrivateDirectory` (the
    /// daemon creates it) before trusting anything in it.
    public var privateRuntimeDirectory: String?
    /// Crash-loop records and other state: `/var/lib/modhostd` as root, else
    /// `$XDG_STATE_HOME/modhostd`, else `$HOME/.local/state/modhostd`.
    public var stateDirectory: String
    /// The configuration file: `/etc/modhostd/modhostd.json` as root, else
    /// `$XDG_CONFIG_HOME/modhostd/modhostd.json`, else `$HOME/.config/modhostd/modhostd.json`.
    public var configPath: String

    /// Computes the defaults for `uid` in `environment`. Root wins over `XDG_*` variables,
    /// so a root shell and a systemd system service agree on the paths. When `HOME` is
    /// unset, the home directory comes from the password database, else `/tmp`.
    public init(environment: [String: String] = ProcessEnvironment.current, uid: UInt32 = geteuid()) {
        if uid == 0 {
            socketPath = "/run/modhostd/modhostd.sock"
            privateRuntimeDirectory = nil
            stateDirectory = "/var/lib/modhostd"
            configPath = "/etc/modhostd/modhostd.json"
            return
        }
        func xdg(_ name: String) -> String? {
            guard let value = environment[name], value.hasPrefix("/") else { return nil }
            return value.count > 1 && value.hasSuffix("/") ? String(value.dropLast()) : value
        }
        let home = Self.homeDirectory(environment: environment, uid: uid)
        if let runtime = xdg("XDG_RUNTIME_DIR") {
            socketPath = runtime + "/modhostd.sock"
            privateRuntimeDirectory = nil
        } else {
            privateRuntimeDirectory = "/tmp/modhostd-\(uid)"
            socketPath = "/tmp/modhostd-\(uid)/modhostd.sock"
        }
        stateDirectory = (xdg("XDG_STATE_HOME") ?? home + "/.local/state") + "/modhostd"
        configPath = (xdg("XDG_CONFIG_HOME") ?? home + "/.config") + "/modhostd/modhostd.json"
    }

    /// Checks that `directory` is private to `uid`, as OpenSSH and systemd check theirs:
    /// a real directory (not a symlink), owned by `uid`, with no permission bits for group
    /// or others (`allowingRead`: no write bits; they may read and search it). With
    /// `create`, a missing directory is made with mode 0700 first (the daemon); without, a
    /// missing one is reported as `ENOENT` (the client: no daemon). An existing directory
    /// is never changed. Throws a one-line reason that names the directory, what is wrong
    /// and the fix.
    public static func checkPrivateDirectory(
        _ directory: String, uid: UInt32 = geteuid(), create: Bool, allowingRead: Bool = false
    ) throws(PrivateDirectoryError) {
        if create, mkdir(directory, 0o700) != 0, Glibc.errno != EEXIST {
            throw .system(.current("mkdir", subject: directory))
        }
        var info = stat()
        guard lstat(directory, &info) == 0 else { throw .system(.current("lstat", subject: directory)) }
        guard info.st_mode & S_IFMT == S_IFDIR else { throw .notPrivate(directory: directory, problem: "it is not a directory (a symlink or another file)") }
        guard info.st_uid == uid else { throw .notPrivate(directory: directory, problem: "it is owned by uid \(info.st_uid), not uid \(uid)") }
        guard info.st_mode & (allowingRead ? 0o022 : 0o077) == 0 else {
            throw .notPrivate(directory: directory, problem: "its mode \(String(info.st_mode & 0o7777, radix: 8)) gives group or others \(allowingRead ? "write " : "")access")
        }
    }

    /// `$HOME` if absolute, else the password database's entry for `uid`, else `/tmp`.
    static func homeDirectory(environment: [String: String], uid: UInt32) -> String {
        if let home = environment["HOME"], home.hasPrefix("/") {
            return home.count > 1 && home.hasSuffix("/") ? String(home.dropLast()) : home
        }
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 4096)
        // pw_dir points into `buffer`: read it while the buffer is pinned.
        let path = buffer.withUnsafeMutableBufferPointer { raw -> String? in
            guard getpwuid_r(uid, &entry, raw.baseAddress!, raw.count, &result) == 0, result != nil,
                  let directory = entry.pw_dir
            else { return nil }
            return String(cString: directory)
        }
        if let path, path.hasPrefix("/") { return path }
        return "/tmp"
    }
}

/// Why a runtime directory cannot be trusted.
public enum PrivateDirectoryError: Error, Sendable, Hashable, CustomStringConvertible {
    /// It exists but is not private to us; `problem` says how.
    case notPrivate(directory: String, problem: String)
    /// It cannot be created or examined (`ENOENT`: it does not exist).
    case system(SystemError)

    /// One line: the directory, what is wrong, and the fix.
    public var description: String {
        switch self {
        case .notPrivate(let directory, let problem):
            "the runtime directory \(directory) is not private: \(problem). Fix: remove it (another user may have created it) or set XDG_RUNTIME_DIR or pass --socket"
        case .system(let error): "\(error)"
        }
    }
}
