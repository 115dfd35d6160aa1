/// Exit codes of modhostd and modhostctl (sysexits.h names where one fits).
public enum ExitCode: Int32, Sendable, Error {
    /// Success.
    case success = 0
    /// The command ran and found a problem (e.g. `verify` refused a file).
    case failure = 1
    /// Wrong arguments (EX_USAGE).
    case usage = 64
    /// Bad input data, such as an invalid configuration file (EX_DATAERR).
    case dataError = 65
    /// The daemon is not running or not reachable (EX_UNAVAILABLE).
    case unavailable = 69
    /// Code that is not the daemon's (a plugin's) called `exit()`; the daemon exits with
    /// this instead of the status that code chose, so that systemd restarts it (EX_SOFTWARE).
    case pluginExited = 70
    /// An operating-system error, such as a socket that cannot be created (EX_OSERR).
    case osError = 71
    /// The process on the control socket is not trusted: it runs as another user than
    /// root or the caller (EX_NOPERM).
    case noPermission = 77
}
