import Foundation
import Glibc
import Synchronization

/// Where the build products tests need are: `make` lays them out in `build/` (or
/// `$MODHOST_BUILD`), including the example plugins in `build/plugins`.
public enum BuildProducts {
    /// The package's root directory.
    public static let packageRoot: String = {
        // This file is Sources/TestSupport/TestSupport.swift.
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
    }()

    /// The SDK layout `make` produced.
    public static var directory: String {
        ProcessInfo.processInfo.environment["MODHOST_BUILD"] ?? packageRoot + "/build"
    }

    public static var pluginDirectory: String { directory + "/plugins" }
    public static func plugin(_ name: String) -> String { pluginDirectory + "/lib\(name).so" }
    public static var modhostd: String { directory + "/bin/modhostd" }
    public static var modhostctl: String { directory + "/bin/modhostctl" }
    public static var pluginMakefile: String { directory + "/share/modulehost/plugin.mk" }
}

/// Copies of the daemon and the control tool, with the SDK library they load, in a fresh
/// directory every user can read (mode 0755, under /tmp): a test that runs them as another
/// user (uid 65534) then works wherever the checkout lives, even under a directory that
/// user cannot enter. The layout is the installed one (`bin/` next to `lib/`), which the
/// tools' RUNPATH (`$ORIGIN/../lib`) expects.
public final class ToolsForAnotherUser: Sendable {
    public let root = TemporaryDirectory("modhost-tools")
    public var modhostd: String { root.file("bin/modhostd") }
    public var modhostctl: String { root.file("bin/modhostctl") }

    public init() throws {
        for (source, target) in [("bin/modhostd", "bin"), ("bin/modhostctl", "bin"), ("bin/modhost-trial", "bin"),
                                 ("bin/modhost-worker", "bin"), ("lib/libModuleKit.so", "lib")] {
            let directory = root.directory(target)
            let name = (source as NSString).lastPathComponent
            let copy = directory + "/" + name
            try FileManager.default.copyItem(atPath: BuildProducts.directory + "/" + source, toPath: copy)
            chmod(copy, 0o755)
        }
    }

    /// Runs `executable` (one of the copies) as uid and gid 65534 with no supplementary
    /// groups; needs root.
    public func runAsNobody(_ executable: String, _ arguments: [String]) throws -> ProcessResult {
        try run("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", executable] + arguments)
    }
}

/// A fresh directory under /tmp, removed with everything in it when the value is released.
public final class TemporaryDirectory: Sendable {
    public let path: String

    public init(_ label: String = "modhost-test") {
        var template = Array("/tmp/\(label)-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        precondition(made != nil, "mkdtemp failed: \(String(cString: strerror(errno)))")
        path = String(cString: template.withUnsafeBufferPointer { $0.baseAddress! })
        chmod(path, 0o755)
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }

    /// The path of `name` inside the directory.
    public func file(_ name: String) -> String { path + "/" + name }

    /// Writes `bytes` to `name` with `mode`; returns the path.
    @discardableResult
    public func write(_ name: String, _ bytes: [UInt8], mode: mode_t = 0o644) throws -> String {
        let target = file(name)
        try Data(bytes).write(to: URL(fileURLWithPath: target))
        chmod(target, mode)
        return target
    }

    @discardableResult
    public func write(_ name: String, text: String, mode: mode_t = 0o644) throws -> String {
        try write(name, Array(text.utf8), mode: mode)
    }

    /// Copies `source` in as `name`; returns the path.
    @discardableResult
    public func copy(_ source: String, as name: String) throws -> String {
        let target = file(name)
        try? FileManager.default.removeItem(atPath: target)
        try FileManager.default.copyItem(atPath: source, toPath: target)
        chmod(target, 0o644)
        return target
    }

    /// A subdirectory, created.
    public func directory(_ name: String) -> String {
        let target = file(name)
        try? FileManager.default.createDirectory(atPath: target, withIntermediateDirectories: true)
        chmod(target, 0o755)
        return target
    }
}

/// What a finished process did.
public struct ProcessResult: Sendable {
    public var status: Int32
    public var standardOutput: String
    public var standardError: String
    /// True when the process ended because of a signal (status is then the signal).
    public var signalled: Bool
}

/// Runs `executable` with `arguments` to completion and captures its output.
public func run(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                directory: String? = nil) throws -> ProcessResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    if let environment {
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
    }
    if let directory { process.currentDirectoryURL = URL(fileURLWithPath: directory) }
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    // Read both pipes to the end before waiting, so a chatty child never blocks.
    let errReader = Thread.detachedRead(err.fileHandleForReading)
    let outData = out.fileHandleForReading.readDataToEndOfFile()
    let errData = errReader.wait()
    process.waitUntilExit()
    return ProcessResult(
        status: process.terminationStatus, standardOutput: String(decoding: outData, as: UTF8.self),
        standardError: String(decoding: errData, as: UTF8.self),
        signalled: process.terminationReason == .uncaughtSignal)
}

/// Runs a shell command line; throws with its output when it fails.
@discardableResult
public func shell(_ command: String, directory: String? = nil) throws -> String {
    let result = try run("/bin/bash", ["-c", command], directory: directory)
    guard result.status == 0 else {
        throw ShellError(command: command, status: result.status, output: result.standardOutput + result.standardError)
    }
    return result.standardOutput
}

public struct ShellError: Error, CustomStringConvertible {
    public var command: String
    public var status: Int32
    public var output: String
    public var description: String { "`\(command)` exited \(status):\n\(output)" }
}

extension Thread {
    /// Reads a pipe to its end on another thread.
    fileprivate static func detachedRead(_ handle: FileHandle) -> PipeReader {
        let reader = PipeReader()
        let thread = Thread { reader.finish(handle.readDataToEndOfFile()) }
        thread.start()
        return reader
    }
}

final class PipeReader: Sendable {
    private let done = DispatchSemaphore(value: 0)
    private let box = Mutex(Data())
    func finish(_ data: Data) {
        box.withLock { $0 = data }
        done.signal()
    }
    func wait() -> Data {
        done.wait()
        return box.withLock { $0 }
    }
}
