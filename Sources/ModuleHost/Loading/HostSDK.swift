import Glibc
import ModuleKit
import PluginFormat

/// The ModuleKit library loaded in this process: which file, which ABI version, which
/// compiler. Swift plugins are checked against it (docs/abi.md, "Swift plugin
/// compatibility").
public struct HostSDK: Sendable {
    /// Real path of the libModuleKit.so this process uses.
    public let libraryPath: String
    /// Its ABI version: a plugin needs the same major and a minor at most this one.
    public let moduleKitVersion: (major: Int, minor: Int)
    /// The Swift version that compiled it, e.g. "6.3": a plugin needs the same.
    public let compilerVersion: String

    public init(libraryPath: String, moduleKitVersion: (major: Int, minor: Int), compilerVersion: String) {
        self.libraryPath = libraryPath
        self.moduleKitVersion = moduleKitVersion
        self.compilerVersion = compilerVersion
    }

    /// The SDK of this process, found once.
    public static let current: HostSDK = {
        let anchor = unsafeBitCast(ModuleKitBuild.anchor, to: UnsafeRawPointer.self)
        let path = DynamicLibrary.file(containing: anchor).map { realPath($0) ?? $0 } ?? ""
        return HostSDK(libraryPath: path, moduleKitVersion: ModuleKitBuild.abiVersion, compilerVersion: ModuleKitBuild.compilerVersion)
    }()

    /// "MAJOR.MINOR" of `moduleKitVersion`.
    public var moduleKit: String { "\(moduleKitVersion.major).\(moduleKitVersion.minor)" }

    /// The host's ModuleKit as an opened library (it is mapped already: opening it again
    /// maps nothing), for the ownership check of the symbols a Swift plugin resolves; nil
    /// when the library was not found.
    static let library: DynamicLibrary? = current.libraryPath.isEmpty ? nil : try? DynamicLibrary(path: current.libraryPath)

    /// The release of ModuleHost this host is (the Debian package's and the pkg-config
    /// file's version).
    public static let release = "1.0.0"

    /// One line naming `program`, this release and what it implements, for `--version`:
    /// "modhostd 1.0.0 (C ABI 1.1, ModuleKit 1.0, Swift 6.2)".
    public static func versionLine(_ program: String) -> String {
        "\(program) \(release) (C ABI \(abiMajor).\(abiMinor), ModuleKit \(current.moduleKit), Swift \(current.compilerVersion))"
    }

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
