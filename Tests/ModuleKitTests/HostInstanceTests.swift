import Dispatch
import ModuleKit
import Synchronization
import Testing

/// Notifications, module info, logging, thread-safe snapshots and instance isolation.
@Suite("Host instance", .timeLimit(.minutes(5)))
struct HostInstanceTests {
    // "A module declares the extra notification names it listens to ... and receives only
    // those; the host and the modules can post them with a payload."
    @Test func notificationsReachOnlyTheModulesListeningToThem() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([
            probe("a", order: 0, recorder: recorder, behavior: ProbeBehavior(notifications: ["cache.flush"])),
            probe("b", order: 1, recorder: recorder, behavior: ProbeBehavior(notifications: ["user.login", "cache.flush"])),
            probe("c", order: 2, recorder: recorder),
        ])
        await host.start()
        recorder.clear()
        await host.post(notification: "cache.flush", payload: ["reason": "test"])
        await host.post(notification: "user.login")
        await host.post(notification: "unheard")
        #expect(recorder.all == [
            "a.cache.flush({\"reason\":\"test\"})", "b.cache.flush({\"reason\":\"test\"})", "b.user.login(null)",
        ])
    }

    // Modules post too: a module's handler posting a notification reaches the listeners.
    @Test func aModuleCanPostANotificationToOthers() async {
        let recorder = Recorder()
        let host = makeHost()
        let poster = ModuleFactory(name: "poster", version: "1") { _, _ in Poster() }
        await host.add([poster, probe("listener", order: 1, recorder: recorder, behavior: ProbeBehavior(notifications: ["hello"]))])
        await host.start()
        recorder.clear()
        await host.send(ModuleEvent.custom(name: "go", payload: .null), to: "poster")
        #expect(recorder.all == ["listener.hello(\"from poster\")"])
    }

    // A fan-out goes to the modules running when it began: modules a handler adds during it
    // (ordered before or after the handler's module) do not get that event, and every other
    // module gets it exactly once (the cached module list must follow the change).
    @Test func modulesAddedDuringAFanOutDoNotGetThatEventAndTheOthersGetItOnce() async {
        let recorder = Recorder()
        let host = makeHost()
        let adder = ModuleFactory(name: "adder", version: "1", defaultOrder: 5) { _, _ in
            Adder(adding: [probe("early", order: 0, recorder: recorder), probe("late", order: 9, recorder: recorder)])
        }
        await host.add([probe("a", order: 1, recorder: recorder), adder, probe("z", order: 8, recorder: recorder)])
        await host.start()
        recorder.clear()
        await host.send(ModuleEvent.custom(name: "tick", payload: .null))
        #expect(recorder.all == ["a.tick(null)", "early.init", "late.init", "early.start", "late.start", "z.tick(null)"])
        recorder.clear()
        await host.send(ModuleEvent.custom(name: "tick", payload: .null))
        #expect(recorder.all == ["early.tick(null)", "a.tick(null)", "z.tick(null)", "late.tick(null)"])
    }

    // postFromAnywhere is usable from any thread and keeps the order of one poster.
    @Test(.timeLimit(.minutes(1)))
    func postFromAnywhereDeliversInOrderOnTheHost() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([probe("a", recorder: recorder, behavior: ProbeBehavior(notifications: ["n"]))])
        await host.start()
        recorder.clear()
        DispatchQueue.global().async {
            for index in 0..<50 { host.postFromAnywhere(notification: "n", payload: .number(Double(index))) }
            host.sendFromAnywhere(.custom(name: "end", payload: .null))
        }
        await recorder.wait { $0.count == 51 }
        #expect(recorder.all == (0..<50).map { "a.n(\($0))" } + ["a.end(null)"])
    }

    // At most 65,536 messages from anywhere wait for delivery: a poster faster than its host
    // (here while the host is busy) loses the rest, and once the queue drains, messages
    // are delivered again (outside attack: a flood from a module's task grew the daemon
    // by 30 MB a second without bound).
    // While a flood goes on, what is dropped is said at most once a second (found from
    // outside: a warning per dropped message, 25,000 lines in 20 s).
    @Test(.timeLimit(.minutes(2)))
    func aFloodFromAnywhereIsSaidAtMostOnceASecond() async {
        let records = WarningRecorder(containing: "from other threads")
        LoggingSystem.bootstrap(records, level: .info)
        defer { LoggingSystem.bootstrap(StandardErrorBackend(), level: .info) }
        let recorder = Recorder()
        let host = makeHost()
        await host.add([probe("a", recorder: recorder, behavior: ProbeBehavior(notifications: ["n"]))])
        await host.start()
        let clock = ContinuousClock()
        let started = clock.now
        let done = Recorder()
        DispatchQueue.global().async {
            for index in 0..<400_000 { host.postFromAnywhere(notification: "n", payload: .number(Double(index))) }
            done.record("done")
        }
        await done.wait { !$0.isEmpty }
        let seconds = Int((clock.now - started).components.seconds)
        let said = records.kept()
        #expect(!said.isEmpty, "the flood dropped nothing")
        #expect(said.count <= seconds + 2, "\(said.count) warnings in \(seconds) s")
        await host.shutdown()
    }

    @Test(.timeLimit(.minutes(2)))
    func messagesFromAnywhereBeyondTheMailboxLimitAreDropped() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([probe("a", recorder: recorder, behavior: ProbeBehavior(notifications: ["n"]))])
        await host.start()
        recorder.clear()
        let limit = 65_536
        await host.perform { host in
            for index in 0..<(limit + 1000) { host.postFromAnywhere(notification: "n", payload: .number(Double(index))) }
        }
        // Sent once the queue has drained (before, it would be dropped too).
        await recorder.wait { $0.count >= limit }
        host.sendFromAnywhere(.custom(name: "end", payload: .null))
        await recorder.wait { $0.last == "a.end(null)" }
        // The first of them may have gone straight to the delivering task, if it waited
        // already: the queue held the next 65,536 then.
        let delivered = recorder.starting(with: "a.n(")
        #expect(delivered.count == limit || delivered.count == limit + 1, "\(delivered.count)")
        #expect(delivered == (0..<delivered.count).map { "a.n(\($0))" })
    }

    // Name, version and metadata per module, and the host's info payload of all of them as
    // JSON (docs/modules.md, "Module info").
    @Test func infosAndThePayloadListTheRunningModulesInOrder() async throws {
        let host = makeHost("infos")
        await host.add([
            probe("cards", order: 1, recorder: Recorder(), behavior: ProbeBehavior(version: "2.1.0", metadata: ["cardTypes": ["carousel", "stack"]])),
            probe("analytics", order: 0, recorder: Recorder(), behavior: ProbeBehavior(version: "3.0.0")),
        ])
        let infos = await host.infos()
        #expect(infos == [
            ModuleInfo(name: "analytics", version: "3.0.0"),
            ModuleInfo(name: "cards", version: "2.1.0", metadata: ["cardTypes": ["carousel", "stack"]]),
        ])
        let payload = await host.infoPayload()
        #expect(payload.jsonText == """
            {"instance":"infos","modules":[{"metadata":{},"name":"analytics","version":"3.0.0"},\
            {"metadata":{"cardTypes":["carousel","stack"]},"name":"cards","version":"2.1.0"}]}
            """)
    }

    // The registered modules as of the last update, readable from any thread without
    // waiting for the instance: what a control plane shows while an update waits on a module.
    @Test(.timeLimit(.minutes(1)))
    func theRegisteredSnapshotIsReadableWhileAnUpdateWaitsOnAModule() async {
        let recorder = Recorder()
        let gate = Gate()
        let host = makeHost()
        await host.add([
            probe("a", order: 0, recorder: recorder, behavior: ProbeBehavior(blockOn: ["willUnload"], gate: gate)),
            probe("b", order: 1, recorder: recorder),
        ])
        #expect(host.registeredModulesSnapshot == (await host.registeredModules()))
        let removal = Task { await host.remove(moduleNamed: ["a"]) }
        await recorder.wait { $0.contains("a.willUnload") }
        // The update is suspended inside a's handler; the snapshot still answers at once.
        #expect(host.registeredModulesSnapshot.map(\.name) == ["a", "b"])
        #expect(host.registeredModulesSnapshot.allSatisfy { $0.running })
        gate.open()
        await removal.value
        #expect(host.registeredModulesSnapshot.map(\.name) == ["b"])
        #expect(host.registeredModulesSnapshot == (await host.registeredModules()))
    }

    // Adds one at a time (as a plugin set adds its plugins) keep the modules and the
    // registered snapshot in (order, name) order, equal to what a full rebuild gives: also
    // for equal orders, a disabled module, one that refuses to be created, and a name
    // registered again once it is enabled.
    @Test func modulesAddedOneByOneStayInOrderAndTheSnapshotMatchesTheRegisteredModules() async {
        let recorder = Recorder()
        let host = makeHost(settings: ["off": ModuleSettings(enabled: false), "late": ModuleSettings(order: -5)])
        await host.start()
        let orders = [7, 3, 3, 9, 0, 3, 7, -1, 5, 3]
        for (index, order) in orders.enumerated() {
            await host.add([probe("m\(index)", order: order, recorder: recorder)])
            #expect(host.registeredModulesSnapshot == (await host.registeredModules()))
        }
        await host.add([probe("off", order: 4, recorder: recorder), probe("late", order: 100, recorder: recorder),
                        ModuleFactory(name: "refuses", version: "1", defaultOrder: 2) { _, _ in nil }])
        #expect(host.registeredModulesSnapshot == (await host.registeredModules()))
        let expected = (orders.enumerated().map { ($0.element, "m\($0.offset)") } + [(-5, "late")])
            .sorted { ($0.0, $0.1) < ($1.0, $1.1) }.map(\.1)
        #expect(await host.moduleNames == expected)
        #expect(host.registeredModulesSnapshot.filter { !$0.running }.map(\.name) == ["refuses", "off"])
        await host.updateSettings(["late": ModuleSettings(order: -5)])
        #expect(host.registeredModulesSnapshot.first { $0.name == "off" }?.running == true)
        #expect(host.registeredModulesSnapshot == (await host.registeredModules()))
        await host.add([probe("refuses", order: 1, recorder: recorder)])
        #expect(host.registeredModulesSnapshot == (await host.registeredModules()))
        #expect(host.registeredModulesSnapshot.first { $0.name == "refuses" }?.running == true)
    }

    // "errors they report are logged with the module's name": the logger a module gets
    // carries its name and the instance's.
    @Test func aModuleLoggerCarriesTheModuleAndInstanceNames() {
        let host = makeHost("logs")
        let logger = host.logger(for: "cards")
        #expect(logger.metadata.contains { $0 == ("module", "cards") })
        #expect(logger.metadata.contains { $0 == ("instance", "logs") })
    }

    // The snapshot of running names is readable from any thread (C has_module callbacks).
    @Test func runningModuleNamesIsASnapshotReadableFromAnyThread() async {
        let host = makeHost()
        #expect(host.runningModuleNames.isEmpty)
        await host.add([probe("a", recorder: Recorder()), probe("b", order: 1, recorder: Recorder())])
        let seen = await Task.detached { (host.runningModuleNames, host.isRunning(moduleNamed: "b"), host.isRunning(moduleNamed: "x")) }.value
        #expect(seen.0 == ["a", "b"] && seen.1 && !seen.2)
        await host.remove(moduleNamed: ["b"])
        #expect(!host.isRunning(moduleNamed: "b"))
    }

    // The snapshot is current in the middle of an update: a module being initialized sees the
    // modules created with it; a module being deinitialized no longer counts as running.
    @Test func runningModuleNamesIsCurrentDuringAnUpdate() async {
        let recorder = Recorder()
        let host = makeHost()
        let asker = ModuleFactory(name: "asker", version: "1") { _, _ in RunningChecker(recorder: recorder) }
        await host.add([asker, probe("later", order: 1, recorder: Recorder())])
        await host.remove(moduleNamed: ["asker"])
        #expect(recorder.all == ["init: later=true asker=true", "deinit: asker=false later=true"])
    }

    // A host instance and its modules are released once shut down and no longer referenced.
    @Test(.timeLimit(.minutes(1)))
    func aShutDownInstanceIsReleased() async {
        weak var weakHost: HostInstance?
        let live = LiveCount()
        do {
            let host = makeHost()
            weakHost = host
            await host.add([ModuleFactory(name: "tracked", version: "1") { _, _ in LifetimeModule(live) }])
            await host.start()
            #expect(live.value.load(ordering: .relaxed) == 1)
            await host.perform { host in
                // An observer capturing the host makes a cycle that shutdown breaks.
                host.moduleManager.observeModules { $0 as? LifetimeModule }.subscribe { _ in _ = host.name }
            }
            await host.shutdown()
        }
        while weakHost != nil || live.value.load(ordering: .relaxed) != 0, !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(2))
        }
        #expect(weakHost == nil && live.value.load(ordering: .relaxed) == 0)
    }

    // "the same plugin used by two instances gets separate module objects and state; events,
    // notifications and Bus contents of one never reach the other."
    @Test func twoInstancesStayIsolated() async {
        let first = Recorder()
        let second = Recorder()
        let hostOne = makeHost("one")
        let hostTwo = makeHost("two")
        let shared = ModuleFactory(name: "shared", version: "1", plugin: "common") { host, _ in
            Probe(name: "shared", recorder: host.name == "one" ? first : second, behavior: ProbeBehavior(notifications: ["n"]))
        }
        await hostOne.add([shared])
        await hostTwo.add([shared])
        await hostOne.start()
        await hostTwo.start()
        let tagOne = await hostOne.perform { host in tags(host.moduleManager.modules) }
        let tagTwo = await hostTwo.perform { host in tags(host.moduleManager.modules) }
        #expect(tagOne != tagTwo, "separate module objects")

        await hostOne.post(notification: "n", payload: 1)
        await hostTwo.send(ModuleEvent.custom(name: "only-two", payload: .null))
        await hostOne.send(AsyncModuleEvent.custom(name: "only-one", payload: .null))
        #expect(first.all == ["shared.init", "shared.start", "shared.n(1)", "shared.only-one", "shared.only-one.done"])
        #expect(second.all == ["shared.init", "shared.start", "shared.only-two(null)"])

        hostOne.bus.install(Counter(value: 1))
        #expect(hostOne.bus.access(Counter.self)?.value == 1)
        #expect(hostTwo.bus.access(Counter.self) == nil)

        let emissions = Recorder()
        await hostTwo.perform { host in
            host.moduleManager.observeModules { $0 as? Probe }.subscribe { emissions.record("two:\($0.count)") }
        }
        await hostOne.remove(moduleNamed: ["shared"])
        #expect(emissions.all == ["two:1"], "an update of one instance does not notify the other's observers")
        #expect(hostTwo.runningModuleNames == ["shared"])
    }

    // The Bus of an instance is emptied, in reverse order with hooks, when it shuts down.
    @Test func shutdownUninstallsTheInstanceBus() async {
        let recorder = Recorder()
        let host = makeHost()
        host.bus.install(HookedValue(Counter(value: 1)).preUninstall { _ in recorder.record("counter") })
        host.bus.install(HookedValue("text").preUninstall { _ in recorder.record("text") })
        await host.shutdown()
        #expect(recorder.all == ["text", "counter"])
        #expect(host.bus.count == 0)
    }
}

/// Posts "hello" when it receives the custom event "go".
final class Poster: Module {
    var moduleName: String { "poster" }
    var info: ModuleInfo { ModuleInfo(name: "poster", version: "1") }
    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        if case .custom("go", _) = event { host.post(notification: "hello", payload: "from poster") }
    }
}

/// Adds its factories on the first custom event it handles.
final class Adder: Module {
    var adding: [ModuleFactory]
    init(adding: [ModuleFactory]) { self.adding = adding }
    var moduleName: String { "adder" }
    var info: ModuleInfo { ModuleInfo(name: "adder", version: "1") }
    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        guard case .custom = event, !adding.isEmpty else { return }
        host.add(adding)
        adding = []
    }
}

/// Reports what `isRunning` says during its own `.initialize` and `.deinitialize`.
final class RunningChecker: Module {
    let recorder: Recorder
    init(recorder: Recorder) { self.recorder = recorder }
    var moduleName: String { "asker" }
    var info: ModuleInfo { ModuleInfo(name: "asker", version: "1") }
    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        switch event {
        case .initialize:
            recorder.record("init: later=\(host.isRunning(moduleNamed: "later")) asker=\(host.isRunning(moduleNamed: "asker"))")
        case .deinitialize:
            recorder.record("deinit: asker=\(host.isRunning(moduleNamed: "asker")) later=\(host.isRunning(moduleNamed: "later"))")
        default:
            break
        }
    }
}

/// Counts live `LifetimeModule`s (swift-atomics' LifetimeTracked idea).
final class LiveCount: Sendable {
    let value = Atomic<Int>(0)
}

final class LifetimeModule: Module {
    let live: LiveCount
    init(_ live: LiveCount) {
        self.live = live
        live.value.add(1, ordering: .relaxed)
    }
    deinit { live.value.subtract(1, ordering: .relaxed) }
    var moduleName: String { "tracked" }
    var info: ModuleInfo { ModuleInfo(name: "tracked", version: "1") }
}

struct Counter: Sendable, Equatable {
    var value: Int
}
