import ControlProtocol
import DaemonKit
import ModuleHost
import ModuleKit
import PluginFormat

/// The daemon's configuration file (JSON), e.g.:
///
///     {
///       "pluginDirectories": ["/usr/lib/modulehost/plugins"],
///       "modules": { "greeting": { "enabled": true, "order": 5, "configuration": { "salutation": "Hi" } } },
///       "eventDeadlineSeconds": 5,
///       "requestDeadlineSeconds": 10,
///       "shutdownBudgetSeconds": 30,
///       "logLevel": "info",
///       "isolation": "in-process",
///       "plugins": { "Parser": { "isolation": "process", "limits": { "addressSpaceBytes": 536870912 } } }
///     }
///
/// Every field is optional. Command-line options add to or override it. SIGHUP and
/// `modhostctl reload` read it again and apply only what changed; an invalid file is
/// reported and the running configuration kept.
public struct DaemonConfiguration: Sendable, Equatable {
    public var pluginDirectories: [String] = []
    public var modules: [String: ModuleSettings] = [:]
    public var eventDeadline: Duration = .seconds(5)
    /// The longest `send`, `call`, `enable`, `disable` and `info` wait before they reply
    /// `deadline_exceeded` (the work goes on in the background).
    public var requestDeadline: Duration = .seconds(10)
    /// The longest a SIGTERM/SIGINT shutdown may take in total, below systemd's default
    /// `TimeoutStopSec` of 90 s; past it the daemon exits with status 1, naming the modules
    /// still running.
    public var shutdownBudget: Duration = .seconds(30)
    public var logLevel: LogLevel = .info
    /// How log lines are written: text, or one JSON object per line (as `--log-format`).
    public var logFormat: DaemonOptions.LogFormat = .text
    public var allowInsecurePlugins = false
    /// Where plugins run unless `plugins` or their manifest says otherwise (docs/isolation.md).
    public var isolation: Isolation = .inProcess
    /// Per-plugin isolation settings, by plugin name.
    public var plugins: [String: PluginIsolationSettings] = [:]
    /// `call` a plugin none of whose modules runs (all disabled, stopped or stuck); off,
    /// such a call is refused with `plugin_not_running`. A plugin with no modules at all
    /// (only exports) is always callable.
    public var allowCallsWithoutRunningModule = false
    /// Stop a loaded plugin whose file becomes unsafe (writable by group or others, or owned
    /// by another user); off, it keeps running and the daemon logs a warning.
    public var stopPluginsWithUnsafeFiles = false
    /// How many versions of plugins that ran in the daemon it keeps mapped (an image that
    /// ran Swift or C code in this process is never unmapped) before it executes itself
    /// again, which unmaps them: modules hand their state over to their successors, as in a
    /// replace (docs/daemon.md, "Replacing for ever").
    public var retiredImageLimit = 128

    /// The allowed `retiredImageLimit`.
    public static let retiredImageLimitRange = 1...100_000

    /// The allowed durations, in seconds, in the file (`eventDeadlineSeconds`,
    /// `requestDeadlineSeconds`, `shutdownBudgetSeconds`) and on the command line
    /// (`--event-deadline`, `--request-deadline`, `--shutdown-budget`).
    public static let durationRange = 0.001...3600.0

    /// The fields a configuration file may hold (docs/daemon.md documents each one, and
    /// share/modhostd.json.example sets each one).
    public static let fieldNames: Set<String> = ["pluginDirectories", "modules", "eventDeadlineSeconds", "requestDeadlineSeconds",
                                                 "shutdownBudgetSeconds", "logLevel", "allowInsecurePlugins", "isolation", "plugins",
                                                 "allowCallsWithoutRunningModule", "stopPluginsWithUnsafeFiles", "retiredImageLimit",
                                                 "logFormat"]

    /// The largest configuration file read, in bytes (1 MiB).
    public static let maximumFileSize = 1 << 20

    public init() {}

    /// Reads and checks the file at `path`; the error names the file, the field and the fix.
    public static func load(_ path: String) throws(DaemonError) -> DaemonConfiguration {
        let data: [UInt8]
        do {
            data = try BoundedFile.read(path, limit: maximumFileSize)
        } catch .tooLarge {
            throw invalid(path, "is larger than \(maximumFileSize) bytes", "keep the configuration file under 1 MiB")
        } catch {
            throw invalid(path, "cannot be read (\(error))", "create it or pass --config with the right path")
        }
        let value: JSONValue
        do {
            value = try JSONValue.parse(data)
        } catch {
            throw invalid(path, "is \(error)", "correct the JSON there (names once per object, no leading zeros, UTF-8)")
        }
        guard case .object(let fields) = value else { throw invalid(path, "is not a JSON object", "wrap the settings in { }") }
        let known = fieldNames
        if let unknown = fields.keys.sorted().first(where: { !known.contains($0) }) {
            throw unknownField(unknown, known: known.sorted(), path, problem: "has an unknown field \"\(unknown)\"",
                               fix: "remove it; known fields: \(known.sorted().joined(separator: ", "))")
        }
        var configuration = DaemonConfiguration()
        if let directories = fields["pluginDirectories"] { configuration.pluginDirectories = try pluginDirectories(directories, path) }
        if let modules = fields["modules"] { configuration.modules = try moduleSettings(modules, path) }
        // Every duration of the configuration: seconds within the same range.
        let durations: [(key: String, example: Int, set: (inout DaemonConfiguration, Duration) -> Void)] = [
            ("eventDeadlineSeconds", 5, { $0.eventDeadline = $1 }),
            ("requestDeadlineSeconds", 10, { $0.requestDeadline = $1 }),
            ("shutdownBudgetSeconds", 30, { $0.shutdownBudget = $1 }),
        ]
        for (key, example, set) in durations {
            guard let field = fields[key] else { continue }
            guard let duration = field.numberValue.flatMap({ CheckedNumber.duration(seconds: $0, in: durationRange) }) else {
                throw invalid(path, "field \"\(key)\" is \(field.jsonText), not a number of seconds \(CheckedNumber.describe(durationRange))",
                              "e.g. \(example)")
            }
            set(&configuration, duration)
        }
        if let format = fields["logFormat"] {
            guard let name = format.stringValue, let parsed = DaemonOptions.LogFormat(rawValue: name) else {
                throw invalid(path, "field \"logFormat\" is \(format.jsonText), not \"text\" or \"json\"", "e.g. \"json\"")
            }
            configuration.logFormat = parsed
        }
        if let level = fields["logLevel"] {
            guard let name = level.stringValue, let parsed = LogLevel(name: name) else {
                throw invalid(path, "field \"logLevel\" is not one of debug, info, warning, error", "e.g. \"info\"")
            }
            configuration.logLevel = parsed
        }
        // Every switch of the configuration: true or false.
        let flags: [(key: String, set: (inout DaemonConfiguration, Bool) -> Void)] = [
            ("allowCallsWithoutRunningModule", { $0.allowCallsWithoutRunningModule = $1 }),
            ("stopPluginsWithUnsafeFiles", { $0.stopPluginsWithUnsafeFiles = $1 }),
            ("allowInsecurePlugins", { $0.allowInsecurePlugins = $1 }),
        ]
        for (key, set) in flags {
            guard let field = fields[key] else { continue }
            guard let flag = field.boolValue else { throw invalid(path, "field \"\(key)\" is not true or false", "use a boolean") }
            set(&configuration, flag)
        }
        if let limit = fields["retiredImageLimit"] {
            guard let number = limit.numberValue, let integer = CheckedNumber.integer(number, in: retiredImageLimitRange) else {
                throw invalid(path, "field \"retiredImageLimit\" is \(limit.jsonText), not a whole number from 1 to 100000", "e.g. 128")
            }
            configuration.retiredImageLimit = integer
        }
        if let isolation = fields["isolation"] {
            configuration.isolation = try Self.isolation(isolation, path, field: "isolation")
        }
        if let plugins = fields["plugins"] {
            guard case .object(let entries) = plugins else {
                throw invalid(path, "field \"plugins\" is not an object", "map plugin names to {\"isolation\", \"limits\", \"user\", \"group\"}")
            }
            for (name, entry) in entries.sorted(by: { $0.key < $1.key }) {
                configuration.plugins[name] = try pluginSettings(name, entry, path)
            }
        }
        return configuration
    }

    /// The error for field `name` of an object whose fields are `known`: `problem`, with
    /// the known field it is probably a typo of (`Spelling`), which the fix then renames it
    /// to; else `fix`.
    private static func unknownField(_ name: String, known: [String], _ path: String, problem: String, fix: String) -> DaemonError {
        guard let suggestion = Spelling.suggestion(for: name, among: known) else { return invalid(path, problem, fix) }
        return invalid(path, problem + " (did you mean \"\(suggestion)\"?)", "rename \"\(name)\" to \"\(suggestion)\"")
    }

    /// The `pluginDirectories` field: absolute paths.
    private static func pluginDirectories(_ directories: JSONValue, _ path: String) throws(DaemonError) -> [String] {
        guard case .array(let items) = directories, let strings = Optional(items.compactMap(\.stringValue)),
              strings.count == items.count
        else { throw invalid(path, "field \"pluginDirectories\" is not an array of strings", "list directory paths") }
        for directory in strings {
            if let problem = PathText.problem(with: directory, absolute: true) {
                throw invalid(path, "field \"pluginDirectories\" holds \(JSONValue.quote(directory)), which \(problem)",
                              "list each plugin directory by its absolute path")
            }
        }
        return strings
    }

    /// The `modules` field: each module's `enabled`, `order` and `configuration`.
    private static func moduleSettings(_ modules: JSONValue, _ path: String) throws(DaemonError) -> [String: ModuleSettings] {
        var result: [String: ModuleSettings] = [:]
        guard case .object(let entries) = modules else {
            throw invalid(path, "field \"modules\" is not an object", "map module names to {\"enabled\", \"order\", \"configuration\"}")
        }
        for (name, entry) in entries.sorted(by: { $0.key < $1.key }) {
            if let problem = PluginName.problem(name) {
                throw invalid(path, "field \"modules\" names \(problem)", "use the module names `modhostctl list` shows")
            }
            guard case .object(let settings) = entry else {
                throw invalid(path, "field \"modules.\(name)\" is not an object", "write {\"enabled\": true, \"order\": 1, \"configuration\": {}}")
            }
            var module = ModuleSettings()
            if let enabled = settings["enabled"] {
                guard let flag = enabled.boolValue else { throw invalid(path, "field \"modules.\(name).enabled\" is not true or false", "use a boolean") }
                module.enabled = flag
            }
            if let order = settings["order"] {
                guard let number = order.numberValue, number == number.rounded() else {
                    throw invalid(path, "field \"modules.\(name).order\" is not an integer", "use a whole number")
                }
                guard let integer = CheckedNumber.integer(number, in: Manifest.orderRange) else {
                    throw invalid(path, "field \"modules.\(name).order\" is \(order.jsonText), not an integer \(CheckedNumber.describe(Manifest.orderRange))",
                                  "use a whole number in that range")
                }
                module.order = integer
            }
            if let value = settings["configuration"] { module.configuration = value }
            if let extra = settings.keys.sorted().first(where: { !["enabled", "order", "configuration"].contains($0) }) {
                throw unknownField(extra, known: ["enabled", "order", "configuration"], path,
                                   problem: "field \"modules.\(name).\(extra)\" is unknown", fix: "use enabled, order and configuration")
            }
            result[name] = module
        }
        return result
    }

    private static func isolation(_ value: JSONValue, _ path: String, field: String) throws(DaemonError) -> Isolation {
        guard let text = value.stringValue, let isolation = Isolation(rawValue: text) else {
            throw invalid(path, "field \"\(field)\" is \(value.jsonText), not \"in-process\" or \"process\"", "use one of those")
        }
        return isolation
    }

    /// The values each worker limit takes. The smallest are what a worker itself needs
    /// before any plugin code runs (docs/isolation.md, "Limits"): under them it could not
    /// even start its threads, and would stall rather than fail.
    static var limitRanges: [(key: String, range: ClosedRange<Int>, target: WritableKeyPath<WorkerLimits, Int?>)] {
        [("addressSpaceBytes", (128 << 20)...(1 << 53), \.addressSpaceBytes), ("openFiles", 16...(1 << 30), \.openFiles),
         ("cpuSeconds", 1...(1 << 53), \.cpuSeconds), ("processes", 1...(1 << 30), \.processes)]
    }

    private static func pluginSettings(_ name: String, _ entry: JSONValue, _ path: String) throws(DaemonError) -> PluginIsolationSettings {
        if let problem = PluginName.problem(name) {
            throw invalid(path, "field \"plugins\" names \(problem)", "use the plugin names `modhostctl list` shows")
        }
        guard case .object(let fields) = entry else {
            throw invalid(path, "field \"plugins.\(name)\" is not an object", "write {\"isolation\": \"process\"}")
        }
        if let extra = fields.keys.sorted().first(where: { !["isolation", "limits", "user", "group"].contains($0) }) {
            throw unknownField(extra, known: ["isolation", "limits", "user", "group"], path,
                               problem: "field \"plugins.\(name).\(extra)\" is unknown", fix: "use isolation, limits, user and group")
        }
        var settings = PluginIsolationSettings()
        if let isolation = fields["isolation"] {
            settings.isolation = try Self.isolation(isolation, path, field: "plugins.\(name).isolation")
        }
        for key in ["user", "group"] {
            guard let value = fields[key] else { continue }
            guard let text = value.stringValue, !text.isEmpty, text.utf8.count <= 64, !text.contains("\0") else {
                throw invalid(path, "field \"plugins.\(name).\(key)\" is not a user or group name or number", "e.g. \"nobody\"")
            }
            if key == "user" { settings.user = text } else { settings.group = text }
        }
        if let limits = fields["limits"] {
            guard case .object(let values) = limits else {
                throw invalid(path, "field \"plugins.\(name).limits\" is not an object", "e.g. {\"addressSpaceBytes\": 536870912, \"openFiles\": 256}")
            }
            if let extra = values.keys.sorted().first(where: { key in !limitRanges.contains { $0.key == key } }) {
                throw unknownField(extra, known: limitRanges.map(\.key), path, problem: "field \"plugins.\(name).limits.\(extra)\" is unknown",
                                   fix: "use \(limitRanges.map(\.key).joined(separator: ", "))")
            }
            for (key, range, target) in limitRanges {
                guard let value = values[key] else { continue }
                guard let number = value.numberValue, let integer = CheckedNumber.integer(number, in: range) else {
                    throw invalid(path, "field \"plugins.\(name).limits.\(key)\" is \(value.jsonText), not a whole number \(CheckedNumber.describe(range))",
                                  "use a whole number \(CheckedNumber.describe(range)), or leave \(key) out to keep the daemon's")
                }
                settings.limits[keyPath: target] = integer
            }
        }
        return settings
    }

    private static func invalid(_ path: String, _ problem: String, _ fix: String) -> DaemonError {
        DaemonError(.invalidConfiguration, "\(path): configuration \(problem). Fix: \(fix)")
    }
}
