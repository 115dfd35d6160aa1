/// One type of the export signature grammar (docs/calling.md), spelled as in a signature.
///
/// Every type except `buf` is one C parameter. `buf` as an argument is two C parameters,
/// `const uint8_t *` then `size_t`; `buf` as a result is a returned `uint8_t *` plus a
/// trailing `size_t *` out parameter the host appends. `void` is only a result type.
public enum ValueType: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    case i8, i16, i32, i64
    case u8, u16, u32, u64
    case f32, f64
    case bool
    /// A NUL-terminated C string, `const char *`.
    case str
    /// A byte buffer: `const uint8_t *` and `size_t` (see the type's overview).
    case buf
    /// No value; valid only as a result type.
    case void

    /// The grammar spelling, e.g. `i32`.
    public var description: String { rawValue }

    /// The C type(s) the type stands for as an argument, for messages and docs.
    public var cSpelling: String {
        switch self {
        case .i8: return "int8_t"
        case .i16: return "int16_t"
        case .i32: return "int32_t"
        case .i64: return "int64_t"
        case .u8: return "uint8_t"
        case .u16: return "uint16_t"
        case .u32: return "uint32_t"
        case .u64: return "uint64_t"
        case .f32: return "float"
        case .f64: return "double"
        case .bool: return "bool"
        case .str: return "const char *"
        case .buf: return "const uint8_t *, size_t"
        case .void: return "void"
        }
    }

    /// True for the eight integer types.
    public var isInteger: Bool {
        switch self {
        case .i8, .i16, .i32, .i64, .u8, .u16, .u32, .u64: return true
        default: return false
        }
    }

    /// True for the four signed integer types.
    public var isSignedInteger: Bool {
        switch self {
        case .i8, .i16, .i32, .i64: return true
        default: return false
        }
    }

    /// The smallest and largest value of an integer type (as Int128 so every width fits),
    /// nil for the other types.
    public var integerRange: ClosedRange<Int128>? {
        switch self {
        case .i8: return Int128(Int8.min)...Int128(Int8.max)
        case .i16: return Int128(Int16.min)...Int128(Int16.max)
        case .i32: return Int128(Int32.min)...Int128(Int32.max)
        case .i64: return Int128(Int64.min)...Int128(Int64.max)
        case .u8: return 0...Int128(UInt8.max)
        case .u16: return 0...Int128(UInt16.max)
        case .u32: return 0...Int128(UInt32.max)
        case .u64: return 0...Int128(UInt64.max)
        default: return nil
        }
    }

    /// The types allowed as arguments: every type but `void`, in grammar order.
    public static let argumentTypes: [ValueType] = allCases.filter { $0 != .void }
}
