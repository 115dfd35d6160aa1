#if canImport(Glibc)
import Glibc
#endif

/// The most the host reads from a plugin file. Larger files and manifests are refused by
/// name before their bytes are read (docs/abi.md, "Limits").
public enum PluginLimits {
    /// The largest plugin file the host accepts: 256 MiB (the largest real plugins are a
    /// few MiB).
    public static let maximumFileSize: UInt64 = 256 << 20
    /// The largest embedded manifest: 64 KiB (a manifest is a few hundred bytes).
    public static let maximumManifestSize: UInt64 = 64 << 10
}

/// Checked arithmetic for offsets, sizes and counts read from a file: every result is
/// either exact and in range, or an `ELFError` that names what was being computed. The
/// only arithmetic PluginFormat does on numbers taken from a file goes through here.
enum FileArithmetic {
    /// `offset..<offset + size`, checked not to overflow and to end within `limit` bytes.
    static func range(_ what: @autoclosure () -> String, offset: UInt64, size: UInt64,
                      within limit: UInt64) throws(ELFError) -> Range<UInt64> {
        let (end, overflow) = offset.addingReportingOverflow(size)
        guard !overflow else { throw .malformed("\(what()) at byte \(offset) with \(size) bytes end past 2^64") }
        guard end <= limit else { throw .truncated(what: what(), needed: end, fileSize: limit) }
        return offset..<end
    }

    /// `a + b`, or an error naming `what`.
    static func sum(_ what: @autoclosure () -> String, _ a: UInt64, _ b: UInt64) throws(ELFError) -> UInt64 {
        let (result, overflow) = a.addingReportingOverflow(b)
        guard !overflow else { throw .malformed("\(what()) (\(a) + \(b)) is past 2^64") }
        return result
    }

    /// `count * size`, or an error naming `what`.
    static func product(_ what: @autoclosure () -> String, _ count: UInt64, _ size: UInt64) throws(ELFError) -> UInt64 {
        let (result, overflow) = count.multipliedReportingOverflow(by: size)
        guard !overflow else { throw .malformed("\(what()) (\(count) × \(size) bytes) is past 2^64") }
        return result
    }

    /// The index range of `range` within an array, after `range` was checked against the
    /// array's count (so the conversion cannot fail).
    static func indices(_ range: Range<UInt64>) -> Range<Int> { Int(range.lowerBound)..<Int(range.upperBound) }
}

/// A file opened read-only once, read at the offsets asked for with `pread`: validation
/// reads only the headers and tables it checks, and the daemon hashes and copies the very
/// file it validated, in bounded chunks.
///
/// Safe to share between threads: the descriptor never changes and `pread` keeps no file
/// position. It is closed when the value is released.
public final class ReadOnlyFile: Sendable {
    public let path: String
    /// The file's status when it was opened.
    public let status: stat
    private let descriptor: Int32

    private init(path: String, status: stat, descriptor: Int32) {
        self.path = path
        self.status = status
        self.descriptor = descriptor
    }

    deinit { close(descriptor) }

    /// Opens `path` without reading it; the error carries the errno (`ELOOP` for a symlink
    /// when not following). `O_NONBLOCK` makes opening a FIFO harmless, and one open
    /// answers what lstat and stat would.
    public static func open(_ path: String, followSymlinks: Bool) -> Result<ReadOnlyFile, ELFError> {
        do {
            return .success(try opening(path, followSymlinks: followSymlinks))
        } catch {
            return .failure(error)
        }
    }

    /// `open(_:followSymlinks:)`, throwing its error. (The validator opens every plugin file
    /// with it: a `Result` of these types has its type made at run time the first time.)
    public static func opening(_ path: String, followSymlinks: Bool) throws(ELFError) -> ReadOnlyFile {
        let flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (followSymlinks ? 0 : O_NOFOLLOW)
        let fd = Glibc.open(path, flags)
        guard fd >= 0 else { throw .cannotRead(path: path, errno: errno) }
        var status = stat()
        guard fstat(fd, &status) == 0 else {
            let code = errno
            close(fd)
            throw .cannotRead(path: path, errno: code)
        }
        return ReadOnlyFile(path: path, status: status, descriptor: fd)
    }

    /// The size when opened (0 for anything but a regular file).
    public var size: UInt64 { status.st_mode & S_IFMT == S_IFREG ? UInt64(max(status.st_size, 0)) : 0 }

    /// The bytes of `range`, which must lie within `size`.
    public func read(_ range: Range<UInt64>) throws(ELFError) -> [UInt8] {
        let count = Int(range.count)
        var done = 0
        let buffer = [UInt8](unsafeUninitializedCapacity: count) { storage, initialized in
            done = readFully(into: UnsafeMutableRawBufferPointer(storage), at: range.lowerBound)
            initialized = max(done, 0)
        }
        guard done == count else {
            if done < 0 { throw .cannotRead(path: path, errno: errno) }
            throw .truncated(what: "the file (it shrank while being read)", needed: range.upperBound, fileSize: range.lowerBound + UInt64(done))
        }
        return buffer
    }

    /// Calls `body` with the file's first `size` bytes in order, in chunks of at most
    /// `chunkSize` bytes: memory stays bounded whatever the file's size.
    public func forEachChunk(chunkSize: Int = 1 << 20, _ body: (UnsafeRawBufferPointer) -> Void) throws(ELFError) {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(min(UInt64(chunkSize), max(size, 1))), alignment: 16)
        defer { buffer.deallocate() }
        var offset: UInt64 = 0
        while offset < size {
            let wanted = Int(min(UInt64(buffer.count), size - offset))
            let done = readFully(into: UnsafeMutableRawBufferPointer(rebasing: buffer[0..<wanted]), at: offset)
            guard done == wanted else {
                if done < 0 { throw .cannotRead(path: path, errno: errno) }
                throw .truncated(what: "the file (it shrank while being read)", needed: size, fileSize: offset + UInt64(done))
            }
            body(UnsafeRawBufferPointer(rebasing: buffer[0..<wanted]))
            offset += UInt64(wanted)
        }
    }

    /// Fills `buffer` from `offset`; the count read (short at end of file), or -1 with errno.
    private func readFully(into buffer: UnsafeMutableRawBufferPointer, at offset: UInt64) -> Int {
        var done = 0
        while done < buffer.count {
            let n = pread(descriptor, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done))
            if n < 0 && errno == EINTR { continue }
            if n < 0 { return -1 }
            if n == 0 { break }
            done += n
        }
        return done
    }
}
