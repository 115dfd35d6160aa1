import DaemonKit
import CDynamicLoader
import Glibc
import ModuleKit
import Synchronization

/// Attributes a fatal signal raised in a loaded plugin's code, at any time (a thread the
/// plugin started, a timer, an event handler), to that plugin, so that the next start
/// quarantines it.
///
/// A handler for SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT finds the plugin image that
/// holds the interrupted instruction, or else the nearest return address on the crashing
/// thread's stack (so `abort()` called by a plugin counts too), and writes that plugin's
/// record, prepared when the plugin was loaded, to `fatal.json` in the state directory
/// with async-signal-safe calls only. It then hands the signal to the handler that was
/// installed before (the Swift runtime's backtracer, or the default action): the process
/// still dies by the signal. A crash the handler cannot attribute to a plugin leaves no
/// record; the in-flight record (see `CrashGuard`) still names the file the host was
/// working on, if any.
package enum FatalSignalRecorder {
    /// Installs the handler, writing to `guard`'s `fatal.json` (emptied, with room for a
    /// record made in advance: a record needs no new disk space). Call it after
    /// `recoverFromPreviousRun()`. Returns why it could not, or nil.
    package static func install(_ guard: CrashGuard) -> String? {
        let fd: Int32
        switch `guard`.openFatalRecord() {
        case .success(let opened): fd = opened
        case .failure(let error): return "cannot open \(`guard`.fatalPath): \(error.message)"
        }
        guard modhost_crash_recorder_install(fd) == 0 else {
            return "cannot install the fatal-signal handler: \(SystemError.describe(errno))"
        }
        return nil
    }

    /// Remembers `loaded` (from `file`, with content `hash`) as a plugin a crash can be
    /// attributed to, making sure `guard`'s `fatal.json` has room for its record.
    static func track(_ loaded: LoadedPlugin, file: String, hash: String, guard: CrashGuard) {
        guard let library = loaded.library else { return }
        let record = String(JSONValue.object(["file": .string(file), "plugin": .string(loaded.name), "hash": .string(hash)]).jsonText.dropLast())
        // What the handler adds: phase, cause and time (crash_recorder.c, at most 192 bytes).
        `guard`.reserveFatalRecord(length: record.utf8.count + 192)
        _ = record.withCString { modhost_crash_recorder_add(library.handle, $0) }
    }
}

/// Turns a call of `exit()` from plugin code into a failure that systemd restarts.
///
/// An exit handler checks that the host itself asked to end (`ExitGuard.exit`). If not,
/// some other code called `exit()`: the plugin whose code is on the calling stack (else
/// the one the in-flight record names) is logged and recorded in `fatal.json` (so the next
/// start quarantines it, as after a crash), and the process ends at once with
/// `pluginExitStatus` instead of the status the plugin chose.
public enum ExitGuard {
    /// The exit status when code other than the host's called `exit()`.
    public static let pluginExitStatus = ExitCode.pluginExited.rawValue

    private static let daemonExiting = Atomic<Bool>(false)
    /// The process the check is about: in a child forked from it (by plugin code), an
    /// `exit()` is the child's own business.
    private static let processID = Atomic<Int32>(0)
    private static let installed = Mutex<(crashGuard: CrashGuard, logger: Logger)?>(nil)

    /// Installs the check (once per process; a later call changes the guard and logger).
    package static func install(_ crashGuard: CrashGuard, logger: Logger) {
        let first = installed.withLock { state in
            defer { state = (crashGuard, logger) }
            return state == nil
        }
        processID.store(getpid(), ordering: .sequentiallyConsistent)
        if first { on_exit({ status, _ in ExitGuard.unexpectedExit(status) }, nil) }
    }

    /// Ends the process with `status`, as the host's own decision: not a crash, so the
    /// crash guard's in-flight record is cleared first (a plugin still in its init or
    /// start, say when the shutdown budget ran out, is not quarantined at the next start).
    /// Only the first call ends the process: a thread that calls it later (two ends
    /// decided at once) waits for that end, as `exit` may not run twice at once.
    public static func exit(_ status: Int32) -> Never {
        if daemonExiting.exchange(true, ordering: .sequentiallyConsistent) {
            while true { pause() }
        }
        installed.withLock { $0?.crashGuard }?.exiting()
        Glibc.exit(status)
    }

    private static func unexpectedExit(_ status: Int32) {
        guard getpid() == processID.load(ordering: .sequentiallyConsistent),
              !daemonExiting.load(ordering: .sequentiallyConsistent),
              let (crashGuard, logger) = installed.withLock({ $0 }) else { return }
        let cause = "exit(\(status))"
        var record: UnsafePointer<CChar>?
        var crash: CrashGuard.Crash?
        if modhost_crash_recorder_caller(&record) != nil, let record {
            crash = try? JSONValue.parse(Array((String(cString: record) + #","phase":"run","time":""}"#).utf8)).decode(CrashGuard.Crash.self)
        }
        let current = crashGuard.current
        if crash == nil, let current, !current.plugin.isEmpty { crash = current }
        if var crash {
            if let current, current.plugin == crash.plugin { crash.phase = current.phase }
            crash.cause = cause
            crash.time = UTCTimestamp.now()
            crashGuard.recordFatal(crash)
            logger.error("plugin \(crash.plugin) called \(cause) (during \(crash.phase)); modhostd exits with status \(pluginExitStatus) so that it is restarted, and quarantines the plugin at the next start",
                         [("plugin", crash.plugin), ("file", crash.file)])
        } else {
            logger.error("code that is not modhostd's (no plugin found on the calling stack) called \(cause); modhostd exits with status \(pluginExitStatus) so that it is restarted")
        }
        _exit(pluginExitStatus)
    }
}
