import DaemonKit
import Foundation
import Glibc
@testable import ModuleHost
import ModuleKit
import Testing
import TestSupport

/// Plugins that misbehave outside the calls the daemon makes: they fork when loaded, call
/// exit(), crash in a thread of their own, or kill the process outright. Each test checks
/// what an operator sees: the daemon's exit status, the log line naming the plugin, the
/// quarantine at the next start, and the other plugins still running.
@Suite(.timeLimit(.minutes(5)), .serialized) struct CrashAttributionTests {
    /// A C plugin with one module named like the plugin in lower case; `handleBody` is the
    /// body of `handle_event(void *raw, const char *event, const char *payload)` (it may use
    /// `self->host`), `extra` goes before it (includes, statics, constructors).
    static func plugin(_ name: String, in directory: String, handleBody: String = "", extra: String = "") throws -> String {
        let module = name.lowercased()
        let source = """
            #define _GNU_SOURCE
            #include <modulehost.h>
            #include <pthread.h>
            #include <signal.h>
            #include <stdio.h>
            #include <stdlib.h>
            #include <string.h>
            #include <unistd.h>
            typedef struct { const modhost_host_api *host; } instance;
            \(extra)
            static void *create(const modhost_host_api *host, const char *config) {
                (void)config; instance *self = malloc(sizeof *self); self->host = host; return self;
            }
            static void handle(void *raw, const char *event, const char *payload) {
                instance *self = raw; (void)self; (void)payload;
                \(handleBody)
            }
            static void destroy(void *raw) { free(raw); }
            static const modhost_module modules[] = {
                {.struct_size = sizeof(modhost_module), .kind = MODHOST_MODULE_C, .name = "\(module)", .version = "1.0",
                 .create = create, .handle_event = handle, .destroy = destroy},
            };
            static const modhost_plugin plugin = {sizeof(modhost_plugin), MODHOST_ABI_MAJOR, MODHOST_ABI_MINOR, 1, "\(name)", modules};
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """
        return try PluginFactory(directory: directory).buildC(
            name, source: source, manifest: PluginFactory.manifest(plugin: name, modules: [module]), flags: "-pthread")
    }

    /// A daemon run on fixed directories, so that a second start sees what the first left.
    struct Setup {
        let scratch = TemporaryDirectory("crash-attr")
        var plugins: String { scratch.file("plugins") }
        var state: String { scratch.file("state") }
        var socket: String { scratch.file("sock") }
        var arguments: [String] {
            ["--plugins", plugins, "--state-dir", state, "--socket", socket] + (hasConfig ? ["--config", scratch.file("modhostd.json")] : [])
        }
        let hasConfig: Bool

        init(_ examples: [String] = ["Counter"], config: String? = nil) throws {
            _ = scratch.directory("plugins")
            for name in examples { try scratch.copy(BuildProducts.plugin(name), as: "plugins/lib\(name).so") }
            hasConfig = config != nil
            if let config { try scratch.write("modhostd.json", text: config) }
        }

        func start() throws -> RunningProcess { try RunningProcess(BuildProducts.modhostd, arguments) }

        func ctl(_ arguments: String...) throws -> ProcessResult {
            try run(BuildProducts.modhostctl, ["--socket", socket] + arguments)
        }

        /// The row `modhostctl list --json` shows for the file `lib<name>.so`.
        func row(ofFile name: String) throws -> [String: Any]? {
            let reply = try JSONSerialization.jsonObject(with: Data(try ctl("list", "--json").standardOutput.utf8)) as? [String: Any]
            return (reply?["modules"] as? [[String: Any]])?.first { $0["file"] as? String == plugins + "/lib\(name).so" }
        }

        /// Starts again after a death attributed to `plugin`: it must be quarantined with
        /// `reason` in the log and the list, and Counter must run.
        func restartQuarantining(_ plugin: String, reason: String) async throws {
            let again = try start()
            #expect(await again.waitFor("control socket ready", timeout: .seconds(60)))
            #expect(again.text.contains("plugin \(plugin) \(reason)"), "log: \(again.text)")
            // What is refused is that content: the file may hold another build by now.
            #expect(again.text.contains("(file \(plugins)/lib\(plugin).so); a file with that content (hash "), "log: \(again.text)")
            let row = try self.row(ofFile: plugin)
            #expect(row?["state"] as? String == "quarantined")
            let lastError = row?["lastError"] as? String ?? ""
            #expect(lastError.contains(reason), "row: \(String(describing: row))")
            let listed = try ctl("list").standardOutput
            let counterRuns = listed.split(separator: "\n").contains { $0.contains("counter") && $0.contains("running") }
            #expect(counterRuns, "list: \(listed)")
            again.send(SIGTERM)
            #expect(await again.wait() == 0)
        }
    }

    /// True once no process has `pid` (or it is a zombie waiting for its parent).
    static func isGone(_ pid: pid_t) -> Bool {
        if kill(pid, 0) != 0 { return true }
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return true }
        return stat[stat.index(close, offsetBy: 2)] == "Z"
    }

    func eventually(_ condition: () throws -> Bool) async rethrows -> Bool {
        for _ in 0..<600 {
            if try condition() { return true }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return false
    }

    // MARK: - Finding 6: trial loads bounded by time, not by a pipe

    /// A constructor that starts a process which outlives the load (`daemonize`: in a new
    /// session, as daemons detach), which writes its pid to `pidFile`; the constructor
    /// returns once that file exists.
    static func forker(_ name: String, in directory: String, pidFile: String, daemonize: Bool) throws -> String {
        let detach = daemonize ? "if (setsid() < 0 || fork() != 0) _exit(0);" : ""
        return try plugin(name, in: directory, extra: """
            __attribute__((constructor)) static void spawn(void) {
                if (fork() == 0) {
                    \(detach)
                    FILE *out = fopen("\(pidFile).tmp", "w");
                    if (out) { fprintf(out, "%d", (int)getpid()); fclose(out); rename("\(pidFile).tmp", "\(pidFile)"); }
                    sleep(3600);
                    _exit(0);
                }
                for (int i = 0; i < 20000 && access("\(pidFile)", F_OK) != 0; i++) usleep(1000);
            }
            """)
    }

    @Test(arguments: [false, true])
    func aPluginThatForksWhenLoadedIsRefusedAndBlocksNothing(daemonize: Bool) async throws {
        let h = try DaemonLifecycleTests.Harness(["Counter"])
        #expect(await h.waitFor("control socket ready"))
        let scratch = TemporaryDirectory("forker")
        let pidFile = scratch.file("grandchild.pid")
        try h.drop(try Self.forker("Forker", in: scratch.path, pidFile: pidFile, daemonize: daemonize), as: "libForker.so")
        try h.drop(BuildProducts.plugin("Calculator"), as: "libCalculator.so")
        // Refused, saying why, well before the 10 s trial deadline; the next file loads.
        #expect(await h.daemon.waitFor("refused \(h.plugins)/libForker.so", timeout: .seconds(9)))
        #expect(h.daemon.text.contains("started a process that outlived the load"), "log: \(h.daemon.text)")
        #expect(h.daemon.text.contains("Fix: start helper processes from the module's init or start"), "log: \(h.daemon.text)")
        #expect(await h.waitFor("loaded plugin Calculator"))
        // No process is left behind.
        #expect(await eventually { FileManager.default.fileExists(atPath: pidFile) })
        let pid = pid_t(try String(contentsOfFile: pidFile, encoding: .utf8)) ?? 0
        #expect(pid > 0)
        #expect(await eventually { Self.isGone(pid) })
        if !Self.isGone(pid) { kill(pid, SIGKILL) }
        #expect(try h.modules()["calculator"]?["state"] as? String == "running")
        let status = await h.stop()
        #expect(status == 0, "log: \(h.daemon.text)")
    }

    /// Found by an outside run: a worker's `kill(getppid(), SIGSEGV)` (or anyone's `kill
    /// -SEGV`) made the daemon print a crash backtrace and go on, without its fatal-signal
    /// recorder from then on. A fatal signal sent from outside ends the daemon by that
    /// signal, as docs/daemon.md says, blames no plugin, and the next start loads them all.
    @Test func aFatalSignalSentFromOutsideEndsTheDaemonAndBlamesNoPlugin() async throws {
        let setup = try Setup()
        let daemon = try setup.start()
        #expect(await daemon.waitFor("control socket ready", timeout: .seconds(60)))
        daemon.send(SIGSEGV)
        #expect(await daemon.wait(timeout: .seconds(10)) == 128 + SIGSEGV, "\(daemon.text)")
        #expect(!daemon.text.contains("Program crashed"), "\(daemon.text)")
        let again = try setup.start()
        #expect(await again.waitFor("control socket ready", timeout: .seconds(60)))
        #expect(!again.text.contains("quarantined"), "\(again.text)")
        #expect(try setup.row(ofFile: "Counter")?["state"] as? String == "running")
        again.send(SIGTERM)
        #expect(await again.wait() == 0)
    }

    /// Found by an outside run: after `kill -9` of the daemon, its workers die (by
    /// PR_SET_PDEATHSIG), but a child a plugin forked out of its worker's process group
    /// stayed, an orphan. It runs in its worker's PID namespace, which ends with the
    /// worker: it is gone before the next start, which has nothing left to kill.
    @Test(.timeLimit(.minutes(3)))
    func whatAKilledDaemonsWorkersForkedEndsWithThem() async throws {
        let scratch = TemporaryDirectory("leftover-groups")
        let pidFile = scratch.file("child.pid")
        let forker = try Self.plugin("Forker", in: scratch.directory("forker"), extra: """
            #include <sys/stat.h>
            __attribute__((constructor)) static void spawn(void) {
                struct stat status;
                if (fstat(3, &status) != 0 || !S_ISSOCK(status.st_mode)) return;  /* only in its worker */
                /* Only in the first daemon's worker. */
                if (access("\(pidFile)", F_OK) == 0) return;
                if (fork() == 0) {
                    /* Out of the worker's group, which the worker kills when its socket
                     * closes; its pid as the daemon sees it (getpid() counts in the
                     * worker's namespace). */
                    setpgid(0, 0);
                    char self[32] = {0};
                    if (readlink("/proc/self", self, sizeof self - 1) < 0) _exit(1);
                    FILE *out = fopen("\(pidFile).tmp", "w");
                    if (out) { fputs(self, out); fclose(out); rename("\(pidFile).tmp", "\(pidFile)"); }
                    for (;;) pause();
                }
            }
            """)
        let setup = try Setup(config: #"{"plugins": {"Forker": {"isolation": "process"}}}"#)
        try setup.scratch.copy(forker, as: "plugins/libForker.so")
        let first = try setup.start()
        #expect(await first.waitFor("control socket ready", timeout: .seconds(60)), "\(first.text)")
        #expect(await eventually { FileManager.default.fileExists(atPath: pidFile) })
        let child = pid_t(try String(contentsOfFile: pidFile, encoding: .utf8)) ?? 0
        try #require(child > 0)
        defer { kill(child, SIGKILL) }
        #expect(!Self.isGone(child))
        first.send(SIGKILL)
        _ = await first.wait()
        #expect(await eventually { Self.isGone(child) }, "process \(child), which the plugin forked, outlived the daemon")
        let again = try setup.start()
        #expect(await again.waitFor("control socket ready", timeout: .seconds(60)), "\(again.text)")
        #expect(!again.text.contains("processes left by plugin Forker's worker"), "\(again.text)")
        again.send(SIGTERM)
        #expect(await again.wait() == 0)
    }

    // MARK: - Finding 9: exit() from plugin code

    @Test func aPluginCallingExitInInitEndsTheDaemonWithAFailureAndIsQuarantined() async throws {
        let setup = try Setup()
        _ = try Self.plugin("Quitter", in: setup.plugins, handleBody: #"if (strcmp(event, "init") == 0) exit(0);"#)
        let first = try setup.start()
        #expect(await first.wait(timeout: .seconds(60)) == 70)
        #expect(first.text.contains("plugin Quitter called exit(0)"), "log: \(first.text)")
        try await setup.restartQuarantining("Quitter", reason: "ended the host process by calling exit(0)")
    }

    @Test func aPluginCallingExitInAnEventHandlerEndsTheDaemonWithAFailureAndIsQuarantined() async throws {
        let setup = try Setup()
        _ = try Self.plugin("Leaver", in: setup.plugins, handleBody: #"if (strcmp(event, "leave") == 0) exit(0);"#)
        let first = try setup.start()
        #expect(await first.waitFor("control socket ready", timeout: .seconds(60)))
        _ = try setup.ctl("send", "leave", "--to", "leaver")
        #expect(await first.wait(timeout: .seconds(60)) == 70)
        #expect(first.text.contains("plugin Leaver called exit(0)"), "log: \(first.text)")
        try await setup.restartQuarantining("Leaver", reason: "ended the host process by calling exit(0)")
    }

    // MARK: - A child process that plugin code forks

    /// A plugin whose module, on the event `spawn`, forks a child that writes its pid to
    /// `pidFile`, then runs `child` (and waits for a signal).
    static func spawner(_ name: String, in directory: String, pidFile: String, child: String = "") throws -> String {
        try plugin(name, in: directory, handleBody: """
            if (strcmp(event, "spawn") == 0 && fork() == 0) {
                FILE *out = fopen("\(pidFile).tmp", "w");
                if (out) { fprintf(out, "%d", (int)getpid()); fclose(out); rename("\(pidFile).tmp", "\(pidFile)"); }
                \(child)
                for (;;) pause();
            }
            """)
    }

    /// The pid the child wrote; fails the test (never 0 or less, which `kill` would take
    /// for a process group, this one's) when it did not.
    func childPID(_ pidFile: String) async throws -> pid_t {
        #expect(await eventually { FileManager.default.fileExists(atPath: pidFile) })
        let pid = pid_t((try? String(contentsOfFile: pidFile, encoding: .utf8)) ?? "") ?? 0
        return try #require(pid > 0 ? pid : nil, "no child pid in \(pidFile)")
    }

    /// Outside attack (operator): a child forked by plugin code kept the state directory's
    /// and the socket's locks after the daemon ended (the next start exited 71, naming the
    /// daemon's pid, long gone), and its SIGTERM went to the daemon's signal handler: the
    /// child ignored it, and the daemon took it for its own.
    @Test(.timeLimit(.minutes(3)))
    func aChildThatPluginCodeForksKeepsNoLockAndDiesBySIGTERM() async throws {
        let setup = try Setup()
        let pidFile = setup.scratch.file("child.pid")
        _ = try Self.spawner("Spawner", in: setup.plugins, pidFile: pidFile)
        let first = try setup.start()
        #expect(await first.waitFor("control socket ready", timeout: .seconds(60)))
        _ = try setup.ctl("send", "spawn", "--to", "spawner")
        let child = try await childPID(pidFile)
        defer { kill(child, SIGKILL) }
        // SIGTERM to the child ends the child, not the daemon.
        kill(child, SIGTERM)
        #expect(await eventually { Self.isGone(child) }, "the child ignored SIGTERM")
        #expect(try setup.ctl("status").status == 0, "log: \(first.text)")
        #expect(!first.text.contains("SIGTERM received"), "log: \(first.text)")
        // A child still running when the daemon ends holds none of its locks.
        unlink(pidFile)
        _ = try setup.ctl("send", "spawn", "--to", "spawner")
        let second = try await childPID(pidFile)
        defer { kill(second, SIGKILL) }
        first.send(SIGTERM)
        // (RunningProcess sees the daemon's end only once no process holds its output: the
        // children are killed before `wait`.)
        #expect(await eventually { Self.isGone(first.pid) })
        #expect(!Self.isGone(second))
        let again = try setup.start()
        #expect(await again.waitFor("control socket ready", timeout: .seconds(60)), "log: \(again.text)")
        kill(child, SIGKILL)
        kill(second, SIGKILL)
        #expect(await first.wait(timeout: .seconds(60)) == 0)
        again.send(SIGTERM)
        #expect(await again.wait(timeout: .seconds(60)) == 0)
    }

    /// A child forked by plugin code that exits or crashes ended itself, not the daemon: it
    /// recorded a crash (or an exit) in the daemon's state directory, and the next start
    /// quarantined the plugin.
    @Test(.timeLimit(.minutes(3)), arguments: [("ExitingChild", "exit(0);"), ("CrashingChild", "volatile int *nowhere = 0; *nowhere = 1;")])
    func aChildThatPluginCodeForksMayExitOrCrashAlone(name: String, child: String) async throws {
        let setup = try Setup()
        let pidFile = setup.scratch.file("child.pid")
        _ = try Self.spawner(name, in: setup.plugins, pidFile: pidFile, child: child)
        let first = try setup.start()
        #expect(await first.waitFor("control socket ready", timeout: .seconds(60)))
        _ = try setup.ctl("send", "spawn", "--to", name.lowercased())
        let pid = try await childPID(pidFile)
        #expect(await eventually { Self.isGone(pid) })
        #expect(try setup.ctl("status").status == 0)
        first.send(SIGTERM)
        #expect(await first.wait(timeout: .seconds(60)) == 0)
        #expect(!first.text.contains("called exit"), "log: \(first.text)")
        let again = try setup.start()
        #expect(await again.waitFor("control socket ready", timeout: .seconds(60)))
        #expect(try setup.row(ofFile: name)?["state"] as? String == "running", "log: \(again.text)")
        again.send(SIGTERM)
        #expect(await again.wait(timeout: .seconds(60)) == 0)
    }

    // MARK: - The state directory's disk full, its records damaged

    /// Whether this process can mount a tmpfs (root, and a kernel that lets it).
    static let canMountTmpfs: Bool = {
        guard geteuid() == 0 else { return false }
        let scratch = TemporaryDirectory("mount-probe")
        let point = scratch.directory("point")
        guard (try? run("/bin/mount", ["-t", "tmpfs", "-o", "size=64k", "tmpfs", point]))?.status == 0 else { return false }
        _ = try? run("/bin/umount", [point])
        return true
    }()

    /// Fills the file system of `directory` with a file `filler` in it, until it is full.
    static func fill(_ directory: String) {
        let fd = open(directory + "/filler", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        defer { close(fd) }
        let block = [UInt8](repeating: 0x55, count: 4096)
        while block.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) > 0 {}
        _ = block.withUnsafeBytes { write(fd, $0.baseAddress, 1) }
    }

    /// Outside attack: with the state directory's disk full, a crash in a plugin's code
    /// left an empty fatal.json (an exit() from it, none), and the next start loaded the
    /// plugin again: under systemd's Restart=on-failure, a crash loop.
    @Test(.enabled(if: canMountTmpfs, "mounting a tmpfs needs root"), .timeLimit(.minutes(3)),
          arguments: [("FullBomb", #"volatile int *nowhere = 0; *nowhere = 1;"#, 128 + SIGSEGV, "crashed the host process with SIGSEGV in its code"),
                      ("FullLeaver", "exit(0);", 70, "ended the host process by calling exit(0)")])
    func aCrashWithTheStateDiskFullIsStillPinnedOnThePlugin(name: String, crash: String, status: Int32, reason: String) async throws {
        let setup = try Setup()
        _ = try Self.plugin(name, in: setup.plugins, handleBody: "if (strcmp(event, \"detonate\") == 0) { \(crash) }")
        let state = setup.scratch.directory("state")
        #expect(try run("/bin/mount", ["-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", state]).status == 0)
        defer { _ = try? run("/bin/umount", ["-l", state]) }
        let first = try setup.start()
        #expect(await first.waitFor("control socket ready", timeout: .seconds(60)))
        Self.fill(state)
        _ = try setup.ctl("send", "detonate", "--to", name.lowercased())
        #expect(await first.wait(timeout: .seconds(60)) == status, "log: \(first.text)")
        unlink(state + "/filler")
        try await setup.restartQuarantining(name, reason: reason)
    }

    /// Outside attack: with the state directory's disk full, a plugin was refused by the
    /// check "file type", with the fix "check the directory is writable". A plugin in
    /// process is loaded from a copy in memory and needs no room on disk; an isolated one's
    /// copy is a file its worker opens, refused with the fix.
    @Test(.enabled(if: canMountTmpfs, "mounting a tmpfs needs root"), .timeLimit(.minutes(3)))
    func aFullStateDiskRefusesThePrivateCopyAndSaysHowToRecover() async throws {
        let setup = try Setup(config: #"{"plugins": {"Counter": {"isolation": "process"}}}"#)
        let state = setup.scratch.directory("state")
        #expect(try run("/bin/mount", ["-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", state]).status == 0)
        defer { _ = try? run("/bin/umount", ["-l", state]) }
        Self.fill(state)
        let daemon = try setup.start()
        #expect(await daemon.waitFor("control socket ready", timeout: .seconds(60)))
        let row = try setup.row(ofFile: "Counter")
        let lastError = row?["lastError"] as? String ?? ""
        #expect(lastError.contains("private copy check failed: cannot write \(state)/images/Counter-1.1-"), "\(String(describing: row))")
        #expect(lastError.contains("No space left on device"), "\(lastError)")
        #expect(lastError.contains("Fix: free space in \(state)/images, then reload (modhostctl reload)"), "\(lastError)")
        // In process, with the disk still full, it loads.
        try setup.scratch.write("modhostd.json", text: "{}")
        #expect(try setup.ctl("reload").status == 0)
        #expect(try setup.row(ofFile: "Counter")?["state"] as? String == "running")
        try setup.scratch.write("modhostd.json", text: #"{"plugins": {"Counter": {"isolation": "process"}}}"#)
        unlink(state + "/filler")
        #expect(try setup.ctl("reload").status == 0)
        #expect(try setup.row(ofFile: "Counter")?["state"] as? String == "running")
        daemon.send(SIGTERM)
        #expect(await daemon.wait(timeout: .seconds(60)) == 0)
    }

    /// Outside attack: a damaged crashed.json (or fatal.json) lifted every quarantine with
    /// no word in the log. It still cannot be read, but it is said, and kept aside.
    @Test func aDamagedCrashRecordIsLoggedAndKeptAside() async throws {
        let setup = try Setup()
        _ = try Self.plugin("Killer", in: setup.plugins, handleBody: #"if (strcmp(event, "start") == 0) kill(getpid(), SIGKILL);"#)
        let first = try setup.start()
        #expect(await first.wait(timeout: .seconds(60)) == 128 + SIGKILL)
        // The next start records the crash in crashed.json; cut it short.
        try await setup.restartQuarantining("Killer", reason: "crashed the host process during start")
        let crashed = setup.state + "/crashed.json"
        let record = try #require(try? String(contentsOfFile: crashed, encoding: .utf8))
        try String(record.prefix(20)).write(toFile: crashed, atomically: false, encoding: .utf8)
        try "{\"file\": 7".write(toFile: setup.state + "/fatal.json", atomically: false, encoding: .utf8)
        // Killer's quarantine is lost with the record: it is loaded, and kills the daemon again.
        let again = try setup.start()
        #expect(await again.wait(timeout: .seconds(60)) == 128 + SIGKILL)
        #expect(again.text.contains("the crash guard's record \(crashed) cannot be read"), "log: \(again.text)")
        #expect(again.text.contains("it was moved to \(crashed).unreadable"), "log: \(again.text)")
        #expect(again.text.contains("the crash guard's record \(setup.state)/fatal.json cannot be read"), "log: \(again.text)")
        #expect((try? String(contentsOfFile: crashed + ".unreadable", encoding: .utf8)) == String(record.prefix(20)))
    }

    // MARK: - Finding 10: a crash in a thread a plugin started

    /// A plugin whose module starts a thread at create that waits for the event `detonate`,
    /// then runs `crash`.
    static func timeBomb(_ name: String, in directory: String, crash: String) throws -> String {
        try plugin(name, in: directory, handleBody: """
            if (strcmp(event, "detonate") == 0) { pthread_mutex_lock(&lock); armed = 1; pthread_cond_signal(&wake); pthread_mutex_unlock(&lock); }
            if (strcmp(event, "init") == 0) { pthread_t thread; pthread_create(&thread, NULL, bomb, NULL); pthread_detach(thread); }
            """, extra: """
            static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
            static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
            static int armed;
            __attribute__((noinline)) static void explode(void) { \(crash) }
            static void *bomb(void *unused) {
                (void)unused;
                pthread_mutex_lock(&lock);
                while (!armed) pthread_cond_wait(&wake, &lock);
                pthread_mutex_unlock(&lock);
                explode();
                return NULL;
            }
            """)
    }

    /// RaiseBomb: a plugin's `raise(SIGSEGV)` (found by a review: the Swift runtime's
    /// backtracer, handed a signal that was raised rather than a fault, printed a crash and
    /// let the daemon go on). RaiseAbortBomb and KillAbortBomb: a plugin's `raise(SIGABRT)`
    /// or `pthread_kill` of it (found from outside: the daemon went on, nothing recorded,
    /// as `abort()` alone ends the process once the handler returns).
    @Test(arguments: [("NullBomb", "volatile int *nowhere = 0; *nowhere = 1;", SIGSEGV, "SIGSEGV"),
                      ("AbortBomb", "abort();", SIGABRT, "SIGABRT"),
                      ("RaiseBomb", "raise(SIGSEGV);", SIGSEGV, "SIGSEGV"),
                      ("RaiseAbortBomb", "raise(SIGABRT);", SIGABRT, "SIGABRT"),
                      ("KillAbortBomb", "pthread_kill(pthread_self(), SIGABRT);", SIGABRT, "SIGABRT")])
    func aCrashInAPluginsOwnThreadIsAttributedAndQuarantined(name: String, crash: String, signal: Int32, signalName: String) async throws {
        let setup = try Setup()
        _ = try Self.timeBomb(name, in: setup.plugins, crash: crash)
        let first = try setup.start()
        #expect(await first.waitFor("control socket ready", timeout: .seconds(60)))
        _ = try setup.ctl("send", "detonate", "--to", name.lowercased())
        #expect(await first.wait(timeout: .seconds(60)) == 128 + signal)
        let record = (try? String(contentsOfFile: setup.state + "/fatal.json", encoding: .utf8)) ?? ""
        #expect(record.contains("\"plugin\":\"\(name)\""), "record: \(record)")
        try await setup.restartQuarantining(name, reason: "crashed the host process with \(signalName) in its code")
    }

    /// Outside attack: a handler that jumps through a bad pointer crashes with neither the
    /// instruction nor any return address in the plugin's code, so the crash was pinned on
    /// nothing and every start crashed again. The plugin the daemon was calling on that
    /// thread is the one.
    @Test func aJumpThroughABadPointerIsPinnedOnThePluginItCalled() async throws {
        let setup = try Setup()
        _ = try Self.plugin("Jumper", in: setup.plugins, handleBody: """
            if (strcmp(event, "jump") == 0) {
            #if defined(__x86_64__)
                __asm__ volatile("jmp *%0" : : "r"((unsigned long)0x1000));
            #elif defined(__aarch64__)
                __asm__ volatile("br %0" : : "r"((unsigned long)0x1000));
            #endif
            }
            """)
        let first = try setup.start()
        #expect(await first.waitFor("control socket ready", timeout: .seconds(60)))
        _ = try setup.ctl("send", "jump", "--to", "jumper")
        #expect(await first.wait(timeout: .seconds(60)) == 128 + SIGSEGV)
        let record = (try? String(contentsOfFile: setup.state + "/fatal.json", encoding: .utf8)) ?? ""
        #expect(record.contains("\"plugin\":\"Jumper\""), "record: \(record)")
        try await setup.restartQuarantining("Jumper", reason: "crashed the host process with SIGSEGV in its code")
    }

    // MARK: - The in-flight record covers start, and validation

    @Test func aPluginThatKillsTheDaemonDuringStartIsQuarantined() async throws {
        let setup = try Setup()
        _ = try Self.plugin("Killer", in: setup.plugins, handleBody: #"if (strcmp(event, "start") == 0) kill(getpid(), SIGKILL);"#)
        let first = try setup.start()
        #expect(await first.wait(timeout: .seconds(60)) == 128 + SIGKILL)
        try await setup.restartQuarantining("Killer", reason: "crashed the host process during start")
    }

    /// The in-flight record is written over the previous one, never truncated (a
    /// truncation costs ten writes): what a death leaves must still name exactly the last
    /// file begun, even after a longer record, and a record ended must name none.
    @Test func theInFlightRecordNamesTheLastFileBegunAndNoneOnceEnded() throws {
        let scratch = TemporaryDirectory("inflight")
        let state = scratch.file("state")
        let long = "/plugins/" + String(repeating: "long", count: 60) + ".so"
        do {
            let dying = try CrashGuard(directory: state)
            dying.begin(file: long, plugin: "", hash: "", phase: "validation", identity: "1:2:3:4")
            dying.end()
            dying.begin(file: long, plugin: "Long", hash: "aaaa", phase: "copy")
            dying.begin(file: "/p/libS.so", plugin: "S", hash: "bbbb", phase: "init")
        }  // the process "dies" here: the guard is gone, its record stays
        let next = try CrashGuard(directory: state)
        let crash = next.recoverFromPreviousRun()
        #expect(crash?.file == "/p/libS.so" && crash?.plugin == "S" && crash?.hash == "bbbb" && crash?.phase == "init",
                "recovered: \(String(describing: crash))")
        #expect(next.crash(forHash: "aaaa") == nil)
        next.begin(file: long, plugin: "Long", hash: "aaaa", phase: "start")
        next.end()
        #expect(try CrashGuard(directory: state).recoverFromPreviousRun() == nil)
    }

    /// A file whose program-header offset is near 2^64 (finding 1): validation must refuse
    /// it, and if a bug still crashes the daemon on it, the next start is not killed again.
    /// Outside attack: after a fuzz run, crashed.json held 131 records for one path, and
    /// past its 4 MiB read limit every quarantine would have been dropped. It keeps the
    /// newest records of each path, and a bounded number in all.
    @Test func crashRecordsKeepTheNewestOfEachPath() throws {
        let scratch = TemporaryDirectory("crashed")
        let state = scratch.directory("state")
        let fuzzed = (0..<20).map {
            CrashGuard.Crash(file: "/p/libFuzz.so", plugin: "Fuzz", hash: "h\($0)", phase: "init",
                             time: UTCTimestamp.format(seconds: 1_700_000_000 + $0))
        }
        let other = CrashGuard.Crash(file: "/p/libOther.so", plugin: "Other", hash: "o", phase: "init", time: UTCTimestamp.format(seconds: 1_600_000_000))
        let text = try JSONValue(encoding: fuzzed + [other]).jsonText
        #expect(FileManager.default.createFile(atPath: state + "/crashed.json", contents: Data(text.utf8)))
        let first = try CrashGuard(directory: state)
        #expect(first.crash(forHash: "h0") != nil, "the records are read back whole")
        first.recordTrialFailure(file: "/p/libFuzz.so", plugin: "Fuzz", hash: "h20", ending: "timeout")
        let next = try CrashGuard(directory: state)
        let kept = (0...20).filter { next.crash(forHash: "h\($0)") != nil }
        #expect(kept == Array(13...20), "\(kept)")
        #expect(next.crash(forHash: "o") != nil)
    }

    @Test func aFileThatCrashesValidationDoesNotCrashLoopTheDaemon() async throws {
        let setup = try Setup()
        var bytes = Array(try Data(contentsOf: URL(fileURLWithPath: BuildProducts.plugin("Calculator"))))
        for index in 0..<8 { bytes[32 + index] = index == 0 ? 0xf0 : 0xff }
        try setup.scratch.write("plugins/libOverflow.so", bytes)
        for _ in 0..<2 {
            let daemon = try setup.start()
            let ready = await daemon.waitFor("control socket ready", timeout: .seconds(60))
            guard ready else { continue }  // at most one start may die
            let row = try setup.row(ofFile: "Overflow")
            #expect(["refused", "quarantined"].contains(row?["state"] as? String ?? ""), "row: \(String(describing: row))")
            #expect(try setup.ctl("list").standardOutput.contains("counter"))
            daemon.send(SIGTERM)
            #expect(await daemon.wait() == 0)
            return
        }
        Issue.record("the daemon died at two starts in a row on a file that crashes validation")
    }
}
