import Foundation
import Glibc

/// Builds real plugin libraries for the tests: C with `gcc -shared -fPIC`, Swift with
/// `swiftc -emit-library -parse-as-library`, in a fresh temporary directory.
struct PluginBuilder {
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    let directory: String

    init() throws {
        var template = Array((NSTemporaryDirectory() + "/plugincall-XXXXXX").utf8CString)
        let made: UnsafeMutablePointer<CChar>? = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        guard let made else {
            throw Failure(description: "mkdtemp failed: \(String(cString: strerror(errno)))")
        }
        directory = String(cString: made)
    }

    /// Compiles C source into `lib<name>.so`; returns its absolute path.
    func buildC(name: String, source: String, extraArguments: [String] = []) throws -> String {
        let sourcePath = "\(directory)/\(name).c"
        try source.write(toFile: sourcePath, atomically: true, encoding: .utf8)
        let output = "\(directory)/lib\(name).so"
        try run(
            "gcc",
            ["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", output, sourcePath, "-Wl,-soname,lib\(name).so"]
                + extraArguments)
        return output
    }

    /// Compiles a Swift file of `@_cdecl` functions into `lib<name>.so`.
    func buildSwift(name: String, source: String) throws -> String {
        let sourcePath = "\(directory)/\(name).swift"
        try source.write(toFile: sourcePath, atomically: true, encoding: .utf8)
        let output = "\(directory)/lib\(name).so"
        try run(
            "swiftc",
            [
                "-emit-library", "-parse-as-library", "-swift-version", "6", "-O", "-module-name", name,
                "-Xlinker", "-soname=lib\(name).so", "-o", output, sourcePath,
            ])
        return output
    }

    /// Runs a tool found on PATH; throws with its output when it fails.
    func run(_ tool: String, _ arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [tool] + arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let output = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw Failure(
                description: "\(tool) \(arguments.joined(separator: " ")) failed:\n"
                    + String(decoding: output, as: UTF8.self))
        }
    }
}

/// A library opened with `dlopen(path, RTLD_NOW)`; never closed (as the host does).
struct LoadedLibrary: Sendable {
    let path: String
    /// The handle's bits (a raw pointer is not Sendable; the handle is never closed).
    let handleBits: UInt

    var handle: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: handleBits)! }

    init(path: String) throws {
        guard let handle = dlopen(path, RTLD_NOW) else {
            throw PluginBuilder.Failure(description: "dlopen \(path): \(String(cString: dlerror()))")
        }
        self.path = path
        self.handleBits = UInt(bitPattern: handle)
    }

    /// The address of `symbol`, for tests that call it directly.
    func address(_ symbol: String) throws -> UnsafeRawPointer {
        guard let address = dlsym(handle, symbol) else {
            throw PluginBuilder.Failure(description: "dlsym \(symbol): \(String(cString: dlerror()))")
        }
        return UnsafeRawPointer(address)
    }
}
