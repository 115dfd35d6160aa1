import DaemonKit
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.timeLimit(.minutes(5)))
struct RuntimePathsTests {
    @Test func rootUsesSystemLocationsEvenWithXDGVariables() {
        let paths = RuntimePaths(environment: ["XDG_RUNTIME_DIR": "/run/user/0", "HOME": "/root"], uid: 0)
        #expect(paths.socketPath == "/run/modhostd/modhostd.sock")
        #expect(paths.stateDirectory == "/var/lib/modhostd")
        #expect(paths.configPath == "/etc/modhostd/modhostd.json")
    }

    @Test func aUserWithXDGVariablesUsesThem() {
        let paths = RuntimePaths(
            environment: [
                "XDG_RUNTIME_DIR": "/run/user/1000/", "XDG_STATE_HOME": "/data/state",
                "XDG_CONFIG_HOME": "/data/config", "HOME": "/home/ann",
            ], uid: 1000)
        #expect(paths.socketPath == "/run/user/1000/modhostd.sock")
        #expect(paths.stateDirectory == "/data/state/modhostd")
        #expect(paths.configPath == "/data/config/modhostd/modhostd.json")
    }

    @Test func aUserWithoutXDGVariablesFallsBackToHomeAndAPrivateDirectoryInTmp() {
        let paths = RuntimePaths(environment: ["HOME": "/home/ann"], uid: 1000)
        // Never a socket directly in world-writable /tmp: a private directory holds it.
        #expect(paths.socketPath == "/tmp/modhostd-1000/modhostd.sock")
        #expect(paths.privateRuntimeDirectory == "/tmp/modhostd-1000")
        #expect(paths.stateDirectory == "/home/ann/.local/state/modhostd")
        #expect(paths.configPath == "/home/ann/.config/modhostd/modhostd.json")
    }

    @Test func relativeOrEmptyXDGVariablesAreIgnored() {
        let paths = RuntimePaths(
            environment: ["XDG_RUNTIME_DIR": "run", "XDG_STATE_HOME": "", "XDG_CONFIG_HOME": "cfg", "HOME": "/home/ann"],
            uid: 1000)
        #expect(paths.socketPath == "/tmp/modhostd-1000/modhostd.sock")
        #expect(paths.stateDirectory == "/home/ann/.local/state/modhostd")
        #expect(paths.configPath == "/home/ann/.config/modhostd/modhostd.json")
    }

    @Test func withoutHomeThePasswordDatabaseIsUsed() {
        // uid 65534 (nobody) exists in /etc/passwd with home /nonexistent on Debian.
        let paths = RuntimePaths(environment: [:], uid: 65534)
        #expect(paths.stateDirectory.hasSuffix("/.local/state/modhostd"))
        #expect(paths.stateDirectory.hasPrefix("/"))
        #expect(!paths.stateDirectory.hasPrefix("/home/ann"))
    }

    @Test func thePrivateRuntimeDirectoryIsCreated0700AndCheckedLikeOpenSSHDoes() throws {
        let parent = NSTemporaryDirectory() + "rt-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        #expect(mkdir(parent, 0o755) == 0)
        defer { try? FileManager.default.removeItem(atPath: parent) }
        let directory = parent + "/modhostd-\(geteuid())"

        // Missing: the client reports ENOENT (no daemon), the daemon creates it 0700.
        #expect(throws: PrivateDirectoryError.system(SystemError("lstat", code: ENOENT, subject: directory))) {
            try RuntimePaths.checkPrivateDirectory(directory, create: false)
        }
        let oldMask = umask(0)
        defer { umask(oldMask) }
        try RuntimePaths.checkPrivateDirectory(directory, create: true)
        var info = stat()
        #expect(lstat(directory, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o700)
        try RuntimePaths.checkPrivateDirectory(directory, create: true)  // ours: accepted again
        try RuntimePaths.checkPrivateDirectory(directory, create: false)

        // Group or others may enter: refused, naming the mode and the fix.
        chmod(directory, 0o755)
        do {
            try RuntimePaths.checkPrivateDirectory(directory, create: true)
            Issue.record("a 0755 runtime directory was accepted")
        } catch {
            #expect(error.description.contains("\(directory) is not private: its mode 755 gives group or others access"))
            #expect(error.description.contains("Fix:"))
        }
        // Allowing reading (the state directory): 0755 passes, and it is left as it was;
        // a group or others write bit is still refused.
        try RuntimePaths.checkPrivateDirectory(directory, create: true, allowingRead: true)
        #expect(lstat(directory, &info) == 0 && info.st_mode & 0o7777 == 0o755)
        chmod(directory, 0o1777)
        #expect(throws: PrivateDirectoryError.notPrivate(directory: directory, problem: "its mode 1777 gives group or others write access")) {
            try RuntimePaths.checkPrivateDirectory(directory, create: true, allowingRead: true)
        }
        #expect(lstat(directory, &info) == 0 && info.st_mode & 0o7777 == 0o1777)
        chmod(directory, 0o700)

        // Owned by someone else (as a local attacker would pre-create it): refused.
        if geteuid() == 0 {
            #expect(chown(directory, 65534, 65534) == 0)
            #expect(throws: PrivateDirectoryError.notPrivate(directory: directory, problem: "it is owned by uid 65534, not uid 0")) {
                try RuntimePaths.checkPrivateDirectory(directory, create: true)
            }
        }
        // A symlink to a directory of ours is not the directory: refused.
        let link = parent + "/link"
        let real = parent + "/real"
        #expect(mkdir(real, 0o700) == 0)
        #expect(symlink(real, link) == 0)
        #expect(throws: PrivateDirectoryError.notPrivate(directory: link, problem: "it is not a directory (a symlink or another file)")) {
            try RuntimePaths.checkPrivateDirectory(link, create: true)
        }
    }
}

/// Paths split as text, whatever their shape (Foundation's splitting traps on `s` and `s/`).
@Suite(.timeLimit(.minutes(5)))
struct PathTextTests {
    @Test(arguments: [
        ("/a/b", "/a", "b"), ("/a", "/", "a"), ("a", ".", "a"), ("s", ".", "s"), ("s/", ".", "s"), ("a/b/", "a", "b"),
        ("a//b", "a", "b"), ("/", "/", "/"), ("//a", "/", "a"), ("", ".", ""), (".", ".", "."), ("./s", ".", "s"),
    ])
    func parentAndLastComponent(path: String, parent: String, last: String) {
        #expect(PathText.parent(of: path) == parent)
        #expect(PathText.lastComponent(of: path) == last)
    }

    /// A relative path from the command line is kept as the working directory's.
    @Test(arguments: [
        ("/srv/plugins", "/srv/plugins"), ("build", "/home/me/build"), ("./build", "/home/me/build"), ("././b/", "/home/me/b/"),
        (".", "/home/me"), ("./", "/home/me"), ("../x", "/home/me/../x"),
    ])
    func absolute(path: String, expected: String) {
        #expect(PathText.absolute(path, in: "/home/me") == expected)
        #expect(PathText.absolute(path, in: "/home/me/") == expected)
    }
}
