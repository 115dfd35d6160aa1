import CDynamicLoader
import DaemonKit
import Dispatch
import Glibc
@_spi(ModuleHost) import ModuleKit
import PluginCall
import PluginFormat
import Synchronization

/// A call by name in an isolated plugin that failed: the control protocol's code
/// (`unknown_function`, `invalid_arguments`, `call_failed`) and a message.
public struct IsolatedCallError: Error, Sendable, Equatable, CustomStringConvertible {
    public var code: String
    public var message: String
    public var description: String { message }
}

/// Where a plugin's code runs (docs/isolation.md).
public enum Isolation: String, Sendable, Equatable, CaseIterable {
    /// In the daemon's own process: fastest; a crash there is the daemon's.
    case inProcess = "in-process"
    /// In a `modhost-worker` process of its own, supervised by the daemon.
    case process
}

/// Resource limits of an isolated plugin's worker (setrlimit); nil leaves the daemon's.
public struct WorkerLimits: Sendable, Equatable {
    /// RLIMIT_AS, in bytes.
    public var addressSpaceBytes: Int?
    /// RLIMIT_NOFILE.
    public var openFiles: Int?
    /// RLIMIT_CPU, in seconds of CPU time.
    public var cpuSeconds: Int?
    /// RLIMIT_NPROC: processes of the worker's user (bounds a fork bomb).
    public var processes: Int?

    public init(addressSpaceBytes: Int? = nil, openFiles: Int? = nil, cpuSeconds: Int? = nil, processes: Int? = nil) {
        self.addressSpaceBytes = addressSpaceBytes
        self.openFiles = openFiles
        self.cpuSeconds = cpuSeconds
        self.processes = processes
    }

    /// The limits set, as in the configuration, by name (`addressSpaceBytes 104857600,
    /// openFiles 16`); nil when none is.
    var summary: String? {
        guard case .object(let set) = json, !set.isEmpty else { return nil }
        return set.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value.jsonText)" }.joined(separator: ", ")
    }

    var json: JSONValue {
        var fields: [String: JSONValue] = [:]
        if let addressSpaceBytes { fields["addressSpaceBytes"] = .number(Double(addressSpaceBytes)) }
        if let openFiles { fields["openFiles"] = .number(Double(openFiles)) }
        if let cpuSeconds { fields["cpuSeconds"] = .number(Double(cpuSeconds)) }
        if let processes { fields["processes"] = .number(Double(processes)) }
        return .object(fields)
    }
}

/// One plugin's isolation settings, from the configuration's `"plugins"` object.
public struct PluginIsolationSettings: Sendable, Equatable {
    /// nil: the manifest's preference, else the default.
    public var isolation: Isolation?
    public var limits = WorkerLimits()
    /// The user (name or uid) and group the worker runs as when the daemon runs as root.
    public var user: String?
    public var group: String?

    public init(isolation: Isolation? = nil, limits: WorkerLimits = WorkerLimits(), user: String? = nil, group: String? = nil) {
        self.isolation = isolation
        self.limits = limits
        self.user = user
        self.group = group
    }
}

/// Which plugins a `PluginSet` isolates and how: per plugin, the configuration's setting,
/// else the manifest's preference (`"isolation": "process"`), else `defaultIsolation`.
public struct IsolationPolicy: Sendable, Equatable {
    public var defaultIsolation: Isolation
    public var plugins: [String: PluginIsolationSettings]
    /// The `modhost-worker` executable.
    public var workerExecutable: String
    /// The level of the log lines a worker sends.
    public var logLevel: LogLevel
    /// Supervision: a worker that crashes `burst` times within `window` is quarantined.
    public var burst: Int
    public var window: Duration

    public init(defaultIsolation: Isolation = .inProcess, plugins: [String: PluginIsolationSettings] = [:],
                workerExecutable: String? = nil, logLevel: LogLevel = .info, burst: Int = 5, window: Duration = .seconds(10)) {
        self.defaultIsolation = defaultIsolation
        self.plugins = plugins
        self.workerExecutable = workerExecutable ?? Self.besideExecutable
        self.logLevel = logLevel
        self.burst = burst
        self.window = window
    }

    /// `modhost-worker` next to the running executable.
    public static var besideExecutable: String {
        let executable = FileSystem.executablePath ?? CommandLine.arguments[0]
        return PathText.parent(of: executable) + "/modhost-worker"
    }

    /// Where `manifest`'s plugin runs.
    public func isolation(of manifest: Manifest) -> Isolation {
        if let chosen = plugins[manifest.name]?.isolation { return chosen }
        if manifest.isolation == Isolation.process.rawValue { return .process }
        return defaultIsolation
    }
}

/// What an operator (and `modhostctl list`/`metrics`) sees of an isolated plugin's worker.
public struct WorkerStatus: Sendable, Equatable {
    public enum Phase: String, Sendable {
        /// A worker is starting (the first time or after a crash).
        case starting
        case running
        /// The worker ended without being asked; a restart is scheduled.
        case crashed
        /// Crashed `burst` times within `window`: not restarted until its file changes or
        /// a module of it is enabled (`modhostctl enable`).
        case quarantined
        /// Stopped by the daemon (removal, replacement, shutdown).
        case stopped
    }
    public var phase: Phase
    /// The running worker's pid.
    public var pid: Int32?
    /// Workers started after the first.
    public var restarts: Int
    /// Workers that ended without being asked (crash, exit, killed as unresponsive).
    public var crashes: Int
    /// The last worker's end, e.g. "killed by signal 11 (Segmentation fault)".
    public var lastCrash: String?
    /// The running worker's resident set size, in bytes (from /proc), nil when none runs.
    public var residentBytes: Int64?
    /// Notifications its workers posted that were dropped: `NotificationQueue.limit` of
    /// them, or `NotificationQueue.byteLimit` of payloads, waited for delivery
    /// (docs/isolation.md, "Floods").
    public var droppedNotifications: UInt64 = 0
    /// Log lines of its workers dropped: more than `LogLineRate.perSecond` in a second.
    public var droppedLogLines: UInt64 = 0
}

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
    private let state = Mutex(State())

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
    private func launch() async throws(LoadFailure) -> WorkerConnection {
        func fail(_ problem: String, _ fix: String) -> LoadFailure {
            LoadFailure(file: file.path, check: .isolation, problem: problem, fix: fix)
        }
        var load: [String: JSONValue] = [
            "op": "load", "plugin": .string(name), "file": .string(file.path), "image": .string(file.resolvedPath),
            "host": .string(host.name), "label": .string(host.logger.label),
            "preload": .array(preloads.map { .string($0) }), "logLevel": .string(policy.logLevel.description),
            "eventDeadlineSeconds": .number(Double(workerDeadline.components.seconds) + Double(workerDeadline.components.attoseconds) / 1e18),
            "limits": settings.limits.json,
        ]
        if let manifest = try? JSONValue(encoding: file.manifest) { load["manifest"] = manifest }
        if geteuid() == 0 {
            do {
                let (uid, gid) = try Self.identity(user: settings.user, group: settings.group)
                if let uid { load["uid"] = .number(Double(uid)) }
                if let gid { load["gid"] = .number(Double(gid)) }
            } catch {
                throw fail(error.description, "name an existing user and group in the plugin's configuration")
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

    /// Creates module `module` in the worker; nil when its factory refused. When the worker
    /// cannot answer, the module is still created here, `crashed`, and the worker restarted.
    func create(_ module: String, configuration: JSONValue, running: [String]) -> (info: ModuleInfo?, notifications: Set<String>)? {
        state.withLock { state in
            state.modules.removeAll { $0.name == module }
            state.modules.append((module, ModuleRecord(configuration: configuration)))
        }
        let reply = request(["op": "create", "module": .string(module), "configuration": configuration,
                             "running": .array(running.map { .string($0) })], what: "create of \(module)", module: module)
        guard let reply else { return (nil, []) }
        if reply["created"]?.boolValue != true {
            state.withLock { $0.modules.removeAll { $0.name == module } }
            return nil
        }
        let info = try? reply["info"]?.decode(ModuleInfo.self)
        var names: Set<String> = []
        if case .array(let list) = reply["notifications"] ?? .null { names = Set(list.compactMap(\.stringValue)) }
        return (info, names)
    }

    /// Delivers a synchronous event; returns once the worker has (or could not).
    func deliver(_ module: String, kind: String, event: String, payload: JSONValue) {
        if kind == "start" {
            state.withLock { state in
                if let index = state.modules.firstIndex(where: { $0.name == module }) { state.modules[index].record.started = true }
            }
        }
        let given = workers.beginIsolated(module: module, event: event)
        if let compact = CompactFrame.Kind(kind) {
            // The hot path: a compact frame (`CompactFrame`), the same request in bytes.
            _ = requestOutcome(what: event, module: module) { id in
                CompactFrame.event(id: id, kind: compact, module: module, event: event, payload: payload)
            }
        } else {
            _ = request(["op": "event", "module": .string(module), "kind": .string(kind), "event": .string(event), "payload": payload],
                        what: event, module: module)
        }
        workers.endIsolated(module: module, given)
        if kind == "deinit" { state.withLock { $0.modules.removeAll { $0.name == module } } }
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
        let outcome = await connection.requestAsync(["op": "awaited", "module": .string(module), "event": .string(event), "payload": payload],
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
        guard let reply = request(["op": "configure", "module": .string(module), "configuration": configuration], what: "configurationChanged")
        else { return true }
        return reply["running"]?.boolValue ?? true
    }

    /// The info of `module` as the worker's module reports it now; nil when no worker runs
    /// or it did not answer within the event deadline (logged: the caller answers from the
    /// last info it had).
    func info(_ module: String) -> ModuleInfo? {
        let phase = state.withLock { $0.phase }
        let outcome = requestOutcome(["op": "info", "module": .string(module)], what: "info of \(module)")
        guard case .reply(let reply)? = outcome else {
            let why = switch outcome {
            case .timedOut?: "did not answer within \(deadline.secondsText)"
            case .gone?: "ended"
            default: "is \(phase.rawValue)"
            }
            logger.warning("the info of module \(module) is the last known (from its worker, or its name and version): its worker \(why)",
                           [("module", module)])
            return nil
        }
        return try? reply["info"]?.decode(ModuleInfo.self)
    }

    func stateForReplacement(_ module: String) -> JSONValue? {
        guard let state = request(["op": "state", "module": .string(module)], what: "stateForReplacement")?["state"], state != .null
        else { return nil }
        return state
    }

    func restore(_ module: String, state: JSONValue) {
        _ = request(["op": "restore", "module": .string(module), "state": state], what: "restore")
    }

    /// Calls `function` in the worker with arguments as text (`texts`) or JSON values
    /// (`json`), as a plugin loaded in process is called: the same results and the same
    /// error codes (`CallError.code`). Given a `deadline`, the call fails with
    /// `deadline_exceeded` once it has passed (the function goes on in the worker); without
    /// one it waits for the result as long as it takes. Either way a worker that does not
    /// read the call within that deadline (or the event deadline) is killed as unanswering.
    public func call(_ function: String, texts: [String]? = nil, json: [JSONValue]? = nil,
                     deadline: Duration? = nil) async throws(IsolatedCallError) -> CallValue {
        guard let connection = currentConnection else {
            let phase = status.phase
            throw IsolatedCallError(code: "call_failed", message: "plugin \(name)'s worker is not running (\(phase.rawValue)); "
                                    + (phase == .quarantined ? "it stays down until its file changes or modhostctl enable names one of its modules"
                                                             : "try again once it is restarted"))
        }
        if let busy = connection.overrunCall {
            throw IsolatedCallError(code: "plugin_busy",
                                    message: "plugin \(name) is busy: \(busy.function) has been running for \((ContinuousClock.now - busy.since).secondsText) in its worker; it gets no new call until that returns")
        }
        let arguments: CompactFrame.Arguments = if let texts { .texts(texts) } else if let json { .json(json) } else { .none }
        let outcome: WorkerConnection.Outcome
        switch await connection.call(function: function, deadline: deadline, frame: { id in
            CompactFrame.call(id: id, function: function, arguments: arguments)
        }) {
        case .outcome(let answered):
            outcome = answered
        case .notStarted(let ahead):
            throw IsolatedCallError(code: "plugin_busy",
                                    message: PluginWorker.notStarted(plugin: name, function: function, deadline: deadline ?? self.deadline,
                                                                     ahead: ahead.map { PluginWorker.Stuck(what: "\($0.function) in its worker", elapsed: $0.running) }))
        }
        switch outcome {
        case .reply(let reply):
            if let error = reply["error"] {
                throw IsolatedCallError(code: error.text("code") ?? "call_failed", message: error.text("message") ?? "the call failed")
            }
            // What the worker answers is the plugin's code's to write: a value of another type
            // than plugin.json declares (or none) is no result, and ends the worker as any
            // invalid frame does.
            let declared = returnTypes[function]
            guard let type = reply.text("type").flatMap(ValueType.init(rawValue:)), type == declared,
                  let value = try? type.value(fromJSON: reply["value"] ?? .null)
            else {
                let given = reply.text("type").map { JSONValue.escapingControlCharacters(String($0.prefix(40))) }
                let reason = given == declared?.rawValue
                    ? "it answered call \(function) with a value that is no \(given ?? "")"
                    : "it answered call \(function) with \(given.map { "a value of type \($0)" } ?? "no type"), where plugin.json declares \(declared?.rawValue ?? "no such function")"
                connection.kill(reason: reason)
                throw IsolatedCallError(code: "call_failed", message: "plugin \(name)'s worker gave an invalid result: \(reason); it is restarted")
            }
            return value
        case .timedOut:
            throw IsolatedCallError(code: "deadline_exceeded",
                                    message: "call \(name).\(function) did not return within the deadline of \((deadline ?? self.deadline).secondsText); it goes on in its worker, and the plugin gets no new call until it returns")
        case .gone:
            // How this worker ended (not the one before it): the poller may see its sockets
            // close before it reaps it.
            let ending = await connection.ending(within: .seconds(2))
            throw IsolatedCallError(code: "call_failed",
                                    message: "plugin \(name)'s worker ended during the call of \(function)\(ending.map { " (\($0))" } ?? ""); it is restarted")
        }
    }

    private var currentConnection: WorkerConnection? {
        state.withLock { $0.phase == .running ? $0.connection : nil }
    }

    /// Sends `message` and waits for its reply up to the event deadline; nil when no worker
    /// runs or it did not answer (it is then killed and restarted).
    private func request(_ message: KeyValuePairs<String, JSONValue>, what: String, module: String? = nil) -> WorkerMessage? {
        if case .reply(let reply)? = requestOutcome(message, what: what, module: module) { return reply }
        return nil
    }

    /// `request`, saying what became of it; nil when no worker ran to send it to.
    private func requestOutcome(_ message: KeyValuePairs<String, JSONValue>, what: String, module: String? = nil) -> WorkerConnection.Outcome? {
        requestOutcome(what: what, module: module) { id in WorkerFrame.encode(members: message, id: .number(Double(id))) }
    }

    /// `requestOutcome` of the frame `frame(id)` makes for request `id`.
    private func requestOutcome(what: String, module: String?, frame: (Int) -> [UInt8]?) -> WorkerConnection.Outcome? {
        guard let connection = currentConnection else {
            if let module { notDelivered(module, what) }
            return nil
        }
        let outcome = connection.request(deadline: deadline, frame: frame)
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
    private func check(_ outcome: WorkerConnection.Outcome, _ connection: WorkerConnection, what: String, module: String? = nil,
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

    // MARK: - Supervision

    /// One end of a worker, as counted toward quarantine.
    struct WorkerEnd {
        var at: ContinuousClock.Instant
        /// Killed because it did not answer within its deadline.
        var hung: Bool
    }

    /// How long an end of a worker counts toward quarantine: `policy.window`, and for a
    /// worker killed because it did not answer within its deadline, five deadlines more
    /// (`burst` of them): each such end took the daemon a deadline to find out, so a handler
    /// that hangs on every event would otherwise never end `burst` workers within the window,
    /// and would hold up every event sent to it for a deadline, for ever.
    func quarantineWindow(hung: Bool) -> Duration {
        hung ? policy.window + deadline * policy.burst : policy.window
    }

    /// Called by the connection (on the worker poller) once its worker has ended and been reaped.
    /// `stoppedQuietly`: it died by SIGKILL, which the daemon sent for no reason of its
    /// own (the end of a worker it stopped: one whose sockets close kills its own group).
    func ended(_ connection: WorkerConnection, _ ending: String, stoppedQuietly: Bool) {
        if state.withLock({ $0.phase == .stopped && $0.connection !== connection }) {
            // Stopped by the daemon (no restart follows): an end other than the quiet one
            // came from the plugin's code (an exit in destroy, say) or from a kill for a
            // reason (not answering deinit in time), and is said.
            if !stoppedQuietly {
                logger.warning("plugin \(name)'s worker (pid \(connection.pid)) \(ending) while the daemon stopped it",
                               [("pid", "\(connection.pid)"), ("cause", ending)])
            }
            return
        }
        let now = ContinuousClock.now
        let hung = connection.killedAfterItsDeadline
        let decision: (quarantined: Bool, delay: Duration, crashes: Int, hangsCounted: Bool)? = state.withLock { state in
            guard state.connection === connection, state.phase != .stopped else { return nil }
            state.connection = nil
            state.crashes += 1
            state.lastCrash = ending
            state.crashTimes = state.crashTimes.filter { now - $0.at < quarantineWindow(hung: $0.hung) } + [WorkerEnd(at: now, hung: hung)]
            let recent = state.crashTimes.count
            if recent >= policy.burst {
                state.phase = .quarantined
                return (true, .zero, recent, state.crashTimes.contains(where: \.hung))
            }
            state.phase = .crashed
            let delay: Duration = recent <= 1 ? .zero : .milliseconds(100) * (1 << min(recent - 2, 8))
            return (false, delay, recent, false)
        }
        guard let decision else { return }
        let (modules, restartsEnded) = state.withLock { ($0.modules.map(\.name), $0.restartsEnded) }
        logger.error("plugin \(name)'s worker (pid \(connection.pid)) \(ending)"
                     + (modules.isEmpty ? "" : "; its modules are crashed: \(modules.joined(separator: ", "))")
                     + (restartsEnded ? "; it is not restarted: the daemon is shutting down" : ""),
                     [("pid", "\(connection.pid)"), ("cause", ending)])
        if restartsEnded { return }
        if decision.quarantined {
            let crashWindow = quarantineWindow(hung: false).secondsText, hangWindow = quarantineWindow(hung: true).secondsText
            let within = !decision.hangsCounted ? crashWindow
                : "\(hangWindow) (an end for not answering within the deadline counts for \(hangWindow), any other for \(crashWindow))"
            logger.error("plugin \(name) is quarantined: its worker ended \(decision.crashes) times within \(within); it is not restarted until its file changes or a module of it is enabled (modhostctl enable MODULE)",
                         [("crashes", "\(decision.crashes)")])
            return
        }
        scheduleRestart(after: decision.delay)
    }

    private func scheduleRestart(after delay: Duration) {
        Task.detached { [self] in
            if delay > .zero { try? await Task.sleep(for: delay) }
            await self.restart()
        }
    }

    /// Starts a new worker and runs the daemon's modules of this plugin in it again.
    private func restart() async {
        guard state.withLock({ state -> Bool in
            guard state.phase == .crashed || state.phase == .quarantined, !state.restartsEnded else { return false }
            state.phase = .starting
            return true
        }) else { return }
        let connection: WorkerConnection
        do {
            connection = try await launch()
        } catch {
            // A plugin stopped meanwhile (replaced, removed: its private copy is deleted, and
            // the launch may have failed for that) is not restarted, and that is no error.
            let quarantine = state.withLock { state -> Bool in
                guard state.phase == .starting else { return false }
                state.phase = .quarantined
                state.lastCrash = error.problem
                return true
            }
            if quarantine {
                logger.error("cannot restart plugin \(name)'s worker: \(error.problem)")
                logger.error("plugin \(name) is quarantined until its file changes or a module of it is enabled")
            }
            return
        }
        let (modules, stopped, restarts) = state.withLock { state -> ([(name: String, record: ModuleRecord)], Bool, Int) in
            guard state.phase == .starting, !state.restartsEnded else { return ([], true, 0) }
            // Still `starting`: the modules get nothing until they run again in order.
            state.connection = connection
            state.restarts += 1
            return (state.modules, false, state.restarts)
        }
        if stopped {
            connection.stop()
            return
        }
        if let ending = connection.ending {
            ended(connection, ending, stoppedQuietly: false)
            return
        }
        logger.info("restarted plugin \(name)'s worker (pid \(connection.pid), restart \(restarts))", [("pid", "\(connection.pid)")])
        let running = host.runningModuleNames
        for (module, record) in modules {
            let reply = connection.request(["op": "create", "module": .string(module), "configuration": record.configuration,
                                            "running": .array(running.map { .string($0) })], deadline: deadline)
            check(reply, connection, what: "create of \(module)")
            guard case .reply(let created) = reply, created["created"]?.boolValue == true else { continue }
            if record.started {
                check(connection.request(["op": "event", "module": .string(module), "kind": "start", "event": "start"], deadline: deadline),
                      connection, what: "start")
            }
        }
        state.withLock { state in
            if state.connection === connection && state.phase == .starting { state.phase = .running }
        }
    }

    /// Lets a quarantined plugin run again (`modhostctl enable` of one of its modules):
    /// the crash count starts over and a worker is started now.
    func release() {
        let quarantined = state.withLock { state -> Bool in
            guard state.phase == .quarantined else { return false }
            state.crashTimes = []
            return true
        }
        guard quarantined else { return }
        logger.info("plugin \(name) leaves quarantine (enabled); starting its worker")
        Task.detached { [self] in await self.restart() }
    }

    /// Ends the worker for good (removal, replacement, shutdown): no restart follows.
    /// From now on a worker that ends is not restarted (the host is shutting down: its
    /// modules get willTerminate and deinit, and a worker killed for not answering them
    /// must not be followed by a new one).
    func endRestarts() {
        state.withLock { $0.restartsEnded = true }
    }

    /// Stops its worker, if one runs, and returns its connection (whose `ending` says when
    /// it has been reaped).
    @discardableResult
    func stop() -> WorkerConnection? {
        let connection = state.withLock { state -> WorkerConnection? in
            state.phase = .stopped
            defer { state.connection = nil }
            return state.connection
        }
        connection?.stop()
        return connection
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

    /// The uid and gid of `user` and `group` (names or numbers); the user's group when no
    /// group is named.
    static func identity(user: String?, group: String?) throws(TrialProcess.SpawnError) -> (uid_t?, gid_t?) {
        var uid: uid_t?
        var gid: gid_t?
        if let user {
            if let number = UInt32(user) {
                uid = number
            } else if let entry = getpwnam(user) {
                uid = entry.pointee.pw_uid
                gid = entry.pointee.pw_gid
            } else {
                throw TrialProcess.SpawnError(description: "no user named \(user)")
            }
        }
        if let group {
            if let number = UInt32(group) {
                gid = number
            } else if let entry = getgrnam(group) {
                gid = entry.pointee.gr_gid
            } else {
                throw TrialProcess.SpawnError(description: "no group named \(group)")
            }
        }
        return (uid, gid)
    }

    /// A process's resident set size from /proc/PID/statm, in bytes.
    static func residentBytes(of pid: pid_t) -> Int64? { ProcessMemory.residentBytes(pid: pid) }
}

/// One worker process and its three sockets (docs/isolation.md): requests and their
/// replies; the worker poller reads its control socket and reaps it.
///
/// Ordered requests (`request`, synchronous) go over socket 4 one at a time, and the
/// thread that sent one reads its reply itself, up to the deadline: a round trip wakes no
/// thread in this process but the caller. Calls by name go over socket 5 and are answered
/// there, read by a caller while it can (`call`), else by the worker poller. The replies to
/// awaited events, log lines and notifications come on the control socket, read by the
/// worker poller (one thread for every worker). Every frame sent has a deadline; on 3 and
/// 5 no sender waits for room in the socket (`FrameOutbox`: the poller writes the rest).
final class WorkerConnection: Sendable {
    let pid: pid_t
    /// Socket 3: the load frame, awaited events and the answers to the worker's questions
    /// go out here; the worker poller reads what comes back.
    let control: FrameOutbox
    /// Socket 4: ordered requests; replies read by the thread that holds `orderedGate`.
    private let ordered: WorkerChannel
    /// Socket 5: calls by name and their replies (`call`).
    private let calls: FrameOutbox
    /// The calls waiting for their replies on socket 5, by request id, and the socket's
    /// reader: nil while a thread holds it to read (a caller for a moment, or the worker
    /// poller while calls wait and no caller reads; only the holder reads, and it hands
    /// every reply it reads to its caller); `closed` once the socket ended.
    private let callReplies = Mutex<CallReplies>(CallReplies())
    private struct CallReplies {
        var waiters: [Int: Waiter] = [:]
        /// Calls that did not return by their deadline and whose replies have not come:
        /// the worker runs calls one at a time, so no new call is made until they have
        /// (`plugin_busy`, as in process), and the socket is read on for their replies.
        var overrun: [Int: (function: String, since: ContinuousClock.Instant)] = [:]
        var reader: FrameReader?
        var closed = false
        /// The call the worker has now (sent and not answered: it runs calls one at a time,
        /// so the next is sent only once this one is answered), and the calls waiting for
        /// their turn, in order (`takeTurn`).
        var turn: (id: Int, function: String, since: ContinuousClock.Instant)?
        var queue: [(id: Int, function: String, continuation: CheckedContinuation<Turn, Never>)] = []
    }

    /// What a call waiting for its turn to be sent got.
    enum Turn {
        case granted
        /// Its deadline passed first: it is not sent, and never runs. `ahead` is the call
        /// the worker had then, and for how long.
        case notStarted(ahead: (function: String, running: Duration)?)
        /// The socket ended.
        case gone
    }
    /// How long a caller reads the calls socket itself, on its own thread, waiting for its
    /// reply, before it hands the reading to the worker poller and suspends: a quick call's
    /// round trip is a fraction of this, and no thread of Swift concurrency is held longer.
    static let callWatch = Duration.milliseconds(2)
    /// One ordered request at a time (a semaphore of 1, so that it can be waited for with
    /// a deadline).
    private let orderedGate = DispatchSemaphore(value: 1)
    /// Used only by the holder of `orderedGate`; nil once the socket is out of step (a
    /// request timed out or failed): every later request is `gone`.
    private let orderedReader: Mutex<FrameReader?>
    private let plugin: IsolatedPlugin
    /// Waiters for replies on the control socket, by request id; `closed` once its reader
    /// has stopped (a request made then is `gone` at once).
    private let pending = Mutex((waiters: [Int: Waiter](), closed: false))
    private let nextID = Atomic<Int>(1)
    /// Set once the poller has seen the end (then the pid may be reused: never signal it).
    /// `laterReason`: why the poller kills the worker if it has not ended by the time a
    /// `killLater` gave (a socket of it no longer works, but it still runs); `stopping`
    /// once `stop` has been called (its sockets are then closed on purpose).
    private let life = Mutex((ended: false, killReason: String?.none, laterReason: String?.none, stopping: false, hung: false))
    private let readiness = Waiter()
    /// Completed by `reap` with `{"ending": TEXT}` once the worker has been reaped.
    private let finished = Waiter()
    private let described = Mutex<[(name: String, version: String)]>([])

    /// The modules the worker's plugin provides, from its ready frame.
    var modules: [(name: String, version: String)] { described.withLock { $0 } }

    enum Outcome {
        /// The reply, as the strict parser read it (its members looked up by name, not
        /// hashed into a dictionary).
        case reply(WorkerMessage)
        case timedOut
        case gone
    }

    /// A request waiting for its reply, from an awaiting task.
    final class Waiter: Sendable {
        private struct State {
            var outcome: Outcome?
            var continuation: CheckedContinuation<Outcome, Never>?
            var extended = false
        }
        private let state = Mutex(State())

        /// The first outcome wins.
        func complete(_ outcome: Outcome) {
            let continuation: CheckedContinuation<Outcome, Never>?? = state.withLock { state in
                guard state.outcome == nil else { return .none }
                state.outcome = outcome
                defer { state.continuation = nil }
                return .some(state.continuation)
            }
            guard let continuation else { return }
            continuation?.resume(returning: outcome)
        }

        /// The outcome, if there is one yet.
        func peek() -> Outcome? { state.withLock { $0.outcome } }

        /// The outcome, or `.timedOut` once `deadline` (nil: none) has passed. The timer is
        /// a dispatch source, cancelled (and freed) as soon as the outcome is known: a
        /// `DispatchQueue.asyncAfter` would stay queued, with what it holds, until its time.
        ///
        /// `unread`, if given, is asked when `deadline` passes: true (the reply may be in the
        /// socket, not read yet by the thread that reads every worker's frames, which was
        /// busy, e.g. with another worker's large frame) gives the reply `grace` more, once.
        func wait(upTo deadline: Duration?, unread: (@Sendable () -> Bool)? = nil, grace: Duration = .zero) async -> Outcome {
            guard let deadline else { return await wait() }
            let timer = DispatchSource.makeTimerSource(queue: .global())
            timer.setEventHandler { [self] in  // holds the timer until it is cancelled (which frees this handler)
                if let unread, state.withLock({ state in defer { state.extended = true }; return !state.extended }), unread() {
                    timer.schedule(deadline: .now() + grace.dispatchInterval)
                    return
                }
                complete(.timedOut)
            }
            timer.schedule(deadline: .now() + deadline.dispatchInterval)
            timer.resume()
            let outcome = await wait()
            timer.cancel()
            return outcome
        }

        func wait() async -> Outcome {
            await withCheckedContinuation { continuation in
                let done: Outcome? = state.withLock { state in
                    if let outcome = state.outcome { return outcome }
                    state.continuation = continuation
                    return nil
                }
                if let done { continuation.resume(returning: done) }
            }
        }
    }

    private init(pid: pid_t, fds: [Int32], plugin: IsolatedPlugin) {
        self.pid = pid
        control = FrameOutbox(WorkerChannel(fd: fds[0]))
        ordered = WorkerChannel(fd: fds[1])
        orderedReader = Mutex(FrameReader(fd: fds[1]))
        calls = FrameOutbox(WorkerChannel(fd: fds[2]))
        callReplies.withLock { $0.reader = FrameReader(fd: fds[2]) }
        self.plugin = plugin
    }

    /// The sockets the worker poller writes what had no room in (control, calls).
    var outboxes: [FrameOutbox] { [control, calls] }

    /// Socket 5, which the worker poller polls while it reads the replies there.
    var callsDescriptor: Int32 { calls.channel.fd }

    /// Whether the calls socket holds bytes not read yet.
    var callsHaveUnreadInput: Bool { calls.channel.hasUnreadInput }

    /// How long a frame the worker began may wait for its next byte before the worker is
    /// killed (`WorkerPoller`): the event deadline.
    var frameDeadline: Duration { plugin.deadline }

    /// Starts `executable` with one end of each of three new socketpairs as its descriptors
    /// 3, 4 and 5, in a process group of its own, with a clean environment, and has the
    /// worker poller watch it.
    static func spawn(_ executable: String, plugin: IsolatedPlugin) throws(TrialProcess.SpawnError) -> WorkerConnection {
        var ours: [Int32] = []
        var theirs: [Int32] = []
        func closeAll() { for fd in ours + theirs { close(fd) } }
        for _ in 0..<3 {
            var ends: [Int32] = [-1, -1]
            guard modhost_worker_socketpair(&ends) == 0 else {
                let problem = String(cString: strerror(errno))
                closeAll()
                throw TrialProcess.SpawnError(description: "socketpair: \(problem)")
            }
            ours.append(ends[0])
            theirs.append(ends[1])
        }
        let workerEnds = theirs
        let token = WorkerRecords.newToken()
        let spawned: (code: Int32, pid: pid_t)
        do throws(SystemError) {
            spawned = try SpawnThread.run { spawnProcess(executable, sockets: workerEnds, token: token) }
        } catch {
            closeAll()
            throw TrialProcess.SpawnError(description: "\(error)")
        }
        let (code, pid) = spawned
        for fd in theirs { close(fd) }
        guard code == 0 else {
            for fd in ours { close(fd) }
            throw TrialProcess.SpawnError(description: String(cString: strerror(code)))
        }
        // Nothing else reaps it, so the pid is still this worker's.
        let pidfd = modhost_worker_pidfd_open(pid)
        guard pidfd >= 0 else {
            let problem = String(cString: strerror(errno))
            Glibc.kill(-pid, SIGKILL)
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
            for fd in ours { close(fd) }
            throw TrialProcess.SpawnError(description: "pidfd_open: \(problem) (isolated plugins need Linux 5.3 or later)")
        }
        plugin.workerRecords.started(pid, plugin: plugin.name, token: token)
        let connection = WorkerConnection(pid: pid, fds: ours, plugin: plugin)
        WorkerPoller.shared.watch(connection, pidfd: pidfd)
        return connection
    }

    /// posix_spawn of `executable` with `sockets` as its descriptors 3, 4 and 5 (they are
    /// all above 9, so no dup2 overwrites another's source), standard input /dev/null, in a
    /// process group of its own, with a clean environment: nothing of the daemon's reaches
    /// plugin code, and no Swift backtrace on a crash (it delays the end by a quarter of a
    /// second or more), but `token` (`WorkerRecords`). (error, pid).
    private static func spawnProcess(_ executable: String, sockets: [Int32], token: String) -> (Int32, pid_t) {
        TrialProcess.spawnInGroup(executable, arguments: [],
                                  environment: ["PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "SWIFT_BACKTRACE": "enable=no",
                                                WorkerRecords.tokenVariable: token]) {
            actions in
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
            let targets = [WorkerProcess.socketDescriptor, WorkerProcess.orderedDescriptor, WorkerProcess.callsDescriptor]
            for (socket, target) in zip(sockets, targets) { posix_spawn_file_actions_adddup2(&actions, socket, target) }
        }
    }

    /// The checks a worker makes itself, which its failed frame may name: those of
    /// `PluginLoader.open`, of loading the plugins it depends on, and its own setup.
    static let checksOfAWorker: Set<LoadFailure.Check> = [.dlopen, .entrySymbol, .descriptor, .abi, .sdkLinkage, .exports, .manifest,
                                                           .dependency, .isolation]

    /// The worker's ready frame (its modules), its failed frame, or its end.
    func ready(within deadline: Duration) async -> Result<Void, LoadFailure> {
        let outcome = await readiness.wait(upTo: deadline)
        func failure(_ problem: String, _ fix: String) -> LoadFailure {
            LoadFailure(file: plugin.file.path, check: .isolation, problem: problem, fix: fix)
        }
        switch outcome {
        case .reply(let message) where message.text("op") == "ready":
            var modules: [(name: String, version: String)] = []
            if case .array(let list) = message["modules"] ?? .null {
                for entry in list { if let name = entry.text("name") { modules.append((name, entry.text("version") ?? "")) } }
            }
            // The worker's loader checked its descriptor against plugin.json; a frame that
            // says otherwise was written by the plugin's own code (e.g. a constructor, which
            // runs before the worker's ready), to claim another plugin's module names.
            let listed = plugin.file.manifest.modules
            guard modules.map(\.name) == listed else {
                kill(reason: "its ready frame did not list the modules plugin.json lists")
                return .failure(failure("its worker's ready frame did not list the modules plugin.json lists (\(listed.joined(separator: ", "))): the plugin's code wrote it on the worker's socket",
                                        "remove the plugin's code that writes to descriptors it did not open (3, 4 and 5 are the worker's)"))
            }
            described.withLock { $0 = modules }
            return .success(())
        case .reply(let message):
            // The plugin's code may have written this frame too: it may name only a check
            // the worker makes, never one of the daemon's (a crash guard's quarantine...).
            var check = message.text("check").flatMap(LoadFailure.Check.init(rawValue:)) ?? .isolation
            if !Self.checksOfAWorker.contains(check) { check = .isolation }
            // Its texts are bounded as the worker's log lines are.
            return .failure(LoadFailure(file: plugin.file.path, check: check,
                                        problem: "in its worker: \(LogLineRate.bounded(message.text("problem") ?? "it failed"))",
                                        fix: LogLineRate.bounded(message.text("fix") ?? "see the log")))
        case .timedOut:
            kill(reason: "it was not ready within \(deadline.secondsText)\(plugin.limitsHint)", afterItsDeadline: true)
            return .failure(failure("its worker was not ready within \(deadline.secondsText)\(plugin.limitsHint)",
                                    plugin.settings.limits.summary == nil ? "fix the plugin's load-time code"
                                        : "raise plugins.\(plugin.name).limits in modhostd's configuration, or fix the plugin's load-time code"))
        case .gone:
            // The poller says how it ended, once it has reaped it.
            let ending = await finished.wait()
            var text = "ended"
            if case .reply(let message) = ending { text = message.text("ending") ?? text }
            return .failure(failure("its worker \(text) while loading it", "fix the plugin's load-time code; the daemon was not affected"))
        }
    }

    /// Sends an ordered request (socket 4) and blocks the calling thread up to `deadline`,
    /// all told, for its reply, which this thread reads itself. After a request that timed
    /// out or failed, the socket is out of step: every later one is `gone` (the caller kills
    /// the worker on `timedOut`; `reap` ends the socket when it ends).
    func request(_ message: KeyValuePairs<String, JSONValue>, deadline: Duration) -> Outcome {
        request(deadline: deadline) { id in WorkerFrame.encode(members: message, id: .number(Double(id))) }
    }

    /// `request(_:deadline:)` of the frame `frame(id)` makes for request `id` (nil: too
    /// large, `gone`).
    func request(deadline: Duration, frame: (Int) -> [UInt8]?) -> Outcome {
        let until = ContinuousClock.now + deadline
        // A timeout already past tries the gate without reading the clock (it is nearly always
        // free: one thread at a time sends the plugin its events).
        guard orderedGate.wait(timeout: DispatchTime(uptimeNanoseconds: 1)) == .success
            || orderedGate.wait(timeout: .now() + deadline.dispatchInterval) == .success else { return .timedOut }
        defer { orderedGate.signal() }
        return orderedReader.withLock { reader -> Outcome in
            guard reader != nil else { return .gone }
            let id = nextID.add(1, ordering: .relaxed).oldValue
            var outcome = Outcome.gone
            switch ordered.send(frame: frame(id), until: until) {
            case .sent:
                do throws(FrameReader.End) {
                    let reply = try reader!.next(until: until)
                    if reply.integer("id") == id { return .reply(reply) }
                    kill(reason: "it answered request \(id) with the reply to another")
                } catch .timedOut {
                    outcome = .timedOut
                } catch .invalid(let problem) {
                    kill(reason: "it wrote what is no frame on its socket of ordered requests (4): \(problem)")
                } catch {
                    // Its end is closed: a worker that is ending, or one that closed it and
                    // would never answer again.
                    killLater(reason: "its socket of ordered requests (4) was closed (\(error)) and it did not end")
                }
            case .timedOut: outcome = .timedOut
            case .gone: killLater(reason: "its socket of ordered requests (4) was closed and it did not end")
            }
            reader = nil
            return outcome
        }
    }

    /// Sends `message` as one frame on `outbox` (3 or 5), written whole no later than
    /// `deadline`, without waiting for room in the socket: what it has no room for now the
    /// worker poller writes, and a worker that has not read the frame by its deadline is
    /// killed for `overdue`. Suspends, holding no thread, until then.
    private func send(_ frame: [UInt8]?, on outbox: FrameOutbox, until deadline: ContinuousClock.Instant,
                      overdue: FrameOutbox.Overdue) async -> WorkerChannel.Sent {
        switch post(frame, on: outbox, until: deadline, overdue: overdue) {
        case .finished(let sent): return sent
        case .waiting(let done): return await done.wait()
        }
    }

    /// As `send`, without waiting for the outcome (from any thread, the poller's too).
    @discardableResult
    private func post(_ frame: [UInt8]?, on outbox: FrameOutbox, until deadline: ContinuousClock.Instant,
                      overdue: FrameOutbox.Overdue) -> FrameOutbox.Enqueued {
        let enqueued = outbox.enqueue(frame, until: deadline, overdue: overdue)
        if case .waiting = enqueued { WorkerPoller.shared.flush(self) }
        return enqueued
    }

    /// Sends the load frame on the control socket, written whole within `deadline` (else
    /// the worker is killed, as not reading it).
    func sendLoad(_ message: JSONValue, within deadline: Duration) async -> WorkerChannel.Sent {
        await send(WorkerFrame.encode(message), on: control, until: .now + deadline, overdue: .init("read its load frame", within: deadline))
    }

    /// Sends an awaited event `what` (the control socket) and awaits its reply, up to
    /// `deadline` all told: a worker that has not read it by then is killed (`timedOut`).
    func requestAsync(_ message: JSONValue, what: String, deadline: Duration) async -> Outcome {
        let until = ContinuousClock.now + deadline
        guard let (id, numbered) = numbered(message) else { return .gone }
        let waiter = Waiter()
        guard pending.withLock({ pending -> Bool in
            guard !pending.closed else { return false }
            pending.waiters[id] = waiter
            return true
        }) else { return .gone }
        let sent = await send(numbered, on: control, until: until, overdue: .init("answer", what, within: deadline))
        guard sent == .sent else {
            _ = pending.withLock { $0.waiters.removeValue(forKey: id) }
            return sent == .timedOut ? .timedOut : .gone
        }
        // The worker poller reads the reply: a worker whose reply is in its socket when the
        // deadline passes is not blamed for the poller's lateness.
        let control = control.channel
        return await waiter.wait(upTo: max(until - .now, .zero), unread: { control.hasUnreadInput }, grace: deadline)
    }

    /// Sends call `function` (socket 5), the frame `frame(id)` makes for request `id` (nil:
    /// too large, `gone`), and waits for its reply, up to `deadline` if given:
    /// `timedOut` then (the function goes on in the worker; its late reply is dropped). Its
    /// frame must be written whole by `deadline`, or else by the event deadline: a worker
    /// that has not read it by then is killed (it no longer reads, or the stream is out of
    /// step), and the call is `timedOut`.
    ///
    /// The caller's thread reads the reply itself while no other thread reads the socket,
    /// for up to `callWatch`: a quick call then wakes no thread in this process but the
    /// caller's, as a bare socket round trip does. Replies it reads for other calls go to
    /// their callers; once it stops reading with calls still waiting, the worker poller
    /// reads on for them.
    ///
    /// A call is sent only once the call before it has been answered (the worker runs them
    /// one at a time): one whose turn has not come by its deadline is `notStarted`, never
    /// sent, and never runs; one that overran keeps the turn until its reply comes.
    func call(function: String, deadline: Duration?, frame: (Int) -> [UInt8]?) async -> CallOutcome {
        let start = ContinuousClock.now
        let id = nextID.add(1, ordering: .relaxed).oldValue
        let until = deadline.map { start + $0 }
        switch await takeTurn(id, function, until: until) {
        case .granted: break
        case .notStarted(let ahead): return .notStarted(ahead: ahead)
        case .gone: return .outcome(.gone)
        }
        let numbered = frame(id)
        let waiter = Waiter()
        guard callReplies.withLock({ replies -> Bool in
            guard !replies.closed else { return false }
            replies.waiters[id] = waiter
            return true
        }) else { return .outcome(.gone) }
        // Counted from its turn: the worker had another call to answer before.
        let sendLimit = deadline ?? plugin.deadline
        switch await send(numbered, on: calls, until: .now + sendLimit, overdue: .init("read call", function, within: sendLimit)) {
        case .sent:
            break
        case .timedOut:
            forgetCall(id)
            passTurn(id)
            return .outcome(.timedOut)
        case .gone:
            forgetCall(id)
            passTurn(id)
            return .outcome(.gone)
        }
        let watchUntil = ContinuousClock.now + Self.callWatch
        if let own = readOwnReply(id, waiter, until: until.map { min($0, watchUntil) } ?? watchUntil) {
            if case .reply = own { passTurn(id) }
            return .outcome(own)
        }
        let outcome = await waiter.wait(upTo: until.map { max($0 - .now, .zero) })
        if case .timedOut = outcome { forgetCall(id, overran: (function, start)) }
        return .outcome(outcome)
    }

    /// What became of a call: its outcome, or not started (its turn did not come by its
    /// deadline, with the call the worker had then).
    enum CallOutcome {
        case outcome(Outcome)
        case notStarted(ahead: (function: String, running: Duration)?)
    }

    /// Waits, holding no thread, until call `id` may be sent (the worker has no other call
    /// to answer), or until `until` passes (nil: as long as it takes).
    private func takeTurn(_ id: Int, _ function: String, until: ContinuousClock.Instant?) async -> Turn {
        /// `.granted` if no call has the turn (taking it), `.gone` once the socket ended.
        func takeIfFree(_ replies: inout CallReplies) -> Turn? {
            if replies.closed { return .gone }
            guard replies.turn == nil else { return nil }
            replies.turn = (id, function, .now)
            return .granted
        }
        // Nearly always free: taken without suspending (a continuation would cost a hop to
        // another thread on every call).
        if let free = callReplies.withLock({ takeIfFree(&$0) }) { return free }
        return await withCheckedContinuation { continuation in
            let now = callReplies.withLock { replies -> Turn? in
                if let free = takeIfFree(&replies) { return free }
                replies.queue.append((id, function, continuation))
                return nil
            }
            if let now {
                continuation.resume(returning: now)
                return
            }
            guard let until else { return }
            DispatchQueue.global().asyncAfter(deadline: .now() + max(until - .now, .zero).dispatchInterval) { [weak self] in
                guard let self else { return }
                let dropped = callReplies.withLock { replies -> (CheckedContinuation<Turn, Never>, Turn)? in
                    guard let index = replies.queue.firstIndex(where: { $0.id == id }) else { return nil }
                    let ahead = replies.turn.map { (function: $0.function, running: ContinuousClock.now - $0.since) }
                    return (replies.queue.remove(at: index).continuation, .notStarted(ahead: ahead))
                }
                if let (continuation, turn) = dropped { continuation.resume(returning: turn) }
            }
        }
    }

    /// Call `id` is answered (or was not sent): the next waiting call, if any, is sent.
    private func passTurn(_ id: Int) {
        let next = callReplies.withLock { replies -> CheckedContinuation<Turn, Never>? in
            guard replies.turn?.id == id else { return nil }
            guard !replies.queue.isEmpty else {
                replies.turn = nil
                return nil
            }
            let next = replies.queue.removeFirst()
            replies.turn = (next.id, next.function, .now)
            return next.continuation
        }
        next?.resume(returning: .granted)
    }

    /// The oldest call that overran its deadline and is still running in the worker.
    var overrunCall: (function: String, since: ContinuousClock.Instant)? {
        callReplies.withLock { $0.overrun.values.min { $0.since < $1.since } }
    }

    /// A new request id, and the frame of `message` (an object) with it (nil: too large).
    private func numbered(_ message: JSONValue) -> (Int, [UInt8]?)? {
        guard case .object = message else { return nil }
        let id = nextID.add(1, ordering: .relaxed).oldValue
        return (id, WorkerFrame.encode(message, id: .number(Double(id))))
    }

    /// Call `id` waits no more (`overran`: it did not return by its deadline, and its reply
    /// is still to come); once no call waits or overruns, the poller gives the socket back.
    private func forgetCall(_ id: Int, overran: (function: String, since: ContinuousClock.Instant)? = nil) {
        let (released, idle) = callReplies.withLock { replies -> (Bool, FrameReader?) in
            // A reply read since the caller's deadline passed has removed the waiter: the
            // call is over, and no overrun is left to wait for.
            let unanswered = replies.waiters.removeValue(forKey: id) != nil
            if let overran, unanswered, !replies.closed {
                replies.overrun[id] = overran
                // Its reply must still be read: by the poller, if no thread reads now.
                defer { replies.reader = nil }
                return (false, replies.reader)
            }
            return (replies.waiters.isEmpty && replies.overrun.isEmpty && replies.reader == nil && !replies.closed, nil)
        }
        if let idle { WorkerPoller.shared.readCalls(self, idle) }
        if released { WorkerPoller.shared.releaseCalls(self) }
    }

    /// Reads socket 5 on this thread until the reply to call `id` arrives or `until`
    /// passes, if no other thread reads it now; the reply, or nil to wait for it. Hands the
    /// socket to the worker poller when it stops with other calls (or its own) waiting.
    private func readOwnReply(_ id: Int, _ waiter: Waiter, until: ContinuousClock.Instant) -> Outcome? {
        guard var reader = callReplies.withLock({ replies -> FrameReader? in
            defer { replies.reader = nil }
            return replies.reader
        }) else { return nil }
        var own: Outcome?
        // The thread that read before may have handed this reply over already.
        while own == nil && waiter.peek() == nil {
            do throws(FrameReader.End) {
                let reply = try reader.next(until: until)
                if reply.integer("id") == id { own = .reply(reply) } else { callReplied(reply) }
            } catch .timedOut {
                break
            } catch {
                endCalls(error)
                return waiter.peek() ?? .gone
            }
        }
        let othersWait = callReplies.withLock { replies -> Bool in
            if own != nil { replies.waiters[id] = nil }
            let idle = replies.waiters.isEmpty && replies.overrun.isEmpty
            if idle { replies.reader = reader }
            return !idle
        }
        if othersWait { WorkerPoller.shared.readCalls(self, reader) }
        return own ?? waiter.peek()
    }

    /// A reply read on socket 5 (by a caller, or the worker poller): to its caller (none
    /// when that call timed out: dropped). One that answers no request ever sent gets the
    /// worker killed.
    func callReplied(_ reply: WorkerMessage) {
        guard let id = answeredRequest(reply, on: "socket of calls (5)") else { return }
        let (waiter, overran) = callReplies.withLock { replies in
            (replies.waiters.removeValue(forKey: id), replies.overrun.removeValue(forKey: id))
        }
        waiter?.complete(.reply(reply))
        if let overran {
            plugin.logger.info("call \(plugin.name).\(overran.function) returned after \((ContinuousClock.now - overran.since).secondsText), past its deadline; the plugin takes calls again",
                               [("function", overran.function), ("pid", "\(pid)")])
        }
        passTurn(id)
    }

    /// The worker poller gives the calls socket's reader back once no call waits: true
    /// when it took it (or the socket has ended), false while calls wait.
    func returnCallsReader(_ reader: FrameReader) -> Bool {
        callReplies.withLock { replies in
            guard !replies.closed else { return true }
            guard replies.waiters.isEmpty, replies.overrun.isEmpty else { return false }
            replies.reader = reader
            return true
        }
    }

    /// Socket 5 ended (the worker ended) or went out of step: every waiting call is `gone`,
    /// and so is every later one. A frame that is not a reply gets the worker killed, and so
    /// does a socket the worker closed while it runs on (a worker never does; its plugin
    /// may), a second later unless it ends.
    func endCalls(_ end: FrameReader.End) {
        if case .invalid(let reason) = end {
            kill(reason: "it sent an invalid reply to a call (\(reason))")
        } else {
            killLater(reason: "its socket of calls (5) was closed (\(end)) and it did not end")
        }
        let (waiters, queued) = callReplies.withLock { replies in
            defer {
                replies.waiters = [:]
                replies.overrun = [:]
                replies.reader = nil
                replies.closed = true
                replies.turn = nil
                replies.queue = []
            }
            return (Array(replies.waiters.values), replies.queue.map(\.continuation))
        }
        for waiter in waiters { waiter.complete(.gone) }
        for turn in queued { turn.resume(returning: .gone) }
    }

    /// A frame of the control socket (from the worker poller): a reply to its waiter, a
    /// log line or a notification to the plugin, a question (`locate`) answered; any other
    /// frame gets the worker killed, as one that is not JSON does.
    func received(_ message: WorkerMessage) {
        if message["id"] != nil {
            guard let id = answeredRequest(message, on: "control socket (3)") else { return }
            pending.withLock { $0.waiters.removeValue(forKey: id) }?.complete(.reply(message))
            return
        }
        switch message.text("op") {
        case "log": plugin.log(message.json, pid: pid)
        case "post": plugin.post(message.json)
        case "locate":
            // Answered without waiting for room in the socket (this thread reads every
            // worker's): what it has no room for now is written once it has.
            let deadline = plugin.deadline
            post(WorkerFrame.encode(plugin.locate(message.json)), on: control, until: .now + deadline,
                 overdue: .init("read the answer to its locate", within: deadline))
        case "ready", "failed": readiness.complete(.reply(message))
        case let op:
            kill(reason: "it wrote a frame with \(op.map { "op \(PluginName.shown($0))" } ?? "no op and no id"), which the protocol does not have, on its control socket (3)")
        }
    }

    /// The id of the request `reply` answers; nil, with the worker killed, when it carries
    /// none or that of a request the daemon never sent (only the plugin's code writes such
    /// a frame). A reply to a request given up on (its deadline passed) is not this.
    private func answeredRequest(_ reply: WorkerMessage, on socket: String) -> Int? {
        guard let id = reply.integer("id"), id >= 1, id < nextID.load(ordering: .sequentiallyConsistent) else {
            let given = reply["id"].map { JSONValue.escapingControlCharacters(String($0.jsonText.prefix(40))) }
            kill(reason: given.map { "it wrote a reply to request \($0), which the daemon never sent, on its \(socket)" }
                ?? "it wrote a reply without an id on its \(socket)")
            return nil
        }
        return id
    }

    /// The control socket's stream ended (from the worker poller): every waiter learns the
    /// worker is gone.
    func streamEnded() {
        killLater(reason: "its control socket (3) was closed and it did not end")
        readiness.complete(.gone)
        let waiters = pending.withLock { pending in
            defer { pending = ([:], true) }
            return Array(pending.waiters.values)
        }
        for waiter in waiters { waiter.complete(.gone) }
    }

    /// The worker has ended (from the worker poller, once its pidfd is readable; it is not
    /// reaped yet, so its pid and process group are still its own): kills what is left of
    /// its process group, reaps it and reports how it ended.
    func reap() {
        let reason = life.withLock { life -> String? in
            life.ended = true
            // Whatever the plugin forked dies with it.
            Glibc.kill(-pid, SIGKILL)
            return life.killReason
        }
        // Forgotten while the zombie still holds its pid (no new worker can have it yet).
        plugin.workerRecords.ended(pid)
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        var ending: String
        if status & 0x7f == 0 {
            ending = "exited with status \((status >> 8) & 0xff)"
        } else {
            let signal = status & 0x7f
            ending = "was killed by signal \(signal) (\(String(cString: strsignal(signal))))"
        }
        let stoppedQuietly = status & 0x7f == SIGKILL && reason == nil
        if let reason { ending += ": \(reason)" }
        // Said (and counted) before whoever waits for the end is told: a daemon that exits
        // once its workers have ended must not exit before it has said how one ended.
        plugin.ended(self, ending, stoppedQuietly: stoppedQuietly)
        finished.complete(.reply(WorkerMessage(keys: ["ending"], values: [.string(ending)])))
        // The reader, and a caller reading an ordered reply, stop (a process the plugin
        // forked may still hold the other ends).
        shutDown()
    }

    private func shutDown() {
        control.channel.shutDown()
        ordered.shutDown()
        calls.channel.shutDown()
    }

    /// Whether it was killed because it did not answer (or read) within its deadline.
    var killedAfterItsDeadline: Bool { life.withLock { $0.hung } }

    /// How the worker ended, once it has been reaped; nil while it runs.
    var ending: String? {
        guard case .reply(let message) = finished.peek() else { return nil }
        return message.text("ending")
    }

    /// How the worker ended, waiting up to `deadline` for it to be reaped (its sockets may
    /// close first); nil if it was not by then.
    func ending(within deadline: Duration) async -> String? {
        guard case .reply(let message) = await finished.wait(upTo: deadline) else { return nil }
        return message.text("ending")
    }

    /// Kills the worker (its process group) because it misbehaved; `reap` reports it.
    /// `afterItsDeadline`: because it did not answer (or read) within its deadline, which
    /// counts toward quarantine for longer (`IsolatedPlugin.quarantineWindow`).
    func kill(reason: String, afterItsDeadline: Bool = false) {
        life.withLock { life in
            guard !life.ended else { return }
            if life.killReason == nil {
                life.killReason = "killed because \(reason)"
                life.hung = afterItsDeadline
            }
            Glibc.kill(-pid, SIGKILL)
            Glibc.kill(pid, SIGKILL)
        }
    }

    /// Kills the worker for `reason` unless it ends within a second: a socket of it was
    /// closed, as when it is ending (crashed, exited), when it is then reported as it
    /// ended, or when its plugin closed it, when it would never answer again.
    func killLater(reason: String) {
        let first = life.withLock { life -> Bool in
            guard !life.ended, !life.stopping, life.laterReason == nil else { return false }
            life.laterReason = reason
            return true
        }
        if first { WorkerPoller.shared.kill(self, after: .seconds(1)) }
    }

    /// Ends the worker on purpose: closing the socket makes it kill its process group; one
    /// that has not ended after a second is killed.
    func stop() {
        life.withLock { $0.stopping = true }
        shutDown()
        WorkerPoller.shared.kill(self, after: .seconds(1))
    }

    /// Kills the worker's process group unless the worker has ended (the poller, a second
    /// after `stop`).
    func killUnlessEnded() {
        life.withLock { life in
            guard !life.ended else { return }
            if life.killReason == nil, let reason = life.laterReason { life.killReason = "killed because \(reason)" }
            Glibc.kill(-pid, SIGKILL)
        }
    }
}

/// A module of an isolated plugin, as the daemon's host instance sees it: everything it is
/// given goes to the module of the same name in the plugin's worker.
final class IsolatedModule: ModuleInAnotherProcess {
    let plugin: IsolatedPlugin
    let moduleName: String
    let notifications: Set<String>
    /// The info the worker's module gave last: the answer while no worker can be asked.
    private var lastInfo: ModuleInfo

    init?(plugin: IsolatedPlugin, name: String, version: String, configuration: JSONValue, running: [String]) {
        guard let created = plugin.create(name, configuration: configuration, running: running) else { return nil }
        self.plugin = plugin
        moduleName = name
        lastInfo = created.info ?? ModuleInfo(name: name, version: version)
        notifications = created.notifications
    }

    /// Asked of the worker's module each time, as a module in process is (its Info may
    /// change as it runs), up to the event deadline; the last answer when its worker is
    /// down or does not answer in time (logged; the worker is then killed and restarted).
    var info: ModuleInfo {
        if let info = plugin.info(moduleName), info.name == moduleName { lastInfo = info }
        return lastInfo
    }

    /// For `ModuleLookupError`: a cast of this stand-in to the module's own types fails.
    var location: String {
        "plugin \(plugin.name)'s worker process\(plugin.status.pid.map { " \($0)" } ?? "")"
    }

    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        // Its worker's answer is awaited at most the event deadline (then the worker is killed).
        host.handlerKeepsItsOwnDeadline()
        switch event {
        // The worker's own host sent these already (create initializes, configure changes).
        case .initialize, .configurationChanged: return
        case .start: plugin.deliver(moduleName, kind: "start", event: "start", payload: .null)
        case .deinitialize: plugin.deliver(moduleName, kind: "deinit", event: "deinit", payload: .null)
        case .notification(let name, let payload): plugin.deliver(moduleName, kind: "notification", event: name, payload: payload)
        case .custom(let name, let payload): plugin.deliver(moduleName, kind: "custom", event: name, payload: payload)
        @unknown default: return
        }
    }

    func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async {
        await plugin.deliverAwaited(moduleName, event: event.name, payload: event.payload)
    }

    func updateConfiguration(_ configuration: JSONValue, host: isolated HostInstance) -> (any Module)? {
        host.handlerKeepsItsOwnDeadline()
        return plugin.configure(moduleName, configuration: configuration) ? self : nil
    }

    func stateForReplacement(host: isolated HostInstance) -> JSONValue? {
        host.handlerKeepsItsOwnDeadline()
        return plugin.stateForReplacement(moduleName)
    }

    func restore(state: JSONValue, host: isolated HostInstance) {
        host.handlerKeepsItsOwnDeadline()
        plugin.restore(moduleName, state: state)
    }
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

/// The one thread every worker is spawned from. PR_SET_PDEATHSIG fires when the *thread*
/// that started a process ends, and pool threads come and go: this one never ends.
enum SpawnThread {
    private final class Job: Sendable {
        let body: @Sendable () -> Void
        let done = DispatchSemaphore(value: 0)
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }

    private static let queue = Mutex<[Job]>([])
    private static let wake = DispatchSemaphore(value: 0)
    /// Whether the thread runs; it is started by the first `run`, or by a later one if
    /// that could not start it.
    private static let started = Mutex(false)

    /// Starts the spawn thread unless it runs.
    private static func start() throws(SystemError) {
        try started.withLock { (started: inout Bool) throws(SystemError) in
            guard !started else { return }
            try startThread(name: "worker.spawn") {
                while true {
                    wake.wait()
                    while let job = queue.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) {
                        job.body()
                        job.done.signal()
                    }
                }
            }
            started = true
        }
    }

    /// Runs `body` on the spawn thread and returns its result. Throws, without running
    /// `body`, if the spawn thread is not running and cannot be started.
    static func run<T: Sendable>(_ body: @escaping @Sendable () -> T) throws(SystemError) -> T {
        try start()
        let result = Mutex<T?>(nil)
        let job = Job { let value = body(); result.withLock { $0 = value } }
        queue.withLock { $0.append(job) }
        wake.signal()
        job.done.wait()
        return result.withLock { $0! }
    }
}
