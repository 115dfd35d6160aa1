import CDynamicLoader
import DaemonKit
import Glibc
import ModuleKit
import Synchronization

/// The one thread that watches every worker of the process (docs/isolation.md): it reads
/// each worker's control socket (replies, log lines, notifications), reads the calls socket
/// of a worker while calls wait for replies that no caller reads, writes what a worker's
/// sockets had no room for once they have room (`FrameOutbox`), kills a worker that has not
/// read a frame by its deadline, kills one that leaves a frame it writes unfinished (no byte
/// of the rest within the event deadline), reaps each worker when it ends (its pidfd polls
/// readable), and kills a worker asked to stop that has not ended in time.
///
/// One thread whatever the number of workers and however often they are replaced: a
/// thread that comes and goes with each worker leaves memory behind in the daemon (its
/// malloc arena, its cached stack), so replaces would grow the daemon.
///
/// Nothing it calls waits for a worker: a reply completes a waiter, a log line is logged,
/// a notification is queued, a frame is written as far as the socket takes it now, an end
/// is reported to the plugin (which schedules a restart).
final class WorkerPoller: Sendable {
    static let shared = WorkerPoller()

    private enum Request {
        case watch(WorkerConnection, pidfd: Int32)
        /// Kill the worker at that time unless it has ended by then.
        case kill(WorkerConnection, at: ContinuousClock.Instant)
        /// Its outboxes hold frames the sockets had no room for.
        case flush(WorkerConnection)
        /// Read its calls socket for the calls waiting (no caller reads it any more).
        case readCalls(WorkerConnection, FrameReader)
        /// No call may wait any more: give the calls socket back if none does.
        case releaseCalls(WorkerConnection)
    }

    /// A watched worker, owned by the poller thread.
    private struct Entry {
        let connection: WorkerConnection
        let pidfd: Int32
        /// Its control socket's frames; nil once that stream has ended.
        var reader: FrameReader?
        /// Its calls socket's frames while this thread reads them for waiting calls.
        var calls: FrameReader?
        /// Since when `reader` and `calls` hold the start of a frame and nothing more of it
        /// has come: nil while they hold none.
        var controlStalled: ContinuousClock.Instant?
        var callsStalled: ContinuousClock.Instant?
        var killAt: ContinuousClock.Instant?
        /// For each of `connection.outboxes`: the earliest deadline of the frames it holds,
        /// nil when it holds none.
        var flushBy: [ContinuousClock.Instant?]
    }

    /// What a descriptor polled stands for.
    private enum Slot {
        case wake
        case control(Int)
        case process(Int)
        case calls(Int)
        case outbox(Int, Int)
    }

    private let requests = Mutex<[Request]>([])
    /// Written to wake the thread from `poll`, drained by it.
    private let wakeRead: Int32
    private let wakeWrite: Int32

    private init() {
        var ends: [Int32] = [-1, -1]
        guard modhost_worker_wake_pipe(&ends) == 0 else {
            fatalError("modhostd cannot create a pipe for its worker poller: \(SystemError.describe(errno))")
        }
        wakeRead = ends[0]
        wakeWrite = ends[1]
        do throws(SystemError) {
            try startThread(name: "worker.poll") { [self] in run() }
        } catch {
            fatalError("modhostd cannot start the thread of its worker poller: \(error)")
        }
    }

    /// Watches `connection`'s worker from now until it has been reaped: its control socket
    /// is read and its end reported (`WorkerConnection.received`, `.streamEnded`,
    /// `.reap`). Takes `pidfd`, which it closes once the worker is reaped.
    func watch(_ connection: WorkerConnection, pidfd: Int32) {
        submit(.watch(connection, pidfd: pidfd))
    }

    /// Kills `connection`'s worker after `delay` unless it has ended by then.
    func kill(_ connection: WorkerConnection, after delay: Duration) {
        submit(.kill(connection, at: ContinuousClock.now + delay))
    }

    /// Writes the frames `connection`'s outboxes queued as the sockets take them, each by
    /// its deadline (else the worker is killed for it).
    func flush(_ connection: WorkerConnection) {
        submit(.flush(connection))
    }

    /// Reads `connection`'s calls socket with `reader` for the calls that wait, until none
    /// waits (then the reader is given back: `WorkerConnection.returnCallsReader`).
    func readCalls(_ connection: WorkerConnection, _ reader: FrameReader) {
        submit(.readCalls(connection, reader))
    }

    /// Gives `connection`'s calls socket back if no call waits any more.
    func releaseCalls(_ connection: WorkerConnection) {
        submit(.releaseCalls(connection))
    }

    private func submit(_ request: Request) {
        requests.withLock { $0.append(request) }
        var one: UInt8 = 1
        _ = Glibc.write(wakeWrite, &one, 1)
    }

    private func run() {
        var entries: [Entry] = []
        var fds: [pollfd] = []
        var slots: [Slot] = []
        var drain = [UInt8](repeating: 0, count: 64)
        while true {
            for request in requests.withLock({ pending in defer { pending = [] }; return pending }) {
                apply(request, to: &entries)
            }
            actOnDeadlines(&entries, now: .now)
            let next = pollSet(entries, &fds, &slots)
            let ready = fds.withUnsafeMutableBufferPointer { poll($0.baseAddress, nfds_t($0.count), Self.timeout(until: next)) }
            guard ready > 0 else { continue }  // timed out, or EINTR
            var reaped: [Int] = []
            for (slot, fd) in zip(slots, fds) where fd.revents != 0 {
                switch slot {
                case .wake:
                    while drain.withUnsafeMutableBytes({ Glibc.read(wakeRead, $0.baseAddress!, 64) }) > 0 {}
                case .control(let index):
                    read(&entries[index], budget: 16)
                case .calls(let index):
                    readCalls(&entries[index], budget: 16)
                case .outbox(let index, let outbox):
                    flush(&entries[index], outbox, now: .now)
                case .process(let index):
                    reaped.append(index)
                }
            }
            for index in reaped { reap(&entries[index]) }
            for index in reaped.sorted().reversed() {
                close(entries[index].pidfd)
                entries.remove(at: index)
            }
        }
    }

    /// Carries out one request of another thread.
    private func apply(_ request: Request, to entries: inout [Entry]) {
        let index: Int?
        switch request {
        case .watch(let connection, let pidfd):
            entries.append(Entry(connection: connection, pidfd: pidfd, reader: FrameReader(fd: connection.control.channel.fd, maximumSize: WorkerFrame.controlMaximumSize),
                                 flushBy: connection.outboxes.map { _ in nil }))
            return
        case .kill(let connection, _), .flush(let connection), .readCalls(let connection, _), .releaseCalls(let connection):
            index = entries.firstIndex { $0.connection === connection }
        }
        switch (request, index) {
        case (.kill(_, let at), let index?):
            entries[index].killAt = min(at, entries[index].killAt ?? at)
        case (.flush, let index?):
            for outbox in entries[index].flushBy.indices { flush(&entries[index], outbox, now: .now) }
        case (.flush(let connection), nil):
            // Reaped already: nothing more is written.
            for outbox in connection.outboxes { outbox.abandon() }
        case (.readCalls(_, let reader), let index?):
            entries[index].calls = reader
            readCalls(&entries[index], budget: 16)
        case (.readCalls(let connection, _), nil):
            connection.endCalls(.closed)
        case (.releaseCalls, let index?):
            if let reader = entries[index].calls, entries[index].connection.returnCallsReader(reader) { entries[index].calls = nil }
        default:
            break
        }
    }

    /// Kills the workers whose time is up and flushes the frames whose deadline came.
    private func actOnDeadlines(_ entries: inout [Entry], now: ContinuousClock.Instant) {
        for index in entries.indices {
            if let at = entries[index].killAt, at <= now {
                entries[index].killAt = nil
                entries[index].connection.killUnlessEnded()
            }
            killIfUnfinished(&entries[index], now: now)
            for outbox in entries[index].flushBy.indices {
                if let by = entries[index].flushBy[outbox], by <= now { flush(&entries[index], outbox, now: now) }
            }
        }
    }

    /// The descriptors to poll (`fds`, with what each is in `slots`): the wake-up pipe, then
    /// each worker's control socket, process, calls socket while the poller reads it, and
    /// outboxes with frames waiting; and the next deadline to wake up for.
    private func pollSet(_ entries: [Entry], _ fds: inout [pollfd], _ slots: inout [Slot]) -> ContinuousClock.Instant? {
        fds.removeAll(keepingCapacity: true)
        slots.removeAll(keepingCapacity: true)
        fds.append(pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0))
        slots.append(.wake)
        var next: ContinuousClock.Instant?
        for (index, entry) in entries.enumerated() {
            fds.append(pollfd(fd: entry.reader == nil ? -1 : entry.connection.control.channel.fd, events: Int16(POLLIN), revents: 0))
            slots.append(.control(index))
            fds.append(pollfd(fd: entry.pidfd, events: Int16(POLLIN), revents: 0))
            slots.append(.process(index))
            if entry.calls != nil {
                fds.append(pollfd(fd: entry.connection.callsDescriptor, events: Int16(POLLIN), revents: 0))
                slots.append(.calls(index))
            }
            for (outbox, by) in entry.flushBy.enumerated() {
                guard let by else { continue }
                fds.append(pollfd(fd: entry.connection.outboxes[outbox].channel.fd, events: Int16(POLLOUT), revents: 0))
                slots.append(.outbox(index, outbox))
                next = min(by, next ?? by)
            }
            if let at = entry.killAt { next = min(at, next ?? at) }
            if let stalled = entry.controlStalled ?? entry.callsStalled {
                let at = min(stalled, entry.callsStalled ?? stalled) + entry.connection.frameDeadline
                next = min(at, next ?? at)
            }
        }
        return next
    }

    /// The worker of `entry` has ended: what it wrote is all there, read before its end is
    /// reported, which shuts the sockets, so that the streams end too.
    private func reap(_ entry: inout Entry) {
        read(&entry, budget: 256)
        readCalls(&entry, budget: 256)
        entry.connection.reap()
        read(&entry, budget: 256)
        readCalls(&entry, budget: 256)
        if entry.reader != nil {
            entry.reader = nil
            entry.connection.streamEnded()
        }
        if entry.calls != nil {
            entry.calls = nil
            entry.connection.endCalls(.closed)
        }
        for outbox in entry.connection.outboxes { outbox.abandon() }
    }

    /// Reads up to `budget` times what `entry`'s control socket holds and hands each whole
    /// frame to its connection; at the end of the stream (or a bad frame, whose worker is
    /// killed), says so once.
    private func read(_ entry: inout Entry, budget: Int) {
        guard entry.reader != nil else { return }
        do throws(FrameReader.End) {
            let received = try Self.drain(&entry.reader!, budget: budget, to: entry.connection.received)
            entry.controlStalled = Self.stalled(entry.reader!, since: entry.controlStalled, received: received)
        } catch {
            entry.reader = nil
            entry.controlStalled = nil
            // A frame too large or not a JSON object ends the connection, and so the worker.
            if case .invalid(let reason) = error { entry.connection.kill(reason: "it sent an invalid frame (\(reason))") }
            entry.connection.streamEnded()
        }
    }

    /// Reads up to `budget` times what `entry`'s calls socket holds, if this thread reads
    /// it, and hands each reply to its caller; gives the socket back once no call waits.
    private func readCalls(_ entry: inout Entry, budget: Int) {
        guard entry.calls != nil else { return }
        do throws(FrameReader.End) {
            let received = try Self.drain(&entry.calls!, budget: budget, to: entry.connection.callReplied)
            entry.callsStalled = Self.stalled(entry.calls!, since: entry.callsStalled, received: received)
        } catch {
            entry.calls = nil
            entry.callsStalled = nil
            entry.connection.endCalls(error)
            return
        }
        if entry.connection.returnCallsReader(entry.calls!) {
            entry.calls = nil
            entry.callsStalled = nil
        }
    }

    /// Since when `reader` holds the start of a frame with nothing more of it come, after a
    /// drain that `received` bytes or not; nil when it holds none.
    private static func stalled(_ reader: FrameReader, since: ContinuousClock.Instant?, received: Bool) -> ContinuousClock.Instant? {
        guard reader.holdsUnfinishedFrame else { return nil }
        return received ? .now : since ?? .now
    }

    /// Kills `entry`'s worker once a frame it began on its control socket, or on its calls
    /// socket while this thread reads it, has had no more bytes for the event deadline: its
    /// plugin wrote there, and every frame after it would be read as the rest of that one
    /// (a call overrunning for good, the plugin refused every later call). The worker itself
    /// writes each frame whole, at once.
    private func killIfUnfinished(_ entry: inout Entry, now: ContinuousClock.Instant) {
        let deadline = entry.connection.frameDeadline
        // The rest may be in the socket already, unread while this thread was held up
        // elsewhere: the next read, in this turn of the loop, restarts the clock.
        let socket: String
        if let stalled = entry.controlStalled, stalled + deadline <= now, !entry.connection.control.channel.hasUnreadInput {
            socket = "control socket (3)"
        } else if let stalled = entry.callsStalled, stalled + deadline <= now, !entry.connection.callsHaveUnreadInput {
            socket = "socket of calls (5)"
        } else {
            return
        }
        entry.controlStalled = nil
        entry.callsStalled = nil
        entry.connection.kill(reason: "it wrote the start of a frame on its \(socket) and not the rest within \(deadline.secondsText)",
                              afterItsDeadline: true)
    }

    /// Hands every whole frame `reader` holds to `deliver`, reading what its socket holds
    /// (without waiting) up to `budget` times; throws at the end of the stream or a bad frame.
    /// Returns whether it read any byte.
    private static func drain(_ reader: inout FrameReader, budget: Int, to deliver: (WorkerMessage) -> Void) throws(FrameReader.End) -> Bool {
        var reads = 0
        while true {
            while let message = try reader.buffered() { deliver(message) }
            guard reads < budget, try reader.receiveAvailable() else { return reads > 0 }
            reads += 1
        }
    }

    /// Writes what outbox `outbox` of `entry` holds as far as its socket takes it; kills
    /// the worker once a frame is overdue.
    private func flush(_ entry: inout Entry, _ outbox: Int, now: ContinuousClock.Instant) {
        switch entry.connection.outboxes[outbox].flush(now: now) {
        case .empty:
            entry.flushBy[outbox] = nil
        case .waiting(let until):
            entry.flushBy[outbox] = until
        case .overdue(let reason):
            entry.flushBy[outbox] = nil
            entry.connection.kill(reason: reason, afterItsDeadline: true)
        }
    }

    /// `poll`'s timeout in milliseconds until `deadline` (rounded up), -1 for none.
    private static func timeout(until deadline: ContinuousClock.Instant?) -> Int32 {
        guard let deadline else { return -1 }
        let left = deadline - ContinuousClock.now
        guard left > .zero else { return 0 }
        let (seconds, attoseconds) = left.components
        guard seconds < Int64(Int32.max / 1000) else { return Int32.max }
        return Int32(seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1)
    }
}
