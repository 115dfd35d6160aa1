/// Why a call was refused or failed. Every case except `nullResult` and `invalidResult`
/// is thrown before the plugin function runs.
///
/// `function` is the export's name (empty when the check ran without one, e.g.
/// `Signature.parseArguments(_:)` called directly); `position` is 1-based.
public enum CallError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The plugin's manifest does not declare `function`; nothing is guessed or looked up.
    case undeclaredFunction(plugin: String, function: String, declared: [String])
    /// The number of arguments differs from the signature's.
    case wrongArity(function: String, signature: Signature, given: Int)
    /// A value's type is not the declared type of its argument (no implicit conversion).
    case wrongType(function: String, position: Int, expected: ValueType, given: ValueType)
    /// A typed call asked for a result type other than the declared one.
    case wrongResultType(function: String, expected: ValueType, requested: ValueType)
    /// A value cannot be passed as declared: text or JSON input that is malformed or out
    /// of range, or a string containing NUL.
    case invalidArgument(function: String, position: Int, ValueError)
    /// The function returned NULL for a `str` result (the convention requires a string).
    /// Nothing leaks: there was nothing to free.
    case nullResult(function: String)
    /// A `buf` result was NULL with a non-zero length. Nothing was freed or read.
    case invalidResult(function: String, reason: String)
    /// `ffi_prep_cif` refused the signature (status is libffi's `ffi_status`).
    case preparationFailed(function: String, status: Int)

    /// The control protocol's error code for it: `unknown_function`, `invalid_arguments`
    /// (wrong count, type or value of an argument) or `call_failed`.
    public var code: String {
        switch self {
        case .undeclaredFunction: "unknown_function"
        case .wrongArity, .wrongType, .invalidArgument: "invalid_arguments"
        default: "call_failed"
        }
    }

    public var description: String {
        func named(_ function: String) -> String { function.isEmpty ? "" : "\(function): " }
        switch self {
        case .undeclaredFunction(let plugin, let function, let declared):
            let list = declared.isEmpty ? "it declares none" : "it declares " + declared.joined(separator: ", ")
            return "plugin \(plugin) does not declare a function \(function) in its manifest exports (\(list))"
        case .wrongArity(let function, let signature, let given):
            let count = signature.argumentTypes.count
            return "\(named(function))expected \(count) argument\(count == 1 ? "" : "s") for \(signature), got \(given)"
        case .wrongType(let function, let position, let expected, let given):
            return "\(named(function))argument \(position) must be \(expected), got a \(given) value"
        case .invalidArgument(let function, let position, let error):
            return "\(named(function))argument \(position): \(error)"
        case .wrongResultType(let function, let expected, let requested):
            return "\(named(function))returns \(expected), not \(requested)"
        case .nullResult(let function):
            return "\(named(function))returned NULL for a str result"
        case .invalidResult(let function, let reason):
            return "\(named(function))\(reason)"
        case .preparationFailed(let function, let status):
            return "\(named(function))ffi_prep_cif failed with status \(status)"
        }
    }
}

/// Why a plugin's declared exports cannot be used: found at load time, before any call.
public enum ExportError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The manifest's signature text does not follow the grammar.
    case invalidSignature(plugin: String, function: String, SignatureError)
    /// The export name is not a C identifier.
    case invalidName(plugin: String, function: String)
    /// Two exports have the same name.
    case duplicate(plugin: String, function: String)
    /// `dlsym` found no such symbol (message: `dlerror()`'s text).
    case missingSymbol(plugin: String, function: String, message: String)
    /// The symbol resolves, but in another file than the plugin's own (a dependency):
    /// calling it would run code the plugin did not declare.
    case symbolFromDependency(plugin: String, function: String, library: String, pluginPath: String)
    /// `dladdr` could not say which file defines the symbol.
    case unknownOrigin(plugin: String, function: String)

    public var description: String {
        switch self {
        case .invalidSignature(let plugin, let function, let error):
            return "plugin \(plugin): export \(function): \(error)"
        case .invalidName(let plugin, let function):
            return "plugin \(plugin): export name \"\(function)\" is not a C identifier ([A-Za-z_][A-Za-z0-9_]*)"
        case .duplicate(let plugin, let function):
            return "plugin \(plugin): export \(function) is declared more than once"
        case .missingSymbol(let plugin, let function, let message):
            return "plugin \(plugin): declared export \(function) is not defined: \(message)"
        case .symbolFromDependency(let plugin, let function, let library, let pluginPath):
            return "plugin \(plugin): declared export \(function) is not defined in the plugin's own file "
                + "\(pluginPath) but in \(library); refusing it"
        case .unknownOrigin(let plugin, let function):
            return "plugin \(plugin): cannot tell which file defines export \(function) (dladdr failed)"
        }
    }
}
