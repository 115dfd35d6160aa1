import DaemonKit
import ModuleHost
import ModuleKit
import PluginCall

/// What the control socket can ask of a running daemon. `Daemon` implements it; the
/// control protocol (`ControlService`) maps requests onto it, so the protocol can be
/// tested against any implementation.
///
/// Every method may be called concurrently from several clients; the implementation
/// serializes what must be serialized.
public protocol DaemonControl: Sendable {
    /// Every module the daemon knows, running or not, in start order (order, then name),
    /// then one row per file refused, waiting for a dependency, quarantined or being
    /// loaded (with `module` "-"), by path.
    func moduleRows() async -> [ModuleRow]
    /// Counters and paths of the running daemon.
    func status() async -> DaemonStatus
    /// The daemon's metrics (`MetricsReport`): answered from counters, never waiting for a
    /// module, a call or a reload.
    func metrics() async -> MetricsReport
    /// Enables or disables a module by name at run time (like a configuration change).
    func setEnabled(_ enabled: Bool, module: String) async throws(DaemonError)
    /// Re-reads the configuration file and rescans every plugin directory, as SIGHUP does.
    func reload() async throws(DaemonError) -> ReloadSummary
    /// Sends a host-defined event with a payload directly to every running module (whether
    /// it listens to that name or not), or to `module` only. `awaited` sends it as an
    /// asynchronous event the daemon awaits (with the deadline).
    func send(event: String, payload: JSONValue, to module: String?, awaited: Bool) async throws(DaemonError)
    /// Posts a notification with a payload to the running modules that listen to its name
    /// (a module's `notifications`), in order; returns their names, in order.
    func post(notification: String, payload: JSONValue) async throws(DaemonError) -> [String]
    /// Calls a function a loaded plugin exports, by name, with arguments given as text (as
    /// typed on a command line) or as JSON values; see docs/calling.md.
    func call(plugin: String, function: String, arguments: CallArguments) async throws(DaemonError) -> CallValue
    /// The host instance's info payload: `{"instance": name, "modules": [{"metadata",
    /// "name", "version"}, ...]}`, the running modules in start order.
    func infoPayload() async throws(DaemonError) -> JSONValue
}

/// Arguments of a call by name.
public enum CallArguments: Sendable {
    case texts([String])
    case json([JSONValue])
}

/// One line of `modhostctl list`.
public struct ModuleRow: Codable, Sendable, Equatable {
    /// The module's name, or "-" for a file that provides no running module.
    public var module: String
    public var plugin: String
    /// The plugin file as found in the plugin directory.
    public var file: String
    public var version: String
    /// A `State`'s raw value: "running", "stuck", "disabled" or "stopped" for a module, or
    /// for a module of an isolated plugin whose worker is down "crashed", "restarting" or
    /// "quarantined", or "loading" while its plugin is being added; "refused",
    /// "waiting-for-dependency", "quarantined" or "loading" for a file row.
    public var state: String
    public var order: Int?
    /// How many times this plugin has been loaded in this process (1 for the first load).
    public var generation: Int?
    /// The last refusal, crash or error that concerns it.
    public var lastError: String?
    /// For a `stuck` module: the callback it has not returned from ("create", an event name).
    public var stuckIn: String?
    /// For a `stuck` module: how long that callback has been running, in seconds.
    public var stuckSeconds: Double?
    /// Where the module's plugin runs: "in-process" or "process" (docs/isolation.md).
    public var isolation: String?
    /// For a module of an isolated plugin: its worker's pid (while one runs).
    public var workerPid: Int32?
    /// For a module of an isolated plugin: how many times its worker was restarted.
    public var restarts: Int?

    public init(module: String, plugin: String, file: String, version: String, state: String,
                order: Int? = nil, generation: Int? = nil, lastError: String? = nil,
                stuckIn: String? = nil, stuckSeconds: Double? = nil) {
        self.module = module
        self.plugin = plugin
        self.file = file
        self.version = version
        self.state = state
        self.order = order
        self.generation = generation
        self.lastError = lastError
        self.stuckIn = stuckIn
        self.stuckSeconds = stuckSeconds
    }
}

extension ModuleRow {
    /// The one vocabulary of states `list`, the log, `reload` and docs/daemon.md ("States")
    /// use.
    public typealias State = PluginState
}

/// `modhostctl status`.
public struct DaemonStatus: Codable, Sendable, Equatable {
    public var pid: Int32
    public var uptimeSeconds: Double
    /// True once every enabled module has started (what READY=1 reports).
    public var ready: Bool
    public var socketPath: String
    public var stateDirectory: String
    public var configPath: String?
    public var pluginDirectories: [String]
    public var pluginsLoaded: Int
    public var modulesRunning: Int
    public var filesRefused: Int
    /// Images of removed or replaced plugin versions that stay mapped (never unloaded;
    /// their private copies are deleted).
    public var retiredGenerations: Int
    /// Their total size, in bytes.
    public var retiredBytes: Int64
    /// Plugins refused at start because they crashed the daemon before.
    public var crashGuarded: Int
    public var reloads: Int

    public init(pid: Int32, uptimeSeconds: Double, ready: Bool, socketPath: String, stateDirectory: String,
                configPath: String?, pluginDirectories: [String], pluginsLoaded: Int, modulesRunning: Int,
                filesRefused: Int, retiredGenerations: Int, retiredBytes: Int64, crashGuarded: Int, reloads: Int) {
        self.pid = pid
        self.uptimeSeconds = uptimeSeconds
        self.ready = ready
        self.socketPath = socketPath
        self.stateDirectory = stateDirectory
        self.configPath = configPath
        self.pluginDirectories = pluginDirectories
        self.pluginsLoaded = pluginsLoaded
        self.modulesRunning = modulesRunning
        self.filesRefused = filesRefused
        self.retiredGenerations = retiredGenerations
        self.retiredBytes = retiredBytes
        self.crashGuarded = crashGuarded
        self.reloads = reloads
    }
}

/// What a reload changed (plugin names), and every file whose content is not loaded after
/// it (paths, by state), whether this reload tried it or an earlier scan did.
public struct ReloadSummary: Codable, Sendable, Equatable {
    public var configurationChanged: Bool
    public var added: [String]
    public var replaced: [String]
    public var removed: [String]
    /// Files in state `refused` (including a newer file of a plugin whose older version runs).
    public var refused: [String]
    /// Files in state `waiting-for-dependency`.
    public var waitingForDependency: [String]
    /// Files in state `quarantined`.
    public var quarantined: [String]

    public init(configurationChanged: Bool = false, added: [String] = [], replaced: [String] = [],
                removed: [String] = [], refused: [String] = [], waitingForDependency: [String] = [],
                quarantined: [String] = []) {
        self.configurationChanged = configurationChanged
        self.added = added
        self.replaced = replaced
        self.removed = removed
        self.refused = refused
        self.waitingForDependency = waitingForDependency
        self.quarantined = quarantined
    }

    public init(from decoder: any Decoder) throws {
        // A daemon from before the per-state lists sends only `refused`.
        let container = try decoder.container(keyedBy: CodingKeys.self)
        configurationChanged = try container.decode(Bool.self, forKey: .configurationChanged)
        added = try container.decode([String].self, forKey: .added)
        replaced = try container.decode([String].self, forKey: .replaced)
        removed = try container.decode([String].self, forKey: .removed)
        refused = try container.decode([String].self, forKey: .refused)
        waitingForDependency = try container.decodeIfPresent([String].self, forKey: .waitingForDependency) ?? []
        quarantined = try container.decodeIfPresent([String].self, forKey: .quarantined) ?? []
    }
}

/// A request the daemon could not carry out: a stable code for programs and a message
/// for people.
public struct DaemonError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What kind of failure. The raw value is the code on the wire (docs/control-protocol.md,
    /// "Errors"); the errors of the layers below map to it here and nowhere else.
    public enum Code: String, Sendable, Equatable, CaseIterable {
        // The request itself.
        case malformedRequest = "malformed_request"
        case invalidRequest = "invalid_request"
        case unknownCommand = "unknown_command"
        case unsupportedVersion = "unsupported_version"
        case requestTooLong = "request_too_long"
        case requestTimeout = "request_timeout"
        case peerNotPermitted = "peer_not_permitted"
        case tooManyConnections = "too_many_connections"
        case replyTooLarge = "reply_too_large"
        case internalError = "internal_error"
        // What it names.
        case unknownModule = "unknown_module"
        case unknownPlugin = "unknown_plugin"
        case unknownFunction = "unknown_function"
        case invalidArguments = "invalid_arguments"
        case reservedEvent = "reserved_event"
        case invalidConfiguration = "invalid_configuration"
        // What came of it.
        case callFailed = "call_failed"
        case deadlineExceeded = "deadline_exceeded"
        case moduleStuck = "module_stuck"
        case pluginBusy = "plugin_busy"
        case pluginNotRunning = "plugin_not_running"
        case workerEnded = "worker_ended"
        // The daemon's own start.
        case alreadyRunning = "already_running"
        case stateDirectory = "state_directory"
        case controlSocket = "control_socket"
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// A plugin set's failure, with its code.
    public init(_ error: PluginSetError) {
        let code: Code = switch error.code {
        case .stateDirectory: .stateDirectory
        case .alreadyRunning: .alreadyRunning
        case .unknownFunction: .unknownFunction
        case .invalidArguments: .invalidArguments
        case .callFailed: .callFailed
        case .pluginBusy: .pluginBusy
        case .deadlineExceeded: .deadlineExceeded
        case .replyTooLarge: .replyTooLarge
        }
        self.init(code, error.message)
    }

    /// A refused or failed call by name in the daemon's process.
    public init(_ error: CallError) {
        self.init(PluginSetError(error))
    }

    /// A request the control server refused before the daemon saw it.
    public init(_ rejection: ControlRejection, message: String) {
        let code: Code = switch rejection {
        case .peerNotPermitted: .peerNotPermitted
        case .lineTooLong: .requestTooLong
        case .invalidUTF8: .malformedRequest
        case .timedOut: .requestTimeout
        case .tooManyConnections, .tooManyConnectionsFromProcess: .tooManyConnections
        }
        self.init(code, message)
    }

    public var description: String { message }
}
