import Synchronization

/// What a host instance knows about one registered module: its factory's identity, its
/// effective settings and whether an object of it is running. A `Sendable` snapshot.
public struct ModuleStatus: Sendable, Hashable {
    /// The registration name.
    public var name: String
    /// The factory's version.
    public var version: String
    /// The plugin that provides it ("" for modules built into the host).
    public var plugin: String
    /// The effective order: the settings' order, else the factory's default order.
    public var order: Int
    /// The effective `enabled` setting.
    public var enabled: Bool
    /// True when a module object of it is running in the host.
    public var running: Bool

    /// A status with every field given.
    public init(name: String, version: String, plugin: String, order: Int, enabled: Bool, running: Bool) {
        self.name = name
        self.version = version
        self.plugin = plugin
        self.order = order
        self.enabled = enabled
        self.running = running
    }
}

/// Something noteworthy the host did about a module, delivered to
/// `HostInstance.diagnostics()` streams as well as logged. Lets tests and tools observe
/// overruns and refusals without parsing logs.
public enum HostDiagnostic: Sendable, Hashable {
    /// A handler did not finish within the deadline. The host went on without an awaited
    /// one after `elapsed`; a synchronous one cannot be interrupted, and the instance waits
    /// for it (`HostInstance.overdueHandler`), `elapsed` being how long it had run when found.
    case deadlineExceeded(module: String, event: String, elapsed: Duration)
    /// A handler that had exceeded its deadline finished later, after `elapsed` in total.
    case finishedLate(module: String, event: String, elapsed: Duration)
    /// The module's factory returned nil, or made a module whose `moduleName` or
    /// `info.name` is not the factory's name (logged with the three names); the module is
    /// not running.
    case moduleRefused(module: String, plugin: String)
    /// A module was not created because one with the same name is already running.
    case duplicateModule(module: String, plugin: String)
    /// `updateConfiguration` returned nil: the module was removed.
    case moduleRemovedByConfiguration(module: String)
}

extension ModuleInfo {
    /// This info as the JSON object of the info payload:
    /// `{"name": ..., "version": ..., "metadata": {...}}`.
    public var payload: JSONValue {
        .object(["name": .string(name), "version": .string(version), "metadata": .object(metadata)])
    }
}

/// Fan-out of diagnostics to any number of `AsyncStream`s. Safe from any thread.
final class DiagnosticsHub: Sendable {
    private struct State {
        var next: UInt64 = 0
        var finished = false
        var continuations: [UInt64: AsyncStream<HostDiagnostic>.Continuation] = [:]
    }
    private let state = Mutex(State())

    func stream() -> AsyncStream<HostDiagnostic> {
        let (stream, continuation) = AsyncStream.makeStream(of: HostDiagnostic.self)
        let id = state.withLock { state -> UInt64? in
            if state.finished { return nil }
            state.next += 1
            state.continuations[state.next] = continuation
            return state.next
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.continuations.removeValue(forKey: id) }
        }
        return stream
    }

    func emit(_ diagnostic: HostDiagnostic) {
        let continuations = state.withLock { Array($0.continuations.values) }
        for continuation in continuations { continuation.yield(diagnostic) }
    }

    func finish() {
        let continuations = state.withLock { state -> [AsyncStream<HostDiagnostic>.Continuation] in
            state.finished = true
            defer { state.continuations.removeAll() }
            return Array(state.continuations.values)
        }
        for continuation in continuations { continuation.finish() }
    }
}
