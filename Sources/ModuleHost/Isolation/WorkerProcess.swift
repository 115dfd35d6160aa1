import CDynamicLoader
import DaemonKit
import Dispatch
import Glibc
@_spi(ModuleHost) import ModuleKit
import PluginCall
import PluginFormat
import Synchronization

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
/// (PR_SET_PDEATHSIG), checks who started it, closes every other descriptor but 0-2, puts
/// pipes it reads on 1 and 2 (`WorkerOutput`: the plugin's output is logged as its own), reads
/// the `load` frame, takes the group and user it names (when started by root), sets its
/// resource limits and PR_SET_NO_NEW_PRIVS; then it loads the plugin's dependencies and the
/// plugin, answers `ready` (or `failed`), and serves frames until the daemon closes the
/// socket, when it kills its whole process group (itself and anything the plugin forked).
public enum WorkerProcess {
    /// The descriptor the daemon passes the control socket on.
    public static let socketDescriptor: Int32 = 3
    /// The socket of ordered requests (create, event, configure, state, restore).
    static let orderedDescriptor: Int32 = 4
    /// The socket of calls by name.
    static let callsDescriptor: Int32 = 5
    /// Exit status when not started by modhostd.
    public static let notStartedByDaemon: Int32 = 64

    /// Runs the worker; never returns.
    public static func main() -> Never {
        _ = modhost_worker_set_parent_death_signal(SIGKILL)
        // So that an address-space limit counts what the worker uses, not glibc's reserves.
        _ = modhost_worker_use_one_malloc_arena()
        let parent = getppid()
        let descriptors = [socketDescriptor, orderedDescriptor, callsDescriptor]
        guard parent > 1, descriptors.allSatisfy({ modhost_worker_peer_pid($0) == parent }) else {
            StandardError.write("modhost-worker: refused: it runs one isolated plugin for modhostd, which starts it over sockets on descriptors 3, 4 and 5; it is never started by hand (set \"isolation\": \"process\" in modhostd's configuration instead)\n")
            exit(notStartedByDaemon)
        }
        _ = modhost_worker_close_from(callsDescriptor + 1)
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
        if let problem = takePrivileges(load) {
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
        channel.send(["op": WorkerOp.ready.json, "pid": .number(Double(getpid())),
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
    static func takePrivileges(_ load: JSONValue) -> String? {
        if let group = load.integer("gid") {
            guard setgroups(0, nil) == 0, setgid(gid_t(group)) == 0 else { return "cannot take group \(group): \(SystemError.describe(errno))" }
        }
        if let user = load.integer("uid") {
            guard setuid(uid_t(user)) == 0 else { return "cannot take user \(user): \(SystemError.describe(errno))" }
        }
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
}

/// A request from the daemon, its id and the socket its reply goes to; `request` is nil
/// for a message that is no request the worker knows (answered `invalid_request`).
struct WorkerRequest: Sendable {
    let id: JSONValue
    let request: DaemonRequest?
    let op: String?
    let replyTo: WorkerChannel

    init(_ message: WorkerMessage, replyTo: WorkerChannel) {
        id = message["id"] ?? .null
        request = DaemonRequest(message)
        op = message.text("op")
        self.replyTo = replyTo
    }
}

/// The daemon's running module names, as of the last `create` (`has_module`).
final class DaemonModules: Sendable {
    let names = Mutex<Set<String>>([])
}

/// Questions the worker asks the daemon on the control socket (`{"op":"locate",...,"ask":K}`)
/// and their answers (`{"answer":K,...}`), which the control thread hands over: the asking
/// thread waits up to a deadline, and gets nil when none came by then; an answer that comes
/// later is dropped. The asking thread is inside plugin code (a C module's `has_module`, a
/// Swift module's lookup), which is synchronous and cannot await an actor or a stream: it
/// blocks on a semaphore with the deadline.
final class DaemonAnswers: Sendable {
    private final class Answer: Sendable {
        let value = Mutex<JSONValue?>(nil)
        let arrived = DispatchSemaphore(value: 0)
    }
    private let pending = Mutex((next: 1, waiting: [Int: Answer]()))

    /// Sends `question` on `channel` and waits up to `deadline` for its answer.
    func ask(_ question: [String: JSONValue], on channel: WorkerChannel, within deadline: Duration) -> JSONValue? {
        let answer = Answer()
        let id = pending.withLock { pending -> Int in
            defer { pending.next += 1 }
            pending.waiting[pending.next] = answer
            return pending.next
        }
        defer { _ = pending.withLock { $0.waiting.removeValue(forKey: id) } }
        var frame = question
        frame["ask"] = .number(Double(id))
        guard channel.send(.object(frame)),
              answer.arrived.wait(timeout: .now() + deadline.dispatchInterval) == .success else { return nil }
        return answer.value.withLock { $0 }
    }

    /// Hands an answer to the thread that asked, if it still waits.
    func receive(_ message: JSONValue) {
        guard let id = message.integer("answer"), let answer = pending.withLock({ $0.waiting[id] }) else { return }
        answer.value.withLock { $0 = message }
        answer.arrived.signal()
    }
}

/// Sends every log line of the worker to the daemon, which logs it as its own with the
/// plugin's name.
struct ChannelLogBackend: LogBackend {
    let channel: WorkerChannel

    func write(_ record: LogRecord) {
        channel.send(["op": WorkerOp.log.json, "level": .number(Double(record.level.rawValue)), "label": .string(record.label),
                      "message": .string(record.message),
                      "metadata": .array(record.metadata.map { .array([.string($0.0), .string($0.1)]) })])
    }
}

/// The plugin loaded in the worker and its modules, on a host instance of the worker's
/// own; serves the daemon's requests (docs/isolation.md, "Frames").
final class WorkerService: Sendable {
    /// Says that a notification of this plugin's could not be sent to the daemon.
    static func notPosted(_ notification: String, _ logger: Logger) {
        logger.warning("notification \(notification) was not posted: with its payload it is larger than the 1 MiB a worker may send at once (or the daemon has gone)",
                                          [("notification", notification)])
    }

    let channel: WorkerChannel
    let plugin: LoadedPlugin
    let host: HostInstance
    /// The worker's own log (sent to the daemon, which logs it as the plugin's worker's).
    let logger: Logger
    let workers: PluginWorkers
    /// Modules running elsewhere in the daemon, as of the last `create`: what `has_module`
    /// answers for names outside this plugin.
    let daemonModules = DaemonModules()
    /// The daemon's answers to what this worker asks it (where a module runs).
    let answers = DaemonAnswers()
    /// The C modules whose custom events and notifications the ordered thread delivers
    /// itself (`serveOrdered`), by name: set after each create, removed at deinit.
    let direct = Mutex<[String: CModule.Delivery]>([:])

    init(load: JSONValue, channel: WorkerChannel) throws(LoadFailure) {
        self.channel = channel
        let path = load.text("file") ?? ""
        func fail(_ problem: String) -> LoadFailure {
            LoadFailure(file: path, check: .manifest, problem: problem, fix: "restart modhostd; this is a bug if it persists")
        }
        guard let image = load.text("image"), let manifestJSON = load["manifest"] else { throw fail("the load frame lacks image or manifest") }
        let manifest: Manifest
        do {
            manifest = try Manifest(json: manifestJSON)
        } catch {
            throw fail("the load frame's manifest is invalid: \(error)")
        }
        let deadline = load["eventDeadlineSeconds"]?.numberValue.flatMap { CheckedNumber.duration(seconds: $0, in: 0.001...3600) } ?? .seconds(5)
        // Notifications its Swift modules make are the daemon's to deliver, as a C module's
        // post_notification (below): every module that listens gets them, in every process
        // and in the daemon's module order, these modules included (their stand-ins there
        // forward them back).
        // The name and log label of the daemon's host (an embedder's own): the worker's
        // modules log under them, as they would in process.
        let logger = Logger(label: load.text("label") ?? "modhostd")
        self.logger = logger
        let host = HostInstance(name: load.text("host") ?? "modhostd", eventDeadline: deadline, logger: logger,
                                forwardingNotifications: { notification, payload, module in
                                    var post: [String: JSONValue] = ["op": WorkerOp.post.json, "name": .string(notification), "payload": payload]
                                    if let module { post["module"] = .string(module) }
                                    if !channel.send(.object(post)) { Self.notPosted(notification, logger) }
                                },
                                locatingModules: { [answers = self.answers, daemonModules = self.daemonModules] module in
                                    Self.locate(module, plugin: manifest, asking: answers, on: channel, within: deadline,
                                                lastKnown: daemonModules)
                                })
        self.host = host
        let workers = PluginWorkers()
        self.workers = workers
        // The plugins it depends on are mapped first, under the names its NEEDED entries
        // ask for; their modules do not run here.
        if case .array(let preloads) = load["preload"] ?? .array([]) {
            for case .string(let library) in preloads {
                do {
                    _ = try DynamicLibrary(path: library)
                } catch {
                    throw LoadFailure(file: path, check: .dependency, problem: "cannot load a plugin it depends on (\(library)): \(error.message)",
                                      fix: "fix that plugin first")
                }
            }
        }
        let daemonModules = self.daemonModules
        let channelForPost = channel
        let loader = PluginLoader(registry: ModuleRegistry(), workers: workers) { name, host in
            try CHostServices(
                moduleName: name, logger: host.logger(for: name),
                post: { notification, payload in
                    if !channelForPost.send(["op": WorkerOp.post.json, "name": .string(notification), "payload": payload]) { Self.notPosted(notification, logger) }
                },
                hasModule: { name in host.isRunning(moduleNamed: name) || daemonModules.names.withLock { $0.contains(name) } })
        }
        let file = PluginFile(path: path, resolvedPath: image, manifest: manifest, dynamic: DynamicInfo(), warnings: [])
        plugin = try loader.open(file)
        if !manifest.dependencies.isEmpty {
            logger.warning(
                "plugin \(manifest.name) runs in a worker process: the modules of \(manifest.dependencies.joined(separator: ", ")) run elsewhere, and a cast of a module to one of their protocols finds nothing here (module(named:as:) throws \"isolated in another process\"); use events, notifications or calls by name across processes",
                [("plugin", manifest.name)])
        }
    }

    /// Where module `name`, which does not run in this worker, runs: asked of the daemon
    /// (up to the event deadline), which answers from its running modules; nil when it
    /// runs nowhere. A module of this plugin runs here or nowhere. Without an answer, the
    /// daemon's running modules as of this worker's last create.
    static func locate(_ name: String, plugin manifest: Manifest, asking answers: DaemonAnswers, on channel: WorkerChannel,
                       within deadline: Duration, lastKnown: DaemonModules) -> String? {
        guard !manifest.modules.contains(name) else { return nil }
        let elsewhere = "this module's plugin \(manifest.name) runs in a worker process of its own"
        guard let answer = answers.ask(["op": WorkerOp.locate.json, "module": .string(name)], on: channel, within: deadline) else {
            return lastKnown.names.withLock { $0.contains(name) } ? elsewhere : nil
        }
        guard answer["running"]?.boolValue == true else { return nil }
        return answer.text("plugin").map { "plugin \($0); \(elsewhere)" } ?? elsewhere
    }

    /// Waits, up to the event deadline, until no C callback is queued or running.
    func drain() {
        let until = ContinuousClock.now + host.eventDeadline
        while !(workers.busyModules.isEmpty && workers.busyCalls.isEmpty) && ContinuousClock.now < until {
            usleep(5_000)
        }
    }

    /// The ordered thread: reads the requests of socket 4, one at a time (the daemon sends
    /// the next only once this one is answered). A custom event or notification for a C
    /// module is delivered on this thread, in the module's order (`CModule.Delivery`),
    /// however long it takes: the daemon waits only up to its deadline and then kills this
    /// process. Every other request goes to `serve`, on the host instance's context, and is
    /// answered from there, before the daemon sends the next.
    func serveOrdered(_ channel: WorkerChannel, slowPath: AsyncStream<WorkerRequest>.Continuation) {
        var reader = FrameReader(fd: channel.fd)
        while let message = next(from: &reader, "its socket of ordered requests (4)") {
            let received = WorkerRequest(message, replyTo: channel)
            if case .event(let module, let kind, let name, let payload)? = received.request, kind == .custom || kind == .notification,
               let delivery = direct.withLock({ $0[module] }) {
                let event: ModuleEvent = kind == .custom ? .custom(name: name, payload: payload) : .notification(name: name, payload: payload)
                let stuck = delivery.deliverHere(event)?.what
                reply(received.id, members: stuck.map { ["stuck": .string($0)] } ?? [:], on: channel)
                continue
            }
            slowPath.yield(received)
        }
        // The daemon closed it: the control thread sees the same and ends the process.
    }

    /// The next request `reader` reads from `socket`, or nil once that has ended. The daemon
    /// closing it is the usual end; any other (a failed read, a frame this worker cannot
    /// read) is logged, so that the worker's end says why.
    private func next(from reader: inout FrameReader, _ socket: String) -> WorkerMessage? {
        do throws(FrameReader.End) {
            return try reader.next()
        } catch .closed {
            return nil
        } catch {
            logger.error("the worker stops reading \(socket): \(error)")
            return nil
        }
    }

    /// The calls thread: runs the calls by name of socket 5 one at a time, on this thread,
    /// and answers each on the same socket (where the daemon's caller reads it).
    func serveCalls(_ channel: WorkerChannel) {
        var reader = FrameReader(fd: channel.fd)
        while let message = next(from: &reader, "its socket of calls (5)") {
            let id = message["id"] ?? .null
            switch call(DaemonRequest(message)) {
            case .success(let value):
                reply(id, members: ["type": .string(value.type.rawValue), "value": value.json], on: channel)
            case .failure(let error):
                reply(id, members: ["error": ["code": .string(error.code.rawValue), "message": .string(error.message)]], on: channel)
            }
        }
    }

    /// Serves the requests in `stream`, in order; awaited events run beside the rest, each
    /// answering when it is done.
    func serve(_ stream: AsyncStream<WorkerRequest>) async {
        var settings: [String: ModuleSettings] = [:]
        for await received in stream {
            let channel = received.replyTo
            let id = received.id
            func reply(_ body: JSONValue) { self.reply(id, body, on: channel) }
            switch received.request {
            case .create(let module, let configuration, let running)?:
                daemonModules.names.withLock { $0 = Set(running) }
                settings[module] = ModuleSettings(configuration: configuration)
                await host.updateSettings(settings)
                reply(await createAnswer(module))
            case .event(let module, .deinitialize, _, _)?:
                // The daemon's module is gone (disabled, removed, replaced, shut down; it had
                // its willUnload): so is this one, and a later create makes a new instance.
                // Answered once a C module's destroy (queued after its deinit) has returned,
                // so that it has run before the daemon may end this process.
                let queues = workers.queues(module: module)
                _ = direct.withLock { $0.removeValue(forKey: module) }
                settings[module] = nil
                await host.removeUnloaded(moduleNamed: [module])
                if workers.stuck(module: module) == nil { await finish(queues) }
                reply(stuckReply(module))
            case .event(let module, .start, _, _)?:
                // Through the host, so that what it held for the module until its start (a
                // custom event one of this plugin's modules sent it) is delivered now.
                await host.start(moduleNamed: module)
                reply(stuckReply(module))
            case .event(let module, let kind, let name, let payload)?:
                let event: ModuleEvent = kind == .custom ? .custom(name: name, payload: payload) : .notification(name: name, payload: payload)
                await host.perform { host in host.module(named: module)?.handle(event, host: host) }
                reply(stuckReply(module))
            case .info(let module)?:
                let info = await host.perform { host in host.module(named: module)?.info }
                reply(["info": info.flatMap { try? JSONValue(encoding: $0) } ?? .null])
            case .awaited(let module, let event, let payload)?:
                // Answered from a task of its own: the next request does not wait for it.
                Task { self.reply(id, await self.awaited(event, payload: payload, module: module), on: channel) }
            case .configure(let module, let configuration)?:
                settings[module] = ModuleSettings(configuration: configuration)
                await host.updateSettings(settings)
                await updateDirect(module)
                reply(["running": .bool(host.isRunning(moduleNamed: module))])
            case .state(let module)?:
                let state = await host.perform { host in host.module(named: module)?.stateForReplacement(host: host) }
                reply(["state": state ?? .null])
            case .restore(let module, let state)?:
                await host.perform { host in host.module(named: module)?.restore(state: state, host: host) }
                reply([:])
            case .call?, nil:
                reply(["error": ["code": "invalid_request", "message": .string("unknown op \(received.op ?? "none") on this socket, or a member missing")]])
            }
        }
    }

    /// Creates `module` (its settings set already) and says how it went; a module whose
    /// create overran is stuck, and the answer says so (the daemon then ends this process).
    private func createAnswer(_ module: String) async -> JSONValue {
        var created = await create(module)
        await updateDirect(module)
        if let stuck = workers.stuck(module: module), case .object(var fields) = created {
            fields["stuck"] = .string(stuck.what)
            created = .object(fields)
        }
        return created
    }

    /// Sends `module` the awaited event `message` names and says how it went, with whether
    /// this host gave up on it at its deadline (the daemon counts the overrun).
    private func awaited(_ name: String, payload: JSONValue, module: String) async -> JSONValue {
        let event: AsyncModuleEvent
        switch name {
        case "willUnload": event = .willUnload
        case "willTerminate": event = .willTerminate
        default: event = .custom(name: name, payload: payload)
        }
        let metrics = host.metrics.module(named: module)
        let overruns = metrics.snapshot().deadlineOverruns
        await host.send(event, to: module)
        var answer = stuckReply(module)
        if metrics.snapshot().deadlineOverruns != overruns, case .object(var fields) = answer {
            fields["overran"] = true
            answer = .object(fields)
        }
        return answer
    }

    /// Waits, up to the event deadline all told, until what is queued on `queues` now (a C
    /// module's destroy) has run.
    private func finish(_ queues: [PluginWorker]) async {
        let until = ContinuousClock.now + host.eventDeadline
        for queue in queues {
            let left = until - .now
            guard left > .zero else { return }
            _ = await withDeadline(left) { await queue.run("after destroy", deadline: left) {} }
        }
    }

    /// Creates `module` (and so initializes it: `add` does); its notifications and info,
    /// or `created: false` when its factory refused.
    private func create(_ module: String) async -> JSONValue {
        guard let factory = plugin.modules.first(where: { $0.factory.name == module })?.factory else {
            return ["created": false]
        }
        if await !host.perform({ $0.module(named: module) != nil }) { await host.add([factory]) }
        let described: (notifications: [String], info: ModuleInfo)? = await host.perform { host in
            host.module(named: module).map { (Array($0.notifications).sorted(), $0.info) }
        }
        guard let described else { return ["created": false] }
        let info = (try? JSONValue(encoding: described.info)) ?? .null
        return ["created": true, "notifications": .array(described.notifications.map { .string($0) }), "info": info]
    }

    /// Lets the ordered thread deliver events to `module` itself if it is a running C module.
    private func updateDirect(_ module: String) async {
        let delivery = await host.perform { host in (host.module(named: module) as? CModule)?.delivery }
        direct.withLock { $0[module] = delivery }
    }

    /// A reply that says whether `module`'s C code overran its deadline and is stuck.
    private func stuckReply(_ module: String) -> JSONValue {
        if let stuck = workers.stuck(module: module) { return ["stuck": .string(stuck.what)] }
        return [:]
    }

    /// Calls a function by name (on the calls thread): its value, or the error the daemon
    /// would give in process.
    private func call(_ request: DaemonRequest?) -> Result<CallValue, PluginSetError> {
        guard case .call(let function, let arguments)? = request else {
            return .failure(PluginSetError(.callFailed, "the worker was sent a frame on its socket of calls that is no call"))
        }
        guard let table = plugin.functions else {
            return .failure(PluginSetError(.unknownFunction, "plugin \(plugin.name) exports no functions for calling by name"))
        }
        do throws(CallError) {
            switch arguments {
            case .none: return .success(try table.call(function, json: []))
            case .texts(let texts): return .success(try table.call(function, texts: texts))
            case .json(let values): return .success(try table.call(function, json: values))
            }
        } catch {
            return .failure(PluginSetError(error))
        }
    }

    private func reply(_ id: JSONValue, _ body: JSONValue, on channel: WorkerChannel) {
        guard case .object = body else { return }
        send(WorkerFrame.encode(body, id: id), replying: id, on: channel)
    }

    /// `reply` with the members of the body in the order given (as `jsonText` writes them:
    /// in name order, for the same text), written without building a dictionary first.
    private func reply(_ id: JSONValue, members: KeyValuePairs<String, JSONValue>, on channel: WorkerChannel) {
        send(WorkerFrame.encode(members: members, id: id), replying: id, on: channel)
    }

    private func send(_ frame: [UInt8]?, replying id: JSONValue, on channel: WorkerChannel) {
        if channel.send(frame: frame, until: nil) != .sent {
            channel.send(["id": id, "error": ["code": .string(PluginSetError.Code.callFailed.rawValue), "message": .string("the reply is larger than \(channel.maximumSize >> 20) MiB")]])
        }
    }
}
