import ModuleKit
import PluginFormat
import Synchronization

/// The functions one plugin exports for calling by name: exactly those its manifest
/// declares, each resolved in the plugin's own file.
///
/// Signatures are parsed and symbols checked when the table is made (load time); the
/// `ffi_cif` of a function is prepared on its first lookup and cached for the life of the
/// table, so only the first call of each function pays for preparation.
///
/// Thread-safety: `Sendable`. The cache is behind a `Mutex` held only for the dictionary
/// lookup or insertion, never during a call; calls may run concurrently (see
/// `CallableFunction`). For the cheapest repeated calls, look the function up once with
/// `function(named:)` and keep the `CallableFunction`.
public final class FunctionTable: Sendable {
    /// The plugin's name, used in error messages.
    public let pluginName: String
    /// The declared exports in manifest order.
    public let declared: [SymbolOwnership.ResolvedExport]

    private let byName: [String: SymbolOwnership.ResolvedExport]
    private let allowRegisterPath: Bool
    private let prepared = Mutex<[String: CallableFunction]>([:])

    /// Makes a table from exports the loader already resolved.
    /// - Parameter allowRegisterPath: false makes every call go through `ffi_call`.
    public init(pluginName: String, exports: [SymbolOwnership.ResolvedExport], allowRegisterPath: Bool = true) {
        self.pluginName = pluginName
        self.declared = exports
        self.allowRegisterPath = allowRegisterPath
        self.byName = Dictionary(exports.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
    }

    /// Parses and resolves a loaded plugin's declared exports
    /// (`SymbolOwnership.resolveExports`) and makes the table.
    ///
    /// - Throws: `ExportError` for a malformed signature, a missing symbol or a symbol only
    ///   a dependency provides; no table is made then.
    public convenience init(
        pluginName: String, exports: [Manifest.Export], handle: UnsafeMutableRawPointer, pluginPath: String,
        allowRegisterPath: Bool = true
    ) throws(ExportError) {
        let resolved = try SymbolOwnership.resolveExports(
            exports, plugin: pluginName, handle: handle, pluginPath: pluginPath)
        self.init(pluginName: pluginName, exports: resolved, allowRegisterPath: allowRegisterPath)
    }

    /// The declared signature of `name`.
    /// - Throws: `CallError.undeclaredFunction` when the manifest does not declare it.
    public func signature(of name: String) throws(CallError) -> Signature {
        guard let export = byName[name] else { throw undeclared(name) }
        return export.signature
    }

    /// The callable function `name`, preparing its cif on first use (then cached).
    /// - Throws: `CallError.undeclaredFunction`, or `.preparationFailed` from libffi.
    public func function(named name: String) throws(CallError) -> CallableFunction {
        if let cached = prepared.withLock({ $0[name] }) { return cached }
        guard let export = byName[name] else { throw undeclared(name) }
        // Prepared outside the lock; if two threads race, the first insertion wins and
        // both return that one.
        let function = try CallableFunction(
            name: name, address: export.address, signature: export.signature, allowRegisterPath: allowRegisterPath)
        return prepared.withLock { cache in
            if let existing = cache[name] { return existing }
            cache[name] = function
            return function
        }
    }

    /// Calls `name` with typed arguments (see `CallableFunction.call(_:)`).
    public func call(_ name: String, _ arguments: [CallValue]) throws(CallError) -> CallValue {
        try function(named: name).call(arguments)
    }

    /// Calls `name` with one command-line text per argument, converted per its signature.
    public func call(_ name: String, texts: [String]) throws(CallError) -> CallValue {
        try function(named: name).call(texts: texts)
    }

    /// Calls `name` with JSON arguments, converted per its signature.
    public func call(_ name: String, json: [JSONValue]) throws(CallError) -> CallValue {
        try function(named: name).call(json: json)
    }

    private func undeclared(_ name: String) -> CallError {
        CallError.undeclaredFunction(plugin: pluginName, function: name, declared: declared.map(\.name))
    }
}
