import CDynamicLoader
import Glibc
import PluginCall

/// A shared object opened with `RTLD_NOW`. It is never closed: a Swift image cannot be
/// unloaded safely (the runtime keeps pointers into its metadata), so every image the
/// host opens stays mapped until the process exits, and is counted as retired when its
/// modules are gone.
///
/// `@unchecked Sendable`: the handle is an opaque pointer that glibc lets any thread use
/// with `dlsym`; this wrapper never mutates or frees it.
public final class DynamicLibrary: @unchecked Sendable {
    public let path: String
    let handle: UnsafeMutableRawPointer

    /// Opens `path` (absolute) with RTLD_NOW | RTLD_LOCAL. Throws dlerror's text.
    public init(path: String) throws(DynamicLibraryError) {
        guard let handle = dlopen(path, RTLD_NOW | RTLD_LOCAL) else {
            throw DynamicLibraryError(message: Self.lastError())
        }
        self.path = path
        self.handle = handle
    }

    /// The address of `symbol` as this library's scope sees it (which includes its
    /// dependencies), or the dlerror text.
    public func symbol(_ name: String) -> Result<UnsafeMutableRawPointer, DynamicLibraryError> {
        _ = dlerror()
        guard let address = dlsym(handle, name) else { return .failure(DynamicLibraryError(message: Self.lastError())) }
        return .success(address)
    }

    /// Which object defines the code or data at `address`: this library's own image,
    /// another object (a dependency), or none. The one ownership rule
    /// (`SymbolOwnership.owner(of:in:)`), a lookup in the loader's sorted table of objects
    /// that does not slow down as more plugins are loaded.
    public func owner(of address: UnsafeRawPointer) -> SymbolOwnership.Owner {
        SymbolOwnership.owner(of: address, in: handle)
    }

    /// The file that defines the code at `address`, as the dynamic loader names it (the
    /// path it was opened by).
    public static func file(containing address: UnsafeRawPointer) -> String? {
        guard let name = modhost_fast_object_containing(address) ?? modhost_object_containing(address) else { return nil }
        return String(cString: name)
    }

    static func lastError() -> String {
        guard let text = dlerror() else { return "unknown dynamic loader error" }
        return String(cString: text)
    }
}

/// The dynamic loader's own explanation.
public struct DynamicLibraryError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public var description: String { message }
}
