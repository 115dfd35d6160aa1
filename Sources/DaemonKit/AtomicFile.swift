import Glibc

/// The one way ModuleHost replaces a file whole: the contents go to a temporary file next to
/// it (`PATH.tmp`), which is then renamed over `path`, so a reader (or a daemon that dies
/// half-way) sees the old file or the new one, never a part of one. Every failure (open,
/// a short or failed write, close, rename) is thrown with the call and the path, and the
/// temporary file is removed; the old file is then untouched.
///
/// No fsync: what is written survives the writing process dying (it is in the page cache),
/// which is what the daemon's state files guard against; an fsync per write made starting
/// 100 plugins 10 times slower. Not for files two processes write at once.
public enum AtomicFile {
    /// Writes bytes into the temporary file; given to the `contents` closure.
    public struct Writer {
        let fd: Int32
        let path: String

        /// Writes all of `bytes` at the current end (nil) or at `offset`, retrying short
        /// writes and interruptions.
        public func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64? = nil) throws(SystemError) {
            var done = 0
            while done < bytes.count {
                let rest = bytes.count - done
                let pointer = bytes.baseAddress! + done
                let written = try valueOrErrno(offset == nil ? "write" : "pwrite", subject: path) {
                    if let offset { pwrite(fd, pointer, rest, off_t(offset) + off_t(done)) } else { Glibc.write(fd, pointer, rest) }
                }
                guard written > 0 else { throw SystemError(offset == nil ? "write" : "pwrite", code: EIO, subject: path) }
                done += written
            }
        }

        /// Writes all of `bytes` at the current end (nil) or at `offset`.
        public func write(_ bytes: [UInt8], at offset: Int64? = nil) throws(SystemError) {
            let failure: SystemError? = bytes.withUnsafeBytes { raw in
                do throws(SystemError) { try write(raw, at: offset) } catch { return error }
                return nil
            }
            if let failure { throw failure }
        }
    }

    /// Replaces `path` with what `contents` writes, created with `mode`.
    ///
    /// - Throws: `SystemError` naming the call that failed, or what `contents` threw.
    public static func write(to path: String, mode: mode_t = 0o644, _ contents: (Writer) throws -> Void) throws {
        let temporary = path + ".tmp"
        let fd = try valueOrErrno("open", subject: temporary) { open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode) }
        do {
            try contents(Writer(fd: fd, path: temporary))
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
        guard close(fd) == 0 else {
            let error = SystemError.current("close", subject: temporary)
            unlink(temporary)
            throw error
        }
        guard rename(temporary, path) == 0 else {
            let error = SystemError.current("rename", subject: path)
            unlink(temporary)
            throw error
        }
    }

    /// Replaces `path` with `bytes`.
    public static func write(_ bytes: [UInt8], to path: String, mode: mode_t = 0o644) throws {
        try write(to: path, mode: mode) { try $0.write(bytes) }
    }
}
