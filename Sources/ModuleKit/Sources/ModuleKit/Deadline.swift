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
