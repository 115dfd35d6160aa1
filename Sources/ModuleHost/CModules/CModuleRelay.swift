@_spi(ModuleHost) import ModuleKit
import CDynamicLoader
import Dispatch
import Glibc
import PluginFormat
import Synchronization

/// Delivers a custom event sent to every module, or a notification posted, to each run of
/// consecutive C modules (of them, the listeners) in one hand-over: one thread, a *lane*,
/// calls the modules of the run one after the other, while the host's context waits for
/// the whole run.
///
/// The guarantees of `CModule` hold: each module's calls run one at a time and in order
/// (the lane runs a call in its module's `PluginWorker`'s place, `PluginWorker.claim`), a
/// stuck module is given nothing, and a call still running at the event deadline costs
/// its own module only. The waiting context watches which call the lane runs; one it has
/// seen running for the deadline is left to the lane, its module is stuck (logged, as
/// `CModule` logs it) and a new lane calls the modules after it. The waiting context
/// sleeps while the lane runs (no clock is read per call): it sees a call at most an
/// eighth of the deadline after it started, so an overrun is found between the deadline
/// and an eighth of it later.
final class CModuleRelay: ModuleRelay {
    /// Lanes that run no batch. A lane is taken from here for a batch, and given back by
    /// its caller once the batch is over, or by the lane itself once the call its caller
    /// left it to has returned.
    private let idleLanes = Mutex<[SyncRunner]>([])
    /// The modules of the last run and their deliveries: the same run, event after event,
    /// is looked up once. The modules are held, so that no new module can be found at the
    /// address of one of them.
    private let lastRun = Mutex<(modules: [CModule], deliveries: [CModule.Delivery])>(([], []))
    /// Numbers the batches, for the tokens of their calls (`PluginWorker.claim`).
    private let lastBatch = Atomic<UInt64>(0)

    func deliver(_ event: ModuleEvent, to modules: ArraySlice<any Module>, host: isolated HostInstance) -> Bool {
        let kind: CEventKind
        switch event {
        case .custom: kind = .custom
        case .notification: kind = .notification
        default: return false
        }
        let name = event.name
        // Names C must not see are refused by each module's own handler, which says why.
        guard PluginName.problem(name) == nil, !ModuleEvent.lifecycleNames.contains(name), let cName = CText(name) else { return false }
        var cPayload: CText?
        if event.payload != .null {
            guard let text = CText(event.payload.jsonText) else { return false }
            cPayload = text
        }
        guard let lane = idleLanes.withLock({ $0.popLast() }) ?? SyncRunner(name: "plugin-lane") else {
            // No thread for a lane: each module's own handler runs its call.
            return false
        }
        let serial = lastBatch.add(1, ordering: .relaxed).newValue
        let batch = Batch(kind: kind, name: name, cName: cName, cPayload: cPayload, deadline: host.eventDeadline,
                          serial: serial, entries: deliveries(of: modules))
        run(batch, on: lane)
        return true
    }

    /// The deliveries of `modules`, all `CModule`s (only they give this relay as theirs).
    private func deliveries(of modules: ArraySlice<any Module>) -> [CModule.Delivery] {
        lastRun.withLock { last in
            if last.modules.count == modules.count, zip(last.modules, modules).allSatisfy({ $0 === $1 }) {
                return last.deliveries
            }
            let cModules = modules.map { unsafeDowncast($0, to: CModule.self) }
            last = (cModules, cModules.map(\.delivery))
            return last.deliveries
        }
    }

    /// Runs `batch` on `lane` and waits until every entry has returned or overran.
    private func run(_ batch: Batch, on lane: SyncRunner) {
        var epoch: UInt32 = 0
        var lane = lane
        start(batch, epoch: epoch, on: lane)
        let deadline = batch.deadline
        let count = batch.entries.count
        // Most calls return within microseconds: watched for a short while before sleeping.
        _ = SyncRunner.watch(until: batch.start + min(deadline, SyncRunner.watchFor)) { batch.finished.isSet }
        // The entry the lane was last seen to have taken (-1: none seen yet) and since when:
        // from the batch's start for the first, from the hand-over to a new lane after one.
        var seen = (next: -1, at: batch.start)
        while true {
            let progress = batch.progress.load(ordering: .acquiring)
            guard Int(progress.next) <= count else {
                idleLanes.withLock { $0.append(lane) }
                return
            }
            let now = ContinuousClock.now
            if Int(progress.next) != seen.next { seen = (Int(progress.next), seen.next < 0 ? seen.at : now) }
            if now - seen.at >= deadline, progress.next > 0 {
                // The call of entry next - 1 is still running, unless the lane is between two.
                let superseded = Batch.Progress(epoch: epoch &+ 1, next: progress.next)
                // Sequentially consistent, as the lane's claim and its look at the epoch after
                // it (`PluginWorker.claim`): either the lane sees this, or `abandon` its claim.
                guard batch.progress.compareExchange(expected: progress, desired: superseded, ordering: .sequentiallyConsistent).exchanged
                else { continue }
                epoch &+= 1
                let index = Int(progress.next) - 1
                let delivery = batch.entries[index]
                if delivery.worker.abandon(lane: batch.token(index), what: batch.name, since: seen.at) {
                    delivery.overran(batch.name)
                }
                guard index + 1 < count else { return }
                guard let next = idleLanes.withLock({ $0.popLast() }) ?? SyncRunner(name: "plugin-lane") else {
                    // No thread for a new lane: the rest of the run does not get the event.
                    for delivery in batch.entries[(index + 1)...] { delivery.refused(batch.name, stuckIn: nil) }
                    return
                }
                lane = next
                start(batch, epoch: epoch, on: lane)
                seen = (-1, now)
                continue
            }
            // Past the deadline with no entry taken yet (the lane has not run): look again
            // an eighth of the deadline later, not at once.
            let left = deadline - (now - seen.at)
            _ = batch.wakeUp.wait(timeout: .now() + (left > .zero ? min(left, deadline / 8) : deadline / 8).dispatchInterval)
        }
    }

    /// Hands the rest of `batch` to `lane`, for the caller that owns the batch at `epoch`.
    /// A lane left behind gives itself back once it has returned.
    private func start(_ batch: Batch, epoch: UInt32, on lane: SyncRunner) {
        lane.hand { [self] in
            if !batch.runEntries(epoch: epoch) { idleLanes.withLock { $0.append(lane) } }
        }
    }
}

/// One event for one run of C modules, and how far the lanes got.
private final class Batch: Sendable {
    /// The lane that owns the batch (its epoch) and the next entry it may start; `next`
    /// is one past the last entry when every call has returned.
    struct Progress: AtomicRepresentable, Equatable {
        var epoch: UInt32
        var next: UInt32

        typealias AtomicRepresentation = UInt64.AtomicRepresentation
        static func encodeAtomicRepresentation(_ value: consuming Progress) -> UInt64.AtomicRepresentation {
            UInt64.encodeAtomicRepresentation(UInt64(value.epoch) << 32 | UInt64(value.next))
        }
        static func decodeAtomicRepresentation(_ storage: consuming UInt64.AtomicRepresentation) -> Progress {
            let value = UInt64.decodeAtomicRepresentation(storage)
            return Progress(epoch: UInt32(truncatingIfNeeded: value >> 32), next: UInt32(truncatingIfNeeded: value))
        }
    }

    let kind: CEventKind
    let name: String
    let cName: CText
    let cPayload: CText?
    let deadline: Duration
    let serial: UInt64
    let entries: [CModule.Delivery]
    let start = ContinuousClock.now
    let progress = Atomic(Progress(epoch: 0, next: 0))
    /// Set by the lane that returns from the last call, which signals `wakeUp` too. Apart
    /// from `progress`: the caller watches it while the lane changes `progress` per call.
    let finished = Flag()
    let wakeUp = DispatchSemaphore(value: 0)

    init(kind: CEventKind, name: String, cName: CText, cPayload: CText?, deadline: Duration, serial: UInt64,
         entries: [CModule.Delivery]) {
        self.kind = kind
        self.name = name
        self.cName = cName
        self.cPayload = cPayload
        self.deadline = deadline
        self.serial = serial
        self.entries = entries
    }

    /// The token of the call of entry `index` (`PluginWorker.claim`): unique in the process
    /// while fewer than 2^38 batches of fewer than 2^24 modules each have run.
    func token(_ index: Int) -> UInt64 {
        (serial & (1 << 38 - 1)) << 24 | UInt64(truncatingIfNeeded: index + 1) & (1 << 24 - 1)
    }

    /// Runs the entries from the next one while the lane of `epoch` owns the batch: true
    /// once it has run the last, false when another lane owns the batch now.
    func runEntries(epoch: UInt32) -> Bool {
        modhost_crash_recorder_allow_abort()
        let count = entries.count
        var next = progress.load(ordering: .acquiring)
        while next.epoch == epoch {
            let taken = Progress(epoch: epoch, next: next.next &+ 1)
            let (exchanged, found) = progress.compareExchange(expected: next, desired: taken, ordering: .acquiringAndReleasing)
            guard exchanged else {
                next = found
                continue
            }
            let index = Int(next.next)
            guard index < count else {
                finished.set()
                wakeUp.signal()
                return true
            }
            if !call(entries[index], index: index, epoch: epoch) { return false }
            next = taken
        }
        return false
    }

    /// Calls one module unless it is stuck; false when another lane owns the batch now.
    private func call(_ delivery: CModule.Delivery, index: Int, epoch: UInt32) -> Bool {
        let claim = delivery.worker.claim(token: token(index)) { progress.load(ordering: .sequentiallyConsistent).epoch == epoch }
        switch claim {
        case .superseded:
            // Its caller gave up on this call before it could start.
            delivery.notReached(name)
            return false
        case .stuck(let stuck):
            delivery.refused(name, stuckIn: stuck)
            return true
        case .busy:
            delivery.refused(name, stuckIn: nil)
            return true
        case .claimed:
            // Counted here, where the module's calls run: the host's context waits meanwhile.
            if delivery.metrics.countDelivery() % ModuleMetrics.synchronousSampling == 0 {
                let clock = ContinuousClock()
                let started = clock.now
                delivery.call(kind, cName.pointer, cPayload?.pointer)
                delivery.metrics.handlerTime.record(clock.now - started)
            } else {
                delivery.call(kind, cName.pointer, cPayload?.pointer)
            }
            delivery.worker.release()
            return true
        }
    }
}

/// A flag set once, in an object of its own (so in a cache line of its own, as a rule).
private final class Flag: Sendable {
    private let value = Atomic<Bool>(false)
    var isSet: Bool { value.load(ordering: .acquiring) }
    func set() { value.store(true, ordering: .releasing) }
}

/// A NUL-terminated copy of a string in C's heap, freed with its wrapper.
///
/// `@unchecked Sendable`: the bytes are written once, in `init`, and only read after, by
/// C code on whichever thread holds the wrapper; `deinit` frees them once no one does.
private final class CText: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<CChar>

    init?(_ text: String) {
        guard let copy = strdup(text) else { return nil }
        pointer = copy
    }

    deinit { free(pointer) }
}
