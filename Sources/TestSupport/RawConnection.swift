import Foundation
import Glibc

/// A Unix stream socket bound to `path` (not listening yet), or -1 when it cannot be bound:
/// a stale socket file, or a listener of a test's own.
public func boundUnixSocket(_ path: String) -> Int32 {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
    let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    guard bound == 0 else {
        close(fd)
        return -1
    }
    return fd
}

/// A raw, blocking Unix stream socket connection for sending exactly the bytes a test
/// wants (partial lines, invalid UTF-8) and reading what comes back.
public final class RawConnection: Sendable {
    public let fd: Int32

    public init(_ path: String) throws {
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
    public func send(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let count = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if count <= 0 { return }
            offset += count
        }
    }

    public func send(_ text: String) { send(Array(text.utf8)) }

    /// Reads until `lines` newline-terminated lines arrived, EOF, or `timeout`. Returns the
    /// complete lines (without newlines) and whether EOF was seen.
    public func readLines(_ lines: Int = 1, timeout: Duration = .seconds(20)) -> (lines: [String], eof: Bool) {
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
    public func waitForEOF(timeout: Duration = .seconds(20)) -> Bool {
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

