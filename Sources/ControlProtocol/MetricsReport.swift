import ModuleKit

/// What `modhostctl metrics` shows (the control request `metrics`): the daemon's counters,
/// per module, per event name, per function called by name, per isolated plugin's worker,
/// and daemon-wide. Counters only grow while the daemon runs; gauges are values now.
/// `prometheusText` writes it in the Prometheus text exposition format 0.0.4.
public struct MetricsReport: Codable, Sendable, Equatable {
    /// A histogram: cumulative counts per upper bound (seconds), then the total (+Inf).
    public struct Histogram: Codable, Sendable, Equatable {
        public var upperBounds: [Double]
        /// One more than `upperBounds`: observations at or below each bound, then all of them.
        public var cumulativeCounts: [UInt64]
        public var sum: Double
        public var count: UInt64

        public init(_ snapshot: HistogramSnapshot) {
            upperBounds = snapshot.upperBounds
            cumulativeCounts = snapshot.cumulativeCounts
            sum = snapshot.sumSeconds
            count = snapshot.count
        }
    }

    /// One module name (every module that has run since the daemon started).
    public struct Module: Codable, Sendable, Equatable {
        public var module: String
        public var plugin: String
        /// Events handed to its handlers: lifecycle, custom, awaited, notifications.
        public var eventsDelivered: UInt64
        /// Time in its handlers: every awaited event, one synchronous event in 64.
        public var handlerSeconds: Histogram
        /// Handlers (or C callbacks) still running at the event deadline.
        public var deadlineOverruns: UInt64
        /// By kind: `refused` (it refused to be created), `not_delivered` (an event not given
        /// to a C module stuck in an earlier callback).
        public var errors: [String: UInt64]

        public init(_ snapshot: ModuleMetricsSnapshot) {
            module = snapshot.module
            plugin = snapshot.plugin
            eventsDelivered = snapshot.eventsDelivered
            handlerSeconds = Histogram(snapshot.handlerTime)
            deadlineOverruns = snapshot.deadlineOverruns
            errors = Dictionary(uniqueKeysWithValues: snapshot.errors.map { ($0.key.rawValue, $0.value) })
        }
    }

    /// Deliveries of one event name to modules (at most 64 names, the rest as `(other)`).
    public struct Event: Codable, Sendable, Equatable {
        public var event: String
        public var deliveries: UInt64

        public init(event: String, deliveries: UInt64) {
            self.event = event
            self.deliveries = deliveries
        }
    }

    /// One function called by name.
    public struct Function: Codable, Sendable, Equatable {
        public var plugin: String
        /// The function, or `(undeclared)` for names the plugin does not export.
        public var function: String
        public var calls: UInt64
        public var seconds: Histogram
        /// Calls still running at the request deadline.
        public var deadlineOverruns: UInt64
        /// Failures by error code (`invalid_arguments`, `unknown_function`, `call_failed`,
        /// `plugin_busy`...).
        public var errors: [String: UInt64]

        public init(plugin: String, function: String, calls: UInt64, seconds: Histogram, deadlineOverruns: UInt64,
                    errors: [String: UInt64]) {
            self.plugin = plugin
            self.function = function
            self.calls = calls
            self.seconds = seconds
            self.deadlineOverruns = deadlineOverruns
            self.errors = errors
        }
    }

    /// The worker process of an isolated plugin (docs/isolation.md).
    public struct Worker: Codable, Sendable, Equatable {
        public var plugin: String
        public var restarts: UInt64
        public var crashes: UInt64
        /// Its resident memory now, in bytes (absent while no worker runs).
        public var residentBytes: Int64?
        /// What the daemon dropped of what its workers sent: notifications posted while too
        /// many waited for delivery, log lines over the rate (docs/isolation.md, "Floods").
        public var droppedNotifications: UInt64
        public var droppedLogLines: UInt64
        /// Where its worker is: `starting`, `running`, `crashed`, `quarantined` or `stopped`
        /// (absent from a daemon that did not say).
        public var phase: String?

        public init(plugin: String, restarts: UInt64, crashes: UInt64, residentBytes: Int64?,
                    droppedNotifications: UInt64 = 0, droppedLogLines: UInt64 = 0, phase: String? = nil) {
            self.phase = phase
            self.plugin = plugin
            self.restarts = restarts
            self.crashes = crashes
            self.residentBytes = residentBytes
            self.droppedNotifications = droppedNotifications
            self.droppedLogLines = droppedLogLines
        }
    }

    /// Daemon-wide values.
    public struct Daemon: Codable, Sendable, Equatable {
        public var pluginsLoaded: Int
        public var modulesRunning: Int
        /// Files whose current content is refused, now.
        public var filesRefused: Int
        /// Since start: plugins added, replaced, removed, and files refused, by every scan.
        public var pluginsAdded: UInt64
        public var pluginsReplaced: UInt64
        public var pluginsRemoved: UInt64
        public var refusals: UInt64
        /// Reloads asked for (SIGHUP, `modhostctl reload`).
        public var reloads: Int
        /// Plugin images mapped in the daemon: the loaded ones and the retired ones (images of
        /// removed or replaced versions, never unmapped), with their sizes in bytes.
        public var imagesMapped: Int
        public var imagesMappedBytes: Int64
        public var imagesRetired: Int
        public var imagesRetiredBytes: Int64
        /// Private copies in the state directory's `images`, as on disk now.
        public var imagesPrivate: Int
        public var imagesPrivateBytes: Int64
        /// The daemon's resident memory and memory mappings now (`vm.max_map_count` bounds
        /// the mappings).
        public var residentBytes: Int64
        public var mappings: Int
        public var uptimeSeconds: Double
        /// When the daemon started, in seconds since the Unix epoch (absent from a daemon
        /// that did not say).
        public var startTimeSeconds: Double?
        /// What the daemon is: its release, C ABI, ModuleKit and Swift versions.
        public var build: [String: String]?

        public init(pluginsLoaded: Int, modulesRunning: Int, filesRefused: Int, pluginsAdded: UInt64, pluginsReplaced: UInt64,
                    pluginsRemoved: UInt64, refusals: UInt64, reloads: Int, imagesMapped: Int, imagesMappedBytes: Int64,
                    imagesRetired: Int, imagesRetiredBytes: Int64, imagesPrivate: Int, imagesPrivateBytes: Int64,
                    residentBytes: Int64, mappings: Int, uptimeSeconds: Double, startTimeSeconds: Double? = nil,
                    build: [String: String]? = nil) {
            self.startTimeSeconds = startTimeSeconds
            self.build = build
            self.pluginsLoaded = pluginsLoaded
            self.modulesRunning = modulesRunning
            self.filesRefused = filesRefused
            self.pluginsAdded = pluginsAdded
            self.pluginsReplaced = pluginsReplaced
            self.pluginsRemoved = pluginsRemoved
            self.refusals = refusals
            self.reloads = reloads
            self.imagesMapped = imagesMapped
            self.imagesMappedBytes = imagesMappedBytes
            self.imagesRetired = imagesRetired
            self.imagesRetiredBytes = imagesRetiredBytes
            self.imagesPrivate = imagesPrivate
            self.imagesPrivateBytes = imagesPrivateBytes
            self.residentBytes = residentBytes
            self.mappings = mappings
            self.uptimeSeconds = uptimeSeconds
        }
    }

    public var daemon: Daemon
    /// By module name.
    public var modules: [Module]
    /// By event name.
    public var events: [Event]
    /// By plugin, then function.
    public var calls: [Function]
    /// By plugin: isolated plugins only.
    public var workers: [Worker]

    public init(daemon: Daemon, modules: [Module], events: [Event], calls: [Function], workers: [Worker]) {
        self.daemon = daemon
        self.modules = modules
        self.events = events
        self.calls = calls
        self.workers = workers
    }
}

// MARK: - The Prometheus text exposition format

extension MetricsReport {
    /// The report in the Prometheus text exposition format, version 0.0.4: for each metric
    /// family a `# HELP` and a `# TYPE` line, then its samples; counters end in `_total`,
    /// histograms have `_bucket{le=...}`, `_sum` and `_count`; label values are escaped
    /// (`\\`, `\"`, `\n`). Every name starts with `modhost_`, but the standard
    /// `process_start_time_seconds` and `process_resident_memory_bytes`.
    public var prometheusText: String {
        var out = Exposition()
        let d = daemon
        out.gauge("modhost_plugins_loaded", "Plugins loaded now.", [([], Double(d.pluginsLoaded))])
        out.gauge("modhost_modules_running", "Modules running now.", [([], Double(d.modulesRunning))])
        out.gauge("modhost_plugin_files_refused", "Plugin files whose current content is refused, now.", [([], Double(d.filesRefused))])
        out.counter("modhost_plugin_changes_total", "Plugins added, replaced and removed, and files refused, by the scans since the daemon started.",
                    [([("change", "added")], Double(d.pluginsAdded)), ([("change", "replaced")], Double(d.pluginsReplaced)),
                     ([("change", "removed")], Double(d.pluginsRemoved)), ([("change", "refused")], Double(d.refusals))])
        out.counter("modhost_reloads_total", "Reloads (SIGHUP, modhostctl reload) since the daemon started.", [([], Double(d.reloads))])
        out.gauge("modhost_images_mapped", "Plugin images mapped in the daemon: loaded and retired versions.", [([], Double(d.imagesMapped))])
        out.gauge("modhost_images_mapped_bytes", "Size of the plugin images mapped in the daemon, in bytes.", [([], Double(d.imagesMappedBytes))])
        out.gauge("modhost_images_retired", "Images of removed or replaced plugin versions that stay mapped.", [([], Double(d.imagesRetired))])
        out.gauge("modhost_images_retired_bytes", "Size of the retired images, in bytes.", [([], Double(d.imagesRetiredBytes))])
        out.gauge("modhost_images_private", "Private plugin copies in the state directory.", [([], Double(d.imagesPrivate))])
        out.gauge("modhost_images_private_bytes", "Size of the private plugin copies in the state directory, in bytes.", [([], Double(d.imagesPrivateBytes))])
        out.gauge("modhost_resident_memory_bytes", "The daemon's resident memory, in bytes.", [([], Double(d.residentBytes))])
        out.gauge("modhost_memory_mappings", "The daemon's memory mappings (bounded by vm.max_map_count).", [([], Double(d.mappings))])
        out.gauge("modhost_uptime_seconds", "Seconds since the daemon started.", [([], d.uptimeSeconds)])
        if let build = d.build {
            out.gauge("modhost_build_info", "What the daemon is: always 1, with its release, C ABI, ModuleKit and Swift versions as labels.",
                      [(build.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }, 1)])
        }
        // The names every Prometheus client library gives these, so that the standard
        // dashboards and alerts find them.
        if let start = d.startTimeSeconds {
            out.gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", [([], start)])
        }
        out.gauge("process_resident_memory_bytes", "Resident memory size in bytes.", [([], Double(d.residentBytes))])

        let moduleLabels = modules.map { [("module", $0.module), ("plugin", $0.plugin)] }
        out.counter("modhost_module_events_delivered_total", "Events handed to the module's handlers: lifecycle, custom, awaited and notifications.",
                    zip(moduleLabels, modules).map { ($0, Double($1.eventsDelivered)) })
        out.histogram("modhost_module_handler_seconds", "Time the host waited for the module's handlers: every awaited event, one synchronous event in 64.",
                      zip(moduleLabels, modules).map { ($0, $1.handlerSeconds) })
        out.counter("modhost_module_deadline_overruns_total", "Handlers still running at the event deadline.",
                    zip(moduleLabels, modules).map { ($0, Double($1.deadlineOverruns)) })
        out.counter("modhost_module_errors_total", "Module errors by kind: refused (it refused to be created), not_delivered (an event not given to a C module stuck in a callback).",
                    zip(moduleLabels, modules).flatMap { labels, module in
                        module.errors.sorted { $0.key < $1.key }.map { (labels + [("error", $0.key)], Double($0.value)) }
                    })
        out.counter("modhost_event_deliveries_total", "Deliveries to modules per event name (at most 64 names; the rest as (other)).",
                    events.map { ([("event", $0.event)], Double($0.deliveries)) })

        let callLabels = calls.map { [("plugin", $0.plugin), ("function", $0.function)] }
        out.counter("modhost_calls_total", "Calls by name per function.", zip(callLabels, calls).map { ($0, Double($1.calls)) })
        out.histogram("modhost_call_seconds", "Time calls by name ran, arguments' conversion included.",
                      zip(callLabels, calls).map { ($0, $1.seconds) })
        out.counter("modhost_call_deadline_overruns_total", "Calls by name still running at the request deadline.",
                    zip(callLabels, calls).map { ($0, Double($1.deadlineOverruns)) })
        out.counter("modhost_call_errors_total", "Failed or refused calls by name, by error code.",
                    zip(callLabels, calls).flatMap { labels, call in
                        call.errors.sorted { $0.key < $1.key }.map { (labels + [("code", $0.key)], Double($0.value)) }
                    })

        let workerLabels = workers.map { [("plugin", $0.plugin)] }
        out.counter("modhost_worker_restarts_total", "Restarts of an isolated plugin's worker process.",
                    zip(workerLabels, workers).map { ($0, Double($1.restarts)) })
        out.counter("modhost_worker_crashes_total", "Isolated plugin workers that ended without being asked (crash, exit, unresponsive).",
                    zip(workerLabels, workers).map { ($0, Double($1.crashes)) })
        out.counter("modhost_worker_dropped_total", "What the daemon dropped of what an isolated plugin's workers sent: notifications posted while too many waited for delivery, log lines over the rate.",
                    zip(workerLabels, workers).flatMap { labels, worker in
                        [(labels + [("what", "log")], Double(worker.droppedLogLines)),
                         (labels + [("what", "notification")], Double(worker.droppedNotifications))]
                    })
        out.gauge("modhost_worker_resident_memory_bytes", "Resident memory of an isolated plugin's worker process, in bytes.",
                  zip(workerLabels, workers).compactMap { labels, worker in worker.residentBytes.map { (labels, Double($0)) } })
        out.gauge("modhost_worker_up", "1 while an isolated plugin's worker runs, 0 while it starts, is down or is quarantined.",
                  zip(workerLabels, workers).compactMap { labels, worker in worker.phase.map { (labels, $0 == "running" ? 1 : 0) } })
        out.gauge("modhost_worker_quarantined", "1 while an isolated plugin is quarantined (its worker ended too often; not restarted).",
                  zip(workerLabels, workers).compactMap { labels, worker in worker.phase.map { (labels, $0 == "quarantined" ? 1 : 0) } })
        return out.text
    }
}

/// Writes metric families in the text exposition format 0.0.4.
struct Exposition {
    typealias Labels = [(String, String)]
    private(set) var text = ""

    mutating func counter(_ name: String, _ help: String, _ samples: [(Labels, Double)]) {
        family(name, help, "counter")
        for (labels, value) in samples { sample(name, labels, value) }
    }

    mutating func gauge(_ name: String, _ help: String, _ samples: [(Labels, Double)]) {
        family(name, help, "gauge")
        for (labels, value) in samples { sample(name, labels, value) }
    }

    mutating func histogram(_ name: String, _ help: String, _ series: [(Labels, MetricsReport.Histogram)]) {
        family(name, help, "histogram")
        for (labels, histogram) in series {
            for (index, count) in histogram.cumulativeCounts.enumerated() {
                let bound = index < histogram.upperBounds.count ? Self.number(histogram.upperBounds[index]) : "+Inf"
                sample(name + "_bucket", labels + [("le", bound)], Double(count))
            }
            sample(name + "_sum", labels, histogram.sum)
            sample(name + "_count", labels, Double(histogram.count))
        }
    }

    private mutating func family(_ name: String, _ help: String, _ type: String) {
        text += "# HELP \(name) \(Self.escapeHelp(help))\n# TYPE \(name) \(type)\n"
    }

    private mutating func sample(_ name: String, _ labels: Labels, _ value: Double) {
        text += name
        if !labels.isEmpty {
            text += "{" + labels.map { "\($0.0)=\"\(Self.escapeLabelValue($0.1))\"" }.joined(separator: ",") + "}"
        }
        text += " " + Self.number(value) + "\n"
    }

    /// Integers without a fraction, others as Swift prints a Double (`1e-06`, `0.25`).
    static func number(_ value: Double) -> String {
        if value.isNaN { return "NaN" }
        if value.isInfinite { return value < 0 ? "-Inf" : "+Inf" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return "\(value)"
    }

    /// A label value: backslash, double quote and line feed escaped, and the other control
    /// characters (`JSONValue.isControlCharacter`), which the format cannot escape,
    /// replaced by U+FFFD: an event name a plugin posts cannot send a terminal escape
    /// sequence or reorder the line.
    static func escapeLabelValue(_ value: String) -> String { escape(value, quotes: true) }

    /// HELP text: backslash and line feed escaped (and control characters replaced).
    static func escapeHelp(_ text: String) -> String { escape(text, quotes: false) }

    private static func escape(_ value: String, quotes: Bool) -> String {
        var escaped = ""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\\": escaped += "\\\\"
            case "\"" where quotes: escaped += "\\\""
            case "\n": escaped += "\\n"
            case _ where JSONValue.isControlCharacter(scalar): escaped += "\u{FFFD}"
            default: escaped.unicodeScalars.append(scalar)
            }
        }
        return escaped
    }
}
