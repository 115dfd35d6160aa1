import Foundation
import Glibc
@testable import ModuleHost
import ModuleKit
import PluginCall
import PluginFormat
import Testing
import TestSupport

/// One corpus, two modes. The same plugin sources, a C one and a Swift one, each built
/// under one name that runs in process and another that runs isolated (this process binds
/// a plugin it loads by its SONAME, so the two cannot share a name), run side by side in
/// one plugin set. Every entry of the corpus is put to the module or plugin of each mode,
/// and the two answers, normalized (the names of the modules and plugins as roles, every
/// character outside printable ASCII escaped, anything over 4096 bytes as its length and
/// FNV-1a hash), must be equal; or, for an entry whose `Difference` gives the reason the
/// modes differ by design, the isolated answer must be the one it derives from the answer
/// in process, and not that answer. An answer in process is never empty where the module
/// is given something, so no comparison holds for want of answers.
@Suite(.timeLimit(.minutes(10)), .serialized)
struct DifferentialTests {
    typealias Language = IsolationTests.Language

    static let modes: [Isolation] = [.inProcess, .process]
    /// What a request to a worker, or a reply, holds at most: 16 MiB of JSON text.
    static let frameLimit = 16 << 20
    /// What a worker may post at once: a frame of 1 MiB.
    static let postLimit = 1 << 20

    // MARK: - The modes

    static func plugin(_ language: Language, _ isolation: Isolation) -> String {
        "Diff" + (language == .c ? "C" : "Swift") + (isolation == .inProcess ? "InProcess" : "Isolated")
    }

    static func module(_ language: Language, _ isolation: Isolation) -> String { plugin(language, isolation).lowercased() }

    static func other(_ isolation: Isolation) -> Isolation { isolation == .inProcess ? .process : .inProcess }

    static func other(_ language: Language) -> Language { language == .c ? .swift : .c }

    /// The module of the daemon's own that records what reaches it.
    static let recorder = "diffrecorder"

    /// Every module of the set, with the role it plays for the module of `language` in
    /// `isolation`: itself, its twin (the same source in the other mode), its peer (the
    /// other language in the same mode), its peer's twin, and the recorder.
    static func roles(_ language: Language, _ isolation: Isolation) -> [(module: String, role: String)] {
        [(module(language, isolation), "self"), (module(language, other(isolation)), "twin"),
         (module(other(language), isolation), "peer"), (module(other(language), other(isolation)), "peertwin"),
         (recorder, "recorder")]
    }

    // MARK: - Normalized answers

    /// One way the two modes answer an entry differently by design: why, and what the
    /// isolated module answers given the in-process answer (nil when the in-process answer
    /// is not the one this difference is about).
    struct Difference: Sendable {
        var reason: String
        var isolated: @Sendable (_ inProcess: String) -> String?

        /// In process `inProcess`, isolated `isolated`.
        static func exactly(_ inProcess: String, _ isolated: String, _ reason: String) -> Difference {
            Difference(reason: reason) { $0 == inProcess ? isolated : nil }
        }

        /// Isolated, the in-process answer with `part` (which it holds) as `replacement`.
        static func replacing(_ part: String, with replacement: String, _ reason: String) -> Difference {
            Difference(reason: reason) { $0.contains(part) ? $0.replacingOccurrences(of: part, with: replacement) : nil }
        }

        /// The same difference for the function named `function`, where its answers say `{f}`.
        func naming(_ function: String) -> Difference {
            let isolated = self.isolated
            return Difference(reason: reason) { inProcess in
                isolated(inProcess.replacingOccurrences(of: function, with: "{f}"))?.replacingOccurrences(of: "{f}", with: function)
            }
        }
    }

    /// Expects both modes' answers to `entry` to be equal, or to differ as `difference`
    /// lists; and the answer in process not to be empty (`answered`), so that two missing
    /// answers do not pass for two equal ones.
    static func compare(_ entry: String, _ answers: [Isolation: String], differs difference: Difference? = nil,
                        answered: Bool = true, sourceLocation: SourceLocation = #_sourceLocation) {
        let inProcess = answers[.inProcess] ?? "(none)", isolated = answers[.process] ?? "(none)"
        if answered {
            #expect(!inProcess.isEmpty, "\(entry): no answer in process", sourceLocation: sourceLocation)
        }
        guard let difference else {
            #expect(inProcess == isolated, "\(entry):\n  in process: \(inProcess)\n  isolated:   \(isolated)",
                    sourceLocation: sourceLocation)
            return
        }
        let listed = difference.isolated(inProcess)
        #expect(listed != nil && listed != inProcess && listed == isolated,
                "\(entry) should differ as listed (\(difference.reason)):\n  in process: \(inProcess)\n  isolated:   \(isolated)\n  listed:     \(listed ?? "(not listed for this answer in process)")",
                sourceLocation: sourceLocation)
    }

    /// `text` as the answer of the module of `language` in `isolation`: every character
    /// outside printable ASCII escaped (so that equal answers are equal byte for byte, not
    /// merely canonically equivalent), the set's plugin and module names as roles, the
    /// fixture's directory as `<root>`, and over 4096 bytes as its start, length and hash.
    static func normalized(_ text: String, _ language: Language, _ isolation: Isolation, root: String) -> String {
        var out = ascii(text).replacingOccurrences(of: root, with: "<root>")
        for (module, role) in roles(language, isolation) {
            if module != recorder { out = out.replacingOccurrences(of: capitalized(module), with: "<\(role.capitalized)>") }
            out = out.replacingOccurrences(of: module, with: "<\(role)>")
        }
        return out.utf8.count > 4096 ? String(out.prefix(200)) + "... " + digest(out) : out
    }

    /// The plugin named like `module`, which is its name in lower case.
    static func capitalized(_ module: String) -> String {
        for language in Language.allCases {
            for isolation in modes where self.module(language, isolation) == module { return plugin(language, isolation) }
        }
        return module
    }

    /// `text` with every character outside printable ASCII as `\u{HEX}`.
    static func ascii(_ text: String) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            if scalar.isASCII, scalar.value >= 0x20, scalar.value != 0x7F {
                out.unicodeScalars.append(scalar)
            } else {
                out += "\\u{" + String(scalar.value, radix: 16) + "}"
            }
        }
        return out
    }

    /// `#LENGTH:FNV-1a` of the bytes of `parts` one after the other, as the corpus plugins
    /// write a long text.
    static func digest(_ parts: [UInt8]...) -> String {
        var hash: UInt64 = 14_695_981_039_346_656_037
        for part in parts {
            part.withUnsafeBufferPointer { bytes in
                guard var byte = bytes.baseAddress else { return }
                let end = byte + bytes.count
                while byte < end {
                    hash = (hash ^ UInt64(byte.pointee)) &* 1_099_511_628_211
                    byte += 1
                }
            }
        }
        let hex = String(hash, radix: 16)
        return "#\(parts.reduce(0) { $0 + $1.count }):" + String(repeating: "0", count: 16 - hex.count) + hex
    }

    static func digest(_ text: String) -> String { digest([UInt8](text.utf8)) }

    /// The digest of a string of `count` x's, and of its JSON text.
    static func xDigest(_ count: Int, quoted: Bool = false) -> String {
        let text = [UInt8](repeating: UInt8(ascii: "x"), count: count)
        return quoted ? digest([UInt8(ascii: "\"")], text, [UInt8(ascii: "\"")]) : digest(text)
    }

    /// `value` in one line that tells every value a `JSONValue` can hold apart (a number by
    /// its exact double, NaN and infinities included), as the Swift plugin of the corpus
    /// spells what it is given; a string over 4096 bytes as its digest.
    static func describe(_ value: JSONValue) -> String {
        switch value {
        case .null: return "null"
        case .bool(let flag): return flag ? "true" : "false"
        case .number(let number): return "n:" + number.debugDescription
        case .string(let text): return text.utf8.count > 4096 ? digest(text) : JSONValue.quote(text)
        case .array(let elements): return "[" + elements.map(describe).joined(separator: ",") + "]"
        case .object(let members):
            return "{" + members.sorted { Array($0.key.utf8).lexicographicallyPrecedes(Array($1.key.utf8)) }
                .map { JSONValue.quote($0.key) + ":" + describe($0.value) }.joined(separator: ",") + "}"
        }
    }

    /// A call's result: its type, its text and JSON forms, and a float's bits; a string or
    /// buffer over 4096 bytes as its digest.
    static func spell(_ value: CallValue) -> String {
        switch value {
        case .string(let text) where text.utf8.count > 4096: return "str " + digest(text)
        case .string(let text): return "str " + JSONValue.quote(text)
        case .bytes(let bytes) where bytes.count > 4096: return "buf " + digest(bytes)
        case .float(let number): return "f32 \(value.text) json=\(value.json.jsonText) bits=\(String(number.bitPattern, radix: 16))"
        case .double(let number): return "f64 \(value.text) json=\(value.json.jsonText) bits=\(String(number.bitPattern, radix: 16))"
        default: return "\(value.type) \(value.text) json=\(value.json.jsonText)"
        }
    }

    static func spell(_ info: ModuleInfo?) -> String {
        guard let info else { return "none" }
        return "\(info.name) \(info.version) \(describe(.object(info.metadata)))"
    }

    /// Appends `line` to the file at `path`.
    static func append(_ line: String, to path: String) {
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return }
        let bytes = Array((line + "\n").utf8)
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }

    // MARK: - The plugins

    /// The C plugin of the corpus: plugin `name`, module `name` in lower case, which writes
    /// to `records`, one line each, `WHAT NAME PAYLOAD`: `create - CONFIGURATION`, every
    /// event with its kind (`lifecycle`, `custom`, `notification`) and payload as the host
    /// gave it (`-` for none; over 4096 bytes, as `#LENGTH:FNV-1a`), and `destroy - -`. It
    /// listens to `probe` and `relay`. On custom event `post.N` it posts notification N
    /// with the event's payload, on `postnull.N` with none, on `postbad.N` with text that is
    /// no JSON, on `postbytes.N` with bytes that are no UTF-8; on `postbig` it posts `relay`
    /// with a JSON string whose text is as long as the payload says; on `has.M` it writes
    /// down `has M true|false`, what `has_module(M)` answers. It exports an identity
    /// function per argument type (`c_i8` ... `c_buf`), and `c_void`, `c_count` (calls of
    /// c_void so far), `c_mixed` (every type at once, printed), `c_wide` (64 arguments),
    /// `c_div`, `c_null` (a NULL str), `c_badbuf` (NULL with a length), `c_nobuf` (NULL
    /// without), `c_badutf8`, `c_fill` and `c_fillbuf` (a result of the length asked for),
    /// `c_length` and `c_buflength` (an argument's length); `c_hidden` is exported but not
    /// declared.
    static func cPlugin(_ name: String, in directory: String, records: String) throws -> String {
        let wideParameters = (0..<64).map { "int32_t a\($0)" }.joined(separator: ", ")
        let wideSum = (0..<64).map { "(int64_t)\($0 + 1) * a\($0)" }.joined(separator: " + ")
        let source = """
            #define _GNU_SOURCE
            #include <modulehost.h>
            #include <fcntl.h>
            #include <inttypes.h>
            #include <stdatomic.h>
            #include <stdio.h>
            #include <stdlib.h>
            #include <string.h>
            #include <unistd.h>
            static void note(const char *what, const char *name, const char *payload) {
                size_t length = payload ? strlen(payload) : 0;
                size_t size = strlen(what) + strlen(name) + (length <= 4096 ? length : 0) + 64;
                char *line = malloc(size);
                if (line == NULL) return;
                int n;
                if (payload == NULL) {
                    n = snprintf(line, size, "%s %s -\\n", what, name);
                } else if (length <= 4096) {
                    n = snprintf(line, size, "%s %s %s\\n", what, name, payload);
                } else {
                    uint64_t hash = 14695981039346656037ULL;
                    for (size_t i = 0; i < length; i++) hash = (hash ^ (unsigned char)payload[i]) * 1099511628211ULL;
                    n = snprintf(line, size, "%s %s #%zu:%016" PRIx64 "\\n", what, name, length, hash);
                }
                int fd = open("\(records)", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
                if (fd >= 0) { if (write(fd, line, (size_t)n) < 0) {} close(fd); }
                free(line);
            }
            static const char *const kinds[] = {"event", "lifecycle", "custom", "notification"};
            static void *create(const modhost_host_api *host, const char *config) {
                note("create", "-", config);
                return (void *)host;
            }
            static void receive(void *instance, uint32_t kind, const char *event, const char *payload) {
                const modhost_host_api *host = instance;
                note(kind <= 3 ? kinds[kind] : "event", event, payload);
                if (strncmp(event, "post.", 5) == 0) host->post_notification(event + 5, payload);
                else if (strncmp(event, "postnull.", 9) == 0) host->post_notification(event + 9, NULL);
                else if (strncmp(event, "postbad.", 8) == 0) host->post_notification(event + 8, "{\\"a\\":");
                else if (strncmp(event, "postbytes.", 10) == 0) host->post_notification(event + 10, "\\"\\xff\\xfe\\"");
                else if (strcmp(event, "postbig") == 0 && payload != NULL) {
                    size_t length = strtoull(payload, NULL, 10);
                    char *text = length >= 2 ? malloc(length + 1) : NULL;
                    if (text == NULL) return;
                    memset(text, 'x', length);
                    text[0] = '"';
                    text[length - 1] = '"';
                    text[length] = 0;
                    host->post_notification("relay", text);
                    free(text);
                } else if (strncmp(event, "has.", 4) == 0) {
                    note("has", event + 4, host->has_module(event + 4) ? "true" : "false");
                }
            }
            static void destroy(void *instance) { (void)instance; note("destroy", "-", NULL); }
            MODHOST_EXPORT int8_t c_i8(int8_t x) { return x; }
            MODHOST_EXPORT int16_t c_i16(int16_t x) { return x; }
            MODHOST_EXPORT int32_t c_i32(int32_t x) { return x; }
            MODHOST_EXPORT int64_t c_i64(int64_t x) { return x; }
            MODHOST_EXPORT uint8_t c_u8(uint8_t x) { return x; }
            MODHOST_EXPORT uint16_t c_u16(uint16_t x) { return x; }
            MODHOST_EXPORT uint32_t c_u32(uint32_t x) { return x; }
            MODHOST_EXPORT uint64_t c_u64(uint64_t x) { return x; }
            MODHOST_EXPORT float c_f32(float x) { return x; }
            MODHOST_EXPORT double c_f64(double x) { return x; }
            MODHOST_EXPORT bool c_bool(bool x) { return x; }
            MODHOST_EXPORT char *c_str(const char *text) { return strdup(text); }
            MODHOST_EXPORT uint8_t *c_buf(const uint8_t *data, size_t length, size_t *out_length) {
                uint8_t *copy = malloc(length ? length : 1);
                if (copy) memcpy(copy, data, length);
                *out_length = copy ? length : 0;
                return copy;
            }
            static atomic_long voids;
            MODHOST_EXPORT void c_void(void) { atomic_fetch_add(&voids, 1); }
            MODHOST_EXPORT int64_t c_count(void) { return atomic_load(&voids); }
            MODHOST_EXPORT char *c_mixed(int8_t a, int16_t b, int32_t c, int64_t d, uint8_t e, uint16_t f, uint32_t g, uint64_t h,
                                         float i, double j, bool k, const char *l, const uint8_t *m, size_t m_length) {
                size_t size = strlen(l) + 2 * m_length + 256;
                char *text = malloc(size);
                if (text == NULL) return NULL;
                int n = snprintf(text, size, "%d %d %d %" PRId64 " %u %u %u %" PRIu64 " %a %a %d %s ",
                                 a, b, c, d, e, f, g, h, (double)i, j, k, l);
                for (size_t x = 0; x < m_length; x++) n += snprintf(text + n, size - (size_t)n, "%02x", m[x]);
                return text;
            }
            MODHOST_EXPORT int64_t c_wide(\(wideParameters)) { return \(wideSum); }
            MODHOST_EXPORT double c_div(double a, double b) { return a / b; }
            MODHOST_EXPORT char *c_null(void) { return NULL; }
            MODHOST_EXPORT uint8_t *c_badbuf(size_t *out_length) { *out_length = 5; return NULL; }
            MODHOST_EXPORT uint8_t *c_nobuf(size_t *out_length) { *out_length = 0; return NULL; }
            MODHOST_EXPORT char *c_badutf8(void) { return strdup("a\\xff\\xfe b\\xc3"); }
            MODHOST_EXPORT char *c_fill(uint64_t length) {
                char *text = malloc(length + 1);
                if (text) { memset(text, 'x', length); text[length] = 0; }
                return text;
            }
            MODHOST_EXPORT uint8_t *c_fillbuf(uint64_t length, size_t *out_length) {
                uint8_t *bytes = malloc(length ? length : 1);
                if (bytes) for (uint64_t i = 0; i < length; i++) bytes[i] = (uint8_t)(i % 251);
                *out_length = bytes ? length : 0;
                return bytes;
            }
            MODHOST_EXPORT uint64_t c_length(const char *text) { return strlen(text); }
            MODHOST_EXPORT uint64_t c_buflength(const uint8_t *data, size_t length) { (void)data; return length; }
            MODHOST_EXPORT int32_t c_hidden(void) { return 1; }
            static const char *const notes[] = {"probe", "relay", NULL};
            static const modhost_module modules[] = {{
                .struct_size = sizeof(modhost_module), .kind = MODHOST_MODULE_C, .name = "\(name.lowercased())", .version = "1.0",
                .notifications = notes, .create = create, .destroy = destroy, .receive = receive,
            }};
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("\(name)", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """
        let exports = cExports.map { ("c_" + $0.0, $0.1) }
        return try PluginFactory(directory: directory).buildC(
            name, source: source, manifest: PluginFactory.manifest(plugin: name, modules: [name.lowercased()], exports: exports, abi: "1.1"))
    }

    static let cExports: [(String, String)] = [
        ("i8", "i8(i8)"), ("i16", "i16(i16)"), ("i32", "i32(i32)"), ("i64", "i64(i64)"),
        ("u8", "u8(u8)"), ("u16", "u16(u16)"), ("u32", "u32(u32)"), ("u64", "u64(u64)"),
        ("f32", "f32(f32)"), ("f64", "f64(f64)"), ("bool", "bool(bool)"), ("str", "str(str)"), ("buf", "buf(buf)"),
        ("void", "void()"), ("count", "i64()"),
        ("mixed", "str(i8,i16,i32,i64,u8,u16,u32,u64,f32,f64,bool,str,buf)"),
        ("wide", "i64(" + Array(repeating: "i32", count: 64).joined(separator: ",") + ")"),
        ("div", "f64(f64,f64)"), ("null", "str()"), ("badbuf", "buf()"), ("nobuf", "buf()"), ("badutf8", "str()"),
        ("fill", "str(u64)"), ("fillbuf", "buf(u64)"), ("length", "u64(str)"), ("buflength", "u64(buf)"),
    ]

    /// The functions the Swift plugin exports (`s_` and the name), with the C plugin's
    /// behaviour.
    static let swiftExports: [(String, String)] = cExports.filter { !["mixed", "wide", "badbuf", "nobuf"].contains($0.0) }

    /// The Swift plugin of the corpus: plugin `name`, module `name` in lower case, which
    /// writes what it is given as the C plugin's does, to the file its configuration's
    /// `records` names (taken out of the configuration it keeps; one without it keeps the
    /// file it had), every value spelled by `describe`. Its Info's metadata is its
    /// configuration's `metadata` object, `big`, a string as long as the last `bigInfo`
    /// event's payload says, and after a `nanInfo` event `nan`, a NaN. On custom event
    /// `shout.N` it writes `before`, posts N with the payload (`host.post`), and writes
    /// `after`; on `tell.M` it sends M the custom event `told` with the payload
    /// (`host.send`); `keep` keeps the payload, `bulk` a string as long as its payload says,
    /// and `nan` an object holding a NaN and an infinity, which it hands over on a replace
    /// (as `{"kept": VALUE}`) and writes down (`state`, `restore`). A configuration with
    /// `"refuse": true` makes its init refuse, one with `"remove": true` removes it. It
    /// exports the functions of `swiftExports`, `s_hidden` undeclared.
    static func swiftPlugin(_ name: String) throws -> String {
        let module = name.lowercased()
        let source = """
            import Glibc
            import ModuleKit
            import Synchronization

            private let records = Mutex("/dev/null")

            private func note(_ line: String) {
                let path = records.withLock { $0 }
                let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
                guard fd >= 0 else { return }
                let bytes = Array((line + "\\n").utf8)
                _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                close(fd)
            }

            private func digest(_ bytes: [UInt8]) -> String {
                var hash: UInt64 = 14_695_981_039_346_656_037
                for byte in bytes { hash = (hash ^ UInt64(byte)) &* 1_099_511_628_211 }
                let hex = String(hash, radix: 16)
                return "#\\(bytes.count):" + String(repeating: "0", count: 16 - hex.count) + hex
            }

            private func describe(_ value: JSONValue) -> String {
                switch value {
                case .null: return "null"
                case .bool(let flag): return flag ? "true" : "false"
                case .number(let number): return "n:" + number.debugDescription
                case .string(let text): return text.utf8.count > 4096 ? digest(Array(text.utf8)) : JSONValue.quote(text)
                case .array(let elements): return "[" + elements.map(describe).joined(separator: ",") + "]"
                case .object(let members):
                    return "{" + members.sorted { Array($0.key.utf8).lexicographicallyPrecedes(Array($1.key.utf8)) }
                        .map { JSONValue.quote($0.key) + ":" + describe($0.value) }.joined(separator: ",") + "}"
                }
            }

            public final class Twin: PluginModule {
                public static let name = "\(module)"
                public static let version = "1.0"
                public var notifications: Set<String> { ["probe", "relay"] }
                var configuration: JSONValue
                var kept: JSONValue = .null
                var bigInfo = 0
                var nanInfo = false
                public var info: ModuleInfo {
                    var metadata: [String: JSONValue] = [:]
                    if case .object(let members) = configuration["metadata"] ?? .null { metadata = members }
                    if bigInfo > 0 { metadata["big"] = .string(String(repeating: "x", count: bigInfo)) }
                    if nanInfo { metadata["nan"] = .number(.nan) }
                    return ModuleInfo(name: Self.name, version: Self.version, metadata: metadata)
                }

                static func taking(_ configuration: JSONValue) -> JSONValue {
                    guard case .object(var members) = configuration else { return configuration }
                    if let path = members.removeValue(forKey: "records")?.stringValue { records.withLock { $0 = path } }
                    return .object(members)
                }

                public init?(host: isolated HostInstance, configuration: JSONValue) {
                    self.configuration = Self.taking(configuration)
                    note("create - \\(describe(self.configuration))")
                    if configuration["refuse"] == .bool(true) { return nil }
                }
                deinit { note("destroy - -") }

                public func handle(_ event: ModuleEvent, host: isolated HostInstance) {
                    switch event {
                    case .custom(let name, let payload):
                        note("custom \\(name) \\(describe(payload))")
                        if name.hasPrefix("shout.") {
                            note("before \\(name) \\(describe(payload))")
                            host.post(notification: String(name.dropFirst(6)), payload: payload)
                            note("after \\(name) \\(describe(payload))")
                        } else if name.hasPrefix("tell.") {
                            host.send(.custom(name: "told", payload: payload), to: String(name.dropFirst(5)))
                        } else if name == "keep" {
                            kept = payload
                        } else if name == "bulk" {
                            kept = .string(String(repeating: "x", count: Int(payload.numberValue ?? 0)))
                        } else if name == "nan" {
                            kept = ["n": .number(.nan), "inf": .number(.infinity)]
                        } else if name == "bigInfo" {
                            bigInfo = Int(payload.numberValue ?? 0)
                        } else if name == "nanInfo" {
                            nanInfo = true
                        }
                    case .notification(let name, let payload): note("notification \\(name) \\(describe(payload))")
                    case .configurationChanged(let configuration): note("lifecycle configurationChanged \\(describe(Self.taking(configuration)))")
                    default: note("lifecycle \\(event.name) -")
                    }
                }

                public func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async {
                    note("awaited \\(event.name) \\(describe(event.payload))")
                }

                public func updateConfiguration(_ configuration: JSONValue, host: isolated HostInstance) -> (any Module)? {
                    self.configuration = Self.taking(configuration)
                    note("configure - \\(describe(self.configuration))")
                    return self.configuration["remove"] == .bool(true) ? nil : self
                }

                public func stateForReplacement(host: isolated HostInstance) -> JSONValue? {
                    note("state - \\(describe(kept))")
                    return kept == .null ? nil : ["kept": kept]
                }

                public func restore(state: JSONValue, host: isolated HostInstance) {
                    note("restore - \\(describe(state))")
                    kept = state["kept"] ?? .null
                }
            }

            private let voids = Atomic<Int64>(0)

            @_cdecl("s_i8") public func sI8(_ x: Int8) -> Int8 { x }
            @_cdecl("s_i16") public func sI16(_ x: Int16) -> Int16 { x }
            @_cdecl("s_i32") public func sI32(_ x: Int32) -> Int32 { x }
            @_cdecl("s_i64") public func sI64(_ x: Int64) -> Int64 { x }
            @_cdecl("s_u8") public func sU8(_ x: UInt8) -> UInt8 { x }
            @_cdecl("s_u16") public func sU16(_ x: UInt16) -> UInt16 { x }
            @_cdecl("s_u32") public func sU32(_ x: UInt32) -> UInt32 { x }
            @_cdecl("s_u64") public func sU64(_ x: UInt64) -> UInt64 { x }
            @_cdecl("s_f32") public func sF32(_ x: Float) -> Float { x }
            @_cdecl("s_f64") public func sF64(_ x: Double) -> Double { x }
            @_cdecl("s_bool") public func sBool(_ x: Bool) -> Bool { x }
            @_cdecl("s_str") public func sStr(_ text: UnsafePointer<CChar>) -> UnsafeMutablePointer<CChar>? { strdup(text) }
            @_cdecl("s_buf")
            public func sBuf(_ data: UnsafePointer<UInt8>?, _ length: Int, _ outLength: UnsafeMutablePointer<Int>) -> UnsafeMutablePointer<UInt8>? {
                let copy = malloc(max(length, 1))!.assumingMemoryBound(to: UInt8.self)
                if let data, length > 0 { copy.update(from: data, count: length) }
                outLength.pointee = length
                return copy
            }
            @_cdecl("s_void") public func sVoid() { voids.add(1, ordering: .relaxed) }
            @_cdecl("s_count") public func sCount() -> Int64 { voids.load(ordering: .relaxed) }
            @_cdecl("s_div") public func sDiv(_ a: Double, _ b: Double) -> Double { a / b }
            @_cdecl("s_null") public func sNull() -> UnsafeMutablePointer<CChar>? { nil }
            @_cdecl("s_badutf8") public func sBadUTF8() -> UnsafeMutablePointer<CChar>? {
                let bytes: [UInt8] = [0x61, 0xFF, 0xFE, 0x20, 0x62, 0xC3, 0]
                let text = malloc(bytes.count)!.assumingMemoryBound(to: UInt8.self)
                text.update(from: bytes, count: bytes.count)
                return UnsafeMutableRawPointer(text).assumingMemoryBound(to: CChar.self)
            }
            @_cdecl("s_fill") public func sFill(_ length: UInt64) -> UnsafeMutablePointer<CChar>? {
                let text = malloc(Int(length) + 1)!.assumingMemoryBound(to: CChar.self)
                memset(text, 0x78, Int(length))
                text[Int(length)] = 0
                return text
            }
            @_cdecl("s_fillbuf")
            public func sFillBuf(_ length: UInt64, _ outLength: UnsafeMutablePointer<Int>) -> UnsafeMutablePointer<UInt8>? {
                let bytes = malloc(max(Int(length), 1))!.assumingMemoryBound(to: UInt8.self)
                for index in 0..<Int(length) { bytes[index] = UInt8(index % 251) }
                outLength.pointee = Int(length)
                return bytes
            }
            @_cdecl("s_length") public func sLength(_ text: UnsafePointer<CChar>) -> UInt64 { UInt64(strlen(text)) }
            @_cdecl("s_buflength") public func sBufLength(_ data: UnsafePointer<UInt8>?, _ length: Int) -> UInt64 { UInt64(length) }
            @_cdecl("s_hidden") public func sHidden() -> Int32 { 1 }

            @_cdecl("modhost_plugin_entry_v1")
            public func modhostPluginEntry() -> UnsafeRawPointer? { PluginExport.plugin("\(name)", modules: [Twin.self]) }
            """
        let exports = swiftExports.map { "{\"name\": \"s_\($0.0)\", \"signature\": \"\($0.1)\"}" }.joined(separator: ", ")
        let manifest = """
            {"name": "\(name)", "version": "1.0", "modules": ["\(module)"], "exports": [\(exports)]}
            """
        return try IsolationTests.buildWithPluginMakefile(name, variant: "differential", files: ["\(name).swift": source, "plugin.json": manifest])
    }

    // MARK: - The set

    /// A module of the daemon's own that listens to `probe` and `relay` and writes down,
    /// as the corpus modules do, every custom event and notification it gets.
    final class Recorder: Module {
        let moduleName = DifferentialTests.recorder
        let path: String
        var info: ModuleInfo { ModuleInfo(name: moduleName, version: "1.0") }
        var notifications: Set<String> { ["probe", "relay"] }

        init(path: String) { self.path = path }

        func handle(_ event: ModuleEvent, host: isolated HostInstance) {
            switch event {
            case .custom(let name, let payload): DifferentialTests.append("custom \(name) \(DifferentialTests.describe(payload))", to: path)
            case .notification(let name, let payload):
                DifferentialTests.append("notification \(name) \(DifferentialTests.describe(payload))", to: path)
            default: break
            }
        }
    }

    /// The corpus plugins of both languages in both modes, running in one started set
    /// beside the recorder, and the lines each module wrote.
    final class Twins {
        let f: IsolationTests.Fixture
        /// The directory of the modules' records.
        let records: String
        /// What the set logs.
        let log: IsolationTests.RecordingBackend
        /// Where the last `skip` left each module's lines.
        private var offsets: [String: Int] = [:]
        /// Each marker is new.
        private var marks = 0

        static var modules: [String] {
            Language.allCases.flatMap { language in modes.map { module(language, $0) } } + [recorder]
        }

        init(log: IsolationTests.RecordingBackend) async throws {
            self.log = log
            // A long event deadline: a worker of a debug build takes seconds to read and
            // answer a request of 16 MiB, longer on a loaded machine, and nothing here hangs.
            f = try IsolationTests.Fixture(plugins: [plugin(.c, .inProcess): PluginIsolationSettings(isolation: .inProcess),
                                                     plugin(.swift, .inProcess): PluginIsolationSettings(isolation: .inProcess)],
                                           deadline: .seconds(120))
            records = f.root.directory("records")
            for isolation in modes {
                let name = plugin(.c, isolation)
                try FileManager.default.copyItem(atPath: try cPlugin(name, in: f.root.directory("build-\(name)"), records: path(module(.c, isolation))),
                                                 toPath: f.plugins + "/lib\(name).so")
                try FileManager.default.copyItem(atPath: try swiftPlugin(plugin(.swift, isolation)), toPath: f.plugins + "/lib\(plugin(.swift, isolation)).so")
            }
            await f.set.updateSettings(settings([:]))
            let path = self.path(recorder)
            await f.host.add([ModuleFactory(name: recorder, version: "1.0") { _, _ in Recorder(path: path) }])
            let changes = await f.set.reconcile()
            #expect(changes.added.sorted() == Language.allCases.flatMap { language in modes.map { plugin(language, $0) } }.sorted(), "\(changes)")
            await f.set.start()
        }

        func path(_ module: String) -> String { records + "/\(module).log" }

        /// Every corpus module's settings: `configuration`, and for a Swift module, when it is
        /// an object, the file it writes to.
        func settings(_ configuration: JSONValue) -> [String: ModuleSettings] {
            var all: [String: ModuleSettings] = [:]
            for language in Language.allCases {
                for isolation in modes {
                    var given = configuration
                    if language == .swift, case .object(var members) = configuration {
                        members["records"] = .string(path(module(language, isolation)))
                        given = .object(members)
                    }
                    all[module(language, isolation)] = ModuleSettings(configuration: given)
                }
            }
            return all
        }

        /// The complete lines `module` wrote since the last `skip`.
        func lines(_ module: String) -> [String] {
            guard let data = FileManager.default.contents(atPath: path(module)) else { return [] }
            let bytes = [UInt8](data)
            let start = offsets[module] ?? 0
            guard let end = bytes.lastIndex(of: 10), end >= start else { return [] }
            return String(decoding: bytes[start..<end], as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        }

        /// From now on, `lines` gives only what is written from here.
        func skip() {
            for module in Self.modules {
                let bytes = FileManager.default.contents(atPath: path(module)).map { [UInt8]($0) } ?? []
                offsets[module] = (bytes.lastIndex(of: 10) ?? -1) + 1
            }
        }

        /// A text that appears nowhere but where it is sent from now on.
        func mark() -> String {
            marks += 1
            return "mark-\(marks)"
        }

        /// Waits until every module of `modules` wrote a line holding `mark` that begins with
        /// `prefix`.
        func until(_ modules: [String], wrote prefix: String, _ mark: String) async -> Bool {
            await f.until { modules.allSatisfy { module in lines(module).contains { $0.hasPrefix(prefix) && $0.contains(mark) } } }
        }

        /// What `module` wrote since the last `skip`, but the lines holding `mark`, normalized
        /// as the answer of the module of `language` in `isolation`.
        func answer(_ module: String, _ language: Language, _ isolation: Isolation, without mark: String? = nil) -> String {
            let kept = lines(module).filter { line in mark.map { !line.contains($0) } ?? true }
            // A C module is destroyed on a thread of its own once deinitialized: where that
            // falls among what a new instance writes meanwhile is not part of the answer.
            let ordered = kept.filter { $0 != "destroy - -" } + kept.filter { $0 == "destroy - -" }
            return normalized(ordered.joined(separator: " | "), language, isolation, root: f.root.path)
        }

        /// What every module (by its role for the module of `language` in `isolation`) wrote
        /// since the last `skip`, but the lines holding `mark`.
        func answers(_ language: Language, _ isolation: Isolation, without mark: String) -> String {
            roles(language, isolation).map { module, role in "\(role): " + answer(module, language, isolation, without: mark) }
                .joined(separator: " || ")
        }
    }
}

// MARK: - The corpus

extension DifferentialTests {
    @Test func theCorpusAnswersTheSameInProcessAndIsolated() async throws {
        let log = IsolationTests.RecordingBackend(keeping: "isolation-test")
        LoggingSystem.bootstrap(log, level: .info)
        defer { LoggingSystem.bootstrap(StandardErrorBackend(), level: .info) }
        let twins = try await Twins(log: log)
        // Created with their configuration, initialized and started alike.
        for language in Language.allCases {
            Self.compare("\(language) start", Dictionary(uniqueKeysWithValues: Self.modes.map { ($0, twins.answer(Self.module(language, $0), language, $0)) }))
        }
        await Self.calls(twins)
        await Self.events(twins)
        await Self.notifications(twins)
        await Self.posts(twins)
        await Self.tells(twins)
        await Self.hasModule(twins)
        try await Self.configurations(twins)
        try await Self.replacements(twins)
        // Shut down alike: deinitialized and destroyed.
        twins.skip()
        await twins.f.set.shutdown()
        for language in Language.allCases {
            var answers: [Isolation: String] = [:]
            for isolation in Self.modes {
                let module = Self.module(language, isolation)
                #expect(await twins.f.until { twins.lines(module).contains("destroy - -") }, "\(module) was not destroyed")
                answers[isolation] = twins.answer(module, language, isolation)
            }
            Self.compare("\(language) shutdown", answers)
        }
    }
}

// MARK: - Calls by name

extension DifferentialTests {
    enum Arguments: Sendable {
        case texts([String])
        case json([JSONValue])
    }

    /// A call of the corpus: the function (without its language's prefix), its arguments,
    /// the languages whose plugin it is put to, and how the modes differ on it (`{f}`
    /// standing for the function's name), if they do.
    struct Call: Sendable {
        var function: String
        var arguments: Arguments
        var languages: [Language] = Language.allCases
        var differs: Difference?

        var label: String {
            let shown: [String]
            switch arguments {
            case .texts(let texts): shown = texts.map { $0.utf8.count > 64 ? "\($0.utf8.count) bytes \(JSONValue.quote(String($0.prefix(8))))..." : JSONValue.quote($0) }
            case .json(let values): shown = values.map { DifferentialTests.describe($0) }
            }
            let form = if case .json = arguments { "json" } else { "texts" }
            return "\(function) \(form) [\(DifferentialTests.ascii(shown.joined(separator: ", ")))]"
        }
    }

    static func texts(_ function: String, _ texts: String..., only languages: [Language] = Language.allCases, differs: Difference? = nil) -> Call {
        Call(function: function, arguments: .texts(texts), languages: languages, differs: differs)
    }

    static func json(_ function: String, _ values: JSONValue..., only languages: [Language] = Language.allCases, differs: Difference? = nil) -> Call {
        Call(function: function, arguments: .json(values), languages: languages, differs: differs)
    }

    /// The result of calling `function` of `loaded` as the embedding API gives it, in the
    /// plugin's mode: `spell`'s form, or `error CODE: MESSAGE`.
    static func call(_ loaded: LoadedPlugin, _ function: String, _ arguments: Arguments) async -> String {
        do {
            if let isolated = loaded.isolated {
                switch arguments {
                case .texts(let texts): return spell(try await isolated.call(function, texts: texts))
                case .json(let values): return spell(try await isolated.call(function, json: values))
                }
            }
            guard let table = loaded.functions else { return "no functions" }
            switch arguments {
            case .texts(let texts): return spell(try table.call(function, texts: texts))
            case .json(let values): return spell(try table.call(function, json: values))
            }
        } catch let error as PluginSetError {
            return "error \(error.code.rawValue): \(error.message)"
        } catch let error as CallError {
            return "error \(error.code): \(error.description)"
        } catch {
            return "error \(error)"
        }
    }

    static let notSent = "isolated, a call whose arguments are larger than 16 MiB as JSON is refused with invalid_arguments and never sent, and one whose result is (a buf result as base64) fails with reply_too_large; a host that embeds the plugin set gets any size in process"

    static func tooLargeArguments(_ value: UInt64) -> Difference {
        .exactly("u64 \(value) json=\(value)",
                 "error invalid_arguments: call <Self>.{f}: its arguments are larger than the 16 MiB a request to an isolated plugin may hold; pass less, or run the plugin in process",
                 notSent)
    }

    static func tooLargeResult(_ inProcess: String) -> Difference {
        .exactly(inProcess, "error reply_too_large: the reply is larger than the 16 MiB a worker may send here: it is not sent; return less, or run the plugin in process",
                 notSent)
    }

    static let nanSign = "a NaN result crosses as the JSON string \"nan\": isolated, it comes back as NaN without its sign or payload bits"

    static let nonFiniteJSON = "JSON text cannot hold NaN or an infinity, which a JSONValue built in Swift can: such a number crosses as null"

    static let nullF64 = "error invalid_arguments: {f}: argument 1: \"null\" is not a valid f64: null is not accepted for f64"

    static let callCorpus: [Call] = {
        let limit = frameLimit
        let x = { (count: Int) in String(repeating: "x", count: count) }
        let wide = (1...64).map { "\($0 * 3 - 100)" }
        return [
            texts("i8", "0"), texts("i8", "-128"), texts("i8", "127"), texts("i8", "128"), texts("i8", "-129"), texts("i8", "0x7f"),
            texts("i8", "-0x80"), texts("i8", "0x80"), texts("i8", "+5"), texts("i8", "1.5"), texts("i8", ""), texts("i8", " 1"),
            texts("i16", "-32768"), texts("i16", "32767"), texts("i16", "32768"),
            texts("i32", "-2147483648"), texts("i32", "2147483647"), texts("i32", "2147483648"), texts("i32", "x"), texts("i32", "0X1f"),
            texts("i64", "-9223372036854775808"), texts("i64", "9223372036854775807"), texts("i64", "9223372036854775808"),
            texts("i64", "0x7fffffffffffffff"), texts("i64", "-0x8000000000000001"),
            texts("u8", "255"), texts("u8", "256"), texts("u8", "-1"), texts("u8", "-0"), texts("u8", "0xff"),
            texts("u16", "65535"), texts("u16", "65536"), texts("u32", "4294967295"), texts("u32", "4294967296"),
            texts("u64", "18446744073709551615"), texts("u64", "18446744073709551616"), texts("u64", "0xffffffffffffffff"),
            texts("u64", "340282366920938463463374607431768211456"),
            texts("f32", "0"), texts("f32", "-0"), texts("f32", "1.5"), texts("f32", "0.1"), texts("f32", "3.4028235e38"),
            texts("f32", "3.5e38"), texts("f32", "1e-45"), texts("f32", "0x1p-149"), texts("f32", "nan"), texts("f32", "inf"),
            texts("f32", "-inf"), texts("f32", "Infinity"), texts("f32", "abc"),
            texts("f32", "-nan", differs: .exactly("f32 nan json=\"nan\" bits=ffc00000", "f32 nan json=\"nan\" bits=7fc00000", nanSign)),
            texts("f64", "-0.0"), texts("f64", "0.1"), texts("f64", "5e-324"), texts("f64", "2.5e-310"), texts("f64", "1.7976931348623157e308"),
            texts("f64", "1e309"), texts("f64", "1e-400"), texts("f64", "nan"), texts("f64", "inf"), texts("f64", "-inf"), texts("f64", "0x1.8p1"),
            texts("f64", ""),
            texts("f64", "-nan", differs: .exactly("f64 nan json=\"nan\" bits=fff8000000000000", "f64 nan json=\"nan\" bits=7ff8000000000000", nanSign)),
            texts("bool", "true"), texts("bool", "false"), texts("bool", "1"), texts("bool", "0"), texts("bool", "yes"), texts("bool", "TRUE"),
            texts("str", ""), texts("str", "héllo"), texts("str", "e\u{301}"), texts("str", "😀"), texts("str", "a\u{0}b"),
            texts("str", "\u{1}\u{7F}\n\t\u{2028}\u{200E}"), texts("str", String(repeating: "ü", count: 1 << 19)),
            texts("buf", ""), texts("buf", "hex:"), texts("buf", "hex:00ff10"), texts("buf", "hex:0"), texts("buf", "hex:zz"),
            texts("buf", "base64:AAEC/w=="), texts("buf", "base64:!!"), texts("buf", "text:hex:00"), texts("buf", "plain"), texts("buf", "héllo"),
            texts("void"), texts("count"), texts("void", "1"), texts("count"), texts("i32"), texts("i32", "1", "2"),
            texts("mixed", "-1", "-2", "-3", "-4", "5", "6", "7", "8", "1.5", "-0.0", "true", "é", "hex:00ff", only: [.c]),
            texts("mixed", "-128", "-32768", "-2147483648", "-9223372036854775808", "255", "65535", "4294967295", "18446744073709551615",
                  "3.4028235e38", "5e-324", "false", "", "", only: [.c]),
            texts("mixed", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "true", "s", only: [.c]),
            Call(function: "wide", arguments: .texts(wide), languages: [.c]),
            Call(function: "wide", arguments: .texts(Array(wide.dropLast())), languages: [.c]),
            Call(function: "wide", arguments: .texts(wide + ["1"]), languages: [.c]),
            texts("div", "1", "0"), texts("div", "-1", "0"), texts("div", "1", "3"),
            texts("null"), texts("badbuf", only: [.c]), texts("nobuf", only: [.c]), texts("badutf8"),
            texts("nope"), texts("hidden"), texts(""),
            texts("fill", "0"), texts("fill", "\(limit - 256)", only: [.c]),
            texts("fill", "\(limit + 1)", only: [.c], differs: tooLargeResult("str " + xDigest(limit + 1))),
            texts("fillbuf", "\(12 << 20 - 1024)", only: [.c]),
            // As base64, 12 MiB and 3 bytes are more than 16 MiB.
            texts("fillbuf", "\(12 << 20 + 3)", only: [.c], differs: tooLargeResult("buf " + digest((0..<(12 << 20 + 3)).map { UInt8($0 % 251) }))),
            texts("length", x(limit - 256), only: [.c]),
            texts("length", x(limit + 1), only: [.c], differs: tooLargeArguments(UInt64(limit + 1))),

            json("i32", 5), json("i32", -5), json("i32", -0.0), json("i32", 2147483648), json("i32", 1.5), json("i32", "7"),
            json("i32", "0x10"), json("i32", true), json("i32", nil), json("i32", []), json("i32", [:]),
            json("i64", 9007199254740992), json("i64", 9007199254740994), json("i64", "-9223372036854775808"), json("i64", 1e300),
            json("u64", "18446744073709551615"), json("u64", -1), json("u64", 1e20), json("u8", 255), json("u8", 256),
            json("f64", -0.0), json("f64", 0.1), json("f64", .number(.leastNonzeroMagnitude)), json("f64", 1.7976931348623157e308), json("f64", "nan"),
            json("f64", "-inf"), json("f64", "1e999"), json("f64", true), json("f64", 1e21), json("f64", 123456789.125),
            json("f32", 3.4028234663852886e38), json("f32", 3.5e38), json("f32", 1e-46), json("f32", 0.1),
            json("bool", true), json("bool", false), json("bool", 1), json("bool", "true"),
            json("str", ""), json("str", "é"), json("str", "e\u{301}"), json("str", "a\u{0}b"), json("str", 5), json("str", nil),
            json("buf", ""), json("buf", "AAEC/w=="), json("buf", [0, 1, 255]), json("buf", [256]), json("buf", [-1]), json("buf", [1.5]),
            json("buf", "!!!"), json("buf", [:]), json("buf", []), json("buf", [-0.0]),
            json("void"), json("void", 1), json("count"),
            json("mixed", -1, -2, -3, "-4", 5, 6, 7, "18446744073709551615", 0.5, -0.0, false, "é", [0, 255], only: [.c]),
            Call(function: "wide", arguments: .json(wide.map { .number(Double($0)!) }), languages: [.c]),
            json("f64", .number(.nan), differs: .exactly("f64 nan json=\"nan\" bits=7ff8000000000000", nullF64, nonFiniteJSON)),
            json("f64", .number(-.infinity), differs: .exactly("f64 -inf json=\"-inf\" bits=fff0000000000000", nullF64, nonFiniteJSON)),
            json("i32", .number(.nan), differs: .exactly("error invalid_arguments: {f}: argument 1: \"null\" is not a valid i32: not a whole number",
                                                        "error invalid_arguments: {f}: argument 1: \"null\" is not a valid i32: null is not accepted for i32",
                                                        nonFiniteJSON)),
        ]
    }()

    /// Every call of the corpus, put to the plugin of each mode in each language.
    static func calls(_ twins: Twins) async {
        for language in Language.allCases {
            let prefix = language == .c ? "c_" : "s_"
            let declared = Set((language == .c ? cExports : swiftExports).map(\.0))
            var plugins: [Isolation: LoadedPlugin] = [:]
            for isolation in modes { plugins[isolation] = await twins.f.set.plugin(named: plugin(language, isolation)) }
            for entry in callCorpus where entry.languages.contains(language) {
                // Undeclared names are asked of every plugin; declared ones of those that export them.
                guard declared.contains(entry.function) || !cExports.contains(where: { $0.0 == entry.function }) else { continue }
                let function = entry.function.isEmpty ? "" : prefix + entry.function
                var answers: [Isolation: String] = [:]
                for isolation in modes {
                    guard let loaded = plugins[isolation] else { continue }
                    answers[isolation] = normalized(await call(loaded, function, entry.arguments), language, isolation, root: twins.f.root.path)
                }
                compare("\(language) call \(prefix)\(entry.label)", answers, differs: entry.differs?.naming(function))
            }
        }
    }
}

// MARK: - Events and notifications

extension DifferentialTests {
    static let notDelivered = "an event or notification larger than the 16 MiB a request to a worker may hold is not sent to it (in process there is no such bound)"

    /// `value` with every number JSON text cannot hold (NaN, an infinity) as null: what
    /// crosses to a worker and back.
    static func asJSON(_ value: JSONValue) -> JSONValue {
        switch value {
        case .number(let number) where !number.isFinite: return .null
        case .array(let elements): return .array(elements.map(asJSON))
        case .object(let members): return .object(members.mapValues(asJSON))
        default: return value
        }
    }

    /// Whether `value` holds a number JSON text cannot hold.
    static func holdsNonFinite(_ value: JSONValue) -> Bool { asJSON(value) != value }

    /// The payloads of the corpus: every kind of JSON value, the numbers and strings at the
    /// edges of what JSON text holds, and a string of 1 MiB.
    static let payloads: [JSONValue] = [
        nil, true, false, 0, -0.0, 1, -1, 0.1, 1e-7, .number(.leastNonzeroMagnitude), 1.7976931348623157e308, 9007199254740992, 9007199254740994,
        -9223372036854775808.0, 1e21, 123456789.125,
        "", "é", "e\u{301}", "😀", "\u{0}", "\u{1F}\u{7F}\u{80}\u{9F}", "\u{2028}\u{2029}\u{200E}", "\"\\/", "line\nbreak\ttab",
        [], [:], [1, [2, [3, []]]], ["": 1, "é": 2, "a": [:], "b": nil], ["z": 1, "e\u{301}": 2, "m": [true, false, nil]],
        .number(.nan), .number(.infinity), .number(-.infinity), ["n": .number(.nan), "list": [.number(-.infinity)]],
        .string(String(repeating: "ü", count: 1 << 19)),
    ]

    /// Payloads whose request to a worker is just under what a frame holds, and over it.
    static let underLimit = JSONValue.string(String(repeating: "x", count: frameLimit - 256))
    static let overLimit = JSONValue.string(String(repeating: "x", count: frameLimit + 1))

    /// The length of `value`'s JSON text, for a long string (none of the corpus has a
    /// character to escape) without writing it.
    static func jsonSize(_ value: JSONValue) -> Int {
        if case .string(let text) = value, text.utf8.count > 4096 { return text.utf8.count + 2 }
        return value.jsonText.utf8.count
    }

    /// What the module of `language` writes down for `kind` `name` with `payload`.
    static func line(_ language: Language, _ kind: String, _ name: String, _ payload: JSONValue) -> String {
        guard language == .c else { return "\(kind) \(name) \(describe(payload))" }
        if payload == .null { return "\(kind) \(name) -" }
        if case .string(let long) = payload, long.utf8.count > 4096 {
            return "\(kind) \(name) " + digest([UInt8(ascii: "\"")], [UInt8](long.utf8), [UInt8(ascii: "\"")])
        }
        let text = payload.jsonText
        return "\(kind) \(name) " + (text.utf8.count > 4096 ? digest(text) : text)
    }

    /// How the modes differ on `payload` given to the module of `language` as `kind` `name`.
    static func difference(_ language: Language, _ kind: String, _ name: String, _ payload: JSONValue) -> Difference? {
        if jsonSize(payload) > frameLimit {
            return .exactly(ascii(line(language, kind, name, payload)), "", notDelivered)
        }
        let inProcess = ascii(line(language, kind, name, payload)), isolated = ascii(line(language, kind, name, asJSON(payload)))
        // A C module is given JSON text: `null` for a NaN in process, no payload (NULL) for the null it is isolated.
        return inProcess == isolated ? nil : .exactly(inProcess, isolated, nonFiniteJSON)
    }

    /// Every payload as a custom event, synchronous and awaited, to each module in each
    /// mode, and the payloads at the limit (a C module's event shows the request just under
    /// it is sent whole) and over it, synchronous; and custom events of every kind of name.
    static func events(_ twins: Twins) async {
        for language in Language.allCases {
            for payload in payloads + (language == .c ? [underLimit, overLimit] : [overLimit]) {
                for awaited in [false, true] where !awaited || jsonSize(payload) < 4 << 20 {
                    var answers: [Isolation: String] = [:]
                    for isolation in modes {
                        let module = module(language, isolation)
                        twins.skip()
                        if awaited {
                            await twins.f.host.send(AsyncModuleEvent.custom(name: "echo", payload: payload), to: module)
                        } else {
                            await twins.f.host.send(ModuleEvent.custom(name: "echo", payload: payload), to: module)
                        }
                        answers[isolation] = twins.answer(module, language, isolation)
                    }
                    // A C module learns of an awaited custom event as of any custom event.
                    let kind = awaited ? "awaited" : "custom"
                    compare("\(language) \(kind) echo \(ascii(describe(payload)).prefix(80))", answers,
                            differs: difference(language, awaited && language == .c ? "custom" : kind, "echo", payload))
                }
            }
            let names = ["init", "deinit", "a:b", "é", "a b", String(repeating: "n", count: 64), String(repeating: "n", count: 65), ""]
            for name in names {
                var answers: [Isolation: String] = [:]
                for isolation in modes {
                    let module = module(language, isolation)
                    twins.skip()
                    await twins.f.host.send(ModuleEvent.custom(name: name, payload: 1), to: module)
                    answers[isolation] = twins.answer(module, language, isolation)
                }
                // A C module is given no name it cannot read whole, and no lifecycle name from anyone but the host.
                let delivered = language == .swift || (PluginName.isValid(name) && !ModuleEvent.lifecycleNames.contains(name))
                compare("\(language) custom event named \(JSONValue.quote(name))", answers, answered: delivered)
            }
        }
    }

    /// Every payload posted by the host as notification `probe`, which every module listens
    /// to: each module of each mode gets it, or, as listed, does not.
    static func notifications(_ twins: Twins) async {
        for payload in payloads + [overLimit] {
            twins.skip()
            await twins.f.host.post(notification: "probe", payload: payload)
            let mark = twins.mark()
            await twins.f.host.post(notification: "probe", payload: .string(mark))
            #expect(await twins.until(Twins.modules, wrote: "notification probe", mark), "\(mark) was not delivered to every module")
            for language in Language.allCases {
                let answers = Dictionary(uniqueKeysWithValues: modes.map { ($0, twins.answer(module(language, $0), language, $0, without: mark)) })
                compare("\(language) notification probe \(ascii(describe(payload)).prefix(80))", answers,
                        differs: difference(language, "notification", "probe", payload))
            }
        }
    }

    /// Roles' answers joined as `Twins.answers` joins them.
    static func joined(_ answers: [String]) -> String {
        zip(["self", "twin", "peer", "peertwin", "recorder"], answers).map { "\($0): \($1)" }.joined(separator: " || ")
    }

    /// Isolated, a Swift module's `host.post` reaches the poster once its handler has
    /// returned: its own line comes after `after` rather than before it.
    static let postedAfterReturn = Difference(
        reason: "isolated, a notification a Swift module posts is delivered after the posting code returns (as postFromAnywhere), in process during the post"
    ) { inProcess in
        var roles = inProcess.components(separatedBy: " || ")
        var lines = roles[0].components(separatedBy: " | ")
        guard let after = lines.firstIndex(where: { $0.hasPrefix("after shout.") }), after > 0,
              lines[after - 1].hasPrefix("notification ") else { return nil }
        lines.swapAt(after - 1, after)
        roles[0] = lines.joined(separator: " | ")
        return roles.joined(separator: " || ")
    }

    /// A notification a module posts, in each mode: what every module then gets (the module
    /// itself, its twin in the other mode, the other language's modules, the recorder).
    struct Post: Sendable {
        var event: String
        var payload: JSONValue
        var differs: Difference?
    }

    static func postCorpus(_ language: Language) -> [Post] {
        let small: [JSONValue] = [nil, 1, -0.0, .number(.leastNonzeroMagnitude), "é", "\u{0}\u{2028}", ["a": [1, nil, "e\u{301}"]], [:]]
        let over = "a worker sends at most 1 MiB at once: a notification a module posts whose name and payload make a frame over 1 MiB is not posted (in process there is no such bound)"
        if language == .c {
            let fits = postLimit - 64, tooLarge = postLimit + 1
            let cLine = "notification relay " + xDigest(tooLarge - 2, quoted: true)
            let swiftLine = "notification relay " + xDigest(tooLarge - 2)
            return small.map { Post(event: "post.relay", payload: $0) } + [
                Post(event: "postnull.relay", payload: nil), Post(event: "postbad.relay", payload: nil),
                Post(event: "postbytes.relay", payload: nil), Post(event: "post.init", payload: nil),
                Post(event: "postbig", payload: .number(Double(fits))),
                Post(event: "postbig", payload: .number(Double(tooLarge)),
                     differs: .exactly(joined(["custom postbig \(tooLarge) | \(cLine)", cLine, swiftLine, swiftLine, swiftLine]),
                                       joined(["custom postbig \(tooLarge)", "", "", "", ""]), over)),
            ]
        }
        let big = String(repeating: "x", count: postLimit + 1)
        let swiftLine = "notification relay " + xDigest(postLimit + 1)
        let cLine = "notification relay " + xDigest(postLimit + 1, quoted: true)
        let described = xDigest(postLimit + 1)
        let shout = "custom shout.relay \(described) | before shout.relay \(described)"
        return (small + [["inf": .number(.infinity)]]).map { payload in
            Post(event: "shout.relay", payload: payload,
                 differs: holdsNonFinite(payload) ? Difference(reason: nonFiniteJSON + "; " + postedAfterReturn.reason) { inProcess in
                     nonFiniteAsNull.isolated(inProcess).flatMap(postedAfterReturn.isolated)
                 } : postedAfterReturn)
        } + [
            Post(event: "shout.init", payload: nil),
            Post(event: "shout.relay", payload: .string(big),
                 differs: .exactly(joined(["\(shout) | \(swiftLine) | after shout.relay \(described)", swiftLine, cLine, cLine, swiftLine]),
                                   joined(["\(shout) | after shout.relay \(described)", "", "", "", ""]), over)),
        ]
    }

    /// Every post of the corpus, by the module of each language in each mode: the poster
    /// then posts a marker, which comes after it everywhere it is delivered.
    static func posts(_ twins: Twins) async {
        for language in Language.allCases {
            let markEvent = language == .c ? "post.relay" : "shout.relay"
            for post in postCorpus(language) {
                var answers: [Isolation: String] = [:]
                for isolation in modes {
                    let poster = module(language, isolation)
                    twins.skip()
                    await twins.f.host.send(ModuleEvent.custom(name: post.event, payload: post.payload), to: poster)
                    let mark = twins.mark()
                    await twins.f.host.send(ModuleEvent.custom(name: markEvent, payload: .string(mark)), to: poster)
                    #expect(await twins.until(Twins.modules, wrote: "notification relay", mark), "\(mark) from \(poster) was not delivered to every module")
                    answers[isolation] = twins.answers(language, isolation, without: mark)
                }
                compare("\(language) \(post.event) \(ascii(describe(post.payload)).prefix(80))", answers, differs: post.differs)
            }
        }
    }

    static let ownPluginOnly = "isolated, the custom events a Swift module sends with host.send reach only the modules of its own plugin"

    /// A custom event the Swift module sends to each other module (`host.send`), in each mode.
    static func tells(_ twins: Twins) async {
        for role in ["self", "twin", "peer", "peertwin", "recorder"] {
            var answers: [Isolation: String] = [:]
            for isolation in modes {
                let teller = module(.swift, isolation)
                let target = roles(.swift, isolation).first { $0.role == role }!.module
                twins.skip()
                await twins.f.host.send(ModuleEvent.custom(name: "tell." + target, payload: "told"), to: teller)
                let mark = twins.mark()
                await twins.f.host.send(ModuleEvent.custom(name: "tell." + teller, payload: .string(mark)), to: teller)
                #expect(await twins.until([teller], wrote: "custom told", mark), "\(mark) was not told to \(teller)")
                answers[isolation] = twins.answers(.swift, isolation, without: mark)
            }
            let differs: Difference? = role == "self" ? nil : .replacing(" || \(role): custom told \"told\"", with: " || \(role): ", ownPluginOnly)
            compare("swift tells \(role)", answers, differs: differs)
        }
    }

    static let createdLater = "isolated, has_module knows the worker's own modules and the daemon's running modules as of the module's creation, and the Swift modules were created after it"

    /// What `has_module` answers a C module in each mode, for each module of the set and one
    /// that does not run.
    static func hasModule(_ twins: Twins) async {
        for role in ["self", "twin", "peer", "peertwin", "recorder", "nothing"] {
            var answers: [Isolation: String] = [:]
            for isolation in modes {
                let module = module(.c, isolation)
                let target = roles(.c, isolation).first { $0.role == role }?.module ?? "nothing"
                twins.skip()
                await twins.f.host.send(ModuleEvent.custom(name: "has." + target, payload: nil), to: module)
                answers[isolation] = twins.answer(module, .c, isolation)
            }
            compare("c has_module \(role)", answers,
                    differs: ["peer", "peertwin"].contains(role) ? .replacing("has <\(role)> true", with: "has <\(role)> false", createdLater) : nil)
        }
    }
}

// MARK: - Configuration, Info and state

extension DifferentialTests {
    /// `nonFiniteJSON` for a Swift module's lines and Info: isolated, each NaN or infinity it
    /// was given is null.
    static let nonFiniteAsNull = Difference(reason: nonFiniteJSON) { inProcess in
        let isolated = ["n:nan", "n:-nan", "n:inf", "n:-inf"].reduce(inProcess) { $0.replacingOccurrences(of: $1, with: "null") }
        return isolated == inProcess ? nil : isolated
    }

    /// The Info of `module` as the host reads it: from `infos()`, and unless `once`, in the
    /// info payload and from the module itself; and whether it runs.
    static func info(_ twins: Twins, _ module: String, once: Bool = false) async -> String {
        let listed = await twins.f.host.infos().first { $0.name == module }
        let running = twins.f.host.runningModuleNames.contains(module)
        if once { return "info: \(spell(listed)) | running: \(running)" }
        var printed: JSONValue = .null
        if case .array(let entries) = await twins.f.host.infoPayload()["modules"] ?? .null {
            printed = entries.first { $0["name"]?.stringValue == module } ?? .null
        }
        let seen = await twins.f.host.perform { host in host.module(named: module)?.info }
        return "info: \(spell(listed)) | payload: \(describe(printed)) | own: \(spell(seen)) | running: \(running)"
    }

    /// Waits until every corpus module deinitialized since the last `skip` was destroyed too.
    static func settled(_ twins: Twins) async -> Bool {
        await twins.f.until {
            Twins.modules.filter { $0 != recorder }.allSatisfy { module in
                let lines = twins.lines(module)
                return lines.filter { $0 == "destroy - -" }.count >= lines.filter { $0 == "lifecycle deinit -" }.count
            }
        }
    }

    /// What each module of `language` wrote since the last `skip`, with its Info (read
    /// only once when `once`).
    static func answersWithInfo(_ twins: Twins, _ language: Language, once: Bool = false) async -> [Isolation: String] {
        var answers: [Isolation: String] = [:]
        for isolation in modes {
            let module = module(language, isolation)
            answers[isolation] = twins.answer(module, language, isolation) + " || "
                + normalized(await info(twins, module, once: once), language, isolation, root: twins.f.root.path)
        }
        return answers
    }

    static var configurationCorpus: [JSONValue] {
        [
            ["n": -0.0, "f": 0.1, "tiny": .number(.leastNonzeroMagnitude), "huge": 1.7976931348623157e308, "exact": 9007199254740992,
             "over": 9007199254740994],
            ["s": "é e\u{301} 😀 \u{0} \u{1F} \u{2028}", "": "empty key", "nested": [[], [:], [nil, true, false]]],
            ["metadata": ["build": "abc", "n": -0.0, "list": [1, "two", nil], "tiny": .number(.leastNonzeroMagnitude), "é": "e\u{301}"]],
            ["metadata": ["nan": .number(.nan)], "inf": .number(.infinity)],
            [1, "two"], "text", nil, [:],
            ["blob": .string(String(repeating: "x", count: frameLimit + 1))],
            ["remove": true],
            ["refuse": true],
        ]
    }

    static let tooLargeConfiguration = "a configuration larger than the 16 MiB a request to a worker may hold is not sent to it: a change to it is not delivered (the module runs on as it was), and a module created with it is refused (in process there is no such bound)"

    /// How the modes differ on `configuration`, given to running modules of `language`
    /// (`created` false) or to new ones.
    static func difference(_ language: Language, configuration: JSONValue, created: Bool) -> Difference? {
        if configuration.jsonText.utf8.count > frameLimit {
            return Difference(reason: tooLargeConfiguration) { inProcess in
                let parts = inProcess.components(separatedBy: " || ")
                guard parts.count == 2, !parts[0].isEmpty else { return nil }
                guard created else { return " || " + parts[1] }
                let left = parts[0].components(separatedBy: " | ").filter { !$0.hasPrefix("create ") && $0 != "lifecycle init -" && $0 != "lifecycle start -" }
                return left.joined(separator: " | ") + " || info: none | payload: null | own: none | running: false"
            }
        }
        return language == .swift && holdsNonFinite(configuration) ? nonFiniteAsNull : nil
    }

    static let infoNotSent = "isolated, an Info larger than the 16 MiB a reply may hold cannot be sent: the answer is the Info the module gave last, and the daemon logs a warning saying why (in process there is no such bound)"

    /// Gives every corpus module the empty configuration, and creates it again: all of them run.
    static func reset(_ twins: Twins) async throws {
        let corpus = Twins.modules.filter { $0 != recorder }
        twins.skip()
        await twins.f.set.updateSettings(twins.settings([:]))
        for module in corpus { try await twins.f.set.setEnabled(false, module: module) }
        #expect(await settled(twins), "a module was not destroyed")
        for module in corpus { try await twins.f.set.setEnabled(true, module: module) }
        #expect(Set(corpus).isSubset(of: twins.f.host.runningModuleNames), "\(twins.f.host.runningModuleNames)")
    }

    /// Each configuration of the corpus, given to the running modules (what they see of
    /// the change, and their Info then), and then to new ones (disabled and enabled again);
    /// and Info that changes as a module runs.
    static func configurations(_ twins: Twins) async throws {
        let corpus = Twins.modules.filter { $0 != recorder }
        for configuration in configurationCorpus {
            let label = ascii(describe(configuration)).prefix(80)
            twins.skip()
            await twins.f.set.updateSettings(twins.settings(configuration))
            #expect(await settled(twins), "\(label): a module was not destroyed")
            for language in Language.allCases {
                compare("\(language) configuration changed to \(label)", await answersWithInfo(twins, language),
                        differs: difference(language, configuration: configuration, created: false))
            }
            twins.skip()
            for module in corpus { try await twins.f.set.setEnabled(false, module: module) }
            #expect(await settled(twins), "\(label): a module was not destroyed")
            for module in corpus { try await twins.f.set.setEnabled(true, module: module) }
            for language in Language.allCases {
                compare("\(language) created with configuration \(label)", await answersWithInfo(twins, language),
                        differs: difference(language, configuration: configuration, created: true))
            }
            if !Set(corpus).isSubset(of: twins.f.host.runningModuleNames) { try await reset(twins) }
        }
        try await reset(twins)
        // Info that changes as the module runs, up to and over what a reply holds, and with a NaN.
        let lastInfo = Difference.replacing(xDigest(frameLimit + 1), with: xDigest(frameLimit - 4096), infoNotSent)
        for (event, payload) in [("bigInfo", 1 << 20), ("bigInfo", frameLimit - 4096), ("bigInfo", frameLimit + 1), ("bigInfo", 0), ("nanInfo", 0)] {
            twins.skip()
            for isolation in modes {
                await twins.f.host.send(ModuleEvent.custom(name: event, payload: .number(Double(payload))), to: module(.swift, isolation))
            }
            let tooLarge = payload > frameLimit
            // An Info of 16 MiB is read once: each reading sends it whole.
            compare("swift info after \(event) \(payload)", await answersWithInfo(twins, .swift, once: payload > 1 << 20),
                    differs: event == "nanInfo" ? nonFiniteAsNull : tooLarge ? lastInfo : nil)
            if tooLarge {
                let said = "the info of module \(module(.swift, .process)) is the last known (from its worker, or its name and version): its worker could not send it: the reply is larger than the 16 MiB"
                #expect(twins.log.kept().contains { $0.message.hasPrefix(said) }, "the log does not say why the info is the last known")
            }
        }
        try await reset(twins)
    }

    static let stateNotHandedOver = "isolated, a state for replacement is handed over as JSON up to 16 MiB: a larger one is not, and the new version starts without it (in process there is no such bound)"

    /// Replaces every plugin with a new version of its file, with each state of the corpus
    /// kept by the Swift modules: what every module then does, old and new.
    static func replacements(_ twins: Twins) async throws {
        let versions = PluginFactory(directory: twins.f.root.directory("versions"))
        let over = xDigest(frameLimit + 1)
        let entries: [(event: String?, payload: JSONValue, differs: Difference?)] = [
            (nil, nil, nil),
            ("keep", ["a": 1, "é": [-0.0, .number(.leastNonzeroMagnitude), "e\u{301}"]], nil),
            ("nan", nil, .replacing("restore - {\"kept\":{\"inf\":n:inf,\"n\":n:nan}}", with: "restore - {\"kept\":{\"inf\":null,\"n\":null}}", nonFiniteJSON)),
            ("bulk", .number(Double(frameLimit - 4096)), nil),
            ("bulk", .number(Double(frameLimit + 1)), .replacing(" | restore - {\"kept\":\(over)}", with: "", stateNotHandedOver)),
        ]
        let names = Language.allCases.flatMap { language in modes.map { plugin(language, $0) } }
        for (cycle, entry) in entries.enumerated() {
            twins.skip()
            if let event = entry.event {
                for isolation in modes { await twins.f.host.send(ModuleEvent.custom(name: event, payload: entry.payload), to: module(.swift, isolation)) }
            }
            for name in names {
                let file = twins.f.plugins + "/lib\(name).so"
                let manifest = try PluginFactory.embeddedManifest(file)
                let next = try versions.withManifest(file, manifest.replacing(#/"version"\s*:\s*"[0-9.]+"/#, with: #""version":"2.\#(cycle)""#),
                                                     as: "lib\(name)-\(cycle).so")
                try FileManager.default.copyItem(atPath: next, toPath: twins.f.plugins + "/.lib\(name).so.tmp")
                #expect(rename(twins.f.plugins + "/.lib\(name).so.tmp", file) == 0)
            }
            let changes = await twins.f.set.reconcile()
            #expect(changes.replaced.sorted() == names.sorted(), "\(changes)")
            #expect(await settled(twins), "a module was not destroyed")
            for language in Language.allCases {
                let answers = Dictionary(uniqueKeysWithValues: modes.map { ($0, twins.answer(module(language, $0), language, $0)) })
                compare("\(language) replaced, \(entry.event ?? "nothing") \(ascii(describe(entry.payload)).prefix(80)) kept", answers,
                        differs: language == .swift ? entry.differs : nil)
            }
        }
    }
}
