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

    /// Where the by-name calls (`call(_:...)`) are counted; nil counts nothing.
    public let metrics: CallMetrics?

    private let byName: [String: SymbolOwnership.ResolvedExport]
    private let allowRegisterPath: Bool
    private let prepared = Mutex<[String: CallableFunction]>([:])

    /// Makes a table from exports the loader already resolved.
    /// - Parameter allowRegisterPath: false makes every call go through `ffi_call`.
    /// - Parameter metrics: where the by-name calls are counted (calls through a
    ///   `CallableFunction` kept by the caller are not).
    public init(pluginName: String, exports: [SymbolOwnership.ResolvedExport], allowRegisterPath: Bool = true,
                metrics: CallMetrics? = nil) {
        self.pluginName = pluginName
        self.metrics = metrics
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
        allowRegisterPath: Bool = true, metrics: CallMetrics? = nil
    ) throws(ExportError) {
        let resolved = try SymbolOwnership.resolveExports(
            exports, plugin: pluginName, handle: handle, pluginPath: pluginPath)
        self.init(pluginName: pluginName, exports: resolved, allowRegisterPath: allowRegisterPath, metrics: metrics)
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

    /// Calls `name` with typed arguments (see `CallableFunction.call(_:)`). Counted in
    /// `metrics`, as the other by-name calls.
    public func call(_ name: String, _ arguments: [CallValue]) throws(CallError) -> CallValue {
        try counted(name) { function throws(CallError) in try function.call(arguments) }
    }

    /// Calls `name` with one command-line text per argument, converted per its signature.
    public func call(_ name: String, texts: [String]) throws(CallError) -> CallValue {
        try counted(name) { function throws(CallError) in try function.call(texts: texts) }
    }

    /// Calls `name` with JSON arguments, converted per its signature.
    public func call(_ name: String, json: [JSONValue]) throws(CallError) -> CallValue {
        try counted(name) { function throws(CallError) in try function.call(json: json) }
    }

    /// The counters the calls of `name` count in: its own when the plugin declares it, else
    /// those of `CallMetrics.undeclaredFunction` (names come from callers: bounded). Nil
    /// without `metrics`.
    public func callMetrics(for name: String) -> FunctionCallMetrics? {
        metrics?.function(named: byName[name] == nil ? CallMetrics.undeclaredFunction : name)
    }

    /// Looks `name` up and runs `body` with it; with `metrics`, counts the call, its
    /// duration (lookup and conversions included) and its error code, under `name` when
    /// the plugin declares it, else under `CallMetrics.undeclaredFunction`.
    private func counted(_ name: String, _ body: (CallableFunction) throws(CallError) -> CallValue)
        throws(CallError) -> CallValue
    {
        guard let counters = callMetrics(for: name) else { return try body(try function(named: name)) }
        let clock = ContinuousClock()
        let started = clock.now
        do {
            let value = try body(try function(named: name))
            counters.recordCall(duration: clock.now - started, error: nil)
            return value
        } catch {
            counters.recordCall(duration: clock.now - started, error: error.code)
            throw error
        }
    }

    private func undeclared(_ name: String) -> CallError {
        CallError.undeclaredFunction(plugin: pluginName, function: name, declared: declared.map(\.name))
    }
}
