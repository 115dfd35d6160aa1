@_exported import CModuleHost
import Glibc
import Synchronization

/// Carries a Swift module type through the C descriptor (`modhost_module.swift_type`).
/// Immutable, so sharing it between threads is safe.
public final class ModuleTypeBox: Sendable {
    public let type: any PluginModule.Type
    init(_ type: any PluginModule.Type) { self.type = type }
}

/// Builds the C descriptor a Swift plugin's entry symbol returns.
///
/// A Swift plugin exports itself with one line:
///
///     @_cdecl("modhost_plugin_entry_v1")
///     public func entry() -> UnsafeRawPointer? { PluginExport.plugin("Greeter", modules: [Greeter.self]) }
public enum PluginExport {
    /// What one descriptor describes: a plugin name and the exact module types. A new
    /// image of the same plugin (a hot replace) has new type metadata, so it gets a
    /// descriptor of its own and never the previous image's.
    private struct Key: Hashable {
        var name: String
        var types: [ObjectIdentifier]
    }

    /// Descriptors already built, by image, as addresses. They are never freed: the host
    /// keeps pointers into them for the life of the process.
    private static let built = Mutex<[Key: UInt]>([:])

    /// The descriptor of a plugin named `name` providing `modules`, built once per set of
    /// module types (that is, once per loaded image of the plugin) and kept for the life
    /// of the process. Safe to call from any thread.
    public static func plugin(_ name: String, modules: [any PluginModule.Type]) -> UnsafeRawPointer? {
        let key = Key(name: name, types: modules.map { ObjectIdentifier($0) })
        let address = built.withLock { built -> UInt in
            if let address = built[key] { return address }
            let address = UInt(bitPattern: makeDescriptor(name, modules))
            built[key] = address
            return address
        }
        return UnsafeRawPointer(bitPattern: address)
    }

    private static func makeDescriptor(_ name: String, _ types: [any PluginModule.Type]) -> UnsafeMutablePointer<modhost_plugin> {
        let modules = UnsafeMutablePointer<modhost_module>.allocate(capacity: max(types.count, 1))
        for (index, type) in types.enumerated() {
            let box = Unmanaged.passRetained(ModuleTypeBox(type)).toOpaque()
            modules[index] = modhost_module(
                struct_size: UInt32(MemoryLayout<modhost_module>.size),
                kind: UInt32(MODHOST_MODULE_SWIFT.rawValue),
                name: strdup(type.name)!,
                version: strdup(type.version)!,
                notifications: nil, create: nil, handle_event: nil, destroy: nil,
                swift_type: UnsafeRawPointer(box), receive: nil)
        }
        let plugin = UnsafeMutablePointer<modhost_plugin>.allocate(capacity: 1)
        plugin.initialize(to: modhost_plugin(
            struct_size: UInt32(MemoryLayout<modhost_plugin>.size),
            abi_major: UInt32(MODHOST_ABI_MAJOR), abi_minor: UInt32(MODHOST_ABI_MINOR),
            module_count: UInt32(types.count), name: strdup(name)!, modules: modules))
        return plugin
    }

    /// Host side: the Swift module type a descriptor of kind `MODHOST_MODULE_SWIFT`
    /// carries, or nil when the pointer is not a `ModuleTypeBox` of this process's
    /// ModuleKit (e.g. the plugin carries its own copy of the SDK).
    public static func moduleType(_ swiftType: UnsafeRawPointer) -> (any PluginModule.Type)? {
        let object = Unmanaged<AnyObject>.fromOpaque(swiftType).takeUnretainedValue()
        return (object as? ModuleTypeBox)?.type
    }
}

/// Facts about the ModuleKit build in this process: what a Swift plugin is checked against
/// (docs/abi.md, "Swift plugin compatibility").
public enum ModuleKitBuild {
    /// ModuleKit's binary interface version. A plugin records the version it was built
    /// against; a host runs it when the majors are equal and the plugin's minor is at most
    /// the host's. The minor grows with every release that adds to the interface, the
    /// major with a release that breaks it (`make abi-check` tells which).
    public static var abiVersion: (major: Int, minor: Int) { (Int(moduleKitABIRecord.0), Int(moduleKitABIRecord.1)) }

    /// The Swift language version of the compiler that built this ModuleKit, "MAJOR.MINOR"
    /// such as "6.3". A Swift plugin must come from the same major.minor.
    ///
    /// Read from `#if compiler(...)`, which can only compare: each minor version has its own
    /// branch, and a compiler newer than the last branch stops the build (rather than
    /// claiming a version it is not, which would refuse every plugin it builds).
    public static var compilerVersion: String {
        #if compiler(>=6.13)
        #error("ModuleKitBuild.compilerVersion does not know this Swift compiler: add a branch for its major.minor")
        #elseif compiler(>=6.12)
        return "6.12"
        #elseif compiler(>=6.11)
        return "6.11"
        #elseif compiler(>=6.10)
        return "6.10"
        #elseif compiler(>=6.9)
        return "6.9"
        #elseif compiler(>=6.8)
        return "6.8"
        #elseif compiler(>=6.7)
        return "6.7"
        #elseif compiler(>=6.6)
        return "6.6"
        #elseif compiler(>=6.5)
        return "6.5"
        #elseif compiler(>=6.4)
        return "6.4"
        #elseif compiler(>=6.3)
        return "6.3"
        #elseif compiler(>=6.2)
        return "6.2"
        #elseif compiler(>=6.1)
        return "6.1"
        #else
        return "6.0"
        #endif
    }

    /// Any function of ModuleKit; its address tells the host which file the SDK was
    /// loaded from (dladdr).
    public static let anchor: @convention(c) () -> Int32 = { Int32(MODHOST_ABI_MAJOR) }
}

// The ABI version, also kept in the ELF section .modhost.modulekit of libModuleKit.so as
// two little-endian UInt32 (major, minor), so that `modhostctl manifest` reads the version
// of the SDK a plugin links against from the file, without loading it. The release step
// in docs/abi.md bumps it. The two test conditions are defined only by the ABI upgrade
// test (Tests/ModuleHostTests/ABIUpgradeTests.swift), which builds changed ModuleKits.
#if MODULEKIT_ABI_TEST_BREAKING
@section(".modhost.modulekit") @used
let moduleKitABIRecord: (UInt32, UInt32) = (2, 0)
#elseif MODULEKIT_ABI_TEST_ADDITIONS
@section(".modhost.modulekit") @used
let moduleKitABIRecord: (UInt32, UInt32) = (1, 1)
#else
@section(".modhost.modulekit") @used
let moduleKitABIRecord: (UInt32, UInt32) = (1, 0)
#endif
