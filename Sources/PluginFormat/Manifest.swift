@_spi(ModuleHost) import ModuleKit

/// A plugin's manifest: what the host knows about a plugin file before running any of its
/// code. It is JSON, embedded by `plugin.mk` in the ELF section `.modhost.manifest`
/// (see docs/abi.md), so `modhostctl inspect` and validation read it without `dlopen`.
public struct Manifest: Codable, Sendable, Equatable {
    /// The plugin's name: unique among loaded plugins, used by dependencies. Follows the
    /// grammar of `PluginName`, as do `modules` and `dependencies`.
    public var name: String
    public var version: String
    public var description: String
    /// "MAJOR.MINOR" of the C ABI the plugin was built against.
    public var abi: String
    /// "swift" or "c".
    public var language: Language
    /// Swift plugins only: what they were compiled with and against.
    public var toolchain: Toolchain?
    /// Names of plugins this one needs loaded first.
    public var dependencies: [String]
    /// Default position among plugins and modules (lower first); settings may override.
    /// Within `Manifest.orderRange`.
    public var order: Int

    /// The allowed orders, in manifests and in the daemon's configuration.
    public static let orderRange = -1_000_000_000...1_000_000_000
    /// Names of the modules the entry symbol will describe, in order.
    public var modules: [String]
    /// Functions exported for calling by name, with their signatures.
    public var exports: [Export]
    /// Where the plugin asks to run: "process" (in a worker process of its own) or
    /// "in-process"; nil leaves it to the host's configuration (docs/isolation.md).
    public var isolation: String?
    /// Fields the manifest has that no manifest field is called, by path (`dependecies`,
    /// `exports[0].signatur`), in document order. Reading does not fail on them, so that
    /// a plugin built for a newer ABI is refused by its ABI version first; plugin.mk
    /// (`modhostctl manifest`) and the validator refuse them (`unknownField`). Not encoded.
    public var unknownFields: [String] = []

    /// The field names of a manifest, of its `toolchain` and of each of its `exports`.
    public static let fieldNames = CodingKeys.allCases.map(\.rawValue)
    static let toolchainFieldNames = ["swift", "moduleKit"]
    static let exportFieldNames = ["name", "signature"]

    /// The first of `unknownFields`, with the known name it is probably a typo of.
    public struct UnknownField: Sendable, Equatable {
        /// The field's path, e.g. `dependecies` or `exports[0].signatur`.
        public var path: String
        /// The known field of the same object it is closest to (`Spelling`), if any.
        public var suggestion: String?
        /// "unknown field "dependecies" (did you mean "dependencies"?)".
        public var problem: String {
            "unknown field \"\(path)\"" + (suggestion.map { " (did you mean \"\($0)\"?)" } ?? "")
        }
        /// What to change in `source` (the plugin.json), in words.
        public func fix(in source: String) -> String {
            let name = path.split(separator: ".").last.map(String.init) ?? path
            if let suggestion { return "rename \"\(name)\" to \"\(suggestion)\" in \(source)" }
            return "remove \"\(name)\" from \(source); its object's fields are \(Self.known(for: path).joined(separator: ", "))"
        }

        static func known(for path: String) -> [String] {
            path.hasPrefix("toolchain.") ? Manifest.toolchainFieldNames
                : path.hasPrefix("exports[") ? Manifest.exportFieldNames : Manifest.fieldNames
        }

        init(path: String) {
            self.path = path
            let name = path.split(separator: ".").last.map(String.init) ?? path
            suggestion = Spelling.suggestion(for: name, among: Self.known(for: path))
        }
    }

    /// The first unknown field, nil when every field is known.
    public var unknownField: UnknownField? { unknownFields.first.map(UnknownField.init(path:)) }

    public enum Language: String, Codable, Sendable { case swift, c }

    /// What a Swift plugin was built with and against: the host runs it when the ModuleKit
    /// majors are equal, the plugin's minor is at most the host's and the compilers share
    /// major.minor (docs/abi.md, "Swift plugin compatibility").
    public struct Toolchain: Codable, Sendable, Equatable {
        /// `swiftc --version`'s first line, e.g. "Swift version 6.3.1 (swift-6.3.1-RELEASE)".
        public var swift: String
        /// "MAJOR.MINOR": the ModuleKit ABI version of the SDK the plugin was built against.
        public var moduleKit: String
        public init(swift: String, moduleKit: String) {
            self.swift = swift
            self.moduleKit = moduleKit
        }

        /// `moduleKit` as (major, minor), nil when it is not "MAJOR.MINOR".
        public var moduleKitVersion: (major: Int, minor: Int)? { Manifest.majorMinor(moduleKit) }

        /// The compiler's "MAJOR.MINOR" from `swift`, nil when it names none.
        public var compilerVersion: String? { Self.compilerVersion(of: swift) }

        /// "MAJOR.MINOR" of the first "Swift version X.Y" in a compiler's version text
        /// ("Swift version 6.3.1 (swift-6.3.1-RELEASE)" and "Swift version 6.3-dev" give
        /// "6.3"), nil when there is none.
        public static func compilerVersion(of text: String) -> String? {
            let bytes = Array(text.utf8), marker = Array("Swift version ".utf8)
            guard bytes.count >= marker.count,
                  let start = (0...(bytes.count - marker.count)).first(where: { bytes[$0..<($0 + marker.count)].elementsEqual(marker) })
            else { return nil }
            let isDigit = { (byte: UInt8) in byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }
            let rest = bytes[(start + marker.count)...]
            let major = rest.prefix(while: isDigit)
            guard (1...4).contains(major.count), rest.dropFirst(major.count).first == UInt8(ascii: ".") else { return nil }
            let minor = rest.dropFirst(major.count + 1).prefix(while: isDigit)
            guard (1...4).contains(minor.count), let majorValue = Int(String(decoding: major, as: UTF8.self)),
                  let minorValue = Int(String(decoding: minor, as: UTF8.self)) else { return nil }
            return "\(majorValue).\(minorValue)"
        }
    }

    /// A function callable by name: its symbol and its signature in the grammar of
    /// docs/abi.md, e.g. `i32(i32,i32)`.
    public struct Export: Codable, Sendable, Equatable {
        public var name: String
        public var signature: String
        public init(name: String, signature: String) {
            self.name = name
            self.signature = signature
        }
    }

    public init(
        name: String, version: String, description: String = "", abi: String, language: Language,
        toolchain: Toolchain? = nil, dependencies: [String] = [], order: Int = 0, modules: [String],
        exports: [Export] = [], isolation: String? = nil
    ) {
        self.name = name
        self.version = version
        self.description = description
        self.abi = abi
        self.language = language
        self.toolchain = toolchain
        self.dependencies = dependencies
        self.order = order
        self.modules = modules
        self.exports = exports
        self.isolation = isolation
    }

    enum CodingKeys: String, CodingKey, CaseIterable {
        case name, version, description, abi, language, toolchain, dependencies, order, modules, exports, isolation
    }

    /// The values `isolation` may take.
    public static let isolationValues = ["in-process", "process"]

    /// The ABI version as (major, minor), or nil when `abi` is not "MAJOR.MINOR".
    public var abiVersion: (major: Int, minor: Int)? { Self.majorMinor(abi) }

    /// "MAJOR.MINOR" as two integers, nil for any other text.
    static func majorMinor(_ text: String) -> (major: Int, minor: Int)? {
        // The usual form, digits.digits (at most 18 each, so no overflow), read directly:
        // the general path below costs a few thousand instructions, and every plugin file
        // is checked on every scan.
        var parts = (0, 0), digits = 0, dot = false
        for byte in text.utf8 {
            if byte == UInt8(ascii: "."), !dot, digits > 0 {
                (dot, digits) = (true, 0)
            } else if byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9"), digits < 18 {
                digits += 1
                if dot { parts.1 = parts.1 * 10 + Int(byte - UInt8(ascii: "0")) } else { parts.0 = parts.0 * 10 + Int(byte - UInt8(ascii: "0")) }
            } else {
                return majorMinorWithSigns(text)
            }
        }
        return dot && digits > 0 ? parts : majorMinorWithSigns(text)
    }

    /// `majorMinor` for any other text: each part is what `Int(_:)` reads (a sign allowed).
    private static func majorMinorWithSigns(_ text: String) -> (major: Int, minor: Int)? {
        // Only ASCII can be digits and dots; on ASCII, bytes and characters are the same.
        let dot = UInt8(ascii: ".")
        guard text.utf8.allSatisfy({ $0 < 0x80 }), let split = text.utf8.firstIndex(of: dot), let major = Int(text[..<split])
        else { return nil }
        let rest = text[text.utf8.index(after: split)...]
        guard !rest.utf8.contains(dot), let minor = Int(rest) else { return nil }
        return (major, minor)
    }

    /// Parses manifest JSON (with `JSONValue.parse`'s strict rules), naming the field that
    /// is wrong when it fails.
    public static func parse(_ bytes: [UInt8]) throws(ManifestError) -> Manifest {
        let document: JSONValue.TopLevel
        do {
            document = try JSONValue.parseKeepingMembers(bytes)
        } catch {
            throw ManifestError(reason: error.description)
        }
        switch document {
        case .members(let keys, let values):
            let manifest = try Manifest(FieldReader(keys: keys, values: values, path: ""))
            try manifest.check()
            return manifest
        case .other(let value):
            return try Manifest(json: value)
        }
    }

    /// Reads a manifest from a parsed document, with the same checks as `parse`; unknown
    /// fields are listed in `unknownFields`, not refused here.
    public init(json: JSONValue) throws(ManifestError) {
        guard case .object(let fields) = json else {
            throw ManifestError(reason: "the top level is \(json.kind), expected an object")
        }
        try self.init(FieldReader(fields: fields, path: ""))
        try check()
    }

    /// The checks across fields, once every field has been read.
    private func check() throws(ManifestError) {
        if let problem = VersionText.problem(version) {
            throw ManifestError(reason: "field \"version\" is \(problem)")
        }
        if abiVersion == nil {
            throw ManifestError(reason: "field \"abi\" is \"\(abi)\", expected \"MAJOR.MINOR\" such as \"1.0\"")
        }
        if modules.isEmpty && exports.isEmpty {
            throw ManifestError(reason: "lists no modules and no exports; a plugin must provide at least one")
        }
        if let module = NameClaims.repeatedName(modules) {
            throw ManifestError(reason: "field \"modules\": \(NameConflict(.listedTwice(module: module)).problem)")
        }
        if language == .swift && toolchain == nil {
            throw ManifestError(reason: "a Swift plugin needs field \"toolchain\" (plugin.mk adds it)")
        }
        if let toolchain {
            if toolchain.moduleKitVersion == nil {
                throw ManifestError(reason: "field \"toolchain.moduleKit\" is \"\(toolchain.moduleKit)\", expected \"MAJOR.MINOR\" such as \"1.0\"")
            }
            if toolchain.compilerVersion == nil {
                throw ManifestError(reason: "field \"toolchain.swift\" is \"\(toolchain.swift)\", which names no \"Swift version MAJOR.MINOR\"")
            }
        }
    }

    private init(_ reader: FieldReader) throws(ManifestError) {
        name = try reader.name("name")
        version = try reader.string("version")
        description = try reader.string("description", default: "")
        abi = try reader.string("abi")
        let languageName = try reader.string("language")
        guard let language = Language(rawValue: languageName) else {
            throw ManifestError(reason: "field \"language\" is \"\(languageName)\", expected \"swift\" or \"c\"")
        }
        self.language = language
        if let toolchainFields = try reader.object("toolchain") {
            let inner = FieldReader(fields: toolchainFields, path: "toolchain.")
            toolchain = Toolchain(swift: try inner.string("swift"), moduleKit: try inner.string("moduleKit"))
            unknownFields += inner.unknown(among: Self.toolchainFieldNames)
        } else {
            toolchain = nil
        }
        dependencies = try reader.names("dependencies", default: [])
        order = try reader.integer("order", in: Self.orderRange, default: 0)
        modules = try reader.names("modules")
        var exportUnknowns: [String] = []
        exports = try reader.objects("exports").enumerated().map { (index, fields) throws(ManifestError) in
            let inner = FieldReader(fields: fields, path: "exports[\(index)].")
            exportUnknowns += inner.unknown(among: Self.exportFieldNames)
            return Export(name: try inner.string("name"), signature: try inner.string("signature"))
        }
        if reader.field("isolation") != nil {
            let value = try reader.string("isolation")
            guard Self.isolationValues.contains(value) else {
                throw ManifestError(reason: "field \"isolation\" is \"\(value)\", expected \"process\" or \"in-process\"")
            }
            isolation = value
        } else {
            isolation = nil
        }
        unknownFields = reader.unknown(among: Self.fieldNames) + unknownFields + exportUnknowns
    }

    public init(from decoder: any Decoder) throws {
        // The rules of `init(json:)`, for manifests embedded in other JSON documents.
        self = try Manifest(json: try decoder.singleValueContainer().decode(JSONValue.self))
    }

    /// The manifest embedded in the plugin file at `path`, nil when there is none or it
    /// cannot be read: what a refused file's report shows of it. Reads only the file's
    /// headers and manifest section, never runs code.
    public static func embedded(in path: String) -> Manifest? {
        (try? ELFImage(path: path)).flatMap { try? $0.manifestContents() }.flatMap { try? Manifest.parse($0) }
    }

    /// Pretty JSON with sorted keys (`JSONValue.prettyJSONText`), as `plugin.mk` embeds it
    /// and `inspect` prints it.
    public func jsonText() -> String {
        // A manifest holds strings, integers within `orderRange` and arrays: it always encodes.
        (try? JSONValue(encoding: self))?.prettyJSONText ?? "{}"
    }
}

/// Why a manifest could not be read.
public struct ManifestError: Error, Sendable, Equatable, CustomStringConvertible {
    public var reason: String
    public init(reason: String) { self.reason = reason }

    public var description: String { reason }
}

/// Reads typed fields of a JSON object, with errors that name the field.
struct FieldReader {
    /// The object's member names and values, in the same order. A few names are looked up
    /// once each, so a linear search beats hashing every name into a dictionary.
    let keys: [String]
    let values: [JSONValue]
    let path: String
    /// Whether `keys` are in document order (false when made from a dictionary).
    let isOrdered: Bool

    init(keys: [String], values: [JSONValue], path: String, isOrdered: Bool = true) {
        self.keys = keys
        self.values = values
        self.path = path
        self.isOrdered = isOrdered
    }

    init(fields: [String: JSONValue], path: String) {
        self.init(keys: Array(fields.keys), values: Array(fields.values), path: path, isOrdered: false)
    }

    /// The value of member `key`, nil when there is none (names are unique: the parser
    /// refuses duplicates).
    func field(_ key: String) -> JSONValue? {
        guard let index = keys.firstIndex(of: key) else { return nil }
        return values[index]
    }

    /// The paths of the members not named in `known`, in the reader's order (sorted when the
    /// reader was made from a dictionary).
    func unknown(among known: [String]) -> [String] {
        let names = keys.filter { !known.contains($0) }
        return (isOrdered ? names : names.sorted()).map { path + $0 }
    }

    /// A required field is missing; when a member's name is a typo of it, that is said too.
    func missing(_ key: String) -> ManifestError {
        let typo = keys.first { $0 != key && Spelling.suggestion(for: $0, among: [key]) != nil }
            .map { "; unknown field \"\(path)\($0)\" (did you mean \"\(key)\"?)" } ?? ""
        return ManifestError(reason: "required field \"\(path)\(key)\" is missing\(typo)")
    }
    func wrong(_ key: String, _ value: JSONValue, _ expected: String) -> ManifestError {
        ManifestError(reason: "field \"\(path)\(key)\" has the wrong type: \(value.kind), expected \(expected)")
    }

    func string(_ key: String, default fallback: String? = nil) throws(ManifestError) -> String {
        guard let value = field(key) else {
            if let fallback { return fallback }
            throw missing(key)
        }
        guard case .string(let text) = value else { throw wrong(key, value, "a string") }
        return text
    }

    func integer(_ key: String, in range: ClosedRange<Int>, default fallback: Int) throws(ManifestError) -> Int {
        guard let value = field(key) else { return fallback }
        guard case .number(let number) = value, number == number.rounded() else { throw wrong(key, value, "an integer") }
        guard let integer = CheckedNumber.integer(number, in: range) else {
            throw ManifestError(reason: "field \"\(path)\(key)\" is \(number), not an integer \(CheckedNumber.describe(range))")
        }
        return integer
    }

    /// A string that follows the name grammar (`PluginName`).
    func name(_ key: String) throws(ManifestError) -> String {
        let text = try string(key)
        if let problem = PluginName.problem(text) { throw ManifestError(reason: "field \"\(path)\(key)\" is \(problem)") }
        return text
    }

    /// An array of names.
    func names(_ key: String, default fallback: [String]? = nil) throws(ManifestError) -> [String] {
        let list = try strings(key, default: fallback)
        for (index, text) in list.enumerated() {
            if let problem = PluginName.problem(text) { throw ManifestError(reason: "field \"\(path)\(key)[\(index)]\" is \(problem)") }
        }
        return list
    }

    func strings(_ key: String, default fallback: [String]? = nil) throws(ManifestError) -> [String] {
        guard let value = field(key) else {
            if let fallback { return fallback }
            throw missing(key)
        }
        guard case .array(let elements) = value else { throw wrong(key, value, "an array of strings") }
        var result: [String] = []
        for (index, element) in elements.enumerated() {
            guard case .string(let text) = element else { throw wrong("\(key)[\(index)]", element, "a string") }
            result.append(text)
        }
        return result
    }

    func object(_ key: String) throws(ManifestError) -> [String: JSONValue]? {
        guard let value = field(key) else { return nil }
        guard case .object(let members) = value else { throw wrong(key, value, "an object") }
        return members
    }

    func objects(_ key: String) throws(ManifestError) -> [[String: JSONValue]] {
        guard let value = field(key) else { return [] }
        guard case .array(let elements) = value else { throw wrong(key, value, "an array of objects") }
        var result: [[String: JSONValue]] = []
        for (index, element) in elements.enumerated() {
            guard case .object(let members) = element else { throw wrong("\(key)[\(index)]", element, "an object") }
            result.append(members)
        }
        return result
    }
}
