import DaemonKit
import Foundation
import Glibc
import Testing
import TestSupport

/// An isolated plugin's worker runs the plugin's code, which can write anything on the
/// worker's sockets (docs/isolation.md, "The worker protocol"): what it writes is not
/// believed, and a worker whose sockets no longer work is ended and restarted.
@Suite(.timeLimit(.minutes(5)), .serialized)
struct HostileWorkerTests {
    /// A C plugin `Liar` whose module notes `EVENT PID` in `events` for every event and:
    /// on event `lie`, writes a log frame of its own on the worker's control socket
    /// (descriptor 3) that claims to come from plugin Honest's module, worker 1; on `say`,
    /// logs through the host as it should; on `print`, writes a line that looks like the
    /// daemon's on its standard error, a line on its standard output (no fflush), 1000 lines
    /// on standard error, then (1.1 s later) an escape sequence and no newline, and closes
    /// both; on `garbage`, writes bytes that are no frame on
    /// the socket of ordered requests (4); on `unknown`, a frame with an op the protocol does
    /// not have on the control socket (3); on `cut`, the start of a frame and not the rest
    /// on the control socket; on `close`, closes descriptors 3, 4 and 5; on
    /// `segv`, crashes; on `breakout`, starts a process that leaves everything the worker could
    /// find it by and notes `escapee PID` in `events`; on `phantom`, writes on the control socket an answer to request
    /// 1000000, never sent. It exports `liar_add(a, b)`, `liar_slow(ms)`, which returns
    /// after `ms` milliseconds, `liar_forge(count)`, `liar_phantom(id)` and
    /// `liar_truncate(n)` (below).
    static func liar(in directory: String, events: String = "/dev/null") throws -> String {
        let frame = #"{"op":"log","level":1,"label":"modhostd","message":"claimed line","metadata":[["plugin","Honest"],["module","honest"],["worker","1"],["request","7"]]}"#
        let source = """
            #define _GNU_SOURCE
            #include <modulehost.h>
            #include <fcntl.h>
            #include <signal.h>
            #include <stdio.h>
            #include <stdlib.h>
            #include <string.h>
            #include <sys/prctl.h>
            #include <unistd.h>
            static const char frame[] = "\(frame.replacingOccurrences(of: "\"", with: "\\\""))";
            /* Writes the frame of text on descriptor fd. */
            static void frame_on(int fd, const char *text) {
                size_t n = strlen(text);
                unsigned char header[4] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8), (unsigned char)n};
                if (write(fd, header, 4) != 4 || write(fd, text, n) < 0) {}
            }
            /* An answer, on descriptor fd, to request id, which the daemon never sent. */
            static void phantom(int fd, uint64_t id) {
                char text[64];
                snprintf(text, sizeof text, "{\\\"id\\\":%llu}", (unsigned long long)id);
                frame_on(fd, text);
            }
            /* This process's pid as the daemon sees it (getpid() is 1 in the worker's PID
               namespace). */
            static int daemon_pid(void) {
                char self[32] = {0};
                return readlink("/proc/self", self, sizeof self - 1) > 0 ? atoi(self) : (int)getpid();
            }
            static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }
            static void handle(void *instance, const char *event, const char *payload) {
                const modhost_host_api *host = instance;
                (void)payload;
                char line[256];
                int length = snprintf(line, sizeof line, "%s %d\\n", event, daemon_pid());
                int fd = open("\(events)", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
                if (fd >= 0) { if (write(fd, line, (size_t)length) < 0) {} close(fd); }
                if (strcmp(event, "garbage") == 0) { if (write(4, "garbage!garbage!", 16) < 0) {} }
                if (strcmp(event, "close") == 0) { close(3); close(4); close(5); }
                if (strcmp(event, "closecalls") == 0) close(5);
                if (strcmp(event, "phantom") == 0) phantom(3, 1000000);
                if (strcmp(event, "cut") == 0) { static const unsigned char start[] = {0, 0, 0, 200, '{'}; if (write(3, start, sizeof start) < 0) {} }
                if (strcmp(event, "unknown") == 0) {
                    static const char unknown[] = "{\\"op\\":\\"launch\\"}";
                    unsigned char header[4] = {0, 0, 0, (unsigned char)(sizeof unknown - 1)};
                    if (write(3, header, 4) != 4 || write(3, unknown, sizeof unknown - 1) < 0) {}
                }
                if (strcmp(event, "segv") == 0 || strcmp(event, "crashnote") == 0) { volatile int *nowhere = 0; *nowhere = 1; }
                if (strcmp(event, "hangnote") == 0) pause();
                if (strcmp(event, "escape") == 0) {
                    /* Into a child's process group, without its token, with a pipe over its
                       control socket: it no longer sees the daemon close it. */
                    pid_t child = fork();
                    if (child == 0) { setpgid(0, 0); for (;;) pause(); }
                    setpgid(child, child);
                    setpgid(0, child);
                    unsetenv("MODHOST_WORKER_TOKEN");
                    int ends[2];
                    if (pipe(ends) == 0) dup2(ends[0], 3);
                }
                if (strcmp(event, "breakout") == 0 && fork() == 0) {
                    /* A process that leaves everything the worker could find it by: its
                       session and group, its parent, its descriptors, its environment and
                       the parent-death signal; it notes its pid as the daemon sees it. */
                    setsid();
                    if (fork() != 0) _exit(0);
                    prctl(PR_SET_PDEATHSIG, 0);
                    signal(SIGTERM, SIG_IGN);
                    signal(SIGHUP, SIG_IGN);
                    int fd = open("\(events)", O_WRONLY | O_APPEND | O_CLOEXEC);
                    if (fd >= 0) { dprintf(fd, "escapee %d\\n", daemon_pid()); close(fd); }
                    for (int i = 0; i < 1024; i++) close(i);
                    clearenv();
                    for (;;) pause();
                }
                if (strcmp(event, "lie") == 0) {
                    unsigned long n = sizeof frame - 1;
                    unsigned char header[4] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8), (unsigned char)n};
                    if (write(3, header, 4) != 4 || write(3, frame, n) != (long)n) {}
                }
                if (strcmp(event, "say") == 0) host->log(MODHOST_LOG_INFO, "honest line");
                if (strcmp(event, "print") == 0) {
                    dprintf(2, "error modhostd: plugin Counter's worker (pid 4711) was killed by signal 11\\n");
                    printf("to stdout\\n");
                    for (int i = 0; i < 1000; i++) fprintf(stderr, "flood %d\\n", i);
                    usleep(1100000);
                    dprintf(2, "\\033[31mred");
                    close(1); close(2);
                }
            }
            static void destroy(void *instance) { (void)instance; }
            MODHOST_EXPORT int32_t liar_add(int32_t a, int32_t b) { return a + b; }
            /* A text of 17 MiB, more than a reply may hold. */
            MODHOST_EXPORT const char *liar_big(void) {
                static char *text;
                if (text == NULL && (text = malloc(((size_t)17 << 20) + 1)) != NULL) {
                    memset(text, 'x', (size_t)17 << 20);
                    text[(size_t)17 << 20] = 0;
                }
                return text;
            }
            MODHOST_EXPORT int32_t liar_slow(int32_t ms) { usleep((useconds_t)ms * 1000); return ms; }
            /* Answers the calls numbered 1 to count itself, on socket 5, each with a result
               of type str (liar_forge returns an i32), before the worker's own answer. */
            MODHOST_EXPORT int32_t liar_phantom(int32_t id) { phantom(5, (uint64_t)id); return 0; }
            /* Writes on socket 5 the start of a frame of 200 bytes, then n bytes of it, and
               returns: the worker's answer is taken for more of that frame, which stays unfinished. */
            MODHOST_EXPORT int32_t liar_truncate(int32_t n) {
                unsigned char f[4 + 100] = {0, 0, 0, 200, 4};
                if (n < 0 || n > 100) n = 1;
                if (write(5, f, 4 + (size_t)n) < 0) {}
                return n;
            }
            MODHOST_EXPORT int32_t liar_forge(int32_t count) {
                for (int32_t id = 1; id <= count; id++) {
                    char text[64];
                    snprintf(text, sizeof text, "{\\\"type\\\":\\\"str\\\",\\\"value\\\":\\\"forged\\\",\\\"id\\\":%d}", (int)id);
                    frame_on(5, text);
                }
                return 7;
            }
            static const char *const notes[] = {"hangnote", "crashnote", "bignote", NULL};
            static const modhost_module modules[] = {{ sizeof(modhost_module), MODHOST_MODULE_C, "liar", "1.0",
                notes, create, handle, destroy, 0 }};
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("Liar", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """
        return try PluginFactory(directory: directory).buildC("Liar", source: source,
                                                              manifest: PluginFactory.manifest(plugin: "Liar", modules: ["liar"],
                                                                                               exports: [("liar_add", "i32(i32,i32)"), ("liar_big", "str()"), ("liar_slow", "i32(i32)"),
                                                                                                         ("liar_forge", "i32(i32)"), ("liar_phantom", "i32(i32)"),
                                                                                                         ("liar_truncate", "i32(i32)")]))
    }

    /// A modhostd running the example Counter in process and `plugin` (built into `file`)
    /// isolated, once its control socket is ready.
    static func daemon(isolating plugin: String, file: String, arguments: [String] = []) async throws -> DaemonLifecycleTests.Harness {
        let h = try DaemonLifecycleTests.Harness(["Counter"], files: [file], arguments: arguments,
                                                 config: #"{"plugins": {"\#(plugin)": {"isolation": "process"}}}"#)
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        return h
    }

    /// Stops it with SIGTERM; it must exit 0.
    static func stop(_ h: DaemonLifecycleTests.Harness) async {
        h.daemon.send(SIGTERM)
        #expect(await h.daemon.wait() == 0, "\(h.daemon.text)")
    }

    @Test("an isolated plugin cannot make its log lines another plugin's or another worker's", .timeLimit(.minutes(3)))
    func aWorkerCannotLogAsAnotherPlugin() async throws {
        let scratch = TemporaryDirectory("isolated-log")
        let liar = try Self.liar(in: scratch.directory("liar"))
        let h = try await Self.daemon(isolating: "Liar", file: liar)
        let pid = try #require(try h.modules()["liar"]?["workerPid"] as? Int)
        #expect(try h.ctl("send", "say", "--to", "liar").status == 0)
        #expect(try h.ctl("send", "lie", "--to", "liar").status == 0)
        #expect(await h.waitFor("claimed line"), "\(h.daemon.text)")
        #expect(await h.waitFor("honest line"), "\(h.daemon.text)")
        let lines = h.daemon.text.split(separator: "\n")
        // A line logged through the host names its module, plugin and worker, once each.
        let honest = try #require(lines.first { $0.contains("honest line") })
        #expect(honest.contains("module=liar plugin=Liar worker=\(pid)"), "\(honest)")
        // What the plugin wrote itself keeps what it may say (its own metadata), not a
        // plugin, module or worker that is not its own.
        let claimed = try #require(lines.first { $0.contains("claimed line") })
        #expect(claimed.contains("plugin=Liar worker=\(pid)"), "\(claimed)")
        #expect(claimed.contains("request=7"), "\(claimed)")
        for lie in ["plugin=Honest", "module=honest", "worker=1 "] {
            #expect(!(claimed + " ").contains(lie), "\(claimed)")
        }
        await Self.stop(h)
    }

    @Test("what an isolated plugin writes on its standard output and error is logged as its own", .timeLimit(.minutes(3)))
    func aWorkersOutputIsTaggedAsThePlugins() async throws {
        let scratch = TemporaryDirectory("isolated-output")
        let liar = try Self.liar(in: scratch.directory("liar"))
        let h = try await Self.daemon(isolating: "Liar", file: liar)
        let pid = try #require(try h.modules()["liar"]?["workerPid"] as? Int)
        #expect(try h.ctl("send", "print", "--to", "liar").status == 0)
        #expect(await h.waitFor("lines of output dropped"), "\(h.daemon.text)")
        // The last line the plugin writes, left without a newline: sent when it closes the
        // pipe, and logged whenever the daemon reads it (a clean-clone run read the log before).
        #expect(await h.waitFor("[31mred"), "\(h.daemon.text)")
        let lines = h.daemon.text.split(separator: "\n")
        // The forged line is no daemon line: it is the plugin's, tagged, at warning level.
        #expect(!lines.contains { $0.hasPrefix("error modhostd: plugin Counter") }, "\(h.daemon.text)")
        let forged = try #require(lines.first { $0.contains("plugin Counter's worker (pid 4711)") })
        #expect(forged == "warning modhost-worker: error modhostd: plugin Counter's worker (pid 4711) was killed by signal 11 stream=stderr plugin=Liar worker=\(pid)")
        #expect(lines.contains("info modhost-worker: to stdout stream=stdout plugin=Liar worker=\(pid)"), "\(h.daemon.text)")
        // The escape sequence is escaped, and its line, left without a newline, is sent once the plugin closes the pipe.
        #expect(lines.contains { $0.hasPrefix("warning modhost-worker: \\u001b[31mred") }, "\(h.daemon.text)")
        #expect(!h.daemon.text.contains("\u{1b}"))
        // A flood is cut to 200 lines a second; the rest is counted.
        let flood = lines.filter { $0.contains("modhost-worker: flood ") }
        #expect(flood.count >= 100 && flood.count < 1000, "\(flood.count) flood lines")
        #expect(flood.allSatisfy { $0.hasSuffix("stream=stderr plugin=Liar worker=\(pid)") })
        // Closing its descriptors costs the plugin nothing else.
        #expect(try h.ctl("send", "say", "--to", "liar").status == 0)
        #expect(await h.waitFor("honest line"), "\(h.daemon.text)")
        await Self.stop(h)
    }

    @Test("a worker that writes what is no frame, or a frame the protocol does not have, or closes its sockets, is ended, named and restarted",
          .timeLimit(.minutes(3)), arguments: ["garbage", "unknown", "cut", "close", "closecalls", "phantom", "phantomcall"])
    func aWorkerWhoseSocketsNoLongerWorkIsRestarted(fault: String) async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let events = scratch.file("events.log")
        let liar = try Self.liar(in: scratch.directory("liar"), events: events)
        let h = try await Self.daemon(isolating: "Liar", file: liar, arguments: ["--event-deadline", "1"])
        let pid = try #require(try h.modules()["liar"]?["workerPid"] as? Int)
        if fault == "phantomcall" {
            // A reply on socket 5 to a call never made (outside attack: dropped unsaid).
            _ = try h.ctl("call", "Liar", "liar_phantom", "1000000")
        } else {
            _ = try h.ctl("send", fault, "--to", "liar")
        }
        // Socket 5 (calls) closed is seen at the next call (outside run: every call then
        // failed with "worker ended" for good, while the worker ran on).
        if fault == "closecalls" { _ = try h.ctl("call", "Liar", "liar_add", "2", "3") }
        // The daemon sees it at once (garbage) or when the worker neither answers nor ends.
        #expect(await h.waitFor("plugin Liar's worker (pid \(pid))"), "\(h.daemon.text)")
        let restarted = try await StuckModuleTests.listUntil(h.socket) { rows in
            rows["liar"]?["restarts"] as? Int == 1 && rows["liar"]?["state"] as? String == "running"
        }
        #expect(restarted.met, "the worker was not restarted: \(h.daemon.text)")
        #expect(restarted.fast, "list answers took \(restarted.times)")
        let ended = h.daemon.text.split(separator: "\n").first { $0.contains("plugin Liar's worker (pid \(pid))") } ?? ""
        #expect(ended.contains(["garbage": "no frame", "unknown": #"op "launch", which the protocol does not have"#,
                                "phantom": "a reply to request 1000000, which the daemon never sent, on its control socket (3)",
                                "cut": "it wrote the start of a frame on its control socket (3) and not the rest within 1 s",
                                "phantomcall": "a reply to request 1000000, which the daemon never sent, on its socket of calls (5)"][fault]
                                ?? "closed"), "\(ended)")
        // The new worker gets events again.
        let now = try #require(try h.modules()["liar"]?["workerPid"] as? Int)
        #expect(now != pid)
        #expect(try h.ctl("send", "after", "--to", "liar").status == 0)
        let lines = ((try? String(contentsOfFile: events, encoding: .utf8)) ?? "").split(separator: "\n")
        #expect(lines.contains("after \(now)"), "\(lines)")
        // And calls by name.
        let sum = try h.ctl("call", "Liar", "liar_add", "2", "3")
        #expect(sum.status == 0 && sum.standardOutput == "5\n", "\(sum.standardOutput)\(sum.standardError)")
        await Self.stop(h)
    }

    /// Outside attack: a call answered with a value of another type than plugin.json
    /// declares came back as that value (a str from an i32 function), and the worker ran on.
    @Test("a worker that answers a call with a value of another type than plugin.json declares is ended, named and restarted",
          .timeLimit(.minutes(3)))
    func aCallAnsweredWithAnotherTypeEndsTheWorker() async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let liar = try Self.liar(in: scratch.directory("liar"))
        let h = try await Self.daemon(isolating: "Liar", file: liar)
        let pid = try #require(try h.modules()["liar"]?["workerPid"] as? Int)
        let forged = try h.ctl("call", "Liar", "liar_forge", "200")
        #expect(forged.status != 0 && !forged.standardOutput.contains("forged"), "\(forged.standardOutput)\(forged.standardError)")
        #expect(forged.standardError.contains("it answered call liar_forge with a value of type str, where plugin.json declares i32"),
                "\(forged.standardError)")
        #expect(await h.waitFor("plugin Liar's worker (pid \(pid))"), "\(h.daemon.text)")
        try await Self.expectRestartedAndCalled(h)
        await Self.stop(h)
    }

    /// Outside attack: an in-process module's notification of over 16 MiB (allowed in
    /// process) could not be written as a frame, and every isolated listener's worker was
    /// killed for it, as if its socket had closed; twelve such posts quarantined an
    /// innocent plugin. Now the notification is not sent to the worker, which runs on, and
    /// the log says why, naming the module.
    @Test("a notification too large for a worker frame is not delivered to it, and its worker runs on", .timeLimit(.minutes(3)))
    func aNotificationTooLargeForAFrameLeavesTheWorkerRunning() async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let events = scratch.file("events.log")
        let liar = try Self.liar(in: scratch.directory("liar"), events: events)
        let shouter = try PluginFactory(directory: scratch.directory("shouter")).buildC("Shouter", source: """
            #include <modulehost.h>
            #include <stdlib.h>
            #include <string.h>
            static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }
            static void handle(void *instance, const char *event, const char *payload) {
                const modhost_host_api *host = instance;
                (void)payload;
                if (strcmp(event, "shout") != 0) return;
                size_t n = (size_t)17 << 20;
                char *text = malloc(n + 3);
                if (text == NULL) return;
                text[0] = '"';
                memset(text + 1, 'x', n);
                text[n + 1] = '"';
                text[n + 2] = 0;
                host->post_notification("bignote", text);
                free(text);
            }
            static void destroy(void *instance) { (void)instance; }
            static const modhost_module modules[] = {{ sizeof(modhost_module), MODHOST_MODULE_C, "shouter", "1.0",
                NULL, create, handle, destroy, 0 }};
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("Shouter", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """, manifest: PluginFactory.manifest(plugin: "Shouter", modules: ["shouter"]))
        let h = try DaemonLifecycleTests.Harness(["Counter"], files: [liar, shouter],
                                                 config: #"{"plugins": {"Liar": {"isolation": "process"}}}"#)
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let pid = try #require(try h.modules()["liar"]?["workerPid"] as? Int)
        for _ in 0..<3 { #expect(try h.ctl("send", "shout", "--to", "shouter").status == 0) }
        #expect(await h.waitFor("bignote not delivered to module liar's worker"), "\(h.daemon.text)")
        // The worker still answers, the same process, never restarted.
        #expect(try h.ctl("send", "after", "--to", "liar").status == 0)
        let lines = ((try? String(contentsOfFile: events, encoding: .utf8)) ?? "").split(separator: "\n")
        #expect(lines.contains("after \(pid)"), "\(lines)")
        let row = try h.modules()["liar"]
        #expect(row?["workerPid"] as? Int == pid && row?["restarts"] as? Int == 0, "\(String(describing: row))")
        #expect(!h.daemon.text.contains("plugin Liar's worker (pid \(pid))"), "\(h.daemon.text)")
        await Self.stop(h)
    }

    /// Outside attack: a call whose result is larger than a reply may be failed with
    /// `reply_too_large` in process but `call_failed` isolated. Both now say
    /// `reply_too_large`, and the worker runs on.
    @Test("a call result too large for a reply fails the same way in process and isolated", .timeLimit(.minutes(3)),
          arguments: [false, true])
    func aResultTooLargeForAReplyIsReplyTooLargeInBothModes(isolated: Bool) async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let liar = try Self.liar(in: scratch.directory("liar"))
        let h = try DaemonLifecycleTests.Harness(["Counter"], files: [liar],
                                                 config: isolated ? #"{"plugins": {"Liar": {"isolation": "process"}}}"# : "{}")
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let pid = try h.modules()["liar"]?["workerPid"] as? Int
        #expect((pid != nil) == isolated)
        let big = try h.ctl("call", "Liar", "liar_big")
        #expect(big.status != 0 && big.standardError.contains("reply_too_large"), "\(big.standardError.prefix(300))")
        let sum = try h.ctl("call", "Liar", "liar_add", "2", "3")
        #expect(sum.status == 0 && sum.standardOutput == "5\n", "\(sum.standardOutput)\(sum.standardError)")
        #expect(try h.modules()["liar"]?["workerPid"] as? Int == pid)
        await Self.stop(h)
    }

    /// Outside attack: plugin code moved its worker into a child's process group, cleared
    /// its token and put a pipe over its control socket; on remove the daemon killed only
    /// the worker's first process group, and the worker ran on. It is killed itself.
    @Test("a worker that leaves its process group still ends when its plugin is removed", .timeLimit(.minutes(3)))
    func aWorkerThatLeavesItsGroupEndsWhenRemoved() async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let liar = try Self.liar(in: scratch.directory("liar"))
        let h = try await Self.daemon(isolating: "Liar", file: liar)
        let pid = try #require(try h.modules()["liar"]?["workerPid"] as? Int)
        #expect(try h.ctl("send", "escape", "--to", "liar").status == 0)
        let group = try #require(Self.processGroup(of: pid_t(pid)))
        #expect(group != pid_t(pid), "the worker did not leave its group")
        defer { kill(-group, SIGKILL) }  // the child it joined, which the daemon does not know of
        #expect(unlink(h.plugins + "/libLiar.so") == 0)
        // Removed once willUnload, which it no longer reads, is past its deadline.
        #expect(await h.waitFor("removed plugin Liar"), "\(h.daemon.text)")
        let gone = await Self.ends(pid_t(pid))
        #expect(gone, "worker \(pid) still runs: \(h.daemon.text)")
        #expect(try h.ctl("list").status == 0)
        await Self.stop(h)
    }

    /// Outside attack: taking another user clears the parent-death signal, so a worker
    /// running as nobody that no longer read its socket outlived a daemon killed with
    /// SIGKILL. It asks for the signal again once it runs as that user.
    @Test("a worker running as another user ends with a daemon killed by SIGKILL", .timeLimit(.minutes(3)),
          .enabled(if: geteuid() == 0, "a worker takes another user only when the daemon runs as root"))
    func aWorkerAsAnotherUserEndsWithTheDaemon() async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let liar = try Self.liar(in: scratch.directory("liar"))
        let h = try DaemonLifecycleTests.Harness(["Counter"], files: [liar],
                                                 config: #"{"plugins": {"Liar": {"isolation": "process", "user": "nobody"}}}"#)
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let pid = try #require(try h.modules()["liar"]?["workerPid"] as? Int)
        // So that it no longer sees its socket close either.
        #expect(try h.ctl("send", "escape", "--to", "liar").status == 0)
        let group = try #require(Self.processGroup(of: pid_t(pid)))
        defer { kill(-group, SIGKILL) }  // the child it joined
        h.daemon.send(SIGKILL)
        _ = await h.daemon.wait()
        let gone = await Self.ends(pid_t(pid))
        #expect(gone, "worker \(pid) outlived the daemon")
        if !gone { kill(pid_t(pid), SIGKILL) }
    }

    /// How the daemon lets go of a worker.
    enum Farewell: String, CaseIterable, Sendable {
        case removed, stopped, killed
    }

    /// Outside attack: a process the plugin forked that left its session, group, parent,
    /// descriptors and environment outlived its worker's removal, the daemon's stop and
    /// the daemon's death. It runs in the worker's PID namespace, which ends with it.
    @Test("no process an isolated plugin starts outlives its worker, however it hides", .timeLimit(.minutes(3)),
          arguments: Farewell.allCases)
    func noProcessAPluginStartsOutlivesItsWorker(farewell: Farewell) async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let events = scratch.file("events")
        let liar = try Self.liar(in: scratch.directory("liar"), events: events)
        let h = try await Self.daemon(isolating: "Liar", file: liar)
        #expect(try h.ctl("send", "breakout", "--to", "liar").status == 0)
        let escapee = try #require(await Self.escapee(in: events), "\(h.daemon.text)")
        defer { kill(escapee, SIGKILL) }
        #expect(Self.processGroup(of: escapee) != nil, "the escapee does not run")
        switch farewell {
        case .removed:
            #expect(unlink(h.plugins + "/libLiar.so") == 0)
            #expect(await h.waitFor("removed plugin Liar"), "\(h.daemon.text)")
        case .stopped: await Self.stop(h)
        case .killed:
            h.daemon.send(SIGKILL)
            _ = await h.daemon.wait()
        }
        #expect(await Self.ends(escapee), "process \(escapee), started by the plugin, outlived its worker (\(farewell))")
        if farewell == .removed { await Self.stop(h) }
    }

    /// The same from a daemon that does not run as root: it makes a user namespace for the
    /// worker's PID namespace.
    @Test("no process an isolated plugin starts outlives a daemon that is not root", .timeLimit(.minutes(3)),
          .enabled(if: geteuid() == 0, "runs the daemon as uid 65534"))
    func noProcessAPluginStartsOutlivesADaemonThatIsNotRoot() async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let events = scratch.file("events")
        let liar = try Self.liar(in: scratch.directory("liar"), events: events)
        let plugins = scratch.directory("plugins")
        try scratch.copy(liar, as: "plugins/libLiar.so")
        let home = scratch.directory("home")
        chown(home, 65534, 65534)
        try scratch.write("events", text: "")
        chown(events, 65534, 65534)
        try scratch.write("modhostd.json", text: #"{"plugins": {"Liar": {"isolation": "process"}}}"#)
        let tools = try ToolsForAnotherUser()
        let socket = home + "/sock"
        let daemon = try RunningProcess("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", tools.modhostd,
                                                             "--plugins", plugins, "--state-dir", home + "/state", "--socket", socket,
                                                             "--config", scratch.file("modhostd.json")])
        #expect(await daemon.waitFor("control socket ready", timeout: .seconds(60)), "\(daemon.text)")
        #expect(try tools.runAsNobody(tools.modhostctl, ["--socket", socket, "send", "breakout", "--to", "liar"]).status == 0)
        let escapee = try #require(await Self.escapee(in: events), "\(daemon.text)")
        defer { kill(escapee, SIGKILL) }
        #expect(!daemon.text.contains("the kernel refused"), "\(daemon.text)")
        daemon.send(SIGKILL)
        _ = await daemon.wait()
        #expect(await Self.ends(escapee), "process \(escapee), started by the plugin, outlived a daemon running as uid 65534")
    }

    /// The pid of the escapee the Liar's `breakout` noted in `events`, once it has.
    static func escapee(in events: String) async -> pid_t? {
        for _ in 0..<200 {
            let text = (try? String(contentsOfFile: events, encoding: .utf8)) ?? ""
            if let line = text.split(separator: "\n").first(where: { $0.hasPrefix("escapee ") }) {
                return pid_t(line.dropFirst("escapee ".count))
            }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return nil
    }

    /// Whether process `pid` ends (or is a zombie) within ten seconds.
    static func ends(_ pid: pid_t) async -> Bool {
        for _ in 0..<200 {
            if processGroup(of: pid) == nil { return true }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return processGroup(of: pid) == nil
    }

    /// The process group of `pid`, nil once it is gone (or a zombie).
    static func processGroup(of pid: pid_t) -> pid_t? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 2, fields[0] != "Z" else { return nil }
        return pid_t(fields[2])
    }

    /// Expects `h`'s Liar to have been restarted once, to run, and to answer a call.
    static func expectRestartedAndCalled(_ h: DaemonLifecycleTests.Harness) async throws {
        let restarted = try await StuckModuleTests.listUntil(h.socket) { rows in
            rows["liar"]?["restarts"] as? Int == 1 && rows["liar"]?["state"] as? String == "running"
        }
        #expect(restarted.met, "the worker was not restarted: \(h.daemon.text)")
        let sum = try h.ctl("call", "Liar", "liar_add", "2", "3")
        #expect(sum.status == 0 && sum.standardOutput == "5\n", "\(sum.standardOutput)\(sum.standardError)")
    }

    /// Outside attack: a call whose plugin wrote the start of a frame on socket 5 and not
    /// the rest left the worker's answer inside that frame; the call overran, every later
    /// call was refused (`plugin_busy`) for good, and nothing was logged.
    @Test("a worker that leaves a frame unfinished on its calls socket is ended, named and restarted", .timeLimit(.minutes(3)))
    func aFrameLeftUnfinishedEndsTheWorker() async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let liar = try Self.liar(in: scratch.directory("liar"))
        let h = try await Self.daemon(isolating: "Liar", file: liar, arguments: ["--request-deadline", "1", "--event-deadline", "1"])
        let pid = try #require(try h.modules()["liar"]?["workerPid"] as? Int)
        let cut = try h.ctl("call", "Liar", "liar_truncate", "5")
        #expect(cut.status != 0, "\(cut.standardOutput)\(cut.standardError)")
        #expect(await h.waitFor("plugin Liar's worker (pid \(pid))"), "\(h.daemon.text)")
        let ended = h.daemon.text.split(separator: "\n").first { $0.contains("plugin Liar's worker (pid \(pid))") } ?? ""
        #expect(ended.contains("it wrote the start of a frame on its socket of calls (5) and not the rest within 1 s"), "\(ended)")
        try await Self.expectRestartedAndCalled(h)
        await Self.stop(h)
    }

    /// A C plugin `Hoarder` (module `hoarder`) exporting `hoard_big(mib)`, which returns a
    /// text of `mib` MiB (at most 128), and `hoard_half(mib)`, which writes on the worker's
    /// socket of calls (5) the header of a frame of 16 MiB and `mib` MiB of it, and returns:
    /// the worker's own answer is read as more of that frame, which stays unfinished.
    static func hoarder(in directory: String) throws -> String {
        try PluginFactory(directory: directory).buildC("Hoarder", source: """
            #include <modulehost.h>
            #include <stdlib.h>
            #include <string.h>
            #include <unistd.h>
            static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }
            static void handle(void *instance, const char *event, const char *payload) { (void)instance; (void)event; (void)payload; }
            static void destroy(void *instance) { (void)instance; }
            static size_t bytes(int32_t mib) { return (size_t)(mib < 0 || mib > 128 ? 0 : mib) << 20; }
            MODHOST_EXPORT char *hoard_big(int32_t mib) {
                size_t n = bytes(mib);
                char *text = malloc(n + 1);  /* the host frees it */
                if (text == NULL) return strdup("");
                memset(text, 'x', n);
                text[n] = 0;
                return text;
            }
            MODHOST_EXPORT int32_t hoard_half(int32_t mib) {
                static const unsigned char header[4] = {1, 0, 0, 0};  /* 16 MiB */
                size_t n = bytes(mib);
                char *body = calloc(1, n + 1);
                if (body != NULL && write(5, header, 4) == 4) {
                    for (size_t done = 0; done < n;) {
                        ssize_t wrote = write(5, body + done, n - done);
                        if (wrote <= 0) break;
                        done += (size_t)wrote;
                    }
                }
                free(body);
                return mib;
            }
            static const modhost_module modules[] = {{ sizeof(modhost_module), MODHOST_MODULE_C, "hoarder", "1.0",
                NULL, create, handle, destroy, 0 }};
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("Hoarder", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """, manifest: PluginFactory.manifest(plugin: "Hoarder", modules: ["hoarder"],
                                                  exports: [("hoard_big", "str(i32)"), ("hoard_half", "i32(i32)")]))
    }

    /// The resident memory of process `pid`, in MiB (0 when it cannot be read).
    static func residentMiB(_ pid: pid_t) -> Int { Int((ProcessMemory.residentBytes(pid: pid) ?? 0) >> 20) }

    /// Outside run: a worker that wrote the header of a frame of 16 MiB and a part of it
    /// made the daemon reserve (and fill) all 16 MiB at once; calls whose results were
    /// megabytes left the daemon that much larger for good (the buffer that read them was
    /// kept at its largest, each result stayed held until the request deadline, and glibc
    /// kept the blocks once freed): 100 MB results, 176 MB held. The daemon now holds what
    /// has arrived, while it is needed, and returns it.
    @Test("the daemon returns the memory of large call results and of a frame left unfinished", .timeLimit(.minutes(3)),
          arguments: [false, true])
    func largeResultsAndUnfinishedFramesLeaveNoMemoryBehind(isolated: Bool) async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let hoarder = try Self.hoarder(in: scratch.directory("hoarder"))
        // Long deadlines: a result of megabytes takes seconds in a debug build on a busy
        // machine; the frame left unfinished is ended after the event deadline.
        let h = try DaemonLifecycleTests.Harness(["Counter"], files: [hoarder], arguments: ["--request-deadline", "60", "--event-deadline", "3"],
                                                 config: isolated ? #"{"plugins": {"Hoarder": {"isolation": "process"}}}"# : "{}")
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let daemon = h.daemon.pid
        // A call with a small result first: what every call allocates once is there before.
        let small = try h.ctl("call", "Hoarder", "hoard_big", "1")
        #expect(small.status == 0, "\(small.standardError)")
        let before = Self.residentMiB(daemon)
        #expect(before > 0)
        // Isolated, results of 15 MiB (a worker's frame holds at most 16: too large for a
        // reply line, refused once the call has run); in process, of 7 MiB, sent.
        for _ in 1...3 {
            let big = try h.ctl("call", "Hoarder", "hoard_big", isolated ? "15" : "7")
            if isolated {
                #expect(big.standardError.contains("reply_too_large"), "\(big.standardError.prefix(300))")
            } else {
                #expect(big.status == 0 && big.standardOutput.count > 7 << 20, "\(big.standardError.prefix(300))")
            }
        }
        let afterResults = Self.residentMiB(daemon)
        #expect(afterResults - before < 8, "the daemon grew from \(before) to \(afterResults) MiB with the results of 3 calls")
        guard isolated else {
            #expect(await h.stop() == 0)
            return
        }
        // The header of a frame of 16 MiB and 1 MiB of it: the daemon holds about what came,
        // until the worker is ended for the rest, which never comes.
        let pid = try #require(try h.modules()["hoarder"]?["workerPid"] as? Int)
        let caller = try RunningProcess(BuildProducts.modhostctl, ["--socket", h.socket, "call", "Hoarder", "hoard_half", "1"])
        var largest = Self.residentMiB(daemon)
        let clock = ContinuousClock(), giveUp = clock.now + .seconds(60)
        while !h.daemon.text.contains("plugin Hoarder's worker (pid \(pid))"), clock.now < giveUp {
            largest = max(largest, Self.residentMiB(daemon))
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(largest - before < 8, "the daemon grew from \(before) to \(largest) MiB reading 1 MiB of a frame")
        let ended = h.daemon.text.split(separator: "\n").first { $0.contains("plugin Hoarder's worker (pid \(pid))") } ?? ""
        #expect(ended.contains("it wrote the start of a frame on its socket of calls (5) and not the rest within 3 s"), "\(ended)")
        _ = await caller.wait(timeout: .seconds(30))
        let restarted = try await StuckModuleTests.listUntil(h.socket) { rows in
            rows["hoarder"]?["restarts"] as? Int == 1 && rows["hoarder"]?["state"] as? String == "running"
        }
        #expect(restarted.met, "\(h.daemon.text)")
        let afterFrame = Self.residentMiB(daemon)
        #expect(afterFrame - before < 8, "the daemon grew from \(before) to \(afterFrame) MiB")
        #expect(await h.stop() == 0)
    }

    /// Outside run: a plugin replaced while its worker was stuck in a handler (killed at the
    /// event deadline while the replace waited for it) ran its new version, but the old
    /// worker's end restarted the old version from the private copy the replace deleted:
    /// "cannot restart plugin ...'s worker" and "is quarantined", at error level, about a
    /// plugin that ran fine.
    @Test("replacing an isolated plugin whose worker is stuck runs the new version and restarts nothing of the old",
          .timeLimit(.minutes(3)))
    func replacingAStuckIsolatedPluginRestartsNothingOfTheOld() async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let old = try IsolationTests.faultyPlugin("Stuck", in: scratch.directory("v1"), events: scratch.file("v1.log"))
        let new = try IsolationTests.faultyPlugin("Stuck", in: scratch.directory("v2"), events: scratch.file("v2.log"))
        let h = try await Self.daemon(isolating: "Stuck", file: old, arguments: ["--event-deadline", "2"])
        let pid = try #require(try h.modules()["stuck"]?["workerPid"] as? Int)
        let blocked = try RunningProcess(BuildProducts.modhostctl, ["--socket", h.socket, "send", "block", "--to", "stuck"])
        func noted(_ log: String, _ line: String) -> Bool {
            ((try? String(contentsOfFile: scratch.file(log), encoding: .utf8)) ?? "").contains(line)
        }
        #expect(await DaemonLifecycleTests().eventually { noted("v1.log", "stuck block") }, "\(h.daemon.text)")
        try h.drop(new, as: "libStuck.so")
        #expect(await h.waitFor("plugin Stuck's worker (pid \(pid))"), "\(h.daemon.text)")
        _ = await blocked.wait(timeout: .seconds(30))
        #expect(try await DaemonLifecycleTests().eventually {
            _ = try h.ctl("send", "after", "--to", "stuck")
            return noted("v2.log", "stuck after")
        }, "\(h.daemon.text)")
        // An absence: whatever the old worker's end started has had half a second more.
        try await Task.sleep(for: .milliseconds(500))
        let text = h.daemon.text
        #expect(!text.contains("cannot restart") && !text.contains("quarantined"), "\(text)")
        let creates = ((try? String(contentsOfFile: scratch.file("v1.log"), encoding: .utf8)) ?? "").split(separator: "\n").filter { $0.hasPrefix("stuck create") }
        #expect(creates.count == 1, "the old version was created again: \(creates)")
        await Self.stop(h)
    }

    @Test("a send to an isolated module whose worker ends during the event, or is down, says so", .timeLimit(.minutes(3)))
    func aSendThatNoWorkerHandledFails() async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let events = scratch.file("events.log")
        let liar = try Self.liar(in: scratch.directory("liar"), events: events)
        let h = try await Self.daemon(isolating: "Liar", file: liar)
        // Five crashes within ten seconds: each send fails, naming the worker's end; then
        // the plugin is quarantined and a send to it says its worker is not running.
        for crash in 1...5 {
            let running = try await StuckModuleTests.listUntil(h.socket) { $0["liar"]?["state"] as? String == "running" }
            #expect(running.met, "crash \(crash): \(h.daemon.text)")
            let sent = try h.ctl("send", "segv", "--to", "liar")
            #expect(sent.status != 0 && sent.standardError.contains("worker_ended"), "\(sent.standardOutput)\(sent.standardError)")
            #expect(sent.standardError.contains("ended while it handled it"), "\(sent.standardError)")
        }
        let quarantined = try await StuckModuleTests.listUntil(h.socket) { $0["liar"]?["state"] as? String == "quarantined" }
        #expect(quarantined.met, "\(h.daemon.text)")
        let refused = try h.ctl("send", "hello", "--to", "liar")
        #expect(refused.status != 0 && refused.standardError.contains("worker_ended"), "\(refused.standardOutput)\(refused.standardError)")
        #expect(refused.standardError.contains("not running"), "\(refused.standardError)")
        // Counted as list shows it: not running.
        let status = try h.ctl("status").standardOutput
        #expect(status.contains("modules running:     1\n"), "\(status)")
        let metrics = try h.ctl("metrics").standardOutput
        #expect(metrics.contains("\nmodhost_modules_running 1\n"), "\(metrics)")
        let awaited = try h.ctl("send", "--await", "hello", "--to", "liar")
        #expect(awaited.status != 0 && awaited.standardError.contains("worker_ended"), "\(awaited.standardOutput)\(awaited.standardError)")
        // A send to every module still reaches the others, and succeeds.
        #expect(try h.ctl("send", "hello").status == 0, "\(h.daemon.text)")
        await Self.stop(h)
    }

    /// A plugin whose module crashes its worker in create: the startup log does not say
    /// it was loaded in a worker "-", nor blame a timeout for what was a crash, and does not
    /// count its module as started.
    @Test("the startup log tells a worker that crashed in create from one that runs", .timeLimit(.minutes(3)))
    func theStartupLogTellsACrashedWorkerFromARunningOne() async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let doomed = try IsolationTests.faultyPlugin("Doomed", in: scratch.directory("doomed"), events: "/dev/null", crashInCreate: true)
        let h = try await Self.daemon(isolating: "Doomed", file: doomed)
        let log = h.daemon.text
        #expect(!log.contains("in worker process -"), "\(log)")
        #expect(!log.contains("did not answer within"), "\(log)")
        // Started, or said not to run (its worker is restarted at once, so in the moment
        // between a new worker's ready and its create's crash it does run).
        let started = try #require(log.split(separator: "\n").first { $0.contains("started ") && ($0.contains(" modules: ") || $0.contains(" module: ")) })
        #expect(started.contains("doomed") != log.contains("module doomed is not running: its worker is"), "\(log)")
        await Self.stop(h)
    }

    /// A post is reported as reaching only the listeners that handled it: an isolated
    /// listener whose worker hangs in it (killed at the event deadline) or crashes in it
    /// makes the post fail, naming it; one whose worker is down is not named as reached.
    @Test("a post an isolated listener did not handle is not reported as reached", .timeLimit(.minutes(3)))
    func aPostThatNoWorkerHandledFails() async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let liar = try Self.liar(in: scratch.directory("liar"))
        let h = try await Self.daemon(isolating: "Liar", file: liar, arguments: ["--event-deadline", "1"])
        func running() async throws -> Bool {
            try await StuckModuleTests.listUntil(h.socket) { $0["liar"]?["state"] as? String == "running" }.met
        }
        let hung = try h.ctl("post", "hangnote")
        #expect(hung.status != 0 && hung.standardError.contains("deadline_exceeded"), "\(hung.standardOutput)\(hung.standardError)")
        #expect(hung.standardError.contains("module liar did not finish notification hangnote") && hung.standardError.contains("killed"),
                "\(hung.standardError)")
        #expect(try await running(), "\(h.daemon.text)")
        let crashed = try h.ctl("post", "crashnote")
        #expect(crashed.status != 0 && crashed.standardError.contains("worker_ended"), "\(crashed.standardOutput)\(crashed.standardError)")
        #expect(crashed.standardError.contains("not handled by module liar"), "\(crashed.standardError)")
        await Self.stop(h)
    }

    @Test("a call that overruns its deadline in a worker makes the plugin busy until it returns, as in process",
          .timeLimit(.minutes(3)))
    func aCallThatOverrunsMakesThePluginBusyUntilItReturns() async throws {
        let scratch = TemporaryDirectory("hostile-worker")
        let liar = try Self.liar(in: scratch.directory("liar"))
        let h = try await Self.daemon(isolating: "Liar", file: liar, arguments: ["--request-deadline", "1"])
        let pid = try #require(try h.modules()["liar"]?["workerPid"] as? Int)
        let slow = try h.ctl("call", "Liar", "liar_slow", "4000")
        #expect(slow.status != 0 && slow.standardError.contains("deadline_exceeded"), "\(slow.standardOutput)\(slow.standardError)")
        // It says what follows, not to look for a stuck module in list (which shows none).
        #expect(!slow.standardError.contains("modhostctl list") && slow.standardError.contains("no new call"), "\(slow.standardError)")
        // Refused at once while it runs, naming what runs; not made to wait behind it.
        let busy = try h.ctl("call", "Liar", "liar_add", "2", "3")
        #expect(busy.status != 0 && busy.standardError.contains("plugin_busy"), "\(busy.standardOutput)\(busy.standardError)")
        #expect(busy.standardError.contains("liar_slow"), "\(busy.standardError)")
        // Once it has returned, calls work again, in the same worker.
        var answer = ""
        for _ in 0..<300 where answer != "5\n" {
            answer = try h.ctl("call", "Liar", "liar_add", "2", "3").standardOutput
            if answer != "5\n" { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(answer == "5\n", "\(h.daemon.text)")
        #expect(try h.modules()["liar"]?["workerPid"] as? Int == pid)
        await Self.stop(h)
    }

    /// Found by an outside run: a worker that exited in its module's destroy while the
    /// daemon shut down was not logged (the same exit during `disable` was).
    @Test("a worker that exits by itself during the shutdown is logged", .timeLimit(.minutes(3)))
    func aWorkerExitingDuringTheShutdownIsLogged() async throws {
        let scratch = TemporaryDirectory("quitter")
        let source = """
            #include <modulehost.h>
            #include <unistd.h>
            static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }
            static void handle(void *instance, const char *event, const char *payload) { (void)instance; (void)event; (void)payload; }
            static void destroy(void *instance) { (void)instance; _exit(3); }
            static const modhost_module modules[] = {{ sizeof(modhost_module), MODHOST_MODULE_C, "quitter", "1.0",
                NULL, create, handle, destroy, 0 }};
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("Quitter", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """
        let quitter = try PluginFactory(directory: scratch.directory("quitter"))
            .buildC("Quitter", source: source, manifest: PluginFactory.manifest(plugin: "Quitter", modules: ["quitter"]))
        let h = try await Self.daemon(isolating: "Quitter", file: quitter)
        let pid = try #require(try h.modules()["quitter"]?["workerPid"] as? Int)
        await Self.stop(h)
        #expect(h.daemon.text.contains("plugin Quitter's worker (pid \(pid)) exited with status 3"), "\(h.daemon.text)")
    }

    /// A plugin's constructor runs in its worker before the worker is ready, so it can write
    /// a ready or failed frame of its own: a ready frame naming modules plugin.json does not
    /// list (to take another plugin's module names) refuses the plugin, and no module of that
    /// name appears; a failed frame cannot name a check only the daemon makes (found by an
    /// outside run: a forged "crash guard" failure read as the daemon's own verdict).
    @Test("a ready or failed frame the plugin forged cannot claim module names or the daemon's checks", .timeLimit(.minutes(3)),
          arguments: [
              (#"{"op":"ready","pid":1,"modules":[{"name":"forger","version":"1.0"},{"name":"ghost","version":"6.6"}]}"#,
               "ready frame did not list the modules plugin.json lists (forger)"),
              (#"{"op":"failed","check":"crash guard","problem":"plugin Counter crashed the host process","fix":"remove libCounter.so"}"#,
               "isolation check failed: in its worker: plugin Counter crashed the host process"),
              // The texts of a failed frame reach the log and `list`: bounded as log lines are.
              (#"{"op":"failed","check":"dlopen","problem":""# + String(repeating: "x", count: 100_000) + #"","fix":"none"}"#,
               "in its worker: xxxx"),
          ])
    func aForgedReadyFrameIsRefused(frame: String, refused: String) async throws {
        let scratch = TemporaryDirectory("forged-ready")
        let source = """
            #define _GNU_SOURCE
            #include <modulehost.h>
            #include <sys/stat.h>
            #include <unistd.h>
            static const char frame[] = "\(frame.replacingOccurrences(of: "\"", with: "\\\""))";
            __attribute__((constructor)) static void forge(void) {
                struct stat status;
                if (fstat(3, &status) != 0 || !S_ISSOCK(status.st_mode)) return;
                unsigned long n = sizeof frame - 1;
                unsigned char header[4] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8), (unsigned char)n};
                if (write(3, header, 4) != 4 || write(3, frame, n) != (long)n) {}
            }
            static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }
            static void handle(void *instance, const char *event, const char *payload) { (void)instance; (void)event; (void)payload; }
            static void destroy(void *instance) { (void)instance; }
            static const modhost_module modules[] = {{ sizeof(modhost_module), MODHOST_MODULE_C, "forger", "1.0",
                NULL, create, handle, destroy, 0 }};
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("Forger", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """
        let forger = try PluginFactory(directory: scratch.directory("forger"))
            .buildC("Forger", source: source, manifest: PluginFactory.manifest(plugin: "Forger", modules: ["forger"]))
        let h = try await Self.daemon(isolating: "Forger", file: forger)
        let rows = try h.modules()
        #expect(rows["ghost"] == nil, "\(rows)")
        #expect(rows["forger"] == nil, "\(rows)")
        #expect(rows["counter"]?["state"] as? String == "running", "\(rows)")
        let refusal = try #require(rows.values.first { ($0["file"] as? String ?? "").hasSuffix("libForger.so") }, "\(rows)")
        #expect(refusal["state"] as? String == "refused", "\(refusal)")
        #expect("\(refusal)".contains(refused), "\(refusal)")
        #expect("\(refusal)".utf8.count < 16_384, "\("\(refusal)".utf8.count) bytes")
        #expect(!h.daemon.text.contains("crash guard check failed"), "\(h.daemon.text)")
        await Self.stop(h)
    }

    /// One thread of the daemon reads every worker's control socket. A worker that writes a
    /// frame too large for it (here 16 MiB, a valid log frame) ends itself, at the header;
    /// the daemon does not spend seconds reading it while another worker's answer waits, so
    /// that other worker is not killed for the daemon's lateness.
    @Test("one worker's huge frame does not get another worker killed", .timeLimit(.minutes(3)))
    func aHugeFrameCostsOnlyItsWorker() async throws {
        let scratch = TemporaryDirectory("huge-frame")
        let liar = try Self.liar(in: scratch.directory("liar"))
        let source = """
            #define _GNU_SOURCE
            #include <modulehost.h>
            #include <stdlib.h>
            #include <string.h>
            #include <unistd.h>
            static void *create(const modhost_host_api *host, const char *config) { (void)config; return (void *)host; }
            static void handle(void *instance, const char *event, const char *payload) {
                (void)instance; (void)payload;
                if (strcmp(event, "big") != 0) return;
                static const char head[] = "{\\"op\\":\\"log\\",\\"level\\":1,\\"label\\":\\"hog\\",\\"message\\":\\"";
                size_t n = 16u << 20, text = n - (sizeof head - 1) - 2;
                char *frame = malloc(4 + n);
                if (!frame) return;
                frame[0] = (char)(n >> 24); frame[1] = (char)(n >> 16); frame[2] = (char)(n >> 8); frame[3] = (char)n;
                memcpy(frame + 4, head, sizeof head - 1);
                memset(frame + 4 + sizeof head - 1, 'a', text);
                memcpy(frame + 4 + n - 2, "\\"}", 2);
                for (size_t done = 0; done < 4 + n;) { ssize_t w = write(3, frame + done, 4 + n - done); if (w <= 0) break; done += (size_t)w; }
                free(frame);
            }
            static void destroy(void *instance) { (void)instance; }
            static const modhost_module modules[] = {{ sizeof(modhost_module), MODHOST_MODULE_C, "hog", "1.0",
                NULL, create, handle, destroy, 0 }};
            static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("Hog", modules);
            MODHOST_PLUGIN_ENTRY { return &plugin; }
            """
        let hog = try PluginFactory(directory: scratch.directory("hog"))
            .buildC("Hog", source: source, manifest: PluginFactory.manifest(plugin: "Hog", modules: ["hog"]))
        let h = try DaemonLifecycleTests.Harness(["Counter"], files: [liar, hog], arguments: ["--event-deadline", "1"],
                                                 config: #"{"plugins": {"Liar": {"isolation": "process"}, "Hog": {"isolation": "process"}}}"#)
        #expect(await h.waitFor("control socket ready"), "\(h.daemon.text)")
        let liarPid = try #require(try h.modules()["liar"]?["workerPid"] as? Int)
        _ = try h.ctl("send", "big", "--to", "hog")
        let awaited = try h.ctl("send", "hello", "--to", "liar", "--await")
        #expect(awaited.status == 0, "\(awaited.standardError)\n\(h.daemon.text)")
        #expect(await h.waitFor("plugin Hog's worker"), "\(h.daemon.text)")
        let log = h.daemon.text
        #expect(log.contains("is outside 1...1048576"), "\(log)")
        #expect(!log.contains("plugin Liar's worker"), "\(log)")
        #expect(try h.modules()["liar"]?["workerPid"] as? Int == liarPid)
        await Self.stop(h)
    }
}
