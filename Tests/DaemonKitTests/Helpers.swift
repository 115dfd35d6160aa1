import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Collects values appended from any thread; tests wait for conditions on it.
final class Collector<Value: Sendable>: Sendable {
    private let values = Mutex<[Value]>([])

    func append(_ value: Value) { values.withLock { $0.append(value) } }
    var all: [Value] { values.withLock { $0 } }

    /// Waits (polling, up to `timeout`) until `condition` holds for the collected values.
    func waitFor(timeout: Duration = .seconds(20), _ condition: @Sendable ([Value]) -> Bool) async -> Bool {
        await eventually(timeout: timeout) { condition(self.all) }
    }
}

/// Polls `condition` every 10 ms until it is true or `timeout` passes. Generous timeouts
/// keep tests from flaking on a loaded 2-core machine; passing tests return as soon as the
/// condition holds.
func eventually(timeout: Duration = .seconds(20), _ condition: @Sendable () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now.advanced(by: timeout)
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(10))
    }
    return condition()
}

/// Runs blocking `body` on a fresh OS thread, so blocking calls never occupy the
/// cooperative pool (which the code under test needs for its handler tasks).
func onThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        let thread = Thread { continuation.resume(returning: body()) }
        thread.start()
    }
}

/// A fresh directory under /tmp, removed by `remove()`.
struct TemporaryDirectory: Sendable {
    let path: String

    init(mode: mode_t = 0o700) throws {
        var template = Array("/tmp/dktest-XXXXXX".utf8CString)
        let result = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        guard let result else { throw POSIXError(.EIO) }
        path = String(cString: result)
        chmod(path, mode)
    }

    func file(_ name: String) -> String { path + "/" + name }

    func remove() { try? FileManager.default.removeItem(atPath: path) }
}

/// Writes `bytes` to `path` the way `cp` does: open (create/truncate), write, close.
func writeFile(_ path: String, _ text: String) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    defer { close(fd) }
    let bytes = Array(text.utf8)
    let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    guard written == bytes.count else { throw POSIXError(.EIO) }
}

/// A raw, blocking Unix stream socket connection for sending exactly the bytes a test
/// wants (partial lines, invalid UTF-8) and reading what comes back.
final class RawConnection: Sendable {
    let fd: Int32

    init(_ path: String) throws {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard result == 0 else {
            let code = errno
            close(fd)
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
        }
    }

    deinit { close(fd) }

    /// Sends all bytes (ignores errors: the server may have hung up, which tests check
    /// through what they read).
    func send(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let count = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if count <= 0 { return }
            offset += count
        }
    }

    func send(_ text: String) { send(Array(text.utf8)) }

    /// Reads until `lines` newline-terminated lines arrived, EOF, or `timeout`. Returns the
    /// complete lines (without newlines) and whether EOF was seen.
    func readLines(_ lines: Int = 1, timeout: Duration = .seconds(20)) -> (lines: [String], eof: Bool) {
        var buffer: [UInt8] = []
        var eof = false
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while buffer.filter({ $0 == 10 }).count < lines {
            let remaining = ContinuousClock.now.duration(to: deadline)
            if remaining <= .zero { break }
            var fds = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0)]
            let ready = poll(&fds, 1, 100)
            if ready <= 0 { continue }
            var chunk = [UInt8](repeating: 0, count: 65536)
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count <= 0 {
                eof = true
                break
            }
            buffer += chunk[..<count]
        }
        let text = String(decoding: buffer, as: UTF8.self)
        var parts = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        parts.removeLast()  // the (possibly empty) unterminated rest
        return (parts, eof)
    }

    /// Waits up to `timeout` for EOF, discarding data; true if the server closed.
    func waitForEOF(timeout: Duration = .seconds(20)) -> Bool {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while ContinuousClock.now < deadline {
            var fds = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0)]
            if poll(&fds, 1, 100) <= 0 { continue }
            var chunk = [UInt8](repeating: 0, count: 65536)
            if chunk.withUnsafeMutableBytes({ recv(fd, $0.baseAddress, $0.count, 0) }) <= 0 { return true }
        }
        return false
    }
}

/// Number of open descriptors of this process.
func openDescriptorCount() -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
}
