import Foundation
import Glibc
import PluginCall
import PluginFormat
import Testing
import TestSupport

/// Calls with typed Swift values (`CallScalar`) instead of `CallValue`s.
@Suite(.timeLimit(.minutes(5))) struct TypedCallTests {
    let dir = TemporaryDirectory("typed-calls")

    func table() throws -> FunctionTable {
        let source = """
            #include <stdbool.h>
            #include <stdint.h>
            __attribute__((visibility("default"))) int32_t t_add(int32_t a, int32_t b) { return a + b; }
            __attribute__((visibility("default"))) uint64_t t_mix(int64_t a, uint8_t b) { return (uint64_t)a * b; }
            __attribute__((visibility("default"))) bool t_less(double a, float b) { return a < b; }
            __attribute__((visibility("default"))) int32_t t_neg(int32_t a) { return -a; }
            """
        let path = try PluginFactory(directory: dir.path).buildC("Typed", source: source, manifest: nil)
        guard let handle = dlopen(path, RTLD_NOW | RTLD_LOCAL) else { throw POSIXError(.ENOENT) }
        return try FunctionTable(
            pluginName: "Typed",
            exports: [.init(name: "t_add", signature: "i32(i32,i32)"), .init(name: "t_mix", signature: "u64(i64,u8)"),
                      .init(name: "t_less", signature: "bool(f64,f32)"), .init(name: "t_neg", signature: "i32(i32)")],
            handle: handle, pluginPath: path)
    }

    @Test func typedValuesRoundTrip() throws {
        let functions = try table()
        let sum: Int32 = try functions.function(named: "t_add").call(Int32.max, Int32(1))
        #expect(sum == Int32.min)  // C wraps
        let product: UInt64 = try functions.function(named: "t_mix").call(Int64(-1), UInt8(2))
        #expect(product == UInt64.max - 1)
        let less: Bool = try functions.function(named: "t_less").call(1.5, Float(2.5))
        #expect(less)
        let notLess: Bool = try functions.function(named: "t_less").call(3.5, Float(2.5))
        #expect(!notLess)
    }

    @Test func typesAreCheckedBeforeTheCall() throws {
        // One build: rebuilding a loaded library in place would crash the loader.
        let functions = try table()
        let add = try functions.function(named: "t_add")
        #expect(throws: CallError.wrongType(function: "t_add", position: 2, expected: .i32, given: .i64)) {
            let _: Int32 = try add.call(Int32(1), Int64(2))
        }
        #expect(throws: CallError.wrongResultType(function: "t_add", expected: .i32, requested: .u32)) {
            let _: UInt32 = try add.call(Int32(1), Int32(2))
        }
        let negate = try functions.function(named: "t_neg")
        #expect(throws: CallError.self) {
            let _: Int32 = try negate.call(Int32(1), Int32(2))
        }
    }
}
