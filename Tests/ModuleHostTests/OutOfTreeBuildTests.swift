import Foundation
@testable import ModuleHost
import ModuleKit
import Testing
import TestSupport

/// The README's "write your first plugin", taken from the README itself, built out of
/// tree with the shipped plugin.mk and loaded: the docs a newcomer follows must work.
@Suite struct OutOfTreeBuildTests {
    func buildFromReadme(language: String) throws -> (TemporaryDirectory, String) {
        let blocks = try MarkdownBlock.blocks(of: "README.md")
        let manifest = try #require(blocks.first { $0.language == "json" }).body
        let makefile = try #require(blocks.first { $0.language == "make" }).body
            .replacingOccurrences(of: "/path/to/modulehost/build", with: BuildProducts.directory)
        let source = try #require(blocks.first { $0.language == language }).body
        let dir = TemporaryDirectory("first-plugin")
        try dir.write("plugin.json", text: manifest)
        try dir.write("Makefile", text: makefile)
        try dir.write(language == "c" ? "hello.c" : "Hello.swift", text: source)
        try shell("make", directory: dir.path)
        return (dir, dir.path + "/build/libHello.so")
    }

    @Test(arguments: ["c", "swift"])
    func theReadmePluginBuildsAndLoads(language: String) async throws {
        let (dir, path) = try buildFromReadme(language: language)
        let file = try Validator().validate(path)
        #expect(file.manifest.name == "Hello")
        #expect(file.manifest.language.rawValue == language)
        #expect(file.dynamic.soname == "libHello.so")
        if language == "swift" {
            #expect(file.manifest.toolchain?.moduleKit == HostSDK.current.moduleKit)
        }
        // Both variants are called Hello: check the loadable one in a separate process.
        let verify = try run(BuildProducts.modhostctl, ["verify", path])
        #expect(verify.status == 0, "\(verify.standardOutput)")
        let daemon = try RunningProcess(BuildProducts.modhostd, ["--plugins", dir.path + "/build", "--state-dir", dir.file("state"),
                                                                 "--socket", dir.file("sock")])
        #expect(await daemon.waitFor("started 1 modules: hello"))
        daemon.send(SIGTERM)
        #expect(await daemon.wait() == 0)
        let startLine = daemon.text.split(separator: "\n").first { $0.contains(language == "c" ? ": start " : "hello: start") }
        #expect(startLine?.contains("module=hello") == true, "\(daemon.text)")
    }
}
