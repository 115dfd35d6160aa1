internal import Dispatch
import Synchronization

/// Decides, once, whether an awaited handler or its deadline came first.
///
/// The handler task and the timer task both call `finish`; the first call wins and
/// resumes the waiter. Safe from any thread.
final class DeadlineRace: Sendable {
    enum Outcome: Sendable, Equatable {
        case completed
        case deadlineExceeded
    }

    private enum State {
        case pending(CheckedContinuation<Outcome, Never>?)
        case decided(Outcome)
    }

    private let state = Mutex(State.pending(nil))

    /// Records `outcome` if nothing was decided yet. Returns true when this call decided.
    @discardableResult
    func finish(_ outcome: Outcome) -> Bool {
        let (decided, waiter) = state.withLock { state -> (Bool, CheckedContinuation<Outcome, Never>?) in
            guard case .pending(let waiter) = state else { return (false, nil) }
            state = .decided(outcome)
            return (true, waiter)
        }
        waiter?.resume(returning: outcome)
        return decided
    }

    /// Suspends until an outcome is decided and returns it.
    func wait() async -> Outcome {
        await withCheckedContinuation { (continuation: CheckedContinuation<Outcome, Never>) in
            let decided = state.withLock { state -> Outcome? in
                switch state {
                case .decided(let outcome):
                    return outcome
                case .pending:
                    state = .pending(continuation)
                    return nil
                }
            }
            if let decided { continuation.resume(returning: decided) }
        }
    }
}

/// Decides `.deadlineExceeded` for every awaited handler of one host instance whose
/// deadline passes before it finishes, with one timer for all of them.
///
/// Handlers nearly always finish long before their deadline. Arming and cancelling a timer
/// for each would cost more than the rest of a delivery; here a delivery only enters and
/// leaves a table, and a single timer, armed for the earliest deadline in the table, fires
/// only when one may have passed. Safe from any thread.
final class DeadlineWatch: Sendable {
    private struct Entry {
        let race: DeadlineRace
        let due: ContinuousClock.Instant
    }

    private struct State {
        var pending: [UInt64: Entry] = [:]
        var lastID: UInt64 = 0
        /// When the timer fires next; nil when no timer is armed.
        var armedFor: ContinuousClock.Instant?
    }

    private let state = Mutex(State())

    /// Watches `race` from now on: it is decided `.deadlineExceeded` once `due` has passed,
    /// unless `end` removed it first. Returns the ticket for `end`.
    func start(_ race: DeadlineRace, due: ContinuousClock.Instant) -> UInt64 {
        let (ticket, arm) = state.withLock { state -> (UInt64, Bool) in
            state.lastID += 1
            state.pending[state.lastID] = Entry(race: race, due: due)
            guard state.armedFor.map({ due < $0 }) ?? true else { return (state.lastID, false) }
            state.armedFor = due
            return (state.lastID, true)
        }
        if arm { schedule(due) }
        return ticket
    }

    /// Stops watching the race of `ticket` (its handler finished, or its outcome is known).
    func end(_ ticket: UInt64) {
        state.withLock { _ = $0.pending.removeValue(forKey: ticket) }
    }

    private func schedule(_ due: ContinuousClock.Instant) {
        let (seconds, attoseconds) = (due - ContinuousClock.now).components
        // Past a billion seconds (31 years) the timer never fires; below, nanoseconds fit.
        let delay: DispatchTimeInterval = seconds >= 1_000_000_000
            ? .never : .nanoseconds(Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000))
        // The timer holds the watch weakly: a host instance that goes away takes it along.
        DispatchQueue.global().asyncAfter(deadline: .now() + delay) { [weak self] in self?.fire(armedFor: due) }
    }

    /// Decides every race whose deadline has passed, then arms the timer for the earliest
    /// one left, if this was the armed timer (an earlier, superseded one only decides).
    private func fire(armedFor: ContinuousClock.Instant) {
        let now = ContinuousClock.now
        let (expired, next) = state.withLock { state -> ([DeadlineRace], ContinuousClock.Instant?) in
            var expired: [DeadlineRace] = []
            var earliest: ContinuousClock.Instant?
            for (ticket, entry) in state.pending {
                if entry.due <= now {
                    expired.append(entry.race)
                    state.pending[ticket] = nil
                } else if earliest.map({ entry.due < $0 }) ?? true {
                    earliest = entry.due
                }
            }
            guard state.armedFor == armedFor else { return (expired, nil) }
            state.armedFor = earliest
            return (expired, earliest)
        }
        for race in expired { race.finish(.deadlineExceeded) }
        if let next { schedule(next) }
    }
}

extension Duration {
    /// Milliseconds with three decimals, for log lines: "101.234ms".
    var millisecondsText: String {
        let (seconds, attoseconds) = components
        let microseconds = seconds * 1_000_000 + attoseconds / 1_000_000_000_000
        let whole = microseconds / 1000
        let fraction = abs(microseconds % 1000)
        let padded = String(fraction)
        return "\(whole).\(String(repeating: "0", count: 3 - padded.count))\(padded)ms"
    }
}
