import CDynamicLoader
import DaemonKit
import Glibc
import ModuleKit
import PluginCall
import PluginFormat
import Synchronization

/// A running set of plugins, loaded into this process from plugin directories and kept in
/// line with them: the plugin lifecycle without a daemon around it (no signals, sockets,
/// configuration files or systemd). `modhostd` is a shell over one; a Swift service embeds
/// one to follow a plugin directory of its own.
///
/// What it owns: scanning the directories (`reconcile`), adding, replacing and removing
/// plugins, the private copies they are loaded from (sealed memory files for the plugins
/// mapped in this process, files in `imagesDirectory` for isolated ones; one name per
/// generation so that glibc never returns an old image for a new version), the trial
/// loads, the crash guard's records around every step that runs plugin code, enabling and
/// disabling modules, and a snapshot of all of it (`snapshot()`).
///
/// Guarantees:
/// - **Threading.** An actor: every method may be called from any task. Changes to the
///   set (`reconcile`, `start`, `updateSettings`, `setEnabled`, `reconfigure`,
///   `shutdown`, every `set...` method) run one at a time, in the order they were
///   called, each after the previous one has finished, so a rescan and a settings
///   change never interleave halfway. Reads (`snapshot`, `plugin(named:)`) never wait
///   for a whole change, a trial load or a module's callbacks, only for the step on
///   this actor in progress (reading or copying one file, one `dlopen` and the plugin's
///   entry point); `isStopping` and `stopChanges` never wait.
/// - **Order.** New plugins load in dependency order; a removal stops the plugins that
///   depend on the removed one first (in reverse load order); a replacement reloads its
///   dependents against the new version in the same update.
/// - **Failures.** A refused file is logged once (at error level, naming the file, the
///   check and the fix), shown in `snapshot()` and not tried again until it changes
///   (unless its refusal depends on other files: a missing dependency, a name another file
///   holds, which are tried again at every `reconcile`); it never stops the other files.
///   A replacement that fails leaves the old version running.
/// - **Logging.** One line per load, refusal, replacement and removal, on `logger`, with
///   `plugin`, `file` and `module` keys where they apply.
///
/// No plugin image is unloaded (a process has one Swift runtime, which keeps a Swift
/// image's types; C images are linked `-z nodelete` and may still run a stuck callback), so
/// a removed or replaced version stays mapped: `snapshot()` counts them. Its memory file
/// stays open (one descriptor per version for as long as the process runs, so that no
/// later image gets its path); its copy on disk is deleted: `imagesDirectory` holds one
/// file per loaded isolated plugin, and the first `reconcile` deletes the copies an earlier
/// run left there (so give each set a directory of its own).
///
/// The process binds a plugin's dependencies by SONAME: two sets in one process must not
/// load plugins of the same name at the same time. One set made after another was shut
/// down may load the same plugins: the names of the images are counted for the process,
/// so its dependents bind to its own images.
public actor PluginSet {
    /// The host instance the plugins' modules run in.
    public nonisolated let host: HostInstance
    /// Every module type of the loaded plugins, by name.
    public nonisolated let registry: ModuleRegistry
    /// Where the C modules' callbacks and calls by name run.
    public nonisolated let workers: PluginWorkers
    /// Calls by name and the changes of every `reconcile`, counted (the modules' counters
    /// are `host.metrics`).
    public nonisolated let metrics = PluginSetMetrics()
    nonisolated let crashGuard: CrashGuard
    /// The workers it started, recorded in the crash guard's (state) directory, so that
    /// its next start ends what a killed run's workers left.
    nonisolated let workerRecords: WorkerRecords
    nonisolated let imagesDirectory: String
    nonisolated let trialLoader: (any TrialLoader)?
    /// Where its files and their code come from: the plugin directories and `dlopen`
    /// (`DirectoryPluginSource`), unless a test gives another.
    nonisolated let pluginSource: any PluginSource
    nonisolated let logger: Logger
    /// The state directory's lock, held while this set exists, until `shutdown()` returns
    /// (`init(stateDirectory:)`).
    nonisolated let stateLock: ExclusiveLock?
    var validator: Validator
    /// The plugin directories, scanned in this order.
    public private(set) var directories: [String]
    /// The module settings given (`init`, `updateSettings`), before `setEnabled`'s overrides.
    var settings: [String: ModuleSettings]
    /// `setEnabled` on top of `settings`.
    var enabledOverrides: [String: Bool] = [:]
    /// Which plugins run in a worker process (docs/isolation.md).
    public private(set) var isolationPolicy: IsolationPolicy
    let changes = SerialQueue()

    /// A loaded plugin and where it came from.
    struct Record {
        var source: String
        var identity: FileIdentity
        var hash: String
        var loaded: LoadedPlugin
        var generation: Int
        /// The SONAME its current image has (generation names differ from the original).
        var soname: String
        var originalSoname: String
        var size: Int64
    }
    var records: [String: Record] = [:]
    /// Files refused, by path, with the identity they had: not tried again until they change
    /// (except when they only waited for a dependency).
    var refused: [String: (failure: LoadFailure, identity: FileIdentity?)] = [:]
    /// Refused files that only wait for a dependency that may still be arriving.
    var waiting: Set<String> = []
    /// The plugin name and version read from each file's manifest by the last scan that read
    /// it, by path: what a refused file's row shows.
    var manifestsRead: [String: (name: String, version: String)] = [:]
    /// `setStopsPluginsWithUnsafeFiles`.
    var stopsPluginsWithUnsafeFiles = false
    /// Refused files whose plugin or module name another file held when the scan checked
    /// the names (before any copy or dlopen): tried again at every scan.
    var nameClashes: Set<String> = []
    /// Files being loaded by the reconcile in progress.
    var loading: Set<String> = []
    var retiredCount = 0
    var retiredBytes: Int64 = 0
    var generations: [String: Int] = [:]
    /// The highest name generation (`DynamicStringPatch.generationName`) of each plugin
    /// that this process has mapped, from the moment its image is opened here, by any plugin
    /// set: glibc binds a dependency by name to whichever image of that name the process
    /// loaded first, so a set made after another was shut down must not reuse its names.
    /// Only in-process loads use one up: an isolated plugin's image is mapped in its
    /// worker, a process of its own, and keeps its original name, so it can be replaced
    /// without limit.
    static let namesMapped = Mutex<[String: Int]>([:])
    /// Records that the image of `plugin` with name generation `generation` is mapped here,
    /// from `image`.
    func mapped(_ plugin: String, nameGeneration generation: Int, image: PluginFile) {
        Self.namesMapped.withLock { $0[plugin] = max($0[plugin] ?? 0, generation) }
        if memoryImages[image.resolvedPath] != nil { openedMemoryImages.insert(image.resolvedPath) }
    }
    /// The images made as memory files, by path (`/proc/PID/fd/N`), with their descriptors.
    var memoryImages: [String: Int32] = [:]
    /// Of them, those this process has opened: their descriptors stay open for as long as
    /// it runs, so that no later image gets their paths.
    var openedMemoryImages: Set<String> = []
    /// The memory images held, and those of them opened here (the rest are refused ones
    /// not closed yet: none, once a change is over).
    package var memoryImagesHeld: (held: Set<String>, opened: Set<String>) { (Set(memoryImages.keys), openedMemoryImages) }
    /// How many images may be memory files: half the descriptors the process may open (the
    /// soft RLIMIT_NOFILE, which modhostd raises), the other half left to everything else;
    /// none when the process is not dumpable, as trial loads and workers, other processes,
    /// open them by `/proc/PID/fd/N`. Past it, images are copies on disk.
    let memoryImageBudget: Int = {
        guard modhost_process_is_dumpable() == 1 else { return 0 }
        var limit = rlimit()
        guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 0 }
        return Int(clamping: limit.rlim_cur / 2)
    }()
    /// The most name generations of one plugin this process can tell apart (lowered by tests).
    var nameGenerationLimit = DynamicStringPatch.maximumGeneration
    func setNameGenerationLimit(_ limit: Int) { nameGenerationLimit = min(limit, DynamicStringPatch.maximumGeneration) }
    /// Whether the first scan has deleted what an earlier run left in `imagesDirectory`.
    var imagesSwept = false
    /// The plugin whose modules are being created and initialized, or started, now (by a
    /// startup, reload or replace), in which phase and since when.
    private nonisolated let work = Mutex<(plugin: String, phase: String, since: ContinuousClock.Instant)?>(nil)

    /// "plugin X (in init for N s)" while plugin X's modules are being created and
    /// initialized ("start": started), nil otherwise: what a startup or reload is waiting
    /// for when no module is stuck yet (a `create` still within the event deadline). Any thread.
    package nonisolated var workInProgress: String? {
        work.withLock { work in work.map { "plugin \($0.plugin) (in \($0.phase) for \((ContinuousClock.now - $0.since).secondsText))" } }
    }

    /// Marks the `phase` ("init" or "start") of plugin `plugin`'s modules as the work in
    /// progress until `endWork()`, with the crash guard's in-flight record when its code runs
    /// in this process (`inThisProcess`; an isolated plugin's runs in its worker).
    nonisolated func beginWork(plugin: String, file: String, hash: String, phase: String, inThisProcess: Bool) {
        work.withLock { $0 = (plugin, phase, .now) }
        if inThisProcess { crashGuard.begin(file: file, plugin: plugin, hash: hash, phase: phase) }
    }

    /// Ends what `beginWork` marked.
    nonisolated func endWork() {
        crashGuard.end()
        work.withLock { $0 = nil }
    }

    /// Set by `stopChanges()` or `shutdown()`: no further plugin is loaded, replaced or
    /// started. Atomic, so that a signal handler's task sets it without waiting for this
    /// actor (which a plugin's entry point may hold).
    nonisolated let stopFlag = Atomic<Bool>(false)
    nonisolated var stopRequested: Bool { stopFlag.load(ordering: .sequentiallyConsistent) }

    /// A plugin set that loads nothing until `reconcile` is called.
    ///
    /// - `host`: where the modules run; created with `settings`.
    /// - `directories`: the plugin directories (`setDirectories` changes them).
    /// - `imagesDirectory`: where the private copies on disk are written. It must exist and be
    ///   private to this process's user (`modhostd` checks its state directory's `images`
    ///   with `RuntimePaths.checkPrivateDirectory`): whoever can write there can replace code
    ///   this process loads.
    /// - `crashGuard`: records which file is being worked on, and refuses files that
    ///   crashed the process before.
    /// - `trialLoader`: loads a new plugin somewhere the process does not depend on before
    ///   it is loaded here (`ProcessTrialLoader`: a child process); nil loads new plugins
    ///   directly, so one that crashes while loading takes this process with it.
    /// - `isolation`: which plugins run in a worker process of their own, supervised
    ///   (docs/isolation.md); by default all run in this process.
    /// - `logger`: where every load, refusal, replacement and removal is logged.
    public init(host: HostInstance, settings: [String: ModuleSettings] = [:], directories: [String],
                imagesDirectory: String, crashGuard: CrashGuard, validator: Validator = Validator(),
                registry: ModuleRegistry = ModuleRegistry(), workers: PluginWorkers = PluginWorkers(),
                trialLoader: (any TrialLoader)? = ProcessTrialLoader(), isolation: IsolationPolicy = IsolationPolicy(),
                logger: Logger = Logger(label: "plugins")) {
        self.init(host: host, settings: settings, directories: directories, imagesDirectory: imagesDirectory,
                  crashGuard: crashGuard, validator: validator, registry: registry, workers: workers,
                  trialLoader: trialLoader, isolation: isolation, logger: logger, stateLock: nil)
    }

    init(host: HostInstance, settings: [String: ModuleSettings], directories: [String], imagesDirectory: String,
         crashGuard: CrashGuard, validator: Validator, registry: ModuleRegistry, workers: PluginWorkers,
         trialLoader: (any TrialLoader)?, isolation: IsolationPolicy = IsolationPolicy(), logger: Logger, stateLock: ExclusiveLock?,
         pluginSource: any PluginSource = DirectoryPluginSource()) {
        self.stateLock = stateLock
        self.pluginSource = pluginSource
        self.isolationPolicy = isolation
        self.host = host
        self.settings = settings
        self.directories = directories
        self.imagesDirectory = imagesDirectory
        self.crashGuard = crashGuard
        workerRecords = WorkerRecords(stateDirectory: crashGuard.directory, logger: logger)
        self.validator = validator
        self.registry = registry
        self.workers = workers
        self.trialLoader = trialLoader
        self.logger = logger
    }

    /// A plugin set that keeps its state in `stateDirectory` as `modhostd` keeps its own: for
    /// a process that embeds one (docs/embedding.md). Before anything is read or written
    /// there:
    /// - the directory and its `images` (the private copies this process loads) are checked
    ///   by `checkStateDirectory`: created with mode 0700 when missing, refused when someone
    ///   else could write to them;
    /// - the directory is locked (`modhostd.lock`, an exclusive `flock` holding this pid) for
    ///   as long as the set exists and until its `shutdown()` has returned: another process,
    ///   an embedder or a `modhostd`, cannot use the same state directory (`already_running`);
    /// - the crash guard is opened there, and what the previous run of this process left is
    ///   read: a plugin that crashed it while it was loaded, initialized or started is
    ///   logged (error level, on `logger`) and its file refused until it changes.
    ///
    /// Throws `PluginSetError` with code `.stateDirectory` or `.alreadyRunning`, a message
    /// naming the directory, what is wrong and the fix; nothing is loaded or run then.
    /// Loads nothing until `reconcile` is called; the other arguments are those of
    /// `init(host:settings:directories:imagesDirectory:crashGuard:...)`.
    public init(host: HostInstance, settings: [String: ModuleSettings] = [:], directories: [String],
                stateDirectory: String, validator: Validator = Validator(),
                trialLoader: (any TrialLoader)? = ProcessTrialLoader(), logger: Logger = Logger(label: "plugins")) throws(PluginSetError) {
        try Self.checkStateDirectory(stateDirectory)
        let lock: ExclusiveLock
        do {
            lock = try ExclusiveLock(path: stateDirectory + "/modhostd.lock", lockingDirectory: true)
        } catch .held(_, let pid) {
            throw PluginSetError(.alreadyRunning, pid == getpid()
                ? "another plugin set in this process is using the state directory \(stateDirectory). Fix: shut it down first, or give this one its own state directory"
                : "another process\(pid.map { " (pid \($0))" } ?? "") is using the state directory \(stateDirectory). Fix: stop it, or give this one its own state directory")
        } catch {
            throw PluginSetError(.stateDirectory, "cannot lock the state directory \(stateDirectory): \(error)")
        }
        let crashGuard = try CrashGuard(directory: stateDirectory)
        crashGuard.recoverFromPreviousRun(logging: logger)
        self.init(host: host, settings: settings, directories: directories, imagesDirectory: stateDirectory + "/images",
                  crashGuard: crashGuard, validator: validator, registry: ModuleRegistry(), workers: PluginWorkers(),
                  trialLoader: trialLoader, logger: logger, stateLock: lock)
    }

    /// Checks, before anything is read or written there, that nobody else can change the
    /// state directory `directory` or its `images` (the private plugin copies a plugin set
    /// loads): each must be a real directory (not a symlink) of this process's user that
    /// group and others cannot write, and `directory` must not lie in another state
    /// directory's `images` (beside a `modhostd.lock`). Missing ones are created with
    /// mode 0700 (parents as needed); existing ones are never changed. Throws
    /// `.stateDirectory` naming the directory, what is wrong and the fix (`alternative`:
    /// how to use another directory).
    public static func checkStateDirectory(_ directory: String, alternative: String = "use another state directory")
        throws(PluginSetError) {
        // Not inside another daemon's private copies (STATE/images): that daemon would count
        // this one's files as its own and delete them as leftovers at its next start. The
        // path as the system would resolve it: its deepest existing ancestor resolved (links,
        // `..`), the rest as given.
        var existing = directory, rest: [String] = []
        var resolved = directory
        while true {
            if let real = realPath(existing) {
                resolved = rest.reversed().reduce(real) { $0 == "/" ? "/" + $1 : $0 + "/" + $1 }
                break
            }
            let up = PathText.parent(of: existing)
            if up == existing { break }
            rest.append(PathText.lastComponent(of: existing))
            existing = up
        }
        var ancestor = resolved
        while true {
            var lock = stat()
            let owner = PathText.parent(of: ancestor)
            if PathText.lastComponent(of: ancestor) == "images", lstat(owner + "/modhostd.lock", &lock) == 0 {
                throw PluginSetError(.stateDirectory, "the state directory \(directory) lies in \(ancestor), the private plugin copies of the modhostd whose state directory is \(owner) (it takes what it finds there for copies of its own). Fix: \(alternative), outside it")
            }
            if owner == ancestor { break }
            ancestor = owner
        }
        try? FileSystem.createDirectory(PathText.parent(of: directory), parents: true)
        let checked = [
            (directory, "the state directory \(directory)"),
            (directory + "/images", "the private copies' directory \(directory)/images in the state directory"),
        ]
        for (path, what) in checked {
            do {
                try RuntimePaths.checkPrivateDirectory(path, create: true, allowingRead: true)
            } catch .notPrivate(_, let problem) {
                throw PluginSetError(.stateDirectory, "\(what) is unsafe: \(problem). Fix: make it a directory (not a symlink) of uid \(geteuid()) that group and others cannot write (chown \(geteuid()) \(path); chmod 700 \(path)), or \(alternative)")
            } catch {
                throw PluginSetError(.stateDirectory, "cannot create \(what): \(error). Fix: create it or \(alternative)")
            }
        }
    }

    // MARK: - Changes

    /// Brings the loaded plugins in line with the plugin directories (see
    /// `PluginSetChanges.swift`): new files are loaded (after a trial load when `trial` and
    /// a trial loader is set), changed files replace their plugin, vanished files remove
    /// it. A file counts as changed when its contents, mode or owner, or its directory's
    /// mode or owner, changed. `retryingRefused` also tries every refused file again (what
    /// it lacked, e.g. a library it needs, may be there now). Returns what it changed. Runs
    /// after every change called before it; after `stopChanges()` it changes nothing.
    @discardableResult
    public func reconcile(trial: Bool = true, retryingRefused: Bool = false) async -> PluginChanges {
        let summary = await changes.run { await self.reconcileNow(trial: trial, retryingRefused: retryingRefused) }
        metrics.count(summary)
        return summary
    }

    /// Whether a loaded plugin whose file becomes unsafe (the validator's permissions
    /// check: writable by group or others, owned by another user, in such a directory) is
    /// removed; otherwise it keeps running, the file shows the refusal as the plugin's
    /// `lastError` and one warning is logged. From the next `reconcile` on.
    public func setStopsPluginsWithUnsafeFiles(_ stop: Bool) async {
        await changes.run { await self.inside { $0.stopsPluginsWithUnsafeFiles = stop } }
    }

    /// Sends `.start` to every module (call it once, after the first `reconcile`): each
    /// inside a crash-guard record naming its plugin, so that a plugin that kills the
    /// process in its start is refused at the next start. Modules added afterwards are
    /// started as they are added. Does nothing after `stopChanges()`.
    public func start() async {
        await changes.run { await self.startModules() }
    }

    /// Replaces the module settings (the `enabled` overrides of `setEnabled` stay on top);
    /// the host applies only what changed (docs/modules.md, ModuleSettings).
    public func updateSettings(_ settings: [String: ModuleSettings]) async {
        await changes.run {
            await self.inside { $0.settings = settings }
            await self.applySettings()
        }
    }

    /// Enables or disables module `module` from now on, over what the settings say, until
    /// this set ends. Throws, changing nothing, when no loaded plugin provides it.
    /// Enabling a module of a quarantined isolated plugin lets the plugin run again.
    public func setEnabled(_ enabled: Bool, module: String) async throws(UnknownModule) {
        let found = await changes.run { () async -> Result<Void, UnknownModule> in
            // Looked up in the change's turn: a change before it may have removed the module.
            let plugin: String
            do throws(UnknownModule) {
                plugin = try self.registry.factory(named: module).plugin
            } catch {
                return .failure(error)
            }
            await self.enable(enabled, module: module, of: plugin)
            await self.applySettings()
            return .success(())
        }
        try found.get()
    }

    /// From now on no plugin is loaded, replaced, removed or started; the plugin being
    /// loaded finishes. For a process that is about to stop. Never waits.
    public nonisolated func stopChanges() {
        stopFlag.store(true, ordering: .sequentiallyConsistent)
    }

    /// Whether `stopChanges()` or `shutdown()` was called. Never waits.
    public nonisolated var isStopping: Bool { stopRequested }

    /// Stops changes (`stopChanges`), waits for the change in progress, then shuts the host
    /// down: every module gets willTerminate (awaited) and deinit, in reverse order.
    /// Then every isolated plugin's worker ends. A worker that ends before (e.g. killed for
    /// not answering willTerminate) is not restarted. Last, a set made on a state
    /// directory (`init(stateDirectory:)`) releases its lock: another set may use it.
    public func shutdown() async {
        stopChanges()
        await changes.run {
            await self.endWorkerRestarts()
            await self.host.shutdown()
            await self.stopWorkers()
        }
        stateLock?.release()
    }

    /// For a process that takes this one's place (a daemon that executes itself again):
    /// stops changes (`stopChanges`), waits for the change in progress, then every running
    /// module, in process or isolated, gets willUnload and hands its state over, as in a
    /// replace, and is deinitialized (`HostInstance.unloadAll`). Returns the states by
    /// module name, for `HostInstance.restoreOnCreation` there. `shutdown()` ends the
    /// workers afterwards.
    public func unloadForSuccessor() async -> [String: JSONValue] {
        stopChanges()
        return await changes.run {
            await self.endWorkerRestarts()
            return await self.host.unloadAll()
        }
    }

    func endWorkerRestarts() {
        for record in records.values { record.loaded.isolated?.endRestarts() }
    }

    /// Stops every worker and waits, 2 s at most, until each has been reaped: how it ended
    /// is logged and its record removed (`WorkerRecords`) before the host process exits. A
    /// stopped worker ends at once (its closed sockets make it kill its own group), or is
    /// killed a second later.
    func stopWorkers() async {
        let stopped = records.values.compactMap { $0.loaded.isolated?.stop() }
        let until = ContinuousClock.now + .seconds(2)
        for connection in stopped { _ = await connection.ending(within: max(until - .now, .zero)) }
    }

    /// Which plugins run in a worker process, from the next load or replacement of each
    /// plugin on (a plugin already running keeps its isolation until then).
    public func setIsolation(_ policy: IsolationPolicy) async {
        await changes.run { await self.inside { $0.isolationPolicy = policy } }
    }

    /// The plugin directories from the next `reconcile` on; a plugin of a directory no
    /// longer listed is removed then.
    public func setDirectories(_ directories: [String]) async {
        await changes.run { await self.inside { $0.directories = directories } }
    }

    /// The checks for files from the next `reconcile` on (e.g. `allowInsecure`).
    public func setValidator(_ validator: Validator) async {
        await changes.run { await self.inside { $0.validator = validator } }
    }

    /// Changes the directories, the checks for files, the isolation policy, whether unsafe
    /// files stop their plugins and (when given) the module settings, all in one change: no
    /// reconcile runs with some of them new and others old. As the setters of each, from
    /// the next `reconcile` on (the settings at once).
    public func reconfigure(directories: [String], validator: Validator, isolation: IsolationPolicy,
                            stopsPluginsWithUnsafeFiles: Bool, settings: [String: ModuleSettings]? = nil) async {
        await changes.run {
            await self.inside { set in
                set.directories = directories
                set.validator = validator
                set.isolationPolicy = isolation
                set.stopsPluginsWithUnsafeFiles = stopsPluginsWithUnsafeFiles
                if let settings { set.settings = settings }
            }
            if settings != nil { await self.applySettings() }
        }
    }

    /// Runs `change` on this actor; called inside the serial change queue.
    private func inside(_ change: @Sendable (isolated PluginSet) -> Void) {
        change(self)
    }

    /// `setEnabled`'s change, inside the serial change queue.
    private func enable(_ enabled: Bool, module: String, of plugin: String) {
        if enabled { records[plugin]?.loaded.isolated?.release() }
        enabledOverrides[module] = enabled
    }

    func applySettings() async {
        var merged = settings
        for (name, enabled) in enabledOverrides { merged[name, default: ModuleSettings()].enabled = enabled }
        await host.updateSettings(merged)
    }

    func startModules() async {
        if stopRequested { return }
        let origins = records.mapValues { (file: $0.source, hash: $0.hash, inThisProcess: $0.loaded.isolated == nil) }
        await host.start { [self] plugin, deliver in
            guard let origin = origins[plugin] else { return deliver() }
            beginWork(plugin: plugin, file: origin.file, hash: origin.hash, phase: "start", inThisProcess: origin.inThisProcess)
            deliver()
            endWork()
        }
    }

    // MARK: - Reading

    /// The state of a file in `refused` (a loaded plugin's file whose newer content was
    /// refused counts by that content).
    func state(ofRefused path: String, countingLoading: Bool = true) -> PluginSetSnapshot.FileState {
        if countingLoading && loading.contains(path) { return .loading }
        guard let failure = refused[path]?.failure else { return .refused }
        if waiting.contains(path) || failure.check == .dependency { return .waitingForDependency }
        return failure.check == .crashGuard ? .quarantined : .refused
    }

    /// Every file whose current content is not loaded, by state, in path order.
    public func filesNotLoaded() -> [PluginSetSnapshot.FileState: [String]] {
        var result: [PluginSetSnapshot.FileState: [String]] = [:]
        for path in refused.keys.sorted() { result[state(ofRefused: path), default: []].append(path) }
        return result
    }

    /// The plugin loaded under `name`, nil when none is.
    public func plugin(named name: String) -> LoadedPlugin? { records[name]?.loaded }

    /// What is loaded, refused and retired now. After `shutdown()` it still lists every
    /// plugin loaded (its image stays mapped), while none of their modules runs
    /// (`HostInstance.runningModuleNames` is empty) and each isolated plugin's worker is
    /// `stopped`; `isStopping` tells that state apart.
    public func snapshot() -> PluginSetSnapshot {
        let plugins = records.values.sorted { $0.loaded.name < $1.loaded.name }.map { record in
            PluginSetSnapshot.Plugin(
                name: record.loaded.name, file: record.source, version: record.loaded.file.manifest.version,
                generation: record.generation, modules: record.loaded.modules.map(\.factory.name),
                lastError: refused[record.source]?.failure, worker: record.loaded.isolated?.status)
        }
        let sources = Set(records.values.map(\.source))
        let files = refused.sorted { $0.key < $1.key }.filter { !sources.contains($0.key) }.map { path, entry in
            PluginSetSnapshot.File(path: path, state: state(ofRefused: path), failure: entry.failure,
                                   plugin: manifestsRead[path]?.name, version: manifestsRead[path]?.version)
        }
        return PluginSetSnapshot(plugins: plugins, files: files, filesRefused: refused.count,
                                 retiredGenerations: retiredCount, retiredBytes: retiredBytes,
                                 loadedBytes: records.values.reduce(0) { $0 &+ ($1.loaded.library == nil ? 0 : $1.size) })
    }
}

/// What one `PluginSet.reconcile` changed, by plugin name (refused: by file path).
public struct PluginChanges: Sendable, Equatable {
    public var added: [String] = []
    public var replaced: [String] = []
    /// Plugins removed, and dependents stopped because what they depend on went.
    public var removed: [String] = []
    /// Files refused (or waiting for a dependency) in this pass.
    public var refused: [String] = []

    public init(added: [String] = [], replaced: [String] = [], removed: [String] = [], refused: [String] = []) {
        self.added = added
        self.replaced = replaced
        self.removed = removed
        self.refused = refused
    }
}

/// A `PluginSet` at one moment.
public struct PluginSetSnapshot: Sendable {
    /// A loaded plugin.
    public struct Plugin: Sendable, Equatable {
        public var name: String
        /// The file in the plugin directory it was loaded from.
        public var file: String
        public var version: String
        /// How many times it has been loaded in this process (1 for the first load).
        public var generation: Int
        /// Its modules, in its manifest's order.
        public var modules: [String]
        /// Why the file's current content is not what runs (a newer version was refused).
        public var lastError: LoadFailure?
        /// Its worker, when it runs isolated (docs/isolation.md); nil in process.
        public var worker: WorkerStatus?
        public var isolation: Isolation { worker == nil ? .inProcess : .process }
    }

    /// The state of a file that provides no loaded plugin: `refused`,
    /// `waitingForDependency`, `quarantined` or `loading` (docs/daemon.md, "States").
    public typealias FileState = PluginState

    /// A file that provides no loaded plugin.
    public struct File: Sendable, Equatable {
        public var path: String
        public var state: FileState
        public var failure: LoadFailure
        /// The plugin name and version its manifest gave, when the refusal came after the
        /// manifest was read.
        public var plugin: String?
        public var version: String?
    }

    /// By name.
    public var plugins: [Plugin]
    /// By path.
    public var files: [File]
    /// Every file whose current content is refused, including those of plugins whose older
    /// version still runs.
    public var filesRefused: Int
    /// Images of removed or replaced versions that stay mapped (their private copies are
    /// deleted).
    public var retiredGenerations: Int
    /// Their total size, in bytes.
    public var retiredBytes: Int64
    /// The size of the loaded plugins' images, in bytes: with the retired ones, what the
    /// process has mapped.
    public var loadedBytes: Int64 = 0
}

/// What identifies a file's version without reading it: device, inode, size, mtime; and
/// what its checks depend on besides its contents: its mode and owner, and those of its
/// plugin directory (`init(path:directory:)`), so that a `chmod` or `chown` is a change.
struct FileIdentity: Equatable, Sendable {
    var device: UInt64
    var inode: UInt64
    var size: Int64
    var modified: Int64
    var mode: UInt32
    var owner: UInt32
    var directoryMode: UInt32 = 0
    var directoryOwner: UInt32 = 0

    init?(path: String) {
        var status = stat()
        guard stat(path, &status) == 0 else { return nil }
        self.init(status: status)
    }

    /// The file at `path` in a plugin directory whose `stat` is `directory`.
    init?(path: String, directory: stat?) {
        self.init(path: path)
        if let directory {
            directoryMode = UInt32(directory.st_mode)
            directoryOwner = UInt32(directory.st_uid)
        }
    }

    init(status: stat) {
        device = UInt64(status.st_dev)
        inode = UInt64(status.st_ino)
        size = Int64(status.st_size)
        modified = Int64(status.st_mtim.tv_sec) * 1_000_000_000 + Int64(status.st_mtim.tv_nsec)
        mode = UInt32(status.st_mode)
        owner = UInt32(status.st_uid)
    }

    /// The identity of the contents as text (what the crash guard records): device, inode,
    /// size and modification time.
    var key: String { "\(device):\(inode):\(size):\(modified)" }
}

/// Runs async operations one at a time, in the order they were submitted: each starts once
/// the one before has returned. An actor alone does not give this: its methods interleave
/// at every suspension, and a change to a plugin set suspends (trial loads, workers,
/// module callbacks), so a rescan could begin in the middle of a reload. A consumer task
/// reading an `AsyncStream` of operations would do the same with a task kept alive for the
/// set's whole life and a reply channel per operation; a chain of tasks needs neither.
final class SerialQueue: Sendable {
    private let tail = Mutex<Task<Void, Never>?>(nil)

    /// Runs `operation` after every operation submitted before it has finished.
    func run<T: Sendable>(_ operation: @escaping @Sendable () async -> T) async -> T {
        let (result, previous): (Task<T, Never>, Task<Void, Never>?) = tail.withLock { tail in
            let previous = tail
            let task = Task<T, Never> {
                await previous?.value
                return await operation()
            }
            tail = Task { _ = await task.value }
            return (task, previous)
        }
        _ = previous
        return await result.value
    }
}

/// Why a plugin set could not do what it was asked: a code for programs and a message for
/// people (what failed, why, and the fix). The codes of calls by name are those of
/// `CallError.code`.
public struct PluginSetError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What kind of failure; the raw value is the code's spelling in an isolated plugin's
    /// replies.
    public enum Code: String, Sendable, Equatable, CaseIterable {
        /// The state directory cannot be created, locked or trusted.
        case stateDirectory = "state_directory"
        /// Another process holds the state directory.
        case alreadyRunning = "already_running"
        /// The plugin exports no such function (or none at all).
        case unknownFunction = "unknown_function"
        /// The arguments do not fit the function's signature.
        case invalidArguments = "invalid_arguments"
        /// The call could not be made or gave no valid result.
        case callFailed = "call_failed"
        /// An earlier call of the plugin still runs, past its deadline.
        case pluginBusy = "plugin_busy"
        /// The call did not return within its deadline.
        case deadlineExceeded = "deadline_exceeded"
        /// The call ran, but its result is larger than a reply may be, and is not sent.
        case replyTooLarge = "reply_too_large"
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// A refused or failed call by name, with `CallError.code` as its code.
    public init(_ error: CallError) {
        self.init(Code(rawValue: error.code) ?? .callFailed, error.description)
    }

    public var description: String { message }
}
