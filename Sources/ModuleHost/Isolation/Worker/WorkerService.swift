import Dispatch
import Glibc
@_spi(ModuleHost) import ModuleKit
import PluginCall
import PluginFormat
import Synchronization

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
        let loader = PluginLoader(workers: workers) { name, host in
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
            _ = await queue.attempt("after destroy", deadline: left) {}
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

    /// Sends the reply `frame` to request `id`; one larger than `channel` takes (nil: larger
    /// than any frame) is answered `reply_too_large` instead, as the daemon answers a reply
    /// too large for its clients. (A send that fails otherwise finds the daemon gone: this
    /// worker then ends.)
    private func send(_ frame: [UInt8]?, replying id: JSONValue, on channel: WorkerChannel) {
        if let frame, frame.count - 4 <= channel.maximumSize {
            _ = channel.send(frame: frame, until: nil)
            return
        }
        let error: JSONValue = ["code": .string(PluginSetError.Code.replyTooLarge.rawValue),
                                "message": .string("the reply is larger than the \(channel.maximumSize >> 20) MiB a worker may send here: it is not sent; return less, or run the plugin in process")]
        channel.send(["id": id, "error": error])
    }
}
