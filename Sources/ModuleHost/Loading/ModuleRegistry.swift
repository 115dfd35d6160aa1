import ModuleKit
import PluginFormat
import Synchronization

/// Every module type the host knows, by name: ModuleHost's stand-in for
/// `NSClassFromString`. Filled by the loader as plugins load; read from any thread.
public final class ModuleRegistry: Sendable {
    /// One registered module: how to make it and where it came from.
    public struct Entry: Sendable {
        public let factory: ModuleFactory
        /// The Swift type for Swift modules; nil for C modules.
        public let swiftType: (any PluginModule.Type)?
        public let plugin: String
        public let file: String
    }

    private struct State {
        // Not `[:]`: a dictionary literal passes its (key, value) tuples, whose type is made
        // at run time, in every process that makes a loader.
        var entries = [String: Entry]()
        var claims = NameClaims()
    }
    private let state = Mutex(State())

    public init() {}

    /// Makes room for `plugins` plugins providing `modules` modules when nothing is
    /// registered yet, so that a plugin set's first scan registers them without rehashing.
    public func reserveCapacity(plugins: Int, modules: Int) {
        state.withLock { state in
            guard state.entries.isEmpty, state.claims.isEmpty else { return }
            state.entries = .init(minimumCapacity: modules)
            state.claims = NameClaims(plugins: plugins, modules: modules)
        }
    }

    /// Registers every module of `plugin`, all or none: a plugin name or a module name
    /// that `NameClaims` refuses (already registered by another plugin) refuses the whole
    /// plugin. A new version of a registered plugin registers after `unregister`.
    public func register(_ plugin: LoadedPlugin) throws(LoadFailure) {
        let names = plugin.modules.map(\.factory.name)
        let conflict: NameConflict? = state.withLock { state in
            if let conflict = state.claims.claimIfFree(plugin: plugin.name, modules: names, file: plugin.file.path) { return conflict }
            for module in plugin.modules {
                state.entries[module.factory.name] = Entry(
                    factory: module.factory, swiftType: module.swiftType, plugin: plugin.name, file: plugin.file.path)
            }
            return nil
        }
        if let conflict { throw LoadFailure(file: plugin.file.path, conflict: conflict) }
    }

    /// Forgets `plugin` and its modules (after a removal or before its replacement).
    public func unregister(plugin: String) {
        state.withLock { state in
            state.claims.release(plugin: plugin)
            state.entries = state.entries.filter { $0.value.plugin != plugin }
        }
    }

    /// The module registered as `name`, nil when none is.
    public func entry(named name: String) -> Entry? { state.withLock { $0.entries[name] } }

    /// The factory of module `name`; throws an error listing the known names.
    public func factory(named name: String) throws(UnknownModule) -> ModuleFactory {
        guard let entry = entry(named: name) else { throw UnknownModule(name: name, known: names) }
        return entry.factory
    }

    /// The Swift type registered as `name` (nil for unknown names and C modules): the
    /// `NSClassFromString` of ModuleHost.
    public func moduleType(named name: String) -> (any PluginModule.Type)? { entry(named: name)?.swiftType }

    /// Registered module names, sorted.
    public var names: [String] { state.withLock { $0.entries.keys.sorted() } }
}

/// A module name nothing registered.
public struct UnknownModule: Error, Sendable, CustomStringConvertible {
    public let name: String
    public let known: [String]
    /// The name as given when it follows the name grammar, else quoted with its control
    /// characters escaped (an embedder's caller may pass any text).
    public var description: String {
        "no module named \(PluginName.isValid(name) ? name : PluginName.shown(name)) is registered; known modules: \(known.isEmpty ? "none" : known.joined(separator: ", "))"
    }
}
