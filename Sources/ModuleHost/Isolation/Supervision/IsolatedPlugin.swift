import CDynamicLoader
import DaemonKit
import Dispatch
import Glibc
@_spi(ModuleHost) import ModuleKit
import PluginCall
import PluginFormat
import Synchronization

/// One plugin running in a `modhost-worker` process, supervised: the daemon side of
/// docs/isolation.md. Its modules are `IsolatedModule`s in the daemon's host instance; each
/// forwards what it is given over the worker's socket.
///
/// Supervision: a worker that crashes, exits or does not answer within the event deadline
/// (it is then killed) is logged with the plugin's name and its signal or exit status; its
/// modules are `crashed` (they get nothing) until a new worker runs them again, created,
/// initialized and started with the configuration they had. The first restart is at once,
/// the next after 0.1 s, 0.2 s, ... (doubling); `burst` crashes within `window` quarantine
/// the plugin. A worker's whole process group is killed when it ends.
public final class IsolatedPlugin: Sendable {
    public let name: String
    let file: PluginFile
    let preloads: [String]
    let settings: PluginIsolationSettings
    let policy: IsolationPolicy
    let host: HostInstance
    /// Where a module's event that its worker did not answer in time is recorded (the
    /// daemon fails that event's request as it fails one a stuck module overran).
    let workers: PluginWorkers
    /// Where its workers are recorded, so that a later start can end what they leave (`WorkerRecords`).
    let workerRecords: WorkerRecords
    let logger: Logger
    let deadline: Duration
    /// What its workers post, waiting for delivery in the daemon (bounded).
    private let posts: NotificationQueue
    /// How many of its workers' log lines the daemon logs a second.
    private let logLines: LogLineRate
    /// Notifications its workers posted under a lifecycle name, refused.
    private let lifecyclePosts: DropReport
    /// The type each function its manifest exports returns: a worker's answer to a call
    /// must be a value of it.
    private let returnTypes: [String: ValueType]

    struct ModuleRecord {
        var configuration: JSONValue
        var started = false
    }

    struct State {
        var connection: WorkerConnection?
        var phase = WorkerStatus.Phase.starting
        var restarts = 0
        var crashes = 0
        var crashTimes: [WorkerEnd] = []
        var lastCrash: String?
        /// The modules the daemon runs, in creation order, and how to run them again.
        var modules: [(name: String, record: ModuleRecord)] = []
        var startedOnce = false
        /// Set when the host shuts down: a worker that ends from then on is not restarted.
        var restartsEnded = false
    }
    /// Its worker, phase and counts; the modules to run again after a restart.
    let state = Mutex(State())

    init(file: PluginFile, preloads: [String], settings: PluginIsolationSettings, policy: IsolationPolicy,
         workerRecords: WorkerRecords, host: HostInstance, workers: PluginWorkers, logger: Logger) {
        name = file.name
        self.workerRecords = workerRecords
        self.workers = workers
        self.file = file
        self.preloads = preloads
        self.settings = settings
        self.policy = policy
        self.host = host
        self.logger = logger.with("plugin", file.name)
        deadline = host.eventDeadline
        posts = NotificationQueue(host: host, plugin: file.name, logger: logger)
        logLines = LogLineRate(plugin: file.name, logger: logger)
        lifecyclePosts = .lifecycleNamedNotifications(poster: "plugin \(file.name)", logger: logger.with("plugin", file.name))
        // The manifest check has parsed every signature already.
        returnTypes = Dictionary(file.manifest.exports.compactMap { export in
            (try? Signature(parsing: export.signature)).map { (export.name, $0.returnType) }
        }, uniquingKeysWith: { first, _ in first })
    }

    /// The worker now.
    public var status: WorkerStatus {
        let (phase, connection, restarts, crashes, lastCrash) = state.withLock {
            ($0.phase, $0.connection, $0.restarts, $0.crashes, $0.lastCrash)
        }
        let pid = phase == .running || phase == .starting ? connection?.pid : nil
        return WorkerStatus(phase: phase, pid: pid, restarts: restarts, crashes: crashes, lastCrash: lastCrash,
                            residentBytes: pid.flatMap(Self.residentBytes(of:)),
                            droppedNotifications: posts.dropped.total, droppedLogLines: logLines.dropped.total)
    }

    /// Starts the first worker and returns the modules its plugin provides (name, version).
    func start() async throws(LoadFailure) -> [(name: String, version: String)] {
        if geteuid() != 0, settings.user != nil || settings.group != nil {
            logger.warning("plugins.\(name).user and group are not applied: only a daemon running as root starts a worker as another user; this worker runs as uid \(geteuid())")
        }
        let connection = try await launch()
        state.withLock {
            $0.connection = connection
            $0.phase = .running
        }
        // A worker that ended between its ready frame and now was not ours yet to restart.
        if let ending = connection.ending { ended(connection, ending, stoppedQuietly: false) }
        return connection.modules
    }

    /// The event deadline the worker keeps itself: shorter than the daemon's by a tenth (at
    /// most 250 ms), so that an awaited handler the worker's host gives up on at its deadline
    /// (cancelled, as in process) is answered before the daemon's deadline passes, and the
    /// worker is not killed for it. A C callback that does not return by then still is.
    var workerDeadline: Duration { deadline - min(deadline / 10, .milliseconds(250)) }

    /// Spawns a worker, sends it the load frame and waits (up to the trial deadline) for it
    /// to be ready.
    func launch() async throws(LoadFailure) -> WorkerConnection {
        func fail(_ problem: String, _ fix: String) -> LoadFailure {
            LoadFailure(file: file.path, check: .isolation, problem: problem, fix: fix)
        }
        var load: [String: JSONValue] = [
            "op": WorkerOp.load.json, "plugin": .string(name), "file": .string(file.path), "image": .string(file.resolvedPath),
            "host": .string(host.name), "label": .string(host.logger.label),
            "preload": .array(preloads.map { .string($0) }), "logLevel": .string(policy.logLevel.description),
            "eventDeadlineSeconds": .number(Double(workerDeadline.components.seconds) + Double(workerDeadline.components.attoseconds) / 1e18),
            "limits": settings.limits.json,
        ]
        if let manifest = try? JSONValue(encoding: file.manifest) { load["manifest"] = manifest }
        if geteuid() == 0 {
            do {
                if let identity = try Self.identity(user: settings.user, group: settings.group) {
                    load["uid"] = .number(Double(identity.uid))
                    load["gid"] = .number(Double(identity.gid))
                    load["groups"] = .array(identity.groups.map { .number(Double($0)) })
                }
            } catch {
                throw fail(error.description, "give plugins.\(name) a \"user\" with an account in the user database, or a numeric \"user\" and a \"group\"")
            }
            // RLIMIT_NPROC binds no root process: a limit that would bind nothing is refused.
            if settings.limits.processes != nil && (load["uid"]?.numberValue ?? 0) == 0 {
                throw fail("its \"processes\" limit would bind nothing: the worker would run as root, and RLIMIT_NPROC does not apply to root",
                           "give the plugin a \"user\" of its own (plugins.\(name).user in modhostd's configuration), or remove \"processes\"")
            }
        }
        let connection: WorkerConnection
        do {
            connection = try WorkerConnection.spawn(policy.workerExecutable, plugin: self)
        } catch {
            throw fail("cannot start the worker \(policy.workerExecutable): \(error)",
                       "install modhost-worker next to modhostd")
        }
        let readyWithin = Duration.seconds(ProcessTrialLoader.defaultTimeout)
        switch await connection.sendLoad(.object(load), within: readyWithin) {
        case .sent:
            break
        case .timedOut:
            // Killed for it by the worker poller.
            throw fail("its worker did not read its load frame within \(readyWithin.secondsText)", "see the log lines before this one")
        case .gone:
            connection.stop()
            throw fail("the worker ended before it was given its plugin", "see the log lines before this one")
        }
        let ready = await connection.ready(within: readyWithin)
        switch ready {
        case .success:
            return connection
        case .failure(let failure):
            connection.stop()
            throw LoadFailure(file: file.path, check: failure.check, problem: failure.problem, fix: failure.fix)
        }
    }

    // MARK: - What modules ask

    /// Creates module `module` in the worker; nil when its factory refused, or when the
    /// request to create it, with its configuration, is larger than a frame (it cannot be
    /// sent: logged). When the worker cannot answer, the module is still created here,
    /// `crashed`, and the worker restarted.
    func create(_ module: String, configuration: JSONValue, running: [String]) -> (info: ModuleInfo?, notifications: Set<String>)? {
        state.withLock { state in
            state.modules.removeAll { $0.name == module }
            state.modules.append((module, ModuleRecord(configuration: configuration)))
        }
        let outcome = requestOutcome(.create(module: module, configuration: configuration, running: running), what: "create of \(module)",
                                     module: module)
        guard case .reply(let reply)? = outcome else {
            // Not sent: no module of that name runs in the worker, so none stands for it here.
            if case .tooLarge? = outcome {
                state.withLock { $0.modules.removeAll { $0.name == module } }
                return nil
            }
            return (nil, [])
        }
        if reply["created"]?.boolValue != true {
            state.withLock { $0.modules.removeAll { $0.name == module } }
            return nil
        }
        let info = info(in: reply, of: module)
        var names: Set<String> = []
        if case .array(let list) = reply["notifications"] ?? .null { names = Set(list.compactMap(\.stringValue)) }
        return (info, names)
    }

    /// Delivers a synchronous event; returns once the worker has (or could not).
    func deliver(_ module: String, kind: DaemonRequest.EventKind, event: String, payload: JSONValue) {
        if kind == .start {
            state.withLock { state in
                if let index = state.modules.firstIndex(where: { $0.name == module }) { state.modules[index].record.started = true }
            }
        }
        let given = workers.beginIsolated(module: module, event: event)
        _ = request(.event(module: module, kind: kind, name: event, payload: payload), what: event, module: module)
        workers.endIsolated(module: module, given)
        if kind == .deinitialize { state.withLock { $0.modules.removeAll { $0.name == module } } }
    }

    /// Delivers an awaited event and waits for it: the host instance goes on at the event
    /// deadline, as for any module; the worker, whose own host gives up on the handler a
    /// little earlier (`workerDeadline`), is killed only if it has not answered a grace
    /// period later (the deadline again, at most 1 s), so a slow machine does not cost a
    /// module that was merely late its worker.
    func deliverAwaited(_ module: String, event: String, payload: JSONValue) async {
        guard let connection = currentConnection else {
            notDelivered(module, event)
            return
        }
        let given = workers.beginIsolated(module: module, event: event)
        let outcome = await connection.requestAsync(.awaited(module: module, event: event, payload: payload),
                                                    what: event, deadline: deadline + min(deadline, .seconds(1)))
        // The host instance counts an awaited event it stopped waiting for as an overrun; the
        // worker's host, which gives up a little earlier (`workerDeadline`), says when it did.
        if case .reply(let reply) = outcome, reply["overran"]?.boolValue == true {
            host.metrics.module(named: module).recordDeadlineOverrun()
        }
        check(outcome, connection, what: event, module: module, countsOverrun: false)
        workers.endIsolated(module: module, given)
    }

    /// Gives `module` a new configuration in the worker; false when it removed itself.
    func configure(_ module: String, configuration: JSONValue) -> Bool {
        state.withLock { state in
            if let index = state.modules.firstIndex(where: { $0.name == module }) { state.modules[index].record.configuration = configuration }
        }
        guard let reply = request(.configure(module: module, configuration: configuration), what: "configurationChanged")
        else { return true }
        return reply["running"]?.boolValue ?? true
    }

    /// The info of `module` as the worker's module reports it now; nil when no worker runs,
    /// it did not answer within the event deadline, or its answer was an error (an info
    /// larger than a reply may be): logged, and the caller answers from the last info it had.
    func info(_ module: String) -> ModuleInfo? {
        let phase = state.withLock { $0.phase }
        let outcome = requestOutcome(.info(module: module), what: "info of \(module)")
        let why: String
        switch outcome {
        case .reply(let reply)?:
            guard let error = reply["error"] else { return info(in: reply, of: module) }
            why = "its worker could not send it: \(LogLineRate.bounded(error.text("message") ?? "no reason given"))"
        case .timedOut?: why = "its worker did not answer within \(deadline.secondsText)"
        case .gone?: why = "its worker ended"
        default: why = "its worker is \(phase.rawValue)"
        }
        logger.warning("the info of module \(module) is the last known (from its worker, or its name and version): \(why)", [("module", module)])
        return nil
    }

    /// The module info in a worker's `reply`, nil when it has none. The worker's replies are
    /// its plugin's code to write: an info that cannot be read is logged, and counts as none.
    private func info(in reply: WorkerMessage, of module: String) -> ModuleInfo? {
        guard let value = reply["info"], value != .null else { return nil }
        do {
            return try value.decode(ModuleInfo.self)
        } catch {
            logger.warning("module \(module)'s worker answered an info that cannot be read (\(error)); its name and version stand for it",
                           [("module", module)])
            return nil
        }
    }

    /// The state `module` hands over to the version that replaces it; nil when it has none
    /// or its worker could not send it (larger than a frame: logged, naming the module, as
    /// the new version then starts without it).
    func stateForReplacement(_ module: String) -> JSONValue? {
        guard let reply = request(.state(module: module), what: "stateForReplacement") else { return nil }
        if let error = reply["error"] {
            logger.error("module \(module)'s state for replacement is not handed over: \(LogLineRate.bounded(error.text("message") ?? "its worker could not send it")); the new version starts without it",
                         [("module", module)])
            return nil
        }
        guard let state = reply["state"], state != .null else { return nil }
        return state
    }

    func restore(_ module: String, state: JSONValue) {
        _ = request(.restore(module: module, state: state), what: "restore")
    }

    /// Calls `function` in the worker with arguments as text (`texts`) or JSON values
    /// (`json`), as a plugin loaded in process is called: the same results and the same
    /// error codes (`CallError.code`). Given a `deadline`, the call fails with
    /// `deadline_exceeded` once it has passed (the function goes on in the worker); without
    /// one it waits for the result as long as it takes. Either way a worker that does not
    /// read the call within that deadline (or the event deadline) is killed as unanswering.
    public func call(_ function: String, texts: [String]? = nil, json: [JSONValue]? = nil,
                     deadline: Duration? = nil) async throws(PluginSetError) -> CallValue {
        guard let connection = currentConnection else {
            let phase = status.phase
            throw PluginSetError(.callFailed, "plugin \(name)'s worker is not running (\(phase.rawValue)); "
                                    + (phase == .quarantined ? "it stays down until its file changes or modhostctl enable names one of its modules"
                                                             : "try again once it is restarted"))
        }
        if let busy = connection.overrunCall {
            throw PluginSetError(.pluginBusy, "plugin \(name) is busy: \(busy.function) has been running for \((ContinuousClock.now - busy.since).secondsText) in its worker; it gets no new call until that returns")
        }
        let arguments: DaemonRequest.CallArguments = if let texts { .texts(texts) } else if let json { .json(json) } else { .none }
        let outcome: WorkerConnection.Outcome
        switch await connection.call(function: function, arguments: arguments, deadline: deadline) {
        case .outcome(let answered):
            outcome = answered
        case .notStarted(let ahead):
            throw PluginSetError(.pluginBusy, PluginWorker.notStarted(plugin: name, function: function, deadline: deadline ?? self.deadline,
                                                                     ahead: ahead.map { PluginWorker.Stuck(what: "\($0.function) in its worker", elapsed: $0.running) }))
        }
        switch outcome {
        case .reply(let reply):
            if let error = reply["error"] {
                throw PluginSetError(error.text("code").flatMap(PluginSetError.Code.init(rawValue:)) ?? .callFailed, error.text("message") ?? "the call failed")
            }
            // What the worker answers is the plugin's code's to write: a value of another type
            // than plugin.json declares (or none) is no result, and ends the worker as any
            // invalid frame does.
            let declared = returnTypes[function]
            guard let type = reply.text("type").flatMap(ValueType.init(rawValue:)), type == declared,
                  let value = Self.result(of: type, reply["value"] ?? .null)
            else {
                let given = reply.text("type").map { JSONValue.escapingControlCharacters(String($0.prefix(40))) }
                let reason = given == declared?.rawValue
                    ? "it answered call \(function) with a value that is no \(given ?? "")"
                    : "it answered call \(function) with \(given.map { "a value of type \($0)" } ?? "no type"), where plugin.json declares \(declared?.rawValue ?? "no such function")"
                connection.kill(reason: reason)
                throw PluginSetError(.callFailed, "plugin \(name)'s worker gave an invalid result: \(reason); it is restarted")
            }
            return value
        case .timedOut:
            throw PluginSetError(.deadlineExceeded, "call \(name).\(function) did not return within the deadline of \((deadline ?? self.deadline).secondsText); it goes on in its worker, and the plugin gets no new call until it returns")
        case .gone:
            // How this worker ended (not the one before it): the poller may see its sockets
            // close before it reaps it.
            let ending = await connection.ending(within: .seconds(2))
            throw PluginSetError(.callFailed, "plugin \(name)'s worker ended during the call of \(function)\(ending.map { " (\($0))" } ?? ""); it is restarted")
        case .tooLarge:
            throw PluginSetError(.invalidArguments, "call \(name).\(function): its arguments are larger than the \(WorkerFrame.maximumSize >> 20) MiB a request to an isolated plugin may hold; pass less, or run the plugin in process")
        }
    }

    /// The value a worker's answer `json` gives for a function returning `type`: a `void`
    /// function's answer is `null` (`CallValue.void` as JSON); nil when `json` is no value
    /// of the type.
    static func result(of type: ValueType, _ json: JSONValue) -> CallValue? {
        if type == .void { return json == .null ? .void : nil }
        return try? type.value(fromJSON: json)
    }

    private var currentConnection: WorkerConnection? {
        state.withLock { $0.phase == .running ? $0.connection : nil }
    }

    /// Sends `request` and waits for its reply up to the event deadline; nil when no worker
    /// runs or it did not answer (it is then killed and restarted).
    private func request(_ request: DaemonRequest, what: String, module: String? = nil) -> WorkerMessage? {
        if case .reply(let reply)? = requestOutcome(request, what: what, module: module) { return reply }
        return nil
    }

    /// `request`, saying what became of it; nil when no worker ran to send it to.
    private func requestOutcome(_ request: DaemonRequest, what: String, module: String? = nil) -> WorkerConnection.Outcome? {
        guard let connection = currentConnection else {
            if let module { notDelivered(module, what) }
            return nil
        }
        let outcome = connection.request(request, deadline: deadline)
        check(outcome, connection, what: what, module: module)
        return outcome
    }

    /// Records that `event` was not given to `module`: no worker runs it now (crashed,
    /// restarting, quarantined). A `send` of it then fails with `worker_ended`, and the
    /// module's `not_delivered` errors count it.
    private func notDelivered(_ module: String, _ event: String) {
        workers.recordUnanswered(module: module, event: event, why: .workerDown)
        host.metrics.module(named: module).recordError(.notDelivered)
    }

    /// A worker that did not answer in time, or whose module's code overran its deadline
    /// there, is killed: the supervision restarts it. The event `module` did not answer is
    /// recorded first (`PluginWorkers.leftUnanswered`), so that whatever fails with the
    /// worker's end finds it, and counted as the module's deadline overrun (as a C module's
    /// in process) unless `countsOverrun` is false.
    func check(_ outcome: WorkerConnection.Outcome, _ connection: WorkerConnection, what: String, module: String? = nil,
                       countsOverrun: Bool = true) {
        let reason: String
        switch outcome {
        case .timedOut:
            reason = "it did not answer \(what) within \(deadline.secondsText)\(limitsHint)"
        case .reply(let reply):
            // What the worker says it is stuck in: its own words, bounded as its log lines are.
            guard let stuck = reply.text("stuck") else { return }
            reason = "its code did not return from \(LogLineRate.bounded(stuck)) within \(deadline.secondsText)"
        case .gone:
            if let module { workers.recordUnanswered(module: module, event: what, why: .workerEnded) }
            return
        case .tooLarge:
            // Not sent: the worker is not to blame, and runs on.
            if let module { host.metrics.module(named: module).recordError(.notDelivered) }
            logger.warning("\(what) not delivered to \(module.map { "module \($0)" } ?? "plugin \(name)")'s worker: with its payload it is larger than the \(WorkerFrame.maximumSize >> 20) MiB a request to an isolated plugin may hold",
                           [("event", what)] + (module.map { [("module", $0)] } ?? []))
            return
        }
        if let module {
            workers.recordUnanswered(module: module, event: what)
            if countsOverrun { host.metrics.module(named: module).recordDeadlineOverrun() }
        }
        connection.kill(reason: reason, afterItsDeadline: true)
    }

    /// Said of a worker with limits that stalled or did not answer in time: a limit too low
    /// makes a worker stall (its threads cannot start), not fail, so the plugin's code is
    /// not the only suspect.
    var limitsHint: String {
        settings.limits.summary.map { " (it runs with the limits \($0): its code may hang, or a limit too low may stall it)" } ?? ""
    }

    /// The logger lines of the worker are logged here, with the plugin's name and pid, at
    /// most `LogLineRate.perSecond` a second (the rest are counted, and said once a second),
    /// each with its message and values cut to `LogLineRate.maximumText` bytes and its first
    /// `LogLineRate.maximumPairs` metadata pairs.
    ///
    /// The frame is the plugin's to write: the daemon names the plugin and the worker
    /// itself, so a `plugin` or `worker` the frame gives is dropped, and so is a `module`
    /// that is not one of this plugin's.
    func log(_ message: JSONValue, pid: pid_t) {
        guard logLines.admit() else { return }
        let level = message.integer("level").flatMap(LogLevel.init(rawValue:)) ?? .info
        var logger = Logger(label: LogLineRate.bounded(message.text("label") ?? host.logger.label))
        if case .array(let pairs) = message["metadata"] ?? .null {
            for case .array(let pair) in pairs.prefix(LogLineRate.maximumPairs) where pair.count == 2 {
                guard let key = pair[0].stringValue, let value = pair[1].stringValue, key != "plugin", key != "worker",
                      key != "module" || file.manifest.modules.contains(value) else { continue }
                logger = logger.with(LogLineRate.bounded(key), LogLineRate.bounded(value))
            }
        }
        logger.log(level, LogLineRate.bounded(message.text("message") ?? ""), [("plugin", name), ("worker", "\(pid)")])
    }

    /// A notification a module of the worker posted (a C module's `post_notification`, a
    /// Swift module's `host.post`): to every module of the daemon's host that listens, this
    /// plugin's included, or to the one it names (`send(.notification, to:)`), in the order
    /// the worker made them; at most `NotificationQueue.limit` wait for delivery, and what
    /// the worker posts beyond that is dropped (counted, and said once a second). A
    /// notification named like a lifecycle event is refused here (counted, and said once a
    /// second, naming this plugin), never handed to the modules that listen.
    func post(_ message: JSONValue) {
        guard let notification = message.text("name") else { return }
        if ModuleEvent.lifecycleNames.contains(notification) { return lifecyclePosts.count() }
        posts.post(notification, payload: message["payload"] ?? .null, to: message.text("module"))
    }

    /// The answer to a worker's `locate`: whether the module it names runs in the daemon's
    /// host (any process) and its plugin, from the host's thread-safe snapshots (the reader
    /// thread answers at once, never waiting for the host's context).
    func locate(_ message: JSONValue) -> JSONValue {
        let module = message.text("module") ?? ""
        let ask: JSONValue = message.integer("ask").map { .number(Double($0)) } ?? .null
        var answer: [String: JSONValue] = ["answer": ask, "running": .bool(host.isRunning(moduleNamed: module))]
        if let plugin = host.registeredModulesSnapshot.first(where: { $0.name == module })?.plugin, !plugin.isEmpty {
            answer["plugin"] = .string(plugin)
        }
        return .object(answer)
    }

    // MARK: - Helpers

    /// Who a worker runs as: a user, its group and its supplementary groups, applied in the
    /// worker as a login applies them (`setgroups`, `setgid`, `setuid`).
    struct WorkerIdentity: Equatable {
        var uid: uid_t
        var gid: gid_t
        var groups: [gid_t]
    }

    /// The identity `user` and `group` (names or numbers) give a worker: the user's account
    /// and, unless `group` names another, its primary group, with the groups that list it
    /// as a member; nil when neither is given (the worker runs as the daemon). What cannot
    /// be applied whole is refused: a group without a user (the worker would stay root),
    /// and a uid with no account and no group (it would keep the daemon's groups).
    static func identity(user: String?, group: String?) throws(TrialProcess.SpawnError) -> WorkerIdentity? {
        guard let user else {
            guard let group else { return nil }
            throw TrialProcess.SpawnError(description: "group \(group) is given without a user: the worker would still run as root with all its privileges")
        }
        let account = UserAccount.lookUp(user)
        var groupID: gid_t?
        if let group {
            guard let gid = UserAccount.groupID(group) else { throw TrialProcess.SpawnError(description: "no group named \(group)") }
            groupID = gid
        }
        if let account {
            let gid = groupID ?? account.gid
            return WorkerIdentity(uid: account.uid, gid: gid, groups: account.groups(primary: gid))
        }
        guard let uid = UInt32(user) else { throw TrialProcess.SpawnError(description: "no user named \(user)") }
        guard let gid = groupID else {
            throw TrialProcess.SpawnError(description: "uid \(user) has no account in the user database, so it has no group of its own: the worker would keep the daemon's groups")
        }
        return WorkerIdentity(uid: uid, gid: gid, groups: [gid])
    }

    /// A process's resident set size from /proc/PID/statm, in bytes.
    static func residentBytes(of pid: pid_t) -> Int64? { ProcessMemory.residentBytes(pid: pid) }
}

extension IsolatedPlugin {
    /// The factories of the daemon's modules of this plugin.
    func factories(_ modules: [(name: String, version: String)], defaultOrder: Int) -> [LoadedPlugin.Module] {
        modules.map { module in
            LoadedPlugin.Module(
                factory: ModuleFactory(name: module.name, version: module.version, plugin: name, defaultOrder: defaultOrder) {
                    [self] host, configuration in
                    // Its worker's answer is awaited at most the event deadline (then the worker is killed).
                    host.handlerKeepsItsOwnDeadline()
                    return IsolatedModule(plugin: self, name: module.name, version: module.version, configuration: configuration,
                                          running: host.runningModuleNames)
                },
                swiftType: nil)
        }
    }
}
