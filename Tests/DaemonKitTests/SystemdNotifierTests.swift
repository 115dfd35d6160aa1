import DaemonKit
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A real AF_UNIX datagram socket standing in for systemd's notify socket.
final class NotifySocket {
    let fd: Int32
    let name: String

    /// Binds `name`: a filesystem path, or an abstract name when it starts with "@".
    init(_ name: String) throws {
        self.name = name
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(name.utf8)
        let abstract = bytes.first == UInt8(ascii: "@")
        if abstract { bytes[0] = 0 }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        let length = socklen_t(MemoryLayout<sockaddr_un>.offset(of: \.sun_path)! + bytes.count + (abstract ? 0 : 1))
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard result == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    }

    deinit { close(fd) }

    /// The next datagram, or nil after 20 s.
    func receive() -> String? {
        var fds = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0)]
        guard poll(&fds, 1, 20_000) == 1 else { return nil }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        guard count >= 0 else { return nil }
        return String(decoding: buffer[..<count], as: UTF8.self)
    }
}

@Suite(.timeLimit(.minutes(5)))
struct SystemdNotifierTests {
    @Test func withoutNotifySocketEverythingIsANoOp() throws {
        let notifier = SystemdNotifier(environment: ["HOME": "/root"])
        #expect(!notifier.isEnabled)
        #expect(notifier.socketPath == nil)
        try notifier.ready(status: "up")
        try notifier.reloading()
        try notifier.stopping()
        try notifier.status("x")
        #expect(!SystemdNotifier(socketPath: "").isEnabled)
    }

    @Test func sendsTheProtocolMessagesToAPathSocket() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let listener = try NotifySocket(directory.file("notify"))
        let notifier = SystemdNotifier(environment: ["NOTIFY_SOCKET": directory.file("notify")])
        #expect(notifier.isEnabled)

        try notifier.ready(status: "3 modules started")
        #expect(listener.receive() == "READY=1\nSTATUS=3 modules started\n")

        let before = SystemdNotifier.monotonicMicroseconds()
        try notifier.reloading(status: "reloading\nconfiguration")
        let after = SystemdNotifier.monotonicMicroseconds()
        let reloading = try #require(listener.receive())
        let lines = reloading.split(separator: "\n").map(String.init)
        #expect(lines.count == 3)
        #expect(lines.first == "RELOADING=1")
        #expect(lines.last == "STATUS=reloading configuration")
        let stamp = try #require(lines.dropFirst().first.flatMap { $0.split(separator: "=").last }.flatMap { UInt64($0) })
        #expect(lines[1].hasPrefix("MONOTONIC_USEC="))
        #expect(stamp >= before && stamp <= after)

        try notifier.stopping()
        #expect(listener.receive() == "STOPPING=1\n")
        try notifier.status("idle")
        #expect(listener.receive() == "STATUS=idle\n")
        try notifier.watchdog()
        #expect(listener.receive() == "WATCHDOG=1\n")
    }

    /// Keep-alives are asked for by WATCHDOG_USEC (half of it between two), for this
    /// process only (WATCHDOG_PID), and only when there is a socket to send them to.
    @Test func theWatchdogIntervalIsHalfOfWhatTheServiceManagerAsks() {
        let socket = ["NOTIFY_SOCKET": "/run/systemd/notify"]
        #expect(SystemdNotifier.watchdogInterval(environment: socket.merging(["WATCHDOG_USEC": "30000000"]) { $1 }, pid: 42) == .seconds(15))
        #expect(SystemdNotifier.watchdogInterval(environment: socket.merging(["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "42"]) { $1 }, pid: 42)
            == .seconds(1))
        #expect(SystemdNotifier.watchdogInterval(environment: socket.merging(["WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "43"]) { $1 }, pid: 42) == nil)
        #expect(SystemdNotifier.watchdogInterval(environment: ["WATCHDOG_USEC": "2000000"], pid: 42) == nil)
        for bad in ["", "0", "-5", "1e6", "99999999999999999999"] {
            #expect(SystemdNotifier.watchdogInterval(environment: socket.merging(["WATCHDOG_USEC": bad]) { $1 }, pid: 42) == nil, "\(bad)")
        }
    }

    /// Standard error is the journal only when JOURNAL_STREAM names the file on descriptor 2.
    @Test func standardErrorIsTheJournalOnlyWhenJournalStreamNamesIt() {
        var status = stat()
        #expect(fstat(2, &status) == 0)
        #expect(SystemdNotifier.standardErrorIsJournal(environment: ["JOURNAL_STREAM": "\(status.st_dev):\(status.st_ino)"]))
        #expect(!SystemdNotifier.standardErrorIsJournal(environment: ["JOURNAL_STREAM": "\(status.st_dev):\(status.st_ino + 1)"]))
        #expect(!SystemdNotifier.standardErrorIsJournal(environment: ["JOURNAL_STREAM": "nonsense"]))
        #expect(!SystemdNotifier.standardErrorIsJournal(environment: [:]))
    }

    @Test func sendsToAnAbstractSocket() throws {
        let name = "@dktest-notify-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let listener = try NotifySocket(name)
        let notifier = SystemdNotifier(socketPath: name)
        try notifier.ready()
        #expect(listener.receive() == "READY=1\n")
    }

    @Test func aMissingSocketIsReportedAsASystemError() throws {
        let notifier = SystemdNotifier(socketPath: "/nonexistent-dktest/notify")
        do {
            try notifier.ready()
            Issue.record("sending to a missing socket should fail")
        } catch {
            #expect(error.syscall == "sendto")
            #expect(error.code == ENOENT)
        }
        let tooLong = SystemdNotifier(socketPath: "/" + String(repeating: "x", count: 200))
        #expect(throws: SystemError.self) { try tooLong.ready() }
    }
}
