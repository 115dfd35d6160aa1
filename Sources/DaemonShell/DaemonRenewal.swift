import DaemonKit
import Glibc
import ModuleHost
import ModuleKit
import PluginFormat

/// Replacing for ever (docs/daemon.md): an image that ran code in this process is never
/// unmapped, so each in-process replace leaves one mapped. Once `retiredImageLimit` of them
/// are, the daemon executes its own program again, with the same pid and arguments: every
/// module hands its state over (willUnload, then its state, as in a replace), the daemon
/// stops as at SIGTERM, and the new program loads every plugin again and gives each module
/// its state back before its start. Memory and mappings stay within the limit's worth of
/// images, whatever the number of replaces.
extension Daemon {
    /// The environment variable that names the memory file holding the modules' states
    /// for the program that takes over (a descriptor number).
    static let handedOverStatesVariable = "MODHOST_HANDED_OVER_STATES"
    /// The most bytes of handed-over states read.
    static let handedOverStatesLimit = 1 << 30

    /// Executes the daemon again when the plugin set holds `retiredImageLimit` retired
    /// images or more, and no stop or renewal is under way.
    func renewIfNeeded() async {
        guard ready, !renewing else { return }
        let retired = await plugins.snapshot().retiredGenerations
        let limit = configuration.retiredImageLimit
        guard retired >= limit else { return }
        renewing = true
        logger.info("\(retired) retired plugin images are mapped in this process (retiredImageLimit \(limit)): modhostd executes itself again to unmap them; its modules hand their state over",
                    [("retired", "\(retired)"), ("limit", "\(limit)")])
        notify { try $0.reloading(status: "executing modhostd again") }
        let states = await plugins.unloadForSuccessor()
        let clean = await stop()
        // A SIGTERM or SIGINT that came meanwhile ends the daemon (`run()` exits).
        guard !terminationRequested else { return }
        let problem = executeAgain(states: states)
        logger.error("cannot execute modhostd again: \(problem); exiting so that the service manager starts it again",
                     [("clean", "\(clean)")])
        ExitGuard.exit(ExitCode.failure.rawValue)
    }

    /// Executes this program again with the same arguments and `states` in a file that
    /// has no name (created in the state directory, which only the daemon's user may
    /// enter, and unlinked at once) whose descriptor `handedOverStatesVariable` names;
    /// returns only when it cannot, with what failed.
    func executeAgain(states: [String: JSONValue]) -> String {
        let bytes = Array(JSONValue.object(states).jsonText.utf8)
        let path = stateDirectory + "/handed-over-states"
        unlink(path)
        // Not close-on-exec: the new program reads it.
        let fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { return "cannot create \(path): \(SystemError.describe(errno))" }
        unlink(path)
        var written = 0
        while written < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + written, bytes.count - written) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return "cannot write the modules' states: \(SystemError.describe(errno))" }
            written += n
        }
        guard closeOnExecAllDescriptors(keeping: fd) else {
            close(fd)
            return "cannot read /proc/self/fd to close what the new program must not hold"
        }
        setenv(Self.handedOverStatesVariable, "\(fd)", 1)
        execv("/proc/self/exe", CommandLine.unsafeArgv)
        let problem = "execv /proc/self/exe: \(SystemError.describe(errno))"
        unsetenv(Self.handedOverStatesVariable)
        close(fd)
        return problem
    }

    /// The states the program this one took over from handed over (`executeAgain`), read
    /// once and removed from the environment; nil when there are none. A variable that
    /// does not name a readable memory file of JSON states is logged and ignored.
    func takeHandedOverStates() -> [String: JSONValue]? {
        guard let text = getenv(Self.handedOverStatesVariable).map({ String(cString: $0) }) else { return nil }
        unsetenv(Self.handedOverStatesVariable)
        func ignored(_ problem: String) -> [String: JSONValue]? {
            logger.warning("\(Self.handedOverStatesVariable)=\(PluginName.shown(text)) \(problem); modules start without handed-over states")
            return nil
        }
        guard let fd = Int32(text), fd > 2 else { return ignored("is not a descriptor number above 2") }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_size >= 0,
              info.st_size <= off_t(Self.handedOverStatesLimit) else {
            return ignored("does not name a regular file of at most \(Self.handedOverStatesLimit >> 20) MiB")
        }
        var bytes = [UInt8](repeating: 0, count: Int(info.st_size))
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, $0.count - done, off_t(done)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return ignored("cannot be read whole") }
            done += n
        }
        guard case .object(let states)? = try? JSONValue.parse(bytes) else { return ignored("does not hold a JSON object") }
        return states
    }
}
