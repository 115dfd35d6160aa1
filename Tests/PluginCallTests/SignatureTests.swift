import PluginCall
import Testing

@Suite("Signature grammar", .timeLimit(.minutes(5)))
struct SignatureTests {
    @Test("every type parses, as result and as argument")
    func everyType() throws {
        for type in ValueType.allCases {
            let asResult = try Signature(parsing: "\(type)()")
            #expect(asResult.returnType == type && asResult.argumentTypes.isEmpty)
        }
        let all = ValueType.argumentTypes
        let text = "void(" + all.map(\.rawValue).joined(separator: ",") + ")"
        let signature = try Signature(parsing: text)
        #expect(signature.returnType == .void)
        #expect(signature.argumentTypes == all)
        #expect(signature.description == text)
    }

    @Test("spaces and tabs between tokens; canonical text round-trips")
    func spacing() throws {
        let signature = try Signature(parsing: "  i32 (\ti32 ,  buf )  ")
        #expect(signature.returnType == .i32)
        #expect(signature.argumentTypes == [.i32, .buf])
        #expect(signature.description == "i32(i32,buf)")
        #expect(try Signature(parsing: signature.description) == signature)
    }

    /// A call pins each argument in a nested scope: 4000 `buf` arguments overflowed the
    /// daemon's stack (found by an outside run; exit 139 on the call). The grammar bounds them.
    @Test("at most 64 arguments, parsed or built, with a short one-line error")
    func argumentCountIsBounded() throws {
        let most = "i32(" + Array(repeating: "buf", count: 64).joined(separator: ",") + ")"
        #expect(try Signature(parsing: most).argumentTypes.count == 64)
        let tooMany = "i32(" + Array(repeating: "buf", count: 4000).joined(separator: ",") + ")"
        #expect {
            try Signature(parsing: tooMany)
        } throws: { error in
            let text = "\(error)"
            return text.contains("at offset 260: expected \")\" after at most 64 arguments, found argument 65") && text.count < 300
        }
        #expect(throws: SignatureError.self) { try Signature(returning: .i32, arguments: Array(repeating: .buf, count: 65)) }
    }

    @Test("C parameter count and prototype")
    func cShape() throws {
        let signature = try Signature(parsing: "buf(str,buf,i32)")
        #expect(signature.cParameterCount == 5)  // str, ptr+len, i32, out_length
        #expect(signature.cPrototype(name: "f") == "uint8_t * f(const char *, const uint8_t *, size_t, int32_t, size_t *out_length)")
        #expect(try Signature(parsing: "void()").cPrototype(name: "g") == "void g(void)")
    }

    @Test(
        "malformed signatures: offset, what was expected, what was found",
        arguments: [
            ("", 0, "a result type", "the end of the text"),
            ("i32", 3, "\"(\" after the result type", "the end of the text"),
            ("i32(", 4, "an argument type", "the end of the text"),
            ("i32(i32,,i32)", 8, "an argument type", "\",\""),
            ("i32(i32 i32)", 8, "\",\" or \")\"", "\"i\""),
            ("i33(i32)", 0, "a result type", "\"i33\""),
            ("i32(void)", 4, "an argument type", "\"void\""),
            ("i32(i32,)", 8, "an argument type", "\")\""),
            ("i32(i32))", 8, "the end of the signature", "\")\""),
            ("i32(i32) x", 9, "the end of the signature", "\"x\""),
            ("(i32)", 0, "a result type", "\"(\""),
            ("i32[i32]", 3, "\"(\" after the result type", "\"[\""),
            ("int(int)", 0, "a result type", "\"int\""),
        ])
    func malformed(text: String, offset: Int, expected: String, found: String) {
        do {
            _ = try Signature(parsing: text)
            Issue.record("\"\(text)\" parsed")
        } catch {
            #expect(error.offset == offset, "\(error)")
            #expect(error.expected.hasPrefix(expected), "\(error)")
            #expect(error.found == found, "\(error)")
            #expect(error.description.contains("at offset \(offset)"))
        }
    }

    @Test("hints for void arguments and C spellings")
    func hints() {
        #expect(throws: SignatureError.self) { try Signature(parsing: "void(void)") }
        do {
            _ = try Signature(parsing: "void(void)")
        } catch {
            #expect(error.hint?.contains("write () for no arguments") == true)
        }
        do {
            _ = try Signature(parsing: "i32(int32_t)")
        } catch {
            #expect(error.hint == "did you mean i32?")
            #expect(error.description.contains("did you mean i32?"))
        }
    }

    @Test("building from parts refuses void arguments")
    func fromParts() throws {
        #expect(try Signature(returning: .u8, arguments: [.str]).description == "u8(str)")
        do {
            _ = try Signature(returning: .i32, arguments: [.i32, .void])
            Issue.record("void argument accepted")
        } catch {
            #expect(error.text == "i32(i32,void)")
            #expect(error.offset == 8)
        }
    }
}
