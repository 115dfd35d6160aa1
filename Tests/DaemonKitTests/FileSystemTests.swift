import DaemonKit
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.timeLimit(.minutes(5)))
struct FileSystemTests {
    @Test func namesListsEveryEntryButDotAndDotDot() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        #expect(try FileSystem.names(in: directory.path) == [])
        try writeFile(directory.file("a.so"), "x")
        try writeFile(directory.file(".hidden"), "x")
        #expect(mkdir(directory.file("sub"), 0o700) == 0)
        #expect(symlink("/nowhere", directory.file("dangling")) == 0)
        #expect(try FileSystem.names(in: directory.path).sorted() == [".hidden", "a.so", "dangling", "sub"])
        #expect(try FileSystem.names(in: directory.path).sorted() == FileManager.default.contentsOfDirectory(atPath: directory.path).sorted())
    }

    @Test func namesOfWhatIsNoDirectoryIsASystemError() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        try writeFile(directory.file("file"), "x")
        #expect(throws: SystemError("opendir", code: ENOENT, subject: directory.file("missing"))) {
            try FileSystem.names(in: directory.file("missing"))
        }
        #expect(throws: SystemError("opendir", code: ENOTDIR, subject: directory.file("file"))) {
            try FileSystem.names(in: directory.file("file"))
        }
    }

    @Test func createDirectoryMakesTheMissingParentsWithTheModeLessTheUmask() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let deep = directory.file("a/b/c")
        #expect(throws: SystemError("mkdir", code: ENOENT, subject: deep)) { try FileSystem.createDirectory(deep) }
        try FileSystem.createDirectory(deep, mode: 0o750, parents: true)
        for path in [directory.file("a"), directory.file("a/b"), deep] {
            var status = stat()
            #expect(lstat(path, &status) == 0)
            #expect(status.st_mode & S_IFMT == S_IFDIR, "\(path)")
            #expect(status.st_mode & 0o777 == 0o750 & ~Self.umask(), "\(path)")
        }
        // Already there: not an error, and left as it is.
        #expect(chmod(deep, 0o700) == 0)
        try FileSystem.createDirectory(deep, mode: 0o755, parents: true)
        try FileSystem.createDirectory(deep + "/", mode: 0o755)
        var status = stat()
        #expect(stat(deep, &status) == 0 && status.st_mode & 0o777 == 0o700)
        // A symlink to a directory counts as one; a file does not.
        #expect(symlink(deep, directory.file("link")) == 0)
        try FileSystem.createDirectory(directory.file("link"))
        try writeFile(directory.file("file"), "x")
        #expect(throws: SystemError("mkdir", code: EEXIST, subject: directory.file("file"))) {
            try FileSystem.createDirectory(directory.file("file"), parents: true)
        }
        #expect(throws: SystemError("mkdir", code: ENOTDIR, subject: directory.file("file/sub"))) {
            try FileSystem.createDirectory(directory.file("file/sub"), parents: true)
        }
    }

    /// This process's umask, read without changing it (as `umask` would, for every thread).
    static func umask() -> mode_t {
        let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("Umask:") }
        return line.flatMap { mode_t($0.dropFirst("Umask:".count).trimmingCharacters(in: .whitespaces), radix: 8) } ?? 0o022
    }

    @Test func existsAndIsDirectoryFollowSymlinks() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        try writeFile(directory.file("file"), "x")
        #expect(symlink(directory.path, directory.file("to-directory")) == 0)
        #expect(symlink("/nowhere", directory.file("dangling")) == 0)
        #expect(FileSystem.exists(directory.file("file")) && !FileSystem.isDirectory(directory.file("file")))
        #expect(FileSystem.exists(directory.file("to-directory")) && FileSystem.isDirectory(directory.file("to-directory")))
        #expect(!FileSystem.exists(directory.file("dangling")) && !FileSystem.isDirectory(directory.file("dangling")))
        #expect(!FileSystem.exists(directory.file("missing")))
    }

    @Test func symlinkTargetIsWhatTheLinkSays() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        #expect(symlink("../relative/x.so", directory.file("link")) == 0)
        try writeFile(directory.file("file"), "x")
        #expect(FileSystem.symlinkTarget(directory.file("link")) == "../relative/x.so")
        #expect(FileSystem.symlinkTarget(directory.file("file")) == nil)
        #expect(FileSystem.symlinkTarget(directory.file("missing")) == nil)
        #expect(FileSystem.executablePath == (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")))
    }

    @Test func theWorkingDirectoryAndTheEnvironmentAreThisProcesss() {
        #expect(FileSystem.currentDirectory == FileManager.default.currentDirectoryPath)
        #expect(PathText.absolute("x") == FileManager.default.currentDirectoryPath + "/x")
        let name = "DKTEST_ENVIRONMENT_\(getpid())"
        setenv(name, "a=b c", 1)
        defer { unsetenv(name) }
        let environment = ProcessEnvironment.current
        #expect(environment[name] == "a=b c")
        #expect(environment == ProcessInfo.processInfo.environment)
    }
}
