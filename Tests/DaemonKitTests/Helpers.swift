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

/// Number of open descriptors of this process.
func openDescriptorCount() -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
}
