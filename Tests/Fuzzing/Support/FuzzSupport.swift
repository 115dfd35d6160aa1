// What every fuzz target needs: the input as bytes, a property check that the fuzzer
// records as a crash, a file to hand to code that reads paths, and a way to wait for
// async code from libFuzzer's synchronous callback.
import Dispatch
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// libFuzzer's input as an array (empty when libFuzzer passes no data).
public func fuzzBytes(_ data: UnsafePointer<UInt8>?, _ size: Int) -> [UInt8] {
    guard let data, size > 0 else { return [] }
    return Array(UnsafeBufferPointer(start: data, count: size))
}

/// Stops the process with a message when a promise the code makes does not hold, so that
/// libFuzzer saves the input like any other crash.
public func fuzzCheck(_ condition: Bool, _ message: @autoclosure () -> String) {
    guard !condition else { return }
    let line = Array("fuzz property violated: \(message())\n".utf8)
    _ = line.withUnsafeBytes { Glibc.write(2, $0.baseAddress, $0.count) }
    abort()
}

/// A file of this process that fuzz targets write each input to, for code that reads
/// from a path (the validator, the configuration loader). One per target process, in
/// a new directory under `$TMPDIR` (or /tmp), removed when the process exits normally;
/// `make fuzz` points `TMPDIR` at a directory in memory (/dev/shm) when it can, since
/// each input is written once.
public final class ScratchFile: Sendable {
    public let path: String
    private let descriptor: Int32

    public init(name: String) {
        let directory = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
        var template = Array("\(directory)/modhost-fuzz-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { fatalError("cannot create a temporary directory in \(directory)") }
        path = String(cString: made) + "/" + name
        descriptor = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { fatalError("cannot create \(path)") }
        let file = path
        scratchFiles.withLock { files in
            if files.isEmpty {
                atexit {
                    scratchFiles.withLock { files in
                        for file in files {
                            unlink(file)
                            rmdir(String(file[..<file.lastIndex(of: "/")!]))
                        }
                    }
                }
            }
            files.append(file)
        }
    }

    /// Replaces the file's contents with `bytes`.
    public func write(_ bytes: [UInt8]) {
        var written = 0
        while written < bytes.count {
            let count = bytes.withUnsafeBytes { pwrite(descriptor, $0.baseAddress! + written, $0.count - written, off_t(written)) }
            fuzzCheck(count > 0, "cannot write \(path)")
            written += count
        }
        fuzzCheck(ftruncate(descriptor, off_t(bytes.count)) == 0, "cannot truncate \(path)")
    }
}

/// Every `ScratchFile` path, removed at exit.
private let scratchFiles = Mutex<[String]>([])

/// Runs `body` and waits for its result. It starts on the calling thread and finishes
/// there unless it suspends (a hop to the concurrency pool and back costs milliseconds on
/// a loaded machine, a thousand times the work of most inputs).
public func waitFor<T: Sendable>(_ body: @escaping @Sendable () async -> T) -> T {
    let result = Mutex<T?>(nil)
    let done = DispatchSemaphore(value: 0)
    Task.immediate {
        let value = await body()
        result.withLock { $0 = value }
        done.signal()
    }
    done.wait()
    return result.withLock { $0! }
}
