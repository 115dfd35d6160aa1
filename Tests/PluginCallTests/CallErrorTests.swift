import PluginCall
import PluginFormat
import Testing

@Suite("Refused calls", .timeLimit(.minutes(5)))
struct CallErrorTests {
    @Test("arity, type, range and NUL errors are thrown before the plugin runs")
    func refusedBeforeCall() throws {
        let table = try Fixtures.table(.c)
        let touch = try table.function(named: "c_touch")
        let touches = try table.function(named: "c_touches")
        let before = try touches.call()
        #expect(try touch.call(.int32(1), .string("ok")) == .void)
        let afterOne = try touches.call()
        guard case .int64(let start) = before, case .int64(let one) = afterOne else {
            Issue.record("c_touches did not return i64")
            return
        }
        #expect(one == start + 1)

        #expect(throws: CallError.wrongArity(function: "c_touch", signature: touch.signature, given: 1)) {
            try touch.call(.int32(1))
        }
        #expect(throws: CallError.wrongArity(function: "c_touch", signature: touch.signature, given: 3)) {
            try touch.call([.int32(1), .string(""), .string("")])
        }
        #expect(throws: CallError.wrongType(function: "c_touch", position: 1, expected: .i32, given: .i64)) {
            try touch.call(.int64(1), .string(""))
        }
        #expect(throws: CallError.wrongType(function: "c_touch", position: 2, expected: .str, given: .buf)) {
            try touch.call(.int32(1), .bytes([]))
        }
        #expect(throws: CallError.self) { try touch.call(.int32(1), .string("a\u{0}b")) }
        #expect(
            throws: CallError.invalidArgument(
                function: "c_touch", position: 1,
                ValueError(type: .i32, input: "2147483648", reason: "out of range for i32 (-2147483648...2147483647)"))
        ) {
            try table.call("c_touch", texts: ["2147483648", "x"])
        }
        #expect(throws: CallError.self) { try table.call("c_touch", json: [.number(0.5), .string("x")]) }
        #expect(throws: CallError.self) { try table.call("c_touch", json: [.number(1)]) }
        #expect(try touches.call() == afterOne, "a refused call reached the plugin")
    }

    @Test("messages name the function, the position and both types")
    func messages() throws {
        let signature = try Signature(parsing: "i32(i32,i32)")
        #expect(
            CallError.wrongArity(function: "add", signature: signature, given: 3).description
                == "add: expected 2 arguments for i32(i32,i32), got 3")
        #expect(
            CallError.wrongType(function: "add", position: 2, expected: .i32, given: .f64).description
                == "add: argument 2 must be i32, got a f64 value")
    }

    @Test("an undeclared function is an error, even when the library defines the symbol")
    func undeclared() throws {
        let fixtures = try Fixtures.get()
        let table = try FunctionTable(
            pluginName: "calltest_c", exports: [Manifest.Export(name: "c_id_i32", signature: "i32(i32)")],
            handle: fixtures.c.handle, pluginPath: fixtures.c.path)
        #expect(try table.call("c_id_i32", [.int32(3)]) == .int32(3))
        #expect(
            throws: CallError.undeclaredFunction(plugin: "calltest_c", function: "c_add_i32", declared: ["c_id_i32"])
        ) {
            try table.function(named: "c_add_i32")
        }
        #expect(throws: CallError.self) { try table.call("no_such_function", []) }
        #expect(throws: CallError.self) { try table.signature(of: "c_add_i32") }
        #expect(try table.signature(of: "c_id_i32").description == "i32(i32)")
        let message = CallError.undeclaredFunction(plugin: "p", function: "f", declared: ["a", "b"]).description
        #expect(message == "plugin p does not declare a function f in its manifest exports (it declares a, b)")
    }

    @Test("the table prepares each function once and caches it")
    func cached() throws {
        let table = try Fixtures.table(.c)
        let first = try table.function(named: "c_add_i32")
        let second = try table.function(named: "c_add_i32")
        #expect(first === second)
    }
}
