import PluginCall
import PluginFormat
import Testing

@Suite("Declared exports resolve in the plugin's own file", .timeLimit(.minutes(5)))
struct SymbolOwnershipTests {
    @Test("a symbol only a dependency provides is refused, naming plugin, function and library")
    func fromDependency() throws {
        let fixtures = try Fixtures.get()
        let b = fixtures.dependent
        // dlsym on B's handle does find shared_f: in A, which B depends on.
        _ = try b.address("shared_f")
        do {
            _ = try SymbolOwnership.resolve("shared_f", plugin: "calltest_b", handle: b.handle, pluginPath: b.path)
            Issue.record("a dependency's symbol was accepted")
        } catch {
            guard case .symbolFromDependency(let plugin, let function, let library, let pluginPath) = error else {
                Issue.record("unexpected error \(error)")
                return
            }
            #expect(plugin == "calltest_b")
            #expect(function == "shared_f")
            #expect(library.hasSuffix("libcalltest_a.so"))
            #expect(pluginPath == b.path)
            #expect(error.description.contains("calltest_b") && error.description.contains("libcalltest_a.so"))
        }
        // The plugin's own symbol passes and is callable; the dependency's own handle
        // accepts the same symbol as its own.
        let table = try FunctionTable(
            pluginName: "calltest_b", exports: [Manifest.Export(name: "b_own", signature: "i32(i32)")],
            handle: b.handle, pluginPath: b.path)
        #expect(try table.call("b_own", [.int32(4)]) == .int32(50))
        let a = fixtures.dependencyA
        _ = try SymbolOwnership.resolve("shared_f", plugin: "calltest_a", handle: a.handle, pluginPath: a.path)
        // A whole manifest with one such export makes no table.
        #expect(throws: ExportError.self) {
            try FunctionTable(
                pluginName: "calltest_b",
                exports: [
                    Manifest.Export(name: "b_own", signature: "i32(i32)"),
                    Manifest.Export(name: "shared_f", signature: "i32(i32)"),
                ],
                handle: b.handle, pluginPath: b.path)
        }
    }

    @Test("a declared symbol that does not exist is refused with dlerror's text")
    func missing() throws {
        let c = try Fixtures.get().c
        do {
            _ = try SymbolOwnership.resolve("c_nowhere", plugin: "calltest_c", handle: c.handle, pluginPath: c.path)
            Issue.record("missing symbol accepted")
        } catch {
            guard case .missingSymbol(_, let function, let message) = error else {
                Issue.record("unexpected error \(error)")
                return
            }
            #expect(function == "c_nowhere")
            #expect(message.contains("c_nowhere"))
        }
    }

    @Test("malformed signatures, bad names and duplicates are refused before any lookup")
    func manifestChecks() throws {
        let bad = [Manifest.Export(name: "f", signature: "i32(i32,,i32)")]
        do {
            _ = try SymbolOwnership.parseExports(bad, plugin: "p")
            Issue.record("malformed signature accepted")
        } catch {
            #expect(error.description.hasPrefix("plugin p: export f: invalid signature \"i32(i32,,i32)\" at offset 8"))
        }
        #expect(throws: ExportError.invalidName(plugin: "p", function: "1f")) {
            try SymbolOwnership.parseExports([Manifest.Export(name: "1f", signature: "void()")], plugin: "p")
        }
        #expect(throws: ExportError.invalidName(plugin: "p", function: "a-b")) {
            try SymbolOwnership.parseExports([Manifest.Export(name: "a-b", signature: "void()")], plugin: "p")
        }
        #expect(throws: ExportError.duplicate(plugin: "p", function: "f")) {
            try SymbolOwnership.parseExports(
                [Manifest.Export(name: "f", signature: "void()"), Manifest.Export(name: "f", signature: "i32()")],
                plugin: "p")
        }
        let parsed = try SymbolOwnership.parseExports(
            [Manifest.Export(name: "_ok1", signature: "void()"), Manifest.Export(name: "g", signature: "str(buf)")],
            plugin: "p")
        #expect(parsed.map(\.name) == ["_ok1", "g"])
        #expect(parsed[1].signature.argumentTypes == [.buf])
    }
}
