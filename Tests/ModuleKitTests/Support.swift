import ModuleKit
import Synchronization
import Testing

/// Records what modules and observers did, in order, from any thread.
final class Recorder: Sendable {
    private let entries = Mutex<[String]>([])

    func record(_ entry: String) { entries.withLock { $0.append(entry) } }

    var all: [String] { entries.withLock { $0 } }

    var count: Int { entries.withLock { $0.count } }

    /// Entries that start with `prefix`, in order.
    func starting(with prefix: String) -> [String] { all.filter { $0.hasPrefix(prefix) } }

    func clear() { entries.withLock { $0.removeAll() } }

    /// Waits (polling, bounded by the test's time limit) until `condition` holds; records
    /// a test failure, with what was recorded, when the time limit ends the wait first.
    func wait(until condition: @Sendable ([String]) -> Bool, sourceLocation: SourceLocation = #_sourceLocation) async {
        while !condition(all), !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(2))
        }
        if !condition(all) { Issue.record("the condition waited for never held; recorded: \(all)", sourceLocation: sourceLocation) }
    }
}

/// A suspension point that ignores cancellation and only ends when opened: a handler that
/// "never finishes" as far as the host can tell.
final class Gate: Sendable {
    private let state = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let resumeNow = state.withLock { state -> Bool in
                if state.open { return true }
                state.waiters.append(continuation)
                return false
            }
            if resumeNow { continuation.resume() }
        }
    }

    func open() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.open = true
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}

/// Process-unique numbers for module objects, so tests can tell instances apart.
enum InstanceCounter {
    private static let next = Atomic<Int>(0)
    static func make() -> Int { next.add(1, ordering: .relaxed).newValue }
}

/// What a `Probe` does beyond recording.
struct ProbeBehavior: Sendable {
    var notifications: Set<String> = []
    /// Async event names whose handler waits on `gate` (never finishing unless opened).
    var blockOn: Set<String> = []
    var gate = Gate()
    /// Async event names whose handler sleeps (cancellably) for a long time.
    var sleepOn: Set<String> = []
    /// What `stateForReplacement` returns.
    var state: JSONValue?
    /// Version and metadata for the module info.
    var version = "1.0.0"
    var metadata: [String: JSONValue] = [:]
}

/// A module that records every callback as "name.event" and follows `ProbeBehavior`.
///
/// `updateConfiguration` reads the new configuration's "reply": "new" returns a new
/// instance, "remove" returns nil, anything else mutates in place and returns self.
final class Probe: Module {
    let moduleName: String
    let recorder: Recorder
    let behavior: ProbeBehavior
    let instance = InstanceCounter.make()
    var configuration: JSONValue
    var restored: JSONValue?

    init(name: String, recorder: Recorder, behavior: ProbeBehavior = ProbeBehavior(), configuration: JSONValue = [:]) {
        self.moduleName = name
        self.recorder = recorder
        self.behavior = behavior
        self.configuration = configuration
    }

    /// "name#instance", to tell instances with the same name apart.
    var tag: String { "\(moduleName)#\(instance)" }

    var info: ModuleInfo { ModuleInfo(name: moduleName, version: behavior.version, metadata: behavior.metadata) }

    var notifications: Set<String> { behavior.notifications }

    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        switch event {
        case .notification(let name, let payload), .custom(let name, let payload):
            recorder.record("\(moduleName).\(name)(\(payload.jsonText))")
        case .configurationChanged(let configuration):
            recorder.record("\(moduleName).configurationChanged(\(configuration.jsonText))")
        default:
            recorder.record("\(moduleName).\(event.name)")
        }
    }

    func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async {
        recorder.record("\(moduleName).\(event.name)")
        if behavior.blockOn.contains(event.name) { await behavior.gate.wait() }
        if behavior.sleepOn.contains(event.name) {
            do {
                try await Task.sleep(for: .seconds(3600))
            } catch {
                recorder.record("\(moduleName).\(event.name).cancelled")
            }
        }
        recorder.record("\(moduleName).\(event.name).done")
    }

    func updateConfiguration(_ configuration: JSONValue, host: isolated HostInstance) -> (any Module)? {
        switch configuration["reply"]?.stringValue {
        case "new":
            return Probe(name: moduleName, recorder: recorder, behavior: behavior, configuration: configuration)
        case "remove":
            return nil
        default:
            self.configuration = configuration
            return self
        }
    }

    func stateForReplacement(host: isolated HostInstance) -> JSONValue? {
        recorder.record("\(moduleName).stateForReplacement")
        return behavior.state
    }

    func restore(state: JSONValue, host: isolated HostInstance) {
        restored = state
        recorder.record("\(moduleName).restore(\(state.jsonText))")
    }
}

/// A second module class, for the type form of `observeModule`.
final class Special: Module {
    let moduleName: String
    let instance = InstanceCounter.make()
    init(name: String) { self.moduleName = name }
    var info: ModuleInfo { ModuleInfo(name: moduleName, version: "1") }
    var tag: String { "\(moduleName)#\(instance)" }
}

/// A protocol some modules adopt, for the transform forms.
protocol Greeter: AnyObject {
    var greeting: String { get }
}

final class GreeterProbe: Module, Greeter {
    let moduleName: String
    let instance = InstanceCounter.make()
    var greeting: String
    init(name: String, greeting: String) {
        self.moduleName = name
        self.greeting = greeting
    }
    var info: ModuleInfo { ModuleInfo(name: moduleName, version: "1") }
    var tag: String { "\(moduleName)#\(instance)" }

    func updateConfiguration(_ configuration: JSONValue, host: isolated HostInstance) -> (any Module)? {
        if configuration["reply"]?.stringValue == "new" {
            return GreeterProbe(name: moduleName, greeting: configuration["greeting"]?.stringValue ?? greeting)
        }
        greeting = configuration["greeting"]?.stringValue ?? greeting
        return self
    }
}

/// A factory making `Probe`s that share `recorder`.
func probe(
    _ name: String, order: Int = 0, recorder: Recorder, behavior: ProbeBehavior = ProbeBehavior(), plugin: String = "test"
) -> ModuleFactory {
    ModuleFactory(name: name, version: behavior.version, plugin: plugin, defaultOrder: order) { host, configuration in
        Probe(name: name, recorder: recorder, behavior: behavior, configuration: configuration)
    }
}

func special(_ name: String, order: Int = 0) -> ModuleFactory {
    ModuleFactory(name: name, version: "1", plugin: "test", defaultOrder: order) { _, _ in Special(name: name) }
}

func greeter(_ name: String, order: Int = 0, greeting: String = "hello") -> ModuleFactory {
    ModuleFactory(name: name, version: "1", plugin: "test", defaultOrder: order) { _, configuration in
        GreeterProbe(name: name, greeting: configuration["greeting"]?.stringValue ?? greeting)
    }
}

/// A factory whose `make` returns nil.
func refusing(_ name: String, order: Int = 0) -> ModuleFactory {
    ModuleFactory(name: name, version: "1", plugin: "refuser", defaultOrder: order) { _, _ in nil }
}

/// A host with a short deadline, for tests.
func makeHost(
    _ name: String = "test", settings: [String: ModuleSettings] = [:], deadline: Duration = .seconds(60)
) -> HostInstance {
    HostInstance(name: name, settings: settings, eventDeadline: deadline)
}

/// Tags of the modules, for observers: "name#instance" for Probe/Special/GreeterProbe.
func tag(_ module: any Module) -> String {
    switch module {
    case let probe as Probe: probe.tag
    case let special as Special: special.tag
    case let greeter as GreeterProbe: greeter.tag
    default: module.moduleName
    }
}

func tags(_ modules: [any Module]) -> String { modules.map(tag).joined(separator: ",") }

/// A log backend that keeps the warnings whose message contains a text (and drops the
/// rest): what a test counts of the host's own warnings.
final class WarningRecorder: LogBackend {
    let text: String
    private let records = Mutex<[LogRecord]>([])
    init(containing text: String) { self.text = text }
    func write(_ record: LogRecord) {
        if record.level == .warning && record.message.contains(text) { records.withLock { $0.append(record) } }
    }
    func kept() -> [LogRecord] { records.withLock { $0 } }
}
