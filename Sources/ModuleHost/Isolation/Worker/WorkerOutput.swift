import CDynamicLoader
import DaemonKit
import Glibc
import ModuleKit

/// What an isolated plugin writes to its standard output and standard error (descriptors 1
/// and 2: `printf`, `fprintf(stderr, ...)`, Swift's `print`, a program it starts), logged
/// by the daemon as the plugin's (docs/isolation.md, "Output").
///
/// `redirect()` runs in the worker before any plugin code: it puts a pipe on each of
/// descriptors 1 and 2, so the daemon's own standard error, which the worker inherited, is
/// no longer open in the worker and no code there can write a line the daemon did not tag.
/// `forward(_:)` starts the thread that reads both pipes and sends each line over the
/// worker's log channel, which the daemon logs with `plugin=NAME worker=PID` like any line of
/// the plugin: `stream=stdout` lines at info level, `stream=stderr` lines at warning level.
///
/// - A line longer than `maximumLine` bytes is cut into lines of that length; bytes that
///   are not UTF-8 are replaced (U+FFFD); control characters are escaped by the log format.
/// - At most `linesPerSecond` lines a second are sent; the rest of that second's are
///   dropped and counted in one line (`N lines of output dropped ...`).
/// - Whatever the plugin does to its descriptors (closes them, puts something else there,
///   fills the pipes) costs only its own output: the daemon reads frames as always, never
///   this pipe. Output the worker has not read when it dies is lost.
enum WorkerOutput {
    /// The longest line sent as one (bytes).
    static let maximumLine = 4096
    /// The most lines sent in one second.
    static let linesPerSecond = 200

    /// The read ends of the pipes now on descriptors 1 and 2, with their stream's name
    /// (empty if no pipe could be made: the descriptors then go to /dev/null).
    static func redirect() -> [(fd: Int32, stream: String)] {
        var ends: [Int32] = [-1, -1]
        _ = modhost_worker_redirect_output(&ends)
        return zip(ends, ["stdout", "stderr"]).filter { $0.0 >= 0 }.map { (fd: $0.0, stream: $0.1) }
    }

    /// Starts the thread that logs what `streams` carry until each of them ends.
    static func forward(_ streams: [(fd: Int32, stream: String)]) {
        guard !streams.isEmpty else { return }
        do throws(SystemError) {
            // Small: under an address-space limit each thread's stack counts.
            try startThread(name: "worker.output", stackSize: 512 << 10) {
                var forwarder = Forwarder(streams)
                forwarder.run()
            }
        } catch {
            // Nobody would read the pipes, and the plugin would block once one is full: its
            // output goes to /dev/null instead, as when no pipe could be made.
            let null = open("/dev/null", O_WRONLY | O_CLOEXEC)
            if null >= 0 {
                dup2(null, 1)
                dup2(null, 2)
                close(null)
            }
            for stream in streams { close(stream.fd) }
            Logger(label: "modhost-worker").warning("the plugin's standard output and error are discarded: \(error)")
        }
    }

    /// The reading thread's state.
    private struct Forwarder {
        var fds: [Int32]
        let streams: [String]
        var pending: [[UInt8]]
        let logger = Logger(label: "modhost-worker")
        var windowStart = ContinuousClock.now
        var sent = 0
        var dropped = 0

        init(_ streams: [(fd: Int32, stream: String)]) {
            fds = streams.map(\.fd)
            self.streams = streams.map(\.stream)
            pending = streams.map { _ in [] }
        }

        mutating func run() {
            var buffer = [UInt8](repeating: 0, count: 16384)
            while fds.contains(where: { $0 >= 0 }) {
                var polled = fds.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
                let ready = poll(&polled, nfds_t(polled.count), dropped > 0 ? 1000 : -1)
                if ready < 0 && errno != EINTR { return }
                reportDropped()
                for index in polled.indices where polled[index].revents != 0 {
                    let count = buffer.withUnsafeMutableBytes { read(fds[index], $0.baseAddress, $0.count) }
                    if count > 0 {
                        pending[index] += buffer[..<count]
                        sendLines(index, all: false)
                    } else if count == 0 || (errno != EINTR && errno != EAGAIN) {
                        // The plugin closed its end (every copy of it): what is left is a line.
                        sendLines(index, all: true)
                        close(fds[index])
                        fds[index] = -1
                    }
                }
            }
        }

        /// Sends every whole line stream `index` holds (and the rest too when `all`).
        mutating func sendLines(_ index: Int, all: Bool) {
            var start = 0
            let bytes = pending[index]
            while start < bytes.count {
                let end = bytes[start...].firstIndex(of: UInt8(ascii: "\n"))
                if let end, end - start <= WorkerOutput.maximumLine {
                    send(bytes[start..<end], index)
                    start = end + 1
                } else if bytes.count - start >= WorkerOutput.maximumLine {
                    send(bytes[start..<(start + WorkerOutput.maximumLine)], index)
                    start += WorkerOutput.maximumLine
                } else if all {
                    send(bytes[start...], index)
                    start = bytes.count
                } else {
                    break
                }
            }
            pending[index].removeFirst(start)
        }

        mutating func send(_ line: ArraySlice<UInt8>, _ index: Int) {
            reportDropped()
            guard sent < WorkerOutput.linesPerSecond else {
                dropped += 1
                return
            }
            sent += 1
            logger.log(streams[index] == "stderr" ? .warning : .info, String(decoding: line, as: UTF8.self), [("stream", streams[index])])
        }

        /// Starts a new one-second window once the last is over, first saying how many lines
        /// it dropped.
        mutating func reportDropped() {
            guard ContinuousClock.now - windowStart >= .seconds(1) else { return }
            if dropped > 0 {
                logger.warning("\(dropped) lines of output dropped (more than \(WorkerOutput.linesPerSecond) in a second)")
            }
            windowStart = .now
            sent = 0
            dropped = 0
        }
    }
}
