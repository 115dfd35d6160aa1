import Foundation
import Glibc
import PluginCall
import PluginFormat

/// Calling a plugin function by name (PluginCall) against calling it through a plain C
/// function pointer, in the same run, on the example C plugin Calculator's
/// `calc_add: i32(i32,i32)`.
///
/// Every loop varies its arguments and adds up the results, and the sums of all loops
/// must agree: the calls can be neither skipped nor hoisted (the callee is an opaque
/// pointer), and a wrong result from the host fails the benchmark.
struct CallBenchmark {
    let sdk: String
    let iterations = 10_000_000
    let repetitions = 5
    let freshTables = 100

    typealias Add = @convention(c) (Int32, Int32) -> Int32

    func run() throws -> [BenchRow] {
        let path = sdk + "/plugins/libCalculator.so"
        guard let bytes = try ELFImage(path: path).sectionContents(named: ".modhost.manifest") else {
            throw BenchError("\(path) has no .modhost.manifest section")
        }
        let manifest = try Manifest.parse(bytes)
        guard let handle = dlopen(path, RTLD_NOW | RTLD_LOCAL) else { throw BenchError(String(cString: dlerror())) }
        let table = try FunctionTable(pluginName: manifest.name, exports: manifest.exports, handle: handle, pluginPath: path)
        let ffiTable = try FunctionTable(
            pluginName: manifest.name, exports: manifest.exports, handle: handle, pluginPath: path, allowRegisterPath: false)
        guard let symbol = dlsym(handle, "calc_add") else { throw BenchError(String(cString: dlerror())) }
        let direct = unsafeBitCast(symbol, to: Add.self)

        let cached = try table.function(named: "calc_add")
        let viaFFI = try ffiTable.function(named: "calc_add")
        guard cached.path == .registers, viaFFI.path == .libffi else {
            throw BenchError("unexpected call paths: \(cached.path), \(viaFFI.path)")
        }

        var directTimes: [Double] = [], cachedTimes: [Double] = [], ffiTimes: [Double] = [], typedTimes: [Double] = []
        for _ in 0..<repetitions {
            let (directSeconds, expected) = Self.directLoop(direct, iterations)
            let (cachedSeconds, cachedSum) = try Self.hostLoop(cached, iterations)
            let (ffiSeconds, ffiSum) = try Self.hostLoop(viaFFI, iterations)
            let (typedSeconds, typedSum) = try Self.typedLoop(cached, iterations)
            guard cachedSum == expected, ffiSum == expected, typedSum == expected else {
                throw BenchError("sums differ: direct \(expected), registers \(cachedSum), libffi \(ffiSum), typed \(typedSum)")
            }
            typedTimes.append(typedSeconds)
            directTimes.append(directSeconds)
            cachedTimes.append(cachedSeconds)
            ffiTimes.append(ffiSeconds)
        }
        let perCall = { (times: [Double]) in median(times) / Double(self.iterations) * 1e9 }
        let directNanos = perCall(directTimes), cachedNanos = perCall(cachedTimes), ffiNanos = perCall(ffiTimes)
        let typedNanos = perCall(typedTimes)

        // First call: lookup + ffi_prep_cif + call on a table that has never prepared the
        // function. The tables are made from the already resolved exports, untimed.
        var firstTimes: [Double] = []
        for index in 0..<freshTables {
            let fresh = FunctionTable(pluginName: manifest.name, exports: table.declared)
            let a = Int32(index), b = Int32(2 * index)
            var result = CallValue.void
            firstTimes.append(try seconds {
                result = try fresh.function(named: "calc_add").call(.int32(a), .int32(b))
            })
            guard result == .int32(a + b) else { throw BenchError("first call returned \(result), expected \(a + b)") }
        }
        let firstMicros = median(firstTimes) * 1e6

        let loop = "\(iterations / 1_000_000) M calls with varying arguments, results summed, median of \(repetitions)"
        return [
            BenchRow(
                name: "call.cached.i32_add", value: cachedNanos, unit: "ns", baseline: directNanos,
                baselineDescription: "direct call through a C function pointer from dlsym, same function, \(loop)",
                target: 3),
            BenchRow(
                name: "call.cached_typed.i32_add", value: typedNanos, unit: "ns", baseline: directNanos,
                baselineDescription: "direct call through a C function pointer from dlsym, same function, \(loop); host called with typed Swift values (call(_: Int32, _: Int32) -> Int32), types checked per call",
                target: 3),
            BenchRow(
                name: "call.cached_libffi.i32_add", value: ffiNanos, unit: "ns", baseline: directNanos,
                baselineDescription: "direct call through a C function pointer from dlsym, same function, \(loop); host forced to ffi_call",
                target: 3),
            BenchRow(
                name: "call.first", value: firstMicros, unit: "us", baseline: cachedNanos / 1000,
                baselineDescription:
                    "one cached call (call.cached.i32_add); the ratio is how many cached calls the first one costs (lookup + ffi_prep_cif + call on a fresh table, median of \(freshTables) tables; the very first in the process took \(String(format: "%.1f", firstTimes[0] * 1e6)) us); target 250: the one-off cost stays within a few microseconds",
                target: 250),
        ]
    }

    /// Seconds for `iterations` direct calls, and the sum of their results.
    @inline(never)
    static func directLoop(_ add: Add, _ iterations: Int) -> (Double, Int64) {
        var sum: Int64 = 0
        let elapsed = seconds {
            for i in 0..<iterations {
                sum &+= Int64(add(Int32(truncatingIfNeeded: i & 0xFFFF), Int32(truncatingIfNeeded: i >> 8 & 0xFFFF)))
            }
        }
        return (elapsed, sum)
    }

    /// Seconds for `iterations` typed calls through the host, and the sum of their results.
    @inline(never)
    static func typedLoop(_ function: CallableFunction, _ iterations: Int) throws -> (Double, Int64) {
        var sum: Int64 = 0
        let elapsed = try seconds {
            for i in 0..<iterations {
                let value: Int32 = try function.call(
                    Int32(truncatingIfNeeded: i & 0xFFFF), Int32(truncatingIfNeeded: i >> 8 & 0xFFFF))
                sum &+= Int64(value)
            }
        }
        return (elapsed, sum)
    }

    /// Seconds for `iterations` calls through the host, and the sum of their results.
    @inline(never)
    static func hostLoop(_ function: CallableFunction, _ iterations: Int) throws -> (Double, Int64) {
        var sum: Int64 = 0
        let elapsed = try seconds {
            for i in 0..<iterations {
                let result = try function.call(
                    .int32(Int32(truncatingIfNeeded: i & 0xFFFF)), .int32(Int32(truncatingIfNeeded: i >> 8 & 0xFFFF)))
                guard case .int32(let value) = result else { throw BenchError("calc_add returned \(result)") }
                sum &+= Int64(value)
            }
        }
        return (elapsed, sum)
    }
}
