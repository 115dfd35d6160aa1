import CFFI
import Glibc

/// A C function pointer that runs a Swift closure: a libffi closure
/// (`ffi_closure_alloc` + `ffi_prep_closure_loc`) whose user data is the closure's own
/// handler and context. It gives C code per-instance state through a plain function
/// pointer with no context parameter (e.g. each C module's own `log`).
///
/// Lifetime: the code pointer is valid while this object is alive; `deinit` frees it with
/// `ffi_closure_free`. The owner must keep the object alive for as long as C code may call
/// the pointer (the loader: until the module's `destroy` has returned).
///
/// Threading: C code may call the pointer from any thread, concurrently; the handler is
/// `@Sendable` and runs on the calling thread, synchronously.
///
/// Arguments reach a handler as `CallValue`s: `str` arguments are copied into a `String`
/// (NULL becomes the empty string; invalid UTF-8 is repaired), `buf` arguments (pointer +
/// size_t) are copied into `.bytes`. Result types `str` and `buf` are refused (there is no
/// owner for the memory); a handler must return a value of exactly the result type
/// (`.void` for void), else the process stops with a precondition failure, since that is
/// a bug in host code.
///
/// `@unchecked Sendable`: a tiny owner of C allocations (closure, cif) that are written
/// only in `init` and freed only in `deinit`; the handler storage is immutable.
public final class FFIClosure: @unchecked Sendable {
    /// The C signature the pointer has.
    public let signature: Signature
    /// The C function pointer to hand to C code; cast it to the exact C function type.
    public let functionPointer: UnsafeRawPointer

    private let closure: UnsafeMutableRawPointer
    private let cif: PreparedCIF
    private let body: ClosureBody

    /// A closure of `signature` calling `handler` with the converted arguments.
    /// - Throws: `FFIClosureError` for a `str` or `buf` result type, or when libffi cannot
    ///   allocate or prepare the closure.
    public convenience init(
        signature: Signature, handler: @escaping @Sendable ([CallValue]) -> CallValue
    ) throws(FFIClosureError) {
        guard signature.returnType != .str && signature.returnType != .buf else {
            throw FFIClosureError(reason: "a closure cannot return \(signature.returnType): no owner for the memory")
        }
        try self.init(signature: signature, body: ClosureBody(kind: .generic(signature, handler)))
    }

    /// A closure of `signature` calling `handler` with `context` and the converted
    /// arguments: the per-closure state C code cannot pass itself.
    public convenience init<Context: Sendable>(
        signature: Signature, context: Context, handler: @escaping @Sendable (Context, [CallValue]) -> CallValue
    ) throws(FFIClosureError) {
        try self.init(signature: signature) { arguments in handler(context, arguments) }
    }

    private init(signature: Signature, body: ClosureBody) throws(FFIClosureError) {
        self.signature = signature
        self.body = body
        do {
            self.cif = try PreparedCIF(signature: signature)
        } catch {
            throw FFIClosureError(reason: "ffi_prep_cif failed with status \(error.status) for \(signature)")
        }
        var code: UnsafeMutableRawPointer?
        guard let closure = ffi_closure_alloc(modhost_ffi_closure_size(), &code), let code else {
            throw FFIClosureError(reason: "ffi_closure_alloc failed")
        }
        let status = ffi_prep_closure_loc(
            closure.assumingMemoryBound(to: ffi_closure.self), cif.cif, closureEntry,
            Unmanaged.passUnretained(body).toOpaque(), code)
        guard status == FFI_OK else {
            ffi_closure_free(closure)
            throw FFIClosureError(reason: "ffi_prep_closure_loc failed with status \(status.rawValue)")
        }
        self.closure = closure
        self.functionPointer = UnsafeRawPointer(code)
    }

    deinit {
        ffi_closure_free(closure)
    }

    // MARK: - The three host-service shapes of modhost_host_api

    /// `void (*)(int32_t level, const char *message)`, as `modhost_host_api.log`.
    public typealias CLogFunction = @convention(c) (Int32, UnsafePointer<CChar>) -> Void
    /// `void (*)(const char *name, const char *payload_json_or_NULL)`, as
    /// `modhost_host_api.post_notification`.
    public typealias CPostNotificationFunction = @convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>?) -> Void
    /// `bool (*)(const char *name)`, as `modhost_host_api.has_module`.
    public typealias CHasModuleFunction = @convention(c) (UnsafePointer<CChar>) -> Bool

    /// A `log` pointer (signature `void(i32,str)`); `handler` gets the level and a copy
    /// of the message.
    public static func log(
        _ handler: @escaping @Sendable (_ level: Int32, _ message: String) -> Void
    ) throws(FFIClosureError) -> FFIClosure {
        try FFIClosure(signature: Self.logSignature, body: ClosureBody(kind: .log(handler)))
    }

    /// A `post_notification` pointer (signature `void(str,str)` where the second may be
    /// NULL); `handler` gets a copy of the name and of the payload's bytes as they are (not
    /// decoded, so that the JSON parser sees and locates any byte that is not UTF-8), `nil`
    /// for a NULL payload.
    public static func postNotification(
        _ handler: @escaping @Sendable (_ name: String, _ payloadJSON: [UInt8]?) -> Void
    ) throws(FFIClosureError) -> FFIClosure {
        try FFIClosure(signature: Self.postSignature, body: ClosureBody(kind: .postNotification(handler)))
    }

    /// A `has_module` pointer (signature `bool(str)`).
    public static func hasModule(
        _ handler: @escaping @Sendable (_ name: String) -> Bool
    ) throws(FFIClosureError) -> FFIClosure {
        try FFIClosure(signature: Self.hasModuleSignature, body: ClosureBody(kind: .hasModule(handler)))
    }

    /// This closure as a `log` function; nil unless the signature is `void(i32,str)`.
    public var asLog: CLogFunction? {
        signature == Self.logSignature ? unsafeBitCast(functionPointer, to: CLogFunction.self) : nil
    }

    /// This closure as a `post_notification` function; nil unless made by
    /// `postNotification(_:)` (only that handler accepts a NULL payload).
    public var asPostNotification: CPostNotificationFunction? {
        if case .postNotification = body.kind {
            return unsafeBitCast(functionPointer, to: CPostNotificationFunction.self)
        }
        return nil
    }

    /// This closure as a `has_module` function; nil unless the signature is `bool(str)`.
    public var asHasModule: CHasModuleFunction? {
        signature == Self.hasModuleSignature ? unsafeBitCast(functionPointer, to: CHasModuleFunction.self) : nil
    }

    static let logSignature = try! Signature(returning: .void, arguments: [.i32, .str])
    static let postSignature = try! Signature(returning: .void, arguments: [.str, .str])
    static let hasModuleSignature = try! Signature(returning: .bool, arguments: [.str])
}

/// The three host services of one C module instance (`modhost_host_api`'s `log`,
/// `post_notification` and `has_module`), each a libffi closure bound to its handler.
///
/// The pointers stay valid while this object is alive; keep it until the module's
/// `destroy` has returned. All three may be called from any thread.
public final class HostCallbacks: Sendable {
    /// For `modhost_host_api.log`.
    public let log: FFIClosure.CLogFunction
    /// For `modhost_host_api.post_notification`.
    public let postNotification: FFIClosure.CPostNotificationFunction
    /// For `modhost_host_api.has_module`.
    public let hasModule: FFIClosure.CHasModuleFunction
    private let closures: [FFIClosure]

    /// Makes the three closures.
    /// - Throws: `FFIClosureError` when libffi cannot allocate a closure.
    public init(
        log: @escaping @Sendable (_ level: Int32, _ message: String) -> Void,
        postNotification: @escaping @Sendable (_ name: String, _ payloadJSON: [UInt8]?) -> Void,
        hasModule: @escaping @Sendable (_ name: String) -> Bool
    ) throws(FFIClosureError) {
        let logClosure = try FFIClosure.log(log)
        let postClosure = try FFIClosure.postNotification(postNotification)
        let hasModuleClosure = try FFIClosure.hasModule(hasModule)
        self.log = logClosure.asLog.unsafelyUnwrapped
        self.postNotification = postClosure.asPostNotification.unsafelyUnwrapped
        self.hasModule = hasModuleClosure.asHasModule.unsafelyUnwrapped
        self.closures = [logClosure, postClosure, hasModuleClosure]
    }
}

/// Why an `FFIClosure` could not be made.
public struct FFIClosureError: Error, Sendable, Equatable, CustomStringConvertible {
    public let reason: String
    public init(reason: String) { self.reason = reason }
    public var description: String { "cannot make a C closure: \(reason)" }
}

// MARK: - Dispatch from libffi into Swift

/// What a closure runs; immutable, passed to libffi as user data.
final class ClosureBody: Sendable {
    enum Kind: Sendable {
        case generic(Signature, @Sendable ([CallValue]) -> CallValue)
        case log(@Sendable (Int32, String) -> Void)
        case postNotification(@Sendable (String, [UInt8]?) -> Void)
        case hasModule(@Sendable (String) -> Bool)
    }

    let kind: Kind

    init(kind: Kind) { self.kind = kind }

    func invoke(result: UnsafeMutableRawPointer, arguments: UnsafeMutablePointer<UnsafeMutableRawPointer?>) {
        func argument<T>(_ index: Int, as type: T.Type) -> T {
            arguments[index].unsafelyUnwrapped.load(as: T.self)
        }
        func string(_ index: Int) -> String? {
            argument(index, as: UnsafePointer<CChar>?.self).map { String(cString: $0) }
        }
        switch kind {
        case .log(let handler):
            handler(argument(0, as: Int32.self), string(1) ?? "")
        case .postNotification(let handler):
            handler(string(0) ?? "", argument(1, as: UnsafePointer<CChar>?.self).map {
                Array(UnsafeRawBufferPointer(start: $0, count: strlen($0)))
            })
        case .hasModule(let handler):
            result.storeBytes(of: handler(string(0) ?? "") ? 1 : 0, as: UInt64.self)
        case .generic(let signature, let handler):
            var values: [CallValue] = []
            values.reserveCapacity(signature.argumentTypes.count)
            var slot = 0
            for type in signature.argumentTypes {
                switch type {
                case .i8: values.append(.int8(argument(slot, as: Int8.self)))
                case .i16: values.append(.int16(argument(slot, as: Int16.self)))
                case .i32: values.append(.int32(argument(slot, as: Int32.self)))
                case .i64: values.append(.int64(argument(slot, as: Int64.self)))
                case .u8: values.append(.uint8(argument(slot, as: UInt8.self)))
                case .u16: values.append(.uint16(argument(slot, as: UInt16.self)))
                case .u32: values.append(.uint32(argument(slot, as: UInt32.self)))
                case .u64: values.append(.uint64(argument(slot, as: UInt64.self)))
                case .f32: values.append(.float(argument(slot, as: Float.self)))
                case .f64: values.append(.double(argument(slot, as: Double.self)))
                case .bool: values.append(.bool(argument(slot, as: UInt8.self) != 0))
                case .str: values.append(.string(string(slot) ?? ""))
                case .buf:
                    let pointer = argument(slot, as: UnsafePointer<UInt8>?.self)
                    let count = argument(slot + 1, as: Int.self)
                    values.append(.bytes(pointer.map { Array(UnsafeBufferPointer(start: $0, count: count)) } ?? []))
                    slot += 1
                case .void: break
                }
                slot += 1
            }
            store(handler(values), as: signature.returnType, into: result)
        }
    }

    /// Writes a handler's result the way libffi expects: integers widened to a full
    /// `ffi_arg` (8 bytes), floats as themselves.
    private func store(_ value: CallValue, as type: ValueType, into result: UnsafeMutableRawPointer) {
        switch (type, value) {
        case (.void, .void): break
        case (.i8, .int8(let v)): result.storeBytes(of: Int64(v), as: Int64.self)
        case (.i16, .int16(let v)): result.storeBytes(of: Int64(v), as: Int64.self)
        case (.i32, .int32(let v)): result.storeBytes(of: Int64(v), as: Int64.self)
        case (.i64, .int64(let v)): result.storeBytes(of: v, as: Int64.self)
        case (.u8, .uint8(let v)): result.storeBytes(of: UInt64(v), as: UInt64.self)
        case (.u16, .uint16(let v)): result.storeBytes(of: UInt64(v), as: UInt64.self)
        case (.u32, .uint32(let v)): result.storeBytes(of: UInt64(v), as: UInt64.self)
        case (.u64, .uint64(let v)): result.storeBytes(of: v, as: UInt64.self)
        case (.f32, .float(let v)): result.storeBytes(of: v, as: Float.self)
        case (.f64, .double(let v)): result.storeBytes(of: v, as: Double.self)
        case (.bool, .bool(let v)): result.storeBytes(of: v ? 1 : 0, as: UInt64.self)
        default:
            preconditionFailure("FFIClosure handler returned \(value) for result type \(type)")
        }
    }
}

/// The one C entry point of every FFIClosure: libffi calls it with the closure's user data.
private let closureEntry:
    @convention(c) (
        UnsafeMutablePointer<ffi_cif>?, UnsafeMutableRawPointer?, UnsafeMutablePointer<UnsafeMutableRawPointer?>?,
        UnsafeMutableRawPointer?
    ) -> Void = { _, result, arguments, userData in
        let body = Unmanaged<ClosureBody>.fromOpaque(userData.unsafelyUnwrapped).takeUnretainedValue()
        body.invoke(result: result.unsafelyUnwrapped, arguments: arguments.unsafelyUnwrapped)
    }
