import Greeting
import ModuleKit

/// The "welcome" module: at start it finds whichever module provides Greeting's `Greeter`
/// protocol (another plugin, another .so) and greets the configured guest with it.
/// Configuration: `{"guest": "operator"}`.
public final class WelcomeModule: PluginModule {
    public static let name = "welcome"
    public static let version = "1.0.0"

    private let guest: String
    private var greeterName: String?
    private var lastGreeting: String?
    private var lookup: (any Disposable)?
    private let logger: Logger

    public init?(host: isolated HostInstance, configuration: JSONValue) {
        guest = configuration["guest"]?.stringValue ?? "operator"
        logger = host.logger(for: Self.name)
    }

    public var info: ModuleInfo {
        var metadata: [String: JSONValue] = ["guest": .string(guest)]
        if let greeterName { metadata["greeter"] = .string(greeterName) }
        if let lastGreeting { metadata["lastGreeting"] = .string(lastGreeting) }
        return ModuleInfo(name: Self.name, version: Self.version, metadata: metadata)
    }

    public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        switch event {
        case .start:
            // Called once the modules are ready, with the first module that is a Greeter.
            lookup = host.moduleManager.getModule(transform: { $0 as? (any Greeter & Module) }) { [self] greeter in
                guard let greeter else {
                    logger.warning("no module provides Greeter; is the Greeting plugin loaded?")
                    return
                }
                greeterName = greeter.moduleName
                lastGreeting = greeter.greet(guest)
                logger.info("\(lastGreeting!) (via \(greeter.moduleName))")
            }
        case .deinitialize:
            lookup?.dispose()
        default:
            break
        }
    }
}

@_cdecl("modhost_plugin_entry_v1")
public func modhostPluginEntry() -> UnsafeRawPointer? {
    PluginExport.plugin("Welcome", modules: [WelcomeModule.self])
}
