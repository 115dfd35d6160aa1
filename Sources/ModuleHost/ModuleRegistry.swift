import ModuleKit
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

    private let entries = Mutex<[String: Entry]>([:])

    public init() {}

    /// Registers every module of `plugin`, all or none: a module name another plugin
    /// already registered refuses the whole plugin.
    public func register(_ plugin: LoadedPlugin) throws(LoadFailure) {
        let result: Result<Void, LoadFailure> = entries.withLock { entries in
            for module in plugin.modules {
                if let existing = entries[module.factory.name], existing.plugin != plugin.name {
                    return .failure(LoadFailure(
                        file: plugin.file.path, check: .duplicate,
                        problem: "module \(module.factory.name) is already provided by plugin \(existing.plugin) (\(existing.file))",
                        fix: "rename the module or remove one of the two plugins"))
                }
            }
            for module in plugin.modules {
                entries[module.factory.name] = Entry(
                    factory: module.factory, swiftType: module.swiftType, plugin: plugin.name, file: plugin.file.path)
            }
            return .success(())
        }
        try result.get()
    }

    /// Forgets the modules of `plugin` (after a removal or before its replacement).
    public func unregister(plugin: String) {
        entries.withLock { entries in entries = entries.filter { $0.value.plugin != plugin } }
    }

    /// The module registered as `name`, nil when none is.
    public func entry(named name: String) -> Entry? { entries.withLock { $0[name] } }

    /// The factory of module `name`; throws an error listing the known names.
    public func factory(named name: String) throws(UnknownModule) -> ModuleFactory {
        guard let entry = entry(named: name) else { throw UnknownModule(name: name, known: names) }
        return entry.factory
    }

    /// The Swift type registered as `name` (nil for unknown names and C modules): the
    /// `NSClassFromString` of ModuleHost.
    public func moduleType(named name: String) -> (any PluginModule.Type)? { entry(named: name)?.swiftType }

    /// Registered module names, sorted.
    public var names: [String] { entries.withLock { $0.keys.sorted() } }
}

/// A module name nothing registered.
public struct UnknownModule: Error, Sendable, CustomStringConvertible {
    public let name: String
    public let known: [String]
    public var description: String {
        "no module named \(name) is registered; known modules: \(known.isEmpty ? "none" : known.joined(separator: ", "))"
    }
}
