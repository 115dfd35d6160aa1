import Foundation

/// A plugin's manifest: what the host knows about a plugin file before running any of its
/// code. It is JSON, embedded by `plugin.mk` in the ELF section `.modhost.manifest`
/// (see docs/abi.md), so `modhostctl inspect` and validation read it without `dlopen`.
public struct Manifest: Codable, Sendable, Equatable {
    /// The plugin's name: unique among loaded plugins, used by dependencies.
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
    public var order: Int
    /// Names of the modules the entry symbol will describe, in order.
    public var modules: [String]
    /// Functions exported for calling by name, with their signatures.
    public var exports: [Export]

    public enum Language: String, Codable, Sendable { case swift, c }

    /// The build fingerprint of a Swift plugin.
    public struct Toolchain: Codable, Sendable, Equatable {
        /// `swiftc --version`'s first line, for people.
        public var swift: String
        /// GNU build id (hex) of the libModuleKit.so the plugin was linked against.
        public var sdk: String
        public init(swift: String, sdk: String) {
            self.swift = swift
            self.sdk = sdk
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
        exports: [Export] = []
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
    }

    enum CodingKeys: String, CodingKey {
        case name, version, description, abi, language, toolchain, dependencies, order, modules, exports
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        name = try c.decode(String.self, forKey: .name)
        version = try c.decode(String.self, forKey: .version)
        description = try c.decodeIfPresent(String.self, forKey: .description) ?? ""
        abi = try c.decode(String.self, forKey: .abi)
        language = try c.decode(Language.self, forKey: .language)
        toolchain = try c.decodeIfPresent(Toolchain.self, forKey: .toolchain)
        dependencies = try c.decodeIfPresent([String].self, forKey: .dependencies) ?? []
        order = try c.decodeIfPresent(Int.self, forKey: .order) ?? 0
        modules = try c.decode([String].self, forKey: .modules)
        exports = try c.decodeIfPresent([Export].self, forKey: .exports) ?? []
    }

    /// The ABI version as (major, minor), or nil when `abi` is not "MAJOR.MINOR".
    public var abiVersion: (major: Int, minor: Int)? {
        let parts = abi.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 2, let major = Int(parts[0]), let minor = Int(parts[1]) else { return nil }
        return (major, minor)
    }

    /// Parses manifest JSON, naming the field that is wrong when it fails.
    public static func parse(_ bytes: [UInt8]) throws(ManifestError) -> Manifest {
        let manifest: Manifest
        do {
            manifest = try JSONDecoder().decode(Manifest.self, from: Data(bytes))
        } catch let error as DecodingError {
            throw ManifestError(describing: error)
        } catch {
            throw ManifestError(reason: "not valid JSON (\(error))")
        }
        if manifest.name.isEmpty { throw ManifestError(reason: "field \"name\" is empty") }
        if manifest.abiVersion == nil {
            throw ManifestError(reason: "field \"abi\" is \"\(manifest.abi)\", expected \"MAJOR.MINOR\" such as \"1.0\"")
        }
        if manifest.modules.isEmpty && manifest.exports.isEmpty {
            throw ManifestError(reason: "lists no modules and no exports; a plugin must provide at least one")
        }
        if manifest.language == .swift && manifest.toolchain == nil {
            throw ManifestError(reason: "a Swift plugin needs field \"toolchain\" (plugin.mk adds it)")
        }
        return manifest
    }

    /// Pretty JSON with sorted keys, as `plugin.mk` embeds it and `inspect` prints it.
    public func jsonText() -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(self)) ?? Data(), as: UTF8.self)
    }
}

/// Why a manifest could not be read.
public struct ManifestError: Error, Sendable, Equatable, CustomStringConvertible {
    public var reason: String
    public init(reason: String) { self.reason = reason }

    init(describing error: DecodingError) {
        func path(_ context: DecodingError.Context) -> String {
            let keys = context.codingPath.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }
            return keys.isEmpty ? "the top level" : "field \"\(keys.joined(separator: "."))\""
        }
        switch error {
        case .keyNotFound(let key, let context):
            let parent = context.codingPath.isEmpty ? "" : " in \(path(context))"
            reason = "required field \"\(key.stringValue)\" is missing\(parent)"
        case .typeMismatch(let type, let context):
            reason = "\(path(context)) has the wrong type, expected \(type)"
        case .valueNotFound(let type, let context):
            reason = "\(path(context)) is null, expected \(type)"
        case .dataCorrupted(let context):
            reason = context.codingPath.isEmpty
                ? "not valid JSON" : "\(path(context)) is invalid: \(context.debugDescription)"
        @unknown default:
            reason = "\(error)"
        }
    }

    public var description: String { reason }
}
