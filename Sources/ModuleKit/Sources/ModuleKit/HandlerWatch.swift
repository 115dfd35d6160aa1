internal import Dispatch
import Synchronization

/// A synchronous callback of a module (an event handler, or `create`,
/// `updateConfiguration`, `stateForReplacement`, `restore`) that has run past its host's
/// event deadline (`HostInstance.overdueHandler`).
public struct OverdueHandler: Sendable, Equatable {
    /// The module whose handler it is.
    public var module: String
    /// The plugin that provided the module ("" for a module built into the host).
    public var plugin: String
    /// The event it handles (`ModuleEvent.name`), or the callback: `create` (the module's
    /// factory), `updateConfiguration`, `stateForReplacement`, `restore` or `info` (asked
    /// by `HostInstance.infos()`).
    public var event: String
    /// How long it has run: at least this, and at most an eighth of the event deadline (or
    /// one second) more.
    public var elapsed: Duration
}

/// Watches the synchronous callbacks of one host instance's modules from outside it.
///
/// A synchronous callback cannot be interrupted, and while it runs its instance runs
/// nothing else. The instance marks the callback it runs (`mark` and `leave`: plain atomic
/// loads and stores, no lock, fence or clock read, on the hottest path there is); a timer
/// looks at the mark every eighth of the deadline (at most every second) on a Dispatch
/// queue of its own, which gets a thread even while plugin code holds every thread of Swift
/// concurrency. A callback seen running in looks the deadline apart is overdue: it is said
/// when found (`Report.overdue`) and when it returns (`Report.returned`, from `leave`, at
/// once). So a callback is found at most an eighth of the deadline after it has run the
/// deadline, and one that overruns it by less may be missed: how long a callback ran is
/// known only from the looks, never more than it ran.
///
/// A nested callback (one its caller's callback caused, such as the handler of an event it
/// sent) is the one watched while it runs; its caller's is watched again, with its own
/// start, once it returns.
///
/// The timer runs only while callbacks run. A look that finds none run since the last one
/// disarms it, and looks once more a period later: a callback that began just as it
/// disarmed (and may not have seen it disarmed, `mark` reading `armed` without a fence)
/// is seen by that last look, which arms the timer again.
///
/// Safe from any thread; `mark`, `leave`, `setEvent` and `exemptCurrent` only from the
/// instance's context.
final class HandlerWatch: Sendable {
    enum Report: Sendable {
        case overdue(OverdueHandler, ModuleMetrics)
        case returned(OverdueHandler)
    }

    /// The callback running: its delivery's serial (the low 40 bits, shifted left by 24)
    /// and its module's `ModuleMetrics.index` + 1 (24 bits; 0 when past them, not watched);
    /// 0 when none runs. A nested callback's mark replaces its caller's until it returns.
    private let running = Atomic<UInt64>(0)
    /// The serial of the last delivery (written only by the instance).
    private let serial = Atomic<UInt64>(0)
    /// The mark of a callback that keeps a deadline of its own (a C module's, an isolated
    /// module's): not reported.
    private let exempt = Atomic<UInt64>(0)
    /// The mark of the callback found overdue, 0 when none: `leave` says its return.
    private let overdueMark = Atomic<UInt64>(0)
    /// The mark of the callback running that no other called (nested ones run within it),
    /// 0 when none runs: an overdue callback that is not `running` but this has not returned.
    private let outermost = Atomic<UInt64>(0)
    /// The name of the event the running callback handles, set when it differs from the last.
    private let eventName = Mutex<String>("")
    /// Whether the timer is armed; `mark` arms it, a look that finds no callback disarms it.
    private let armed = Atomic<Bool>(false)
    private struct Looks {
        /// The serial of the last delivery at the last look.
        var serial: UInt64 = 0
        /// The marks seen lately, and when each was first seen, the latest last: a caller's
        /// mark, seen again once its nested callback returns, keeps its start.
        var seen: [(mark: UInt64, since: ContinuousClock.Instant)] = []
        /// The callback found overdue, with its mark.
        var overdue: (mark: UInt64, handler: OverdueHandler, since: ContinuousClock.Instant)?
    }
    /// How many marks `Looks.seen` keeps (deeper nesting restarts the clock of the outer ones).
    private static let marksKept = 8
    private let looks = Mutex(Looks())
    private let deadline: Duration
    private let period: DispatchTimeInterval
    private let metrics: HostMetrics
    private let report: @Sendable (Report) -> Void

    /// Every watch's timer runs here: its own thread when Swift concurrency's are all held.
    private static let queue = DispatchQueue(label: "modulehost.handler-watch")

    init(deadline: Duration, metrics: HostMetrics, report: @escaping @Sendable (Report) -> Void) {
        self.deadline = deadline
        self.metrics = metrics
        self.report = report
        let eighth = (deadline / 8).clampedNanoseconds
        period = .nanoseconds(Int(min(max(eighth, 10_000_000), 1_000_000_000)))
    }

    /// The callback past the deadline now, if any.
    var overdue: OverdueHandler? {
        looks.withLock { looks in
            looks.overdue.map { overdue in
                var handler = overdue.handler
                handler.elapsed = ContinuousClock.now - overdue.since
                return handler
            }
        }
    }

    /// The mark now: 0, or the callback a nested one was called from (restored by `leave`).
    @inline(__always)
    var current: UInt64 { running.load(ordering: .relaxed) }

    /// Marks the start of a callback of the module counted by `metrics` (its event's name
    /// given to `setEvent` before); `outer` is `current` from before it.
    @inline(__always)
    func mark(_ metrics: ModuleMetrics, outer: UInt64) {
        let next = serial.load(ordering: .relaxed) &+ 1
        serial.store(next, ordering: .relaxed)
        let module = metrics.index < 0xFF_FFFF ? UInt64(metrics.index + 1) : 0
        let mark = next << 24 | module
        if outer == 0 { outermost.store(mark, ordering: .relaxed) }
        running.store(mark, ordering: .releasing)
        if !armed.load(ordering: .relaxed) { arm() }
    }

    /// Marks the end of the callback `mark` marked; `outer` is `current` from before it.
    @inline(__always)
    func leave(restoring outer: UInt64) {
        if overdueMark.load(ordering: .relaxed) != 0 { returned(running.load(ordering: .relaxed)) }
        running.store(outer, ordering: .releasing)
        if outer == 0 { outermost.store(0, ordering: .releasing) }
    }

    /// The callback marked `mark` returns: if it is the overdue one, that is said now.
    private func returned(_ mark: UInt64) {
        guard overdueMark.load(ordering: .relaxed) == mark else { return }
        let now = ContinuousClock.now
        let handler = looks.withLock { looks -> OverdueHandler? in
            guard let overdue = looks.overdue, overdue.mark == mark else { return nil }
            looks.overdue = nil
            overdueMark.store(0, ordering: .relaxed)
            var handler = overdue.handler
            handler.elapsed = now - overdue.since
            return handler
        }
        if let handler { report(.returned(handler)) }
    }

    /// The event the callbacks marked from now on handle.
    func setEvent(_ name: String) {
        eventName.withLock { $0 = name }
    }

    /// The callback marked now keeps a deadline of its own: it is never reported.
    func exemptCurrent() {
        exempt.store(running.load(ordering: .relaxed), ordering: .relaxed)
    }

    private func arm() {
        guard armed.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else { return }
        schedule(lastLook: false)
    }

    private func schedule(lastLook: Bool) {
        // Held weakly: an instance that goes away takes its watch along.
        Self.queue.asyncAfter(deadline: .now() + period) { [weak self] in self?.look(last: lastLook) }
    }

    /// One look at the mark; `last`: the look after the timer was disarmed.
    private func look(last: Bool) {
        let mark = running.load(ordering: .acquiring)
        let outermost = outermost.load(ordering: .acquiring)
        let serial = serial.load(ordering: .relaxed)
        let now = ContinuousClock.now
        var reports: [Report] = []
        let watched = mark & 0xFF_FFFF != 0 && mark != exempt.load(ordering: .relaxed)
        // Read before the lock: the instance may be setting it.
        let event = watched ? eventName.withLock { $0 } : ""
        let module = watched ? metrics.module(atIndex: Int(mark & 0xFF_FFFF) - 1) : nil
        // Reports are made under the lock, so that a callback that returns right after it
        // is found overdue (`returned`, which takes the lock) is said to be late only after
        // it was said to be overdue.
        let active = looks.withLock { looks -> Bool in
            defer {
                looks.serial = serial
                for report in reports { self.report(report) }
            }
            if let overdue = looks.overdue, overdue.mark != mark, overdue.mark != outermost {
                // Returned, and `leave` had not seen it overdue yet. (One that calls a nested
                // callback is still the outermost: two levels of nesting below an overdue
                // callback would say it returned, and find it overdue again later.)
                var handler = overdue.handler
                handler.elapsed = now - overdue.since
                reports.append(.returned(handler))
                looks.overdue = nil
                overdueMark.store(0, ordering: .relaxed)
            }
            guard watched, let module else { return mark != 0 || serial != looks.serial }
            guard let since = looks.seen.first(where: { $0.mark == mark })?.since else {
                if looks.seen.count == Self.marksKept { looks.seen.removeFirst() }
                looks.seen.append((mark, now))
                return true
            }
            guard looks.overdue == nil, now - since >= deadline else { return true }
            let handler = OverdueHandler(module: module.module, plugin: module.plugin, event: event, elapsed: now - since)
            looks.overdue = (mark, handler, since)
            overdueMark.store(mark, ordering: .relaxed)
            reports.append(.overdue(handler, module))
            return true
        }
        if !last {
            if active {
                schedule(lastLook: false)
            } else {
                armed.store(false, ordering: .releasing)
                schedule(lastLook: true)
            }
        } else if active, armed.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged {
            // Callbacks ran since it was disarmed and none armed it again: it goes on. (One
            // that did arm it runs a timer of its own, and this one ends.)
            schedule(lastLook: false)
        }
    }
}
