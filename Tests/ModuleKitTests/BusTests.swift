import Dispatch
import Glibc
import ModuleKit
import Synchronization
import Testing

/// A service with all four hooks, recording them.
final class HookedService: Installable, Uninstallable {
    let name: String
    let recorder: Recorder
    init(_ name: String, _ recorder: Recorder) {
        self.name = name
        self.recorder = recorder
    }
    func preInstall(on bus: Bus) { recorder.record("\(name).preInstall(\(bus.label)) accessible=\(bus.access(HookedService.self) === self)") }
    func postInstall(on bus: Bus) { recorder.record("\(name).postInstall(\(bus.label)) accessible=\(bus.access(HookedService.self) === self)") }
    func preUninstall(from bus: Bus) { recorder.record("\(name).preUninstall(\(bus.label)) accessible=\(bus.access(HookedService.self) === self)") }
    func postUninstall(from bus: Bus) { recorder.record("\(name).postUninstall(\(bus.label)) accessible=\(bus.access(HookedService.self) === self)") }
}

final class OtherService: Installable, Uninstallable {
    let name: String
    let recorder: Recorder
    init(_ name: String, _ recorder: Recorder) {
        self.name = name
        self.recorder = recorder
    }
    func preUninstall(from bus: Bus) { recorder.record("\(name).preUninstall(\(bus.label))") }
    func postUninstall(from bus: Bus) { recorder.record("\(name).postUninstall(\(bus.label))") }
}

protocol KeyValueStore: Sendable {
    func value(for key: String) -> String?
}

final class MemoryStore: KeyValueStore {
    func value(for key: String) -> String? { key == "k" ? "v" : nil }
}

/// A bus with a type of its own.
final class AudioBus: SubBus, Uninstallable {
    let bus = Bus(label: "audio")
    let recorder: Recorder
    init(_ recorder: Recorder) { self.recorder = recorder }
    func preUninstall(from bus: Bus) { recorder.record("audio.preUninstall(\(bus.label))") }
    func postUninstall(from bus: Bus) { recorder.record("audio.postUninstall(\(bus.label))") }
}

@Suite("Bus", .timeLimit(.minutes(5)))
struct BusTests {
    // "install and uninstall any object or value; access by type (bus.access() as Foo?)".
    @Test func installAccessAndUninstallObjectsAndValuesByType() {
        let bus = Bus()
        let store = MemoryStore()
        #expect(bus.install(store))
        #expect(bus.install(Counter(value: 3)))
        #expect(bus.install("a string"))
        #expect((bus.access() as MemoryStore?) === store)
        #expect((bus.access() as Counter?) == Counter(value: 3))
        #expect(bus.access(String.self) == "a string")
        #expect((bus.access() as (any KeyValueStore)?)?.value(for: "k") == "v", "access by protocol")
        #expect(bus.access(Int.self) == nil)
        #expect(bus.uninstall(store))
        #expect(bus.access(MemoryStore.self) == nil)
        #expect(bus.uninstall(Counter(value: 99)), "a value is uninstalled by its type")
        #expect(bus.uninstall(type: String.self))
        #expect(bus.count == 0)
        #expect(!bus.uninstall(type: String.self))
    }

    // Installing a second item of a type replaces the first, which gets its uninstall hooks.
    @Test func installingTheSameTypeAgainReplacesTheOldItem() {
        let recorder = Recorder()
        let bus = Bus(label: "main")
        let first = OtherService("first", recorder)
        let second = OtherService("second", recorder)
        bus.install(first)
        bus.install(first)
        #expect(bus.count == 1 && recorder.all.isEmpty, "installing the same object again does nothing")
        bus.install(second)
        #expect(bus.access(OtherService.self) === second)
        #expect(recorder.all == ["first.preUninstall(main)", "first.postUninstall(main)"])
        #expect(!bus.uninstall(first), "a different object of the type is not uninstalled")
        #expect(bus.access(OtherService.self) === second)
    }

    // "pre/post install and uninstall hooks on objects that opt in".
    @Test func hooksRunInOrderAroundInstallAndUninstall() {
        let recorder = Recorder()
        let bus = Bus(label: "main")
        let service = HookedService("s", recorder)
        bus.install(service)
        bus.uninstall(service)
        #expect(recorder.all == [
            "s.preInstall(main) accessible=false", "s.postInstall(main) accessible=true",
            "s.preUninstall(main) accessible=true", "s.postUninstall(main) accessible=false",
        ])
    }

    // HookedValue adds hooks to a plain value; access finds the plain value.
    @Test func hookedValueAddsHooksToAPlainValue() {
        let recorder = Recorder()
        let bus = Bus(label: "main")
        bus.install(
            HookedValue(Counter(value: 7))
                .preInstall { recorder.record("preInstall(\($0.label)) present=\($0.access(Counter.self) != nil)") }
                .postInstall { recorder.record("postInstall present=\($0.access(Counter.self) != nil)") }
                .preUninstall { recorder.record("preUninstall present=\($0.access(Counter.self) != nil)") }
                .postUninstall { recorder.record("postUninstall present=\($0.access(Counter.self) != nil)") })
        #expect(bus.access(Counter.self) == Counter(value: 7))
        #expect(bus.access(HookedValue<Counter>.self) == nil, "stored as the plain value")
        bus.uninstall(type: Counter.self)
        #expect(recorder.all == [
            "preInstall(main) present=false", "postInstall present=true", "preUninstall present=true", "postUninstall present=false",
        ])
    }

    // "a bus installed on a bus, reachable by its own type".
    @Test func aBusOnABusIsReachableByItsOwnType() {
        let recorder = Recorder()
        let parent = Bus(label: "parent")
        let audio = AudioBus(recorder)
        audio.install(Counter(value: 1))
        parent.install(audio)
        #expect((parent.access() as AudioBus?) === audio)
        #expect(parent.access(AudioBus.self)?.access(Counter.self) == Counter(value: 1))
        #expect(parent.access(Counter.self) == nil, "contents stay on the sub-bus")
        let plain = Bus(label: "plain")
        parent.install(plain)
        #expect(parent.access(Bus.self) === plain)
    }

    // "uninstalling a bus uninstalls everything on it, hooks included, in reverse order".
    @Test func uninstallingABusUninstallsItsContentsInReverseOrderWithHooks() {
        let recorder = Recorder()
        let parent = Bus(label: "parent")
        let audio = AudioBus(recorder)
        audio.install(OtherService("mixer", recorder))
        audio.install(HookedValue(Counter(value: 1)).preUninstall { _ in recorder.record("counter.preUninstall") })
        let inner = Bus(label: "inner")
        inner.install(OtherService("deep", recorder))
        audio.install(inner)
        parent.install(audio)
        parent.uninstall(audio)
        #expect(recorder.all == [
            "audio.preUninstall(parent)",
            "deep.preUninstall(inner)", "deep.postUninstall(inner)",
            "counter.preUninstall",
            "mixer.preUninstall(audio)", "mixer.postUninstall(audio)",
            "audio.postUninstall(parent)",
        ])
        #expect(audio.bus.count == 0 && inner.count == 0 && parent.count == 0)
    }

    // A bus cannot contain itself.
    @Test func installingABusIntoItselfIsRefused() {
        let outer = Bus(label: "outer")
        let inner = Bus(label: "inner")
        #expect(!outer.install(outer))
        #expect(outer.install(inner))
        #expect(!inner.install(outer))
        #expect(outer.contains(bus: inner) && !inner.contains(bus: outer))
    }

    // Outside attack: a bus installed from the preInstall hook of a bus being installed on
    // it made each bus contain the other (both installs returned true), and the next
    // `contains(bus:)` overflowed the stack.
    @Test func aBusCannotBeInstalledOnABusThatIsBeingInstalledOnIt() {
        final class Outer: SubBus { let bus = Bus(label: "outer") }
        final class Inner: SubBus, Installable {
            let bus = Bus(label: "inner")
            let outer: Outer
            let installedOuter = Atomic<Bool>(false)
            init(outer: Outer) { self.outer = outer }
            func preInstall(on parent: Bus) { installedOuter.store(bus.install(outer), ordering: .relaxed) }
        }
        let outer = Outer()
        let inner = Inner(outer: outer)
        #expect(outer.bus.install(inner))
        let hookInstalled = inner.installedOuter.load(ordering: .relaxed)
        #expect(!hookInstalled, "the hook's install made a cycle")
        #expect(outer.bus.contains(bus: inner.bus) && !inner.bus.contains(bus: outer.bus))
    }

    // Outside attack: A installed on B and B on A from two threads at once both succeeded
    // (3 rounds in 2000 for the helper, 1007 here), leaving a cycle.
    @Test(.timeLimit(.minutes(2)))
    func twoBusesInstalledOnEachOtherAtOnceMakeNoCycle() {
        final class Node: SubBus { let bus = Bus(label: "node") }
        let queues = [DispatchQueue(label: "a-on-b"), DispatchQueue(label: "b-on-a")]
        var cycles = 0
        for _ in 0..<2000 {
            let a = Node(), b = Node()
            let arrived = Atomic<Int>(0)
            let successes = Atomic<Int>(0)
            let group = DispatchGroup()
            for (queue, (target, item)) in zip(queues, [(b, a), (a, b)]) {
                queue.async(group: group) {
                    arrived.add(1, ordering: .acquiringAndReleasing)
                    while arrived.load(ordering: .acquiring) < 2 { sched_yield() }
                    if target.bus.install(item) { successes.add(1, ordering: .relaxed) }
                }
            }
            group.wait()
            if successes.load(ordering: .relaxed) != 1 {
                cycles += 1
                // Break the cycle, or the buses are never freed.
                a.bus.uninstall(b)
            }
        }
        #expect(cycles == 0, "both installs succeeded in \(cycles) of 2000 rounds")
    }

    // Concurrent installs and uninstalls from many threads keep the bus consistent and run
    // each hook exactly once per object (replacements included: all objects share a type).
    @Test func concurrentUseKeepsTheBusConsistent() {
        let counts = HookCounts()
        let bus = Bus(label: "stress")
        DispatchQueue.concurrentPerform(iterations: 400) { index in
            let object = Tracked(counts)
            bus.install(object)
            if index % 2 == 0 { bus.uninstall(object) }
            _ = bus.access(Tracked.self)
        }
        bus.uninstallAll()
        #expect(bus.count == 0)
        #expect(counts.installs.load(ordering: .relaxed) == 400)
        #expect(counts.preUninstalls.load(ordering: .relaxed) == 400, "every object was uninstalled exactly once")
        #expect(counts.postUninstalls.load(ordering: .relaxed) == 400)
    }

    // Installing the same object from 8 threads at once installs it once: one preInstall and
    // one postInstall, no uninstall hook while it stays installed, and only the call that
    // installed it returns true. Uninstalling it then runs one pre/post uninstall pair, with
    // postUninstall only once it is gone.
    @Test(.timeLimit(.minutes(2)))
    func concurrentInstallsOfTheSameObjectInstallItOnce() {
        let threads = 8
        let queues = (0..<threads).map { DispatchQueue(label: "installer-\($0)") }
        var failures: [String] = []
        for round in 0..<400 {
            let bus = Bus(label: "race")
            let service = RaceService()
            let arrived = Atomic<Int>(0)
            let installed = Atomic<Int>(0)
            let group = DispatchGroup()
            for queue in queues {
                queue.async(group: group) {
                    arrived.add(1, ordering: .acquiringAndReleasing)
                    while arrived.load(ordering: .acquiring) < threads { sched_yield() }
                    if bus.install(service) { installed.add(1, ordering: .relaxed) }
                }
            }
            group.wait()
            let afterInstall = service.hooks
            let trues = installed.load(ordering: .relaxed)
            let count = bus.count
            let uninstalled = bus.uninstall(service)
            let afterUninstall = service.hooks
            if trues != 1 || afterInstall != [1, 1, 0, 0, 0] || count != 1 || !uninstalled
                || afterUninstall != [1, 1, 1, 1, 0] || bus.count != 0
            {
                failures.append(
                    "round \(round): install returned true \(trues) times, hooks after install \(afterInstall), "
                        + "count \(count), after uninstall \(afterUninstall) (pre, post, preUn, postUn, postUn while accessible)")
            }
        }
        #expect(failures.isEmpty, "\(failures.count) of 400 rounds failed; first: \(failures.first ?? "")")
    }
}

/// Counts its hooks on one bus: [preInstall, postInstall, preUninstall, postUninstall,
/// postUninstall while still accessible].
final class RaceService: Installable, Uninstallable {
    private let counts = Mutex<[Int]>([0, 0, 0, 0, 0])
    var hooks: [Int] { counts.withLock { $0 } }
    private func count(_ index: Int) { counts.withLock { $0[index] += 1 } }
    func preInstall(on bus: Bus) {
        count(0)
        sched_yield()
    }
    func postInstall(on bus: Bus) { count(1) }
    func preUninstall(from bus: Bus) { count(2) }
    func postUninstall(from bus: Bus) {
        count(3)
        if bus.access(RaceService.self) === self { count(4) }
    }
}

/// Tests that install the process-wide Backdoor: serialized, as they share it.
@Suite("Backdoor", .timeLimit(.minutes(5)), .serialized)
struct BackdoorTests {
    // The Backdoor is a process-wide default bus, safe to use from many threads at once.
    @Test func backdoorIsAProcessWideBusSafeUnderConcurrency() {
        let recorder = Recorder()
        let common = Bus.new(label: "common") { bus in
            bus.install(OtherService("service", recorder))
        }
        Backdoor.install(on: common)
        #expect(Backdoor.bus === common)
        #expect((Backdoor.bus?.access() as OtherService?) != nil)

        DispatchQueue.concurrentPerform(iterations: 200) { index in
            let bus = Backdoor.bus
            bus?.install(HookedValue(index).postUninstall { _ in })
            _ = bus?.access(Int.self)
            _ = bus?.accessAll(OtherService.self)
        }
        #expect(common.access(Int.self) != nil)

        Backdoor.uninstall(from: Backdoor.bus)
        #expect(Backdoor.bus == nil)
        #expect(common.count == 0, "uninstalling the Backdoor empties the bus")
        #expect(recorder.all == ["service.preUninstall(common)", "service.postUninstall(common)"])
    }

    // docs/modules.md: "The Bus" example.
    @Test func theBusExampleRuns() {
        let recorder = Recorder()
        let common = Bus.new(label: "common") { bus in
            bus.install(HookedValue(Counter(value: 0))
                .postInstall { recorder.record("installed on \($0.label)") }
                .preUninstall { recorder.record("leaving \($0.label)") })
        }
        Backdoor.install(on: common)
        let counter = Backdoor.bus?.access() as Counter?
        #expect(counter == Counter(value: 0))
        Backdoor.uninstall(from: Backdoor.bus)
        #expect(recorder.all == ["installed on common", "leaving common"])
    }
}

final class HookCounts: Sendable {
    let installs = Atomic<Int>(0)
    let preUninstalls = Atomic<Int>(0)
    let postUninstalls = Atomic<Int>(0)
}

/// Counts its hooks.
final class Tracked: Installable, Uninstallable {
    let counts: HookCounts
    init(_ counts: HookCounts) { self.counts = counts }
    func postInstall(on bus: Bus) { counts.installs.add(1, ordering: .relaxed) }
    func preUninstall(from bus: Bus) { counts.preUninstalls.add(1, ordering: .relaxed) }
    func postUninstall(from bus: Bus) { counts.postUninstalls.add(1, ordering: .relaxed) }
}
