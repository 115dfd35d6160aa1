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
        guard let path = DynamicLibrary.file(containing: anchor) else {
            return HostSDK(libraryPath: "", buildID: "", compilerVersion: ModuleKitBuild.compilerVersion)
        }
        let id = (try? ELFImage(path: path).buildID()) ?? nil
        return HostSDK(libraryPath: path, buildID: id ?? "", compilerVersion: ModuleKitBuild.compilerVersion)
    }()

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
