import DaemonKit
import Glibc
import ModuleKit
import PluginCall
import Synchronization

/// The counters of one plugin set that are not a module's (those are its host's,
/// `HostInstance.metrics`): the calls by name per plugin and function, how many
/// plugins each `reconcile` added, replaced, removed and refused, and the restarts,
/// crashes and dropped frames of isolated plugins' workers across their versions. For an operator's
/// metrics (docs/daemon.md, "Metrics"). They only grow. Thread-safe, never waits for the
/// set or for plugin code.
public final class PluginSetMetrics: Sendable {
    private let calls = Mutex<[String: CallMetrics]>([:])
    /// Added, replaced, removed, refused.
    private let changes: InlineArray<4, Atomic<UInt64>>

    init() {
        changes = InlineArray { _ in Atomic<UInt64>(0) }
    }

    /// The call counters of plugin `plugin`, made on first use and kept across its versions.
    public func calls(plugin: String) -> CallMetrics {
        calls.withLock { calls in
            if let existing = calls[plugin] { return existing }
            let made = CallMetrics(plugin: plugin)
            calls[plugin] = made
            return made
        }
    }

    /// Every function called so far, by plugin then function.
    public func callSnapshot() -> [FunctionCallSnapshot] {
        calls.withLock { Array($0.values) }.sorted { $0.plugin < $1.plugin }.flatMap { $0.snapshot() }
    }

    func count(_ summary: PluginChanges) {
        for (index, count) in [summary.added.count, summary.replaced.count, summary.removed.count, summary.refused.count].enumerated()
        where count > 0 {
            changes[index].wrappingAdd(UInt64(count), ordering: .relaxed)
        }
    }

    /// Restarts, crashes and dropped frames of the workers of the versions of each isolated
    /// plugin that have ended (replaced or removed), by plugin name.
    private let endedWorkers = Mutex<[String: WorkerTotals]>([:])

    /// Restarts and crashes of an isolated plugin's workers, and what the daemon dropped of
    /// what they sent (docs/isolation.md, "Floods").
    public struct WorkerTotals: Sendable, Equatable {
        public var restarts = 0
        public var crashes = 0
        public var droppedNotifications: UInt64 = 0
        public var droppedLogLines: UInt64 = 0

        mutating func add(_ status: WorkerStatus) {
            restarts += status.restarts
            crashes += status.crashes
            droppedNotifications += status.droppedNotifications
            droppedLogLines += status.droppedLogLines
        }
    }

    /// Adds the counts of a version of plugin `plugin` whose worker has been stopped for good.
    func workerEnded(plugin: String, _ status: WorkerStatus) {
        endedWorkers.withLock { $0[plugin, default: WorkerTotals()].add(status) }
    }

    /// The restarts, crashes and dropped frames of plugin `plugin`'s workers since the set
    /// was made, over all its versions: those that ended plus `current`, the running version's.
    public func workerTotals(plugin: String, current: WorkerStatus) -> WorkerTotals {
        var totals = endedWorkers.withLock { $0[plugin] } ?? WorkerTotals()
        totals.add(current)
        return totals
    }

    /// Plugins added, replaced and removed, and files refused, by every `reconcile` so far.
    public var changeTotals: (added: UInt64, replaced: UInt64, removed: UInt64, refused: UInt64) {
        (changes[0].load(ordering: .relaxed), changes[1].load(ordering: .relaxed),
         changes[2].load(ordering: .relaxed), changes[3].load(ordering: .relaxed))
    }
}

extension PluginSet {
    /// The files in `imagesDirectory` (the private copies plugins are loaded from) and their
    /// total size in bytes, as on disk now. Never waits for the set.
    public nonisolated func privateImages() -> (count: Int, bytes: Int64) {
        guard let names = try? FileSystem.names(in: imagesDirectory) else { return (0, 0) }
        var count = 0
        var bytes: Int64 = 0
        for name in names {
            var status = stat()
            guard lstat(imagesDirectory + "/" + name, &status) == 0, (status.st_mode & S_IFMT) == S_IFREG else { continue }
            count += 1
            bytes &+= Int64(status.st_size)
        }
        return (count, bytes)
    }
}
