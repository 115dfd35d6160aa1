import ModuleKit
import Testing

/// The strict JSON rules of `JSONValue.parse`, the parser every host entry point uses.
@Suite(.timeLimit(.minutes(5))) struct StrictJSONTests {
    /// `text` must be refused with `message` at byte `offset`.
    static func refused(_ bytes: [UInt8], offset: Int, _ message: String) {
        do {
            let value = try JSONValue.parse(bytes)
            Issue.record("accepted \(value)")
        } catch {
            #expect(error.offset == offset, "\(error)")
            #expect(error.message.contains(message), "\(error)")
        }
    }

    @Test func aDuplicateMemberNameIsAnErrorAtItsOffset() throws {
        Self.refused(Array(#"{"a":1,"b":2,"a":3}"#.utf8), offset: 13, #"duplicate member name "a""#)
        Self.refused(Array(#"{"x":{"k":[],"k":{}}}"#.utf8), offset: 13, #"duplicate member name "k""#)
        // The same name in two different objects is fine.
        #expect(try JSONValue.parse(Array(#"[{"a":1},{"a":2}]"#.utf8)) == .array([.object(["a": .number(1)]), .object(["a": .number(2)])]))
    }

    @Test func leadingZerosAreAnError() throws {
        Self.refused(Array("0123".utf8), offset: 0, "leading zero")
        Self.refused(Array(#"{"order":-007}"#.utf8), offset: 10, "leading zero")
        Self.refused(Array("[00]".utf8), offset: 1, "leading zero")
        #expect(try JSONValue.parse(Array("[0, -0, 0.5, 10, 0e3]".utf8)) == .array([0, -0.0, 0.5, 10, 0].map(JSONValue.number)))
    }

    @Test func invalidUTF8IsAnErrorNotReplaced() throws {
        // A stray continuation byte, a truncated sequence, an overlong encoding and an
        // encoded surrogate, in fast-path and escaped strings and in member names.
        Self.refused(Array(#"["ab"#.utf8) + [0x80] + Array(#""]"#.utf8), offset: 4, "invalid UTF-8")
        Self.refused(Array(#"["\n"#.utf8) + [0xE2, 0x82] + Array(#""]"#.utf8), offset: 4, "invalid UTF-8")
        Self.refused(Array(#"{""#.utf8) + [0xC0, 0xAF] + Array(#"":1}"#.utf8), offset: 2, "invalid UTF-8")
        Self.refused(Array(#"["x"#.utf8) + [0xED, 0xA0, 0x80] + Array(#""]"#.utf8), offset: 3, "invalid UTF-8")
        Self.refused([0xFF], offset: 0, "expected a value")
        #expect(try JSONValue.parse(Array(#"["é€😀\n"]"#.utf8)) == .array([.string("é€😀\n")]))
    }

    @Test func aNumberBeyondTheRangeOfADoubleIsAnError() throws {
        Self.refused(Array(#"{"v":1e400}"#.utf8), offset: 5, "1e400 is out of range")
        Self.refused(Array("-1e999".utf8), offset: 0, "out of range")
        #expect(try JSONValue.parse(Array("1e308".utf8)) == .number(1e308))
    }

    /// Negative zero keeps its sign through JSON text and back (outside attack: a call
    /// result of -0.0 read `"text":"-0.0"` but `"value":0`).
    @Test func negativeZeroKeepsItsSign() throws {
        #expect(JSONValue.number(-0.0).jsonText == "-0")
        #expect(JSONValue.number(0.0).jsonText == "0")
        guard case .number(let value) = try JSONValue.parse(Array("-0".utf8)) else { Issue.record("not a number"); return }
        #expect(value == 0 && value.sign == .minus)
    }

    @Test func anIntegerADoubleDoesNotHoldExactlyIsAnErrorNotRounded() throws {
        Self.refused(Array(#"{"id":9007199254740993}"#.utf8), offset: 6, "integer 9007199254740993 is not exactly a JSON number")
        Self.refused(Array("[1,-9007199254740993]".utf8), offset: 3, "not exactly a JSON number")
        Self.refused(Array("18446744073709551615".utf8), offset: 0, "send it as a decimal string")
        Self.refused(Array(("1" + String(repeating: "0", count: 22) + "1").utf8), offset: 0, "not exactly")
        // Integers a double holds exactly, and numbers with a fraction or exponent, stay numbers.
        let exact: [(String, Double)] = [("9007199254740992", 0x1p53), ("-9007199254740992", -0x1p53),
                                         ("9007199254740994", 0x1p53 + 2), ("18446744073709551616", 0x1p64),
                                         ("1" + String(repeating: "0", count: 22), 1e22),
                                         ("9007199254740993.0", 0x1p53), ("9007199254740993e0", 0x1p53)]
        for (text, value) in exact {
            #expect(try JSONValue.parse(Array(text.utf8)) == .number(value), "\(text)")
        }
    }

    @Test func nestingUpToTheMaximumDepthIsReadAndOneLevelMoreIsAnError() throws {
        let depth = JSONValue.maximumDepth
        let deepest = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
        var value = try JSONValue.parse(Array(deepest.utf8))
        var levels = 1
        while case .array(let elements) = value, let inner = elements.first {
            value = inner
            levels += 1
        }
        #expect(levels == depth)
        // The value one level too deep starts right after the last bracket that fits.
        let tooDeep = String(repeating: "[", count: depth + 1) + String(repeating: "]", count: depth + 1)
        Self.refused(Array(tooDeep.utf8), offset: depth, "nested deeper than 64 levels")
        Self.refused(Array((#"{"a":"# + tooDeep + "}").utf8), offset: 5 + depth - 1, "nested deeper than 64 levels")
    }

    @Test func whatRFC8259DoesNotAllowIsAnErrorAtItsOffset() {
        Self.refused(Array("[1,]".utf8), offset: 3, "expected a value")
        Self.refused(Array(#"{"a":1,}"#.utf8), offset: 7, "expected a member name")
        Self.refused(Array("[1] // note".utf8), offset: 4, "unexpected text after the JSON value")
        Self.refused(Array("{'a':1}".utf8), offset: 1, "expected a member name")
        Self.refused(Array("[NaN]".utf8), offset: 1, "expected a value")
        Self.refused(Array(#"["tab\#tin"]"#.utf8), offset: 5, "control character")
        Self.refused(Array("".utf8), offset: 0, "unexpected end of input")
    }

    /// The exact text: compact, keys sorted, whole numbers up to 2^53 as integers (negative
    /// zero as `-0`), other numbers as Swift writes a Double.
    @Test func jsonTextIsCompactWithSortedKeysAndWholeNumbersAsIntegers() {
        let value: JSONValue = [
            "b": [0, -0.0, -1, 9_007_199_254_740_992, -9_007_199_254_740_992, 1e16, 0.5, 1e300, -2.5e-7, true, false, nil],
            "a": ["y": "", "x": [:]], "": [],
        ]
        #expect(value.jsonText == #"{"":[],"a":{"x":{},"y":""},"b":[0,-0,-1,9007199254740992,-9007199254740992,1e+16,0.5,1e+300,-2.5e-07,true,false,null]}"#)
        #expect(JSONValue.number(.infinity).jsonText == "null")
    }

    @Test func whatJSONTextWritesParsesBackToTheSameValue() throws {
        let value: JSONValue = [
            "n": [0, -1, 0.5, 1e-5, 1e300, -0x1p53, 123_456.789], "s": "é\u{1B}[2J\"\\\n\u{9B}/😀",
            "nested": ["a": [true, false, nil], "b": [:], "c": []], "": "empty name",
        ]
        #expect(try JSONValue.parse(Array(value.jsonText.utf8)) == value)
        #expect(JSONValue.number(.nan).jsonText == "null")
        // Text with nothing to escape is copied; C1 controls (after a 0xC2 byte) are escaped.
        #expect(JSONValue.string("plain é 😀").jsonText == "\"plain é 😀\"")
        #expect(JSONValue.string("© \u{9B}2J \u{7F}").jsonText == #""© \u009b2J \u007f""#)
    }

    @Test func kindNamesEachCaseForMessages() {
        let kinds = [JSONValue.null, true, 1, "x", [], [:]].map(\.kind)
        #expect(kinds == ["null", "a boolean", "a number", "a string", "an array", "an object"])
    }
}

/// `Codable` types to and from `JSONValue` (`init(encoding:)`, `decode(_:)`) and the
/// indented writer.
@Suite(.timeLimit(.minutes(5))) struct JSONValueCodingTests {
    struct Row: Codable, Equatable {
        enum State: String, Codable { case running, stopped }
        var name: String
        var state: State
        var order: Int?
        var seconds: Double
        var flags: [Bool]
        var nested: [String: [UInt8]]
        var extra: JSONValue
    }

    static let row = Row(name: "greeting \u{1B}", state: .running, order: nil, seconds: 0.25, flags: [true, false],
                         nested: ["a": [0, 255]], extra: ["k": [1, "x", nil]])

    @Test func aValueEncodesAndDecodesWithoutText() throws {
        let value = try JSONValue(encoding: Self.row)
        #expect(value == [
            "name": "greeting \u{1B}", "state": "running", "seconds": 0.25, "flags": [true, false],
            "nested": ["a": [0, 255]], "extra": ["k": [1, "x", nil]],
        ])
        #expect(try value.decode(Row.self) == Self.row)
        // The same as through text and Foundation's coders, but for what jsonText escapes.
        #expect(try JSONValue.parse(Array(value.jsonText.utf8)).decode(Row.self) == Self.row)
    }

    @Test func numbersJSONCannotHoldExactlyAreEncodingErrors() throws {
        #expect(throws: EncodingError.self) { try JSONValue(encoding: [Double.nan]) }
        #expect(throws: EncodingError.self) { try JSONValue(encoding: ["x": Double.infinity]) }
        #expect(throws: EncodingError.self) { try JSONValue(encoding: Int64(1) << 53 + 1) }
        #expect(throws: EncodingError.self) { try JSONValue(encoding: UInt64.max) }
        #expect(try JSONValue(encoding: -(Int64(1) << 53)) == .number(-0x1p53))
        // The same as fields of a struct (the containers' scalar overloads).
        struct Fields: Encodable { var seconds: Double; var count: Int }
        #expect(throws: EncodingError.self) { try JSONValue(encoding: Fields(seconds: .nan, count: 1)) }
        #expect(throws: EncodingError.self) { try JSONValue(encoding: Fields(seconds: 1, count: 1 << 60)) }
        #expect(try JSONValue(encoding: Fields(seconds: 0.5, count: -(1 << 53))) == ["seconds": 0.5, "count": .number(-0x1p53)])
    }

    @Test func decodingRefusesAnythingButTheExactType() throws {
        struct Small: Decodable { var n: UInt8 }
        #expect(throws: DecodingError.self) { try (["n": 300] as JSONValue).decode(Small.self) }
        #expect(throws: DecodingError.self) { try (["n": 1.5] as JSONValue).decode(Small.self) }
        #expect(throws: DecodingError.self) { try (["n": "1"] as JSONValue).decode(Small.self) }
        #expect(throws: DecodingError.self) { try (["m": 1] as JSONValue).decode(Small.self) }
        #expect(throws: DecodingError.self) { try ("1" as JSONValue).decode(Double.self) }
        #expect(throws: DecodingError.self) { try (1 as JSONValue).decode(String.self) }
        #expect(throws: DecodingError.self) { try ([1, 2] as JSONValue).decode([String: Int].self) }
        // Unknown members are ignored; a missing optional is nil.
        #expect(try (["n": 7, "future": [1]] as JSONValue).decode(Small.self).n == 7)
        struct Maybe: Decodable { var n: Int? }
        #expect(try ([:] as JSONValue).decode(Maybe.self).n == nil)
        #expect(try (["n": nil] as JSONValue).decode(Maybe.self).n == nil)
    }

    @Test func theIndentedTextIsTheSameValueOneMemberALine() throws {
        let value: JSONValue = ["b": [1, "two"], "a": ["x": true], "c": [], "d": [:], "e": "\u{1B}"]
        #expect(value.prettyJSONText == """
            {
              "a" : {
                "x" : true
              },
              "b" : [
                1,
                "two"
              ],
              "c" : [],
              "d" : {},
              "e" : "\\u001b"
            }
            """)
        #expect(try JSONValue.parse(Array(value.prettyJSONText.utf8)) == value)
        #expect(JSONValue.string("x").prettyJSONText == #""x""#)
    }
}
