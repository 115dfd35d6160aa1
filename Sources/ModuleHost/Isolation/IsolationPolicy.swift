import DaemonKit
import ModuleKit
import PluginFormat

/// Where a plugin's code runs (docs/isolation.md).
public enum Isolation: String, Sendable, Equatable, CaseIterable {
    /// In the daemon's own process: fastest; a crash there is the daemon's.
    case inProcess = "in-process"
    /// In a `modhost-worker` process of its own, supervised by the daemon.
    case process
}

/// Resource limits of an isolated plugin's worker (setrlimit); nil leaves the daemon's.
public struct WorkerLimits: Sendable, Equatable {
    /// RLIMIT_AS, in bytes.
    public var addressSpaceBytes: Int?
    /// RLIMIT_NOFILE.
    public var openFiles: Int?
    /// RLIMIT_CPU, in seconds of CPU time.
    public var cpuSeconds: Int?
    /// RLIMIT_NPROC: processes of the worker's user (bounds a fork bomb).
    public var processes: Int?

    public init(addressSpaceBytes: Int? = nil, openFiles: Int? = nil, cpuSeconds: Int? = nil, processes: Int? = nil) {
        self.addressSpaceBytes = addressSpaceBytes
        self.openFiles = openFiles
        self.cpuSeconds = cpuSeconds
        self.processes = processes
    }

    /// The limits set, as in the configuration, by name (`addressSpaceBytes 104857600,
    /// openFiles 16`); nil when none is.
    var summary: String? {
        guard case .object(let set) = json, !set.isEmpty else { return nil }
        return set.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value.jsonText)" }.joined(separator: ", ")
    }

    var json: JSONValue {
        var fields: [String: JSONValue] = [:]
        if let addressSpaceBytes { fields["addressSpaceBytes"] = .number(Double(addressSpaceBytes)) }
        if let openFiles { fields["openFiles"] = .number(Double(openFiles)) }
        if let cpuSeconds { fields["cpuSeconds"] = .number(Double(cpuSeconds)) }
        if let processes { fields["processes"] = .number(Double(processes)) }
        return .object(fields)
    }
}

/// One plugin's isolation settings, from the configuration's `"plugins"` object.
public struct PluginIsolationSettings: Sendable, Equatable {
    /// nil: the manifest's preference, else the default.
    public var isolation: Isolation?
    public var limits = WorkerLimits()
    /// The user (name or uid) and group the worker runs as when the daemon runs as root.
    public var user: String?
    public var group: String?

    public init(isolation: Isolation? = nil, limits: WorkerLimits = WorkerLimits(), user: String? = nil, group: String? = nil) {
        self.isolation = isolation
        self.limits = limits
        self.user = user
        self.group = group
    }
}

/// Which plugins a `PluginSet` isolates and how: per plugin, the configuration's setting,
/// else the manifest's preference (`"isolation": "process"`), else `defaultIsolation`.
public struct IsolationPolicy: Sendable, Equatable {
    public var defaultIsolation: Isolation
    public var plugins: [String: PluginIsolationSettings]
    /// The `modhost-worker` executable.
    public var workerExecutable: String
    /// The level of the log lines a worker sends.
    public var logLevel: LogLevel
    /// Supervision: a worker that crashes `burst` times within `window` is quarantined.
    public var burst: Int
    public var window: Duration

    public init(defaultIsolation: Isolation = .inProcess, plugins: [String: PluginIsolationSettings] = [:],
                workerExecutable: String? = nil, logLevel: LogLevel = .info, burst: Int = 5, window: Duration = .seconds(10)) {
        self.defaultIsolation = defaultIsolation
        self.plugins = plugins
        self.workerExecutable = workerExecutable ?? Self.besideExecutable
        self.logLevel = logLevel
        self.burst = burst
        self.window = window
    }

    /// `modhost-worker` next to the running executable.
    public static var besideExecutable: String {
        let executable = FileSystem.executablePath ?? CommandLine.arguments[0]
        return PathText.parent(of: executable) + "/modhost-worker"
    }

    /// Where `manifest`'s plugin runs.
    public func isolation(of manifest: Manifest) -> Isolation {
        if let chosen = plugins[manifest.name]?.isolation { return chosen }
        if manifest.isolation == Isolation.process.rawValue { return .process }
        return defaultIsolation
    }
}

/// What an operator (and `modhostctl list`/`metrics`) sees of an isolated plugin's worker.
public struct WorkerStatus: Sendable, Equatable {
    public enum Phase: String, Sendable {
        /// A worker is starting (the first time or after a crash).
        case starting
        case running
        /// The worker ended without being asked; a restart is scheduled.
        case crashed
        /// Crashed `burst` times within `window`: not restarted until its file changes or
        /// a module of it is enabled (`modhostctl enable`).
        case quarantined
        /// Stopped by the daemon (removal, replacement, shutdown).
        case stopped
    }
    public var phase: Phase
    /// The running worker's pid.
    public var pid: Int32?
    /// Workers started after the first.
    public var restarts: Int
    /// Workers that ended without being asked (crash, exit, killed as unresponsive).
    public var crashes: Int
    /// The last worker's end, e.g. "killed by signal 11 (Segmentation fault)".
    public var lastCrash: String?
    /// The running worker's resident set size, in bytes (from /proc), nil when none runs.
    public var residentBytes: Int64?
    /// Notifications its workers posted that were dropped: `NotificationQueue.limit` of
    /// them, or `NotificationQueue.byteLimit` of payloads, waited for delivery
    /// (docs/isolation.md, "Floods").
    public var droppedNotifications: UInt64 = 0
    /// Log lines of its workers dropped: more than `LogLineRate.perSecond` in a second.
    public var droppedLogLines: UInt64 = 0
}
