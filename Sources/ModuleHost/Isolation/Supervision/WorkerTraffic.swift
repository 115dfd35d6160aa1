import Dispatch
import ModuleKit
import Synchronization

/// The notifications an isolated plugin's worker posted (`{"op":"post"}` frames) that the
/// daemon's host has not delivered yet, bounded (docs/isolation.md, "Floods").
///
/// - At most `limit` wait, with payloads of at most `byteLimit` in all (a worker's frame
///   holds up to 1 MiB): a post that comes while they are full is dropped (delivered to no
///   module), counted (`dropped`) and said in one warning a second at most, naming the
///   plugin. The daemon reads on however many wait, so the plugin's `post` waits at most for
///   its frame to be read, never for delivery, and says nothing: a plugin that posts faster
///   than the daemon delivers loses the excess; nothing else does.
/// - They are delivered in the order the worker made them, on the host's context, at most
///   `batch` per turn and no more once a turn has lasted `turnBudget`: a flooding plugin
///   holds the host for one short turn at a time (one handler, when its handlers are slow),
///   so what other modules post (each source its own turn) waits behind one turn, never a
///   backlog.
/// - `post` never waits (the worker poller calls it for every worker).
final class NotificationQueue: Sendable {
    /// The most notifications of one plugin waiting for delivery in the daemon.
    static let limit = 256
    /// The most bytes of payload (as JSON text) of one plugin's notifications waiting.
    static let byteLimit = 16 << 20
    /// The most delivered in one turn on the host's context.
    static let batch = 16
    /// How long a turn goes on delivering: once its deliveries have taken this long, the
    /// rest wait for the next turn, behind what else waits for the host. A plugin whose
    /// handlers are slow (each within its deadline) thus holds the host one handler at a
    /// time, as a module in process does, not `batch` handlers.
    static let turnBudget = Duration.milliseconds(10)

    private struct Waiting: Sendable {
        let name: String
        let payload: JSONValue
        let module: String?
        let bytes: Int
    }
    private struct State {
        var waiting: [Waiting] = []
        var bytes = 0
        var draining = false
    }
    private let state = Mutex(State())
    private let host: HostInstance
    /// Posts dropped since the queue was made.
    let dropped: DropReport

    init(host: HostInstance, plugin: String, logger: Logger) {
        self.host = host
        let logger = logger.with("plugin", plugin)
        dropped = DropReport { count in
            logger.warning("\(count) notifications of plugin \(plugin) dropped: its worker posts faster than the daemon delivers them (more than \(Self.limit) waiting, or \(Self.byteLimit >> 20) MiB of payloads)",
                           [("dropped", "\(count)")])
        }
    }

    /// Queues notification `name` (to module `module` only, when given), or drops it when
    /// `limit` wait.
    func post(_ name: String, payload: JSONValue, to module: String?) {
        let bytes = payload.jsonText.utf8.count
        let start = state.withLock { state -> Bool? in
            guard state.waiting.count < Self.limit, state.bytes + bytes <= Self.byteLimit else { return nil }
            state.waiting.append(Waiting(name: name, payload: payload, module: module, bytes: bytes))
            state.bytes += bytes
            defer { state.draining = true }
            return !state.draining
        }
        switch start {
        case nil: dropped.count()
        // Medium, as a task made outside any task: a higher priority would let a flooding
        // plugin's batches go before what the others posted.
        case true?: Task.detached(priority: .medium) { [self] in await drain() }
        case false?: break
        }
    }

    /// Delivers what waits, a turn at a time on the host's context, until nothing does.
    private func drain() async {
        while await host.perform({ host in self.deliverTurn(host) }) {}
    }

    /// One turn: delivers what waits, in order, until `batch` are delivered or the turn has
    /// lasted `turnBudget` (a handler may take up to its deadline, so a turn is at most one
    /// handler longer). False once nothing waits: the queue is no longer draining.
    private func deliverTurn(_ host: isolated HostInstance) -> Bool {
        let start = ContinuousClock.now
        for _ in 0..<Self.batch {
            guard let notification = next() else { return false }
            if let module = notification.module {
                host.send(.notification(name: notification.name, payload: notification.payload), to: module)
            } else {
                host.post(notification: notification.name, payload: notification.payload)
            }
            if ContinuousClock.now - start >= Self.turnBudget { break }
        }
        return true
    }

    /// The first notification waiting, taken from the queue; nil (and no longer draining)
    /// when none is.
    private func next() -> Waiting? {
        state.withLock { state in
            guard !state.waiting.isEmpty else {
                state.draining = false
                return nil
            }
            let first = state.waiting.removeFirst()
            state.bytes -= first.bytes
            return first
        }
    }
}

/// At most `perSecond` log lines a second from an isolated plugin's worker (its log
/// frames), as the daemon counts them, whatever the worker claims: the rest of that second's
/// are dropped and counted, and said in one warning (docs/isolation.md, "Floods"). Each line
/// is bounded too (`bounded`, `maximumPairs`).
final class LogLineRate: Sendable {
    /// The most log lines of one plugin logged in one second, as for its output
    /// (`WorkerOutput.linesPerSecond`).
    static let perSecond = WorkerOutput.linesPerSecond
    private let window = Mutex((start: ContinuousClock.now, logged: 0))
    /// Log lines dropped since it was made.
    let dropped: DropReport

    init(plugin: String, logger: Logger) {
        let logger = logger.with("plugin", plugin)
        dropped = DropReport { count in
            logger.warning("\(count) log lines of plugin \(plugin) dropped (more than \(Self.perSecond) in a second)",
                           [("dropped", "\(count)")])
        }
    }

    /// The most bytes of a line's message, and of each metadata value, that are logged, as
    /// for its output (`WorkerOutput.maximumLine`); the most metadata pairs.
    static let maximumText = WorkerOutput.maximumLine
    static let maximumPairs = 32

    /// `text`, or its first bytes and how many were cut (` [N bytes cut]`), `maximumText`
    /// bytes at most in all: cut again (a worker's line, in the daemon), it stays as it is.
    static func bounded(_ text: String) -> String {
        let bytes = text.utf8
        guard bytes.count > maximumText else { return text }
        // Room for the note (at most 33 bytes) and a character cut in two (U+FFFD, 3 bytes).
        let kept = maximumText - 40
        return String(decoding: bytes.prefix(kept), as: UTF8.self) + " [\(bytes.count - kept) bytes cut]"
    }

    /// Whether a line may be logged now; counts it as dropped if not.
    func admit() -> Bool {
        let now = ContinuousClock.now
        let admitted = window.withLock { window -> Bool in
            if now - window.start >= .seconds(1) { window = (now, 0) }
            guard window.logged < Self.perSecond else { return false }
            window.logged += 1
            return true
        }
        if !admitted { dropped.count() }
        return admitted
    }
}

/// What the daemon dropped of a worker's frames: a total, and one line a second at most
/// saying how many since the last (`say`, a second after the first of them).
final class DropReport: Sendable {
    private let counts = Mutex((total: UInt64(0), unsaid: 0))
    private let say: @Sendable (Int) -> Void

    init(say: @escaping @Sendable (Int) -> Void) {
        self.say = say
    }

    /// Dropped so far.
    var total: UInt64 { counts.withLock { $0.total } }

    /// Counts one dropped; the first since the last line schedules the next.
    func count() {
        let first = counts.withLock { counts -> Bool in
            counts.total += 1
            counts.unsaid += 1
            return counts.unsaid == 1
        }
        guard first else { return }
        DispatchQueue.global().asyncAfter(deadline: .now() + 1) { [self] in
            let unsaid = counts.withLock { counts in
                defer { counts.unsaid = 0 }
                return counts.unsaid
            }
            say(unsaid)
        }
    }
}

extension DropReport {
    /// Notifications `poster` (e.g. "plugin NAME") posted under a lifecycle name
    /// (`ModuleEvent.lifecycleNames`), which only the host sends: refused where they are
    /// posted, so that no module that listens logs one warning per post in its own name.
    static func lifecycleNamedNotifications(poster: String, logger: Logger) -> DropReport {
        DropReport { count in
            logger.warning("\(count) notifications named like a lifecycle event posted by \(poster) not delivered: only the host sends \(ModuleEvent.lifecycleNames.sorted().joined(separator: ", "))",
                           [("refused", "\(count)")])
        }
    }
}
