import DaemonKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Real signals sent to this process with kill(2). Serialized: the suite owns SIGHUP,
/// SIGUSR1, SIGUSR2, SIGTERM and SIGINT while it runs; no other suite touches them.
@Suite(.timeLimit(.minutes(5)), .serialized)
struct UnixSignalsTests {
    /// The raw handler pointer value installed for `signal` (0 = SIG_DFL, 1 = SIG_IGN).
    private func currentHandler(_ signal: Int32) -> Int {
        var current = sigaction()
        sigaction(signal, nil, &current)
        return unsafeBitCast(current.__sigaction_handler.sa_handler, to: Int.self)
    }

    private func consume(_ signals: UnixSignals) -> (Collector<UnixSignal>, Task<Void, Never>) {
        let collector = Collector<UnixSignal>()
        let task = Task {
            for await signal in signals { collector.append(signal) }
        }
        return (collector, task)
    }

    @Test func signalSentBeforeIterationStartsIsDelivered() async throws {
        let signals = try UnixSignals(.hangup)
        // Nobody iterates yet: the signal must be buffered, not lost and not fatal.
        #expect(kill(getpid(), SIGHUP) == 0)
        let (received, consumer) = consume(signals)
        #expect(await received.waitFor { $0.contains(.hangup) })
        signals.cancel()
        await consumer.value
    }

    @Test func terminateAndInterruptAreDeliveredInsteadOfKillingTheProcess() async throws {
        let signals = try UnixSignals(.terminate, .interrupt)
        let (received, consumer) = consume(signals)
        #expect(kill(getpid(), SIGTERM) == 0)
        #expect(await received.waitFor { $0.contains(.terminate) })
        #expect(kill(getpid(), SIGINT) == 0)
        #expect(await received.waitFor { $0.contains(.interrupt) })
        #expect(received.all.allSatisfy { $0 == .terminate || $0 == .interrupt })
        signals.cancel()
        await consumer.value
    }

    @Test func onlyRequestedSignalsAreDelivered() async throws {
        let user1 = try UnixSignals(.user1)
        let user2 = try UnixSignals(.user2)
        let (got1, consumer1) = consume(user1)
        let (got2, consumer2) = consume(user2)
        #expect(kill(getpid(), SIGUSR2) == 0)
        #expect(await got2.waitFor { $0 == [.user2] })
        #expect(kill(getpid(), SIGUSR1) == 0)
        #expect(await got1.waitFor { $0 == [.user1] })
        #expect(got2.all == [.user2])
        user1.cancel()
        user2.cancel()
        await consumer1.value
        await consumer2.value
    }

    @Test func everySubscriberOfASignalReceivesIt() async throws {
        let first = try UnixSignals(.user1)
        let second = try UnixSignals(.user1, .hangup)
        let (got1, consumer1) = consume(first)
        let (got2, consumer2) = consume(second)
        #expect(kill(getpid(), SIGUSR1) == 0)
        #expect(await got1.waitFor { $0.contains(.user1) })
        #expect(await got2.waitFor { $0.contains(.user1) })
        first.cancel()
        // The remaining subscriber still holds SIGUSR1.
        #expect(kill(getpid(), SIGUSR1) == 0)
        #expect(await got2.waitFor { $0.filter { $0 == .user1 }.count >= 2 })
        second.cancel()
        await consumer1.value
        await consumer2.value
    }

    @Test func previousDispositionIsRestoredAfterTheLastSubscriberGoes() async throws {
        var ignore = sigaction()
        ignore.__sigaction_handler.sa_handler = SIG_IGN
        var original = sigaction()
        sigaction(SIGUSR2, &ignore, &original)
        defer { sigaction(SIGUSR2, &original, nil) }
        #expect(currentHandler(SIGUSR2) == 1)

        do {
            let first = try UnixSignals(.user2)
            let second = try UnixSignals(.user2)
            #expect(currentHandler(SIGUSR2) > 1)  // our handler
            first.cancel()
            withExtendedLifetime(second) {
                #expect(currentHandler(SIGUSR2) > 1)  // still held by `second`
            }
            // `second` is released here: its deinit unregisters.
        }
        #expect(currentHandler(SIGUSR2) == 1)
    }

    @Test(.timeLimit(.minutes(1)))
    func cancelEndsIteration() async throws {
        let signals = try UnixSignals(.hangup)
        let (_, consumer) = consume(signals)
        signals.cancel()
        signals.cancel()  // idempotent
        await consumer.value  // returns only because the sequence finished
    }

    @Test func uncatchableSignalIsRefusedAndLeavesNothingInstalled() throws {
        let before = currentHandler(SIGUSR1)
        #expect(throws: SystemError.self) { try UnixSignals(.user1, UnixSignal(rawValue: SIGKILL)) }
        #expect(currentHandler(SIGUSR1) == before)
        do {
            _ = try UnixSignals(UnixSignal(rawValue: SIGSTOP))
            Issue.record("SIGSTOP registration should fail")
        } catch {
            #expect(error.code == EINVAL)
            #expect(error.syscall == "sigaction")
        }
    }

    @Test func signalNames() {
        #expect(UnixSignal.terminate.description == "SIGTERM")
        #expect(UnixSignal.hangup.description == "SIGHUP")
        #expect(UnixSignal(rawValue: 40).description == "SIG40")
    }
}
