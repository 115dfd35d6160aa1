import Foundation
import Glibc
import Synchronization

/// A child process the test talks to while it runs (the daemon): its output is collected
/// as it arrives, so the test can wait for a log line, signal it and check how it ended.
public final class RunningProcess: Sendable {
    private let process: Process
    private let output = Mutex("")
    public var pid: Int32 { process.processIdentifier }

    /// Starts `executable` (in `directory`, when given); standard output and standard error
    /// are merged.
    public init(_ executable: String, _ arguments: [String], environment: [String: String] = [:], directory: String? = nil) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if let directory { process.currentDirectoryURL = URL(fileURLWithPath: directory) }
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        self.process = process
        let handle = pipe.fileHandleForReading
        let reader = Thread { [self] in
            while true {
                let data = handle.availableData
                if data.isEmpty { break }
                output.withLock { $0 += String(decoding: data, as: UTF8.self) }
            }
        }
        try process.run()
        reader.start()
    }

    /// Everything the process printed so far.
    public var text: String { output.withLock { $0 } }

    /// Waits until the output contains `needle` (true) or `timeout` passes (false).
    public func waitFor(_ needle: String, timeout: Duration = .seconds(30)) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if text.contains(needle) { return true }
            if !process.isRunning { return text.contains(needle) }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return false
    }

    /// Sends `signal` to the process.
    public func send(_ signal: Int32) { kill(process.processIdentifier, signal) }

    /// Waits for the process to end (killing it after `timeout`) and returns its exit
    /// status, or 128 + the signal that ended it.
    public func wait(timeout: Duration = .seconds(30)) async -> Int32 {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning && ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        // Let the reader drain what is left in the pipe.
        try? await Task.sleep(for: .milliseconds(50))
        return process.terminationReason == .uncaughtSignal ? 128 + process.terminationStatus : process.terminationStatus
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}
