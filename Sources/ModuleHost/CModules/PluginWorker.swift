import CDynamicLoader
import DaemonKit
import Dispatch
import Synchronization

/// Where plugin code that the host cannot interrupt runs: one serial queue, its own thread
/// while a job runs (libdispatch gives a blocked serial queue a thread of its own, never
/// one of Swift concurrency's cooperative threads), so a C function that never returns
/// holds this worker and nothing else.
///
/// Jobs run one at a time, in submission order. Each job has a deadline; a job still
/// running past it makes the worker *stuck* (`stuck`), which callers use to give it no
/// more work until it returns. A C call cannot be preempted: the thread stays where the
/// plugin left it, the caller does not.
///
/// Plugin code reaches a worker in one of two ways:
/// - **queued**, run on the worker's thread, which lets the caller keep its deadline
///   whatever the plugin does: `submit` (nobody waits), `run` (a synchronous caller blocks
///   up to the deadline; the `SyncRunner`'s thread runs the job when it is free) and
///   `attempt` (a task suspends up to the deadline; a job whose turn has not come by then
///   is dropped);
/// - **in the worker's place**, on the calling thread, in the worker's order: `runHere`,
///   for a thread that may block as long as the plugin's code runs (an isolated plugin's
///   ordered thread, whose daemon kills the process at its deadline), and `claim` and
///   `release`, for a relay's lane (`CModuleRelay`), whose caller keeps the deadline and
///   hands the rest of its batch to another lane. No other thread is woken: a hand-off to
///   another thread and back costs more than most C callbacks take. A lane claims only
///   while no job of the queue runs or waits, and a job of the queue that starts meanwhile
///   waits for the claim to be released; a claim is two atomic operations when nothing
///   else runs, with no lock: it is taken once per module per event.
package final class PluginWorker: Sendable {
    /// What the worker is for, e.g. "module hang" or "plugin Spin" (log lines).
    let label: String
    private let queue: DispatchQueue
    private let state = Mutex(State())
    /// The last job number given out. Jobs are numbered and enqueued under this lock, which
    /// the queue's own jobs never take: a job woken by `submit` does not wait for the
    /// submitter to let go of `state`.
    private let lastJob = Mutex<UInt64>(0)

    private struct State {
        var current: Running?
        /// Jobs are numbered in queue order, so those up to `lastStarted` have started,
        /// except those `run` handed to the `SyncRunner` that have not reached the queue yet.
        var lastStarted: UInt64 = 0
        var notStarted: Set<UInt64> = []
        /// Jobs a waiting caller gave up on before they started (the queue was slow to
        /// reach them, or no thread came for them), with what they are and since when their
        /// caller waited: the worker is stuck on them until they have run, and they count
        /// as overrun from their first instant.
        var abandoned: [UInt64: (what: String, since: ContinuousClock.Instant)] = [:]
        /// Jobs `submit` queued that have not started yet, by number: what the worker
        /// still has to do once the job running now (if any) returns.
        var queued: [UInt64: String] = [:]
        /// A job of the queue waits for a lane's call to be released (`claimReleased`).
        var queueWaits = false
        /// Lanes waiting for the queue's jobs to be over (`queueIdle`), each woken once.
        var laneWaits = 0
        /// What the lane's call that overran runs, and since when its caller saw it run.
        var laneWhat = ""
        var laneSince = ContinuousClock.Instant.now
    }
    /// The lane's call running now: 0 for none, else its token shifted left by one, with
    /// the low bit set once its caller said that it overran (`abandon(lane:)`).
    private let laneClaim = Atomic<UInt64>(0)
    /// Jobs of the queue given to it and not over yet (a lane claims only at 0).
    private let queueJobs = Atomic<Int>(0)
    private let claimReleased = DispatchSemaphore(value: 0)
    private let queueIdle = DispatchSemaphore(value: 0)

    struct Running: Sendable {
        var job: UInt64
        var what: String
        var since: ContinuousClock.Instant
        var deadline: Duration
        /// A caller waited the whole deadline for it: stuck, whatever the clock says now.
        var overran = false
    }

    /// What a stuck worker is doing and for how long.
    package struct Stuck: Sendable, Equatable {
        package var what: String
        package var elapsed: Duration

        package init(what: String, elapsed: Duration) {
            self.what = what
            self.elapsed = elapsed
        }
    }

    init(label: String) {
        self.label = label
        queue = DispatchQueue(label: "modhostd.worker." + label)
    }

    /// The job running past its deadline, else the first job a caller gave up on before
    /// it could start (it waits behind a job still running, or for a thread that never
    /// came, e.g. under a processes limit), if any.
    package var stuck: Stuck? {
        state.withLock { state in
            // Asked before every event: the clock is read only when a job runs or was given up on.
            guard state.current != nil || !state.abandoned.isEmpty || laneClaim.load(ordering: .relaxed) != 0 else { return nil }
            return stuck(state)
        }
    }

    private func stuck(_ state: State) -> Stuck? {
        let now = ContinuousClock.now
        if let running = state.current, running.overran || now - running.since > running.deadline {
            return Stuck(what: running.what, elapsed: now - running.since)
        }
        // A lane's call is stuck once its caller says so, the caller keeping its deadline.
        if laneClaim.load(ordering: .acquiring) & 1 != 0 {
            return Stuck(what: state.laneWhat, elapsed: now - state.laneSince)
        }
        return state.abandoned.min { $0.key < $1.key }.map { Stuck(what: $0.value.what, elapsed: now - $0.value.since) }
    }

    /// The job running now, whether or not it is past its deadline, else the next job
    /// queued (for no time yet): nil only when nothing is left to run (e.g. a queued
    /// `destroy` not started yet keeps it busy).
    package var busy: Stuck? {
        state.withLock { state in
            if let running = state.current { return Stuck(what: running.what, elapsed: ContinuousClock.now - running.since) }
            let lane = laneClaim.load(ordering: .acquiring)
            if lane & 1 != 0 { return Stuck(what: state.laneWhat, elapsed: ContinuousClock.now - state.laneSince) }
            if lane != 0 { return Stuck(what: "an event", elapsed: .zero) }
            return state.queued.min { $0.key < $1.key }.map { Stuck(what: $0.value, elapsed: .zero) }
        }
    }

    /// Queues `job` (named `what` in `stuck`) and returns at once. `finished`, if given,
    /// runs on the worker once `job` has returned and the worker no longer counts it as
    /// running.
    @discardableResult
    func submit(_ what: String, deadline: Duration, _ job: @escaping @Sendable () -> Void,
                finished: (@Sendable () -> Void)? = nil) -> UInt64 {
        lastJob.withLock { last -> UInt64 in
            last += 1
            let id = last
            state.withLock { $0.queued[id] = what }
            queueJobs.wrappingAdd(1, ordering: .sequentiallyConsistent)
            // Enqueued under the lock, so queue order is number order.
            queue.async { [self] in
                started(id, what, deadline)
                job()
                self.finishedJob()
                finished?()
            }
            return id
        }
    }

    /// Records that job `id` runs from now on, on the calling thread (which lets a
    /// plugin's SIGABRT reach it: `modhost_crash_recorder_allow_abort`).
    private func started(_ id: UInt64, _ what: String, _ deadline: Duration) {
        modhost_crash_recorder_allow_abort()
        // Counted in `queueJobs` before it was queued: a lane claims no call from now on,
        // and this job waits for the call a lane claimed before.
        while state.withLock({ state -> Bool in
            if laneClaim.load(ordering: .sequentiallyConsistent) != 0 {
                state.queueWaits = true
                return true
            }
            state.lastStarted = max(state.lastStarted, id)
            // Each is usually empty (no job waits, none was given up on): looked into only
            // then, as each removal hashes the number first.
            if !state.notStarted.isEmpty { state.notStarted.remove(id) }
            if !state.queued.isEmpty { state.queued[id] = nil }
            let overran = !state.abandoned.isEmpty && state.abandoned.removeValue(forKey: id) != nil
            state.current = Running(job: id, what: what, since: .now, deadline: deadline, overran: overran)
            return false
        }) {
            claimReleased.wait()
        }
    }

    /// A job of the queue is over: the worker runs none now, and a lane waiting for that
    /// (`claim`) tries again.
    private func finishedJob() {
        let laneWaits = state.withLock { state -> Int in
            state.current = nil
            queueJobs.wrappingSubtract(1, ordering: .sequentiallyConsistent)
            defer { state.laneWaits = 0 }
            return state.laneWaits
        }
        for _ in 0..<laneWaits { queueIdle.signal() }
    }

    /// What became of a lane's `claim`.
    enum Claim {
        /// The lane runs the call now, in the worker's place, and then calls `release`.
        case claimed
        /// The worker is stuck (`stuck`): the call is not made.
        case stuck(Stuck)
        /// Another lane's call runs (not stuck): the call is not made.
        case busy
        /// The batch's caller gave the rest of the batch to another lane meanwhile: this
        /// lane stops.
        case superseded
    }

    /// Lets the calling thread, a relay's lane, make a call in the worker's place, known
    /// by `token` (not 0, below 2^63), once no job of the queue runs or waits, while
    /// `isCurrent` says the lane still owns its batch. It waits for the queue's jobs while
    /// `isCurrent` (read under the worker's lock) holds.
    func claim(token: UInt64, isCurrent: () -> Bool) -> Claim {
        // Each side announces itself before it looks at the other (sequentially consistent):
        // a job of the queue counts itself and then looks for a claim, the lane claims and
        // then looks for jobs, so at least one of them sees the other. Likewise the lane's
        // caller gives the batch to another lane and then marks the claim overrun
        // (`abandon`), the lane claims and then looks whether it still owns the batch.
        let claimed = token << 1
        if queueJobs.load(ordering: .sequentiallyConsistent) == 0,
           laneClaim.compareExchange(expected: 0, desired: claimed, ordering: .sequentiallyConsistent).exchanged {
            if queueJobs.load(ordering: .sequentiallyConsistent) == 0 {
                if isCurrent() { return .claimed }
                release()
                return .superseded
            }
            release()
        }
        while true {
            let claim = state.withLock { state -> Claim? in
                guard isCurrent() else { return .superseded }
                if let stuck = stuck(state) { return .stuck(stuck) }
                if laneClaim.load(ordering: .sequentiallyConsistent) != 0 { return .busy }
                // Claimed as above; a job that counted itself meanwhile looks for a claim
                // under this lock, so after the claim is taken back.
                if queueJobs.load(ordering: .sequentiallyConsistent) == 0,
                   laneClaim.compareExchange(expected: 0, desired: claimed, ordering: .sequentiallyConsistent).exchanged {
                    // `isCurrent` was read under this lock, which `abandon` takes too.
                    if queueJobs.load(ordering: .sequentiallyConsistent) == 0 { return .claimed }
                    laneClaim.store(0, ordering: .sequentiallyConsistent)
                }
                state.laneWaits += 1
                return nil
            }
            if let claim { return claim }
            queueIdle.wait()
        }
    }

    /// Ends the call `claim` gave the lane: a job of the queue waiting for it starts.
    func release() {
        laneClaim.store(0, ordering: .sequentiallyConsistent)
        guard queueJobs.load(ordering: .sequentiallyConsistent) != 0 else { return }
        let queueWaits = state.withLock { state -> Bool in
            defer { state.queueWaits = false }
            return state.queueWaits
        }
        if queueWaits { claimReleased.signal() }
    }

    /// Records that the lane's call `token`, named `what` and seen running since `since`,
    /// overran its deadline: the worker is stuck until it returns. False when it returned
    /// already.
    func abandon(lane token: UInt64, what: String, since: ContinuousClock.Instant) -> Bool {
        state.withLock { state in
            // Under the lock that `stuck` reads them with: the bit and what it stands for
            // are seen together.
            guard laneClaim.compareExchange(expected: token << 1, desired: token << 1 | 1, ordering: .sequentiallyConsistent).exchanged
            else { return false }
            state.laneWhat = what
            state.laneSince = since
            return true
        }
    }

    /// Has the `SyncRunner`'s thread run `job` on this worker's queue if that thread is free
    /// (it then runs there at once when the queue is idle, without waking a thread), and
    /// returns its number; nil when the runner is busy with another job.
    private func offerToRunner(_ what: String, deadline: Duration, _ job: @escaping @Sendable () -> Void,
                               finished: @escaping @Sendable () -> Void) -> UInt64? {
        let id = lastJob.withLock { last -> UInt64 in
            last += 1
            return last
        }
        state.withLock { _ = $0.notStarted.insert(id) }
        queueJobs.wrappingAdd(1, ordering: .sequentiallyConsistent)
        let offered = SyncRunner.shared.offer({ [self] in
            queue.sync {
                started(id, what, deadline)
                job()
                finishedJob()
            }
        }, then: finished)
        if offered { return id }
        state.withLock { state in
            state.notStarted.remove(id)
            queueJobs.wrappingSubtract(1, ordering: .sequentiallyConsistent)
        }
        return nil
    }

    /// Records that the caller waiting for job `id` gave up at its deadline, so `stuck`
    /// says so at once: the running job's clock may have started later than the caller's.
    private func abandon(_ id: UInt64, _ what: String, waitingSince: ContinuousClock.Instant) {
        state.withLock { state in
            if state.current?.job == id {
                state.current?.overran = true
            } else if id > state.lastStarted || state.notStarted.contains(id) {
                state.abandoned[id] = (what, waitingSince)
            }  // else it has finished meanwhile
        }
    }

    /// Runs `job` and waits for it up to `deadline`, blocking the calling thread: its
    /// result, or nil when it did not finish in time (it goes on running; the worker is
    /// then stuck). For synchronous callers that must not wait longer than the deadline.
    func run<T: Sendable>(_ what: String, deadline: Duration, _ job: @escaping @Sendable () -> T) -> T? {
        let waitingSince = ContinuousClock.now
        let result = FirstResult<T>()
        let done = Completion()
        // Told once the job is over, so a next `run` does not find it still current.
        let body: @Sendable () -> Void = { result.finish(job()) }
        let finished: @Sendable () -> Void = { done.finish() }
        let id = offerToRunner(what, deadline: deadline, body, finished: finished)
            ?? submit(what, deadline: deadline, body, finished: finished)
        guard done.wait(upTo: deadline) else {
            abandon(id, what, waitingSince: waitingSince)
            return nil
        }
        return result.value
    }

    /// Runs `job` on the calling thread, in this worker's order (after the job running now,
    /// if any), and returns once it has, however long that takes. Only for a thread that
    /// may block without a deadline of its own: an isolated plugin's ordered thread in its
    /// worker process, whose daemon waits up to its deadline and then kills the process.
    /// No other thread is woken (`DispatchQueue.sync` on an idle queue runs here).
    func runHere(_ what: String, deadline: Duration, _ job: () -> Void) {
        let id = lastJob.withLock { last -> UInt64 in
            last += 1
            return last
        }
        queueJobs.wrappingAdd(1, ordering: .sequentiallyConsistent)
        queue.sync {
            started(id, what, deadline)
            job()
            finishedJob()
        }
    }

    /// The end of one job a thread waits for in `run`: `wait` returns true once `finish`
    /// has run, false once the deadline passed first. The waiter is a synchronous caller
    /// (the host's context delivering a lifecycle event), which cannot suspend: it blocks,
    /// on a semaphore with the deadline.
    ///
    /// Most C callbacks return within microseconds, and on a virtual machine waking a
    /// thread that went to sleep costs tens of them: the waiter first watches the job for
    /// up to `SyncRunner.watchFor` on its own processor, and sleeps only if it is still
    /// running then.
    private final class Completion: Sendable {
        private let finished = Atomic<Bool>(false)
        private let wakeUp = DispatchSemaphore(value: 0)

        func finish() {
            finished.store(true, ordering: .releasing)
            wakeUp.signal()
        }

        /// True once the job has finished, false when `deadline` passed first.
        func wait(upTo deadline: Duration) -> Bool {
            let start = ContinuousClock.now
            if SyncRunner.watch(until: start + min(deadline, SyncRunner.watchFor), for: { finished.load(ordering: .acquiring) }) {
                return true
            }
            let left = deadline - (ContinuousClock.now - start)
            return wakeUp.wait(timeout: .now() + max(left, .zero).dispatchInterval) == .success
        }
    }

    /// What became of a job `attempt` ran.
    package enum Attempt<T: Sendable>: Sendable {
        /// It returned within the deadline.
        case returned(T)
        /// It started and was still running at the deadline: the worker is stuck on it
        /// (`stuck`) until it returns.
        case overran
        /// The jobs ahead of it took the whole deadline: it was dropped, and never runs.
        case notStarted
    }

    /// Runs `job` if its turn comes within `deadline` (counted from now), and waits for it
    /// up to then, holding no thread: the one way to await plugin code. A job whose turn has
    /// not come by the deadline is dropped: it never runs, so its caller's failure is the
    /// whole story. One still running then goes on (plugin code cannot be interrupted), the
    /// worker is stuck on it from that instant, and `returnedLate` runs on the worker once
    /// it has returned, with how long it ran. A caller resumed with its result finds the
    /// worker no longer running the job.
    package func attempt<T: Sendable>(_ what: String, deadline: Duration, _ job: @escaping @Sendable () -> T,
                                      returnedLate: (@Sendable (Duration) -> Void)? = nil) async -> Attempt<T> {
        let waitingSince = ContinuousClock.now
        let turn = Turn()
        let outcome = FirstResult<Attempt<T>>()
        let ran = FirstResult<(value: T, took: Duration)>()
        let id = submit(what, deadline: deadline, {
            guard turn.take() else { return }
            let started = ContinuousClock.now
            let value = job()
            ran.finish((value, ContinuousClock.now - started))
        }, finished: {
            // Told once the worker no longer counts the job as running.
            guard let (value, took) = ran.value else { return }  // dropped: it never ran
            if !outcome.finish(.returned(value)) { returnedLate?(took) }
        })
        // Weak: a result already returned is not kept until the deadline.
        DispatchQueue.global().asyncAfter(deadline: .now() + deadline.dispatchInterval) { [self, weak outcome] in
            guard let outcome else { return }
            if turn.drop() {
                outcome.finish(.notStarted)
            } else if outcome.finish(.overran) {
                abandon(id, what, waitingSince: waitingSince)
            }
        }
        return await outcome.wait()
    }

    /// Why call `function` of `plugin` was refused (`plugin_busy`) when its turn did not
    /// come within `deadline`, with what ran ahead of it: one message, in process and
    /// isolated.
    package static func notStarted(plugin: String, function: String, deadline: Duration, ahead: Stuck?) -> String {
        let running = ahead.map { "\($0.what) has been running for \($0.elapsed.secondsText)" } ?? "the calls ahead of it took the time"
        return "plugin \(plugin) is busy (\(running)): call \(function) did not start within the deadline of \(deadline.secondsText) and will not run"
    }

    /// Whether a job of `attempt` runs: taken by the job when its turn comes, or dropped by
    /// its caller's deadline, whichever is first.
    private final class Turn: Sendable {
        private let state = Atomic<UInt8>(0)  // 0 waiting, 1 taken, 2 dropped
        func take() -> Bool { state.compareExchange(expected: 0, desired: 1, ordering: .acquiringAndReleasing).exchanged }
        func drop() -> Bool { state.compareExchange(expected: 0, desired: 2, ordering: .acquiringAndReleasing).exchanged }
    }
}

/// A thread of its own that runs the jobs handed to it, one at a time. `shared` runs the
/// jobs callers wait for (`PluginWorker.run`: a C module's create and lifecycle events) on
/// their worker's queue while it is free; a relay's lanes (`CModuleRelay`) are runners of
/// their own.
///
/// A job `run` hands to a worker's queue wakes a pool thread, and its caller is woken in
/// turn: on a virtual machine each wake-up costs tens of microseconds, more than most C
/// callbacks take. A caller watches for its job's end for `watchFor` before it sleeps, and
/// a lane watches for its next batch as long after each one, so that events sent one after
/// another run without waking a thread. `shared` sleeps as soon as it is idle: its jobs
/// come one per module, with other work between them (a start's copies and checks), and a
/// thread watching meanwhile would only take a processor from that work. The queue still
/// serialises each module's calls (`DispatchQueue.sync` runs the job on this thread once
/// the queue is idle). A job that never returns keeps this thread; later jobs take the
/// queue path meanwhile (`offer` says false while it is busy).
final class SyncRunner: Sendable {
    static let shared = SyncRunner(name: "plugin-calls", watching: .zero) ?? SyncRunner()
    /// How long a caller in `run` or a relay's batch, and a lane, watch for what they wait
    /// for before they sleep.
    static let watchFor = Duration.microseconds(50)

    /// Whether `happened` came true before `until` (at most a few dozen checks later),
    /// checked on this processor without sleeping: the clock is read once every 32 checks,
    /// as a read costs more than a check.
    static func watch(until: ContinuousClock.Instant, for happened: () -> Bool) -> Bool {
        repeat {
            for _ in 0..<32 where happened() { return true }
        } while ContinuousClock.now < until
        return happened()
    }

    private struct State {
        var job: (@Sendable () -> Void)?
        /// Run once the thread is free again, after `job`.
        var then: (@Sendable () -> Void)?
        var busy = false
        var asleep = false
    }
    private let state = Mutex(State())
    private let offered = Atomic<Bool>(false)
    private let wakeUp = DispatchSemaphore(value: 0)
    /// How long the thread watches for its next job after each one before it sleeps.
    private let watching: Duration

    /// A runner on a new thread named `name` that watches for its next job for `watching`
    /// after each one; nil when no thread can be had.
    init?(name: String, watching: Duration = watchFor) {
        self.watching = watching
        do throws(SystemError) {
            try startThread(name: name) { [self] in self.serve() }
        } catch {
            return nil
        }
    }

    /// A runner with no thread: `offer` says false, and every job takes the queue path.
    private init() {
        watching = .zero
        state.withLock { $0.busy = true }
    }

    /// Hands `job` to this thread unless it is running another job (false). `then` runs on
    /// the thread after `job`, once the thread takes new jobs again: a caller it wakes can
    /// offer its next job at once.
    func offer(_ job: @escaping @Sendable () -> Void, then: (@Sendable () -> Void)? = nil) -> Bool {
        let asleep = state.withLock { state -> Bool? in
            guard !state.busy else { return nil }
            state.busy = true
            state.job = job
            state.then = then
            defer { state.asleep = false }
            return state.asleep
        }
        guard let asleep else { return false }
        offered.store(true, ordering: .releasing)
        if asleep { wakeUp.signal() }
        return true
    }

    /// Hands `job` to this thread, which runs it once the job it runs now, if any, has
    /// returned: for a caller that owns the thread (a lane of `CModuleRelay`), never while
    /// another may hand it a job.
    func hand(_ job: @escaping @Sendable () -> Void) {
        let asleep = state.withLock { state -> Bool in
            state.job = job
            defer { state.asleep = false }
            return state.asleep
        }
        offered.store(true, ordering: .releasing)
        if asleep { wakeUp.signal() }
    }

    private func serve() {
        while true {
            if watching > .zero { _ = Self.watch(until: ContinuousClock.now + watching) { offered.load(ordering: .acquiring) } }
            let taken = state.withLock { state -> (job: @Sendable () -> Void, then: (@Sendable () -> Void)?)? in
                guard let job = state.job else {
                    state.asleep = true
                    return nil
                }
                defer { (state.job, state.then) = (nil, nil) }
                return (job, state.then)
            }
            guard let taken else {
                wakeUp.wait()
                continue
            }
            offered.store(false, ordering: .relaxed)
            taken.job()
            state.withLock { $0.busy = false }
            taken.then?()
        }
    }
}

/// Every worker of one daemon (or one plugin loader): the C modules' workers by module
/// name, and the workers that run calls by name, by plugin name. Thread-safe.
public final class PluginWorkers: Sendable {
    private struct State {
        /// By module name, in registration order: the last one is the current instance.
        var modules: [String: [PluginWorker]] = [:]
        var calls: [String: PluginWorker] = [:]
        /// The events each isolated module did not answer, by name: when last, and why (at
        /// most `unansweredNames` names per module, the latest). By name, so that a flood of
        /// one name (a notification the module posts to itself) cannot hide another's.
        var unanswered: [String: [String: (at: ContinuousClock.Instant, why: Unanswered)]] = [:]
        /// The events isolated modules are given now, waiting for their worker's answer, by
        /// request number: the module, the event and when it was sent. (Keyed by number
        /// alone: one event is begun and ended per round trip to a worker, and hashing a
        /// number costs less than hashing a name.)
        var isolated: [Int: (module: String, event: String, at: ContinuousClock.Instant)] = [:]
        var lastIsolated = 0
    }
    private let state = Mutex(State())

    /// Delivers events sent to every module to the runs of C modules among them.
    let relay = CModuleRelay()

    public init() {}

    /// Adds the worker of a new instance of module `name`, which becomes its current one
    /// (the instance it replaces keeps its worker until it is destroyed).
    func register(module name: String, _ worker: PluginWorker) {
        state.withLock { $0.modules[name, default: []].append(worker) }
    }

    /// Removes it once the instance is destroyed.
    func unregister(module name: String, _ worker: PluginWorker) {
        state.withLock { state in
            state.modules[name]?.removeAll { $0 === worker }
            if state.modules[name]?.isEmpty == true { state.modules[name] = nil }
        }
    }

    /// Records that module `name`, isolated, is given `event` now; its number for
    /// `endIsolated`.
    func beginIsolated(module name: String, event: String) -> Int {
        state.withLock { state in
            state.lastIsolated += 1
            state.isolated[state.lastIsolated] = (name, event, .now)
            return state.lastIsolated
        }
    }

    /// Records that event `number` of module `name` is over: answered, or not.
    func endIsolated(module name: String, _ number: Int) {
        state.withLock { state in
            _ = state.isolated.removeValue(forKey: number)
        }
    }

    /// Why an isolated module did not answer an event.
    package enum Unanswered: Sendable {
        /// Not within the event deadline: its worker is killed for it (or the answer is
        /// still awaited).
        case overran
        /// Its worker ended while the module had it.
        case workerEnded
        /// No worker ran to give it to (crashed, restarting, quarantined).
        case workerDown
    }

    /// Records that module `name`, isolated, did not answer `event`, and why.
    func recordUnanswered(module name: String, event: String, why: Unanswered = .overran) {
        state.withLock { state in
            var events = state.unanswered[name, default: [:]]
            events[event] = (.now, why)
            if events.count > Self.unansweredNames, let oldest = events.min(by: { $0.value.at < $1.value.at })?.key {
                events[oldest] = nil
            }
            state.unanswered[name] = events
        }
    }

    /// How many event names `recordUnanswered` keeps per module.
    static let unansweredNames = 64

    /// Why module `name`, isolated, has not answered `event` given at or after `since`, nil
    /// when it has: its worker was killed for it, or it still waits for the answer (the
    /// host stopped waiting for it at its deadline), or its worker ended or was down.
    package func leftUnanswered(module name: String, event: String, since: ContinuousClock.Instant) -> Unanswered? {
        state.withLock { state in
            if let last = state.unanswered[name]?[event], last.at >= since { return last.why }
            return state.isolated.values.contains { $0.module == name && $0.event == event && $0.at >= since } ? .overran : nil
        }
    }

    /// The workers of every instance of module `name` not destroyed yet.
    func queues(module name: String) -> [PluginWorker] {
        state.withLock { $0.modules[name] ?? [] }
    }

    /// What the current instance of module `name` is stuck in, if it is. (A replaced or
    /// removed instance stuck in its willUnload does not make its successor stuck.)
    package func stuck(module name: String) -> PluginWorker.Stuck? {
        state.withLock { $0.modules[name]?.last?.stuck }
    }

    /// Every module still running a callback, with what it runs: named in the log when the
    /// shutdown budget runs out.
    package var busyModules: [(module: String, busy: PluginWorker.Stuck)] {
        state.withLock { state in
            state.modules.sorted { $0.key < $1.key }.flatMap { name, workers in
                workers.compactMap(\.busy).map { (name, $0) }
            }
        }
    }

    /// Every plugin still running a call by name.
    package var busyCalls: [(plugin: String, busy: PluginWorker.Stuck)] {
        state.withLock { state in
            state.calls.sorted { $0.key < $1.key }.compactMap { name, worker in worker.busy.map { (name, $0) } }
        }
    }

    /// The worker that runs calls by name into `plugin`, made on first use.
    package func calls(plugin: String) -> PluginWorker {
        state.withLock { state in
            if let worker = state.calls[plugin] { return worker }
            let worker = PluginWorker(label: "calls." + plugin)
            state.calls[plugin] = worker
            return worker
        }
    }
}

/// Runs `operation` in a task of its own and returns its result, or nil once `deadline`
/// has passed first; the operation then goes on in the background (its result dropped).
/// The caller never waits longer than the deadline, whatever the operation waits on. The
/// result is held no longer than the caller and the operation hold it: the timer, queued
/// until the deadline whatever happens before, does not keep it (a call's result of many
/// megabytes would otherwise stay in memory for the whole request deadline).
package func withDeadline<T: Sendable>(_ deadline: Duration, _ operation: @escaping @Sendable () async -> T) async -> T? {
    let race = FirstResult<T?>()
    Task { race.finish(await operation()) }
    DispatchQueue.global().asyncAfter(deadline: .now() + deadline.dispatchInterval) { [weak race] in race?.finish(nil) }
    return await race.wait() ?? nil
}

/// The first of several values offered from any thread; later ones are dropped. Every
/// waiter gets that value, once. Those who offer are a job on a worker's thread (plugin
/// code that may never return) and a deadline's timer, neither of them a task: they report
/// under a `Mutex` without suspending, which an actor would not let them do, and the
/// waiting task suspends without holding a thread.
final class FirstResult<T: Sendable>: Sendable {
    private enum State {
        case pending([CheckedContinuation<T, Never>])
        case decided(T)
    }
    private let state = Mutex(State.pending([]))

    /// Records `value` unless one was recorded before, and wakes the waiters; whether it
    /// was the first.
    @discardableResult
    func finish(_ value: T) -> Bool {
        let waiters = state.withLock { state -> [CheckedContinuation<T, Never>]? in
            guard case .pending(let waiters) = state else { return nil }
            state = .decided(value)
            return waiters
        }
        guard let waiters else { return false }
        for waiter in waiters { waiter.resume(returning: value) }
        return true
    }

    /// The recorded value, if any.
    var value: T? {
        state.withLock { if case .decided(let value) = $0 { value } else { nil } }
    }

    /// Suspends until a value is recorded and returns it.
    func wait() async -> T {
        await withCheckedContinuation { continuation in
            let decided = state.withLock { state -> T? in
                switch state {
                case .decided(let value): return value
                case .pending(let waiters):
                    state = .pending(waiters + [continuation])
                    return nil
                }
            }
            if let decided { continuation.resume(returning: decided) }
        }
    }
}

extension Duration {
    /// The same span for `DispatchTime` arithmetic (nanosecond precision).
    var dispatchInterval: DispatchTimeInterval {
        let (seconds, attoseconds) = components
        let nanoseconds = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        guard !nanoseconds.overflow else { return .never }
        return .nanoseconds(Int(clamping: nanoseconds.partialValue + attoseconds / 1_000_000_000))
    }

    /// Seconds as a Double, for replies and log lines.
    package var seconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
