import CFFI
import Glibc
import ModuleKit

#if _endian(big)
#error("PluginCall stores argument values in 8-byte little-endian slots")
#endif

/// How a `CallableFunction` reaches the plugin code.
public enum CallPath: Sendable, Hashable {
    /// Through `ffi_call` with the cached `ffi_cif`. Works for every signature.
    case libffi
    /// Through a C function pointer typed with one 64-bit integer register per C
    /// parameter, for signatures whose parameters and result are all integer-class
    /// (integers, bool, str, buf) and fit the platform's argument registers (6 on x86-64,
    /// 8 on arm64). On those ABIs this passes exactly the bits `ffi_call` would, without its
    /// per-call interpretation of the cif; see docs/calling.md.
    case registers
}

/// One plugin function, ready to call: its address, its signature, and the `ffi_cif`
/// prepared once when the value is made.
///
/// Thread-safety: immutable after `init`; `call` may run on any number of threads at once
/// (argument storage lives on each caller's stack, the cif is only read). The plugin
/// function itself must be safe to call that way; the host adds no lock around it.
///
/// Cost: no heap allocation per call for numbers and bools with the fixed-arity overloads
/// (`call()`, `call(_:)`, `call(_:_:)`, `call(_:_:_:)`); the `[CallValue]` overload costs
/// the caller's array. `str` arguments are passed from the Swift string's own storage
/// (`withCString`), `buf` arguments from the array's storage.
///
/// Ownership (docs/calling.md): arguments are borrowed by the plugin for the duration of
/// the call only. A `str` or `buf` result must be allocated by the plugin with `malloc`
/// (or `calloc`, `realloc`, `strdup`); the host copies it into the returned `CallValue`
/// and releases it with `free` before `call` returns.
public final class CallableFunction: Sendable {
    /// The export's name (the C symbol).
    public let name: String
    /// The declared signature.
    public let signature: Signature
    /// The path every call of this function takes.
    public let path: CallPath

    private let addressBits: UInt
    private let cif: PreparedCIF
    @usableFromInline let argumentTypes: [ValueType]
    @usableFromInline let returnType: ValueType
    private let cParameterCount: Int
    /// True when some argument is `str` or `buf`, or the result is `buf`: those need
    /// storage pinned for the duration of the call (a `str` result needs none).
    private let needsPinning: Bool
    /// True when every argument is a number or bool and the result is neither `str` nor
    /// `buf`: the fixed-arity overloads then encode into registers with no memory at all.
    @usableFromInline let scalarOnly: Bool
    /// The first three argument types (`.void` when absent), read without array access.
    @usableFromInline let type0: ValueType
    @usableFromInline let type1: ValueType
    private let type2: ValueType

    /// Prepares a function for calling: `ffi_prep_cif` runs here, once.
    ///
    /// - Parameters:
    ///   - address: the function's code address (from `dlsym`); the library must stay
    ///     loaded for the life of this value (the host never unloads plugins).
    ///   - allowRegisterPath: false forces `CallPath.libffi` for every signature.
    /// - Throws: `CallError.preparationFailed` when libffi refuses the signature.
    public init(
        name: String, address: UnsafeRawPointer, signature: Signature, allowRegisterPath: Bool = true
    ) throws(CallError) {
        self.name = name
        self.signature = signature
        self.addressBits = UInt(bitPattern: address)
        self.argumentTypes = signature.argumentTypes
        self.returnType = signature.returnType
        self.cParameterCount = signature.cParameterCount
        self.needsPinning =
            signature.returnType == .buf || signature.argumentTypes.contains { $0 == .str || $0 == .buf }
        self.scalarOnly =
            !needsPinning && signature.returnType != .str
        let types = signature.argumentTypes
        self.type0 = types.count > 0 ? types[0] : .void
        self.type1 = types.count > 1 ? types[1] : .void
        self.type2 = types.count > 2 ? types[2] : .void
        let eligible =
            signature.cParameterCount <= RegisterCall.maximumParameters
            && signature.argumentTypes.allSatisfy(\.isIntegerClass) && signature.returnType.isIntegerClass
        self.path = allowRegisterPath && eligible ? .registers : .libffi
        do {
            self.cif = try PreparedCIF(signature: signature)
        } catch let status {
            throw CallError.preparationFailed(function: name, status: status.status)
        }
    }

    /// Calls the function with `arguments`, which must match the signature exactly in
    /// number and type; see the type's overview for ownership and threading.
    ///
    /// - Throws: before the call, `CallError.wrongArity`, `.wrongType` or
    ///   `.invalidArgument` (a string with NUL); after it, `.nullResult` or
    ///   `.invalidResult` for a result that breaks the ownership convention.
    public func call(_ arguments: [CallValue]) throws(CallError) -> CallValue {
        try invoke(arguments)
    }

    /// Calls a function of no arguments (no heap allocation for non-string results).
    public func call() throws(CallError) -> CallValue {
        guard scalarOnly, argumentTypes.isEmpty else { return try invoke(ArgumentList0()) }
        return decodeScalar(callScalars(0, 0, 0, count: 0))
    }

    /// Calls a function of one argument (no heap allocation for numbers and bools).
    public func call(_ a: CallValue) throws(CallError) -> CallValue {
        guard scalarOnly, argumentTypes.count == 1 else { return try invoke(ArgumentList1(a: a)) }
        return decodeScalar(callScalars(try encodeScalar(a, type0, 1), 0, 0, count: 1))
    }

    /// Calls a function of two arguments (no heap allocation for numbers and bools).
    /// This is the overload the benchmark times.
    public func call(_ a: CallValue, _ b: CallValue) throws(CallError) -> CallValue {
        guard scalarOnly, argumentTypes.count == 2 else { return try invoke(ArgumentList2(a: a, b: b)) }
        let r0 = try encodeScalar(a, type0, 1)
        let r1 = try encodeScalar(b, type1, 2)
        return decodeScalar(callScalars(r0, r1, 0, count: 2))
    }

    /// Calls a function of three arguments (no heap allocation for numbers and bools).
    public func call(_ a: CallValue, _ b: CallValue, _ c: CallValue) throws(CallError) -> CallValue {
        guard scalarOnly, argumentTypes.count == 3 else { return try invoke(ArgumentList3(a: a, b: b, c: c)) }
        let r0 = try encodeScalar(a, type0, 1)
        let r1 = try encodeScalar(b, type1, 2)
        let r2 = try encodeScalar(c, type2, 3)
        return decodeScalar(callScalars(r0, r1, r2, count: 3))
    }

    /// Converts command-line texts per the signature (`Signature.parseArguments`) and calls.
    public func call(texts: [String]) throws(CallError) -> CallValue {
        try invoke(try signature.parseArguments(texts, function: name))
    }

    /// Converts JSON arguments per the signature (`Signature.arguments(fromJSON:)`) and calls.
    public func call(json: [JSONValue]) throws(CallError) -> CallValue {
        try invoke(try signature.arguments(fromJSON: json, function: name))
    }

    // MARK: - The call path

    // Never inlined: the fixed-arity overloads keep only their register path inline, without
    // the stack frame this one needs.
    @inline(never)
    private func invoke<Arguments: ArgumentList>(_ arguments: Arguments) throws(CallError) -> CallValue {
        guard arguments.count == argumentTypes.count else {
            throw CallError.wrongArity(function: name, signature: signature, given: arguments.count)
        }
        if !needsPinning {
            // Numbers and bools only: encode straight into stack slots.
            let raw = try withUnsafeTemporaryAllocation(of: UInt64.self, capacity: max(cParameterCount, 1)) {
                slots throws(CallError) -> UInt64 in
                for index in 0..<argumentTypes.count {
                    slots[index] = try encodeScalar(arguments[index], index)
                }
                return callWithSlots(slots, resultLengthAddress: nil)
            }
            return try decodeResult(raw, length: 0)
        }
        // Strings and buffers: check everything first so nothing can fail once storage
        // is pinned, then pin each value's storage for the duration of the call.
        for index in 0..<argumentTypes.count {
            try check(arguments[index], index)
        }
        var resultLength = 0
        let raw = withUnsafeTemporaryAllocation(of: UInt64.self, capacity: max(cParameterCount, 1)) { slots in
            withUnsafeMutablePointer(to: &resultLength) { lengthAddress in
                pin(arguments, from: 0, slot: 0, into: slots, resultLengthAddress: lengthAddress)
            }
        }
        return try decodeResult(raw, length: resultLength)
    }

    /// The 8-byte slot image of a number or bool argument: integers sign- or zero-extended
    /// to 64 bits, floats as their bit pattern in the low bytes.
    @inline(__always)
    private func encodeScalar(_ value: CallValue, _ index: Int) throws(CallError) -> UInt64 {
        try encodeScalar(value, argumentTypes[index], index + 1)
    }

    /// `encodeScalar(_:_:)` for an argument of `type` at 1-based `position`.
    @inline(__always)
    private func encodeScalar(_ value: CallValue, _ type: ValueType, _ position: Int) throws(CallError) -> UInt64 {
        switch (type, value) {
        case (.i8, .int8(let v)): return UInt64(bitPattern: Int64(v))
        case (.i16, .int16(let v)): return UInt64(bitPattern: Int64(v))
        case (.i32, .int32(let v)): return UInt64(bitPattern: Int64(v))
        case (.i64, .int64(let v)): return UInt64(bitPattern: v)
        case (.u8, .uint8(let v)): return UInt64(v)
        case (.u16, .uint16(let v)): return UInt64(v)
        case (.u32, .uint32(let v)): return UInt64(v)
        case (.u64, .uint64(let v)): return v
        case (.f32, .float(let v)): return UInt64(v.bitPattern)
        case (.f64, .double(let v)): return v.bitPattern
        case (.bool, .bool(let v)): return v ? 1 : 0
        default:
            throw wrongType(value, type, position)
        }
    }

    /// The error for an argument of the wrong type, made out of line (see `invoke`).
    @inline(never)
    private func wrongType(_ value: CallValue, _ type: ValueType, _ position: Int) -> CallError {
        CallError.wrongType(function: name, position: position, expected: type, given: value.type)
    }

    /// Calls a function of at most three number/bool parameters whose slot images are
    /// `r0`, `r1`, `r2` (unused ones ignored), without touching memory on the register path.
    @usableFromInline @inline(__always)
    func callScalars(_ r0: UInt64, _ r1: UInt64, _ r2: UInt64, count: Int) -> UInt64 {
        let address = UnsafeRawPointer(bitPattern: addressBits).unsafelyUnwrapped
        if path == .registers {
            switch count {
            case 0: return unsafeBitCast(address, to: RegisterCall.F0.self)()
            case 1: return unsafeBitCast(address, to: RegisterCall.F1.self)(r0)
            case 2: return unsafeBitCast(address, to: RegisterCall.F2.self)(r0, r1)
            default: return unsafeBitCast(address, to: RegisterCall.F3.self)(r0, r1, r2)
            }
        }
        var slots = (r0, r1, r2)
        return withUnsafeMutableBytes(of: &slots) { bytes in
            cif.call(address, slots: bytes.baseAddress.unsafelyUnwrapped.assumingMemoryBound(to: UInt64.self), count: count)
        }
    }

    /// Type check of any argument, including the no-NUL rule for strings.
    private func check(_ value: CallValue, _ index: Int) throws(CallError) {
        switch (argumentTypes[index], value) {
        case (.str, .string(let s)):
            if s.utf8.contains(0) {
                throw CallError.invalidArgument(
                    function: name, position: index + 1,
                    ValueError(type: .str, input: s, reason: "contains a NUL character, which ends a C string"))
            }
        case (.buf, .bytes):
            break
        default:
            _ = try encodeScalar(value, index)
        }
    }

    /// Fills slots from argument `index` on (C slot `slot`), keeping every string and
    /// buffer pinned while the recursion is inside its `with...` scope, then calls.
    private func pin<Arguments: ArgumentList>(
        _ arguments: Arguments, from index: Int, slot: Int, into slots: UnsafeMutableBufferPointer<UInt64>,
        resultLengthAddress: UnsafeMutablePointer<Int>
    ) -> UInt64 {
        if index == argumentTypes.count {
            return callWithSlots(slots, resultLengthAddress: returnType == .buf ? resultLengthAddress : nil)
        }
        switch arguments[index] {
        case .string(let s):
            return s.withCString { pointer in
                slots[slot] = UInt64(UInt(bitPattern: pointer))
                return pin(arguments, from: index + 1, slot: slot + 1, into: slots, resultLengthAddress: resultLengthAddress)
            }
        case .bytes(let bytes):
            return bytes.withUnsafeBufferPointer { buffer in
                // Never pass NULL, even for an empty buffer (docs/calling.md).
                withUnsafePointer(to: RegisterCall.emptyBufferByte) { empty in
                    slots[slot] = UInt64(UInt(bitPattern: buffer.baseAddress ?? empty))
                    slots[slot + 1] = UInt64(buffer.count)
                    return pin(
                        arguments, from: index + 1, slot: slot + 2, into: slots,
                        resultLengthAddress: resultLengthAddress)
                }
            }
        case let value:
            // Checked before pinning started, so this cannot throw.
            slots[slot] = (try? encodeScalar(value, index)) ?? 0
            return pin(arguments, from: index + 1, slot: slot + 1, into: slots, resultLengthAddress: resultLengthAddress)
        }
    }

    /// Makes the call with every C parameter already in `slots`; returns the raw result
    /// bits (integers widened by the ABI or libffi; f32 in the low 32 bits).
    @inline(__always)
    private func callWithSlots(
        _ slots: UnsafeMutableBufferPointer<UInt64>, resultLengthAddress: UnsafeMutablePointer<Int>?
    ) -> UInt64 {
        if let resultLengthAddress {
            slots[cParameterCount - 1] = UInt64(UInt(bitPattern: resultLengthAddress))
        }
        let address = UnsafeRawPointer(bitPattern: addressBits).unsafelyUnwrapped
        switch path {
        case .registers:
            return RegisterCall.call(address, slots, count: cParameterCount)
        case .libffi:
            return cif.call(address, slots: slots.baseAddress.unsafelyUnwrapped, count: cParameterCount)
        }
    }

    @inline(__always)
    private func decodeScalar(_ raw: UInt64) -> CallValue {
        switch returnType {
        case .i8: return .int8(Int8(truncatingIfNeeded: raw))
        case .i16: return .int16(Int16(truncatingIfNeeded: raw))
        case .i32: return .int32(Int32(truncatingIfNeeded: raw))
        case .i64: return .int64(Int64(bitPattern: raw))
        case .u8: return .uint8(UInt8(truncatingIfNeeded: raw))
        case .u16: return .uint16(UInt16(truncatingIfNeeded: raw))
        case .u32: return .uint32(UInt32(truncatingIfNeeded: raw))
        case .u64: return .uint64(raw)
        case .f32: return .float(Float(bitPattern: UInt32(truncatingIfNeeded: raw)))
        case .f64: return .double(Double(bitPattern: raw))
        case .bool: return .bool(UInt8(truncatingIfNeeded: raw) != 0)
        case .void, .str, .buf: return .void
        }
    }

    /// Decodes any result; takes ownership of `str` and `buf` results (copy, then `free`).
    private func decodeResult(_ raw: UInt64, length: Int) throws(CallError) -> CallValue {
        switch returnType {
        case .str:
            guard let pointer = UnsafeMutablePointer<CChar>(bitPattern: UInt(raw)) else {
                throw CallError.nullResult(function: name)
            }
            let string = String(cString: pointer)
            free(pointer)
            return .string(string)
        case .buf:
            guard let pointer = UnsafeMutablePointer<UInt8>(bitPattern: UInt(raw)) else {
                if length == 0 { return .bytes([]) }
                throw CallError.invalidResult(
                    function: name, reason: "returned NULL for a buf result with length \(length)")
            }
            let bytes = Array(UnsafeBufferPointer(start: pointer, count: length))
            free(pointer)
            return .bytes(bytes)
        default:
            return decodeScalar(raw)
        }
    }
}

// MARK: - Argument lists without heap allocation

/// Read access to call arguments, so the fixed-arity overloads need no array.
protocol ArgumentList {
    var count: Int { get }
    subscript(index: Int) -> CallValue { get }
}

extension Array: ArgumentList where Element == CallValue {}

struct ArgumentList0: ArgumentList {
    var count: Int { 0 }
    subscript(index: Int) -> CallValue { preconditionFailure("no arguments") }
}

struct ArgumentList1: ArgumentList {
    let a: CallValue
    var count: Int { 1 }
    subscript(index: Int) -> CallValue { a }
}

struct ArgumentList2: ArgumentList {
    let a: CallValue
    let b: CallValue
    var count: Int { 2 }
    subscript(index: Int) -> CallValue { index == 0 ? a : b }
}

struct ArgumentList3: ArgumentList {
    let a: CallValue
    let b: CallValue
    let c: CallValue
    var count: Int { 3 }
    subscript(index: Int) -> CallValue {
        switch index {
        case 0: return a
        case 1: return b
        default: return c
        }
    }
}

// MARK: - libffi

extension ValueType {
    /// Passed and returned in general-purpose registers (all but f32/f64).
    var isIntegerClass: Bool { self != .f32 && self != .f64 }

    /// The libffi descriptor of one C parameter or result of this type (`buf` as an
    /// argument is two parameters: see `PreparedCIF`).
    var ffiType: UnsafeMutablePointer<ffi_type> {
        switch self {
        case .i8: return modhost_ffi_type_sint8()
        case .i16: return modhost_ffi_type_sint16()
        case .i32: return modhost_ffi_type_sint32()
        case .i64: return modhost_ffi_type_sint64()
        case .u8, .bool: return modhost_ffi_type_uint8()  // C bool is one byte, 0 or 1
        case .u16: return modhost_ffi_type_uint16()
        case .u32: return modhost_ffi_type_uint32()
        case .u64: return modhost_ffi_type_uint64()
        case .f32: return modhost_ffi_type_float()
        case .f64: return modhost_ffi_type_double()
        case .str, .buf: return modhost_ffi_type_pointer()
        case .void: return modhost_ffi_type_void()
        }
    }

    static var sizeType: UnsafeMutablePointer<ffi_type> {
        MemoryLayout<Int>.size == 8 ? modhost_ffi_type_uint64() : modhost_ffi_type_uint32()
    }
}

/// `ffi_prep_cif`'s libffi status when it is not FFI_OK.
struct FFIStatus: Error {
    let status: Int
}

/// An `ffi_cif` and its argument type array, prepared once and then only read.
///
/// `@unchecked Sendable`: it owns two C allocations that are written only in `init` and
/// freed only in `deinit`; `ffi_call` never writes to the cif, so concurrent calls
/// sharing it are safe.
final class PreparedCIF: @unchecked Sendable {
    let cif: UnsafeMutablePointer<ffi_cif>
    let argumentTypes: UnsafeMutablePointer<UnsafeMutablePointer<ffi_type>?>
    let parameterCount: Int

    /// Prepares a cif for calling a function of `signature` (`buf` arguments expand to a
    /// pointer and a size_t, a `buf` result to a pointer result plus a trailing pointer
    /// parameter).
    convenience init(signature: Signature) throws(FFIStatus) {
        var types: [UnsafeMutablePointer<ffi_type>] = []
        for type in signature.argumentTypes {
            types.append(type.ffiType)
            if type == .buf { types.append(ValueType.sizeType) }
        }
        if signature.returnType == .buf { types.append(modhost_ffi_type_pointer()) }
        try self.init(parameters: types, result: signature.returnType.ffiType)
    }

    /// Prepares a cif from raw libffi type descriptors.
    init(parameters: [UnsafeMutablePointer<ffi_type>], result: UnsafeMutablePointer<ffi_type>) throws(FFIStatus) {
        parameterCount = parameters.count
        cif = .allocate(capacity: 1)
        argumentTypes = .allocate(capacity: max(parameters.count, 1))
        for (index, type) in parameters.enumerated() { argumentTypes[index] = type }
        let status = ffi_prep_cif(
            cif, modhost_ffi_default_abi(), UInt32(parameters.count), result,
            parameters.isEmpty ? nil : argumentTypes)
        guard status == FFI_OK else {
            cif.deallocate()
            argumentTypes.deallocate()
            throw FFIStatus(status: Int(status.rawValue))
        }
    }

    deinit {
        cif.deallocate()
        argumentTypes.deallocate()
    }

    /// `ffi_call` with each parameter's value in the low bytes of its 8-byte slot.
    @inline(__always)
    func call(_ address: UnsafeRawPointer, slots base: UnsafeMutablePointer<UInt64>, count: Int) -> UInt64 {
        var result: UInt64 = 0
        let function = unsafeBitCast(address, to: (@convention(c) () -> Void).self)
        withUnsafeTemporaryAllocation(of: UnsafeMutableRawPointer?.self, capacity: max(count, 1)) { values in
            for index in 0..<count { values[index] = UnsafeMutableRawPointer(base + index) }
            ffi_call(cif, function, &result, values.baseAddress)
        }
        return result
    }
}

// MARK: - Register path

/// Calls through a C function pointer typed as taking N 64-bit integers and returning one.
///
/// On the x86-64 System V and AAPCS64 ABIs every integer-class parameter of at most 8
/// bytes (any integer width, bool, pointer, size_t) travels in the next general-purpose
/// register, whatever its declared width, and the callee reads only the low bits it
/// declared; the result comes back in rax / x0 the same way. The slots hold values
/// already sign- or zero-extended to 64 bits, which satisfies every callee convention
/// (clang's and Apple's "extend to 32 bits" included). This is what libffi itself does
/// for such signatures, minus its per-call interpretation of the cif.
enum RegisterCall {
    #if arch(x86_64)
    static let maximumParameters = 6
    #elseif arch(arm64)
    static let maximumParameters = 8
    #else
    static let maximumParameters = -1  // unknown ABI: always use libffi
    #endif

    /// What an empty `buf` argument points at: never NULL.
    static let emptyBufferByte: UInt8 = 0

    typealias F0 = @convention(c) () -> UInt64
    typealias F1 = @convention(c) (UInt64) -> UInt64
    typealias F2 = @convention(c) (UInt64, UInt64) -> UInt64
    typealias F3 = @convention(c) (UInt64, UInt64, UInt64) -> UInt64
    typealias F4 = @convention(c) (UInt64, UInt64, UInt64, UInt64) -> UInt64
    typealias F5 = @convention(c) (UInt64, UInt64, UInt64, UInt64, UInt64) -> UInt64
    typealias F6 = @convention(c) (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) -> UInt64
    typealias F7 = @convention(c) (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) -> UInt64
    typealias F8 = @convention(c) (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) -> UInt64

    @inline(__always)
    static func call(_ address: UnsafeRawPointer, _ s: UnsafeMutableBufferPointer<UInt64>, count: Int) -> UInt64 {
        switch count {
        case 0: return unsafeBitCast(address, to: F0.self)()
        case 1: return unsafeBitCast(address, to: F1.self)(s[0])
        case 2: return unsafeBitCast(address, to: F2.self)(s[0], s[1])
        case 3: return unsafeBitCast(address, to: F3.self)(s[0], s[1], s[2])
        case 4: return unsafeBitCast(address, to: F4.self)(s[0], s[1], s[2], s[3])
        case 5: return unsafeBitCast(address, to: F5.self)(s[0], s[1], s[2], s[3], s[4])
        case 6: return unsafeBitCast(address, to: F6.self)(s[0], s[1], s[2], s[3], s[4], s[5])
        case 7: return unsafeBitCast(address, to: F7.self)(s[0], s[1], s[2], s[3], s[4], s[5], s[6])
        default: return unsafeBitCast(address, to: F8.self)(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7])
        }
    }
}

/// A Swift number or Bool that stands for exactly one scalar type of the signature grammar,
/// for calls with typed Swift values instead of `CallValue`s.
public protocol CallScalar: Sendable {
    /// The grammar type this Swift type passes as (`Int32` → `i32`).
    static var callType: ValueType { get }
    /// The value's bits as the C calling convention passes them in one register slot.
    var callBits: UInt64 { get }
    /// The value from a result's register bits.
    init(callBits: UInt64)
}

extension Int8: CallScalar {
    public static var callType: ValueType { .i8 }
    public var callBits: UInt64 { UInt64(bitPattern: Int64(self)) }
    public init(callBits: UInt64) { self.init(truncatingIfNeeded: callBits) }
}
extension Int16: CallScalar {
    public static var callType: ValueType { .i16 }
    public var callBits: UInt64 { UInt64(bitPattern: Int64(self)) }
    public init(callBits: UInt64) { self.init(truncatingIfNeeded: callBits) }
}
extension Int32: CallScalar {
    public static var callType: ValueType { .i32 }
    public var callBits: UInt64 { UInt64(bitPattern: Int64(self)) }
    public init(callBits: UInt64) { self.init(truncatingIfNeeded: callBits) }
}
extension Int64: CallScalar {
    public static var callType: ValueType { .i64 }
    public var callBits: UInt64 { UInt64(bitPattern: self) }
    public init(callBits: UInt64) { self.init(bitPattern: callBits) }
}
extension UInt8: CallScalar {
    public static var callType: ValueType { .u8 }
    public var callBits: UInt64 { UInt64(self) }
    public init(callBits: UInt64) { self.init(truncatingIfNeeded: callBits) }
}
extension UInt16: CallScalar {
    public static var callType: ValueType { .u16 }
    public var callBits: UInt64 { UInt64(self) }
    public init(callBits: UInt64) { self.init(truncatingIfNeeded: callBits) }
}
extension UInt32: CallScalar {
    public static var callType: ValueType { .u32 }
    public var callBits: UInt64 { UInt64(self) }
    public init(callBits: UInt64) { self.init(truncatingIfNeeded: callBits) }
}
extension UInt64: CallScalar {
    public static var callType: ValueType { .u64 }
    public var callBits: UInt64 { self }
    public init(callBits: UInt64) { self = callBits }
}
extension Float: CallScalar {
    public static var callType: ValueType { .f32 }
    public var callBits: UInt64 { UInt64(bitPattern) }
    public init(callBits: UInt64) { self.init(bitPattern: UInt32(truncatingIfNeeded: callBits)) }
}
extension Double: CallScalar {
    public static var callType: ValueType { .f64 }
    public var callBits: UInt64 { bitPattern }
    public init(callBits: UInt64) { self.init(bitPattern: callBits) }
}
extension Bool: CallScalar {
    public static var callType: ValueType { .bool }
    public var callBits: UInt64 { self ? 1 : 0 }
    public init(callBits: UInt64) { self = UInt8(truncatingIfNeeded: callBits) != 0 }
}

extension CallableFunction {
    /// Calls a function of two number/bool parameters with typed Swift values: the Swift
    /// types must be exactly the declared ones (`Int32` for `i32`, ...), so no value can be
    /// out of range and nothing is converted. Types are checked before the call; nothing
    /// is allocated.
    ///
    ///     let add = try table.function(named: "calc_add")          // i32(i32,i32)
    ///     let sum: Int32 = try add.call(2 as Int32, 40 as Int32)
    ///
    /// - Throws: `CallError.wrongArity`, `.wrongType` or `.wrongResultType`, before the call.
    @inlinable
    public func call<A: CallScalar, B: CallScalar, R: CallScalar>(_ a: A, _ b: B, returning: R.Type = R.self) throws(CallError) -> R {
        guard scalarOnly, argumentTypes.count == 2 else {
            throw CallError.wrongArity(function: name, signature: signature, given: 2)
        }
        guard type0 == A.callType else { throw CallError.wrongType(function: name, position: 1, expected: type0, given: A.callType) }
        guard type1 == B.callType else { throw CallError.wrongType(function: name, position: 2, expected: type1, given: B.callType) }
        guard returnType == R.callType else {
            throw CallError.wrongResultType(function: name, expected: returnType, requested: R.callType)
        }
        return R(callBits: callScalars(a.callBits, b.callBits, 0, count: 2))
    }
}
