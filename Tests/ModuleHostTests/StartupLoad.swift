import ModuleHost
import ModuleKit
import TestSupport

/// Plugin directories loaded as modhostd loads them when it starts: a `PluginSet` over
/// them, on a state directory of its own, and one `reconcile` without trial loads. For
/// tests of what becomes of plugin files (refusals, load order, modules) on the daemon's
/// path. The modules are added to `host` (initialized) but not started: `set.start()`
/// starts them, `shutdown()` ends them.
final class StartupLoad: Sendable {
    let set: PluginSet
    /// What the reconcile changed: `added` in load order, `refused` in the order it refused.
    let changes: PluginChanges
    /// The refusals of the reconcile, in the order it made them.
    let refused: [LoadFailure]
    let state: TemporaryDirectory

    var host: HostInstance { self.set.host }
    /// The plugins loaded, in load order.
    var loaded: [String] { changes.added }

    init(directories: [String], host: HostInstance = HostInstance(name: "startup-load"),
         settings: [String: ModuleSettings] = [:]) async throws {
        let state = TemporaryDirectory("startup-load")
        self.state = state
        set = try PluginSet(host: host, settings: settings, directories: directories, stateDirectory: state.file("state"),
                            trialLoader: nil)
        changes = await set.reconcile(trial: false)
        let files = await set.snapshot().files
        refused = changes.refused.compactMap { path in files.first { $0.path == path }?.failure }
    }

    /// The refusal of the file whose path ends with `suffix`, nil when none was refused.
    func failure(endingWith suffix: String) -> LoadFailure? {
        refused.first { $0.file.hasSuffix(suffix) }
    }

    /// The modules of the loaded plugin `name`, in its manifest's order; nil when it is not loaded.
    func modules(of name: String) async -> [String]? {
        await set.snapshot().plugins.first { $0.name == name }?.modules
    }

    func shutdown() async { await set.shutdown() }
}
