/// A parsed export signature: a result type and the argument types, in C order.
///
/// The grammar (docs/calling.md), with optional spaces or tabs between tokens:
///
///     signature := type "(" [ type { "," type } ] ")"
///     type      := i8 | i16 | i32 | i64 | u8 | u16 | u32 | u64 | f32 | f64
///                | bool | str | buf | void
///
/// `void` is only allowed as the result type; a function without arguments is written
/// `T()`. Example: `i32(i32,i32)` is `int32_t f(int32_t, int32_t)`.
/// A `Signature` is an immutable value: it can be shared between threads freely.
public struct Signature: Sendable, Hashable, CustomStringConvertible {
    /// The most arguments a signature may have. Far more than a function called by name
    /// needs; a call pins each argument in a nested scope, so the bound keeps it shallow.
    public static let maximumArguments = 64

    /// The type the function returns (`void` for none).
    public let returnType: ValueType
    /// The argument types in order; never contains `void`.
    public let argumentTypes: [ValueType]

    /// Builds a signature from its parts.
    /// - Throws: `SignatureError` when an argument type is `void`, or there are more than
    ///   `maximumArguments`.
    public init(returning returnType: ValueType, arguments: [ValueType]) throws(SignatureError) {
        if arguments.count > Self.maximumArguments {
            let text = Self.canonicalText(returnType, arguments)
            let offset = returnType.rawValue.count + 1
                + arguments[..<Self.maximumArguments].reduce(0) { $0 + $1.rawValue.count + 1 }
            throw .tooManyArguments(in: text, at: offset)
        }
        if let index = arguments.firstIndex(of: .void) {
            let text = Self.canonicalText(returnType, arguments)
            // Offset of the offending token in the canonical text: "R(" then "a,b,...".
            let offset = returnType.rawValue.count + 1
                + arguments[..<index].reduce(0) { $0 + $1.rawValue.count + 1 }
            throw SignatureError(
                text: text, offset: offset, expected: Self.argumentTypeList, found: "\"void\"",
                hint: "void is only allowed as the result type; write () for no arguments")
        }
        self.returnType = returnType
        self.argumentTypes = arguments
    }

    /// Parses signature text such as `i32(i32,i32)` or `void ( str , buf )`.
    ///
    /// - Throws: `SignatureError` naming the 0-based character offset of the first
    ///   problem, what the grammar expected there and what it found.
    public init(parsing text: String) throws(SignatureError) {
        var parser = Parser(text: text)
        let (result, arguments) = try parser.parseSignature()
        self.returnType = result
        self.argumentTypes = arguments
    }

    /// The canonical text, with no spaces: `i32(i32,i32)`. Parsing it gives back `self`.
    public var description: String { Self.canonicalText(returnType, argumentTypes) }

    /// The number of C parameters the function takes: one per argument, two per `buf`
    /// argument, plus the trailing `size_t *` out parameter when the result is `buf`.
    public var cParameterCount: Int {
        argumentTypes.reduce(0) { $0 + ($1 == .buf ? 2 : 1) } + (returnType == .buf ? 1 : 0)
    }

    /// The C prototype the signature stands for, e.g. `int32_t NAME(int32_t, int32_t)`.
    public func cPrototype(name: String) -> String {
        var parameters = argumentTypes.map(\.cSpelling)
        let result: String
        switch returnType {
        case .str: result = "char *"
        case .buf:
            result = "uint8_t *"
            parameters.append("size_t *out_length")
        default: result = returnType.cSpelling
        }
        return "\(result) \(name)(\(parameters.isEmpty ? "void" : parameters.joined(separator: ", ")))"
    }

    static func canonicalText(_ result: ValueType, _ arguments: [ValueType]) -> String {
        "\(result)(\(arguments.map(\.rawValue).joined(separator: ",")))"
    }

    static let argumentTypeList =
        "an argument type (\(ValueType.argumentTypes.map(\.rawValue).joined(separator: ", ")))"
    static let resultTypeList =
        "a result type (\(ValueType.allCases.map(\.rawValue).joined(separator: ", ")))"

    /// A hand-written recursive-descent parser over the characters of the text.
    private struct Parser {
        let text: String
        let characters: [Character]
        var position = 0

        init(text: String) {
            self.text = text
            self.characters = Array(text)
        }

        mutating func parseSignature() throws(SignatureError) -> (ValueType, [ValueType]) {
            skipSpaces()
            let result = try parseType(expecting: Signature.resultTypeList, allowVoid: true, hint: nil)
            skipSpaces()
            try expect("(", what: "\"(\" after the result type")
            skipSpaces()
            var arguments: [ValueType] = []
            if peek() == ")" {
                position += 1
            } else {
                while true {
                    if arguments.count == Signature.maximumArguments { throw .tooManyArguments(in: text, at: position) }
                    let type = try parseType(
                        expecting: Signature.argumentTypeList, allowVoid: false,
                        hint: "void is only allowed as the result type; write () for no arguments")
                    arguments.append(type)
                    skipSpaces()
                    if peek() == "," {
                        position += 1
                        skipSpaces()
                        continue
                    }
                    try expect(")", what: "\",\" or \")\" after an argument type")
                    break
                }
            }
            skipSpaces()
            if position < characters.count {
                throw error(expected: "the end of the signature")
            }
            return (result, arguments)
        }

        mutating func parseType(expecting: String, allowVoid: Bool, hint: String?) throws(SignatureError) -> ValueType {
            let start = position
            while position < characters.count, characters[position].isASCII,
                characters[position].isLetter || characters[position].isNumber || characters[position] == "_"
            {
                position += 1
            }
            let word = String(characters[start..<position])
            guard !word.isEmpty else {
                throw error(expected: expecting)
            }
            guard let type = ValueType(rawValue: word), allowVoid || type != .void else {
                let isVoid = word == "void"
                position = start
                throw SignatureError(
                    text: text, offset: start, expected: expecting, found: "\"\(word)\"",
                    hint: isVoid ? hint : Self.suggestion(for: word))
            }
            return type
        }

        mutating func expect(_ character: Character, what: String) throws(SignatureError) {
            guard peek() == character else { throw error(expected: what) }
            position += 1
        }

        func peek() -> Character? { position < characters.count ? characters[position] : nil }

        mutating func skipSpaces() {
            while let c = peek(), c == " " || c == "\t" { position += 1 }
        }

        func error(expected: String) -> SignatureError {
            let found = peek().map { "\"\($0)\"" } ?? "the end of the text"
            return SignatureError(text: text, offset: position, expected: expected, found: found, hint: nil)
        }

        /// Common spellings from C or Swift, mapped to the grammar's.
        static func suggestion(for word: String) -> String? {
            let known: [String: String] = [
                "int": "i32", "int32_t": "i32", "int64_t": "i64", "long": "i64", "char": "i8",
                "short": "i16", "float": "f32", "double": "f64", "Int32": "i32", "Int": "i64",
                "string": "str", "String": "str", "bytes": "buf", "Bool": "bool", "size_t": "u64",
                "uint8_t": "u8", "uint32_t": "u32", "uint64_t": "u64", "Double": "f64", "Float": "f32",
            ]
            return known[word].map { "did you mean \($0)?" }
        }
    }
}

/// Why signature text does not follow the grammar.
///
/// `offset` is the 0-based character offset of the problem in `text`; `description` is
/// one line such as `invalid signature "i32(i32,,i32)" at offset 8: expected an argument
/// type (i8, ...), found ","`.
public struct SignatureError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The signature text as given.
    public let text: String
    /// 0-based character offset of the first problem in `text`.
    public let offset: Int
    /// What the grammar allows at `offset`.
    public let expected: String
    /// What is there instead, quoted, or "the end of the text".
    public let found: String
    /// An extra remark, e.g. a likely intended type name.
    public let hint: String?

    public init(text: String, offset: Int, expected: String, found: String, hint: String? = nil) {
        self.text = text
        self.offset = offset
        self.expected = expected
        self.found = found
        self.hint = hint
    }

    /// `text` has an argument past `Signature.maximumArguments`, starting at `offset`.
    static func tooManyArguments(in text: String, at offset: Int) -> SignatureError {
        SignatureError(text: text, offset: offset, expected: "\")\" after at most \(Signature.maximumArguments) arguments",
                       found: "argument \(Signature.maximumArguments + 1)", hint: nil)
    }

    /// One line; a signature longer than 100 characters is shown cut (with `…`).
    public var description: String {
        let shown = text.count > 100 ? String(text.prefix(100)) + "…" : text
        return "invalid signature \"\(shown)\" at offset \(offset): expected \(expected), found \(found)"
            + (hint.map { " (\($0))" } ?? "")
    }
}
