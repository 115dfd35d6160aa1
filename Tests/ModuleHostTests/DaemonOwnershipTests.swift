import Foundation
import Glibc
import Testing
import TestSupport

/// What modhostd owns and follows: its state directory and control socket (taken before any
/// plugin code runs), the listener modhostctl trusts, and plugin directories that vanish,
/// come back or appear late.
@Suite(.timeLimit(.minutes(5)), .serialized) struct DaemonOwnershipTests {
    typealias Harness = DaemonLifecycleTests.Harness

    /// A C plugin whose entry point (its first code to run) drops `marker-<pid>` into
    /// `markers`, so a test can tell which process ran it.
    func markerPlugin(in directory: String, markers: String) throws -> String {
        try PluginFactory(directory: directory).buildC(
            "Marker", source: PluginFactory.cSource(
                plugin: "Marker", modules: ["marker"],
                entryBody: """
                    char path[512]; snprintf(path, sizeof path, "\(markers)/marker-%d", (int)getpid());
                    FILE *file = fopen(path, "w"); if (file) fclose(file);
                    return &plugin;
                    """,
                extra: "#include <unistd.h>"),
            manifest: PluginFactory.manifest(plugin: "Marker", modules: ["marker"]))
    }

    func markers(_ directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter { $0.hasPrefix("marker-") }.sorted()
    }

    @Test(arguments: ["state directory", "state directory, its lock file deleted", "socket"])
    func aSecondDaemonExits71BeforeRunningAnyPluginCode(shared: String) async throws {
        let scratch = TemporaryDirectory("marker")
        let marks = scratch.directory("marks")
        let plugin = try markerPlugin(in: scratch.path, markers: marks)
        let h = try Harness(["Counter"])
        try h.drop(plugin, as: "libMarker.so")
        #expect(await h.waitFor("loaded plugin Marker"))
        #expect(markers(marks) == ["marker-\(h.daemon.pid)"])

        // Same plugins; shares either the state directory or the socket with the first.
        let other = TemporaryDirectory("second")
        let state = shared.hasPrefix("state directory") ? h.state : other.file("state")
        let socket = shared == "socket" ? h.socket : other.file("modhostd.sock")
        // An operator who takes the lock file for a stale one does not let a second daemon in.
        if shared.hasSuffix("deleted") { #expect(unlink(h.state + "/modhostd.lock") == 0) }
        let second = try RunningProcess(BuildProducts.modhostd, ["--plugins", h.plugins, "--state-dir", state, "--socket", socket])
        #expect(await second.wait(timeout: .seconds(20)) == 71)
        let log = second.text
        #expect(log.contains("another modhostd"), "\(log)")
        #expect(log.contains(shared.hasPrefix("state directory") ? h.state : h.socket), "\(log)")
        #expect(log.split(separator: "\n").count == 1, "one clear line: \(log)")
        // The second daemon ran no plugin code, and the first still serves.
        #expect(markers(marks) == ["marker-\(h.daemon.pid)"])
        #expect(try h.ctl("status").status == 0)
        #expect(await h.stop() == 0)
    }

    /// Outside attack (operator): a lock held by a process that outlived the daemon which
    /// took it was reported as "another modhostd (pid N)", N long gone; a symlinked lock
    /// file gave "Too many levels of symbolic links" with no fix.
    @Test func aLockTheDaemonCannotTakeIsExplainedWithAFix() async throws {
        let scratch = TemporaryDirectory("lock-held")
        let state = scratch.directory("state")
        chmod(state, 0o700)
        // A pid that is no process: the daemon that took the lock has ended.
        try scratch.write("state/modhostd.lock", text: "2147483646\n")
        // This process holds the lock, as a process that inherited it would.
        let holder = open(state, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        #expect(holder >= 0 && flock(holder, LOCK_EX | LOCK_NB) == 0)
        let arguments = ["--plugins", scratch.directory("plugins"), "--state-dir", state, "--socket", scratch.file("sock")]
        let first = try RunningProcess(BuildProducts.modhostd, arguments)
        #expect(await first.wait(timeout: .seconds(20)) == 71)
        #expect(first.text.contains("is locked by a process that inherited the lock of modhostd (pid 2147483646, which is no longer running)"), "\(first.text)")
        #expect(first.text.contains("Fix: find that process with `fuser -v \(state)/modhostd.lock` and stop it"), "\(first.text)")
        close(holder)

        unlink(state + "/modhostd.lock")
        #expect(symlink(scratch.file("elsewhere"), state + "/modhostd.lock") == 0)
        let second = try RunningProcess(BuildProducts.modhostd, arguments)
        #expect(await second.wait(timeout: .seconds(20)) == 71)
        #expect(second.text.contains("\(state)/modhostd.lock is a symlink. Fix: remove it"), "\(second.text)")
        #expect(!FileManager.default.fileExists(atPath: scratch.file("elsewhere")))
    }

    /// A state directory inside another daemon's (its images) is refused before anything
    /// is created there: that daemon would take its files for leftovers of its own.
    @Test func aStateDirectoryInsideAnotherDaemonsIsRefused() async throws {
        let h = try Harness(["Counter"])
        #expect(await h.waitFor("started 1 module: counter"))
        let other = TemporaryDirectory("nested-state")
        let nested = h.state + "/images/nested/state"
        let second = try RunningProcess(BuildProducts.modhostd, ["--plugins", h.plugins, "--state-dir", nested, "--socket", other.file("s.sock")])
        #expect(await second.wait(timeout: .seconds(20)) == 71)
        #expect(second.text.contains("the state directory \(nested) lies in \(h.state)/images, the private plugin copies of the modhostd whose state directory is \(h.state)"), "\(second.text)")
        // The same through a link to it.
        let link = other.file("link")
        #expect(symlink(h.state + "/images", link) == 0)
        let linked = try RunningProcess(BuildProducts.modhostd, ["--plugins", h.plugins, "--state-dir", link + "/new/state", "--socket", other.file("s.sock")])
        #expect(await linked.wait(timeout: .seconds(20)) == 71)
        #expect(linked.text.contains("lies in \(h.state)/images, the private plugin copies"), "\(linked.text)")
        #expect(!FileManager.default.fileExists(atPath: h.state + "/images/nested"))
        #expect(try h.ctl("status").status == 0)
        #expect(await h.stop() == 0)
    }

    /// The state directory cases the daemon refuses: another user's, one anyone may write
    /// (not silently made private), and an `images` that is a symlink, to a directory of
    /// another user or to one of ours.
    enum UnsafeState: String, CaseIterable, Sendable {
        case ownedByNobody, worldWritable, imagesLinkInWorldWritable, imagesLinkToNobody
    }

    @Test(.enabled(if: getuid() == 0, "giving a directory to another user needs root (CI runs as root)"),
          arguments: UnsafeState.allCases)
    func anUnsafeStateDirectoryExits71BeforeWritingOrRunningAnything(_ unsafe: UnsafeState) async throws {
        let scratch = TemporaryDirectory("unsafe-state")
        let marks = scratch.directory("marks")
        let plugins = scratch.directory("plugins")
        try FileManager.default.copyItem(atPath: try markerPlugin(in: scratch.path, markers: marks), toPath: plugins + "/libMarker.so")
        let state = scratch.file("state")
        #expect(mkdir(state, 0o700) == 0)
        let evil = scratch.directory("evil")
        chown(evil, 65534, 65534)
        var culprit = state
        switch unsafe {
        case .ownedByNobody:
            chown(state, 65534, 65534)
        case .worldWritable:
            chmod(state, 0o1777)
        case .imagesLinkInWorldWritable:
            chmod(state, 0o1777)
            #expect(symlink(evil, state + "/images") == 0)
        case .imagesLinkToNobody:
            #expect(symlink(evil, state + "/images") == 0)
            culprit = state + "/images"
        }
        let before = try FileManager.default.contentsOfDirectory(atPath: state).sorted()
        var info = stat()
        lstat(state, &info)
        let mode = info.st_mode & 0o7777

        let daemon = try RunningProcess(BuildProducts.modhostd, ["--plugins", plugins, "--state-dir", state, "--socket", scratch.file("modhostd.sock")])
        #expect(await daemon.wait(timeout: .seconds(20)) == 71)
        let log = daemon.text
        #expect(log.split(separator: "\n").count == 1, "one clear line: \(log)")
        let problem = switch unsafe {
        case .ownedByNobody: "it is owned by uid 65534, not uid 0"
        case .worldWritable, .imagesLinkInWorldWritable: "its mode 1777 gives group or others write access"
        case .imagesLinkToNobody: "it is not a directory (a symlink or another file)"
        }
        #expect(log.contains("state directory"), "\(log)")
        #expect(log.contains("\(culprit) ") && log.contains(problem) && log.contains("Fix:"), "\(log)")
        // Nothing ran, nothing was written or changed, there or through the link.
        #expect(markers(marks).isEmpty)
        #expect(try FileManager.default.contentsOfDirectory(atPath: state).sorted() == before)
        #expect(try FileManager.default.contentsOfDirectory(atPath: evil).isEmpty)
        lstat(state, &info)
        #expect(info.st_mode & 0o7777 == mode, "the daemon changed the mode of \(state)")
    }

    @Test func theControlSocketIsBoundBeforeAnyPluginCodeRuns() async throws {
        let scratch = TemporaryDirectory("gate")
        let gate = scratch.file("open")
        let root = TemporaryDirectory("gated")
        let plugins = root.directory("plugins")
        // Its entry point waits until the test opens the gate.
        try PluginFactory(directory: plugins).buildC(
            "Gated", source: PluginFactory.cSource(
                plugin: "Gated", modules: ["gated"],
                entryBody: "while (access(\"\(gate)\", F_OK) != 0) usleep(10000); return &plugin;",
                extra: "#include <unistd.h>"),
            manifest: PluginFactory.manifest(plugin: "Gated", modules: ["gated"]))
        let socket = root.file("modhostd.sock")
        let daemon = try RunningProcess(BuildProducts.modhostd, ["--plugins", plugins, "--state-dir", root.file("state"), "--socket", socket])
        #expect(await daemon.waitFor("control socket listening"))
        // The plugin is still held at its entry point, and the socket already answers.
        let raw = try RawConnection(socket)
        raw.send("{\"v\":1,\"id\":1,\"cmd\":\"ping\"}\n")
        let (lines, _) = raw.readLines(1)
        #expect(lines.first?.contains("\"ok\":true") == true, "\(lines)")
        #expect(!daemon.text.contains("started"))
        #expect(FileManager.default.createFile(atPath: gate, contents: nil))
        #expect(await daemon.waitFor("started 1 module"))
        let status = try run(BuildProducts.modhostctl, ["--socket", socket, "status", "--json"])
        let reply = try JSONSerialization.jsonObject(with: Data(status.standardOutput.utf8)) as? [String: Any]
        #expect(reply?["ready"] as? Bool == true, "\(status)")
        daemon.send(SIGTERM)
        #expect(await daemon.wait() == 0)
    }

    @Test(.enabled(if: getuid() == 0, "a listener of another user needs root to switch users (CI runs as root)"))
    func modhostctlRefusesAListenerOfAnotherUser() async throws {
        let tools = try ToolsForAnotherUser()
        // Another user's listener at a path a client was pointed at (modhostd itself refuses
        // a socket in a directory others may write, so the impostor binds in its own).
        let shared = TemporaryDirectory("shared")
        chmod(shared.path, 0o755)
        let impostorHome = shared.directory("impostor")
        chown(impostorHome, 65534, 65534)
        let socket = impostorHome + "/modhostd.sock"
        let impostor = try RunningProcess("/usr/bin/setpriv", [
            "--reuid=65534", "--regid=65534", "--clear-groups", tools.modhostd,
            "--plugins", impostorHome, "--state-dir", impostorHome + "/state", "--socket", socket,
        ], environment: ["XDG_CONFIG_HOME": "/nonexistent", "HOME": impostorHome])
        #expect(await impostor.waitFor("control socket ready"), "\(impostor.text)")
        chmod(socket, 0o666)  // let anyone connect: only the credentials may refuse it
        let result = try run(BuildProducts.modhostctl, ["--socket", socket, "status"])
        #expect(result.status == 77, "\(result)")
        #expect(result.standardError.contains("runs as uid 65534"), "\(result.standardError)")
        #expect(result.standardError.contains(socket))
        #expect(!result.standardOutput.contains("pid:"), "the impostor's reply was printed")
        impostor.send(SIGTERM)
        _ = await impostor.wait()
    }

    @Test func aRecreatedPluginDirectoryIsWatchedAgain() async throws {
        let h = try Harness(["Greeting"])
        #expect(await h.waitFor("control socket ready"))
        // `rm -rf dir; mkdir dir` at once, then a drop.
        try FileManager.default.removeItem(atPath: h.plugins)
        #expect(mkdir(h.plugins, 0o755) == 0)
        try h.drop(BuildProducts.plugin("Counter"), as: "libCounter.so")
        #expect(await h.waitFor("loaded plugin Counter"))
        #expect(h.daemon.text.contains("plugin directory \(h.plugins) disappeared"))
        // And once more, after the daemon has noticed.
        try FileManager.default.removeItem(atPath: h.plugins)
        #expect(await h.waitFor("removed plugin Counter"))
        #expect(mkdir(h.plugins, 0o755) == 0)
        try h.drop(BuildProducts.plugin("Greeting"), as: "libGreeting.so")
        #expect(await h.waitFor("loaded plugin Greeting 1.0.0 (generation 2)"))
        #expect(try h.modules()["greeting"]?["state"] as? String == "running")
        #expect(await h.stop() == 0)
    }

    @Test func aPluginDirectoryCreatedAfterStartIsWatched() async throws {
        let other = TemporaryDirectory("late")
        let late = other.file("later/plugins")
        let h = try Harness(["Greeting"], arguments: ["--plugins", late])
        #expect(await h.waitFor("control socket ready"))
        try FileManager.default.createDirectory(atPath: late, withIntermediateDirectories: true)
        chmod(other.file("later"), 0o755)
        chmod(late, 0o755)
        try FileManager.default.copyItem(atPath: BuildProducts.plugin("Counter"), toPath: late + "/libCounter.so")
        chmod(late + "/libCounter.so", 0o644)
        #expect(await h.waitFor("loaded plugin Counter"))
        #expect(await h.stop() == 0)
    }

    /// Outside run: a plugin directory given as a symlink to a directory kept its plugins
    /// listed, running, after the link was removed: the watch followed the link to its
    /// target, which did not change. The link's own directory is watched for it now.
    @Test func aPluginDirectoryThatIsASymlinkIsGoneOnceTheLinkIsRemoved() async throws {
        let other = TemporaryDirectory("linked")
        let real = other.directory("real")
        chmod(real, 0o755)
        try FileManager.default.copyItem(atPath: BuildProducts.plugin("Counter"), toPath: real + "/libCounter.so")
        chmod(real + "/libCounter.so", 0o644)
        let link = other.file("link")
        #expect(symlink(real, link) == 0)
        let h = try Harness(["Greeting"], arguments: ["--plugins", link])
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        #expect(try h.modules()["counter"]?["state"] as? String == "running", "\(h.daemon.text)")
        #expect(unlink(link) == 0)
        #expect(try await DaemonLifecycleTests().eventually { try h.modules()["counter"] == nil }, "\(h.daemon.text)")
        #expect(h.daemon.text.contains("plugin directory \(link) disappeared"), "\(h.daemon.text)")
        #expect(try h.modules()["greeting"]?["state"] as? String == "running")
        // A link made again (to the same directory) brings the plugin back.
        #expect(symlink(real, link) == 0)
        #expect(try await DaemonLifecycleTests().eventually { try h.modules()["counter"]?["state"] as? String == "running" }, "\(h.daemon.text)")
        #expect(await h.stop() == 0)
    }

    @Test func aDanglingSymlinkIsRefusedByName() async throws {
        let h = try Harness(["Counter"])
        #expect(await h.waitFor("control socket ready"))
        let link = h.plugins + "/libGhost.so"
        #expect(symlink(h.root.file("nowhere/libGhost.so"), link) == 0)
        #expect(await h.waitFor("refused \(link): location check failed: symlink leads nowhere (to \(h.root.file("nowhere/libGhost.so")))"))
        #expect(try h.modules()[link]?["state"] as? String == "refused")
        #expect(try h.modules()["counter"]?["state"] as? String == "running")
        #expect(await h.stop() == 0)
    }

    /// A symlink that leads back to itself is refused as a loop, not as leading nowhere; one
    /// to the plugin directory itself as a directory, not as leading out of it.
    @Test func aSymlinkLoopIsRefusedAsALoop() throws {
        let dir = TemporaryDirectory("symlink-loop")
        let plugins = dir.directory("plugins")
        #expect(symlink("libLoop.so", plugins + "/libLoop.so") == 0)
        let verify = try run(BuildProducts.modhostctl, ["verify", plugins])
        #expect(verify.status == 1)
        #expect(verify.standardOutput.contains("\(plugins)/libLoop.so: location check failed: symlinks lead in a loop, or through more than 40 links (to libLoop.so). Fix: point the symlink at an existing plugin file or remove it"),
                "\(verify.standardOutput)")
        // A link to the directory itself is a directory, not a way out of it.
        #expect(symlink(".", plugins + "/libDot.so") == 0)
        let dot = try run(BuildProducts.modhostctl, ["verify", plugins])
        #expect(dot.standardOutput.contains("\(plugins)/libDot.so: file type check failed: not a regular file (a directory)"), "\(dot.standardOutput)")
    }

    /// C plugins A <- B (B depends on A).
    func chain(in directory: String) throws {
        let factory = PluginFactory(directory: directory)
        try factory.buildC("A", source: PluginFactory.cSource(plugin: "A", modules: ["a"]),
                           manifest: PluginFactory.manifest(plugin: "A", modules: ["a"]))
        try factory.buildC("B", source: PluginFactory.cSource(plugin: "B", modules: ["b"]),
                           manifest: PluginFactory.manifest(plugin: "B", modules: ["b"], dependencies: ["A"]), flags: "-lA")
    }

    @Test func aDependentWhoseDependencyIsStillArrivingIsNotReportedAsRefused() async throws {
        let scratch = TemporaryDirectory("chain")
        try chain(in: scratch.path)
        let h = try Harness(["Counter"])
        #expect(await h.waitFor("control socket ready"))
        // A is copied slowly (a plain copy, first half, then the rest); B arrives complete
        // meanwhile, so the daemon sees B while A is still being written.
        let a = try [UInt8](Data(contentsOf: URL(fileURLWithPath: scratch.file("libA.so"))))
        let target = h.plugins + "/libA.so"
        let fd = open(target, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        #expect(fd >= 0)
        _ = a.withUnsafeBytes { write(fd, $0.baseAddress, a.count / 2) }
        try h.drop(scratch.file("libB.so"), as: "libB.so")
        var states: Set<String> = []
        for _ in 0..<10 {
            states.formUnion(try h.modules().filter { ($0.value["file"] as? String)?.hasSuffix("libB.so") == true }
                .compactMap { $0.value["state"] as? String })
            try await Task.sleep(for: .milliseconds(20))
        }
        _ = a.withUnsafeBytes { write(fd, $0.baseAddress! + a.count / 2, a.count - a.count / 2) }
        close(fd)
        #expect(await h.waitFor("loaded plugin B"))
        #expect(try h.modules()["b"]?["state"] as? String == "running")
        #expect(states.isSubset(of: ["waiting-for-dependency", "loading"]), "\(states)")
        #expect(!h.daemon.text.contains("refused \(h.plugins)/libB.so"), "\(h.daemon.text)")
        #expect(await h.stop() == 0)
    }

    @Test func aReallyMissingDependencyIsStillReported() async throws {
        let scratch = TemporaryDirectory("chain")
        try chain(in: scratch.path)
        let h = try Harness(["Counter"])
        #expect(await h.waitFor("control socket ready"))
        try h.drop(scratch.file("libB.so"), as: "libB.so")
        #expect(await h.waitFor("waiting-for-dependency \(h.plugins)/libB.so: dependency check failed: plugin B needs A"))
        #expect(try h.modules()[h.plugins + "/libB.so"]?["state"] as? String == "waiting-for-dependency")
        try h.drop(scratch.file("libA.so"), as: "libA.so")
        #expect(await h.waitFor("loaded plugin B"))
        #expect(await h.stop() == 0)
    }
}
