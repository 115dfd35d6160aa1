import Foundation
import ModuleKit
import Synchronization

/// Event fan-out and observable re-evaluation on one `HostInstance`, each against a plain
/// loop over the same module objects, run on the same actor in the same run.
///
/// `internal.` rows: Swift modules registered in process, not loaded from plugins (the peer
/// group times the plugins' path).
///
/// Every measurement runs on the host's context (functions with an `isolated HostInstance`
/// parameter), so neither side pays for a hop onto the actor: the rows compare the host's
/// dispatch with the direct protocol calls it stands for, like with like.
struct EventBenchmark {
    /// Modules receiving each event.
    let fanout = 100
    /// Modules the observable evaluates.
    let observed = 1000

    func run() async throws -> [BenchRow] {
        var rows: [BenchRow] = []

        let events = HostInstance(name: "bench-events")
        await events.add((0..<fanout).map { BenchModule.factory(index: $0, service: false) })
        await events.start()

        let sync = try await Self.syncFanout(host: events, modules: fanout, events: 20_000, repetitions: 7)
        rows.append(BenchRow(
            name: "internal.events.sync_fanout.per_module", value: sync.host, unit: "ns", baseline: sync.direct,
            baselineDescription: "direct module.handle(event, host:) on the same \(fanout) modules in a loop on the host's actor, median of 7",
            target: 3))

        let async = try await Self.asyncFanout(host: events, modules: fanout, events: 200, repetitions: 7)
        rows.append(BenchRow(
            name: "internal.events.async_fanout.per_module", value: async.host, unit: "ns", baseline: async.direct,
            baselineDescription: "direct `await module.handle(event, host:)` on the same \(fanout) modules (handler returns at once), on the host's actor, median of 7; target 100: a per-handler deadline needs each handler in its own Task, which alone costs ~40 direct calls (see internal.events.async_fanout.per_module_vs_task)",
            target: 100))
        rows.append(BenchRow(
            name: "internal.events.async_fanout.per_module_vs_task", value: async.host, unit: "ns", baseline: async.task,
            baselineDescription: "each handler awaited in its own Task on the host's actor (the least a per-handler deadline needs), same modules, median of 7; target 3: the handler task plus a timer and a race",
            target: 3))
        await events.shutdown()

        let observing = HostInstance(name: "bench-observe")
        // Every other module is a service: half the transformations succeed.
        await observing.add((0..<observed - 1).map { BenchModule.factory(index: $0, service: $0 % 2 == 0) })
        let observe = try await Self.observeReevaluation(host: observing, modules: observed, repetitions: 201)
        rows.append(BenchRow(
            name: "internal.modules.observe_reevaluation.n\(observed)", value: observe.host, unit: "us", baseline: observe.direct,
            baselineDescription: "modules.compactMap { $0 as? any BenchService } over the same \(observed) modules on the host's actor, median of 201",
            target: 3))
        await observing.shutdown()
        return rows
    }

    /// Nanoseconds per module per event: `host.send(.custom)` against a loop of direct
    /// `handle` calls on `host.moduleManager.modules`. Checks that every module received
    /// every event.
    static func syncFanout(host: isolated HostInstance, modules count: Int, events: Int, repetitions: Int) throws
        -> (host: Double, direct: Double)
    {
        let event = ModuleEvent.custom(name: "tick", payload: .null)
        let modules = host.moduleManager.modules
        guard modules.count == count else { throw BenchError("expected \(count) modules, got \(modules.count)") }
        let before = received(modules)
        var hostTimes: [Double] = [], directTimes: [Double] = []
        for _ in 0..<repetitions {
            directTimes.append(seconds {
                for _ in 0..<events {
                    for module in modules { module.handle(event, host: host) }
                }
            })
            hostTimes.append(seconds {
                for _ in 0..<events { host.send(event) }
            })
        }
        let expected = 2 * repetitions * events
        for module in modules {
            let got = (module as! BenchModule).received - before[ObjectIdentifier(module)]!
            guard got == expected else { throw BenchError("\(module.moduleName) received \(got) events, expected \(expected)") }
        }
        let calls = Double(count * events)
        return (median(hostTimes) / calls * 1e9, median(directTimes) / calls * 1e9)
    }

    /// Nanoseconds per module per event: `await host.send(AsyncModuleEvent.custom)` against
    /// direct awaited calls of the same handlers, and against each handler awaited in its
    /// own `Task`.
    static func asyncFanout(host: isolated HostInstance, modules count: Int, events: Int, repetitions: Int) async throws
        -> (host: Double, direct: Double, task: Double)
    {
        let event = AsyncModuleEvent.custom(name: "flush", payload: .null)
        let modules = host.moduleManager.modules
        guard modules.count == count else { throw BenchError("expected \(count) modules, got \(modules.count)") }
        let before = received(modules)
        var hostTimes: [Double] = [], directTimes: [Double] = [], taskTimes: [Double] = []
        for _ in 0..<repetitions {
            var start = monotonicNanoseconds()
            for _ in 0..<events {
                for module in modules { await module.handle(event, host: host) }
            }
            directTimes.append(Double(monotonicNanoseconds() - start) / 1e9)

            start = monotonicNanoseconds()
            for _ in 0..<events {
                for module in modules {
                    // Isolated to `host` like the host's own handler tasks.
                    await Task {
                        _ = host
                        await module.handle(event, host: host)
                    }.value
                }
            }
            taskTimes.append(Double(monotonicNanoseconds() - start) / 1e9)

            start = monotonicNanoseconds()
            for _ in 0..<events { await host.send(event) }
            hostTimes.append(Double(monotonicNanoseconds() - start) / 1e9)
        }
        let expected = 3 * repetitions * events
        for module in modules {
            let got = (module as! BenchModule).received - before[ObjectIdentifier(module)]!
            guard got == expected else { throw BenchError("\(module.moduleName) received \(got) events, expected \(expected)") }
        }
        let calls = Double(count * events)
        return (median(hostTimes) / calls * 1e9, median(directTimes) / calls * 1e9, median(taskTimes) / calls * 1e9)
    }

    /// Microseconds of one `observeModules` re-evaluation with `count` modules: from the
    /// `.initialize` of a module just added (the last step of the update) to the emission
    /// that includes it, against one `compactMap` cast over the same modules. Between
    /// samples the added module is removed again (not timed).
    static func observeReevaluation(host: HostInstance, modules count: Int, repetitions: Int) async throws
        -> (host: Double, direct: Double)
    {
        let stamps = Stamps()
        let subscription = await host.perform { host in
            host.moduleManager.observeModules { $0 as? any BenchService }
                .subscribe { services in stamps.emitted(services.count) }
        }
        var hostTimes: [Double] = [], directTimes: [Double] = []
        for sample in 0..<repetitions {
            let name = "probe\(sample)"
            await host.add([ProbeModule.factory(name: name, stamps: stamps)])
            let (changed, emitted, emittedCount) = (stamps.changed.load(ordering: .acquiring),
                                                    stamps.emittedAt.load(ordering: .acquiring),
                                                    stamps.emittedCount.load(ordering: .acquiring))
            guard changed != 0, emitted > changed else { throw BenchError("no emission after adding \(name)") }
            hostTimes.append(Double(emitted - changed) / 1e9)

            let direct = try await host.perform { host in
                let modules = host.moduleManager.modules
                guard modules.count == count else { throw BenchError("expected \(count) modules, got \(modules.count)") }
                let start = monotonicNanoseconds()
                let services = modules.compactMap { $0 as? any BenchService }
                let elapsed = monotonicNanoseconds() - start
                guard services.count == emittedCount else {
                    throw BenchError("compactMap found \(services.count) services, the observable emitted \(emittedCount)")
                }
                return Double(elapsed) / 1e9
            }
            directTimes.append(direct)
            await host.remove(moduleNamed: [name])
        }
        subscription.dispose()
        return (median(hostTimes) * 1e6, median(directTimes) * 1e6)
    }

    /// Events received so far, per module object.
    static func received(_ modules: [any Module]) -> [ObjectIdentifier: Int] {
        Dictionary(uniqueKeysWithValues: modules.map { (ObjectIdentifier($0), ($0 as! BenchModule).received) })
    }
}

/// What the observable benchmark looks for among the modules.
protocol BenchService: AnyObject {}

/// A module whose handlers count what they receive: the least work the optimiser must keep.
class BenchModule: Module {
    let moduleName: String
    /// Unchecked: a dynamic exclusivity check would cost more than the rest of the call
    /// and hide the dispatch the rows compare. Only touched on the host's context.
    @exclusivity(unchecked) var received = 0

    init(name: String) { moduleName = name }

    var info: ModuleInfo { ModuleInfo(name: moduleName, version: "1.0") }

    func handle(_ event: ModuleEvent, host: isolated HostInstance) { received &+= 1 }

    func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async { received &+= 1 }

    /// A factory for module `index` (order = index), a `BenchService` when `service` is true.
    static func factory(index: Int, service: Bool) -> ModuleFactory {
        let name = String(format: "m%04d", index)
        return ModuleFactory(name: name, version: "1.0", defaultOrder: index) { _, _ in
            service ? BenchServiceModule(name: name) : BenchModule(name: name)
        }
    }
}

final class BenchServiceModule: BenchModule, BenchService {}

/// The module added to change the set: stamps the clock on `.initialize`, the last thing
/// the host does before it evaluates the observables.
final class ProbeModule: BenchModule, BenchService {
    let stamps: Stamps

    init(name: String, stamps: Stamps) {
        self.stamps = stamps
        super.init(name: name)
    }

    override func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        if event == .initialize { stamps.changed.store(monotonicNanoseconds(), ordering: .releasing) }
    }

    /// Ordered after every other module.
    static func factory(name: String, stamps: Stamps) -> ModuleFactory {
        ModuleFactory(name: name, version: "1.0", defaultOrder: Int.max) { _, _ in ProbeModule(name: name, stamps: stamps) }
    }
}

/// Clock readings shared between the probe module, the observer and the benchmark.
final class Stamps: Sendable {
    let changed = Atomic<UInt64>(0)
    let emittedAt = Atomic<UInt64>(0)
    let emittedCount = Atomic<Int>(0)

    func emitted(_ count: Int) {
        emittedAt.store(monotonicNanoseconds(), ordering: .releasing)
        emittedCount.store(count, ordering: .releasing)
    }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
