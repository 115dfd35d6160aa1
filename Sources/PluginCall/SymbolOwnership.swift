import CSymbolOwnership
import Glibc
import PluginFormat

/// The check that a plugin's declared exports are defined in the plugin's own file.
///
/// `dlsym(handle, name)` also searches the handle's dependencies, so a name the plugin
/// declares but does not define could resolve to another library's function. The loader
/// calls `resolveExports(_:plugin:handle:pluginPath:)` once per load, right after `dlopen`
/// (with RTLD_NOW) and before any call. All functions here are safe to call from any
/// thread (they only read loader state).
public enum SymbolOwnership {
    /// One export that passed every check: its name, parsed signature and code address.
    public struct ResolvedExport: Sendable {
        public let name: String
        public let signature: Signature
        /// The code address; valid for the life of the process (plugins are never unloaded).
        public let addressBits: UInt
        public var address: UnsafeRawPointer { UnsafeRawPointer(bitPattern: addressBits).unsafelyUnwrapped }
    }

    /// Checks the exports without loading anything: names are C identifiers, unique, and
    /// signatures follow the grammar. The validator can run this before `dlopen`.
    ///
    /// - Returns: the parsed signatures, in manifest order.
    /// - Throws: `ExportError.invalidName`, `.duplicate` or `.invalidSignature` for the
    ///   first bad export.
    public static func parseExports(_ exports: [Manifest.Export], plugin: String) throws(ExportError) -> [(
        name: String, signature: Signature
    )] {
        var seen = Set<String>()
        var parsed: [(name: String, signature: Signature)] = []
        for export in exports {
            guard isCIdentifier(export.name) else { throw ExportError.invalidName(plugin: plugin, function: export.name) }
            guard seen.insert(export.name).inserted else {
                throw ExportError.duplicate(plugin: plugin, function: export.name)
            }
            do {
                parsed.append((export.name, try Signature(parsing: export.signature)))
            } catch {
                throw ExportError.invalidSignature(plugin: plugin, function: export.name, error)
            }
        }
        return parsed
    }

    /// Parses every export (as `parseExports`) and resolves each in the loaded plugin,
    /// refusing any symbol that is missing or defined in another file than the plugin's.
    ///
    /// - Parameters:
    ///   - handle: the plugin's `dlopen` handle.
    ///   - pluginPath: the path the plugin was opened from (used in messages, and to
    ///     compare files when the loader cannot report link maps).
    /// - Throws: the first `ExportError`; nothing is returned partially.
    public static func resolveExports(
        _ exports: [Manifest.Export], plugin: String, handle: UnsafeMutableRawPointer, pluginPath: String
    ) throws(ExportError) -> [ResolvedExport] {
        var resolved: [ResolvedExport] = []
        for (name, signature) in try parseExports(exports, plugin: plugin) {
            let address = try resolve(name, plugin: plugin, handle: handle, pluginPath: pluginPath)
            resolved.append(ResolvedExport(name: name, signature: signature, addressBits: UInt(bitPattern: address)))
        }
        return resolved
    }

    /// Which loaded object defines the code or data at an address, relative to a plugin.
    public enum Owner: Sendable, Equatable {
        /// The plugin's own image.
        case plugin
        /// Another loaded object (a dependency, the SDK, libc): its path as the dynamic
        /// loader names it.
        case other(file: String)
        /// No loaded object contains the address.
        case unknown
    }

    /// The one symbol-ownership rule (`modhost_symbol_owner` in C, which modhost-trial
    /// uses too): the object containing `address` compared with the object `handle` names,
    /// by link map, never by file name. Safe from any thread.
    public static func owner(of address: UnsafeRawPointer, in handle: UnsafeMutableRawPointer) -> Owner {
        var file: UnsafePointer<CChar>?
        switch modhost_symbol_owner(handle, address, &file) {
        case MODHOST_SYMBOL_OWNER_SELF: return .plugin
        case MODHOST_SYMBOL_OWNER_OTHER: return .other(file: file.map { String(cString: $0) } ?? "?")
        default: return .unknown
        }
    }

    /// Resolves one symbol with `dlsym` and checks with `owner(of:in:)` that the plugin's
    /// own image defines it.
    ///
    /// - Parameter pluginPath: the plugin's path, for messages.
    /// - Throws: `ExportError.missingSymbol` (with `dlerror()`'s text),
    ///   `.symbolFromDependency` (naming the library that defines it) or `.unknownOrigin`.
    public static func resolve(
        _ symbol: String, plugin: String, handle: UnsafeMutableRawPointer, pluginPath: String
    ) throws(ExportError) -> UnsafeRawPointer {
        _ = dlerror()
        guard let address = dlsym(handle, symbol) else {
            let message = dlerror().map { String(cString: $0) } ?? "dlsym returned NULL"
            throw ExportError.missingSymbol(plugin: plugin, function: symbol, message: message)
        }
        switch owner(of: address, in: handle) {
        case .plugin:
            return UnsafeRawPointer(address)
        case .other(let library):
            throw ExportError.symbolFromDependency(plugin: plugin, function: symbol, library: library, pluginPath: pluginPath)
        case .unknown:
            throw ExportError.unknownOrigin(plugin: plugin, function: symbol)
        }
    }

    static func isCIdentifier(_ name: String) -> Bool {
        guard let first = name.utf8.first, first == UInt8(ascii: "_") || isLetter(first) else { return false }
        return name.utf8.allSatisfy { $0 == UInt8(ascii: "_") || isLetter($0) || (0x30...0x39).contains($0) }
    }

    private static func isLetter(_ c: UInt8) -> Bool { (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c) }
}
