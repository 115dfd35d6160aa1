import Dispatch
import ModuleKit
import Synchronization
import Testing

/// The host's watch of synchronous callbacks past the event deadline (`overdueHandler`).
///
/// Serialized: a callback that blocks holds a thread of Swift concurrency, and two at once
/// would hold every thread of a 2-CPU machine, the tests' own tasks included. The blocked
/// callbacks also give up after 30 s, so that a starved run ends.
@Suite("Handler watch", .timeLimit(.minutes(5)), .serialized)
struct HandlerWatchTests {
    /// `host.overdueHandler` once it names a callback, or nil after 20 s.
    static func overdue(_ host: HostInstance) async -> OverdueHandler? {
        let clock = ContinuousClock()
        let until = clock.now + .seconds(20)
        while clock.now < until {
            if let overdue = host.overdueHandler { return overdue }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return nil
    }

    // A synchronous handler past the event deadline cannot be interrupted: the host's watch
    // finds it (`overdueHandler` names the module, its plugin and the event; the overrun is
    // counted and said once) and says when it returns. The handler an event it sent ran
    // before it blocked does not lend it its name.
    @Test(.timeLimit(.minutes(1)))
    func aSynchronousHandlerPastTheDeadlineIsOverdueUntilItReturns() async {
        let host = makeHost(deadline: .milliseconds(200))
        let diagnostics = host.diagnostics()
        let gate = DispatchSemaphore(value: 0)
        let recorder = Recorder()
        await host.add([
            ModuleFactory(name: "blocker", version: "1", plugin: "Blocks") { _, _ in Blocker(gate: gate) },
            probe("other", order: 1, recorder: recorder),
        ])
        await host.start()
        let sent = Task { await host.send(ModuleEvent.custom(name: "block", payload: .null), to: "blocker") }
        let overdue = await Self.overdue(host)
        #expect(overdue?.module == "blocker" && overdue?.plugin == "Blocks" && overdue?.event == "block", "\(String(describing: overdue))")
        #expect((overdue?.elapsed ?? .zero) >= .milliseconds(200))
        #expect(recorder.all.contains("other.nested(null)"))
        #expect(host.metrics.module(named: "blocker").snapshot().deadlineOverruns == 1)
        gate.signal()
        await sent.value
        // Said when it returns, not at the next look (it was `stuck` meanwhile).
        #expect(host.overdueHandler == nil)
        #expect(host.metrics.module(named: "blocker").snapshot().deadlineOverruns == 1)
        #expect(host.metrics.module(named: "other").snapshot().deadlineOverruns == 0)
        await host.shutdown()
        var said: [String] = []
        for await diagnostic in diagnostics {
            switch diagnostic {
            case .deadlineExceeded(let module, let event, _): said.append("exceeded \(module) \(event)")
            case .finishedLate(let module, let event, _): said.append("late \(module) \(event)")
            default: break
            }
        }
        #expect(said == ["exceeded blocker block", "late blocker block"])
    }

    // A module's `info` is its own code: asked for by `infos()`, it is watched as a
    // handler is, and one that blocks past the deadline is overdue in `info`.
    @Test(.timeLimit(.minutes(1)))
    func anInfoThatBlocksPastTheDeadlineIsOverdue() async {
        let host = makeHost(deadline: .milliseconds(200))
        let gate = InfoGate()
        await host.add([ModuleFactory(name: "shy", version: "1", plugin: "Shy") { _, _ in ShyModule(gate: gate) }])
        await host.start()
        gate.closed.withLock { $0 = true }
        let asked = Task { await host.infos().map(\.name) }
        let overdue = await Self.overdue(host)
        #expect(overdue?.module == "shy" && overdue?.event == "info", "\(String(describing: overdue))")
        gate.open.signal()
        #expect(await asked.value == ["shy"])
        await host.shutdown()
    }

    // Handlers that return in time, however many, are never overdue.
    @Test func handlersThatReturnInTimeAreNeverOverdue() async {
        let host = makeHost(deadline: .milliseconds(50))
        let recorder = Recorder()
        await host.add([probe("a", recorder: recorder), probe("b", order: 1, recorder: recorder)])
        await host.start()
        let clock = ContinuousClock()
        let started = clock.now
        // Past several looks of the watch (a quarter of the deadline each).
        while clock.now - started < .milliseconds(300) {
            for _ in 0..<100 { await host.send(ModuleEvent.custom(name: "tick", payload: .null)) }
            #expect(host.overdueHandler == nil)
            recorder.clear()
        }
        #expect(host.metrics.module(named: "a").snapshot().deadlineOverruns == 0)
        #expect(host.metrics.module(named: "b").snapshot().deadlineOverruns == 0)
    }

}

/// Whether `ShyModule`'s info blocks, and what opens it.
final class InfoGate: Sendable {
    let closed = Mutex(false)
    let open = DispatchSemaphore(value: 0)
}

/// Its `info` blocks until `gate` opens, once `gate` is closed.
final class ShyModule: Module {
    let gate: InfoGate
    init(gate: InfoGate) { self.gate = gate }
    var moduleName: String { "shy" }
    var info: ModuleInfo {
        if gate.closed.withLock({ $0 }) { _ = gate.open.wait(timeout: .now() + 30) }
        return ModuleInfo(name: "shy", version: "1")
    }
}

/// On the custom event "block", sends "nested" to the module "other", then blocks its
/// thread until `gate` is signalled.
final class Blocker: Module {
    let gate: DispatchSemaphore
    init(gate: DispatchSemaphore) { self.gate = gate }
    var moduleName: String { "blocker" }
    var info: ModuleInfo { ModuleInfo(name: "blocker", version: "1") }
    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        guard case .custom("block", _) = event else { return }
        host.send(ModuleEvent.custom(name: "nested", payload: .null), to: "other")
        _ = gate.wait(timeout: .now() + 30)
    }
}

