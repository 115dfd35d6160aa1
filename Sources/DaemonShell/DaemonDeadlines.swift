import ControlProtocol
import Glibc
import DaemonKit
import ModuleHost
import ModuleKit
import PluginCall
import Synchronization

/// How the daemon keeps its control plane and its shutdown bounded in time whatever plugin
/// code does (docs/daemon.md, "Deadlines and stuck modules"):
///
/// - `list`, `status` and `ping` read the daemon's own state and the host's snapshot, and
///   never wait for plugin code.
/// - `send`, `call`, `enable`, `disable` and `info` wait at most the request deadline, then
///   reply `deadline_exceeded`; the work goes on in the background.
/// - A module stuck in a callback is refused by `send --to` (`module_stuck`), and a `post`
///   names the listeners stuck before it or in it (`PostDelivery`); a plugin whose
///   call by name overran is refused further calls (`plugin_busy`) until it returns.
/// - Lifecycle event names are refused by `send` (`reserved_event`).
/// - A shutdown takes at most the shutdown budget; what still runs then is logged by name.
extension Daemon {
    /// Runs `operation` (which may wait on plugin code) for at most the request deadline;
    /// `meanwhile` says what an operator sees of it once the deadline has passed. `grace`
    /// is for an operation that keeps the request deadline itself and says better what
    /// became of it: this deadline then only backs it up.
    func withinRequestDeadline<T: Sendable>(_ what: String, meanwhile: String = "see modhostctl list for stuck modules",
                                            grace: Duration = .zero, _ operation: @escaping @Sendable () async -> T)
        async throws(DaemonError) -> T
    {
        let deadline = configuration.requestDeadline
        guard let result = await withDeadline(deadline + grace, operation) else {
            throw DaemonError(.deadlineExceeded,
                              "\(what) did not finish within the request deadline of \(deadline.secondsText); it goes on in the background (\(meanwhile))")
        }
        return result
    }

    /// Waits for startup to finish (`untilReady`), for at most the request deadline.
    func untilReadyWithinRequestDeadline() async throws(DaemonError) {
        try await withinRequestDeadline("waiting for the daemon to finish starting") { await self.untilReady() }
    }

    /// What module `name` is stuck in, if it is: a C module's callback past its deadline
    /// (`PluginWorkers`; an isolated module's is killed instead), or a Swift module's
    /// synchronous handler past the event deadline (`HostInstance.overdueHandler`), which
    /// holds up every event of the host until it returns. From any thread, without waiting.
    nonisolated func stuck(module name: String) -> PluginWorker.Stuck? {
        Self.stuck(module: name, workers: workers, host: host)
    }

    /// `stuck(module:)`, for closures that run on another actor (they must not capture
    /// the daemon).
    static func stuck(module name: String, workers: PluginWorkers, host: HostInstance) -> PluginWorker.Stuck? {
        workers.stuck(module: name) ?? overdue(module: name, host: host)
    }

    /// The synchronous Swift callback of module `name` past the event deadline, if any
    /// (`HostInstance.overdueHandler`), as a C module's is told.
    static func overdue(module name: String, host: HostInstance) -> PluginWorker.Stuck? {
        guard let overdue = host.overdueHandler, overdue.module == name else { return nil }
        return PluginWorker.Stuck(what: overdue.event, elapsed: overdue.elapsed)
    }

    /// Refuses lifecycle names, and a target module that is stuck.
    func checkSendable(event: String, to module: String?) throws(DaemonError) {
        if ModuleEvent.lifecycleNames.contains(event) {
            throw DaemonError(.reservedEvent,
                              "\"\(event)\" is a lifecycle event only the host sends (reserved: \(ModuleEvent.lifecycleNames.sorted().joined(separator: ", "))); choose another event name")
        }
        if let module, let stuck = stuck(module: module) {
            throw DaemonError(.moduleStuck,
                              "module \(module) is stuck in \(stuck.what) for \(stuck.elapsed.secondsText) and gets no events until it returns")
        }
    }

    /// After a send (begun at `started`): the modules that did not return from this event
    /// within the event deadline (they are now stuck, or, isolated, their worker was killed
    /// for it) make it fail with `deadline_exceeded`.
    func checkNotStuck(in event: String, to module: String?, since started: ContinuousClock.Instant) throws(DaemonError) {
        let names = module.map { [$0] } ?? host.runningModuleNames
        // C modules' callbacks only: a Swift module's synchronous handler has returned once
        // the send has (an overrun of it is told by `send`).
        let stuck = names.filter { workers.stuck(module: $0)?.what == event }
        if !stuck.isEmpty {
            throw DaemonError(.deadlineExceeded,
                              "module \(stuck.joined(separator: ", ")) did not finish event \(event) within the event deadline of \(configuration.eventDeadline.secondsText); it is shown as stuck and gets no more events until it returns")
        }
        // An isolated module's worker that did not answer it in time was killed for it; one
        // that ended during it, or was down, did not handle it.
        // (A module that was down before the event, like one stuck in an earlier one, fails
        // only a send to it alone.)
        let unanswered = names.compactMap { name in workers.leftUnanswered(module: name, event: event, since: started).map { (name, $0) } }
            .filter { $0.1 != .workerDown || module != nil }
        let overran = unanswered.filter { $0.1 == .overran }.map(\.0)
        if !overran.isEmpty {
            throw DaemonError(.deadlineExceeded,
                              "module \(overran.joined(separator: ", ")) did not finish event \(event) within the event deadline of \(configuration.eventDeadline.secondsText); its worker was killed for it and is restarted")
        }
        if !unanswered.isEmpty {
            let why = unanswered.map { name, why in
                why == .workerEnded ? "\(name)'s worker ended while it handled it" : "\(name)'s worker is not running (crashed, restarting or quarantined: see modhostctl list)"
            }
            throw DaemonError(.workerEnded,
                              "event \(event) was not handled: module \(why.joined(separator: "; module ")); a crashed worker is restarted, unless quarantined")
        }
    }

    /// Runs a call by name on the plugin's call worker, never on this actor, for at most
    /// the request deadline. A plugin whose previous call overran gets no new call; a call
    /// whose turn does not come within the deadline (the calls ahead of it took it all) is
    /// refused and never runs. An overrun is logged, and so is the call's late return.
    /// `counters`, when given, count a refusal (`plugin_busy`) and an overrun.
    func callOffActor(plugin: String, function: String, counters: FunctionCallMetrics?,
                      _ body: @escaping @Sendable () throws(CallError) -> CallValue)
        async throws(DaemonError) -> Result<CallValue, CallError>
    {
        let worker = workers.calls(plugin: plugin)
        if let stuck = worker.stuck {
            counters?.recordError("plugin_busy")
            throw DaemonError(.pluginBusy,
                              "plugin \(plugin) is busy: \(stuck.what) has been running for \(stuck.elapsed.secondsText); it gets no new call until that returns")
        }
        let deadline = configuration.requestDeadline
        let logger = logger
        let metadata = [("plugin", plugin), ("function", function)]
        let attempt = await worker.attempt("call \(function)", deadline: deadline, { () -> Result<CallValue, CallError> in
            do throws(CallError) {
                return .success(try body())
            } catch {
                return .failure(error)
            }
        }, returnedLate: { ran in
            logger.info("call \(plugin).\(function) returned after \(ran.secondsText), past the request deadline; the plugin takes calls again", metadata)
        })
        switch attempt {
        case .returned(let outcome):
            return outcome
        case .overran:
            overran(plugin, function, counters)
            throw DaemonError(.deadlineExceeded,
                              "call \(plugin).\(function) did not return within the request deadline of \(deadline.secondsText); the plugin gets no new call until it does")
        case .notStarted:
            counters?.recordError("plugin_busy")
            throw DaemonError(.pluginBusy,
                              PluginWorker.notStarted(plugin: plugin, function: function, deadline: deadline, ahead: worker.busy))
        }
    }

    /// A call by name still running at the request deadline: counted and logged.
    func overran(_ plugin: String, _ function: String, _ counters: FunctionCallMetrics?) {
        counters?.recordDeadlineOverrun()
        logger.warning("call \(plugin).\(function) did not return within the request deadline of \(configuration.requestDeadline.secondsText); it goes on running, and the plugin gets no new call until it returns",
                       [("plugin", plugin), ("function", function)])
    }

    /// Closes the control socket and stops the modules, then waits for the C callbacks and
    /// calls still queued, all within the shutdown budget. False when the budget ran out:
    /// what still runs is logged by name (the caller exits 1).
    func stopWithinBudget() async -> Bool {
        let budget = configuration.shutdownBudget
        let clock = ContinuousClock()
        let started = clock.now
        let server = owned.server
        let stopped = await withDeadline(budget) { [plugins] in
            await server?.stop()
            // A startup or reload in progress loads nothing more once stopping; the plugin
            // it is loading finishes first, so the host is not shut down halfway through it.
            await plugins.shutdown()
            return true
        }
        // C callbacks still queued or running (a deinit, a destroy, a call) get what is left.
        while stopped != nil, !(workers.busyModules.isEmpty && workers.busyCalls.isEmpty), clock.now - started < budget {
            try? await Task.sleep(for: .milliseconds(10))
        }
        let remaining = stillRunning(shutdownReturned: stopped != nil)
        guard remaining.isEmpty else {
            logger.error("the shutdown budget of \(budget.secondsText) ran out; exiting with modules still running: \(remaining.joined(separator: ", "))",
                         [("budget", budget.secondsText)])
            return false
        }
        logger.info("stopped")
        return true
    }

    /// What still runs, by name, when a shutdown's budget has run out: C callbacks and calls
    /// by name still queued or running and, unless the plugin set's shutdown returned, the
    /// modules not yet deinitialized and the plugin being loaded. Read from the daemon's
    /// own state, from any thread, without waiting.
    nonisolated func stillRunning(shutdownReturned: Bool) -> [String] {
        // A Swift module's callback past the deadline, unless the host's shutdown returned
        // (then none runs, though the watch may not have seen it return yet).
        let overdue = shutdownReturned ? [] : host.overdueHandler.map { ["module \($0.module) (in \($0.event) for \($0.elapsed.secondsText))"] } ?? []
        let busy = workers.busyModules.map { "module \($0.module) (in \($0.busy.what) for \($0.busy.elapsed.secondsText))" } + overdue
            + workers.busyCalls.map { "plugin \($0.plugin) (in \($0.busy.what) for \($0.busy.elapsed.secondsText))" }
        guard !shutdownReturned else { return busy }
        let unfinished = host.runningModuleNames.map { "module \($0) (not yet deinitialized)" }
        // A startup or reload still in a plugin's code (its modules' create or init, say,
        // within the event deadline) holds up the shutdown without a module being busy yet.
        let loading = plugins.workInProgress.map { [$0] } ?? []
        let remaining = busy + unfinished.filter { line in !busy.contains { $0.hasPrefix(line.prefix { $0 != "(" }) } } + loading
        return remaining.isEmpty ? ["the plugin set (still loading or stopping)"] : remaining
    }
}

/// The shutdown's last resort, on threads of its own: ends the process 1 s after the
/// shutdown budget has run out, and at once at a second SIGTERM or SIGINT.
///
/// The shutdown itself (`Daemon.stopWithinBudget`) runs as Swift tasks, and so does the
/// daemon's own handling of signals: neither runs while plugin code holds every thread of
/// Swift concurrency (a Swift module whose tasks block in `sleep` or on a semaphore, one per
/// CPU). This watch needs none of those threads: signals reach it on the thread that reads
/// them (`UnixSignalWatch`), and the budget is kept by a thread it starts at the first one.
/// When the budget and the second more have passed, it logs what still runs and exits 1,
/// as an exceeded budget does (the in-flight record cleared: not a crash).
final class ShutdownWatchdog: Sendable {
    /// How long past the budget the watch waits for the shutdown's own end (which names
    /// what still runs itself) before it ends the process.
    static let grace = Duration.seconds(1)
    /// The budget, and how many signals came; shared with the signal handler.
    private final class Counts: Sendable {
        let state: Mutex<(budget: Duration, signals: Int)>
        init(budget: Duration) { state = Mutex((budget: budget, signals: 0)) }
    }
    private let counts: Counts
    private let watch: UnixSignalWatch?

    /// Starts watching SIGTERM and SIGINT; `stillRunning` names what still runs.
    init(budget: Duration, logger: Logger, stillRunning: @escaping @Sendable () -> [String]) {
        let counts = Counts(budget: budget)
        self.counts = counts
        do {
            watch = try UnixSignalWatch([.terminate, .interrupt]) { signal in
                let (count, budget) = counts.state.withLock { state in
                    state.signals += 1
                    return (state.signals, state.budget)
                }
                if count > 1 {
                    logger.warning("\(signal) received again during shutdown, exiting now")
                    ExitGuard.exit(ExitCode.failure.rawValue)
                }
                let end = ContinuousClock.now + budget + Self.grace
                do throws(SystemError) {
                    try startThread(name: "shutdown-watch") {
                        Self.sleep(until: end)
                        logger.error("the shutdown budget of \(budget.secondsText) ran out and the shutdown could not go on: plugin code most likely holds the threads Swift concurrency runs on (a Swift module or task blocking its thread); exiting with modules still running: \(stillRunning().joined(separator: ", "))",
                                     [("budget", budget.secondsText)])
                        ExitGuard.exit(ExitCode.failure.rawValue)
                    }
                } catch {
                    logger.warning("cannot watch for the end of the shutdown budget from a thread of its own: \(error)")
                }
            }
        } catch {
            logger.warning("cannot watch for the end of the shutdown budget from a thread of its own: \(error)")
            watch = nil
        }
    }

    /// The budget a shutdown that begins from now on has (a reload may change it).
    func setBudget(_ budget: Duration) { counts.state.withLock { $0.budget = budget } }

    /// Stops watching (the process is exiting by itself).
    func cancel() { watch?.cancel() }

    /// Blocks the calling thread (never a task's) until `end`.
    private static func sleep(until end: ContinuousClock.Instant) {
        while case let remaining = ContinuousClock.now.duration(to: end), remaining > .zero {
            let (seconds, attoseconds) = remaining.components
            var interval = timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
            _ = nanosleep(&interval, nil)
        }
    }
}

/// Which listeners of a posted notification got it: a listener stuck in a callback when it
/// was posted did not get it (a C module gets no events until it returns); one that got it
/// and did not return within the event deadline overran (it is now stuck in it). The reply
/// names both rather than counting them among the listeners reached.
struct PostDelivery {
    var notification: String
    /// Those that got it and returned in time, in module order.
    var reached: [String] = []
    /// Those that got it and are now stuck in it.
    var overran: [String] = []
    /// Those that got it, were found past the event deadline in it and have returned since
    /// (a Swift module's synchronous handler, which the host waited for).
    var returnedLate: [String] = []
    /// Those stuck in another callback (or an earlier one of the same name) when it was posted.
    var notDelivered: [(module: String, stuck: PluginWorker.Stuck)] = []
    /// Isolated listeners whose worker did not answer it within the event deadline (it was
    /// killed for it), and those whose worker ended while it had it.
    var killed: [String] = []
    var workerEnded: [String] = []

    /// `unanswered`: why an isolated listener did not answer the notification, nil when it
    /// did (or runs in process). One whose worker was not running (crashed, restarting,
    /// quarantined) did not get it and is not reached, as a `send` to all.
    /// `overranAndReturned`: whether a listener's deadline overruns grew since the post.
    init(notification: String, listeners: [String], stuckBefore: [String: PluginWorker.Stuck],
         stuckAfter: (String) -> PluginWorker.Stuck?, unanswered: (String) -> PluginWorkers.Unanswered?,
         overranAndReturned: (String) -> Bool) {
        self.notification = notification
        for module in listeners {
            switch unanswered(module) {
            case .overran?: killed.append(module); continue
            case .workerEnded?: workerEnded.append(module); continue
            case .workerDown?: continue
            case nil: break
            }
            let after = stuckAfter(module)
            if let before = stuckBefore[module] {
                // Still in the callback it was in (its time only grew), or returned since:
                // either way the notification found it stuck.
                if after.map({ $0.what == before.what && $0.elapsed >= before.elapsed }) ?? true {
                    notDelivered.append((module, before))
                    continue
                }
            }
            if let after, after.what == notification {
                overran.append(module)
            } else if overranAndReturned(module) {
                returnedLate.append(module)
            } else {
                reached.append(module)
            }
        }
    }

    /// `deadline_exceeded` when a listener overran, `worker_ended` when an isolated
    /// listener's worker ended with it, `module_stuck` when a listener stuck before did not
    /// get it; nil when every listener that runs got it and returned in time.
    func error(eventDeadline: Duration) -> DaemonError? {
        guard !overran.isEmpty || !returnedLate.isEmpty || !notDelivered.isEmpty || !killed.isEmpty || !workerEnded.isEmpty else { return nil }
        var parts: [String] = []
        if !overran.isEmpty {
            parts.append("\(Self.modules(overran)) did not finish notification \(notification) within the event deadline of \(eventDeadline.secondsText); "
                         + (overran.count == 1 ? "it is shown as stuck and gets no more events until it returns" : "they are shown as stuck and get no more events until they return"))
        }
        if !returnedLate.isEmpty {
            parts.append("\(Self.modules(returnedLate)) did not finish notification \(notification) within the event deadline of \(eventDeadline.secondsText) but "
                         + (returnedLate.count == 1 ? "has" : "have") + " returned since")
        }
        if !killed.isEmpty {
            parts.append("\(Self.modules(killed)) did not finish notification \(notification) within the event deadline of \(eventDeadline.secondsText); "
                         + (killed.count == 1 ? "its worker was" : "their workers were") + " killed for it and restarted")
        }
        if !workerEnded.isEmpty {
            parts.append("notification \(notification) was not handled by \(Self.modules(workerEnded)): "
                         + (workerEnded.count == 1 ? "its worker" : "their workers") + " ended while handling it; a crashed worker is restarted, unless quarantined")
        }
        if !notDelivered.isEmpty {
            let each = notDelivered.map { "\($0.module) (stuck in \($0.stuck.what) for \($0.stuck.elapsed.secondsText))" }
            parts.append("notification \(notification) was not delivered to \(notDelivered.count == 1 ? "module" : "modules") \(each.joined(separator: ", ")), "
                         + "stuck in a callback that has not returned")
        }
        parts.append(reached.isEmpty ? "no listener got it" : "it reached \(reached.joined(separator: ", "))")
        let code: DaemonError.Code = !overran.isEmpty || !returnedLate.isEmpty || !killed.isEmpty ? .deadlineExceeded : !workerEnded.isEmpty ? .workerEnded : .moduleStuck
        return DaemonError(code, parts.joined(separator: "; "))
    }

    private static func modules(_ names: [String]) -> String {
        (names.count == 1 ? "module " : "modules ") + names.joined(separator: ", ")
    }
}
