import DaemonKit
import Glibc
import PluginFormat

/// What a plugin set would load from plugin directories and files, found and checked as
/// `PluginSet.reconcile` finds and checks them, without running any plugin code: the valid
/// files in load order, and every refusal with its check, problem and fix. `modhostctl
/// verify` reports it (a dry run of a daemon's start).
public struct PluginPlan: Sendable {
    /// The files that would load, in load order (what each depends on first).
    public var ordered: [PluginFile] = []
    /// Every refused file, and every directory that cannot be read.
    public var refused: [LoadFailure] = []

    /// `files` named directly, then the candidates of `directories` as a scan lists them, in
    /// path order: each validated, its plugin and module names given to the first file that
    /// claims them, then all put in dependency order. Plugins named in `present` count as
    /// loaded unless a file here provides them; `orderOverride` maps plugin names to
    /// configured orders.
    public init(directories: [String], files: [String] = [], validator: Validator, present: Set<String> = [],
                orderOverride: [String: Int] = [:]) {
        let listing = PluginSet.candidates(in: directories)
        refused = listing.unreadable
        let found = files.map { (path: $0, directory: String?.none) }
            + listing.present.sorted { $0.key < $1.key }.map { (path: $0.key, directory: Optional($0.value)) }
        var valid: [PluginFile] = []
        valid.reserveCapacity(found.count)
        var claims = NameClaims(capacity: found.count)
        for (path, directory) in found {
            do throws(LoadFailure) {
                let file = try validator.validate(path, in: directory, directoryStatus: directory.flatMap { listing.directoryStatus[$0] })
                if let conflict = claims.claimIfFree(plugin: file.name, modules: file.manifest.modules, file: file.path) {
                    throw LoadFailure(file: file.path, conflict: conflict)
                }
                valid.append(file)
            } catch {
                refused.append(error)
            }
        }
        let order = DependencyOrder(valid, loaded: present.subtracting(valid.map(\.name)), orderOverride: orderOverride,
                                    namesClaimed: true)
        ordered = order.ordered
        refused += order.refused
    }

    /// Trial-loads each file of `ordered` with `trialLoader`, as the daemon does before it
    /// loads a file added while it runs: after the files of the plugins it depends on,
    /// directly or not (those of this plan, else of `present`). A file whose trial fails,
    /// and every file that depends on it, moves to `refused`.
    public mutating func trialLoad(with trialLoader: any TrialLoader, present: [PluginFile] = []) async {
        var loaded = Dictionary(present.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        var passed: [PluginFile] = []
        var failed: [String: LoadFailure] = [:]
        for file in ordered {
            if let dependency = file.manifest.dependencies.first(where: { failed[$0] != nil }), let refusal = failed[dependency] {
                let failure = LoadFailure.dependencyRefused(file.path, plugin: file.name, dependency: dependency, check: refusal.check)
                failed[file.name] = failure
                refused.append(failure)
                continue
            }
            // Its dependencies, and theirs, in load order, by absolute path (a bare name would
            // be searched on the library path).
            var needed: [PluginFile] = [], frontier = file.manifest.dependencies
            while let name = frontier.popLast() {
                guard let dependency = loaded[name], !needed.contains(where: { $0.name == name }) else { continue }
                needed.append(dependency)
                frontier += dependency.manifest.dependencies
            }
            let preloads = DependencyOrder(needed).ordered.map { PathText.absolute($0.resolvedPath) }
            do throws(LoadFailure) {
                try await trialLoader.trialLoad(file.resolving(to: PathText.absolute(file.resolvedPath)), preloading: preloads)
                loaded[file.name] = file
                passed.append(file)
            } catch {
                failed[file.name] = error
                refused.append(error)
            }
        }
        ordered = passed
    }
}
