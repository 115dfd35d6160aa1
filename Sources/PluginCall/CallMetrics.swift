import ModuleKit
import Synchronization

/// Counters of the calls by name into one plugin, per function: what `FunctionTable`'s
/// by-name calls record (the daemon's `call` request among them), for an operator's metrics
/// (docs/daemon.md, "Metrics"). A plugin set keeps one per plugin name across versions, so
/// the counts only grow.
///
/// Function names come from callers, so only names the plugin declares are counted apart;
/// calls of any other name count under `undeclaredFunction`. Thread-safe.
public final class CallMetrics: Sendable {
    /// Where calls of functions the plugin does not declare are counted (not a valid C
    /// name, so it never collides with one).
    public static let undeclaredFunction = "(undeclared)"

    public let plugin: String
    private let functions = Mutex<[String: FunctionCallMetrics]>([:])

    public init(plugin: String) {
        self.plugin = plugin
    }

    /// The counters of function `name`, made on first use. Callers pass only declared
    /// names or `undeclaredFunction`.
    public func function(named name: String) -> FunctionCallMetrics {
        functions.withLock { functions in
            if let existing = functions[name] { return existing }
            let made = FunctionCallMetrics()
            functions[name] = made
            return made
        }
    }

    /// Every function called so far, by name.
    public func snapshot() -> [FunctionCallSnapshot] {
        functions.withLock { Array($0) }.sorted { $0.key < $1.key }.map { name, metrics in
            metrics.snapshot(plugin: plugin, function: name)
        }
    }
}

/// The counters of one function: calls, their duration, and how they failed.
public final class FunctionCallMetrics: Sendable {
    private let calls = Atomic<UInt64>(0)
    private let overruns = Atomic<UInt64>(0)
    private let duration = DurationHistogram()
    /// By error code (`CallError.code`, or a code of the caller's such as `plugin_busy`):
    /// a handful of codes at most.
    private let errors = Mutex<[String: UInt64]>([:])

    init() {}

    /// Counts one call that ran for `duration` and failed with `error` (nil: succeeded).
    public func recordCall(duration: Duration, error: String?) {
        calls.wrappingAdd(1, ordering: .relaxed)
        self.duration.record(duration)
        if let error { recordError(error) }
    }

    /// Counts a call refused before it ran (e.g. `plugin_busy`), as a failure with `code`.
    public func recordError(_ code: String) {
        errors.withLock { $0[code, default: 0] &+= 1 }
    }

    /// Counts a call still running when its caller's deadline passed.
    public func recordDeadlineOverrun() {
        overruns.wrappingAdd(1, ordering: .relaxed)
    }

    func snapshot(plugin: String, function: String) -> FunctionCallSnapshot {
        FunctionCallSnapshot(plugin: plugin, function: function, calls: calls.load(ordering: .relaxed),
                             duration: duration.snapshot(), deadlineOverruns: overruns.load(ordering: .relaxed),
                             errors: errors.withLock { $0 })
    }
}

/// One function's counters at one moment.
public struct FunctionCallSnapshot: Sendable, Equatable {
    public var plugin: String
    public var function: String
    /// Calls that ran (successful or not; refused ones count only under `errors`).
    public var calls: UInt64
    /// How long they ran, arguments' conversion included.
    public var duration: HistogramSnapshot
    /// Calls still running when their caller's deadline passed.
    public var deadlineOverruns: UInt64
    /// Failures by error code.
    public var errors: [String: UInt64]
}
