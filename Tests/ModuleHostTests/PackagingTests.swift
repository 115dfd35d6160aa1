import DaemonShell
import Foundation
import Glibc
@testable import ModuleHost
import ModuleKit
import Testing
import TestSupport

/// What an operator installs: the example configuration, `make install` and `make deb`.
@Suite(.timeLimit(.minutes(10)), .serialized) struct PackagingTests {
    static let root = BuildProducts.packageRoot
    static let isRoot = geteuid() == 0

    // MARK: versions

    /// One release number everywhere: the tools' `--version`, the protocol's `version`
    /// reply and the package's (modulehost.pc.in, which `make deb` reads).
    @Test func everyToolSaysTheReleaseThePackageIs() throws {
        let pkgconfig = try String(contentsOfFile: Self.root + "/share/modulehost.pc.in", encoding: .utf8)
        let version = pkgconfig.split(separator: "\n").first { $0.hasPrefix("Version: ") }.map { String($0.dropFirst("Version: ".count)) }
        #expect(version == HostSDK.release)
        for (tool, name) in [(BuildProducts.modhostd, "modhostd"), (BuildProducts.modhostctl, "modhostctl")] {
            let result = try run(tool, ["--version"])
            #expect(result.status == 0, "\(result)")
            #expect(result.standardOutput.hasPrefix("\(name) \(HostSDK.release) (C ABI \(HostSDK.abiMajor).\(HostSDK.abiMinor), ModuleKit "),
                    "\(result.standardOutput)")
        }
    }

    /// `modhostctl version` shows its own version line and the running daemon's.
    @Test func versionShowsTheToolAndTheDaemon() async throws {
        let h = try DaemonLifecycleTests.Harness(["Counter"])
        #expect(await h.waitFor("control socket ready"))
        let result = try h.ctl("version")
        let lines = result.standardOutput.split(separator: "\n").map(String.init)
        #expect(result.status == 0 && lines.count == 2, "\(result)")
        #expect(lines.first == HostSDK.versionLine("modhostctl"))
        #expect(lines.last == HostSDK.versionLine("modhostd").dropLast() + ", protocol 1)", "\(lines)")
        #expect(await h.stop() == 0)
    }

    // MARK: share/modhostd.json.example

    /// The example configuration is read by the daemon's own parser, sets every field the
    /// parser knows to a value other than nothing, and docs/daemon.md documents each field.
    @Test func theExampleConfigurationLoadsAndEveryFieldIsDocumented() throws {
        let path = Self.root + "/share/modhostd.json.example"
        let configuration = try DaemonConfiguration.load(path)
        #expect(configuration.pluginDirectories == ["/usr/local/lib/modulehost/plugins"])
        guard case .object(let fields) = try JSONValue.parse(Array(try String(contentsOfFile: path, encoding: .utf8).utf8)) else {
            Issue.record("\(path) is not a JSON object")
            return
        }
        #expect(Set(fields.keys) == DaemonConfiguration.fieldNames, "the example should show every field")
        let document = try String(contentsOfFile: Self.root + "/docs/daemon.md", encoding: .utf8)
        let rows = Set(document.split(separator: "\n").filter { $0.hasPrefix("| `") }.compactMap { line in
            line.dropFirst(3).split(separator: "`").first.map(String.init)
        })
        for field in DaemonConfiguration.fieldNames.sorted() {
            #expect(rows.contains(field), "docs/daemon.md has no table row for the configuration field \(field)")
        }
        for setting in ["enabled", "order", "configuration"] {
            #expect(rows.contains("modules.NAME.\(setting)"), "docs/daemon.md has no row for modules.NAME.\(setting)")
        }
        // The documented example is the file itself.
        let shown = try MarkdownBlock.blocks(of: "docs/daemon.md").filter { $0.language == "json" }
        #expect(shown.contains { $0.body == (try? String(contentsOfFile: path, encoding: .utf8)) }, "docs/daemon.md should show share/modhostd.json.example as it is")
    }

    // MARK: make install

    /// `make install` builds and installs a release build; `make run` says it is a debug one.
    @Test func installBuildsInReleaseMode() throws {
        let install = try run("/usr/bin/make", ["-n", "install", "PREFIX=/nonexistent", "DESTDIR=/nonexistent"], directory: Self.root)
        #expect(install.standardOutput.contains("build -c release"), "\(install.standardOutput)")
        #expect(install.standardOutput.contains("build/release/bin/modhostd"), "\(install.standardOutput)")
        #expect(!install.standardOutput.contains("build -c debug"))
        let runTarget = try run("/usr/bin/make", ["-n", "run"], directory: Self.root)
        #expect(runTarget.standardOutput.contains("make run: a debug build"), "\(runTarget.standardOutput)")
    }

    /// With another SYSCONFDIR, the installed unit reads the configuration `make install`
    /// wrote there (found from outside: the unit kept /etc/modhostd/modhostd.json).
    @Test func theInstalledUnitReadsTheConfigurationWhereInstallPutIt() throws {
        let scratch = TemporaryDirectory("install-sysconfdir")
        let result = try run("/usr/bin/make", ["--no-print-directory", "install", "PACKAGE_BUILD=\(BuildProducts.directory)",
                                               "DESTDIR=\(scratch.path)", "PREFIX=/opt/mh", "SYSCONFDIR=/opt/mh/etc"],
                             directory: Self.root)
        try #require(result.status == 0, "\(result.standardOutput)\(result.standardError)")
        #expect(FileManager.default.fileExists(atPath: scratch.file("opt/mh/etc/modhostd/modhostd.json")))
        let unit = try String(contentsOfFile: scratch.file("opt/mh/share/modulehost/modhostd.service"), encoding: .utf8)
        let start = try #require(unit.split(separator: "\n").first { $0.hasPrefix("ExecStart=") })
        #expect(start.hasPrefix("ExecStart=/opt/mh/bin/modhostd --config /opt/mh/etc/modhostd/modhostd.json "), "\(start)")
    }

    /// `make` lays out build/ while a modhostd started from it may be running (`make run`,
    /// or `build/bin/modhostd` as the README shows): a changed file is written beside its
    /// path and renamed over it, never rewritten in place, which would change the code
    /// under that process's mapping of libModuleKit.so (it crashed with SIGSEGV).
    @Test func theBuildLayoutReplacesAChangedFileByRenamingNeverInPlace() throws {
        let scratch = TemporaryDirectory("sdk-layout")
        func layout() throws -> ProcessResult {
            // Only the layout step: the Swift build it depends on is taken as done.
            try run("/bin/bash", ["-c", "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -o swift-build -o deps sdk BUILD='\(scratch.path)' 2>&1"],
                    directory: Self.root)
        }
        let first = try layout()
        try #require(first.status == 0, "\(first.standardOutput)")
        let library = scratch.file("lib/libModuleKit.so")
        let built = try Data(contentsOf: URL(fileURLWithPath: library))

        // An older libModuleKit.so, held open as a running daemon holds its mapping.
        try scratch.write("lib/libModuleKit.so.old", text: "an older build")
        try #require(rename(scratch.file("lib/libModuleKit.so.old"), library) == 0)
        let held = open(library, O_RDONLY)
        try #require(held >= 0)
        defer { close(held) }

        let second = try layout()
        #expect(second.status == 0, "\(second.standardOutput)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: library)) == built, "the path has the new library")
        var buffer = [UInt8](repeating: 0, count: 64)
        let count = pread(held, &buffer, buffer.count, 0)
        #expect(String(decoding: buffer.prefix(max(count, 0)), as: UTF8.self) == "an older build",
                "the file a process held was rewritten in place")
        #expect(try FileManager.default.contentsOfDirectory(atPath: scratch.file("lib")).sorted() == ["libModuleKit.so", "modulehost", "pkgconfig"],
                "nothing is left beside it")
    }

    // MARK: make deb

    /// `make deb` from the test build: its contents and scripts, an install into a scratch
    /// root (the maintainer scripts create the modhostd user there, the state directory with
    /// its owner and mode), the installed tools run, a purge, and lintian when installed.
    @Test(.enabled(if: isRoot && FileManager.default.isExecutableFile(atPath: "/usr/bin/dpkg-deb"), "needs root and dpkg-deb"),
          .timeLimit(.minutes(10)))
    func theDebianPackageInstallsIntoAScratchRoot() async throws {
        let scratch = TemporaryDirectory("deb")
        let build = try run("/usr/bin/make", ["--no-print-directory", "deb", "PACKAGE_BUILD=\(BuildProducts.directory)", "DEB_OUT=\(scratch.path)"],
                            directory: Self.root)
        try #require(build.status == 0, "\(build.standardOutput)\(build.standardError)")
        let debName = try #require(try FileManager.default.contentsOfDirectory(atPath: scratch.path).first(where: { $0.hasSuffix(".deb") }))
        let deb = scratch.file(debName)

        let contents = try run("/usr/bin/dpkg-deb", ["-c", deb]).standardOutput
        let entries = contents.split(separator: "\n").map { line in
            let columns = line.split(separator: " ", omittingEmptySubsequences: true)
            return (mode: String(columns[0]), owner: String(columns[1]), path: String(columns.last!))
        }
        for path in ["./usr/bin/modhostd", "./usr/bin/modhostctl", "./usr/bin/modhost-trial", "./usr/lib/libModuleKit.so",
                     "./usr/lib/modulehost/swift/ModuleKit.swiftmodule", "./usr/lib/modulehost/swift/ModuleKit.swiftinterface",
                     "./usr/include/modulehost.h", "./usr/include/modulehost/module.modulemap", "./usr/share/modulehost/plugin.mk",
                     "./usr/lib/pkgconfig/modulehost.pc", "./lib/systemd/system/modhostd.service", "./etc/modhostd/modhostd.json",
                     "./usr/lib/modulehost/plugins/", "./usr/share/doc/modulehost/daemon.md", "./usr/share/doc/modulehost/copyright"] {
            #expect(entries.contains { $0.path == path }, "\(path) is not in the package:\n\(contents)")
        }
        #expect(entries.allSatisfy { $0.owner == "root/root" }, "\(contents)")
        #expect(entries.filter { $0.path.hasPrefix("./usr/bin/") && !$0.path.hasSuffix("/") }.allSatisfy { $0.mode == "-rwxr-xr-x" })
        #expect(!entries.contains { $0.path.hasPrefix("./var/") }, "the state directory is made by the maintainer scripts")

        let info = try run("/usr/bin/dpkg-deb", ["-I", deb]).standardOutput
        for field in ["Package: modulehost", "Architecture: ", "Depends: ", "conffiles", "postinst", "prerm", "postrm"] {
            #expect(info.contains(field), "\(field):\n\(info)")
        }
        let conffiles = try run("/usr/bin/dpkg-deb", ["-I", deb, "conffiles"]).standardOutput
        #expect(conffiles == "/etc/modhostd/modhostd.json\n")
        let postinst = try run("/usr/bin/dpkg-deb", ["-I", deb, "postinst"]).standardOutput
        #expect(postinst.contains("useradd") && postinst.contains("DPKG_ROOT"))

        // A scratch root with an empty dpkg database and a user database holding root only.
        let root = scratch.directory("root")
        for directory in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "var/log", "etc"] {
            _ = scratch.directory("root/" + directory)
        }
        try scratch.write("root/var/lib/dpkg/status", text: "")
        try scratch.write("root/etc/passwd", text: "root:x:0:0:root:/root:/bin/sh\n")
        try scratch.write("root/etc/group", text: "root:x:0:\n")
        try scratch.write("root/etc/shadow", text: "root:*:19000:0:99999:7:::\n", mode: 0o640)
        try scratch.write("root/etc/gshadow", text: "root:*::\n", mode: 0o640)
        let dpkg = ["--root=\(root)", "--force-script-chrootless", "--force-depends"]
        let installed = try run("/usr/bin/dpkg", dpkg + ["-i", deb])
        #expect(installed.status == 0, "\(installed.standardOutput)\(installed.standardError)")

        let passwd = try String(contentsOfFile: root + "/etc/passwd", encoding: .utf8)
        let user = try #require(passwd.split(separator: "\n").first { $0.hasPrefix("modhostd:") }, "no modhostd user:\n\(passwd)")
        let fields = user.split(separator: ":", omittingEmptySubsequences: false)
        let uid = try #require(UInt32(fields[2]))
        #expect(uid < 1000 && fields[6] == "/usr/sbin/nologin", "not a system account: \(user)")
        #expect(try String(contentsOfFile: root + "/etc/group", encoding: .utf8).contains("modhostd:x:"))
        var state = stat()
        #expect(lstat(root + "/var/lib/modhostd", &state) == 0)
        #expect(state.st_uid == uid && state.st_mode & 0o7777 == 0o700, "state directory uid \(state.st_uid) mode \(String(state.st_mode & 0o7777, radix: 8))")
        #expect(lstat(root + "/usr/lib/modulehost/plugins", &state) == 0)
        #expect(state.st_uid == 0 && state.st_mode & 0o7777 == 0o755)
        #expect(!(try String(contentsOfFile: "/etc/passwd", encoding: .utf8)).contains("ModuleHost daemon"), "the host's user database was changed")

        // The installed configuration is the example for /usr, read by the real parser.
        let configuration = try DaemonConfiguration.load(root + "/etc/modhostd/modhostd.json")
        #expect(configuration.pluginDirectories == ["/usr/lib/modulehost/plugins"])
        let unit = try String(contentsOfFile: root + "/lib/systemd/system/modhostd.service", encoding: .utf8)
        #expect(unit.contains("ExecStart=/usr/bin/modhostd --config /etc/modhostd/modhostd.json"))
        // The installed (stripped) tools run, and the SDK is where they say.
        let flags = try run(root + "/usr/bin/modhostctl", ["flags", "--c", "--plugin", "Hello"])
        #expect(flags.status == 0 && flags.standardOutput.contains("-I \(root)/usr/include "), "\(flags.standardOutput)\(flags.standardError)")
        #expect(try run(root + "/usr/bin/modhostd", ["--help"]).status == 0)

        let purged = try run("/usr/bin/dpkg", dpkg + ["--purge", "modulehost"])
        #expect(purged.status == 0, "\(purged.standardOutput)\(purged.standardError)")
        for path in ["/var/lib/modhostd", "/etc/modhostd/modhostd.json", "/usr/bin/modhostd"] {
            #expect(!FileManager.default.fileExists(atPath: root + path), "\(path) is left after the purge")
        }

        // lintian, when installed: no error but the two the Swift toolchain's layout causes
        // (docs/daemon.md, "The Debian package").
        if FileManager.default.isExecutableFile(atPath: "/usr/bin/lintian") {
            let lint = try run("/usr/bin/lintian", ["--no-tag-display-limit", deb])
            let allowed = ["custom-library-search-path", "sharedobject-in-library-directory-missing-soname"]
            let errors = lint.standardOutput.split(separator: "\n").filter { $0.hasPrefix("E: ") }
                .filter { line in !allowed.contains { line.contains(": \($0) ") } }
            #expect(errors.isEmpty, "lintian:\n\(lint.standardOutput)")
        }
    }
}
