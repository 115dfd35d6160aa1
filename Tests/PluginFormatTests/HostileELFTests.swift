import Foundation
@testable import PluginFormat
import Testing
import TestSupport

/// Offsets, sizes and counts read from a file are checked before any arithmetic: a hostile
/// value gives an `ELFError` naming the problem, never a trap.
@Suite(.timeLimit(.minutes(5))) struct HostileELFTests {
    static let dir = TemporaryDirectory("hostile-elf")
    /// One real C plugin with a manifest, a SONAME, a NEEDED entry and a build id.
    static let good: String = {
        let factory = PluginFactory(directory: dir.path)
        return try! factory.buildC("Hostile", source: PluginFactory.cSource(plugin: "Hostile", modules: ["hostile"]),
                                   manifest: PluginFactory.manifest(plugin: "Hostile", modules: ["hostile"]),
                                   flags: "-Wl,--build-id")
    }()

    /// Runs every reader of the image; each either answers or throws an ELFError.
    func readEverything(_ path: String) -> [ELFError] {
        var errors: [ELFError] = []
        func attempt(_ body: () throws -> Void) {
            do {
                try body()
            } catch let error as ELFError {
                errors.append(error)
            } catch {
                Issue.record("not an ELFError: \(error)")
            }
        }
        let image: ELFImage
        do {
            image = try ELFImage(path: path)
        } catch {
            return [error]
        }
        if let error = image.sectionError { errors.append(error) }
        attempt { _ = try image.manifestContents() }
        attempt { _ = try image.dynamicInfo() }
        attempt { _ = try image.definedDynamicSymbols(withPrefixes: ["$s9ModuleKit"]) }
        attempt { _ = try image.definedDynamicSymbols() }
        attempt { try Self.expectOnePassAgrees(image) }
        attempt { _ = try image.buildID() }
        attempt { _ = try DynamicStringPatch.patches(["libHostile.so": "libHostile.02", "libc.so.6": "libc.so.7"], image: image) }
        _ = image.loadSegmentPastEnd
        // What dlopen would follow out of the image: a problem the validator refuses.
        attempt { if let problem = try image.loaderAddressProblem() { throw ELFError.malformed(problem) } }
        return errors
    }

    /// The validator's one pass over `.dynsym` answers what `symbols(named:)` and
    /// `definedDynamicSymbols(withPrefixes:)` answer, and throws the latter's error.
    static func expectOnePassAgrees(_ image: ELFImage) throws {
        let names = ["modhost_plugin_entry_v1", "__cxa_finalize", "missing", "modhost_plugin_entry_v1"]
        let prefixes = ["modhost_", "__cxa", "$s9ModuleKit"]
        let pass: (facts: [ELFImage.SymbolFacts?], defined: [String])
        do {
            pass = try image.dynamicSymbols(named: ELFImage.SymbolNames(names), definedWithPrefixes: ELFImage.SymbolNames(prefixes))
        } catch {
            #expect(throws: error) { try image.definedDynamicSymbols(withPrefixes: prefixes) }
            throw error
        }
        #expect(pass.defined == (try image.definedDynamicSymbols(withPrefixes: prefixes)))
        let facts = try image.symbols(named: Set(names))
        #expect(pass.facts == names.map { facts[$0] })
    }

    @Test func theOnePassFindsTheEntryAndWhatThePluginDefines() throws {
        let image = try ELFImage(path: Self.good)
        let pass = try image.dynamicSymbols(named: ELFImage.SymbolNames(["modhost_plugin_entry_v1", "__cxa_finalize", "nothing"]),
                                            definedWithPrefixes: ELFImage.SymbolNames(["modhost_", "__cxa"]))
        #expect(pass.defined == ["modhost_plugin_entry_v1"])
        #expect(pass.facts[0]?.isExported == true && pass.facts[0]?.type == ELFImage.SymbolFacts.typeFunction)
        #expect(pass.facts[1]?.defined == false)
        #expect(pass.facts[2] == nil)
        try Self.expectOnePassAgrees(image)
    }

    @Test(arguments: ELFMutation.all)
    func aHostileValueIsAnErrorNotATrap(mutation: ELFMutation) throws {
        let path = try mutation.apply(to: Self.good, writingTo: Self.dir.file(mutation.fileName))
        let errors = readEverything(path)
        if mutation.refused {
            #expect(!errors.isEmpty, "\(mutation) read without error")
        }
        for error in errors {
            #expect(!error.description.contains("\n"), "\(error)")
        }
    }

    /// The loader check reads a dynamic segment in two passes, whatever its size: looking up
    /// each address's size anew (e317616) took time growing with the square of the entries,
    /// minutes for a file of a few MiB.
    @Test(.timeLimit(.minutes(1))) func aHugeDynamicSegmentIsCheckedInLinearTime() throws {
        var elf = try CraftedELF(contentsOf: Self.good)
        let strtab = elf.u64(try #require(elf.dynamicEntryValue(tag: 5)))
        func append(_ value: UInt64) { for index in 0..<8 { elf.bytes.append(UInt8(truncatingIfNeeded: value >> (8 * UInt64(index)))) } }
        let start = elf.bytes.count
        for _ in 0..<200_000 {
            append(10); append(16)       // DT_STRSZ 16
            append(5); append(strtab)   // DT_STRTAB, where the real one is
        }
        append(0); append(0)
        let dynamic = try #require(elf.programHeader(ofType: 2))
        elf.set64(UInt64(start), at: dynamic + 8)
        elf.set64(UInt64(elf.bytes.count - start), at: dynamic + 32)
        let path = try elf.write(to: Self.dir.file("huge-dynamic.so"))
        #expect(try ELFImage(path: path).loaderAddressProblem() == nil)
    }

    @Test func theUnchangedFileReadsCleanly() throws {
        #expect(readEverything(Self.good).isEmpty)
        let image = try ELFImage(path: Self.good)
        #expect(try image.dynamicInfo().soname == "libHostile.so")
        #expect(try image.buildID()?.count == 40)
    }

    @Test func programHeadersNear2To64AreReportedAsOutsideTheFile() throws {
        let path = try ELFMutation.all[0].apply(to: Self.good, writingTo: Self.dir.file("phoff.so"))
        #expect {
            try ELFImage(path: path)
        } throws: { error in
            "\(error)".contains("program headers") && "\(error)".contains("18446744073709551600")
        }
    }

    @Test func aHugeBuildIDNoteHasNoBuildID() throws {
        let path = try ELFMutation.all.last!.apply(to: Self.good, writingTo: Self.dir.file("note.so"))
        #expect(try ELFImage(path: path).buildID() == nil)
    }

    @Test func patchingAFileWithAHugeStringOffsetIsRefused() throws {
        let mutation = ELFMutation.all.first { $0.description.hasPrefix("DT_NEEDED") }!
        let path = try mutation.apply(to: Self.good, writingTo: Self.dir.file("needed.so"))
        #expect(throws: ELFError.self) {
            try DynamicStringPatch.patches(["libHostile.so": "libHostile.02"], image: try ELFImage(path: path))
        }
    }
}

/// Reading is bounded: only the ranges the checks need are read, and sizes past the limits
/// are refused by name before anything is read.
@Suite(.timeLimit(.minutes(5))) struct BoundedReadTests {
    @Test func aHugeManifestSectionIsRefusedBySize() throws {
        let dir = TemporaryDirectory("bounded-manifest")
        let good = try PluginFactory(directory: dir.path).buildC(
            "Big", source: PluginFactory.cSource(plugin: "Big", modules: ["big"]),
            manifest: PluginFactory.manifest(plugin: "Big", modules: ["big"]))
        let size: UInt64 = 100 << 20
        let path = try CraftedELF.withHugeManifest(good, size: size, writingTo: dir.file("big.so"))
        #expect {
            try ELFImage(path: path).manifestContents()
        } throws: { error in
            error as? ELFError == .tooLarge(what: "manifest section .modhost.manifest", size: size, limit: UInt64(PluginLimits.maximumManifestSize))
        }
    }

    @Test func aFileOverTheMaximumSizeIsRefusedBeforeReadingIt() throws {
        let dir = TemporaryDirectory("bounded-sparse")
        let good = try PluginFactory(directory: dir.path).buildC(
            "Sparse", source: PluginFactory.cSource(plugin: "Sparse", modules: ["sparse"]),
            manifest: PluginFactory.manifest(plugin: "Sparse", modules: ["sparse"]))
        // Just under the limit: only headers and tables are read, the manifest is found.
        try extendSparse(good, to: Int64(PluginLimits.maximumFileSize))
        let image = try ELFImage(path: good)
        #expect(image.fileSize == PluginLimits.maximumFileSize)
        #expect(try image.manifestContents()?.isEmpty == false)
        // One byte more, or 8 GB: refused by size.
        for size in [PluginLimits.maximumFileSize + 1, 8 << 30] {
            try extendSparse(good, to: Int64(size))
            #expect(throws: ELFError.tooLarge(what: "file", size: size, limit: PluginLimits.maximumFileSize)) {
                try ELFImage(path: good)
            }
        }
    }
}
