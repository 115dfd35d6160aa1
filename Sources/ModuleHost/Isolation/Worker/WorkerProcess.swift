import CDynamicLoader
import DaemonKit
import Glibc
@_spi(ModuleHost) import ModuleKit

/// The program `modhost-worker` runs: one isolated plugin, in a process of its own, for the
/// daemon that started it (docs/isolation.md). The daemon is the only client: the worker
/// refuses to run unless descriptors 3, 4 and 5 are UNIX sockets whose other ends belong to
/// its parent process.
///
/// Three sockets, each read by a thread of its own, so that a request is handled on the
/// thread that read it whenever it can be: 3 (control: the load frame, awaited events, log
/// lines and notifications), 4 (ordered requests, one at a time: a custom event or
/// notification for a C module is delivered right there, on the reading thread, without
/// waking another) and 5 (calls by name, run on its reading thread one at a time, and
/// answered there).
///
/// In order, before any plugin code runs: it asks for SIGKILL when its parent ends
/// (PR_SET_PDEATHSIG), checks who started it, closes every other descriptor but 0-2, works
/// in the root directory, puts
/// pipes it reads on 1 and 2 (`WorkerOutput`: the plugin's output is logged as its own), reads
/// the `load` frame, takes the group and user it names (when started by root), sets its
/// resource limits and PR_SET_NO_NEW_PRIVS; then it loads the plugin's dependencies and the
/// plugin, answers `ready` (or `failed`), and serves frames until the daemon closes the
/// socket, when it kills its whole process group and ends. It runs in a PID namespace of
/// its own, whose init (this program too, `namespaceInitArgument`) ends with it, and so
/// does every process its plugin started.
public enum WorkerProcess {
    /// The descriptor the daemon passes the control socket on.
    public static let socketDescriptor: Int32 = 3
    /// The socket of ordered requests (create, event, configure, state, restore).
    static let orderedDescriptor: Int32 = 4
    /// The socket of calls by name.
    static let callsDescriptor: Int32 = 5
    /// Exit status when not started by modhostd.
    public static let notStartedByDaemon: Int32 = 64

    /// The argument that makes `modhost-worker` the init of a worker's PID namespace
    /// (`modhost_worker_run_init`), which the daemon starts it with.
    static let namespaceInitArgument = "--namespace-init"

    /// Runs the worker, or its namespace's init; never returns.
    public static func main() -> Never {
        if CommandLine.arguments.count == 2, CommandLine.arguments[1] == namespaceInitArgument {
            var argv: [UnsafeMutablePointer<CChar>?] = [strdup(CommandLine.arguments[0]), nil]
            modhost_worker_run_init(&argv)
        }
        _ = modhost_worker_set_parent_death_signal(SIGKILL)
        // So that an address-space limit counts what the worker uses, not glibc's reserves.
        _ = modhost_worker_use_one_malloc_arena()
        // In the PID namespace the daemon starts it in, the worker's parent is the
        // namespace's init (pid 1) and the daemon, outside, reads as pid 0 at the sockets'
        // other ends; without one, the daemon is its parent.
        let parent = getppid()
        let descriptors = [socketDescriptor, orderedDescriptor, callsDescriptor]
        let daemon = parent == 1 ? 0 : parent
        guard parent >= 1, descriptors.allSatisfy({ modhost_worker_peer_pid($0) == daemon }) else {
            StandardError.write("modhost-worker: refused: it runs one isolated plugin for modhostd, which starts it over sockets on descriptors 3, 4 and 5; it is never started by hand (set \"isolation\": \"process\" in modhostd's configuration instead)\n")
            exit(notStartedByDaemon)
        }
        _ = modhost_worker_close_from(callsDescriptor + 1)
        // Nothing of the daemon's working directory reaches plugin code either (every path
        // the worker is given is absolute); the root directory is searchable by every user.
        _ = chdir("/")
        // From here on, descriptors 1 and 2 are pipes this worker reads: what the plugin
        // writes there is logged by the daemon as the plugin's, never as its own.
        let output = WorkerOutput.redirect()
        let channel = WorkerChannel(fd: socketDescriptor, maximumSize: WorkerFrame.controlMaximumSize)
        var reader = FrameReader(fd: socketDescriptor)
        var load: JSONValue
        do {
            load = try reader.next().json
        } catch {
            endGroup()
        }
        if load.integer("uid") != nil || load.integer("gid") != nil {
            switch imagesInMemory(load) {
            case .success(let inMemory): load = inMemory
            case .failure(let problem):
                channel.send(["op": WorkerOp.failed.json, "check": "isolation", "problem": .string(problem.text),
                              "fix": "check that the daemon's state directory is readable by the daemon"])
                endGroup()
            }
        }
        if let problem = takePrivileges(load, parent: parent) {
            channel.send(["op": WorkerOp.failed.json, "check": "isolation", "problem": .string(problem),
                          "fix": "correct the plugin's \"user\", \"group\" or \"limits\" in modhostd's configuration"])
            endGroup()
        }
        LoggingSystem.bootstrap(ChannelLogBackend(channel: channel), level: load.text("logLevel").flatMap(LogLevel.init(name:)) ?? .info)
        WorkerOutput.forward(output)
        let service: WorkerService
        do throws(LoadFailure) {
            service = try WorkerService(load: load, channel: channel)
        } catch {
            channel.send(["op": WorkerOp.failed.json, "check": .string(error.check.rawValue), "problem": .string(error.problem), "fix": .string(error.fix)])
            endGroup()
        }
        let (stream, continuation) = AsyncStream.makeStream(of: WorkerRequest.self)
        // Started before `ready`: the daemon sends on these sockets only once it has it.
        let ordered = WorkerChannel(fd: orderedDescriptor)
        let calls = WorkerChannel(fd: callsDescriptor)
        do throws(SystemError) {
            try startThread(name: "worker.ordered") { service.serveOrdered(ordered, slowPath: continuation) }
            try startThread(name: "worker.calls") { service.serveCalls(calls) }
        } catch {
            channel.send(["op": WorkerOp.failed.json, "check": "isolation", "problem": .string("the worker cannot start a thread: \(error)"),
                          "fix": "raise the plugin's \"limits\" (\"processes\", \"addressSpaceBytes\") in modhostd's configuration"])
            endGroup()
        }
        channel.send(["op": WorkerOp.ready.json,
                      "modules": .array(service.plugin.modules.map { ["name": .string($0.factory.name), "version": .string($0.factory.version)] })])
        Task { await service.serve(stream) }
        while true {
            do {
                let message = try reader.next()
                if message["answer"] != nil {
                    service.answers.receive(message.json)
                    continue
                }
                continuation.yield(WorkerRequest(message, replyTo: channel))
            } catch {
                // The daemon closed the socket (or ended): the C callbacks already queued (a
                // destroy after deinit) get the event deadline to finish, then everything of
                // this plugin ends.
                service.drain()
                endGroup()
            }
        }
    }

    /// Kills the worker's process group: the worker and whatever the plugin started.
    static func endGroup() -> Never {
        kill(0, SIGKILL)
        _exit(0)
    }

    /// A problem as text (a `Result`'s failure).
    struct Problem: Error {
        var text: String
    }

    /// `load` with its plugin image and preloads read from memory files: a worker that
    /// takes another user or group cannot open the daemon's private copies (its images
    /// directory is for the daemon's user only), so while it is still the daemon's user it
    /// copies each into a sealed memory file, which it loads as /proc/self/fd/N.
    static func imagesInMemory(_ load: JSONValue) -> Result<JSONValue, Problem> {
        guard case .object(var fields) = load, let image = load.text("image") else { return .success(load) }
        func copy(_ path: String) -> Result<JSONValue, Problem> {
            let name = "modhost-" + PathText.lastComponent(of: path)
            let fd = modhost_worker_memory_copy(path, name)
            guard fd >= 0 else { return .failure(Problem(text: "cannot copy \(path) into memory: \(SystemError.describe(errno))")) }
            return .success(.string("/proc/self/fd/\(fd)"))
        }
        do throws(Problem) {
            fields["image"] = try copy(image).get()
            var preloads: [JSONValue] = []
            if case .array(let paths) = load["preload"] ?? .null {
                for path in paths.compactMap(\.stringValue) { preloads.append(try copy(path).get()) }
            }
            fields["preload"] = .array(preloads)
        } catch {
            return .failure(error)
        }
        return .success(.object(fields))
    }

    /// Applies `load`'s group, user, limits and PR_SET_NO_NEW_PRIVS; the problem, if one
    /// could not be applied.
    static func takePrivileges(_ load: JSONValue, parent: pid_t) -> String? {
        if let problem = takeIdentity(load, parent: parent) { return problem }
        let limits: [(key: String, which: Int32)] = [("addressSpaceBytes", 0), ("openFiles", 1), ("cpuSeconds", 2), ("processes", 3)]
        for (key, which) in limits {
            guard let given = load["limits"]?[key] else { continue }
            guard let value = load["limits"]?.integer(key) else { return "cannot set limit \(key) to \(given.jsonText): not a whole number" }
            if modhost_worker_set_limit(which, UInt64(max(0, value))) != 0 {
                return "cannot set limit \(key) to \(value): \(SystemError.describe(errno))"
            }
        }
        if modhost_worker_set_no_new_privileges() != 0 { return "cannot set PR_SET_NO_NEW_PRIVS: \(SystemError.describe(errno))" }
        return nil
    }

    /// Takes `load`'s identity as a login does, in this order: the supplementary groups,
    /// the group, then the user; and checks that it holds, that root cannot be taken back,
    /// and that it still ends with `parent` (the daemon). Nothing when `load` names no
    /// user; the problem, if any step failed.
    static func takeIdentity(_ load: JSONValue, parent: pid_t) -> String? {
        guard let user = load.integer("uid") else { return nil }
        guard let group = load.integer("gid"), case .array(let listed) = load["groups"] ?? .null else {
            return "the load frame names user \(user) without a group and groups"
        }
        var groups = listed.compactMap { $0.wholeNumber.map { gid_t(truncatingIfNeeded: $0) } }
        guard setgroups(groups.count, &groups) == 0 else { return "cannot take the supplementary groups \(groups): \(SystemError.describe(errno))" }
        guard setgid(gid_t(group)) == 0 else { return "cannot take group \(group): \(SystemError.describe(errno))" }
        guard setuid(uid_t(user)) == 0 else { return "cannot take user \(user): \(SystemError.describe(errno))" }
        guard getuid() == uid_t(user), geteuid() == uid_t(user), getgid() == gid_t(group), getegid() == gid_t(group) else {
            return "took user \(user) and group \(group), but runs as uid \(geteuid()) and gid \(getegid())"
        }
        if user != 0, setuid(0) == 0 { return "took user \(user), but could take root back" }
        // A change of credentials clears the parent-death signal: asked for again, and the
        // daemon checked once more (it may have ended in between): it is still the parent
        // and still holds its end of the control socket.
        guard modhost_worker_set_parent_death_signal(SIGKILL) == 0, getppid() == parent,
              modhost_worker_peer_closed(socketDescriptor) == 0 else {
            return "cannot ask to end with the daemon after taking user \(user)"
        }
        return nil
    }
}
