import ControlProtocol
import DaemonKit
import Glibc
import ModuleHost
import ModuleKit
import PluginCall
import PluginFormat

/// Settings of one daemon run, from the command line; the configuration file adds to them.
public struct DaemonOptions: Sendable {
    public var pluginDirectories: [String] = []
    public var allowInsecurePlugins = false
    public var logLevel: LogLevel?
    /// `--log-format`: overrides the configuration's `logFormat`.
    public var logFormat: LogFormat?
    public var eventDeadline: Duration?
    /// `--request-deadline`: overrides the configuration's `requestDeadline`.
    public var requestDeadline: Duration?
    /// `--shutdown-budget`: overrides the configuration's `shutdownBudget`.
    public var shutdownBudget: Duration?
    public var stateDirectory: String?
    public var socketPath: String?
    /// The configuration file: `--config`'s, else the default path (read when it exists).
    public var configPath: String?
    /// Whether the configuration path was given explicitly (then it must exist).
    public var configPathExplicit = false
    /// The trial loader; nil finds `modhost-trial` next to the running executable.
    public var trialLoader: String?
    /// The isolated plugins' worker; nil finds `modhost-worker` next to the running executable.
    public var worker: String?
    /// `--check-config`: read and check the configuration, say so, and exit without starting.
    public var checkConfigurationOnly = false

    public enum LogFormat: String, Sendable { case text, json }

    public init() {}
}

/// The daemon: a shell over one `PluginSet` (which owns the plugins, their modules and
/// their lifecycle) that adds the configuration file, the signals, the directory watcher,
/// the control socket and systemd notifications.
///
/// Start: the crash guard is read, every plugin directory is watched and then scanned,
/// every valid plugin is loaded in dependency order from a private copy and its modules
/// initialized, then all modules are started and READY=1 is sent. Afterwards changes in
/// the directories (and SIGHUP / `modhostctl reload`) add, replace and remove plugins
/// while everything else keeps running. SIGTERM/SIGINT stop it.
///
/// All changes to the set of plugins go through the plugin set's serial queue, so a
/// reload, a directory event and a control request never interleave halfway.
public actor Daemon: DaemonControl {
    public let options: DaemonOptions
    public let host: HostInstance
    /// The plugins and their lifecycle.
    public let plugins: PluginSet
    let paths: RuntimePaths
    let stateDirectory: String
    let socketPath: String
    let logger = Logger(label: "modhostd")
    let notifier = SystemdNotifier()
    /// Where C module callbacks and calls by name run, off this actor (PluginWorker.swift).
    let workers = PluginWorkers()
    let crashGuard: CrashGuard
    var configuration: DaemonConfiguration
    /// The configuration file the running configuration was read from; nil for none.
    var configurationFile: String?
    var reloads = 0
    let startTime = ContinuousClock.now
    /// When the daemon started, in seconds since the Unix epoch.
    let startedAt: Double = {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }()
    /// Where the daemon is in its life.
    var lifecycle = Lifecycle.starting(readyWaiters: [])
    /// What the daemon holds while it runs, taken by `start()` and let go by `stop()`.
    var owned = Owned()
    /// Whether the daemon is executing itself again (`renewIfNeeded`).
    var renewing = false
    /// What the program was started with, which a renewal keeps open (`descriptorsStartedWith`).
    let inheritedDescriptors = Daemon.descriptorsStartedWith()
    /// Whether a SIGTERM or SIGINT asked the daemon to stop: a renewal under way then
    /// exits rather than executing the daemon again.
    var terminationRequested = false

    /// The daemon's life, one state at a time: starting, then running (or failed), then
    /// stopping and stopped. Only `start()`, `run()` and `stop()` change it.
    enum Lifecycle {
        /// Not ready yet: `start()` has not finished. Requests that act on modules wait
        /// here (`untilReady()`), resumed when it has.
        case starting(readyWaiters: [CheckedContinuation<Void, Never>])
        /// Started: every plugin found is loaded and every enabled module started.
        case running
        /// `start()` failed; `run()` exits with it.
        case failed(DaemonError)
        /// A shutdown began (`stop()`, or a signal during startup).
        case stopping
        /// `stop()` returned.
        case stopped
    }

    /// What the daemon holds from `start()` to the end of `stop()`.
    struct Owned {
        /// The locks of the state directory and the socket path: this process owns them.
        var stateLock: ExclusiveLock?
        var socketLock: ExclusiveLock?
        var server: ControlServer?
        var watcher: DirectoryWatcher?
        /// Ends a shutdown that outlives its budget even when no task of the daemon can run.
        var watchdog: ShutdownWatchdog?
        /// systemd's keep-alives, when it asks for them.
        var keepAlive: DaemonWatchdog?
    }

    /// Whether startup has finished and no shutdown has begun.
    var ready: Bool {
        if case .running = lifecycle { return true }
        return false
    }

    /// Moves to `next`, resuming the requests that waited for startup to finish.
    func enter(_ next: Lifecycle) {
        if case .starting(let waiters) = lifecycle {
            for waiter in waiters { waiter.resume() }
        }
        lifecycle = next
    }

    /// Prepares the daemon; nothing is loaded until `run()` or `start()`.
    public init(options: DaemonOptions, configuration: DaemonConfiguration) throws(DaemonError) {
        let paths = RuntimePaths()
        let stateDirectory = options.stateDirectory ?? paths.stateDirectory
        let crashGuard: CrashGuard
        do throws(PluginSetError) {
            try PluginSet.checkStateDirectory(stateDirectory, alternative: "pass another --state-dir")
            crashGuard = try CrashGuard(directory: stateDirectory)
        } catch {
            throw DaemonError(error)
        }
        self.options = options
        self.configuration = configuration
        configurationFile = options.configurationFileToRead
        self.paths = paths
        self.stateDirectory = stateDirectory
        self.crashGuard = crashGuard
        socketPath = options.socketPath ?? paths.socketPath
        // One descriptor per image mapped from memory (`PluginSet`): room for them.
        raiseDescriptorLimit()
        let host = HostInstance(
            name: "modhostd", settings: configuration.modules,
            eventDeadline: configuration.eventDeadline, logger: Logger(label: "modhostd"))
        self.host = host
        plugins = PluginSet(
            host: host, settings: configuration.modules, directories: configuration.pluginDirectories,
            imagesDirectory: stateDirectory + "/images", crashGuard: crashGuard,
            validator: Validator(allowInsecure: options.allowInsecurePlugins || configuration.allowInsecurePlugins),
            workers: workers, trialLoader: ProcessTrialLoader(executable: options.trialLoader),
            isolation: Self.isolationPolicy(configuration, options), logger: Logger(label: "modhostd"))
    }

    /// The plugin set's isolation policy for `configuration`.
    static func isolationPolicy(_ configuration: DaemonConfiguration, _ options: DaemonOptions) -> IsolationPolicy {
        IsolationPolicy(defaultIsolation: configuration.isolation, plugins: configuration.plugins,
                        workerExecutable: options.worker, logLevel: configuration.logLevel)
    }

    var directories: [String] { configuration.pluginDirectories }

    // MARK: - Running

    /// Runs until SIGTERM or SIGINT; returns the exit code.
    ///
    /// Signals are handled from the moment their handlers are installed, before startup:
    /// a SIGTERM/SIGINT while plugins are still loading stops the startup (no further
    /// plugin is loaded or started) and shuts down through `stop()`, within the shutdown
    /// budget counted from the signal; a second one exits 1 at once.
    public func run() async -> ExitCode {
        LargeBlocks.returnToTheSystemWhenFreed()
        ExitGuard.install(crashGuard, logger: logger)
        let signals: UnixSignals
        do {
            signals = try UnixSignals(.terminate, .interrupt, .hangup)
        } catch {
            logger.error("cannot install signal handlers: \(error)")
            return .osError
        }
        // Ends the process past the shutdown budget, and at a second SIGTERM or SIGINT,
        // even while no Swift task of the daemon can run.
        let watchdog = ShutdownWatchdog(budget: configuration.shutdownBudget, logger: logger) { [self] in
            stillRunning(shutdownReturned: false)
        }
        owned.watchdog = watchdog
        // Startup runs beside the signal loop, so a signal never waits for it. A failed
        // startup ends the loop (the signals already received are still delivered).
        Task {
            do throws(DaemonError) {
                try await start()
            } catch {
                enter(.failed(error))
                signals.cancel()
            }
        }
        for await signal in signals {
            if signal == .hangup {
                logger.info("SIGHUP received: reloading")
                // Off the loop: a reload waits for startup and for plugin code.
                Task { _ = try? await reload() }
                continue
            }
            logger.info("\(signal) received, shutting down\(ready ? "" : " (startup stops: no further plugin is loaded)")")
            terminationRequested = true
            plugins.stopChanges()
            break
        }
        if case .failed(let error) = lifecycle {
            watchdog.cancel()
            logger.error("\(error.message)")
            return .osError
        }
        // A second SIGTERM/SIGINT during shutdown ends the process at once (the watchdog
        // holds the handlers, so no signal falls between this sequence's end and it).
        signals.cancel()
        let clean = await stop()
        watchdog.cancel()
        return clean ? .success : .failure
    }

    /// Takes the daemon's place, then loads everything and starts the modules. Sends
    /// READY=1 once every enabled module has started.
    ///
    /// Order: the state directory's lock, the private runtime directory (when the socket
    /// lives in one), the socket's lock and the bound control socket all come before any
    /// plugin code runs, so a second daemon on the same state directory or socket exits
    /// with `already_running` having run nothing. Then the crash guard is read, the
    /// directories are watched and scanned, and the plugins loaded and started. Requests
    /// that arrive meanwhile are answered from what is loaded so far (`status` says
    /// `ready: false`); those that act on modules wait until startup is done.
    public func start() async throws(DaemonError) {
        try takeOwnership()
        crashGuard.recoverFromPreviousRun(logging: logger)
        if let problem = FatalSignalRecorder.install(crashGuard) {
            logger.warning("\(problem); a crash in a plugin's own threads cannot be attributed to it")
        }
        if let states = takeHandedOverStates() {
            await host.restoreOnCreation(states)
            logger.info("took over from the daemon this program replaced: \(states.count) \(states.count == 1 ? "module's state" : "modules' states") handed over",
                        [("states", "\(states.count)")])
        }
        notify { try $0.status("loading plugins") }
        // Watch first, then scan, so nothing that arrives in between is missed.
        startWatching()
        await plugins.setStopsPluginsWithUnsafeFiles(configuration.stopPluginsWithUnsafeFiles)
        await plugins.reconcile(trial: false)
        await plugins.start()
        // (A shutdown that began meanwhile keeps its state.)
        if case .starting = lifecycle { enter(plugins.isStopping ? .stopping : .running) }
        // A SIGTERM/SIGINT came first: the shutdown (`run()`) takes over from here.
        if plugins.isStopping { return }
        let snapshot = await plugins.snapshot()
        let down = downModules(snapshot)
        let running = await host.moduleNames.filter { down[$0] == nil }
        logger.info("started \(running.count) \(running.count == 1 ? "module" : "modules")\(running.isEmpty ? "" : ": " + Self.firstNames(running))",
                    [("plugins", "\(snapshot.plugins.count)"), ("refused", "\(snapshot.filesRefused)")])
        for (module, worker) in down.sorted(by: { $0.key < $1.key }) {
            logger.warning("module \(module) is not running: its worker is \(worker.phase.rawValue)\(worker.lastCrash.map { " (last: \($0))" } ?? "")",
                           [("module", module)])
        }
        logger.info("control socket ready", [("socket", socketPath)])
        notify { try $0.ready(status: "\(running.count) \(running.count == 1 ? "module" : "modules") running") }
        owned.keepAlive = DaemonWatchdog.start(socketPath: socketPath, notifier: notifier, logger: logger)
    }

    /// The most module names the "started N modules" line lists; `modhostctl list` has
    /// them all.
    public static let namesListed = 20

    /// `names` joined by commas, the first `namesListed` of them and how many more.
    public static func firstNames(_ names: [String]) -> String {
        let shown = names.prefix(namesListed).joined(separator: ", ")
        return names.count > namesListed ? shown + " and \(names.count - namesListed) more (modhostctl list)" : shown
    }

    /// Returns once startup has finished (at once afterwards): requests that act on
    /// modules wait here rather than reach modules that are not started yet.
    func untilReady() async {
        guard case .starting = lifecycle else { return }
        await withCheckedContinuation { continuation in
            guard case .starting(let waiters) = lifecycle else { return continuation.resume() }
            lifecycle = .starting(readyWaiters: waiters + [continuation])
        }
    }

    /// Locks the state directory, prepares the socket's directory, locks the socket path
    /// and binds the control socket: everything that makes this process the one daemon for
    /// them. Throws `.alreadyRunning` (naming the directory or socket and the other pid)
    /// when another daemon has either.
    func takeOwnership() throws(DaemonError) {
        func alreadyRunning(_ what: String, _ pid: Int32?, lockFile: String? = nil) -> DaemonError {
            // The pid in the lock file is the daemon that took it; a process it left behind
            // (one that inherited the lock) may hold it after it ended.
            if let pid, let lockFile, kill(pid, 0) != 0, errno == ESRCH {
                return DaemonError(.alreadyRunning,
                                   "\(what) is locked by a process that inherited the lock of modhostd (pid \(pid), which is no longer running); this one exits without loading any plugin. Fix: find that process with `fuser -v \(lockFile)` and stop it")
            }
            return DaemonError(.alreadyRunning,
                               "another modhostd\(pid.map { " (pid \($0))" } ?? "") is using \(what); this one exits without loading any plugin. Fix: stop it, or give this one its own --state-dir and --socket")
        }
        func lock(_ path: String, _ what: String, code: DaemonError.Code, lockingDirectory: Bool = false) throws(DaemonError) -> ExclusiveLock {
            do {
                return try ExclusiveLock(path: path, lockingDirectory: lockingDirectory)
            } catch .held(_, let pid) {
                throw alreadyRunning(what, pid, lockFile: path)
            } catch .system(let error) where error.code == ELOOP {
                throw DaemonError(code, "cannot lock \(what): \(path) is a symlink. Fix: remove it; modhostd makes its lock files itself")
            } catch {
                throw DaemonError(code, "cannot lock \(what): \(error). Fix: check that \(PathText.parent(of: path)) belongs to the daemon's user and is writable by it")
            }
        }
        owned.stateLock = try lock(stateDirectory + "/modhostd.lock", "the state directory \(stateDirectory)", code: .stateDirectory,
                                   lockingDirectory: true)
        // Before anything is created next to it (its lock, its directory).
        if let problem = UnixSocketAddress.problem(with: socketPath) {
            throw DaemonError(.controlSocket, "the control socket path \(socketPath) \(problem). Fix: pass a shorter --socket")
        }
        var existing = stat()
        if !socketPath.hasPrefix("@"), lstat(socketPath, &existing) == 0, existing.st_mode & S_IFMT != S_IFSOCK {
            throw DaemonError(.controlSocket,
                              "the control socket path \(socketPath) is taken by a \(existing.st_mode & S_IFMT == S_IFDIR ? "directory" : "file that is not a socket"). Fix: pass another --socket, or remove it if nothing needs it")
        }
        let directory = PathText.parent(of: socketPath)
        if !socketPath.hasPrefix("@") {
            if directory == paths.privateRuntimeDirectory {
                do {
                    try RuntimePaths.checkPrivateDirectory(directory, create: true)
                } catch {
                    throw DaemonError(.controlSocket, "cannot use the control socket \(socketPath): \(error)")
                }
            } else {
                try? FileSystem.createDirectory(directory, parents: true)
                if let problem = Self.sharedDirectoryProblem(directory) {
                    throw DaemonError(.controlSocket,
                                      "the control socket's directory \(directory) \(problem): another user could take the socket's name, or its lock's, first and block this start. Fix: pass a --socket in a directory only the daemon's user (or root) may write, such as /run/modhostd")
                }
            }
            // With this lock held, a socket file left at the path is a dead daemon's: the
            // control server may replace it without racing another starting daemon.
            owned.socketLock = try lock(socketPath + ".lock", "the control socket \(socketPath)", code: .controlSocket)
        }
        let service = ControlService(daemon: self, logger: logger)
        do {
            owned.server = try service.makeServer(socketPath: socketPath, listener: takeHandedOverListener())
        } catch .alreadyRunning {
            throw alreadyRunning("the control socket \(socketPath) (a process accepts connections on it)", nil)
        } catch {
            throw DaemonError(.controlSocket, "cannot open the control socket \(socketPath): \(error). Fix: stop the other modhostd or pass --socket")
        }
        logger.info("control socket listening; loading plugins", [("socket", socketPath)])
    }

    /// Why others could create names in `directory` (the control socket's, when given
    /// with --socket): writable by group or others, even with the sticky bit (it keeps them
    /// from removing the daemon's names, not from taking one first), or owned by a user
    /// other than root and the daemon's; nil when they cannot, or it cannot be read (opening
    /// the socket then says why).
    static func sharedDirectoryProblem(_ directory: String) -> String? {
        var status = stat()
        guard stat(directory, &status) == 0 else { return nil }
        return FileSystem.trustProblems(status, trustedUID: geteuid()).first.map { "is \($0)" }
    }

    /// Stops the control socket and the watcher, then the modules (willTerminate awaited,
    /// deinit in reverse order), all within the configured shutdown budget. Returns false
    /// when the budget ran out first; the modules and calls still running are then logged
    /// by name (DaemonDeadlines.swift).
    @discardableResult
    public func stop() async -> Bool {
        // A renewal stops to start again in this process: the service manager is told it
        // reloads (`renewIfNeeded`), not that it stops.
        if !renewing { notify { try $0.stopping(status: "stopping") } }
        enter(.stopping)
        owned.keepAlive?.stop()
        owned.watcher?.stop()
        let clean = await stopWithinBudget()
        owned.socketLock = nil
        owned.stateLock = nil
        enter(.stopped)
        return clean
    }

    func notify(_ message: (SystemdNotifier) throws -> Void) {
        do {
            try message(notifier)
        } catch {
            logger.warning("cannot notify systemd: \(error)")
        }
    }

    // MARK: - Control socket and watcher

    func startWatching() {
        do {
            let watcher = try DirectoryWatcher(directories: [])
            for directory in directories { follow(directory, with: watcher) }
            owned.watcher = watcher
            Task { [weak self] in
                for await batch in watcher.changes {
                    guard let self else { return }
                    await self.directoryChanged(batch)
                }
            }
        } catch {
            logger.error("cannot watch plugin directories (\(error)); changes are picked up on SIGHUP or modhostctl reload")
        }
    }

    /// Watches a plugin directory from now on, also once it is created or recreated.
    func follow(_ directory: String, with watcher: DirectoryWatcher) {
        do {
            try watcher.follow(directory)
            if !watcher.directories.contains(DirectoryWatcher.normalize(directory)) {
                logger.warning("plugin directory \(directory) does not exist yet; its plugins are loaded once it is created", [("directory", directory)])
            }
        } catch {
            logger.error("cannot watch plugin directory \(directory): \(error); it is still scanned on reload", [("directory", directory)])
        }
    }

    func directoryChanged(_ batch: [DirectoryChange]) async {
        for change in batch {
            switch change.kind {
            case .directoryRemoved:
                logger.warning("plugin directory \(change.directory) disappeared; its plugins are removed, and loaded again if it comes back",
                               [("directory", change.directory)])
            case .directoryAppeared:
                logger.info("plugin directory \(change.directory) appeared; scanning it", [("directory", change.directory)])
            case .overflow:
                logger.warning("too many changes at once; rescanning every plugin directory")
            case .ready, .removed, .attributesChanged:
                logger.debug("\(change.kind) \(change.path)")
            }
        }
        await plugins.reconcile()
        await renewIfNeeded()
    }

    // MARK: - DaemonControl

    /// Answered from the daemon's own state and the host's snapshot: never waits for a
    /// module or an update in progress.
    public func moduleRows() async -> [ModuleRow] {
        let statuses = host.registeredModulesSnapshot
        let snapshot = await plugins.snapshot()
        let loaded = Dictionary(snapshot.plugins.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        var rows: [ModuleRow] = []
        for status in statuses {
            let plugin = loaded[status.plugin]
            // A module not running may be in its `create` (being enabled), past the deadline.
            let stuck = status.running ? stuck(module: status.name) : Self.overdue(module: status.name, host: host)
            let worker = plugin?.worker
            var state = Self.state(of: status, stuck: stuck != nil)
            // A running module of an isolated plugin whose worker is down shows why.
            if state == .running, let worker, let down = PluginState(worker: worker.phase) { state = down }
            var row = ModuleRow(
                module: status.name, plugin: status.plugin, file: plugin?.file ?? "", version: plugin?.version ?? status.version,
                state: state.rawValue, order: status.order, generation: plugin?.generation,
                lastError: plugin?.lastError?.description ?? worker?.lastCrash.map { "worker \($0)" },
                stuckIn: stuck?.what, stuckSeconds: stuck.map { ($0.elapsed.seconds * 10).rounded() / 10 })
            row.isolation = plugin.map { $0.isolation.rawValue }
            row.workerPid = worker?.pid
            row.restarts = worker?.restarts
            rows.append(row)
        }
        // The modules of a plugin being added, which the host registers only once their
        // create and init have returned (or overrun): loading, or stuck in create.
        let listed = Set(statuses.map(\.name))
        for plugin in snapshot.plugins {
            for module in plugin.modules where !listed.contains(module) {
                let stuck = stuck(module: module)
                var row = ModuleRow(
                    module: module, plugin: plugin.name, file: plugin.file, version: plugin.version,
                    state: (stuck == nil ? ModuleRow.State.loading : .stuck).rawValue, generation: plugin.generation,
                    stuckIn: stuck?.what, stuckSeconds: stuck.map { ($0.elapsed.seconds * 10).rounded() / 10 })
                row.isolation = plugin.isolation.rawValue
                row.workerPid = plugin.worker?.pid
                row.restarts = plugin.worker?.restarts
                rows.append(row)
            }
        }
        for file in snapshot.files {
            rows.append(ModuleRow(module: "-", plugin: file.plugin ?? "-", file: file.path, version: file.version ?? "-",
                                  state: file.state.rawValue, lastError: file.failure.description))
        }
        return rows
    }

    /// The modules running, as `list` counts them: not those stuck in a callback, nor those
    /// of an isolated plugin whose worker is down (crashed, restarting, quarantined).
    private func modulesRunning(_ snapshot: PluginSetSnapshot) -> Int {
        let down = downModules(snapshot)
        return host.registeredModulesSnapshot.count { $0.running && down[$0.name] == nil && stuck(module: $0.name) == nil }
    }

    /// The modules of isolated plugins whose worker is down, with that worker's status.
    private func downModules(_ snapshot: PluginSetSnapshot) -> [String: WorkerStatus] {
        let down = Dictionary(snapshot.plugins.compactMap { plugin in plugin.worker.flatMap { $0.phase != .running ? (plugin.name, $0) : nil } },
                              uniquingKeysWith: { first, _ in first })
        guard !down.isEmpty else { return [:] }
        return Dictionary(host.registeredModulesSnapshot.compactMap { module in down[module.plugin].map { (module.name, $0) } },
                          uniquingKeysWith: { first, _ in first })
    }

    /// A module's state in the one vocabulary (`ModuleRow.State`).
    static func state(of status: ModuleStatus, stuck: Bool) -> ModuleRow.State {
        stuck ? .stuck : status.running ? .running : status.enabled ? .stopped : .disabled
    }

    public func status() async -> DaemonStatus {
        let snapshot = await plugins.snapshot()
        return DaemonStatus(
            pid: getpid(), uptimeSeconds: Double((ContinuousClock.now - startTime).components.seconds), ready: ready,
            socketPath: socketPath, stateDirectory: stateDirectory, configPath: configurationFile,
            pluginDirectories: directories, pluginsLoaded: snapshot.plugins.count, modulesRunning: modulesRunning(snapshot),
            filesRefused: snapshot.filesRefused, retiredGenerations: snapshot.retiredGenerations, retiredBytes: snapshot.retiredBytes,
            crashGuarded: crashGuard.count, reloads: reloads)
    }

    /// Answered from counters (the host's, the plugin set's and the plugin set's snapshot):
    /// never waits for a module, a call or a reload in progress.
    public func metrics() async -> MetricsReport {
        let snapshot = await plugins.snapshot()
        let changes = plugins.metrics.changeTotals
        let privateImages = plugins.privateImages()
        let daemon = MetricsReport.Daemon(
            pluginsLoaded: snapshot.plugins.count, modulesRunning: modulesRunning(snapshot),
            filesRefused: snapshot.filesRefused, pluginsAdded: changes.added, pluginsReplaced: changes.replaced,
            pluginsRemoved: changes.removed, refusals: changes.refused, reloads: reloads,
            imagesMapped: snapshot.plugins.count(where: { $0.worker == nil }) + snapshot.retiredGenerations,
            imagesMappedBytes: snapshot.loadedBytes &+ snapshot.retiredBytes,
            imagesRetired: snapshot.retiredGenerations, imagesRetiredBytes: snapshot.retiredBytes,
            imagesPrivate: privateImages.count, imagesPrivateBytes: privateImages.bytes,
            residentBytes: ProcessMemory.residentBytes() ?? 0, mappings: ProcessMemory.mappings() ?? 0,
            uptimeSeconds: ((ContinuousClock.now - startTime).seconds * 1000).rounded() / 1000, startTimeSeconds: startedAt,
            build: ["release": HostSDK.release, "abi": "\(HostSDK.abiMajor).\(HostSDK.abiMinor)",
                    "modulekit": HostSDK.current.moduleKit, "swift": HostSDK.current.compilerVersion])
        let hostMetrics = host.metrics.snapshot()
        let calls = plugins.metrics.callSnapshot().map { call in
            MetricsReport.Function(plugin: call.plugin, function: call.function, calls: call.calls,
                                   seconds: MetricsReport.Histogram(call.duration),
                                   deadlineOverruns: call.deadlineOverruns, errors: call.errors)
        }
        let workers = snapshot.plugins.compactMap { plugin in
            plugin.worker.map {
                // Counters go on across the plugin's versions (docs/daemon.md, "Metrics").
                let totals = plugins.metrics.workerTotals(plugin: plugin.name, current: $0)
                return MetricsReport.Worker(plugin: plugin.name, restarts: UInt64(totals.restarts), crashes: UInt64(totals.crashes),
                                            residentBytes: $0.residentBytes, droppedNotifications: totals.droppedNotifications,
                                            droppedLogLines: totals.droppedLogLines, phase: $0.phase.rawValue)
            }
        }
        return MetricsReport(daemon: daemon, modules: hostMetrics.modules.map(MetricsReport.Module.init),
                             events: hostMetrics.eventDeliveries.map { .init(event: $0.event, deliveries: $0.deliveries) },
                             calls: calls, workers: workers)
    }

    public func setEnabled(_ enabled: Bool, module: String) async throws(DaemonError) {
        try await untilReadyWithinRequestDeadline()
        let plugins = plugins
        let outcome = try await withinRequestDeadline("\(enabled ? "enable" : "disable") \(module)") {
            () async -> Result<Void, UnknownModule> in
            do throws(UnknownModule) {
                try await plugins.setEnabled(enabled, module: module)
                return .success(())
            } catch {
                return .failure(error)
            }
        }
        if case .failure(let unknown) = outcome {
            throw DaemonError(.unknownModule, "no module named \(module) is registered; known: \(unknown.known.joined(separator: ", "))")
        }
        logger.info("module \(module) \(enabled ? "enabled" : "disabled")", [("module", module)])
    }

    public func reload() async throws(DaemonError) -> ReloadSummary {
        await untilReady()
        notify { try $0.reloading(status: "reloading") }
        defer { notify { try $0.ready(status: "reloaded") } }
        // The file a start would read now: a default file created since is read, and one
        // deleted since leaves the defaults and the command line, as at a start without it.
        let fresh: (configuration: DaemonConfiguration, file: String?)
        do {
            fresh = try DaemonConfiguration.read(for: options)
        } catch {
            logger.error("reload: \(error.message); keeping the running configuration")
            throw error
        }
        guard !fresh.configuration.pluginDirectories.isEmpty else {
            logger.error("reload: \(DaemonConfiguration.noPluginDirectory); keeping the running configuration")
            throw DaemonError(.invalidConfiguration, DaemonConfiguration.noPluginDirectory)
        }
        if let file = fresh.file, file != configurationFile {
            logger.info("reload: reading the configuration file \(file)")
        } else if fresh.file == nil, let gone = configurationFile {
            logger.warning("reload: the configuration file \(gone) is gone; using the defaults and the command line")
        }
        configurationFile = fresh.file
        let configurationChanged = fresh.configuration != configuration
        if configurationChanged { await applyConfiguration(fresh.configuration) }
        // A reload tries every refused file again: what it lacked may be there now.
        let changes = await plugins.reconcile(retryingRefused: true)
        // Every file not loaded now, whether this scan or an earlier one tried it.
        let files = await plugins.filesNotLoaded()
        let summary = ReloadSummary(configurationChanged: configurationChanged, added: changes.added,
                                    replaced: changes.replaced, removed: changes.removed, refused: files[.refused] ?? [],
                                    waitingForDependency: files[.waitingForDependency] ?? [], quarantined: files[.quarantined] ?? [])
        reloads += 1
        logger.info("reloaded: \(summary.added.count) added, \(summary.replaced.count) replaced, \(summary.removed.count) removed; "
                    + "\(summary.refused.count) refused, \(summary.waitingForDependency.count) waiting-for-dependency, \(summary.quarantined.count) quarantined",
                    [("configuration", configurationChanged ? "changed" : "unchanged")])
        // After the reply: executing again stops the control socket.
        Task { await renewIfNeeded() }
        return summary
    }

    func applyConfiguration(_ fresh: DaemonConfiguration) async {
        let old = configuration
        configuration = fresh
        owned.watchdog?.setBudget(fresh.shutdownBudget)
        LoggingSystem.setLevel(fresh.logLevel)
        await plugins.reconfigure(directories: fresh.pluginDirectories,
                                  validator: Validator(allowInsecure: options.allowInsecurePlugins || fresh.allowInsecurePlugins),
                                  isolation: Self.isolationPolicy(fresh, options),
                                  stopsPluginsWithUnsafeFiles: fresh.stopPluginsWithUnsafeFiles,
                                  settings: fresh.modules != old.modules ? fresh.modules : nil)
        for directory in fresh.pluginDirectories where !old.pluginDirectories.contains(directory) {
            if let watcher = owned.watcher { follow(directory, with: watcher) }
        }
        for directory in old.pluginDirectories where !fresh.pluginDirectories.contains(directory) {
            owned.watcher?.unwatch(directory)
        }
    }

    public func send(event: String, payload: JSONValue, to module: String?, awaited: Bool) async throws(DaemonError) {
        try checkSendable(event: event, to: module)
        try await untilReadyWithinRequestDeadline()
        if let module, !host.isRunning(moduleNamed: module) {
            throw DaemonError(.unknownModule, "no module named \(module) is running")
        }
        let started = ContinuousClock.now
        let targets = module.map { [$0] } ?? host.runningModuleNames
        let overrunsBefore = targets.map { host.metrics.module(named: $0).snapshot().deadlineOverruns }
        try await withinRequestDeadline("event \(event)") { [host] in
            if awaited {
                await host.send(AsyncModuleEvent.custom(name: event, payload: payload), to: module)
            } else {
                await host.send(ModuleEvent.custom(name: event, payload: payload), to: module)
            }
        }
        try checkNotStuck(in: event, to: module, since: started)
        // A Swift module's handler past the event deadline: an awaited one the host gave up
        // on (cancelled; the module runs on), or a synchronous one the host waited for.
        let overran = zip(targets, overrunsBefore).filter { host.metrics.module(named: $0.0).snapshot().deadlineOverruns > $0.1 }.map(\.0)
        if !overran.isEmpty {
            throw DaemonError(.deadlineExceeded,
                              "\(overran.count == 1 ? "module" : "modules") \(overran.joined(separator: ", ")) did not finish event \(event) within the event deadline of \(configuration.eventDeadline.secondsText); "
                                + (awaited ? "its handler was cancelled and the module runs on"
                                           : "a synchronous handler cannot be interrupted: the host waited for it, and so did every other event"))
        }
        logger.info("event \(event) sent\(module.map { " to \($0)" } ?? "")", [("event", event)])
    }

    public func post(notification: String, payload: JSONValue) async throws(DaemonError) -> [String] {
        try checkSendable(event: notification, to: nil)
        try await untilReadyWithinRequestDeadline()
        let started = ContinuousClock.now
        let (listeners, stuckBefore, overrunsBefore) = try await withinRequestDeadline("notification \(notification)") { [host, workers] in
            await host.perform { host -> ([String], [String: PluginWorker.Stuck], [UInt64]) in
                let listeners = host.moduleManager.modules.filter { $0.notifications.contains(notification) }.map(\.moduleName)
                // A listener stuck in a callback now is not given the notification.
                let stuck = Dictionary(uniqueKeysWithValues: listeners.compactMap { name in Self.stuck(module: name, workers: workers, host: host).map { (name, $0) } })
                let overruns = listeners.map { host.metrics.module(named: $0).snapshot().deadlineOverruns }
                host.post(notification: notification, payload: payload)
                return (listeners, stuck, overruns)
            }
        }
        let overrunsNow = Dictionary(uniqueKeysWithValues: zip(listeners, overrunsBefore))
        let delivery = PostDelivery(notification: notification, listeners: listeners, stuckBefore: stuckBefore,
                                    // C modules only: a Swift listener's handler has returned once the post has.
                                    stuckAfter: { [workers] in workers.stuck(module: $0) },
                                    unanswered: { [workers] in workers.leftUnanswered(module: $0, event: notification, since: started) },
                                    // A Swift listener's synchronous handler found past the deadline before it returned.
                                    overranAndReturned: { [host] in host.metrics.module(named: $0).snapshot().deadlineOverruns > overrunsNow[$0] ?? .max })
        if let error = delivery.error(eventDeadline: configuration.eventDeadline) {
            logger.warning("notification \(notification): \(error.message)", [("notification", notification)])
            throw error
        }
        logger.info("notification \(notification) posted to \(delivery.reached.count) listening \(delivery.reached.count == 1 ? "module" : "modules")", [("notification", notification)])
        return delivery.reached
    }

    public func call(plugin: String, function: String, arguments: CallArguments) async throws(DaemonError) -> CallValue {
        try await untilReadyWithinRequestDeadline()
        guard let loaded = await plugins.plugin(named: plugin) else {
            let names = await plugins.snapshot().plugins.map(\.name)
            throw DaemonError(.unknownPlugin, "no plugin named \(plugin) is loaded; loaded: \(names.joined(separator: ", "))")
        }
        // A plugin whose modules all stopped is not called (its functions may need them),
        // isolated or not.
        let modules = host.registeredModulesSnapshot.filter { $0.plugin == plugin }
        let states = modules.map { ($0.name, Self.state(of: $0, stuck: $0.running && stuck(module: $0.name) != nil)) }
        if !configuration.allowCallsWithoutRunningModule, !states.isEmpty, !states.contains(where: { $0.1 == .running || $0.1 == .stuck }) {
            let list = states.map { "\($0.0): \($0.1.rawValue)" }.joined(separator: ", ")
            throw DaemonError(.pluginNotRunning,
                              "plugin \(plugin) has no running module (\(list)). Fix: enable one (modhostctl enable \(states[0].0)), or set allowCallsWithoutRunningModule in the configuration to call it anyway")
        }
        if let isolated = loaded.isolated {
            // Counted like an in-process call: under its name when the manifest declares it.
            let counters = plugins.metrics.calls(plugin: plugin).function(
                named: loaded.file.manifest.exports.contains { $0.name == function } ? function : CallMetrics.undeclaredFunction)
            // In its worker, within the request deadline; a crash there fails only this call.
            let deadline = configuration.requestDeadline
            let outcome: Result<CallValue, PluginSetError>
            do throws(DaemonError) {
                // The call keeps the request deadline itself, and tells a call that overran
                // from one that never started; a worker that ended is waited for 2 s at most
                // to say how.
                outcome = try await withinRequestDeadline("call \(plugin).\(function)",
                                                          meanwhile: "in its worker; the plugin gets no new call until it returns",
                                                          grace: .milliseconds(2500)) {
                    () async -> Result<CallValue, PluginSetError> in
                    let clock = ContinuousClock()
                    let started = clock.now
                    do throws(PluginSetError) {
                        let value: CallValue
                        switch arguments {
                        case .texts(let texts): value = try await isolated.call(function, texts: texts, deadline: deadline)
                        case .json(let values): value = try await isolated.call(function, json: values, deadline: deadline)
                        }
                        counters.recordCall(duration: clock.now - started, error: nil)
                        return .success(value)
                    } catch {
                        counters.recordCall(duration: clock.now - started, error: error.code.rawValue)
                        return .failure(error)
                    }
                }
            } catch {
                if error.code == .deadlineExceeded { overran(plugin, function, counters) }
                throw error
            }
            switch outcome {
            case .success(let value): return value
            case .failure(let error):
                // The call's own deadline (the same) passed before the race's.
                if error.code == .deadlineExceeded { overran(plugin, function, counters) }
                throw DaemonError(error)
            }
        }
        guard let table = loaded.functions else {
            throw DaemonError(.unknownFunction, "plugin \(plugin) exports no functions for calling by name")
        }
        // Off this actor, on the plugin's call worker, within the request deadline.
        let outcome = try await callOffActor(plugin: plugin, function: function, counters: table.callMetrics(for: function)) {
            () throws(CallError) -> CallValue in
            switch arguments {
            case .texts(let texts): return try table.call(function, texts: texts)
            case .json(let values): return try table.call(function, json: values)
            }
        }
        do {
            return try outcome.get()
        } catch {
            throw DaemonError(error)
        }
    }

    /// The modules' Info payloads come from module code (a Swift module's `info`), so they
    /// are asked for within the request deadline.
    public func infoPayload() async throws(DaemonError) -> JSONValue {
        try await withinRequestDeadline("info") { [host] in await host.infoPayload() }
    }
}

extension DaemonOptions {
    /// The configuration file a start or a reload reads now: `--config`'s (which must
    /// exist), else the default file when it exists; nil for none.
    public var configurationFileToRead: String? {
        guard let path = configPath, configPathExplicit || FileSystem.exists(path) else { return nil }
        return path
    }
}

extension DaemonConfiguration {
    /// What `options` configure now: the file `configurationFileToRead` names, else the
    /// defaults, with the command line applied on top; and that file (nil for none).
    public static func read(for options: DaemonOptions) throws(DaemonError) -> (configuration: DaemonConfiguration, file: String?) {
        guard let file = options.configurationFileToRead else { return (DaemonConfiguration().merged(with: options), nil) }
        return (try load(file).merged(with: options), file)
    }

    /// Why a configuration without a plugin directory cannot run.
    public static let noPluginDirectory = "no plugin directory: pass --plugins DIR or list \"pluginDirectories\" in the configuration file"

    /// This configuration with the command line's options applied on top.
    public func merged(with options: DaemonOptions) -> DaemonConfiguration {
        var merged = self
        for directory in options.pluginDirectories where !merged.pluginDirectories.contains(directory) {
            merged.pluginDirectories.append(directory)
        }
        if let level = options.logLevel { merged.logLevel = level }
        if let format = options.logFormat { merged.logFormat = format }
        if let deadline = options.eventDeadline { merged.eventDeadline = deadline }
        if let deadline = options.requestDeadline { merged.requestDeadline = deadline }
        if let budget = options.shutdownBudget { merged.shutdownBudget = budget }
        if options.allowInsecurePlugins { merged.allowInsecurePlugins = true }
        return merged
    }
}
