import CDynamicLoader
import Dispatch
import DaemonKit
import Glibc
import ModuleKit
import Synchronization

/// Loads a plugin somewhere a crash does not reach the caller, before a `PluginSet` loads
/// it into its own process. Throwing refuses the plugin with that failure.
public protocol TrialLoader: Sendable {
    /// Loads `file` (its private copy, `file.resolvedPath`) after the images in
    /// `preloading` (the plugins it depends on, in order), and returns once that load
    /// succeeded; throws a `LoadFailure` naming `file.path` otherwise. Called from the plugin
    /// set's change queue, one trial at a time; it may take time (awaited, not blocking).
    func trialLoad(_ file: PluginFile, preloading: [String]) async throws(LoadFailure)
}

/// The default trial loader: `modhost-trial` in a short-lived child process, so that a
/// plugin that crashes when loaded takes the child down, not this process.
///
/// The trial is bounded by time, not by its output: it runs in a process group of its
/// own, which is killed whole at the deadline (`timeout`) and once the trial has ended (so
/// nothing a plugin's load-time code forked survives it); its verdict is read from what it
/// wrote before it ended, at most `TrialProcess.maximumReply` bytes, never by waiting for
/// the end of a pipe that a forked process may hold open. The trial loader itself refuses
/// a plugin whose load left a process behind.
///
/// The child is awaited off the caller's actor, so a daemon answers control requests while
/// it runs.
public struct ProcessTrialLoader: TrialLoader {
    /// The `modhost-trial` executable.
    public var executable: String
    /// How long a trial load may take, in seconds.
    public var timeout: Double

    /// `executable` nil: `modhost-trial` next to the running executable.
    public init(executable: String? = nil, timeout: Double = ProcessTrialLoader.defaultTimeout) {
        self.executable = executable ?? Self.besideExecutable
        self.timeout = timeout
    }

    /// How long a trial load may take by default, in seconds.
    public static let defaultTimeout: Double = 10

    /// `modhost-trial` next to the running executable.
    public static var besideExecutable: String {
        let executable = FileSystem.executablePath ?? CommandLine.arguments[0]
        return PathText.parent(of: executable) + "/modhost-trial"
    }

    public func trialLoad(_ file: PluginFile, preloading preloads: [String]) async throws(LoadFailure) {
        let trial = executable
        // A Swift plugin needs the host's ModuleKit (and with it the Swift runtime), which it
        // names `libModuleKit.so` (the library has no SONAME, so a preloaded copy would not
        // match that name): the child finds it on its library path. A C plugin needs
        // nothing, and its trial starts in about a millisecond.
        var environment = ProcessEnvironment.current
        // A crash is the verdict, said in one line (`crashed a trial load ... (signal 11)`):
        // not the Swift runtime's backtrace of the trial process, some 40 lines of the
        // daemon's log for each crash.
        environment["SWIFT_BACKTRACE"] = "enable=no"
        if file.manifest.language == .swift, !HostSDK.current.libraryPath.isEmpty {
            let directory = PathText.parent(of: HostSDK.current.libraryPath)
            environment["LD_LIBRARY_PATH"] = [directory, environment["LD_LIBRARY_PATH"]].compactMap { $0 }.joined(separator: ":")
        }
        var arguments: [String] = []
        for library in preloads { arguments += ["--preload", library] }
        arguments += [file.resolvedPath, file.name]

        let result: TrialProcess.Result
        do {
            result = try await TrialProcess.run(trial, arguments: arguments, environment: environment, timeout: timeout)
        } catch {
            throw LoadFailure(file: file.path, check: .crashGuard, problem: "cannot start the trial loader \(trial): \(error)",
                              fix: "install modhost-trial next to this executable, or give ProcessTrialLoader(executable:) its path")
        }
        switch result.ending {
        case .timedOut:
            throw LoadFailure(file: file.path, check: .crashGuard,
                              problem: "a trial load in a child process did not finish within \(Int(timeout)) s",
                              fix: "fix the plugin's load-time code (its entry point must return promptly)", trialEnding: "timeout")
        case .signalled(let signal):
            throw LoadFailure(file: file.path, check: .crashGuard,
                              problem: "the plugin crashed a trial load in a child process (signal \(signal), \(String(cString: strsignal(signal))))",
                              fix: "fix the plugin's load-time code; the host process was not affected",
                              trialEnding: "signal \(signal) (\(String(cString: strsignal(signal))))")
        case .exited(0):
            if let failure = Self.moduleMismatch(result.reply, file) { throw failure }
        case .exited(TrialProcess.leftoverProcessStatus):
            throw LoadFailure(file: file.path, check: .dlopen, problem: "trial load refused it: \(result.reply)",
                              fix: "start helper processes from the module's init or start, not while the plugin is loaded, and reap them")
        case .exited:
            throw Self.refusal(result.reply, file)
        }
    }

    /// The refusal a trial's reply "CAUSE: DETAIL" stands for, worded as the daemon's own
    /// loader words the same cause (`LoadFailure`'s builders), with the fix for that cause.
    static func refusal(_ reply: String, _ file: PluginFile) -> LoadFailure {
        let (cause, detail) = reply.firstIndex(of: ":").map { colon -> (String, String) in
            (String(reply[..<colon]), trimmed(reply[reply.index(after: colon)...]) { $0.isWhitespace && !$0.isNewline })
        } ?? (reply, "")
        let shown = JSONValue.escapingControlCharacters(detail)
        switch cause {
        case "dlopen": return .dlopenFailed(file.path, message: shown)
        case "preload":
            return LoadFailure(file: file.path, check: .dlopen, problem: "a plugin it depends on cannot be loaded with it: \(shown)",
                               fix: "fix or rebuild the plugins in its dependencies first")
        case "entry-missing": return .entryMissing(file.path)
        case "entry-foreign": return .entryForeign(file.path, owner: shown)
        case "entry-nowhere": return .entryForeign(file.path, owner: nil)
        case "entry-null": return .entryReturnedNull(file.path)
        case "plugin-name": return .descriptorNamesAnotherPlugin(file.path, described: shown, manifest: file.name)
        case "descriptor":
            return LoadFailure(file: file.path, check: .descriptor, problem: shown,
                               fix: "build the plugin against this host's modulehost.h with MODHOST_PLUGIN_INIT (C) or PluginExport.plugin (Swift)")
        default:
            return LoadFailure(file: file.path, check: .dlopen, problem: "trial load refused it: \(JSONValue.escapingControlCharacters(reply))",
                               fix: "rebuild the plugin with plugin.mk against this host")
        }
    }

    /// For a successful trial's reply ("ok COUNT" and a module name a line): the refusal when
    /// the entry's modules differ from the manifest's, as the daemon's loader refuses it; nil
    /// when they agree (or not all names fit in the reply and the count agrees).
    static func moduleMismatch(_ reply: String, _ file: PluginFile) -> LoadFailure? {
        let lines = reply.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard let first = lines.first, first.hasPrefix("ok "), let count = Int(first.dropFirst(3)) else { return nil }
        let names = Array(lines.dropFirst())
        let expected = file.manifest.modules
        if names.count == count {
            return names == expected ? nil
                : .modulesDiffer(file.path, described: names.map(JSONValue.escapingControlCharacters), manifest: expected)
        }
        return count == expected.count ? nil
            : .modulesDiffer(file.path, described: names.map(JSONValue.escapingControlCharacters) + ["... (\(count) in all)"], manifest: expected)
    }
}

/// One run of the trial loader: spawned in a new process group, killed with its whole group
/// at the deadline, its reply read without waiting for the end of the pipe.
enum TrialProcess {
    /// modhost-trial's exit status when the load left a process behind (it killed it).
    static let leftoverProcessStatus: Int32 = 3

    enum Ending: Equatable {
        case exited(Int32)
        case signalled(Int32)
        case timedOut
    }

    struct Result {
        var ending: Ending
        /// What the loader wrote to its standard output (at most `maximumReply` bytes),
        /// trimmed.
        var reply: String
    }

    /// The most of a trial's reply the daemon reads (modhost-trial writes at most 16 KiB,
    /// below a pipe's capacity).
    static let maximumReply = 16384

    struct SpawnError: Error, CustomStringConvertible {
        var description: String
    }

    /// Whether the trial has been reaped, and whether the watchdog killed it first; the
    /// lock keeps the watchdog from signalling a process group whose leader was reaped
    /// (its id could then be reused).
    private final class State: Sendable {
        let value = Mutex((ended: false, timedOut: false))
    }

    /// Runs `executable` with `arguments`; standard input is /dev/null, standard output a
    /// pipe for the reply, standard error the daemon's (a plugin's load-time messages reach
    /// the log).
    static func run(_ executable: String, arguments: [String], environment: [String: String],
                    timeout: Double) async throws(SpawnError) -> Result {
        var pipe: [Int32] = [-1, -1]
        guard modhost_pipe_cloexec(&pipe) == 0 else { throw SpawnError(description: "pipe: \(SystemError.describe(errno))") }
        let pid: pid_t
        do {
            pid = try spawn(executable, arguments: arguments, environment: environment, output: pipe[1])
        } catch {
            close(pipe[0])
            close(pipe[1])
            throw error
        }
        close(pipe[1])
        let state = State()
        let watchdog = DispatchWorkItem {
            state.value.withLock { value in
                guard !value.ended else { return }
                value.timedOut = true
                kill(-pid, SIGKILL)
                kill(pid, SIGKILL)
            }
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + timeout, execute: watchdog)
        let status = await withCheckedContinuation { (continuation: CheckedContinuation<Int32, Never>) in
            DispatchQueue.global().async {
                // Wait for the end without reaping, so the group cannot be reused while it is
                // killed; whatever the trial forked into its group dies with it.
                var info = siginfo_t()
                while waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR {}
                state.value.withLock { value in
                    value.ended = true
                    kill(-pid, SIGKILL)
                }
                var status: Int32 = 0
                while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
                continuation.resume(returning: status)
            }
        }
        watchdog.cancel()
        let reply = readAvailable(pipe[0], limit: maximumReply)
        close(pipe[0])
        let ending: Ending
        if state.value.withLock({ $0.timedOut }) {
            ending = .timedOut
        } else if status & 0x7f == 0 {
            ending = .exited((status >> 8) & 0xff)
        } else {
            ending = .signalled(status & 0x7f)
        }
        return Result(ending: ending, reply: trimmed(Substring(decoding: reply, as: UTF8.self)) { $0.isWhitespace })
    }

    private static func spawn(_ executable: String, arguments: [String], environment: [String: String],
                              output: Int32) throws(SpawnError) -> pid_t {
        let (code, pid) = spawnInGroup(executable, arguments: arguments, environment: environment) { actions in
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
            posix_spawn_file_actions_adddup2(&actions, output, 1)
        }
        guard code == 0 else { throw SpawnError(description: SystemError.describe(code)) }
        return pid
    }

    /// posix_spawn of `executable` in a process group of its own, with no signal blocked or
    /// ignored because this process does, exactly `environment`, and the descriptors
    /// `files` sets up: (posix_spawn's error, pid).
    static func spawnInGroup(_ executable: String, arguments: [String], environment: [String: String],
                             files: (inout posix_spawn_file_actions_t) -> Void) -> (Int32, pid_t) {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        files(&actions)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        posix_spawnattr_setpgroup(&attributes, 0)
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigdefault(&attributes, &all)

        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in envp { free(pointer) }
        }
        var pid: pid_t = 0
        let code = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        return (code, pid)
    }

    /// Reads what `fd` holds now, up to `limit` bytes, without waiting for more.
    private static func readAvailable(_ fd: Int32, limit: Int) -> [UInt8] {
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        var bytes = [UInt8](repeating: 0, count: limit)
        var count = 0
        while count < limit {
            let got = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress! + count, limit - count) }
            if got > 0 {
                count += got
            } else if got < 0 && errno == EINTR {
                continue
            } else {
                break
            }
        }
        return Array(bytes.prefix(count))
    }
}

/// `text` without the characters at its start and end that `isTrimmed` is true of.
private func trimmed(_ text: Substring, _ isTrimmed: (Character) -> Bool) -> String {
    guard let first = text.firstIndex(where: { !isTrimmed($0) }), let last = text.lastIndex(where: { !isTrimmed($0) }) else { return "" }
    return String(text[first...last])
}
