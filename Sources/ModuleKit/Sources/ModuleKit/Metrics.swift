import Synchronization

// Counters a host keeps about its modules, for an operator's metrics (`modhostctl metrics`,
// docs/daemon.md "Metrics"). They are counted where the events are delivered, on the host
// instance's context, and read from any thread without waiting for it: every value is an
// `Atomic`, so a reader never races a writer.
//
// The host's own API: a plugin has no use for it.

/// A histogram of durations with fixed buckets (powers of ten from 1 µs to 10 s), safe to
/// record into and read from any thread.
public final class DurationHistogram: Sendable {
    /// The buckets' upper bounds, in seconds; a last bucket (+Inf) takes the rest.
    public static let upperBounds: [Double] = [0.000_001, 0.000_01, 0.000_1, 0.001, 0.01, 0.1, 1, 10]
    private static let upperNanoseconds: [UInt64] = [1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000,
                                                     1_000_000_000, 10_000_000_000]

    /// Observations per bucket (not cumulative), the last one for +Inf.
    private let buckets: InlineArray<9, Atomic<UInt64>>
    private let sumNanoseconds = Atomic<UInt64>(0)

    public init() {
        buckets = InlineArray { _ in Atomic<UInt64>(0) }
    }

    /// Records one observation (a negative duration counts as zero).
    public func record(_ duration: Duration) {
        let nanoseconds = duration.clampedNanoseconds
        var index = 0
        while index < Self.upperNanoseconds.count, nanoseconds > Self.upperNanoseconds[index] { index += 1 }
        buckets[index].wrappingAdd(1, ordering: .relaxed)
        // Wraps after 584 years of recorded time.
        sumNanoseconds.wrappingAdd(nanoseconds, ordering: .relaxed)
    }

    /// The observations so far. Each bucket is read once; the count is the +Inf bucket, so
    /// the snapshot is consistent with itself even while others record.
    public func snapshot() -> HistogramSnapshot {
        var cumulative: [UInt64] = []
        cumulative.reserveCapacity(buckets.count)
        var running: UInt64 = 0
        for index in 0..<buckets.count {
            running &+= buckets[index].load(ordering: .relaxed)
            cumulative.append(running)
        }
        return HistogramSnapshot(upperBounds: Self.upperBounds, cumulativeCounts: cumulative,
                                 sumSeconds: Double(sumNanoseconds.load(ordering: .relaxed)) / 1e9)
    }
}

/// A `DurationHistogram` at one moment.
public struct HistogramSnapshot: Sendable, Equatable {
    /// Upper bounds of the finite buckets, in seconds, ascending.
    public var upperBounds: [Double]
    /// Observations at or below each bound, then the total (+Inf): one more than the bounds.
    public var cumulativeCounts: [UInt64]
    /// The sum of the observations, in seconds.
    public var sumSeconds: Double
    /// The number of observations.
    public var count: UInt64 { cumulativeCounts.last ?? 0 }

    public init(upperBounds: [Double], cumulativeCounts: [UInt64], sumSeconds: Double) {
        self.upperBounds = upperBounds
        self.cumulativeCounts = cumulativeCounts
        self.sumSeconds = sumSeconds
    }

    /// No observation.
    public static var empty: HistogramSnapshot {
        HistogramSnapshot(upperBounds: DurationHistogram.upperBounds,
                          cumulativeCounts: Array(repeating: 0, count: DurationHistogram.upperBounds.count + 1), sumSeconds: 0)
    }
}

/// What went wrong for a module, as the host saw it.
public enum ModuleErrorKind: String, Sendable, CaseIterable {
    /// Its factory returned nil: the module refused to be created (a C `create` returned NULL).
    case refused
    /// An event the host handed to it was not given to its code (a C module stuck in an
    /// earlier callback, or an event name C cannot read whole).
    case notDelivered = "not_delivered"
}

/// The counters of one module name in one host instance. They live as long as the instance,
/// across replacements, disabling and re-enabling, so they only ever grow.
///
/// Thread-safety: every field is atomic. `eventsDelivered` has a single writer, the host
/// instance's context (where every event is delivered), so counting a delivery is a plain
/// load and store; everything else may be recorded from any thread.
public final class ModuleMetrics: Sendable {
    /// A synchronous event is timed when the module's delivery count is a multiple of this:
    /// reading the clock twice costs more than a typical handler (awaited events are always
    /// timed).
    public static let synchronousSampling: UInt64 = 64

    public let module: String
    /// Its place among its instance's module counters, in the order they were made: how the
    /// instance's watch of synchronous handlers names the module running (`HandlerWatch`).
    let index: Int
    private let latestPlugin: Mutex<String>
    private let delivered = Atomic<UInt64>(0)
    /// Time the host waited for the module's handlers (see `synchronousSampling`).
    public let handlerTime = DurationHistogram()
    private let overruns = Atomic<UInt64>(0)
    private let errors: InlineArray<2, Atomic<UInt64>>

    init(module: String, plugin: String, index: Int) {
        self.module = module
        self.index = index
        latestPlugin = Mutex(plugin)
        errors = InlineArray { _ in Atomic<UInt64>(0) }
    }

    /// The plugin that provided the module last.
    public var plugin: String { latestPlugin.withLock { $0 } }

    func setPlugin(_ plugin: String) {
        latestPlugin.withLock { if $0 != plugin { $0 = plugin } }
    }

    /// Counts one delivery and returns the count before it: a delivery whose count is a
    /// multiple of `synchronousSampling` is timed. Only the host instance's context calls it,
    /// or a relay (`ModuleRelay`) while that context waits for it: one writer at a time, so
    /// no read-modify-write is needed.
    @_spi(ModuleHost) @inline(__always)
    public func countDelivery() -> UInt64 {
        let count = delivered.load(ordering: .relaxed)
        delivered.store(count &+ 1, ordering: .relaxed)
        return count
    }

    /// Counts a handler that was still running at its deadline.
    public func recordDeadlineOverrun() {
        overruns.wrappingAdd(1, ordering: .relaxed)
    }

    /// Counts one error of `kind`.
    public func recordError(_ kind: ModuleErrorKind) {
        errors[kind == .refused ? 0 : 1].wrappingAdd(1, ordering: .relaxed)
    }

    /// The counters now.
    public func snapshot() -> ModuleMetricsSnapshot {
        ModuleMetricsSnapshot(
            module: module, plugin: plugin, eventsDelivered: delivered.load(ordering: .relaxed),
            handlerTime: handlerTime.snapshot(), deadlineOverruns: overruns.load(ordering: .relaxed),
            errors: [.refused: errors[0].load(ordering: .relaxed), .notDelivered: errors[1].load(ordering: .relaxed)])
    }
}

/// A module's counters at one moment.
public struct ModuleMetricsSnapshot: Sendable, Equatable {
    public var module: String
    /// The plugin that provided it last ("" for a module built into the host).
    public var plugin: String
    /// Events the host handed to its handlers: lifecycle, custom, awaited and notifications.
    public var eventsDelivered: UInt64
    /// Time in its handlers: every awaited event, and one synchronous delivery in
    /// `ModuleMetrics.synchronousSampling` (the first, the 65th, ...).
    public var handlerTime: HistogramSnapshot
    /// Handlers still running at their deadline.
    public var deadlineOverruns: UInt64
    public var errors: [ModuleErrorKind: UInt64]

    public init(module: String, plugin: String, eventsDelivered: UInt64, handlerTime: HistogramSnapshot,
                deadlineOverruns: UInt64, errors: [ModuleErrorKind: UInt64]) {
        self.module = module
        self.plugin = plugin
        self.eventsDelivered = eventsDelivered
        self.handlerTime = handlerTime
        self.deadlineOverruns = deadlineOverruns
        self.errors = errors
    }
}

/// Deliveries of one event name, counted on the host instance's context (single writer).
final class EventNameCounter: Sendable {
    let name: String
    private let deliveries = Atomic<UInt64>(0)

    init(name: String) { self.name = name }

    /// Only the host instance's context calls it.
    @inline(__always)
    func add(_ count: Int) {
        deliveries.store(deliveries.load(ordering: .relaxed) &+ UInt64(count), ordering: .relaxed)
    }

    var value: UInt64 { deliveries.load(ordering: .relaxed) }
}

/// Every counter of one host instance: per module name, and deliveries per event name.
///
/// Event names come from module code and from outside, so they are bounded before they
/// become names in a report: at most `maximumEventNames` distinct names are counted apart
/// (the first ones seen), the deliveries of any other name count under `otherEventName`,
/// and a name longer than `maximumEventNameLength` UTF-8 bytes is cut to that length.
/// Whoever writes a report escapes them for its format.
public final class HostMetrics: Sendable {
    public static let maximumEventNames = 64
    public static let maximumEventNameLength = 64
    /// Where the deliveries of names past `maximumEventNames` are counted (not a valid
    /// event name, so it never collides with one).
    public static let otherEventName = "(other)"

    /// Every module's counters, by name and in the order they were made.
    private let modules = Mutex<(byName: [String: ModuleMetrics], made: [ModuleMetrics])>(([:], []))
    private let events = Mutex<[String: EventNameCounter]>([:])
    private let other = EventNameCounter(name: HostMetrics.otherEventName)

    init() {}

    /// The counters of module `name`, made on first use; `plugin`, when given, is recorded
    /// as the plugin that provides it now.
    public func module(named name: String, plugin: String? = nil) -> ModuleMetrics {
        modules.withLock { modules in
            if let existing = modules.byName[name] {
                if let plugin { existing.setPlugin(plugin) }
                return existing
            }
            let made = ModuleMetrics(module: name, plugin: plugin ?? "", index: modules.made.count)
            modules.byName[name] = made
            modules.made.append(made)
            return made
        }
    }

    /// The counters whose `index` is `index`, if made.
    func module(atIndex index: Int) -> ModuleMetrics? {
        modules.withLock { $0.made.indices.contains(index) ? $0.made[index] : nil }
    }

    /// The counter for event `name` (bounded as the type says).
    func eventCounter(for name: String) -> EventNameCounter {
        let key = Self.boundedName(name)
        if key == Self.otherEventName { return other }
        return events.withLock { events in
            if let existing = events[key] { return existing }
            guard events.count < Self.maximumEventNames else { return other }
            let made = EventNameCounter(name: key)
            events[key] = made
            return made
        }
    }

    /// `name` cut to at most `maximumEventNameLength` UTF-8 bytes, at a scalar boundary,
    /// with its control characters (`JSONValue.isControlCharacter`) but the line feed
    /// replaced by U+FFFD: the metrics exposition cannot escape them, and names that differ only there are counted
    /// as one (two series of one name would make a scraper refuse the whole exposition).
    static func boundedName(_ name: String) -> String {
        func replaced(_ scalar: Unicode.Scalar) -> Bool { scalar != "\n" && JSONValue.isControlCharacter(scalar) }
        guard name.utf8.count > maximumEventNameLength || name.unicodeScalars.contains(where: replaced) else { return name }
        var length = 0
        var scalars = String.UnicodeScalarView()
        for scalar in name.unicodeScalars {
            let kept = replaced(scalar) ? "\u{FFFD}" : scalar
            length += String(kept).utf8.count
            guard length <= maximumEventNameLength else { break }
            scalars.append(kept)
        }
        return String(scalars)
    }

    /// Every module's counters, by module name, and deliveries by event name (by name,
    /// `otherEventName` last when it counted anything).
    public func snapshot() -> HostMetricsSnapshot {
        let modules = modules.withLock { $0.made }.sorted { $0.module < $1.module }.map { $0.snapshot() }
        var events = events.withLock { Array($0.values) }.sorted { $0.name < $1.name }.map { ($0.name, $0.value) }
        if other.value > 0 { events.append((other.name, other.value)) }
        return HostMetricsSnapshot(modules: modules, eventDeliveries: events.map { .init(event: $0.0, deliveries: $0.1) })
    }
}

/// A host instance's counters at one moment.
public struct HostMetricsSnapshot: Sendable, Equatable {
    public struct EventDeliveries: Sendable, Equatable {
        public var event: String
        public var deliveries: UInt64
    }

    /// Every module that has run in the instance, by name.
    public var modules: [ModuleMetricsSnapshot]
    /// Deliveries per event name, bounded (see `HostMetrics`).
    public var eventDeliveries: [EventDeliveries]
}

extension Duration {
    /// Whole nanoseconds, 0 for a negative duration, `UInt64.max` past it.
    var clampedNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds > 0 || (seconds == 0 && attoseconds > 0) else { return 0 }
        let (whole, overflow) = UInt64(seconds).multipliedReportingOverflow(by: 1_000_000_000)
        guard !overflow else { return .max }
        let (total, overflow2) = whole.addingReportingOverflow(UInt64(clamping: attoseconds / 1_000_000_000))
        return overflow2 ? .max : total
    }
}
