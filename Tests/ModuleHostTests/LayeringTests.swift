import Foundation
import Testing
import TestSupport

/// The targets are layers, and each depends only on those below it (README, "Layout"): the
/// imports in `Sources/` and the dependency lists in Package.swift say the same thing.
@Suite(.timeLimit(.minutes(5)))
struct LayeringTests {
    /// What each layer may use, bottom to top; the system's modules (Glibc, Foundation,
    /// Dispatch, Synchronization) are always allowed. ModuleKit, the SDK, is the lowest layer
    /// of the host side, and DaemonKit (OS plumbing) knows nothing of plugins or of ModuleKit.
    static let allowed: [(target: String, uses: Set<String>)] = [
        ("DaemonKit", ["CForkGuard"]),
        ("PluginFormat", ["ModuleKit"]),
        ("PluginCall", ["ModuleKit", "PluginFormat", "CFFI", "CSymbolOwnership"]),
        ("ModuleHost", ["ModuleKit", "PluginFormat", "PluginCall", "DaemonKit", "CDynamicLoader"]),
        ("ControlProtocol", ["ModuleKit", "PluginFormat", "PluginCall", "DaemonKit", "ModuleHost"]),
        ("DaemonShell", ["ModuleKit", "PluginFormat", "PluginCall", "DaemonKit", "ModuleHost", "ControlProtocol"]),
        ("CommandLineTools", ["ModuleKit", "PluginFormat", "PluginCall", "DaemonKit", "ModuleHost", "ControlProtocol",
                              "DaemonShell"]),
        ("modhostd", ["CommandLineTools", "ModuleHost"]),
        ("modhostctl", ["CommandLineTools"]),
        ("modhost-worker", ["ModuleHost"]),
    ]

    /// The modules of this package and its SDK; any other import is the system's.
    static var projectModules: Set<String> {
        Set(PackageManifest.targets.keys).union(["ModuleKit"])
    }

    @Test func eachLayerImportsOnlyTheLayersBelowIt() throws {
        for (target, uses) in Self.allowed {
            let imports = try SourceImports.of(target: target)
            for (module, files) in imports.sorted(by: { $0.key < $1.key }) where Self.projectModules.contains(module) {
                #expect(uses.contains(module), "\(target) imports \(module) (\(files.sorted().joined(separator: ", "))), which is not below it")
            }
        }
    }

    @Test func packageSwiftDeclaresWhatEachLayerImportsAndNothingElse() throws {
        for (target, _) in Self.allowed {
            let declared = try #require(PackageManifest.targets[target], "Package.swift declares no target \(target)")
            let imported = Set(try SourceImports.of(target: target).keys).intersection(Self.projectModules)
            #expect(declared.subtracting(imported).isEmpty,
                    "\(target) declares \(declared.subtracting(imported).sorted()) in Package.swift and imports none of them")
            #expect(imported.subtracting(declared).isEmpty,
                    "\(target) imports \(imported.subtracting(declared).sorted()) without declaring it in Package.swift")
        }
    }

    /// Every Swift target in Sources/ has a place in the layers (or is a tool, a test helper
    /// or the SDK), so a new folder cannot slip in beside them unplaced.
    @Test func everySourceFolderIsPlaced() throws {
        let placed = Set(Self.allowed.map(\.target))
            .union(["ModuleKit", "TestSupport", "modhost-bench", "modhost-trial", "CFFI", "CDynamicLoader", "CSymbolOwnership", "CForkGuard"])
        let folders = try FileManager.default.contentsOfDirectory(atPath: BuildProducts.packageRoot + "/Sources")
        #expect(Set(folders).subtracting(placed).sorted() == [])
    }
}

/// The project modules each file of `Sources/<target>` imports.
enum SourceImports {
    /// Module name to the files importing it. `import X`, with any attributes before it
    /// (`@testable`, `@_spi(...)`, `@preconcurrency`), and submodule imports by their module.
    static func of(target: String) throws -> [String: Set<String>] {
        let directory = BuildProducts.packageRoot + "/Sources/" + target
        guard let walker = FileManager.default.enumerator(atPath: directory) else {
            throw CocoaError(.fileNoSuchFile, userInfo: [NSFilePathErrorKey: directory])
        }
        let pattern = try Regex(#"^\s*(?:@[\w]+(?:\([^)]*\))?\s+)*import\s+(?:(?:struct|class|enum|protocol|func|var|let|typealias)\s+)?(\w+)"#)
        var imports: [String: Set<String>] = [:]
        for case let file as String in walker where file.hasSuffix(".swift") {
            let text = try String(contentsOfFile: directory + "/" + file, encoding: .utf8)
            for line in text.split(separator: "\n") {
                guard let match = line.firstMatch(of: pattern), let module = match.output[1].substring else { continue }
                imports[String(module), default: []].insert(file)
            }
        }
        #expect(!imports.isEmpty, "no imports found in \(directory)")
        return imports
    }
}

/// Package.swift's targets and their dependencies, read from the text: the names in each
/// target's `dependencies:` list, a product by its name.
enum PackageManifest {
    static let targets: [String: Set<String>] = {
        let text = (try? String(contentsOfFile: BuildProducts.packageRoot + "/Package.swift", encoding: .utf8)) ?? ""
        var targets: [String: Set<String>] = [:]
        let declaration = #/\.(?:target|executableTarget|testTarget|systemLibrary)\(/#
        let name = #/name:\s*"([^"]+)"/#
        let dependencies = #/dependencies:\s*\[([^\]]*)\]/#
        let product = #/\.product\(name:\s*"([^"]+)",\s*package:\s*"[^"]+"\)/#
        let quoted = #/"([^"]+)"/#
        let starts = text.ranges(of: declaration).map(\.lowerBound)
        for (index, start) in starts.enumerated() {
            let end = index + 1 < starts.count ? starts[index + 1] : text.endIndex
            let chunk = text[start..<end]
            guard let targetName = chunk.firstMatch(of: name)?.output.1 else { continue }
            var uses: Set<String> = []
            if let list = chunk.firstMatch(of: dependencies)?.output.1 {
                let plain = list.replacing(product) { "\"\($0.output.1)\"" }
                for match in plain.matches(of: quoted) { uses.insert(String(match.output.1)) }
            }
            targets[String(targetName)] = uses
        }
        return targets
    }()
}
