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
    /// The environment variable that names the control socket's listener, which the
    /// program that takes over goes on accepting on (a descriptor number).
    static let handedOverListenerVariable = "MODHOST_HANDED_OVER_LISTENER"
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
        // The socket stays: clients that connect meanwhile wait in its backlog and are
        // answered by the new program.
        let listener = await owned.server?.stopKeepingListener()
        let states = await plugins.unloadForSuccessor()
        let clean = await stop()
        // A SIGTERM or SIGINT that came meanwhile ends the daemon (`run()` exits).
        guard !terminationRequested else {
            if let listener { close(listener) }
            return
        }
        let problem = executeAgain(states: states, listener: listener)
        logger.error("cannot execute modhostd again: \(problem); exiting so that the service manager starts it again",
                     [("clean", "\(clean)")])
        ExitGuard.exit(ExitCode.failure.rawValue)
    }

    /// Executes this program again with the same arguments and `states` in a file that
    /// has no name (created in the state directory, which only the daemon's user may
    /// enter, and unlinked at once) whose descriptor `handedOverStatesVariable` names, and
    /// `listener` (the control socket's) under `handedOverListenerVariable`; returns only
    /// when it cannot, with what failed.
    func executeAgain(states: [String: JSONValue], listener: Int32?) -> String {
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
        // What the daemon was started with stays open for the new program (a service
        // manager may watch a descriptor it gave the daemon); what was opened since, by the
        // daemon or by plugin code, is closed, but the states and the listener.
        let handedOver = [fd] + (listener.map { [$0] } ?? [])
        guard closeOnExecAllDescriptors(except: Set(inheritedDescriptors + handedOver)),
              handedOver.allSatisfy({ fcntl($0, F_SETFD, 0) == 0 }) else {
            close(fd)
            return "cannot read /proc/self/fd to close what the new program must not hold"
        }
        setenv(Self.handedOverStatesVariable, "\(fd)", 1)
        if let listener { setenv(Self.handedOverListenerVariable, "\(listener)", 1) }
        // The new program keeps this thread's signal mask, and a thread of Swift
        // concurrency blocks SIGTERM: unblocked, or the new daemon would never see one. (A
        // SIGTERM sent to the process meanwhile went to a thread that does not block it.)
        var none = sigset_t()
        sigemptyset(&none)
        pthread_sigmask(SIG_SETMASK, &none, nil)
        execv("/proc/self/exe", CommandLine.unsafeArgv)
        let problem = "execv /proc/self/exe: \(SystemError.describe(errno))"
        unsetenv(Self.handedOverStatesVariable)
        unsetenv(Self.handedOverListenerVariable)
        close(fd)
        return problem
    }

    /// The descriptors from 3 on that the program was started with (read once, when the
    /// daemon is made), but those a renewal handed over: kept open across a renewal.
    nonisolated static func descriptorsStartedWith() -> [Int32] {
        let handedOver = [handedOverStatesVariable, handedOverListenerVariable].compactMap { (name: String) -> Int32? in
            getenv(name).flatMap { Int32(String(cString: $0)) }
        }
        return openDescriptors().filter { !handedOver.contains($0) }
    }

    /// The control socket's listener the program this one took over from kept open
    /// (`executeAgain`), once, removed from the environment; nil when there is none or the
    /// variable names no descriptor above 2 (`ControlServer` checks the socket itself).
    func takeHandedOverListener() -> Int32? {
        guard let text = getenv(Self.handedOverListenerVariable).map({ String(cString: $0) }) else { return nil }
        unsetenv(Self.handedOverListenerVariable)
        guard let fd = Int32(text), fd > 2, fcntl(fd, F_GETFD) >= 0 else {
            logger.warning("\(Self.handedOverListenerVariable)=\(PluginName.shown(text)) is not an open descriptor above 2; the control socket is made anew")
            return nil
        }
        return fd
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
