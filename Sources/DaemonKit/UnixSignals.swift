#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// A Unix signal number with readable names for the ones a daemon handles.
public struct UnixSignal: Hashable, Sendable, CustomStringConvertible {
    /// The signal number, e.g. `SIGTERM`.
    public let rawValue: Int32

    /// Wraps a signal number.
    public init(rawValue: Int32) { self.rawValue = rawValue }

    /// SIGTERM: graceful shutdown.
    public static let terminate = UnixSignal(rawValue: SIGTERM)
    /// SIGINT: interrupt (Ctrl-C), treated like SIGTERM by daemons.
    public static let interrupt = UnixSignal(rawValue: SIGINT)
    /// SIGHUP: reload configuration.
    public static let hangup = UnixSignal(rawValue: SIGHUP)
    /// SIGQUIT.
    public static let quit = UnixSignal(rawValue: SIGQUIT)
    /// SIGUSR1.
    public static let user1 = UnixSignal(rawValue: SIGUSR1)
    /// SIGUSR2.
    public static let user2 = UnixSignal(rawValue: SIGUSR2)
    /// SIGCHLD.
    public static let child = UnixSignal(rawValue: SIGCHLD)
    /// SIGWINCH.
    public static let windowChanged = UnixSignal(rawValue: SIGWINCH)
    /// SIGALRM.
    public static let alarm = UnixSignal(rawValue: SIGALRM)

    /// The conventional name, e.g. `SIGTERM`; `SIG<n>` for numbers without one here.
    public var description: String {
        switch rawValue {
        case SIGTERM: "SIGTERM"
        case SIGINT: "SIGINT"
        case SIGHUP: "SIGHUP"
        case SIGQUIT: "SIGQUIT"
        case SIGUSR1: "SIGUSR1"
        case SIGUSR2: "SIGUSR2"
        case SIGCHLD: "SIGCHLD"
        case SIGWINCH: "SIGWINCH"
        case SIGALRM: "SIGALRM"
        case SIGPIPE: "SIGPIPE"
        default: "SIG\(rawValue)"
        }
    }
}

/// The signals a process receives, as an `AsyncSequence`.
///
/// The initializer installs the handlers before it returns, so a signal sent right after
/// `UnixSignals(...)` returns is buffered and delivered on the first `next()`; none is
/// lost and none runs the default action (termination) while this object lives.
/// Delivery order is the order the process received them; the same signal sent twice
/// before the handler ran may arrive once (the kernel merges pending standard signals).
///
/// Several `UnixSignals` may exist at once, for the same or different signals: each one
/// receives every signal it asked for. When the last one for a signal is cancelled or
/// deinitialized, the disposition that was in place before the first registration is
/// restored.
///
/// How: a `sigaction` handler writes the signal number to a non-blocking pipe
/// (async-signal-safe), and one dedicated thread reads the pipe and feeds the sequences.
/// This works whatever the signal masks of other threads are, unlike `signalfd`.
///
/// One consumer per instance: iterate it from one task.
public final class UnixSignals: AsyncSequence, Sendable {
    /// Each element is one received signal.
    public typealias Element = UnixSignal

    /// The signals this sequence delivers.
    public let signals: [UnixSignal]
    private let stream: AsyncStream<UnixSignal>
    private let token: UInt64

    /// Starts receiving `signals` (duplicates are ignored). Throws if a handler cannot be
    /// installed, e.g. for SIGKILL or SIGSTOP; nothing stays registered then.
    public init(_ signals: [UnixSignal]) throws(SystemError) {
        var unique: [UnixSignal] = []
        for signal in signals where !unique.contains(signal) { unique.append(signal) }
        self.signals = unique
        let (stream, continuation) = AsyncStream.makeStream(
            of: UnixSignal.self, bufferingPolicy: .bufferingOldest(256))
        self.stream = stream
        self.token = try SignalDispatcher.shared.register(unique.map(\.rawValue), continuation)
    }

    /// Variadic form of `init(_:)`.
    public convenience init(_ signals: UnixSignal...) throws(SystemError) {
        try self.init(signals)
    }

    /// Stops receiving: iteration ends after the signals already buffered, and the
    /// previous dispositions are restored if no other `UnixSignals` holds them. Idempotent.
    public func cancel() {
        SignalDispatcher.shared.unregister(token)
    }

    deinit { SignalDispatcher.shared.unregister(token) }

    /// The iterator; create one per instance (single consumer).
    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: stream.makeAsyncIterator(), owner: self)
    }

    /// Iterates the received signals; holds the sequence alive while it iterates.
    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: AsyncStream<UnixSignal>.Iterator
        let owner: UnixSignals

        /// The next received signal, or nil after `cancel()`.
        public mutating func next() async -> UnixSignal? { await base.next() }
    }
}

/// Signals handed to a handler as they arrive, on the one thread that reads every signal
/// of the process: never on a thread of Swift concurrency, so it runs even while every one
/// of those is held (by code the process loads, say). Otherwise as `UnixSignals`: the
/// handlers are installed before the initializer returns, and the previous dispositions
/// come back when the last subscriber of a signal is gone.
///
/// The handler must return quickly: every signal of the process waits for it.
public final class UnixSignalWatch: Sendable {
    private let token: UInt64

    /// Starts calling `handler` for each of `signals` received, until `cancel()`.
    public init(_ signals: [UnixSignal], handler: @escaping @Sendable (UnixSignal) -> Void) throws(SystemError) {
        token = try SignalDispatcher.shared.register(Array(Set(signals.map(\.rawValue))).sorted(), .init(deliver: handler, finish: {}))
    }

    /// Stops calling the handler (a call under way finishes). Idempotent.
    public func cancel() { SignalDispatcher.shared.unregister(token) }

    deinit { SignalDispatcher.shared.unregister(token) }
}

/// The write end of the signal pipe, read by the signal handler. An atomic load is
/// async-signal-safe; -1 until the dispatcher has created its pipe.
private let signalPipeWriteEnd = Atomic<Int32>(-1)
/// The process whose reader thread reads the pipe (set with the pipe).
private let signalPipeOwner = Atomic<Int32>(-1)

/// The process-wide signal handler: records the signal number in the pipe. Uses only
/// async-signal-safe operations and preserves `errno`.
///
/// In a process forked from this one without exec (by code it loaded), which inherits the
/// handler and the pipe but not the reader, the signal takes its default action instead: a
/// SIGTERM sent to such a child ends it, and never reaches this process's subscribers.
private func recordSignal(_ signo: Int32) {
    let savedErrno = Glibc.errno
    if getpid() != signalPipeOwner.load(ordering: .acquiring) {
        signal(signo, SIG_DFL)
        raise(signo)
        Glibc.errno = savedErrno
        return
    }
    let fd = signalPipeWriteEnd.load(ordering: .acquiring)
    if fd >= 0 {
        var byte = UInt8(truncatingIfNeeded: signo)
        _ = Glibc.write(fd, &byte, 1)
    }
    Glibc.errno = savedErrno
}

/// Owns the signal pipe, its reader thread, the installed handlers and the subscribers.
private final class SignalDispatcher: Sendable {
    static let shared = SignalDispatcher()

    private struct State {
        var readEnd: Int32 = -1
        var nextToken: UInt64 = 1
        /// token -> how to hand a signal to one subscriber (a `UnixSignals`'s stream, a
        /// `UnixSignalWatch`'s handler), and what ends that subscription.
        var subscriptions: [UInt64: Subscription] = [:]
        /// signal number -> tokens subscribed to it.
        var subscribers: [Int32: Set<UInt64>] = [:]
        /// The dispositions that were in place before we installed ours.
        var previousActions: [Int32: sigaction] = [:]
    }

    private let state = Mutex(State())

    struct Subscription: Sendable {
        let deliver: @Sendable (UnixSignal) -> Void
        let finish: @Sendable () -> Void
    }

    func register(_ numbers: [Int32], _ continuation: AsyncStream<UnixSignal>.Continuation)
        throws(SystemError) -> UInt64
    {
        try register(numbers, Subscription(deliver: { continuation.yield($0) }, finish: { continuation.finish() }))
    }

    func register(_ numbers: [Int32], _ subscription: Subscription) throws(SystemError) -> UInt64 {
        let result: Result<UInt64, SystemError> = state.withLock { state in
            do throws(SystemError) {
                if state.readEnd < 0 { state.readEnd = try Self.startReader() }
                let token = state.nextToken
                state.nextToken += 1
                state.subscriptions[token] = subscription
                for number in numbers {
                    // Subscribe first so a signal arriving right after sigaction is routed.
                    state.subscribers[number, default: []].insert(token)
                    if state.previousActions[number] == nil {
                        do throws(SystemError) {
                            state.previousActions[number] = try Self.install(number)
                        } catch {
                            _ = Self.remove(token, &state)  // undo this registration entirely
                            throw error
                        }
                    }
                }
                return .success(token)
            } catch {
                return .failure(error)
            }
        }
        switch result {
        case .success(let token): return token
        case .failure(let error):
            subscription.finish()
            throw error
        }
    }

    func unregister(_ token: UInt64) {
        let subscription = state.withLock { state in Self.remove(token, &state) }
        subscription?.finish()
    }

    /// Removes a subscriber from every signal, restoring the old disposition of each
    /// signal it was the last subscriber of. Returns its subscription, if still registered.
    private static func remove(_ token: UInt64, _ state: inout State) -> Subscription? {
        for number in Array(state.subscribers.keys) {
            state.subscribers[number]?.remove(token)
            guard state.subscribers[number]?.isEmpty ?? false else { continue }
            state.subscribers[number] = nil
            if var previous = state.previousActions.removeValue(forKey: number) {
                _ = sigaction(number, &previous, nil)
            }
        }
        return state.subscriptions.removeValue(forKey: token)
    }

    /// Installs `recordSignal` for `number` and returns the previous disposition.
    private static func install(_ number: Int32) throws(SystemError) -> sigaction {
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { recordSignal($0) }
        sigemptyset(&action.sa_mask)
        // SA_RESTART: other threads' blocking calls are not interrupted with EINTR.
        action.sa_flags = Int32(SA_RESTART)
        var previous = sigaction()
        try valueOrErrno("sigaction", subject: "\(UnixSignal(rawValue: number))") {
            sigaction(number, &action, &previous)
        }
        return previous
    }

    /// Creates the pipe and starts the thread that reads it; returns the read end. Throws
    /// (with nothing left open) if either cannot be made.
    private static func startReader() throws(SystemError) -> Int32 {
        let (readEnd, writeEnd) = try GNUCalls.makePipe(nonBlocking: false)
        // The handler must never block: a full pipe drops the byte instead.
        let flags = fcntl(writeEnd, F_GETFL)
        _ = fcntl(writeEnd, F_SETFL, flags | O_NONBLOCK)
        do throws(SystemError) {
            try startThread(name: "dk-signals") { SignalDispatcher.shared.readLoop(readEnd) }
        } catch {
            closeDescriptor(readEnd)
            closeDescriptor(writeEnd)
            throw error
        }
        signalPipeOwner.store(getpid(), ordering: .releasing)
        signalPipeWriteEnd.store(writeEnd, ordering: .releasing)
        return readEnd
    }

    /// Runs for the life of the process: reads signal numbers and routes them.
    private func readLoop(_ readEnd: Int32) {
        var buffer = [UInt8](repeating: 0, count: 64)
        while true {
            let count = buffer.withUnsafeMutableBytes { Glibc.read(readEnd, $0.baseAddress, $0.count) }
            if count < 0 {
                if Glibc.errno == EINTR { continue }
                return
            }
            if count == 0 { return }
            for index in 0..<count {
                let number = Int32(buffer[index])
                let targets = state.withLock { state in
                    (state.subscribers[number] ?? []).sorted().compactMap { state.subscriptions[$0] }
                }
                for target in targets { target.deliver(UnixSignal(rawValue: number)) }
            }
        }
    }
}
