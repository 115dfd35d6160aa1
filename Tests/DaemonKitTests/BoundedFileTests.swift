import DaemonKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.timeLimit(.minutes(5)))
struct BoundedFileTests {
    func write(_ bytes: [UInt8], to path: String) throws {
        try AtomicFile.write(bytes, to: path)
    }

    @Test func aFileUpToTheLimitIsReadWholeAndOneByteMoreIsRefused() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        // Across several reads of the internal chunk size.
        let bytes = (0..<200_000).map { UInt8(truncatingIfNeeded: $0) }
        try write(bytes, to: directory.file("exact"))
        #expect(try BoundedFile.read(directory.file("exact"), limit: bytes.count) == bytes)
        #expect(throws: BoundedFile.ReadError.tooLarge(path: directory.file("exact"), limit: bytes.count - 1)) {
            try BoundedFile.read(directory.file("exact"), limit: bytes.count - 1)
        }
        try write([], to: directory.file("empty"))
        #expect(try BoundedFile.read(directory.file("empty"), limit: 0) == [])
    }

    @Test func aDeviceThatNeverEndsIsRefusedAtTheLimit() {
        #expect(throws: BoundedFile.ReadError.tooLarge(path: "/dev/zero", limit: 1 << 20)) {
            try BoundedFile.read("/dev/zero", limit: 1 << 20)
        }
    }

    @Test func aMissingFileIsASystemError() {
        #expect(throws: BoundedFile.ReadError.system(SystemError("open", code: ENOENT, subject: "/nonexistent/file"))) {
            try BoundedFile.read("/nonexistent/file", limit: 10)
        }
    }
}
