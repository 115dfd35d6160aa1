/// A module: one unit of behaviour a plugin (or the host application) contributes.
///
/// Threading: a module object belongs to one `HostInstance` and is only ever touched on
/// that instance's serial context. Every requirement receives the instance as an
/// `isolated` parameter, so a module's code runs on that context without an extra hop
/// and may use `host.moduleManager` and `host.bus` directly. Modules are not `Sendable`
/// and need no locks of their own.
///
/// Errors: handlers do not throw. A module reports a problem by logging it (see
/// `HostInstance.logger(for:)`); the host logs it with the module's name and carries on.
public protocol Module: AnyObject {
    /// The name the module is registered under: unique within a host instance. It must be
    /// the name of the factory that made the module (for a `PluginModule`, `Self.name`,
    /// which is the default); the host refuses a module whose names disagree, with an
    /// error naming them.
    var moduleName: String { get }

    /// Name, version and metadata, as gathered into the host's info payload. `info.name`
    /// must be `moduleName` (the default for a `PluginModule`).
    var info: ModuleInfo { get }

    /// Extra notification names this module listens to, beyond the lifecycle events.
    /// Only notifications named here are delivered to it.
    var notifications: Set<String> { get }

    /// Handles a synchronous event. Return quickly; start a `Task` for slow work that
    /// the host need not wait for.
    func handle(_ event: ModuleEvent, host: isolated HostInstance)

    /// Handles an event the host awaits before it proceeds (flushing before shutdown,
    /// before unload). The host waits at most its configured deadline, then logs the
    /// overrun with the module's name and goes on without it.
    func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async

    /// Applies a new configuration. Return `self` after mutating in place (observers are
    /// not notified), a new instance to replace this one (observers are notified and
    /// this instance gets `.deinitialize`), or nil to disable and remove the module. A new
    /// instance whose `moduleName` or `info.name` is not this module's name is refused
    /// (logged) and this instance stays.
    func updateConfiguration(_ configuration: JSONValue, host: isolated HostInstance) -> (any Module)?

    /// Called on the old instance when a new version of its plugin replaces it: the state
    /// to hand to the new instance, or nil for none.
    func stateForReplacement(host: isolated HostInstance) -> JSONValue?

    /// Called on the new instance, after `.initialize` and before `.start`, with what the
    /// instance it replaces returned from `stateForReplacement`.
    func restore(state: JSONValue, host: isolated HostInstance)

    #if MODULEKIT_ABI_TEST_ADDITIONS
    // ABI upgrade test only: a requirement added with a default implementation.
    func abiTestRequirement() -> String
    #endif
}

extension Module {
    public var notifications: Set<String> { [] }
    public func handle(_ event: ModuleEvent, host: isolated HostInstance) {}
    public func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async {}
    public func updateConfiguration(_ configuration: JSONValue, host: isolated HostInstance) -> (any Module)? { self }
    public func stateForReplacement(host: isolated HostInstance) -> JSONValue? { nil }
    public func restore(state: JSONValue, host: isolated HostInstance) {}
    #if MODULEKIT_ABI_TEST_ADDITIONS
    public func abiTestRequirement() -> String { "default" }
    #endif
}

/// A module type that can be created by name: what a Swift plugin exports.
///
/// The registry maps `name` to the type; this is ModuleHost's stand-in for looking a class
/// up with `NSClassFromString` and instantiating it.
public protocol PluginModule: Module, SendableMetatype {
    /// The registration name, unique within a host instance.
    static var name: String { get }
    /// The module's version, reported in its info.
    static var version: String { get }
    /// Free-form metadata reported in its info.
    static var metadata: [String: JSONValue] { get }

    /// Creates the module on `host`'s serial context with its configuration object
    /// (an empty object when none is configured). Return nil to refuse; the host logs it.
    init?(host: isolated HostInstance, configuration: JSONValue)
}

extension PluginModule {
    public static var version: String { "0.0.0" }
    public static var metadata: [String: JSONValue] { [:] }
    public var moduleName: String { Self.name }
    public var info: ModuleInfo { ModuleInfo(name: Self.name, version: Self.version, metadata: Self.metadata) }
}

/// Name, version and free-form metadata of a module, as `info` commands and
/// `HostInstance.infoPayload()` report them.
public struct ModuleInfo: Sendable, Hashable, Codable {
    #if MODULEKIT_ABI_TEST_ADDITIONS
    // ABI upgrade test only: a stored property added first, moving the others.
    public var abiTestNote: String = "added"
    #endif
    public var name: String
    public var version: String
    public var metadata: [String: JSONValue]

    public init(name: String, version: String, metadata: [String: JSONValue] = [:]) {
        self.name = name
        self.version = version
        self.metadata = metadata
    }
}

/// Synchronous lifecycle events, delivered in this order for a module's life:
/// `initialize` once when it is registered, `start` after every module registered with it
/// has been initialized, then any number of the others, and `deinitialize` once when it is
/// removed or the host stops (modules are deinitialized in reverse order).
public enum ModuleEvent: Sendable, Hashable {
    case initialize
    case start
    case deinitialize
    /// The module's configuration changed and `updateConfiguration` kept this instance.
    case configurationChanged(JSONValue)
    /// A notification the module listens to (see `Module.notifications`).
    case notification(name: String, payload: JSONValue)
    /// An event the host application defines.
    case custom(name: String, payload: JSONValue)
    #if MODULEKIT_ABI_TEST_ADDITIONS
    // ABI upgrade test only: a case added, with a payload.
    case abiTestAddition(note: String)
    #endif

    /// Whether `name` is the event's name, without copying it.
    @inline(__always)
    func isNamed(_ name: String) -> Bool {
        switch self {
        case .initialize: name == "init"
        case .start: name == "start"
        case .deinitialize: name == "deinit"
        case .configurationChanged: name == "configurationChanged"
        case .notification(let own, _), .custom(let own, _): own == name
        #if MODULEKIT_ABI_TEST_ADDITIONS
        case .abiTestAddition: name == "abiTestAddition"
        #endif
        }
    }

    /// The event's name as C modules receive it.
    public var name: String {
        switch self {
        case .initialize: "init"
        case .start: "start"
        case .deinitialize: "deinit"
        case .configurationChanged: "configurationChanged"
        case .notification(let name, _), .custom(let name, _): name
        #if MODULEKIT_ABI_TEST_ADDITIONS
        case .abiTestAddition: "abiTestAddition"
        #endif
        }
    }

    /// The names of the host's own lifecycle events, synchronous and awaited: "init",
    /// "start", "deinit", "configurationChanged", "willUnload", "willTerminate". Only the
    /// host sends them; a custom event or notification with one of these names is refused
    /// (the daemon's `send`) or not delivered (C modules), so a module never mistakes it
    /// for the real one.
    public static let lifecycleNames: Set<String> = [
        ModuleEvent.initialize.name, ModuleEvent.start.name, ModuleEvent.deinitialize.name,
        ModuleEvent.configurationChanged(.null).name, AsyncModuleEvent.willUnload.name, AsyncModuleEvent.willTerminate.name,
    ]

    /// The event's payload, `.null` when it has none.
    public var payload: JSONValue {
        switch self {
        case .initialize, .start, .deinitialize: .null
        case .configurationChanged(let configuration): configuration
        case .notification(_, let payload), .custom(_, let payload): payload
        #if MODULEKIT_ABI_TEST_ADDITIONS
        case .abiTestAddition(let note): .string(note)
        #endif
        }
    }
}

/// Events the host awaits, each with a deadline, before it proceeds.
public enum AsyncModuleEvent: Sendable, Hashable {
    /// The host is shutting down; flush what must not be lost.
    case willTerminate
    /// This module is about to be removed or replaced by a new version of its plugin.
    case willUnload
    /// An event the host application defines (e.g. "willLogout").
    case custom(name: String, payload: JSONValue)

    /// The event's name as C modules receive it.
    public var name: String {
        switch self {
        case .willTerminate: "willTerminate"
        case .willUnload: "willUnload"
        case .custom(let name, _): name
        }
    }

    /// The event's payload, `.null` when it has none.
    public var payload: JSONValue {
        if case .custom(_, let payload) = self { return payload }
        return .null
    }
}

/// Per-module settings from the host configuration.
public struct ModuleSettings: Sendable, Hashable, Codable {
    /// A disabled module is not created; disabling a running one removes it.
    public var enabled: Bool
    /// Position among modules; lower first. Nil uses the plugin's default order.
    public var order: Int?
    /// The module's free-form configuration object.
    public var configuration: JSONValue

    public init(enabled: Bool = true, order: Int? = nil, configuration: JSONValue = [:]) {
        self.enabled = enabled
        self.order = order
        self.configuration = configuration
    }

    enum CodingKeys: String, CodingKey { case enabled, order, configuration }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        enabled = try container.decodeIfPresent(Bool.self, forKey: .enabled) ?? true
        order = try container.decodeIfPresent(Int.self, forKey: .order)
        configuration = try container.decodeIfPresent(JSONValue.self, forKey: .configuration) ?? [:]
    }
}

/// How to create one named module: the registry's answer to "what is module X".
///
/// Factories come from loaded plugins (Swift types or C descriptors) or from the host
/// application itself. They are `Sendable`; the module objects they make are not and
/// stay on the host instance that made them.
public struct ModuleFactory: Sendable {
    public let name: String
    public let version: String
    /// The plugin that provides the module ("" for modules built into the host).
    public let plugin: String
    /// Order used when the settings give none.
    public let defaultOrder: Int
    /// Creates the module on the host's context with its configuration object (an empty
    /// object when none is configured); nil refuses (the host logs it). The module's
    /// `moduleName` and `info.name` must be `name`: the host refuses a module whose names
    /// disagree.
    public let make: @Sendable (isolated HostInstance, JSONValue) -> (any Module)?

    public init(
        name: String, version: String, plugin: String = "", defaultOrder: Int = 0,
        make: @escaping @Sendable (isolated HostInstance, JSONValue) -> (any Module)?
    ) {
        self.name = name
        self.version = version
        self.plugin = plugin
        self.defaultOrder = defaultOrder
        self.make = make
    }

    /// A factory that creates `type` with its `init?(host:configuration:)`.
    public init<M: PluginModule>(_ type: M.Type, plugin: String = "", defaultOrder: Int = 0) {
        self.init(name: M.name, version: M.version, plugin: plugin, defaultOrder: defaultOrder) { host, configuration in
            #if MODULEKIT_ABI_TEST_ADDITIONS
            // ABI upgrade test only: the added requirement, called on a module that may
            // come from a plugin built before it existed.
            let module = M(host: host, configuration: configuration)
            if let module { host.logger(for: M.name).info("abi test requirement: \(module.abiTestRequirement())") }
            return module
            #else
            M(host: host, configuration: configuration)
            #endif
        }
    }
}
