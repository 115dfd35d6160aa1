import CDynamicLoader
import Glibc
import ModuleKit
import PluginFormat

/// The identity of the ModuleKit library loaded in this process: which file, which build.
/// Swift plugins must have been linked against exactly this build (the toolchain check).
public struct HostSDK: Sendable {
    /// Real path of the libModuleKit.so this process uses.
    public let libraryPath: String
    /// Its GNU build id (hex), or "" when it has none.
    public let buildID: String
    /// The Swift version that compiled it, e.g. "6.3".
    public let compilerVersion: String

    /// The SDK of this process, found once.
    public static let current: HostSDK = {
        let anchor = unsafeBitCast(ModuleKitBuild.anchor, to: UnsafeRawPointer.self)
        guard let loaded = DynamicLibrary.file(containing: anchor) else {
            return HostSDK(libraryPath: "", buildID: "", compilerVersion: ModuleKitBuild.compilerVersion)
        }
        let path = realPath(loaded) ?? loaded
        // The id is read from the notes of the mapped image, not from the file.
        var bytes = [UInt8](repeating: 0, count: 64)
        let length = modhost_build_id_of_object_containing(anchor, &bytes, bytes.count)
        let id = bytes.prefix(length).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
        return HostSDK(libraryPath: path, buildID: id, compilerVersion: ModuleKitBuild.compilerVersion)
    }()

    /// The host's ModuleKit as an opened library (it is mapped already: opening it again
    /// maps nothing), for the ownership check of the symbols a Swift plugin resolves; nil
    /// when the library was not found.
    static let library: DynamicLibrary? = current.libraryPath.isEmpty ? nil : try? DynamicLibrary(path: current.libraryPath)

    /// The ABI version this host implements.
    public static let abiMajor = Int(MODHOST_ABI_MAJOR)
    public static let abiMinor = Int(MODHOST_ABI_MINOR)
}

/// `realpath(3)`, nil when the path does not resolve.
func realPath(_ path: String) -> String? {
    guard let resolved = realpath(path, nil) else { return nil }
    defer { free(resolved) }
    return String(cString: resolved)
}

/// What the symlink at `path` points to (`readlink`), nil if it is not one.
func symlinkTarget(_ path: String) -> String? {
    var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX))
    let length = buffer.withUnsafeMutableBufferPointer { raw in
        raw.withMemoryRebound(to: CChar.self) { readlink(path, $0.baseAddress!, $0.count) }
    }
    guard length >= 0 else { return nil }
    return String(decoding: buffer[..<length], as: UTF8.self)
}
