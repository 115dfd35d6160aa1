import Foundation
import Glibc
@testable import ModuleHost
import PluginFormat
import Testing
import TestSupport

/// Every check that runs before dlopen, each fed a real bad file made here.
@Suite(.timeLimit(.minutes(5))) struct ValidationTests {
    let dir = TemporaryDirectory("validation")
    var factory: PluginFactory { PluginFactory(directory: dir.path) }

    func refusal(_ path: String, in directory: String? = nil, allowInsecure: Bool = false) -> LoadFailure? {
        do {
            _ = try Validator(allowInsecure: allowInsecure).validate(path, in: directory ?? dir.path)
            return nil
        } catch {
            return error
        }
    }

    func goodCPlugin(_ name: String = "Good") throws -> String {
        try factory.buildC(name, source: PluginFactory.cSource(plugin: name, modules: [name.lowercased()]),
                           manifest: PluginFactory.manifest(plugin: name, modules: [name.lowercased()]))
    }

    @Test func aValidCPluginPasses() throws {
        let path = try goodCPlugin()
        let file = try Validator().validate(path, in: dir.path)
        #expect(file.manifest.name == "Good")
        #expect(file.manifest.modules == ["good"])
        #expect(file.warnings.isEmpty)
    }

    @Test func aDirectoryIsNotARegularFile() {
        let path = dir.directory("folder.so")
        let failure = refusal(path)
        #expect(failure?.check == .fileType)
        #expect(failure?.problem.contains("a directory") == true)
        #expect(failure?.description.hasPrefix(path) == true)
    }

    @Test func aFIFOIsNotARegularFile() {
        let path = dir.file("pipe.so")
        #expect(mkfifo(path, 0o644) == 0)
        let failure = refusal(path)
        #expect(failure?.check == .fileType)
        #expect(failure?.problem.contains("FIFO") == true)
    }

    @Test func aSymlinkOutOfThePluginDirectoryIsRefused() throws {
        let outside = TemporaryDirectory("outside")
        let target = try PluginFactory(directory: outside.path).buildC(
            "Outside", source: PluginFactory.cSource(plugin: "Outside", modules: ["outside"]),
            manifest: PluginFactory.manifest(plugin: "Outside", modules: ["outside"]))
        let plugins = dir.directory("plugins")
        let link = plugins + "/libOutside.so"
        #expect(symlink(target, link) == 0)
        let failure = refusal(link, in: plugins)
        #expect(failure?.check == .location)
        #expect(failure?.problem.contains("leads out of the plugin directory") == true)
        // A symlink that stays inside the directory is fine.
        let inside = try goodCPlugin("Inside")
        let innerLink = plugins + "/libInsideLink.so"
        try FileManager.default.moveItem(atPath: inside, toPath: plugins + "/libInside.so")
        #expect(symlink(plugins + "/libInside.so", innerLink) == 0)
        #expect(refusal(innerLink, in: plugins) == nil)
    }

    /// Every directory on the path to a plugin directory counts, as sshd and sudo check
    /// theirs: one that others may write to (without the sticky bit /tmp has) could have
    /// the plugin directory renamed away and replaced.
    @Test func aPluginDirectoryUnderADirectoryOthersMayWriteIsRefused() throws {
        let open = dir.directory("open")
        let plugins = dir.directory("open/plugins")
        let plugin = plugins + "/libGood.so"
        try FileManager.default.moveItem(atPath: try goodCPlugin(), toPath: plugin)
        #expect(chmod(open, 0o777) == 0)
        let failure = refusal(plugin, in: plugins)
        #expect(failure?.check == .permissions, "\(String(describing: failure))")
        #expect(failure?.problem == "on the path to plugin directory \(plugins), \(open) is writable by others (mode 777)", "\(String(describing: failure))")
        #expect(refusal(plugin, in: plugins, allowInsecure: true) == nil)
        // Sticky, as /tmp is: others may add entries but not rename or remove this one.
        #expect(chmod(open, 0o1777) == 0)
        #expect(refusal(plugin, in: plugins) == nil)
    }

    /// Outside attack: with a plugin directory in /tmp, another user's symlink of that
    /// name to any root-owned directory made a root daemon load the .so files there. A
    /// link on the path counts as its owner's.
    @Test(.enabled(if: geteuid() == 0, "a link owned by another user needs root to make"))
    func aPluginDirectoryThroughAnotherUsersSymlinkIsRefused() throws {
        let real = dir.directory("real")
        let plugin = real + "/libGood.so"
        try FileManager.default.moveItem(atPath: try goodCPlugin(), toPath: plugin)
        let link = dir.path + "/planted"
        #expect(symlink(real, link) == 0 && lchown(link, 65534, 65534) == 0)
        let failure = refusal(link + "/libGood.so", in: link)
        #expect(failure?.check == .permissions, "\(String(describing: failure))")
        #expect(failure?.problem == "on the path to plugin directory \(link), \(link) is owned by uid 65534, expected root (uid 0)",
                "\(String(describing: failure))")
        #expect(refusal(plugin, in: real) == nil)
        // The same link owned by root is followed, and what it leads to is checked in turn.
        #expect(lchown(link, 0, 0) == 0)
        #expect(refusal(link + "/libGood.so", in: link) == nil)
    }

    @Test func randomBytesAreNotELF() throws {
        let path = try dir.write("random.so", (0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 2654435761 >> 7) })
        let failure = refusal(path)
        #expect(failure?.check == .elf)
        #expect(failure?.problem.contains("not an ELF file") == true)
        #expect(failure?.problem.contains("expected 7f 45 4c 46") == true)
    }

    @Test func emptyAndTextFilesAreNotELF() throws {
        #expect(refusal(try dir.write("empty.so", []))?.check == .elf)
        let text = refusal(try dir.write("notes.so", text: "this is not a plugin\n"))
        #expect(text?.check == .elf)
        #expect(text?.problem.contains("74 68 69 73") == true)
    }

    /// Patches `count` bytes at `offset` of a copy of a good plugin.
    func patched(_ name: String, at offset: Int, _ bytes: [UInt8]) throws -> String {
        var data = Array(try Data(contentsOf: URL(fileURLWithPath: try goodCPlugin("Patch\(offset)"))))
        data.replaceSubrange(offset..<offset + bytes.count, with: bytes)
        return try dir.write(name, data)
    }

    @Test func a32BitELFIsTheWrongClass() throws {
        let failure = refusal(try patched("class32.so", at: 4, [1]))
        #expect(failure?.check == .elf)
        #expect(failure?.problem.contains("32-bit, expected 64-bit") == true)
    }

    @Test func anotherMachineIsRefused() throws {
        let failure = refusal(try patched("arm.so", at: 18, [183, 0]))
        #expect(failure?.check == .machine)
        #expect(failure?.problem.contains("machine 183") == true)
    }

    @Test func executablesAreNotSharedObjects() throws {
        let work = dir.directory("exe")
        try "int main(void) { return 0; }\n".write(toFile: work + "/main.c", atomically: true, encoding: .utf8)
        try shell("cc -no-pie main.c -o '\(dir.path)/static.so' && cc -pie -fPIE main.c -o '\(dir.path)/pie.so'", directory: work)
        let fixed = refusal(dir.file("static.so"))
        #expect(fixed?.check == .elf)
        #expect(fixed?.problem.contains("ELF type 2") == true)
        let pie = refusal(dir.file("pie.so"))
        #expect(pie?.check == .elf)
        #expect(pie?.problem.contains("position-independent executable") == true)
    }

    @Test(arguments: [3000, 8192])
    func aTruncatedCopyIsRefusedBeforeDlopen(cut: Int) throws {
        // dlopen of such a file dies with SIGBUS; the validator must catch it first.
        let whole = Array(try Data(contentsOf: URL(fileURLWithPath: BuildProducts.plugin("Greeting"))))
        let path = try dir.write("truncated\(cut).so", Array(whole.prefix(cut)))
        let failure = refusal(path)
        #expect(failure?.check == .segments)
        #expect(failure?.problem.contains("but the file has \(cut) bytes") == true)
        #expect(failure?.fix.contains("renaming") == true)
    }

    @Test func aSegmentPastTheEndWithIntactSectionsIsRefused() throws {
        // Grow the first PT_LOAD's file size beyond the file, keeping every header intact.
        let path = try goodCPlugin("Grown")
        var data = Array(try Data(contentsOf: URL(fileURLWithPath: path)))
        func u64(_ at: Int) -> UInt64 { (0..<8).reduce(0) { $0 | UInt64(data[at + $1]) << (8 * UInt64($1)) } }
        let phoff = Int(u64(32))
        let phentsize = Int(data[54]) | Int(data[55]) << 8
        var index = 0
        while data[phoff + index * phentsize] != 1 { index += 1 }
        let fileSizeField = phoff + index * phentsize + 32
        let huge = UInt64(data.count) * 4
        for byte in 0..<8 { data[fileSizeField + byte] = UInt8(truncatingIfNeeded: huge >> (8 * UInt64(byte))) }
        let failure = refusal(try dir.write("grown.so", data))
        #expect(failure?.check == .segments)
        #expect(failure?.problem.contains("loadable segment \(index)") == true)
    }

    @Test func aMissingManifestIsRefused() throws {
        let path = try factory.buildC("Bare", source: PluginFactory.cSource(plugin: "Bare", modules: ["bare"]), manifest: nil)
        let failure = refusal(path)
        #expect(failure?.check == .manifest)
        #expect(failure?.problem.contains("no .modhost.manifest section") == true)
        #expect(failure?.fix.contains("plugin.mk") == true)
    }

    @Test(arguments: [
        ("{not json", "not valid JSON"),
        (#"{"name":"X","version":"1","abi":"1.0","language":"c"}"#, "required field \"modules\" is missing"),
        (#"{"name":"X","version":1,"abi":"1.0","language":"c","modules":["x"]}"#, "field \"version\" has the wrong type"),
        (#"{"name":"X","version":"1","abi":"one","language":"c","modules":["x"]}"#, "field \"abi\" is \"one\""),
        (#"{"name":"X","version":"1","abi":"1.0","language":"swift","modules":["x"]}"#, "needs field \"toolchain\""),
    ])
    func aGarbledManifestNamesTheField(manifest: String, expected: String) throws {
        let path = try factory.buildC("Garbled", source: PluginFactory.cSource(plugin: "Garbled", modules: ["x"]),
                                      manifest: manifest, fileName: "garbled-\(abs(manifest.hashValue)).so")
        let failure = refusal(path)
        #expect(failure?.check == .manifest)
        #expect(failure?.problem.contains(expected) == true, "\(failure?.problem ?? "accepted")")
    }

    @Test func anotherABIMajorIsRefused() throws {
        let path = try factory.buildC("Future", source: PluginFactory.cSource(plugin: "Future", modules: ["future"]),
                                      manifest: PluginFactory.manifest(plugin: "Future", modules: ["future"], abi: "2.0"))
        let failure = refusal(path)
        #expect(failure?.check == .abi)
        #expect(failure?.problem.contains("built for ABI 2.0, this host provides ABI 1.\(HostSDK.abiMinor)") == true)
    }

    @Test func aNewerABIMinorIsRefused() throws {
        let path = try factory.buildC("Newer", source: PluginFactory.cSource(plugin: "Newer", modules: ["newer"]),
                                      manifest: PluginFactory.manifest(plugin: "Newer", modules: ["newer"], abi: "1.9"))
        let failure = refusal(path)
        #expect(failure?.check == .abi)
        #expect(failure?.fix.contains("upgrade the host") == true)
    }

    /// The real Greeting plugin with its manifest's toolchain replaced: what another build
    /// of it would record.
    func greeting(moduleKit: String? = nil, swift: String? = nil, as name: String) throws -> String {
        let original = try PluginFactory.embeddedManifest(BuildProducts.plugin("Greeting"))
        var text = original
        if let moduleKit {
            let recorded = "\"moduleKit\" : \"\(HostSDK.current.moduleKit)\""
            #expect(text.contains(recorded))
            text = text.replacingOccurrences(of: recorded, with: "\"moduleKit\" : \"\(moduleKit)\"")
        }
        if let swift {
            let recorded = try #require(text.split(separator: "\n").first { $0.contains("\"swift\" : ") })
            text = text.replacingOccurrences(of: recorded, with: "    \"swift\" : \"\(swift)\"")
        }
        return try factory.withManifest(BuildProducts.plugin("Greeting"), text, as: name)
    }

    func refusal(_ path: String, host: HostSDK) -> LoadFailure? {
        do {
            _ = try Validator(sdk: host).validate(path, in: dir.path)
            return nil
        } catch {
            return error
        }
    }

    @Test func aSwiftPluginRecordsTheModuleKitAndCompilerItWasBuiltWith() throws {
        let file = try Validator().validate(BuildProducts.plugin("Greeting"))
        let toolchain = try #require(file.manifest.toolchain)
        #expect(toolchain.moduleKit == HostSDK.current.moduleKit)
        #expect(toolchain.compilerVersion == HostSDK.current.compilerVersion)
        #expect(HostSDK.current.moduleKit == "1.0")
    }

    // The rule: equal ModuleKit major, plugin minor at most the host's, same compiler major.minor.
    @Test func theCompatibilityRuleAcceptsOlderMinorsAndOtherCompilerPatches() throws {
        let host = HostSDK(libraryPath: HostSDK.current.libraryPath, moduleKitVersion: (1, 3), compilerVersion: "6.3")
        for moduleKit in ["1.0", "1.3"] {
            let path = try greeting(moduleKit: moduleKit, swift: "Swift version 6.3.0 (swift-6.3-RELEASE)", as: "libGreeting\(moduleKit).so")
            #expect(refusal(path, host: host) == nil, "ModuleKit \(moduleKit) on a 1.3 host")
        }
    }

    @Test func aSwiftPluginBuiltAgainstAnotherModuleKitMajorIsRefused() throws {
        let host = HostSDK(libraryPath: HostSDK.current.libraryPath, moduleKitVersion: (2, 0), compilerVersion: HostSDK.current.compilerVersion)
        let older = refusal(try greeting(as: "libOldGreeting.so"), host: host)
        #expect(older?.check == .moduleKit)
        #expect(older?.description.contains("ModuleKit version check failed: plugin Greeting was built against ModuleKit 1.0, this host runs ModuleKit 2.0. Fix: rebuild the plugin against this host's SDK") == true,
                "\(String(describing: older))")
        let newer = refusal(try greeting(moduleKit: "3.0", as: "libNewGreeting.so"))
        #expect(newer?.check == .moduleKit)
        #expect(newer?.problem == "plugin Greeting was built against ModuleKit 3.0, this host runs ModuleKit 1.0")
        #expect(newer?.fix.contains("upgrade the host to ModuleKit 3.x") == true)
    }

    @Test func aSwiftPluginBuiltAgainstANewerModuleKitMinorIsRefused() throws {
        let failure = refusal(try greeting(moduleKit: "1.7", as: "libNewerGreeting.so"))
        #expect(failure?.check == .moduleKit)
        #expect(failure?.problem == "plugin Greeting was built against ModuleKit 1.7, newer than this host's ModuleKit 1.0")
        #expect(failure?.fix == "upgrade the host to ModuleKit 1.7 or later, or rebuild the plugin against this host's SDK")
    }

    @Test func aSwiftPluginFromAnotherCompilerIsRefused() throws {
        let failure = refusal(try greeting(swift: "Swift version 6.2.4 (swift-6.2.4-RELEASE)", as: "libOtherCompiler.so"))
        #expect(failure?.check == .toolchain)
        #expect(failure?.problem == "plugin Greeting was compiled by Swift 6.2 (Swift version 6.2.4 (swift-6.2.4-RELEASE)), this host's ModuleKit by Swift \(HostSDK.current.compilerVersion)")
        #expect(failure?.fix == "rebuild the plugin with a Swift \(HostSDK.current.compilerVersion) toolchain against this host's SDK")
    }

    @Test(arguments: [("1", "toolchain.moduleKit"), ("one.0", "toolchain.moduleKit"), ("", "toolchain.moduleKit")])
    func anUnreadableModuleKitVersionIsAManifestError(moduleKit: String, field: String) throws {
        let failure = refusal(try greeting(moduleKit: moduleKit, as: "libBadVersion.so"))
        #expect(failure?.check == .manifest)
        #expect(failure?.problem.contains("\"\(field)\" is \"\(moduleKit)\", expected \"MAJOR.MINOR\"") == true, "\(String(describing: failure))")
    }

    @Test func aCompilerTextWithoutAVersionIsAManifestError() throws {
        let failure = refusal(try greeting(swift: "some compiler", as: "libNoCompiler.so"))
        #expect(failure?.check == .manifest)
        #expect(failure?.problem.contains("names no \"Swift version MAJOR.MINOR\"") == true, "\(String(describing: failure))")
    }

    @Test func aPluginCarryingItsOwnSDKCopyIsRefused() throws {
        // Defining a ModuleKit symbol itself means the plugin brought its own copy.
        let source = PluginFactory.cSource(
            plugin: "Smuggler", modules: ["smuggler"],
            extra: "__attribute__((visibility(\"default\"))) int modhost_abi_compatible(const modhost_plugin *p) { (void)p; return 1; }")
        let path = try factory.buildC("Smuggler", source: source, manifest: PluginFactory.manifest(plugin: "Smuggler", modules: ["smuggler"]))
        let failure = refusal(path)
        #expect(failure?.check == .sdkLinkage)
        #expect(failure?.problem.contains("carries its own copy of ModuleKit") == true)
    }

    @Test func groupOrWorldWritableFilesAndDirectoriesAreRefused() throws {
        let path = try goodCPlugin("Loose")
        chmod(path, 0o666)
        let failure = refusal(path)
        #expect(failure?.check == .permissions)
        #expect(failure?.problem.contains("writable by others (mode 666)") == true)
        #expect(failure?.fix.contains("--allow-insecure-plugins") == true)

        chmod(path, 0o644)
        chmod(dir.path, 0o775)
        defer { chmod(dir.path, 0o755) }
        let group = refusal(path)
        #expect(group?.check == .permissions)
        #expect(group?.problem.contains("\(dir.path) is writable by group") == true)
    }

    @Test(.enabled(if: geteuid() == 0, "giving a file to another user needs root (CI runs as root)"))
    func filesOwnedByAnotherUserAreRefused() throws {
        let path = try goodCPlugin("Foreign")
        try #require(chown(path, 65534, 65534) == 0, "chown: \(String(cString: strerror(errno)))")
        let failure = refusal(path)
        #expect(failure?.check == .permissions)
        #expect(failure?.problem.contains("owned by uid 65534") == true)
    }

    @Test func allowInsecureTurnsPermissionsIntoWarnings() throws {
        let path = try goodCPlugin("Tolerated")
        chmod(path, 0o666)
        let file = try Validator(allowInsecure: true).validate(path, in: dir.path)
        #expect(file.warnings.count == 1)
        #expect(file.warnings.first?.contains("--allow-insecure-plugins") == true)
    }

    @Test func theExamplePluginsAreValid() throws {
        let plan = PluginPlan(directories: [BuildProducts.pluginDirectory], validator: Validator())
        #expect(plan.refused.isEmpty, "\(plan.refused)")
        #expect(Set(plan.ordered.map(\.name)).isSuperset(of: ["Greeting", "Welcome", "Counter", "Calculator"]))
    }
}
