import Dispatch
import Glibc
import ModuleKit
import Synchronization
import Testing

/// One subscription raced against a `dispose()` made on another thread.
///
/// The disposer calls `dispose()` while the observer's `target`-th call is in flight: that
/// call waits (boundedly) until `dispose()` has been entered, then does a little work. The
/// observer counts a call as late when `dispose()` had already returned when the call
/// started, or returned while the call was still running.
final class DisposeRace: Sendable {
    let target: Int
    let started = Atomic<Int>(0)
    let calls = Atomic<Int>(0)
    let lateCalls = Atomic<Int>(0)
    let disposeEntered = Atomic<Bool>(false)
    let disposeReturned = Atomic<Bool>(false)
    /// Set when the emitting side has finished: the disposer stops waiting for calls.
    let emitterDone = Atomic<Bool>(false)
    private let work = Atomic<Int>(0)

    init(target: Int) { self.target = target }

    /// The observer's body.
    func observe() {
        let number = started.add(1, ordering: .acquiringAndReleasing).newValue
        let lateAtStart = disposeReturned.load(ordering: .acquiring)
        if number == target {
            var spins = 0
            while !disposeEntered.load(ordering: .acquiring), spins < 100_000 {
                sched_yield()
                spins += 1
            }
        }
        for _ in 0..<256 { work.add(1, ordering: .relaxed) }
        if lateAtStart || disposeReturned.load(ordering: .acquiring) { lateCalls.add(1, ordering: .relaxed) }
        calls.add(1, ordering: .releasing)
    }

    /// Disposes of `subscription` on `queue` once the observer's `target`-th call has
    /// started (or the emitter is done), then records that `dispose()` returned. Resumes
    /// when done.
    func dispose(_ subscription: any Disposable, on queue: DispatchQueue) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            queue.async {
                while self.started.load(ordering: .acquiring) < self.target, !self.emitterDone.load(ordering: .acquiring) {
                    sched_yield()
                }
                self.disposeEntered.store(true, ordering: .releasing)
                subscription.dispose()
                self.disposeReturned.store(true, ordering: .releasing)
                continuation.resume()
            }
        }
    }
}

/// Totals over many rounds of `DisposeRace`.
struct DisposeRaceTotals {
    var calls = 0
    var lateCalls = 0
}

/// "Once `dispose()` returns, the observer is never called again, from any thread": every
/// subscription kind, raced against a dispose from another thread while the host emits.
@Suite("Dispose races", .timeLimit(.minutes(5)), .serialized)
struct DisposeRaceTests {
    static let rounds = 600
    static let updatesPerRound = 6

    /// Runs `rounds` rounds on one host: subscribe with `subscribe` (whose observer must
    /// call `race.observe()`), let the host emit `updatesPerRound` times (each `add` of a
    /// module is one emission) while another thread disposes after a varying number of
    /// calls, then drain the delivery with `drain` and remove the round's modules.
    func race(
        subscribe: (HostInstance, DisposeRace) async -> any Disposable,
        drain: () async -> Void = {}
    ) async -> DisposeRaceTotals {
        let host = makeHost("dispose-race")
        await host.add([special("base")])
        let disposer = DispatchQueue(label: "disposer")
        var totals = DisposeRaceTotals()
        for round in 0..<Self.rounds {
            // The first value (at subscription) is call 1; each add makes one more.
            let race = DisposeRace(target: 2 + round % Self.updatesPerRound)
            let subscription = await subscribe(host, race)
            let names = (0..<Self.updatesPerRound).map { "r\(round)-\($0)" }
            async let disposed: Void = race.dispose(subscription, on: disposer)
            // Each new module sorts first (lower order): every add changes every observed value.
            for (index, name) in names.enumerated() {
                await host.add([special(name, order: -(round * (Self.updatesPerRound + 1) + index + 1))])
            }
            race.emitterDone.store(true, ordering: .releasing)
            await disposed
            // Emissions after dispose() returned must not reach the observer either.
            await host.add([special("r\(round)-late", order: -(round + 1) * (Self.updatesPerRound + 1))])
            await drain()
            await host.remove(moduleNamed: names + ["r\(round)-late"])
            totals.calls += race.calls.load(ordering: .acquiring)
            totals.lateCalls += race.lateCalls.load(ordering: .acquiring)
        }
        await host.shutdown()
        return totals
    }

    @Test(.timeLimit(.minutes(5)))
    func observeModulesIsNeverCalledAfterDisposeReturns() async {
        let totals = await race { host, race in
            await host.perform { host in
                host.moduleManager.observeModules { $0.moduleName }.subscribe { _ in race.observe() }
            }
        }
        #expect(totals.calls >= Self.rounds, "the observers ran")
        #expect(totals.lateCalls == 0, "observer calls made or still running after dispose() returned")
    }

    @Test(.timeLimit(.minutes(5)))
    func mappedObserveModuleIsNeverCalledAfterDisposeReturns() async {
        let totals = await race { host, race in
            await host.perform { host in
                // The first module by order changes with every add: one emission per update.
                host.moduleManager.observeModules { $0.moduleName }.map { $0.first ?? "" }.subscribe { _ in race.observe() }
            }
        }
        #expect(totals.calls >= Self.rounds, "the observers ran")
        #expect(totals.lateCalls == 0, "observer calls made or still running after dispose() returned")
    }

    @Test(.timeLimit(.minutes(5)))
    func observeModuleIsNeverCalledAfterDisposeReturns() async {
        let totals = await race { host, race in
            await host.perform { host in
                host.moduleManager.observeModule(Special.self).subscribe { _ in race.observe() }
            }
        }
        #expect(totals.calls >= Self.rounds, "the observers ran")
        #expect(totals.lateCalls == 0, "observer calls made or still running after dispose() returned")
    }

    @Test(.timeLimit(.minutes(5)))
    func observeOnIsNeverCalledAfterDisposeReturns() async {
        let queue = DispatchQueue(label: "observer")
        let totals = await race(
            subscribe: { host, race in
                let subscription = host.observeModules { $0.moduleName }.observeOn { queue.async(execute: $0) }.subscribe { _ in race.observe() }
                // The subscription is made on the host shortly after subscribe returns: wait
                // for the first value.
                while race.started.load(ordering: .acquiring) == 0 {
                    await host.perform { _ in }
                    await drained(queue)
                }
                return subscription
            },
            drain: {
                await drained(queue)
            })
        #expect(totals.calls >= Self.rounds, "the observers ran")
        #expect(totals.lateCalls == 0, "observer calls made or still running after dispose() returned")
    }

    // A pending getModule completion runs when the update in progress completes; a dispose
    // from another thread while it runs returns only after it has returned.
    @Test(.timeLimit(.minutes(5)))
    func getModuleCompletionIsNeverRunningAfterDisposeReturns() async {
        let host = makeHost("dispose-race")
        await host.add([special("base")])
        let disposer = DispatchQueue(label: "disposer")
        var calls = 0, lateCalls = 0
        for round in 0..<200 {
            let recorder = Recorder()
            var behavior = ProbeBehavior()
            behavior.blockOn = ["willUnload"]
            let name = "g\(round)"
            await host.add([probe(name, recorder: recorder, behavior: behavior)])
            // The removal waits in willUnload: the modules are not ready meanwhile.
            let removal = Task { await host.remove(moduleNamed: [name]) }
            await recorder.wait { $0.contains("\(name).willUnload") }
            let race = DisposeRace(target: 1)
            let pending = await host.perform { host in
                host.moduleManager.getModule(transform: { $0.moduleName }) { _ in race.observe() }
            }
            async let disposed: Void = race.dispose(pending, on: disposer)
            behavior.gate.open()
            await removal.value
            race.emitterDone.store(true, ordering: .releasing)
            await disposed
            calls += race.calls.load(ordering: .acquiring)
            lateCalls += race.lateCalls.load(ordering: .acquiring)
        }
        await host.shutdown()
        #expect(calls > 0, "some completions ran before they were disposed of")
        #expect(lateCalls == 0, "completions made or still running after dispose() returned")
    }

    // A dispose made inside the observer, on the thread running it, returns at once (it does
    // not wait for the call it is part of) and no later emission reaches the observer.
    @Test(.timeLimit(.minutes(1)))
    func disposeFromInsideTheObserverReturnsAndStopsLaterCalls() async {
        let host = makeHost()
        await host.add([special("a")])
        let calls = Atomic<Int>(0)
        let holder = Mutex<(any Disposable)?>(nil)
        let subscription = await host.perform { host in
            host.moduleManager.observeModules { $0.moduleName }.subscribe { _ in
                calls.add(1, ordering: .relaxed)
                holder.withLock { $0 }?.dispose()
            }
        }
        holder.withLock { $0 = subscription }
        await host.add([special("b")])
        #expect(subscription.isDisposed)
        await host.add([special("c")])
        #expect(calls.load(ordering: .relaxed) == 2, "the first value, then the one whose observer disposed")

        // The same through observeOn: the dispose runs on the observer's queue.
        let queue = DispatchQueue(label: "observer")
        let relayed = Mutex<(any Disposable)?>(nil)
        let relayedCalls = Atomic<Int>(0)
        let subscribed = host.observeModules { $0.moduleName }.observeOn { queue.async(execute: $0) }.subscribe { _ in
            relayedCalls.add(1, ordering: .relaxed)
            relayed.withLock { $0 }?.dispose()
        }
        relayed.withLock { $0 = subscribed }
        // The first value may reach the observer before `relayed` is set: emit until a call
        // has disposed (the first after `relayed` is set does).
        var extra = 0
        while !subscribed.isDisposed {
            await host.add([special("x\(extra)")])
            await drained(queue)
            extra += 1
        }
        let made = relayedCalls.load(ordering: .relaxed)
        await host.add([special("e")])
        await drained(queue)
        #expect(relayedCalls.load(ordering: .relaxed) == made, "nothing after the observer disposed")
        await host.shutdown()
    }
}

/// Waits until every block queued on `queue` so far has run.
func drained(_ queue: DispatchQueue) async {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        queue.async { continuation.resume() }
    }
}
