import Glibc

/// The one way ModuleHost reads a small file whole (the configuration file, a plugin.json,
/// the crash guard's records): at most `limit` bytes, so a huge file, or a device such as
/// /dev/zero given as a path, is an error rather than memory filling up. A FIFO is opened
/// without waiting for a writer. Safe to call from any thread.
public enum BoundedFile {
    /// Why a file could not be read.
    public enum ReadError: Error, Sendable, Hashable, CustomStringConvertible {
        /// open or read failed.
        case system(SystemError)
        /// The file holds more than `limit` bytes; nothing past the limit was read.
        case tooLarge(path: String, limit: Int)

        public var description: String {
            switch self {
            case .system(let error): error.description
            case .tooLarge(let path, let limit): "\(path) is larger than \(limit) bytes"
            }
        }
    }

    /// The bytes of the file at `path`, or an error when it cannot be opened or read or
    /// holds more than `limit` bytes.
    public static func read(_ path: String, limit: Int) throws(ReadError) -> [UInt8] {
        let fd: Int32
        do {
            fd = try valueOrErrno("open", subject: path) { open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK) }
        } catch {
            throw .system(error)
        }
        defer { closeDescriptor(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let count: Int
            do {
                count = try valueOrErrno("read", subject: path) {
                    chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
                }
            } catch {
                throw .system(error)
            }
            if count == 0 { return bytes }
            guard bytes.count + count <= limit else { throw .tooLarge(path: path, limit: limit) }
            bytes.append(contentsOf: chunk[..<count])
        }
    }
}
