import Dispatch
import Foundation
import ModuleKit
import Synchronization
import Testing
import TestSupport

// The examples of docs/modules.md, compiled and run. Keep them in sync with the document.

// MARK: docs/modules.md — "A module"

/// A protocol other modules find by casting (docs: "Observing other modules").
public protocol EventStore: AnyObject {
    func append(_ line: String)
    var lines: [String] { get }
}

/// Keeps lines in memory; another module finds it as an `EventStore`.
public final class MemoryStoreModule: PluginModule, EventStore {
    public static let name = "memory-store"
    public static let version = "1.0.0"

    public private(set) var lines: [String] = []

    public init?(host: isolated HostInstance, configuration: JSONValue) {}

    public func append(_ line: String) { lines.append(line) }

    // Hot replace: hand the lines to the next version of the plugin.
    public func stateForReplacement(host: isolated HostInstance) -> JSONValue? {
        .array(lines.map { .string($0) })
    }

    public func restore(state: JSONValue, host: isolated HostInstance) {
        if case .array(let saved) = state { lines = saved.compactMap(\.stringValue) + lines }
    }
}

/// Shared through the Bus: an actor, so any module (or thread) may use it.
public actor TokenCache {
    private var tokens: [String: String] = [:]
    public init() {}
    public func set(_ token: String, for user: String) { tokens[user] = token }
    public func token(for user: String) -> String? { tokens[user] }
}

/// Records logins in every `EventStore`; flushes before the host stops.
public final class AuditModule: PluginModule {
    public static let name = "audit"
    public static let version = "1.0.0"
    public static var metadata: [String: JSONValue] { ["listens": ["user.login"]] }

    private var prefix: String
    private var stores: [any EventStore] = []
    private let subscriptions = DisposeBag()
    private let logger: Logger
    public private(set) var flushed = false

    public init?(host: isolated HostInstance, configuration: JSONValue) {
        prefix = configuration["prefix"]?.stringValue ?? "audit"
        logger = host.logger(for: Self.name)
    }

    public var notifications: Set<String> { ["user.login"] }

    public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        switch event {
        case .initialize:
            // No value arrives until every module of this update exists; then one value,
            // and a new one only when the set of stores changes.
            host.moduleManager.observeModules { $0 as? EventStore }
                .subscribe { [unowned self] stores in self.stores = stores }
                .disposed(by: subscriptions)
            host.bus.install(TokenCache())
        case .notification("user.login", let payload):
            let user = payload["user"]?.stringValue ?? "?"
            for store in stores { store.append("\(prefix): login \(user)") }
        case .deinitialize:
            subscriptions.dispose()
        default:
            break
        }
    }

    public func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async {
        switch event {
        case .willTerminate, .custom("willLogout", _):
            // Awaited by the host, at most `eventDeadline`.
            guard let cache = host.bus.access() as TokenCache? else { return }
            await cache.set("", for: "everyone")
            flushed = true
        default:
            break
        }
    }

    /// A new prefix is applied in place (observers are not re-notified); no prefix at all
    /// removes the module.
    public func updateConfiguration(_ configuration: JSONValue, host: isolated HostInstance) -> (any Module)? {
        guard let prefix = configuration["prefix"]?.stringValue else {
            logger.info("no prefix configured; removing myself")
            return nil
        }
        self.prefix = prefix
        return self
    }
}

/// docs: "Threading rules" — a task started in a callback, using `host`, runs on the host.
final class RefreshingModule: Module {
    var moduleName: String { "refreshing" }
    var info: ModuleInfo { ModuleInfo(name: "refreshing", version: "1") }
    var lastToken: String?

    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        switch event {
        case .start:
            let cache = TokenCache()
            Task {
                let token = await cache.token(for: "ada")   // suspends; the host serves others meanwhile
                self.lastToken = token                      // back on the host's context
                host.post(notification: "token.refreshed")
            }
        default:
            break
        }
    }
}

// MARK: docs/modules.md — "Threading rules", inside an observer

/// Subscribes inside an observer that does not otherwise use the host, as the document
/// shows: `subscribe(isolation: host)`.
final class NestedObserverModule: Module {
    let recorder: Recorder
    private let subscriptions = DisposeBag()
    init(recorder: Recorder) { self.recorder = recorder }
    var moduleName: String { "nested" }
    var info: ModuleInfo { ModuleInfo(name: "nested", version: "1") }

    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        guard case .start = event else { return }
        let names = host.observeModules { $0.moduleName }
        let recorder = recorder
        let subscriptions = subscriptions
        host.moduleManager.observeModule(MemoryStoreModule.self).subscribe { store in
            guard store != nil else { return }
            names.subscribe(isolation: host) { names in recorder.record(names.joined(separator: ",")) }   // not: names.subscribe { … }
                .disposed(by: subscriptions)
        }
        .disposed(by: subscriptions)
    }
}

@Suite("docs/modules.md examples", .timeLimit(.minutes(5)))
struct DocExamplesTests {
    // docs: "Threading rules", "Inside an observer, name the host".
    @Test func subscribingInsideAnObserverWithTheHostNamed() async {
        let recorder = Recorder()
        let host = HostInstance(name: "nested")
        await host.add([ModuleFactory(name: "nested", version: "1") { _, _ in NestedObserverModule(recorder: recorder) },
                        ModuleFactory(MemoryStoreModule.self)])
        await host.start()
        #expect(recorder.all == ["memory-store,nested"])
        await host.shutdown()
    }

    // docs: "Embedding a host instance".
    @Test func theHostSideExampleRuns() async throws {
        let host = HostInstance(
            name: "main",
            settings: [
                "audit": ModuleSettings(order: 10, configuration: ["prefix": "sec"]),
                "memory-store": ModuleSettings(order: 0),
            ],
            eventDeadline: .seconds(2))
        await host.add([ModuleFactory(AuditModule.self, plugin: "Audit"), ModuleFactory(MemoryStoreModule.self, plugin: "Store")])
        await host.start()
        await host.post(notification: "user.login", payload: ["user": "ada"])
        await host.send(AsyncModuleEvent.custom(name: "willLogout", payload: .null))

        let lines = await host.perform { host in (host.module(named: "memory-store") as? EventStore)?.lines }
        #expect(lines == ["sec: login ada"])
        let flushed = await host.perform { host in (host.module(named: "audit") as? AuditModule)?.flushed }
        #expect(flushed == true)
        #expect(host.bus.access(TokenCache.self) != nil)
        // docs: "Module info" shows this instance's info payload at this point.
        let shown = try #require(try MarkdownBlock.blocks(of: "docs/modules.md").first {
            $0.language == "json" && $0.body.contains("\"instance\"")
        })
        let documented = try JSONDecoder().decode(JSONValue.self, from: Data(shown.body.utf8))
        #expect(await host.infoPayload() == documented, "\(shown.location)")
        #expect(await host.moduleNames == ["memory-store", "audit"])

        // Removing the prefix makes updateConfiguration return nil: the module goes.
        await host.updateSettings(["memory-store": ModuleSettings(order: 0), "audit": ModuleSettings(order: 10)])
        #expect(await host.moduleNames == ["memory-store"])

        // Hot replace keeps the store's lines.
        await host.replace(with: [ModuleFactory(MemoryStoreModule.self, plugin: "Store")], replacing: ["memory-store"])
        let kept = await host.perform { host in (host.module(named: "memory-store") as? EventStore)?.lines }
        #expect(kept == ["sec: login ada"])
        await host.shutdown()
    }

    // docs: "Threading rules".
    @Test(.timeLimit(.minutes(1)))
    func aTaskUsingHostRunsOnTheHost() async {
        let recorder = Recorder()
        let host = HostInstance(name: "tasks")
        await host.add([
            ModuleFactory(name: "refreshing", version: "1") { _, _ in RefreshingModule() },
            probe("listener", order: 1, recorder: recorder, behavior: ProbeBehavior(notifications: ["token.refreshed"])),
        ])
        await host.start()
        // The notification the task posted through the host reached the listener.
        await recorder.wait { $0.contains("listener.token.refreshed(null)") }
        #expect(recorder.starting(with: "listener.token.refreshed") == ["listener.token.refreshed(null)"])
        await host.shutdown()
    }

    // docs: "Observing from outside the host".
    @Test(.timeLimit(.minutes(1)))
    func observingFromOutsideTheHost() async {
        let host = HostInstance(name: "outside")
        let ui = DispatchQueue(label: "ui")
        let names = host.observeModules { $0.moduleName }  // from any thread
        let done = Recorder()
        let onUI = DispatchSpecificKey<Bool>()
        ui.setSpecific(key: onUI, value: true)
        names.observeOn { ui.async(execute: $0) }.subscribe { names in
            done.record((DispatchQueue.getSpecific(key: onUI) == true ? "" : "off the queue: ") + names.joined(separator: ","))
        }
        await host.add([ModuleFactory(MemoryStoreModule.self)])
        for await current in names.values where current.contains("memory-store") { break }
        // The subscriber ran on the queue it asked for, with the names of the host's modules.
        await done.wait { $0.contains("memory-store") }
        #expect(done.all.last == "memory-store")
        await host.shutdown()
    }
}
