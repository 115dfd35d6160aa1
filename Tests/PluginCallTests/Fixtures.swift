import Foundation
import PluginCall
import PluginFormat

/// The test plugins, built once per test process and shared by every test.
///
/// `c` and `swift` export the same functions (prefix `c_` / `sw_`) so every round trip
/// runs against both languages; `c` also has the helpers that drive closures and measure
/// the heap. `dependencyA` / `dependent` are for the symbol-ownership tests.
struct Fixtures: Sendable {
    let c: LoadedLibrary
    let swift: LoadedLibrary
    let dependencyA: LoadedLibrary
    let dependent: LoadedLibrary

    static let shared: Result<Fixtures, PluginBuilder.Failure> = {
        do {
            let builder = try PluginBuilder()
            let cPath = try builder.buildC(name: "calltest_c", source: cSource)
            let swiftPath = try builder.buildSwift(name: "calltest_swift", source: swiftSource)
            let aPath = try builder.buildC(name: "calltest_a", source: dependencyASource)
            let bPath = try builder.buildC(
                name: "calltest_b", source: dependentSource,
                extraArguments: ["-L", builder.directory, "-lcalltest_a", "-Wl,-rpath,\(builder.directory)"])
            return .success(
                Fixtures(
                    c: try LoadedLibrary(path: cPath), swift: try LoadedLibrary(path: swiftPath),
                    dependencyA: try LoadedLibrary(path: aPath), dependent: try LoadedLibrary(path: bPath)))
        } catch let failure as PluginBuilder.Failure {
            return .failure(failure)
        } catch {
            return .failure(PluginBuilder.Failure(description: "\(error)"))
        }
    }()

    static func get() throws -> Fixtures { try shared.get() }

    /// Exports both language plugins declare (name without prefix, signature).
    static let commonExports: [(String, String)] = [
        ("id_i8", "i8(i8)"), ("id_i16", "i16(i16)"), ("id_i32", "i32(i32)"), ("id_i64", "i64(i64)"),
        ("id_u8", "u8(u8)"), ("id_u16", "u16(u16)"), ("id_u32", "u32(u32)"), ("id_u64", "u64(u64)"),
        ("id_f32", "f32(f32)"), ("id_f64", "f64(f64)"), ("id_bool", "bool(bool)"),
        ("not_bool", "bool(bool)"),
        ("widen_i8", "i64(i8)"), ("widen_u8", "u64(u8)"), ("widen_i32", "i64(i32)"),
        ("sub_u8", "u8(u8,u8)"),
        ("add_i32", "i32(i32,i32)"), ("madd", "i64(i64,i32,u8)"),
        ("mix", "f64(i8, u16, f32, f64, i64, bool)"),
        ("sum8", "i64(i64,i64,i64,i64,i64,i64,i64,i64)"),
        ("echo_str", "str(str)"), ("str_len", "u64(str)"), ("concat", "str(str,str)"),
        ("echo_buf", "buf(buf)"), ("buf_sum", "u64(buf)"), ("buf_is_null", "bool(buf)"),
        ("buf_then_i32", "i64(buf,i32)"), ("reverse", "buf(buf)"),
        ("empty_buf", "buf()"), ("null_str", "str()"), ("bad_buf", "buf()"),
        ("set_counter", "void(i32)"), ("get_counter", "i32()"),
    ]

    /// Exports only the C plugin has.
    static let cOnlyExports: [(String, String)] = [
        ("leak", "void(u64)"), ("heap_in_use", "u64()"),
        ("call_log", "void(u64,i32,str)"), ("call_post", "void(u64,str,bool,str)"), ("call_has", "bool(u64,str)"),
        ("call_has_threads", "i32(u64,i32,i32)"), ("call_generic", "i64(u64)"), ("call_float", "f32(u64)"),
        ("touch", "void(i32,str)"), ("touches", "i64()"),
    ]

    static func exports(prefix: String, cOnly: Bool) -> [Manifest.Export] {
        (commonExports + (cOnly ? cOnlyExports : [])).map { Manifest.Export(name: prefix + $0.0, signature: $0.1) }
    }

    /// The function table of the C or Swift plugin, as the loader would make it.
    static func table(_ language: Language, path: CallPath = .registers) throws -> FunctionTable {
        let fixtures = try get()
        let library = language == .c ? fixtures.c : fixtures.swift
        return try FunctionTable(
            pluginName: "calltest_\(language)", exports: exports(prefix: language.prefix, cOnly: language == .c),
            handle: library.handle, pluginPath: library.path, allowRegisterPath: path == .registers)
    }

    enum Language: String, Sendable, CaseIterable, CustomStringConvertible {
        case c, swift
        var prefix: String { self == .c ? "c_" : "sw_" }
        var description: String { rawValue }
    }

    // MARK: - Sources

    static let cSource = #"""
        #include <malloc.h>
        #include <pthread.h>
        #include <stdbool.h>
        #include <stddef.h>
        #include <stdint.h>
        #include <stdlib.h>
        #include <string.h>

        #define ID(T, N) T c_id_##N(T x) { return x; }
        ID(int8_t, i8) ID(int16_t, i16) ID(int32_t, i32) ID(int64_t, i64)
        ID(uint8_t, u8) ID(uint16_t, u16) ID(uint32_t, u32) ID(uint64_t, u64)
        ID(float, f32) ID(double, f64) ID(bool, bool)

        bool c_not_bool(bool x) { return !x; }
        int64_t c_widen_i8(int8_t x) { return x; }
        uint64_t c_widen_u8(uint8_t x) { return x; }
        int64_t c_widen_i32(int32_t x) { return x; }
        uint8_t c_sub_u8(uint8_t a, uint8_t b) { return (uint8_t)(a - b); }
        int32_t c_add_i32(int32_t a, int32_t b) { return a + b; }
        int64_t c_madd(int64_t a, int32_t b, uint8_t c) { return a * b + c; }
        double c_mix(int8_t a, uint16_t b, float c, double d, int64_t e, bool f) {
            return a + b * 2.0 + c * 4.0 + d * 8.0 + (double)e * 16.0 + (f ? 1000.0 : 0.0);
        }
        int64_t c_sum8(int64_t a, int64_t b, int64_t c, int64_t d, int64_t e, int64_t f, int64_t g, int64_t h) {
            return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h;
        }
        char *c_echo_str(const char *s) { return strdup(s); }
        uint64_t c_str_len(const char *s) { return strlen(s); }
        char *c_concat(const char *a, const char *b) {
            size_t la = strlen(a), lb = strlen(b);
            char *r = malloc(la + lb + 1);
            memcpy(r, a, la);
            memcpy(r + la, b, lb + 1);
            return r;
        }
        uint8_t *c_echo_buf(const uint8_t *p, size_t n, size_t *out) {
            uint8_t *r = malloc(n ? n : 1);
            memcpy(r, p, n);
            *out = n;
            return r;
        }
        uint64_t c_buf_sum(const uint8_t *p, size_t n) {
            uint64_t s = 0;
            for (size_t i = 0; i < n; i++) s += p[i];
            return s;
        }
        bool c_buf_is_null(const uint8_t *p, size_t n) { (void)n; return p == NULL; }
        int64_t c_buf_then_i32(const uint8_t *p, size_t n, int32_t x) { (void)p; return (int64_t)n * 1000 + x; }
        uint8_t *c_reverse(const uint8_t *p, size_t n, size_t *out) {
            uint8_t *r = malloc(n ? n : 1);
            for (size_t i = 0; i < n; i++) r[i] = p[n - 1 - i];
            *out = n;
            return r;
        }
        uint8_t *c_empty_buf(size_t *out) { *out = 0; return NULL; }
        char *c_null_str(void) { return NULL; }
        uint8_t *c_bad_buf(size_t *out) { *out = 5; return NULL; }
        static int32_t counter;
        void c_set_counter(int32_t v) { counter = v; }
        int32_t c_get_counter(void) { return counter; }

        /* Counts calls, to prove refused calls never reach the plugin. */
        static int64_t touches;
        void c_touch(int32_t a, const char *b) { (void)a; (void)b; touches++; }
        int64_t c_touches(void) { return touches; }

        /* Heap measurement for the leak tests (the whole process shares this malloc). */
        void c_leak(uint64_t n) { volatile char *p = malloc(n); if (p) p[0] = 1; }
        uint64_t c_heap_in_use(void) { struct mallinfo2 m = mallinfo2(); return m.uordblks + m.hblkhd; }

        /* Drivers: C code calling host closures handed over as integers. */
        typedef void (*log_fn)(int32_t, const char *);
        typedef void (*post_fn)(const char *, const char *);
        typedef bool (*has_fn)(const char *);
        void c_call_log(uint64_t f, int32_t level, const char *m) { ((log_fn)(uintptr_t)f)(level, m); }
        void c_call_post(uint64_t f, const char *name, bool with_payload, const char *payload) {
            ((post_fn)(uintptr_t)f)(name, with_payload ? payload : NULL);
        }
        bool c_call_has(uint64_t f, const char *name) { return ((has_fn)(uintptr_t)f)(name); }
        struct worker { has_fn f; int32_t calls; int32_t hits; };
        static void *work(void *arg) {
            struct worker *w = arg;
            for (int32_t i = 0; i < w->calls; i++) if (w->f(i % 2 ? "odd" : "even")) w->hits++;
            return NULL;
        }
        int32_t c_call_has_threads(uint64_t f, int32_t threads, int32_t calls) {
            pthread_t t[16];
            struct worker w[16];
            if (threads > 16) threads = 16;
            for (int32_t i = 0; i < threads; i++) {
                w[i] = (struct worker){ (has_fn)(uintptr_t)f, calls, 0 };
                pthread_create(&t[i], NULL, work, &w[i]);
            }
            int32_t hits = 0;
            for (int32_t i = 0; i < threads; i++) { pthread_join(t[i], NULL); hits += w[i].hits; }
            return hits;
        }
        typedef int64_t (*generic_fn)(int32_t, double, const char *, const uint8_t *, size_t, bool);
        int64_t c_call_generic(uint64_t f) {
            static const uint8_t bytes[] = { 1, 2, 3 };
            return ((generic_fn)(uintptr_t)f)(7, 2.5, "h\xc3\xa9llo", bytes, 3, true);
        }
        typedef float (*float_fn)(float, uint16_t);
        float c_call_float(uint64_t f) { return ((float_fn)(uintptr_t)f)(1.5f, 3); }
        """#

    static let swiftSource = #"""
        import Glibc
        import Synchronization

        @_cdecl("sw_id_i8") public func idI8(_ x: Int8) -> Int8 { x }
        @_cdecl("sw_id_i16") public func idI16(_ x: Int16) -> Int16 { x }
        @_cdecl("sw_id_i32") public func idI32(_ x: Int32) -> Int32 { x }
        @_cdecl("sw_id_i64") public func idI64(_ x: Int64) -> Int64 { x }
        @_cdecl("sw_id_u8") public func idU8(_ x: UInt8) -> UInt8 { x }
        @_cdecl("sw_id_u16") public func idU16(_ x: UInt16) -> UInt16 { x }
        @_cdecl("sw_id_u32") public func idU32(_ x: UInt32) -> UInt32 { x }
        @_cdecl("sw_id_u64") public func idU64(_ x: UInt64) -> UInt64 { x }
        @_cdecl("sw_id_f32") public func idF32(_ x: Float) -> Float { x }
        @_cdecl("sw_id_f64") public func idF64(_ x: Double) -> Double { x }
        @_cdecl("sw_id_bool") public func idBool(_ x: Bool) -> Bool { x }
        @_cdecl("sw_not_bool") public func notBool(_ x: Bool) -> Bool { !x }
        @_cdecl("sw_widen_i8") public func widenI8(_ x: Int8) -> Int64 { Int64(x) }
        @_cdecl("sw_widen_u8") public func widenU8(_ x: UInt8) -> UInt64 { UInt64(x) }
        @_cdecl("sw_widen_i32") public func widenI32(_ x: Int32) -> Int64 { Int64(x) }
        @_cdecl("sw_sub_u8") public func subU8(_ a: UInt8, _ b: UInt8) -> UInt8 { a &- b }
        @_cdecl("sw_add_i32") public func addI32(_ a: Int32, _ b: Int32) -> Int32 { a &+ b }
        @_cdecl("sw_madd") public func madd(_ a: Int64, _ b: Int32, _ c: UInt8) -> Int64 { a &* Int64(b) &+ Int64(c) }
        @_cdecl("sw_mix")
        public func mix(_ a: Int8, _ b: UInt16, _ c: Float, _ d: Double, _ e: Int64, _ f: Bool) -> Double {
            Double(a) + Double(b) * 2 + Double(c) * 4 + d * 8 + Double(e) * 16 + (f ? 1000 : 0)
        }
        @_cdecl("sw_sum8")
        public func sum8(_ a: Int64, _ b: Int64, _ c: Int64, _ d: Int64, _ e: Int64, _ f: Int64, _ g: Int64, _ h: Int64) -> Int64 {
            a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h
        }
        @_cdecl("sw_echo_str") public func echoStr(_ s: UnsafePointer<CChar>) -> UnsafeMutablePointer<CChar>? { strdup(s) }
        @_cdecl("sw_str_len") public func strLen(_ s: UnsafePointer<CChar>) -> UInt64 { UInt64(strlen(s)) }
        @_cdecl("sw_concat")
        public func concat(_ a: UnsafePointer<CChar>, _ b: UnsafePointer<CChar>) -> UnsafeMutablePointer<CChar>? {
            strdup(String(cString: a) + String(cString: b))
        }
        private func copyOut(_ bytes: [UInt8], _ out: UnsafeMutablePointer<Int>) -> UnsafeMutablePointer<UInt8>? {
            let result = malloc(max(bytes.count, 1))!.assumingMemoryBound(to: UInt8.self)
            result.initialize(from: bytes, count: bytes.count)
            out.pointee = bytes.count
            return result
        }
        @_cdecl("sw_echo_buf")
        public func echoBuf(_ p: UnsafePointer<UInt8>?, _ n: Int, _ out: UnsafeMutablePointer<Int>) -> UnsafeMutablePointer<UInt8>? {
            copyOut(Array(UnsafeBufferPointer(start: p, count: n)), out)
        }
        @_cdecl("sw_buf_sum") public func bufSum(_ p: UnsafePointer<UInt8>?, _ n: Int) -> UInt64 {
            UnsafeBufferPointer(start: p, count: n).reduce(0) { $0 + UInt64($1) }
        }
        @_cdecl("sw_buf_is_null") public func bufIsNull(_ p: UnsafePointer<UInt8>?, _ n: Int) -> Bool { p == nil }
        @_cdecl("sw_buf_then_i32") public func bufThenI32(_ p: UnsafePointer<UInt8>?, _ n: Int, _ x: Int32) -> Int64 {
            Int64(n) * 1000 + Int64(x)
        }
        @_cdecl("sw_reverse")
        public func reverse(_ p: UnsafePointer<UInt8>?, _ n: Int, _ out: UnsafeMutablePointer<Int>) -> UnsafeMutablePointer<UInt8>? {
            copyOut(Array(UnsafeBufferPointer(start: p, count: n).reversed()), out)
        }
        @_cdecl("sw_empty_buf") public func emptyBuf(_ out: UnsafeMutablePointer<Int>) -> UnsafeMutablePointer<UInt8>? {
            out.pointee = 0
            return nil
        }
        @_cdecl("sw_null_str") public func nullStr() -> UnsafeMutablePointer<CChar>? { nil }
        @_cdecl("sw_bad_buf") public func badBuf(_ out: UnsafeMutablePointer<Int>) -> UnsafeMutablePointer<UInt8>? {
            out.pointee = 5
            return nil
        }
        private let counter = Atomic<Int32>(0)
        @_cdecl("sw_set_counter") public func setCounter(_ v: Int32) { counter.store(v, ordering: .relaxed) }
        @_cdecl("sw_get_counter") public func getCounter() -> Int32 { counter.load(ordering: .relaxed) }
        """#

    static let dependencyASource = #"""
        #include <stdint.h>
        int32_t shared_f(int32_t x) { return x + 1; }
        """#

    static let dependentSource = #"""
        #include <stdint.h>
        int32_t shared_f(int32_t x);
        int32_t b_own(int32_t x) { return shared_f(x) * 10; }
        """#
}
