import Foundation
import Glibc
import Testing
import TestSupport

/// docs/embedding.md's service, taken from the document itself: its Package.swift and
/// main.swift are written into a package of their own that depends on this checkout by
/// path (as the document says), built with `swift build` (and `--product modhost-trial`),
/// and run on the example plugins of build/plugins. The package lives in
/// build/embedding/my-service, so its build cache is reused from one run to the next (a
/// first build compiles the checkout's library targets once more: about a minute on two
/// cores).
@Suite("docs/embedding.md: a service of its own, built against this checkout", .timeLimit(.minutes(10)), .serialized)
struct EmbeddingTests {
    /// The document's package, written where it is built; files are rewritten only when
    /// they changed, so that an unchanged package is not rebuilt.
    func writeServicePackage() throws -> String {
        let blocks = try MarkdownBlock.blocks(of: "docs/embedding.md").filter { $0.language == "swift" }
        let manifest = try #require(blocks.first { $0.body.contains("import PackageDescription") }).body
        let main = try #require(blocks.first { $0.body.contains("PluginSet(") }).body
        // The document's checkout lives in `/path/to/modulehost`; SwiftPM names a path
        // dependency by its last path component.
        let checkout = BuildProducts.packageRoot
        #expect(manifest.contains("\"/path/to/modulehost\"") && manifest.contains("package: \"modulehost\""))
        let package = manifest
            .replacingOccurrences(of: "/path/to/modulehost", with: checkout)
            .replacingOccurrences(of: "package: \"modulehost\"", with: "package: \"\((checkout as NSString).lastPathComponent)\"")
        let directory = BuildProducts.directory + "/embedding/my-service"
        try FileManager.default.createDirectory(atPath: directory + "/Sources/my-service", withIntermediateDirectories: true)
        for (path, text) in [("Package.swift", package), ("Sources/my-service/main.swift", main)] {
            let file = directory + "/" + path
            if (try? String(contentsOfFile: file, encoding: .utf8)) != text {
                try text.write(toFile: file, atomically: true, encoding: .utf8)
            }
        }
        return directory
    }

    /// Builds `Plugins/Calculator` as version `version` (manifest and module), with the
    /// plugin.mk of build/; returns the built file.
    func calculator(version: String, in scratch: TemporaryDirectory) throws -> String {
        let source = scratch.directory("calculator-\(version)")
        for name in ["Makefile", "calculator.c", "plugin.json"] {
            let text = try String(contentsOfFile: BuildProducts.packageRoot + "/Plugins/Calculator/" + name, encoding: .utf8)
            try text.replacingOccurrences(of: "\"1.0.0\"", with: "\"\(version)\"")
                .write(toFile: source + "/" + name, atomically: true, encoding: .utf8)
        }
        try shell("make -s MODHOST_SDK='\(BuildProducts.directory)' PLUGIN_DIR=out", directory: source)
        return source + "/out/libCalculator.so"
    }

    /// `swift build`, then `swift build --product modhost-trial`, as the document says. A
    /// cached build plan names the checkout's sources of the previous run, and SwiftPM does
    /// not plan again when one of them was deleted since ("missing inputs"): then the
    /// package's build directory is removed and it is built once more, from scratch.
    func build(_ package: String) throws {
        func attempt() throws -> String? {
            for arguments in [["build"], ["build", "--product", "modhost-trial"]] {
                let build = try run("/usr/bin/env", ["swift"] + arguments + ["--package-path", package])
                if build.status != 0 {
                    return "swift \(arguments.joined(separator: " ")) failed:\n\(build.standardOutput)\(build.standardError)"
                }
            }
            return nil
        }
        guard let failure = try attempt() else { return }
        try FileManager.default.removeItem(atPath: package + "/.build")
        let again = try attempt()
        try #require(again == nil, "\(again ?? ""), and before the build directory was removed: \(failure)")
    }

    @Test(.timeLimit(.minutes(10)))
    func theDocumentsServiceLoadsUsesAndFollowsAPluginDirectory() async throws {
        let package = try writeServicePackage()
        try build(package)
        let service = package + "/.build/debug/my-service"
        #expect(FileManager.default.isExecutableFile(atPath: package + "/.build/debug/modhost-trial"))

        let scratch = TemporaryDirectory("embedding")
        let plugins = scratch.directory("plugins")
        for name in ["Counter", "Calculator", "Greeting", "Welcome"] {
            try FileManager.default.copyItem(atPath: BuildProducts.plugin(name), toPath: plugins + "/lib\(name).so")
        }
        let replacement = try calculator(version: "1.1.0", in: scratch)

        let process = try RunningProcess(service, [plugins, scratch.file("state")])
        #expect(await process.waitFor("my-service: following \(plugins)"), "\(process.text)")
        var log = process.text
        // C plugins and Swift plugins (built against build/, run against the service's own
        // ModuleKit), each module reached by name.
        for (plugin, module) in [("Counter", "counter"), ("Calculator", "calculator"), ("Greeting", "greeting"), ("Welcome", "welcome")] {
            #expect(log.contains("my-service: loaded \(plugin) 1.0.0 (generation 1)"), "\(log)")
            #expect(log.contains("my-service: module \(module) 1.0.0 is running"), "\(log)")
        }
        // One ModuleKit in the process: Welcome found Greeting's Greeter by casting.
        #expect(log.contains("Hello, operator! (via greeting)"), "\(log)")
        // The notification reached Counter; the call by name reached Calculator.
        #expect(log.contains(#"event tick #3 payload {"from":"my-service"} instance=my-service module=counter"#), "\(log)")
        #expect(log.contains("my-service: calc_add(40, 2) = 42"), "\(log)")
        #expect(!log.contains("refused"), "\(log)")

        // A new version deployed as the document says (temporary name, then rename): the
        // watcher reports it, the trial loader (next to the service) accepts it, the new
        // image runs.
        let temporary = plugins + "/.libCalculator.so.tmp"
        try FileManager.default.copyItem(atPath: replacement, toPath: temporary)
        #expect(rename(temporary, plugins + "/libCalculator.so") == 0)
        #expect(await process.waitFor("my-service: replaced Calculator 1.1.0 (generation 2)"), "\(process.text)")
        #expect(process.text.contains("plugins: replaced plugin Calculator 1.0.0 by 1.1.0 (generation 2)"), "\(process.text)")
        #expect(await process.waitFor(#"event tick #4 payload {"from":"my-service"}"#), "\(process.text)")
        // The service calls calc_add right after the notification: wait for that line too.
        for _ in 0..<600 where process.text.components(separatedBy: "my-service: calc_add(40, 2) = 42").count < 3 {
            try await Task.sleep(for: .milliseconds(50))
        }
        log = process.text
        #expect(log.contains("my-service: module calculator 1.1.0 is running"), "\(log)")
        #expect(log.components(separatedBy: "my-service: calc_add(40, 2) = 42").count == 3, "\(log)")
        #expect(!log.contains("refused"), "\(log)")

        process.send(SIGTERM)
        #expect(await process.wait() == 0, "\(process.text)")
        log = process.text
        #expect(log.contains("my-service: SIGTERM: stopping"), "\(log)")
        #expect(log.contains("event deinit #6 payload none instance=my-service module=counter"), "\(log)")
        #expect(log.contains("my-service: stopped"), "\(log)")
    }
}
