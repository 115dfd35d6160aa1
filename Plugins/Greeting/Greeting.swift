import ModuleKit

/// A service other plugins use: they import this plugin's Swift module and find the
/// module by casting, e.g. `host.moduleManager.getModule { $0 as? Greeter }`.
public protocol Greeter: AnyObject {
    /// A greeting for `name`, counted in `greetingsGiven`.
    func greet(_ name: String) -> String
    /// How many greetings this instance has given, including those handed over from the
    /// version it replaced.
    var greetingsGiven: Int { get }
}

/// The "greeting" module. Configuration: `{"salutation": "Hello"}`.
public final class GreetingModule: PluginModule, Greeter {
    public static let name = "greeting"
    public static let version = "1.0.0"
    public static var metadata: [String: JSONValue] { ["provides": ["Greeter"]] }

    public var info: ModuleInfo {
        ModuleInfo(name: Self.name, version: Self.version,
                   metadata: ["provides": ["Greeter"], "greetingsGiven": .number(Double(greetingsGiven)), "salutation": .string(salutation)])
    }

    private var salutation: String
    public private(set) var greetingsGiven = 0
    private let logger: Logger

    public init?(host: isolated HostInstance, configuration: JSONValue) {
        salutation = configuration["salutation"]?.stringValue ?? "Hello"
        logger = host.logger(for: Self.name)
    }

    public func greet(_ name: String) -> String {
        greetingsGiven += 1
        return "\(salutation), \(name)!"
    }

    public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        logger.info("\(event.name)")
    }

    /// A new salutation is applied in place: observers keep the same instance.
    public func updateConfiguration(_ configuration: JSONValue, host: isolated HostInstance) -> (any Module)? {
        salutation = configuration["salutation"]?.stringValue ?? "Hello"
        return self
    }

    public func stateForReplacement(host: isolated HostInstance) -> JSONValue? {
        ["greetingsGiven": .number(Double(greetingsGiven))]
    }

    public func restore(state: JSONValue, host: isolated HostInstance) {
        greetingsGiven = Int(state["greetingsGiven"]?.numberValue ?? 0)
    }
}

/// A function other code calls by name (declared in plugin.json's "exports"): the number
/// of ASCII vowels in a C string.
@_cdecl("greeting_vowel_count")
public func greetingVowelCount(_ text: UnsafePointer<CChar>?) -> Int32 {
    guard let text else { return 0 }
    return Int32(String(cString: text).lowercased().filter { "aeiou".contains($0) }.count)
}

@_cdecl("modhost_plugin_entry_v1")
public func modhostPluginEntry() -> UnsafeRawPointer? {
    PluginExport.plugin("Greeting", modules: [GreetingModule.self])
}
