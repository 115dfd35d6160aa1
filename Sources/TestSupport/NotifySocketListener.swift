import Foundation
import Glibc

/// A datagram socket standing in for systemd's `NOTIFY_SOCKET`: point a daemon's
/// environment at `path` and read what it reports.
public final class NotifySocketListener: Sendable {
    public let path: String
    private let fd: Int32

    /// Binds a new socket at `path` (an existing file there is removed first).
    public init(path: String) throws {
        self.path = path
        unlink(path)
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (index, byte) in path.utf8.prefix(raw.count - 1).enumerated() { raw[index] = byte }
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard fd >= 0, bound == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EINVAL) }
    }

    deinit { close(fd) }

    /// The next datagram containing `text` (earlier ones are skipped), or nil after
    /// `timeout`.
    public func next(containing text: String, timeout: Duration = .seconds(60)) async -> String? {
        let deadline = ContinuousClock.now + timeout
        var buffer = [UInt8](repeating: 0, count: 4096)
        while ContinuousClock.now < deadline {
            let count = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if count > 0 {
                let message = String(decoding: buffer.prefix(count), as: UTF8.self)
                if message.contains(text) { return message }
                continue
            }
            try? await Task.sleep(for: .microseconds(200))
        }
        return nil
    }
}
