/// Why `ModuleManager.module(named:as:)` gave no module: what it throws, naming the module,
/// the type asked for and the reason, so that "no such module" and "a module a cast cannot
/// reach" read differently.
public struct ModuleLookupError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Why no module was given.
    public enum Reason: String, Sendable, CaseIterable {
        /// No module of that name is running.
        case notRunning = "not running"
        /// The module runs, in another process: a plugin that runs isolated, in a worker
        /// process of its own, and the other modules see each other's objects across no
        /// process boundary. Events, notifications, calls by name and Info cross it; a
        /// Swift cast does not.
        case inAnotherProcess = "isolated in another process"
        /// The module runs here, but is not of the type asked for.
        case notOfType = "not of the type asked for"
    }

    /// The module looked up.
    public var module: String
    /// The type asked for, as Swift spells it.
    public var type: String
    public var reason: Reason
    /// Where the module runs, when `reason` is `inAnotherProcess` (e.g. "plugin Ledger's
    /// worker process 4711"); otherwise nil.
    public var location: String?

    public init(module: String, type: String, reason: Reason, location: String? = nil) {
        self.module = module
        self.type = type
        self.reason = reason
        self.location = location
    }

    /// e.g. `module "ledger" is isolated in another process (plugin Ledger's worker process
    /// 4711): a Swift cast to Ledgers cannot reach it; use events, notifications or calls by
    /// name`.
    public var description: String {
        switch reason {
        case .notRunning:
            return "module \"\(module)\" is not running"
        case .notOfType:
            return "module \"\(module)\" is not of type \(type)"
        case .inAnotherProcess:
            return "module \"\(module)\" is isolated in another process\(location.map { " (\($0))" } ?? ""): a Swift cast to \(type) cannot reach it; use events, notifications or calls by name"
        }
    }
}

/// A module that stands, in this host, for a module whose object lives in another process
/// (an isolated plugin's module, as the daemon's host runs it): it forwards what it is given,
/// and a cast of it to the other module's types fails.
@_spi(ModuleHost)
public protocol ModuleInAnotherProcess: Module {
    /// Where the module it stands for runs, for `ModuleLookupError.location`.
    var location: String { get }
}
