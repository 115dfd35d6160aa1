import CDynamicLoader
import Foundation
import Glibc
import Synchronization

/// The one thread that watches every worker of the process (docs/isolation.md): it reads
/// each worker's control socket (replies, log lines, notifications), reaps each worker when
/// it ends (its pidfd polls readable), and kills a worker asked to stop that has not ended
/// in time.
///
/// One thread whatever the number of workers and however often they are replaced: a
/// reader and a reaper thread per worker were started and ended with each worker, and each
/// thread that came and went left memory in the daemon (its malloc arena, its cached stack,
/// libdispatch's caches), which showed as RSS and mappings per isolated replace.
///
/// Nothing it calls waits for a worker: a reply completes a waiter, a log line is logged,
/// a notification is queued, an end is reported to the plugin (which schedules a restart).
final class WorkerPoller: Sendable {
    static let shared = WorkerPoller()

    private enum Request {
        case watch(WorkerConnection, pidfd: Int32)
        /// Kill the worker at that time unless it has ended by then.
        case kill(WorkerConnection, at: ContinuousClock.Instant)
    }

    /// A watched worker, owned by the poller thread.
    private struct Entry {
        let connection: WorkerConnection
        let pidfd: Int32
        /// Its control socket's frames; nil once that stream has ended.
        var reader: FrameReader?
        var killAt: ContinuousClock.Instant?
    }

    private let requests = Mutex<[Request]>([])
    /// Written to wake the thread from `poll`, drained by it.
    private let wakeRead: Int32
    private let wakeWrite: Int32

    private init() {
        var ends: [Int32] = [-1, -1]
        guard modhost_worker_wake_pipe(&ends) == 0 else {
            fatalError("modhostd cannot create a pipe for its worker poller: \(String(cString: strerror(errno)))")
        }
        wakeRead = ends[0]
        wakeWrite = ends[1]
        let thread = Thread { [self] in run() }
        thread.name = "worker.poll"
        thread.start()
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

    private func submit(_ request: Request) {
        requests.withLock { $0.append(request) }
        var one: UInt8 = 1
        _ = Glibc.write(wakeWrite, &one, 1)
    }

    private func run() {
        var entries: [Entry] = []
        var fds: [pollfd] = []
        var drain = [UInt8](repeating: 0, count: 64)
        while true {
            for request in requests.withLock({ pending in defer { pending = [] }; return pending }) {
                switch request {
                case .watch(let connection, let pidfd):
                    entries.append(Entry(connection: connection, pidfd: pidfd, reader: FrameReader(fd: connection.channel.fd)))
                case .kill(let connection, let at):
                    if let index = entries.firstIndex(where: { $0.connection === connection }) {
                        entries[index].killAt = min(at, entries[index].killAt ?? at)
                    }
                }
            }
            let now = ContinuousClock.now
            for index in entries.indices {
                if let at = entries[index].killAt, at <= now {
                    entries[index].killAt = nil
                    entries[index].connection.killUnlessEnded()
                }
            }
            fds.removeAll(keepingCapacity: true)
            fds.append(pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0))
            for entry in entries {
                fds.append(pollfd(fd: entry.reader == nil ? -1 : entry.connection.channel.fd, events: Int16(POLLIN), revents: 0))
                fds.append(pollfd(fd: entry.pidfd, events: Int16(POLLIN), revents: 0))
            }
            let timeout = Self.timeout(until: entries.compactMap(\.killAt).min())
            let ready = fds.withUnsafeMutableBufferPointer { poll($0.baseAddress, nfds_t($0.count), timeout) }
            guard ready > 0 else { continue }  // timed out, or EINTR
            if fds[0].revents != 0 {
                while drain.withUnsafeMutableBytes({ Glibc.read(wakeRead, $0.baseAddress!, 64) }) > 0 {}
            }
            var reaped: [Int] = []
            for index in entries.indices {
                let socket = fds[1 + 2 * index]
                let process = fds[2 + 2 * index]
                if socket.revents != 0 { read(&entries[index], budget: 16) }
                if process.revents != 0 {
                    // The worker has ended: what it wrote is all there, read before its end
                    // is reported, which shuts the sockets, so that the stream ends too.
                    read(&entries[index], budget: 256)
                    entries[index].connection.reap()
                    read(&entries[index], budget: 256)
                    if entries[index].reader != nil {
                        entries[index].reader = nil
                        entries[index].connection.streamEnded()
                    }
                    reaped.append(index)
                }
            }
            for index in reaped.reversed() {
                close(entries[index].pidfd)
                entries.remove(at: index)
            }
        }
    }

    /// Reads up to `budget` times what `entry`'s control socket holds and hands each whole
    /// frame to its connection; at the end of the stream (or a bad frame, whose worker is
    /// killed), says so once.
    private func read(_ entry: inout Entry, budget: Int) {
        guard entry.reader != nil else { return }
        do throws(FrameReader.End) {
            var reads = 0
            while true {
                while let message = try entry.reader!.buffered() { entry.connection.received(message) }
                guard reads < budget, try entry.reader!.receiveAvailable() else { return }
                reads += 1
            }
        } catch {
            entry.reader = nil
            // A frame too large or not a JSON object ends the connection, and so the worker.
            if case .invalid(let reason) = error { entry.connection.kill(reason: "it sent an invalid frame (\(reason))") }
            entry.connection.streamEnded()
        }
    }

    /// `poll`'s timeout in milliseconds until `deadline` (rounded up), -1 for none.
    private static func timeout(until deadline: ContinuousClock.Instant?) -> Int32 {
        guard let deadline else { return -1 }
        let left = deadline - ContinuousClock.now
        guard left > .zero else { return 0 }
        let (seconds, attoseconds) = left.components
        return Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1)
    }
}
