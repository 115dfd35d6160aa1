#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// The conventional locations of modhostd's socket, state and configuration, for root
/// (a system service) and for an ordinary user (XDG Base Directory specification).
///
/// Pure functions of the environment and uid passed in (defaults: this process's), so
/// `modhostd` and `modhostctl` compute the same paths and tests can check every branch.
/// XDG variables that are unset, empty or relative are ignored, as the specification says.
public struct RuntimePaths: Sendable, Hashable {
    /// The control socket: `/run/modhostd.sock` as root, else
    /// `$XDG_RUNTIME_DIR/modhostd.sock`, else `/tmp/modhostd-<uid>.sock`.
    public var socketPath: String
    /// Crash-loop records and other state: `/var/lib/modhostd` as root, else
    /// `$XDG_STATE_HOME/modhostd`, else `$HOME/.local/state/modhostd`.
    public var stateDirectory: String
    /// The configuration file: `/etc/modhostd/modhostd.json` as root, else
    /// `$XDG_CONFIG_HOME/modhostd/modhostd.json`, else `$HOME/.config/modhostd/modhostd.json`.
    public var configPath: String

    /// Computes the defaults for `uid` in `environment`. Root wins over `XDG_*` variables,
    /// so a root shell and a systemd system service agree on the paths. When `HOME` is
    /// unset, the home directory comes from the password database, else `/tmp`.
    public init(environment: [String: String] = ProcessInfo.processInfo.environment, uid: UInt32 = geteuid()) {
        if uid == 0 {
            socketPath = "/run/modhostd.sock"
            stateDirectory = "/var/lib/modhostd"
            configPath = "/etc/modhostd/modhostd.json"
            return
        }
        func xdg(_ name: String) -> String? {
            guard let value = environment[name], value.hasPrefix("/") else { return nil }
            return value.count > 1 && value.hasSuffix("/") ? String(value.dropLast()) : value
        }
        let home = Self.homeDirectory(environment: environment, uid: uid)
        socketPath = xdg("XDG_RUNTIME_DIR").map { $0 + "/modhostd.sock" } ?? "/tmp/modhostd-\(uid).sock"
        stateDirectory = (xdg("XDG_STATE_HOME") ?? home + "/.local/state") + "/modhostd"
        configPath = (xdg("XDG_CONFIG_HOME") ?? home + "/.config") + "/modhostd/modhostd.json"
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
