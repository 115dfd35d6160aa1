import CDynamicLoader
import DaemonKit
import Dispatch
import Glibc
import ModuleKit
import PluginFormat

/// How a plugin set adds, replaces and removes plugins. Every function here runs inside
/// its serial change queue.
extension PluginSet {
    /// Brings the loaded plugins in line with the plugin directories: new files are loaded
    /// (after a trial load when `trial`), changed files replace their plugin, vanished files
    /// are removed. Refused files are not tried again until they change, except those
    /// waiting for a dependency.
    ///
    /// Once `stopChanges()` has been called (`stopRequested`), it loads, replaces and
    /// removes nothing more: a plugin already loading finishes (within the event deadline),
    /// the rest is left for the shutdown.
    func reconcileNow(trial: Bool, retryingRefused: Bool = false) async -> PluginChanges {
        var summary = PluginChanges()
        if stopRequested { return summary }
        if !imagesSwept {
            imagesSwept = true
            deleteLeftoverImages()
            workerRecords.endLeftovers()
        }
        let (present, directoryStatus) = candidates()
        await removeVanished(present, &summary)
        // New and changed files: the names held are the loaded plugins', then each
        // candidate's in path order (the first file keeps a name), all checked before any dlopen.
        var plan = ScanPlan(claims: NameClaims(capacity: records.count + present.count))
        for record in records.values {
            plan.claims.claim(plugin: record.loaded.name, modules: record.loaded.file.manifest.modules, file: record.source)
        }
        for (path, directory) in present.sorted(by: { $0.key < $1.key }) {
            await consider(path, in: directory, directoryStatus: directoryStatus[directory], retryingRefused: retryingRefused,
                           into: &plan, &summary)
        }
        await loadNew(plan, trial: trial, &summary)
        for replacement in providersFirst(plan.replacements) where !stopRequested {
            // Loaded again already, as a dependent of a plugin replaced before it (its file
            // did not change: only the isolation it runs with).
            if let record = records[replacement.file.name], record.hash == replacement.hash, !isolationChanged(record) { continue }
            if await replace(with: replacement.file, version: replacement.version, hash: replacement.hash, identity: replacement.identity) {
                summary.replaced.append(replacement.file.name)
            } else {
                summary.refused.append(replacement.file.path)
            }
        }
        return summary
    }

    /// `replacements` with each plugin after those of them it depends on, directly or not:
    /// replacing a plugin loads its dependents again too, against the configuration as it
    /// now is, so a dependent whose isolation changed with its provider's is then done.
    private func providersFirst(_ replacements: [ScanPlan.Replacement]) -> [ScanPlan.Replacement] {
        var pending = replacements
        var ordered: [ScanPlan.Replacement] = []
        while !pending.isEmpty {
            let names = Set(pending.map(\.file.name))
            let next = pending.firstIndex { candidate in
                !names.contains { $0 != candidate.file.name && dependents(of: $0).contains(candidate.file.name) }
            } ?? 0  // a cycle, which no running set holds
            ordered.append(pending.remove(at: next))
        }
        return ordered
    }

    /// What a scan found to load or replace.
    struct ScanPlan {
        /// Files of plugins not loaded.
        var fresh: [PluginFile] = []
        /// New versions of loaded plugins (or the same, to run with another isolation).
        var replacements: [Replacement] = []
        typealias Replacement = (file: PluginFile, version: FileIdentity, hash: String, identity: FileIdentity)
        /// Each accepted file's content hash, identity and version, by path.
        var hashes: [String: (hash: String, identity: FileIdentity, version: FileIdentity)] = [:]
        /// Candidates refused before their manifest was read (e.g. still being copied): one
        /// of them may be a dependency that is on its way.
        var unidentified = 0
        /// New plugins' files that held another plugin, which goes when the new one loads
        /// (path to the plugin loaded from it).
        var displacing: [String: String] = [:]
        var claims: NameClaims
    }

    /// The candidate files of the directories as they are when the scan starts
    /// (`candidates(in:)`); a directory that cannot be read is logged.
    private func candidates() -> (present: [String: String], directoryStatus: [String: stat]) {
        let listing = pluginSource.candidates(in: directories)
        for failure in listing.unreadable { logger.error("\(failure)", [("directory", failure.file)]) }
        return (listing.present, listing.directoryStatus)
    }

    /// The candidate files of `directories` (path to its directory), each directory's
    /// `stat`, and the directories that cannot be read. A directory given twice (`d` and
    /// `d/.`, or through a symlink) is read once, under its first spelling: otherwise each
    /// file would claim its own names.
    static func candidates(in directories: [String]) -> (present: [String: String], directoryStatus: [String: stat], unreadable: [LoadFailure]) {
        var directoryStatus: [String: stat] = [:]
        for directory in directories { directoryStatus[directory] = Validator.status(of: directory) }
        var present: [String: String] = [:]
        var unreadable: [LoadFailure] = []
        var seen: Set<[UInt64]> = []
        for directory in directories {
            if let status = directoryStatus[directory], !seen.insert([UInt64(status.st_dev), UInt64(status.st_ino)]).inserted { continue }
            do {
                for path in try pluginCandidates(in: directory) { present[path] = directory }
            } catch {
                unreadable.append(error)
            }
        }
        return (present, directoryStatus, unreadable)
    }

    /// Removes the plugins whose files are gone (dependents first), and forgets what was
    /// known of files no longer `present`.
    private func removeVanished(_ present: [String: String], _ summary: inout PluginChanges) async {
        for (name, record) in records where present[record.source] == nil && records[name] != nil {
            logger.info("plugin file \(record.source) is gone: removing plugin \(name)", [("plugin", name)])
            summary.removed += await remove(name, reason: "its file \(record.source) was removed")
        }
        for path in refused.keys where present[path] == nil {
            refused[path] = nil
            waiting.remove(path)
            nameClashes.remove(path)
        }
        for path in manifestsRead.keys where present[path] == nil { manifestsRead[path] = nil }
    }

    /// Checks one candidate file and adds it to `plan` (to load or to replace with), or
    /// refuses it, or leaves it (unchanged, or refused before and not changed since).
    private func consider(_ path: String, in directory: String, directoryStatus: stat?, retryingRefused: Bool,
                          into plan: inout ScanPlan, _ summary: inout PluginChanges) async {
        let identity: FileIdentity
        do throws(LoadFailure) {
            guard let current = try pluginSource.identity(of: path, in: directory, directoryStatus: directoryStatus, validator: validator) else {
                return  // gone since the listing
            }
            identity = current
        } catch {
            refuse(error, nil, &summary)
            return
        }
        // Unchanged since it was loaded; unless it was found unsafe since (its mode or
        // owner changed, and may now be back to what it was loaded with: checked again).
        if let record = records.values.first(where: { $0.source == path }), record.identity == identity, !isolationChanged(record),
           refused[path] == nil { return }
        // A refusal that depends on other files (a dependency not loaded, a name another
        // file holds, as this scan's own check finds before any copy or dlopen) is tried
        // again at every pass: that file may have come or gone.
        if !retryingRefused, let entry = refused[path], entry.identity == identity,
           entry.failure.check != .dependency, !nameClashes.contains(path) { return }
        nameClashes.remove(path)
        if let crash = crashGuard.crash(forFile: path, identity: identity.key) {
            refuse(LoadFailure(file: path, check: .crashGuard, problem: "this file \(crash.what) at \(crash.time)",
                               fix: "replace or remove the file; a changed file is tried again"), identity, &summary)
            return
        }
        // From the first read on, a crash is attributed to this file (by path and identity
        // until it is hashed). The version the checks read (inode, size, modification time)
        // is what the private copy is made from later, or refused.
        let file: PluginFile
        let version: FileIdentity
        let hash: String
        do {
            (file, version, hash) = try crashGuard.during(file: path, plugin: "", hash: "", phase: "validation",
                                                          identity: identity.key) { () throws(LoadFailure) in
                try pluginSource.read(path, in: directory, directoryStatus: directoryStatus, validator: validator)
            }
        } catch {
            if error.check == .permissions, let record = records.values.first(where: { $0.source == path }) {
                await loadedFileBecameUnsafe(record, error, identity, &summary)
                return
            }
            // What the file's manifest says, if the refusal came after it was read.
            manifestsRead[path] = pluginSource.manifest(of: path).map { ($0.name, $0.version) }
            refuse(error, identity, &summary)
            plan.unidentified += 1
            return
        }
        manifestsRead[path] = (file.name, file.manifest.version)
        if let record = records.values.first(where: { $0.source == path }), record.hash == hash, !isolationChanged(record) {
            records[record.loaded.name]?.identity = identity  // touched, same content
            if refused[path]?.failure.check == .permissions {
                refused[path] = nil
                logger.info("plugin \(record.loaded.name)'s file \(path) is safe again", [("plugin", record.loaded.name), ("file", path)])
            }
            return
        }
        if let crash = crashGuard.crash(forHash: hash) {
            refuse(LoadFailure(file: path, check: .crashGuard,
                               problem: "this file \(crash.what) at \(crash.time)",
                               fix: "fix the plugin and deploy a new build; a changed file is tried again"), identity, &summary)
            return
        }
        for warning in file.warnings { logger.warning(warning, [("file", path)]) }
        claimNames(of: file, at: path, identity: identity, version: version, hash: hash, into: &plan, &summary)
    }

    /// Gives `file`'s plugin and module names to it and adds it to `plan`, to load or to
    /// replace its plugin with; or refuses it when another file holds one of them.
    private func claimNames(of file: PluginFile, at path: String, identity: FileIdentity, version: FileIdentity, hash: String,
                            into plan: inout ScanPlan, _ summary: inout PluginChanges) {
        // The file now holds another plugin than the one loaded from it: that one goes once
        // the new one has loaded, and keeps running if it is refused. Its names are the
        // new one's to take meanwhile.
        let displaced = records.values.first(where: { $0.source == path && $0.loaded.name != file.name })
        if let displaced { plan.claims.release(plugin: displaced.loaded.name) }
        // A new version of the plugin loaded from this file takes over its names.
        let loadedHere = records[file.name].flatMap { $0.source == path ? $0 : nil }
        if loadedHere != nil { plan.claims.release(plugin: file.name) }
        if let conflict = plan.claims.conflict(plugin: file.name, modules: file.manifest.modules, file: path) {
            for record in [loadedHere, displaced].compactMap({ $0 }) {
                plan.claims.claim(plugin: record.loaded.name, modules: record.loaded.file.manifest.modules, file: path)
            }
            refuse(LoadFailure(file: path, conflict: conflict), identity, &summary)
            nameClashes.insert(path)
            return
        }
        if let displaced { plan.displacing[path] = displaced.loaded.name }
        plan.claims.claim(plugin: file.name, modules: file.manifest.modules, file: path)
        plan.hashes[path] = (hash, identity, version)
        if loadedHere != nil {
            plan.replacements.append((file, version, hash, identity))
        } else {
            plan.fresh.append(file)
        }
    }

    /// Loads the new plugins of `plan`, in dependency order. A plugin whose dependency is
    /// refused while loading in this pass is refused before any of its code runs, naming
    /// the check that refused the dependency (`LoadFailure.dependencyRefused`).
    private func loadNew(_ plan: ScanPlan, trial: Bool, _ summary: inout PluginChanges) async {
        let order = DependencyOrder(plan.fresh, loaded: Set(records.keys).subtracting(plan.displacing.values))
        let waits = plan.unidentified > 0 ? waitingForUnknown(plan.fresh, order: order) : [:]
        for failure in order.refused {
            if let missing = waits[failure.file] {
                wait(failure, for: missing, plan.hashes[failure.file]?.identity, &summary)
            } else {
                refuse(failure, plan.hashes[failure.file]?.identity, &summary)
            }
        }
        registry.reserveCapacity(plugins: order.ordered.count, modules: order.ordered.reduce(0) { $0 + $1.manifest.modules.count })
        // While they load, these show as `loading`, not as a stale refusal.
        loading = Set(order.ordered.map(\.path))
        defer { loading = [] }
        // The plugins of this pass refused while loading (trial, copy, dlopen, entry point),
        // by name: their dependents say which check refused them.
        var failed: [String: LoadFailure] = [:]
        for file in order.ordered {
            defer { loading.remove(file.path) }
            if stopRequested { break }
            guard let (hash, identity, version) = plan.hashes[file.path] else { continue }
            if let dependency = file.manifest.dependencies.first(where: { records[$0] == nil || plan.displacing.values.contains($0) }) {
                let failure = failed[dependency].map {
                    LoadFailure.dependencyRefused(file.path, plugin: file.name, dependency: dependency, check: $0.check)
                } ?? LoadFailure(file: file.path, check: .dependency, problem: "plugin \(file.name) needs \(dependency), which is not loaded",
                                 fix: "fix plugin \(dependency) first")
                failed[file.name] = failure
                refuse(failure, identity, &summary)
                continue
            }
            if await add(file, version: version, hash: hash, identity: identity, trial: trial,
                         displacing: plan.displacing[file.path], removed: &summary.removed) {
                summary.added.append(file.name)
            } else {
                failed[file.name] = refused[file.path]?.failure
                summary.refused.append(file.path)
            }
        }
    }

    /// Plugins (by path) refused by `order` only because a dependency is neither loaded nor
    /// among the identified candidates, directly or through another such plugin, mapped to
    /// that dependency. Asked only when some candidate could not be identified this time:
    /// the dependency may be that file, still being copied.
    func waitingForUnknown(_ fresh: [PluginFile], order: DependencyOrder) -> [String: String] {
        let byName = Dictionary(fresh.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        let refusedPaths = Set(order.refused.filter { $0.check == .dependency }.map(\.file))
        var result: [String: String] = [:]
        var changed = true
        while changed {
            changed = false
            for file in fresh where refusedPaths.contains(file.path) && result[file.path] == nil {
                let unmet = file.manifest.dependencies.filter { records[$0] == nil }
                let missing = unmet.first { byName[$0] == nil }
                let allWaiting = unmet.allSatisfy { byName[$0] == nil || byName[$0].map { result[$0.path] != nil } == true }
                guard allWaiting, let reason = missing ?? unmet.compactMap({ byName[$0].flatMap { result[$0.path] } }).first else { continue }
                result[file.path] = reason
                changed = true
            }
        }
        return result
    }

    /// Records a dependent that waits for `dependency`, which may still be arriving: shown
    /// as `waiting-for-dependency`, logged once at info level, tried again at every scan.
    func wait(_ failure: LoadFailure, for dependency: String, _ identity: FileIdentity?, _ summary: inout PluginChanges) {
        let known = refused[failure.file]
        refused[failure.file] = (failure, identity)
        waiting.insert(failure.file)
        summary.refused.append(failure.file)
        if known?.failure != failure {
            logger.info("\(PluginSetSnapshot.FileState.waitingForDependency.rawValue) \(failure.file): plugin \(dependency) is not loaded yet (a file in a plugin directory cannot be read yet; it may still be arriving)",
                        [("file", failure.file), ("dependency", dependency)])
        }
    }

    func refuse(_ failure: LoadFailure, _ identity: FileIdentity?, _ summary: inout PluginChanges) {
        let known = refused[failure.file]
        waiting.remove(failure.file)
        refused[failure.file] = (failure, identity)
        summary.refused.append(failure.file)
        if known?.failure != failure {
            // The file's state, in the words `list` and `reload` use.
            let state = state(ofRefused: failure.file, countingLoading: false)
            let metadata = [("file", failure.file), ("check", failure.check.rawValue)]
            if state == .waitingForDependency {
                logger.warning("\(state.rawValue) \(failure)", metadata)
            } else {
                logger.error("\(state.rawValue) \(failure)", metadata)
            }
        }
    }

    /// The file of running plugin `record` failed the permissions check (it became writable
    /// by group or others, or owned by another user): reported once, and the plugin removed
    /// when `stopsPluginsWithUnsafeFiles`; otherwise it keeps running with the refusal as
    /// its `lastError`.
    func loadedFileBecameUnsafe(_ record: Record, _ failure: LoadFailure, _ identity: FileIdentity,
                                _ summary: inout PluginChanges) async {
        let name = record.loaded.name, path = record.source
        let known = refused[path]
        refused[path] = (failure, identity)
        manifestsRead[path] = (name, record.loaded.file.manifest.version)
        guard known?.failure != failure else { return }
        if stopsPluginsWithUnsafeFiles {
            summary.removed += await remove(name, reason: "its file \(path) is now unsafe: \(failure.problem)")
            summary.refused.append(path)
            logger.error("\(PluginSetSnapshot.FileState.refused.rawValue) \(failure)", [("file", path), ("check", failure.check.rawValue)])
        } else {
            logger.warning("plugin \(name) keeps running, but its file \(path) is now unsafe: \(failure.problem). Fix: \(failure.fix); "
                           + "with stopPluginsWithUnsafeFiles the daemon stops such a plugin", [("plugin", name), ("file", path)])
        }
    }

    // MARK: - Add

    /// Loads a new plugin from a private copy and registers, initializes (and, once the
    /// host has started, starts) its modules. `trial` first loads it with the trial loader.
    /// `displacing` names the plugin loaded from the same path until now: it is removed (its
    /// names and its dependents' appended to `removed`) once the new one has passed its trial
    /// and opened, just before the new one is registered; until then a refusal leaves it
    /// running.
    func add(_ file: PluginFile, version: FileIdentity, hash: String, identity: FileIdentity, trial: Bool,
             displacing: String? = nil, removed: inout [String]) async -> Bool {
        var none = PluginChanges()
        let generation = (generations[file.name] ?? 0) + 1
        let isolated = isolationPolicy.isolation(of: file.manifest) == .process
        let image: PrivateImage
        do {
            let names = try nameGeneration(of: file.name, path: file.path, inThisProcess: !isolated)
            // The trial runs apart (a child process): only the copy is this process's own work.
            image = try crashGuard.during(file: file.path, plugin: file.name, hash: hash, phase: "copy") { () throws(LoadFailure) in
                try pluginSource.image(of: file, version: version, generation: generation, nameGeneration: names, hash: hash,
                                       renames: [:], inMemory: !isolated, for: self)
            }
        } catch {
            refuse(error, identity, &none)
            return false
        }
        do throws(LoadFailure) {
            try checkIsolation(of: file)
            // A worker is a trial load of its own: it loads the plugin away from this process.
            if trial && !isolated { try await trialLoad(image.file) }
        } catch {
            deleteImage(image.file)
            if let ending = error.trialEnding { crashGuard.recordTrialFailure(file: file.path, plugin: file.name, hash: hash, ending: ending) }
            refuse(error, identity, &none)
            return false
        }
        let loaded: LoadedPlugin
        do throws(LoadFailure) {
            loaded = try await openImage(image, of: file, hash: hash, isolated: isolated)
        } catch {
            deleteImage(image.file)
            refuse(error.relocated(to: file.path), identity, &none)
            return false
        }
        do throws(LoadFailure) {
            if let displacing {
                removed += await remove(displacing, reason: "its file \(file.path) now holds plugin \(file.name)")
            }
            try registry.register(loaded)
        } catch {
            loaded.isolated?.stop()
            deleteImage(image.file)
            refuse(error.relocated(to: file.path), identity, &none)
            return false
        }
        generations[file.name] = generation
        refused[file.path] = nil
        waiting.remove(file.path)
        records[file.name] = Record(source: file.path, identity: identity, hash: hash, loaded: loaded, generation: generation,
                                    soname: image.soname, originalSoname: image.originalSoname, size: image.size)
        beginWork(plugin: file.name, file: file.path, hash: hash, phase: "init", inThisProcess: !isolated)
        await host.add(loaded.modules.map(\.factory))
        endWork()
        logger.info("loaded plugin \(file.name) \(file.manifest.version)\(generation > 1 ? " (generation \(generation))" : "")\(loaded.isolated.map { Self.workerText($0.status) } ?? "")",
                    [("plugin", file.name), ("file", file.path), ("modules", loaded.modules.map(\.factory.name).joined(separator: ","))])
        return true
    }

    /// Opens `image`, the private copy of `file`: in a worker when `isolated`, else in this
    /// process inside a crash-guard record, with the crash recorder told of its code.
    private func openImage(_ image: PrivateImage, of file: PluginFile, hash: String, isolated: Bool) async throws(LoadFailure) -> LoadedPlugin {
        if isolated { return try await isolate(image.file) }
        crashGuard.begin(file: file.path, plugin: file.name, hash: hash, phase: "entry")
        defer { crashGuard.end() }
        let loaded = try pluginSource.open(image, for: self)
        FatalSignalRecorder.track(loaded, file: file.path, hash: hash, guard: crashGuard)
        return loaded
    }

    /// Where an isolated plugin runs, for the log: ` in worker process PID`, or what became
    /// of its worker (its modules' create may have crashed it already).
    private static func workerText(_ status: WorkerStatus) -> String {
        if let pid = status.pid { return " in worker process \(pid)" }
        return " in a worker process, now \(status.phase.rawValue)\(status.lastCrash.map { " (\($0))" } ?? "")"
    }

    // MARK: - Remove

    /// Removes a plugin and, first, every plugin that depends on it (they wait, quarantined,
    /// for it to come back). Their modules get willUnload (awaited) and deinit; the images
    /// stay mapped and are counted as retired, their private copies are deleted. Returns the
    /// names removed.
    func remove(_ name: String, reason: String) async -> [String] {
        let victims = dependents(of: name).reversed() + [name]
        var removed: [String] = []
        for victim in victims {
            guard let record = records[victim] else { continue }
            await host.remove(moduleNamed: record.loaded.modules.map(\.factory.name))
            record.loaded.isolated?.stop()
            registry.unregister(plugin: victim)
            records[victim] = nil
            retire(record)
            removed.append(victim)
            if victim != name {
                refused[record.source] = (LoadFailure(file: record.source, check: .dependency,
                                                      problem: "plugin \(victim) needs \(name), which was removed",
                                                      fix: "it is loaded again when \(name) comes back"), record.identity)
                manifestsRead[record.source] = (victim, record.loaded.file.manifest.version)
                logger.info("stopped plugin \(victim): it depends on \(name); its file is \(PluginSetSnapshot.FileState.waitingForDependency.rawValue)",
                            [("plugin", victim)])
            } else {
                logger.info("removed plugin \(victim): \(reason)", [("plugin", victim), ("file", record.source)])
            }
        }
        return removed
    }

    /// Loaded plugins that depend on `name`, directly or not, in load order.
    func dependents(of name: String) -> [String] {
        var result: [String] = []
        var frontier = [name]
        while let current = frontier.popLast() {
            for (other, record) in records.sorted(by: { $0.key < $1.key })
            where record.loaded.file.manifest.dependencies.contains(current) && !result.contains(other) {
                result.append(other)
                frontier.append(other)
            }
        }
        // Load order: a plugin after what it depends on.
        return DependencyOrder(result.compactMap { records[$0]?.loaded.file }, loaded: Set(records.keys).subtracting(result))
            .ordered.map(\.name)
    }

    /// Counts `record`'s image as retired (it stays mapped) and deletes its private copy.
    func retire(_ record: Record) {
        // An isolated plugin's image was mapped by its worker only, which has ended.
        if let isolated = record.loaded.isolated {
            metrics.workerEnded(plugin: record.loaded.name, isolated.status)
        } else {
            retiredCount += 1
            retiredBytes += record.size
        }
        deleteImage(record.loaded.file)
    }

    // MARK: - Isolation

    /// Starts a worker for `image` (an isolated plugin's private copy) and
    /// returns the plugin as this process sees it: its modules forward to the worker.
    func isolate(_ image: PluginFile, replacing: [String: String] = [:]) async throws(LoadFailure) -> LoadedPlugin {
        let isolated = IsolatedPlugin(file: image, preloads: dependencyImages(of: image.manifest, replacing: replacing),
                                      settings: isolationPolicy.plugins[image.name] ?? PluginIsolationSettings(),
                                      policy: isolationPolicy, workerRecords: workerRecords, host: host, workers: workers, logger: logger)
        let modules = try await isolated.start()
        return LoadedPlugin(file: image, library: nil, modules: isolated.factories(modules, defaultOrder: image.manifest.order),
                            functions: nil, isolated: isolated)
    }

    /// The private copies of the plugins `manifest`'s plugin depends on, directly or not,
    /// each after its own dependencies (`replacing`: plugin name to the copy of the version
    /// being loaded instead).
    func dependencyImages(of manifest: Manifest, replacing: [String: String] = [:]) -> [String] {
        var result: [String] = []
        var seen: Set<String> = []
        func visit(_ name: String) {
            guard let record = records[name], seen.insert(name).inserted else { return }
            for dependency in record.loaded.file.manifest.dependencies { visit(dependency) }
            result.append(replacing[name] ?? record.loaded.file.resolvedPath)
        }
        for dependency in manifest.dependencies { visit(dependency) }
        return result
    }

    /// Whether `record`'s plugin runs otherwise than the isolation policy now says (it is
    /// then loaded again, as a new version would be).
    func isolationChanged(_ record: Record) -> Bool {
        let wanted = isolationPolicy.isolation(of: record.loaded.file.manifest)
        guard let isolated = record.loaded.isolated else { return wanted == .process }
        return wanted == .inProcess || isolated.settings != isolationPolicy.plugins[record.loaded.name] ?? PluginIsolationSettings()
    }

    /// Refuses a plugin to run in process when a plugin it depends on runs isolated: its
    /// image is not in this process to bind to. `loadedWith`: the plugins loaded again
    /// together with it (a replace and its dependents), by name, to the isolation each
    /// will run with; the others run as they do now. A fresh add and a reload apply the
    /// one rule to the configuration as it will be.
    func checkIsolation(of file: PluginFile, loadedWith planned: [String: Isolation] = [:]) throws(LoadFailure) {
        guard isolationPolicy.isolation(of: file.manifest) == .inProcess else { return }
        func isolated(_ name: String) -> Bool { planned[name].map { $0 == .process } ?? (records[name]?.loaded.isolated != nil) }
        if let dependency = file.manifest.dependencies.first(where: isolated) {
            throw LoadFailure(file: file.path, check: .isolation,
                              problem: "plugin \(file.name) runs in process and depends on \(dependency), which runs in a worker process; its code is not in this process to bind to",
                              fix: "isolate \(file.name) too (\"plugins\": {\"\(file.name)\": {\"isolation\": \"process\"}}) or run \(dependency) in process")
        }
    }

    // MARK: - Replace

    /// Replaces a running plugin by a new version of its file. The new version is trial
    /// loaded, then loaded from a private copy under a new name; its dependents are loaded
    /// again against it; then in one update the old modules get willUnload and hand their
    /// state to the new ones, which get init, restore(state:) and start; the old ones get
    /// deinit. If anything fails before that update, the old version keeps running.
    func replace(with file: PluginFile, version newVersion: FileIdentity, hash: String, identity: FileIdentity) async -> Bool {
        guard let old = records[file.name] else { return false }
        // The plugin, then every plugin that depends on it, each with its running version.
        let chain = ([file.name] + dependents(of: file.name)).compactMap { name in records[name].map { (name: name, record: $0) } }
        let update = Update(file: file, version: newVersion, hash: hash)
        var none = PluginChanges()
        func keepOld(_ error: LoadFailure, _ images: [PrivateImage]) -> Bool {
            for image in images { deleteImage(image.file) }
            // The change refused is this file's, even when a dependent's load failed: its
            // row shows it, and a scan tries it again only once the file changes (or at
            // a reload).
            refuse(error.relocated(to: file.path), identity, &none)
            logger.error("replacing plugin \(file.name) failed; version \(old.loaded.file.manifest.version) keeps running: \(error.problem) (check \(error.check.rawValue)). Fix: \(error.fix)",
                         [("plugin", file.name), ("file", file.path), ("check", error.check.rawValue)])
            return false
        }
        var images: [PrivateImage] = []
        do throws(LoadFailure) {
            try await makeImages(for: chain, of: update, into: &images)
        } catch {
            // The new version's own trial (a dependent's fails because of it, but is not it).
            if let ending = error.trialEnding, error.file == file.path {
                crashGuard.recordTrialFailure(file: file.path, plugin: file.name, hash: hash, ending: ending)
            }
            return keepOld(error, images)
        }
        let opened: [LoadedPlugin]
        do throws(LoadFailure) {
            opened = try await open(images, for: chain, of: update)
        } catch {
            return keepOld(error.relocated(to: file.path), images)
        }
        await swap(chain, to: Array(zip(images, opened)), of: update, identity: identity)
        logger.info("replaced plugin \(file.name) \(old.loaded.file.manifest.version) by \(file.manifest.version) (generation \(images[0].generation))",
                    [("plugin", file.name), ("file", file.path)]
                        + (chain.count > 1 ? [("restarted", chain.dropFirst().map(\.name).joined(separator: ","))] : []))
        return true
    }

    /// The new version of a plugin file a replace loads.
    struct Update {
        var file: PluginFile
        var version: FileIdentity
        var hash: String

        /// The content hash of the plugin `name` of a replace, whose running version is `record`.
        func hash(of name: String, _ record: Record) -> String { name == file.name ? hash : record.hash }
    }

    /// The private images of a replace's plugins, in `chain` order, appended to `images` as
    /// they are made (the caller deletes them when this throws): the new version of the
    /// updated plugin, and its dependents' current images renamed to bind to it; each trial
    /// loaded after those before it when it runs in process.
    private func makeImages(for chain: [(name: String, record: Record)], of update: Update,
                            into images: inout [PrivateImage]) async throws(LoadFailure) {
        var renames: [String: String] = [:]  // current soname -> next generation's soname
        var planned: [String: Isolation] = [:]
        for (name, record) in chain {
            planned[name] = isolationPolicy.isolation(of: (name == update.file.name ? update.file : record.loaded.file).manifest)
        }
        for (name, record) in chain {
            let generation = (generations[name] ?? record.generation) + 1
            // A dependent is reloaded from its current image, renamed once more.
            let (file, version) = name == update.file.name ? (update.file, Optional(update.version)) : (record.loaded.file, nil)
            let inThisProcess = isolationPolicy.isolation(of: file.manifest) == .inProcess
            let nameGeneration = try nameGeneration(of: name, path: update.file.path, inThisProcess: inThisProcess)
            let next = DynamicStringPatch.generationName(record.originalSoname, generation: nameGeneration) ?? record.originalSoname
            if next != record.soname { renames[record.soname] = next }
            let hash = update.hash(of: name, record)
            let image = try crashGuard.during(file: record.source, plugin: name, hash: hash, phase: "copy") { () throws(LoadFailure) in
                try pluginSource.image(of: file, version: version, generation: generation, nameGeneration: nameGeneration,
                                       hash: hash, renames: renames, inMemory: inThisProcess, for: self)
            }
            images.append(image)
            try checkIsolation(of: file, loadedWith: planned)
            if inThisProcess {
                try await trialLoad(image.file, preloading: images.dropLast().map(\.file.resolvedPath))
            }
        }
    }

    /// Opens each of `images` (one per plugin of `chain`, in order), in process or in a
    /// worker; when one fails, the workers started for those before it are stopped.
    private func open(_ images: [PrivateImage], for chain: [(name: String, record: Record)],
                      of update: Update) async throws(LoadFailure) -> [LoadedPlugin] {
        var opened: [LoadedPlugin] = []
        do throws(LoadFailure) {
            let replacing = Dictionary(uniqueKeysWithValues: zip(chain.map(\.name), images.map(\.file.resolvedPath)))
            for ((name, record), image) in zip(chain, images) {
                if isolationPolicy.isolation(of: image.file.manifest) == .process {
                    opened.append(try await isolate(image.file, replacing: replacing))
                    continue
                }
                crashGuard.begin(file: update.file.path, plugin: update.file.name, hash: update.hash, phase: "entry")
                defer { crashGuard.end() }
                let plugin = try pluginSource.open(image, for: self)
                FatalSignalRecorder.track(plugin, file: record.source, hash: update.hash(of: name, record), guard: crashGuard)
                opened.append(plugin)
            }
        } catch {
            for plugin in opened { plugin.isolated?.stop() }
            throw error
        }
        return opened
    }

    /// Puts the new versions in the place of `chain`'s running ones: their names move to
    /// the new versions in the registry, the host replaces the modules in one update, and
    /// the old versions are retired.
    private func swap(_ chain: [(name: String, record: Record)], to new: [(image: PrivateImage, loaded: LoadedPlugin)],
                      of update: Update, identity: FileIdentity) async {
        for (name, _) in chain { registry.unregister(plugin: name) }
        for (loaded, name) in zip(new.map(\.loaded), chain.map(\.name)) {
            do throws(LoadFailure) {
                try registry.register(loaded)
            } catch {
                // The names were just given up by the version it replaces: only a bug gets here.
                logger.error("plugin \(name)'s new version could not take its names in the registry: \(error)", [("plugin", name)])
            }
        }
        beginWork(plugin: update.file.name, file: update.file.path, hash: update.hash, phase: "init",
                  inThisProcess: new.contains { $0.loaded.isolated == nil })
        await host.replace(with: new.flatMap { $0.loaded.modules.map(\.factory) },
                           replacing: chain.flatMap { $0.record.loaded.modules.map(\.factory.name) })
        endWork()
        for ((name, previous), (image, loaded)) in zip(chain, new) {
            previous.loaded.isolated?.stop()
            retire(previous)
            generations[name] = image.generation
            let updated = name == update.file.name
            records[name] = Record(
                source: previous.source, identity: updated ? identity : previous.identity, hash: updated ? update.hash : previous.hash,
                loaded: loaded, generation: image.generation, soname: image.soname, originalSoname: previous.originalSoname,
                size: image.size)
        }
        // Each of them runs as its file and the configuration now say: what refused them
        // before is past.
        for (_, previous) in chain { refused[previous.source] = nil }
        refused[update.file.path] = nil
    }
}
