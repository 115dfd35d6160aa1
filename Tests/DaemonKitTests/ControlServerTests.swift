import DaemonKit
import Foundation
import Synchronization
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The control socket with real clients: concurrent, malformed, oversized, slow, and of
/// another uid.
@Suite(.timeLimit(.minutes(5)))
struct ControlServerTests {
    /// A server in a fresh directory with an echo handler that records who asked, and a
    /// rejection reply that records what it refused.
    final class Fixture: Sendable {
        let directory: TemporaryDirectory
        let server: ControlServer
        let peers = Collector<PeerCredentials>()
        let rejections = Collector<ControlRejection>()
        var path: String { server.socketPath }

        init(directoryMode: mode_t = 0o700, configuration: ControlServer.Configuration = .init(),
             handler: ControlServer.Handler? = nil) throws
        {
            directory = try TemporaryDirectory(mode: directoryMode)
            let peers = self.peers, rejections = self.rejections
            server = try ControlServer(socketPath: directory.file("ctl.sock"), configuration: configuration,
                                       rejectionReply: { rejections.append($0); return ControlServerTests.rejected($0) }) {
                request, peer in
                peers.append(peer)
                if let handler { return await handler(request, peer) }
                return "echo:\(request)"
            }
        }

        func finish() async {
            await server.stop()
            directory.remove()
        }
    }

    /// The error line of the tests' servers: the server writes whatever line it is given.
    /// Names the case, so that tests can tell which rejection a line reports.
    @Sendable static func rejected(_ rejection: ControlRejection) -> String {
        let tag = switch rejection {
        case .peerNotPermitted: "peer_not_permitted"
        case .lineTooLong: "request_too_long"
        case .invalidUTF8: "malformed_request"
        case .timedOut: "request_timeout"
        case .tooManyConnections, .tooManyConnectionsFromProcess: "too_many_connections"
        }
        return "rejected \"\(tag)\": \(rejection.description)"
    }

    @Test func servesARequestFromASocketWithMode0600() async throws {
        let fixture = try Fixture()
        var info = stat()
        #expect(lstat(fixture.path, &info) == 0)
        #expect(info.st_mode & S_IFMT == S_IFSOCK)
        #expect(info.st_mode & 0o777 == 0o600)

        let path = fixture.path
        let reply = await onThread { try? ControlClient.request("{\"cmd\":\"status\"}", socketPath: path) }
        #expect(reply == "echo:{\"cmd\":\"status\"}")
        #expect(fixture.peers.all == [PeerCredentials(pid: getpid(), uid: getuid(), gid: getgid())])
        await fixture.finish()
    }

    @Test func sixteenConcurrentClientsAreServedConcurrently() async throws {
        let inFlight = Mutex((now: 0, peak: 0))
        let fixture = try Fixture { request, _ in
            inFlight.withLock { $0.now += 1; $0.peak = max($0.peak, $0.now) }
            try? await Task.sleep(for: .milliseconds(20))
            inFlight.withLock { $0.now -= 1 }
            return "re:" + request
        }
        let path = fixture.path
        let failures = Collector<String>()
        await withTaskGroup(of: Void.self) { group in
            for client in 0..<16 {
                group.addTask {
                    await onThread {
                        do {
                            let connection = try ControlClient(socketPath: path, timeout: .seconds(30))
                            for request in 0..<10 {
                                let line = "client \(client) request \(request)"
                                let reply = try connection.request(line)
                                if reply != "re:" + line { failures.append("\(line) -> \(reply)") }
                            }
                        } catch {
                            failures.append("client \(client): \(error)")
                        }
                    }
                }
            }
        }
        #expect(failures.all.isEmpty)
        #expect(fixture.peers.all.count == 160)
        #expect(inFlight.withLock { $0.peak } > 1, "requests of different clients never overlapped")
        #expect(await eventually { fixture.server.connectionCount == 0 })
        await fixture.finish()
    }

    @Test func pipelinedRequestsAreAnsweredInOrder() async throws {
        let fixture = try Fixture()
        let connection = try RawConnection(fixture.path)
        connection.send("one\r\ntwo\n\nthree\n")
        let (lines, _) = await onThread { connection.readLines(3) }
        #expect(lines == ["echo:one", "echo:two", "echo:three"])
        await fixture.finish()
    }

    @Test func invalidUTF8GetsAnErrorAndTheConnectionStaysUsable() async throws {
        let fixture = try Fixture()
        let connection = try RawConnection(fixture.path)
        connection.send([0x66, 0xff, 0xfe, 0x0a])
        connection.send("fine\n")
        let (lines, eof) = await onThread { connection.readLines(2) }
        #expect(lines.count == 2)
        #expect(lines.first == "rejected \"malformed_request\": request line is not valid UTF-8")
        #expect(lines.last == "echo:fine")
        // The bad line itself, for the protocol's reply to point at its first bad byte.
        #expect(fixture.rejections.all == [.invalidUTF8(line: [0x66, 0xff, 0xfe])])
        #expect(!eof)
        #expect(fixture.peers.all.count == 1)  // the handler never saw the bad line
        await fixture.finish()
    }

    @Test func oversizedLinesGetAnErrorAndAreDisconnected() async throws {
        var configuration = ControlServer.Configuration()
        configuration.maximumLineLength = 64 * 1024
        let fixture = try Fixture(configuration: configuration)

        // Without a newline: the server must not buffer forever.
        let endless = try RawConnection(fixture.path)
        let sender = Task.detached { endless.send([UInt8](repeating: 0x61, count: 1 << 20)) }
        let (lines, eof) = await onThread { endless.readLines(1) }
        #expect(lines.first?.contains("\"request_too_long\"") == true)
        #expect(eof || endless.waitForEOF())
        await sender.value

        // With a newline, just over the limit.
        let long = try RawConnection(fixture.path)
        long.send(String(repeating: "b", count: 64 * 1024 + 1) + "\n")
        let (longLines, _) = await onThread { long.readLines(1) }
        #expect(longLines.first?.contains("\"request_too_long\"") == true)
        #expect(await onThread { long.waitForEOF() })

        // Exactly at the limit is accepted.
        let path = fixture.path
        let maximal = String(repeating: "c", count: 64 * 1024)
        let reply = await onThread { try? ControlClient.request(maximal, socketPath: path) }
        #expect(reply == "echo:" + maximal)
        #expect(fixture.peers.all.count == 1)
        await fixture.finish()
    }

    @Test func aSlowClientTimesOutWithoutDelayingOthers() async throws {
        var configuration = ControlServer.Configuration()
        configuration.requestTimeout = .milliseconds(500)
        configuration.idleTimeout = .milliseconds(500)
        let fixture = try Fixture(configuration: configuration)
        let path = fixture.path

        let slow = try RawConnection(fixture.path)
        slow.send("{\"cmd\":")  // and never finishes the line
        let silent = try RawConnection(fixture.path)  // never sends anything

        // Others are served while those two hang around.
        for index in 0..<5 {
            let reply = await onThread { try? ControlClient.request("ping \(index)", socketPath: path) }
            #expect(reply == "echo:ping \(index)")
        }
        let (lines, _) = await onThread { slow.readLines(1) }
        #expect(lines.first?.contains("\"request_timeout\"") == true)
        #expect(await onThread { slow.waitForEOF() })
        // An idle connection is closed without a reply.
        let (silentLines, silentEOF) = await onThread { silent.readLines(1) }
        #expect(silentLines.isEmpty && silentEOF)
        #expect(await eventually { fixture.server.connectionCount == 0 })
        await fixture.finish()
    }

    @Test func aStaleSocketIsReplacedButALiveServerIsNot() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("ctl.sock")

        // A socket file left behind by a dead daemon: bound, never listening, closed.
        let dead = boundUnixSocket(path)
        #expect(dead >= 0)
        close(dead)

        let first = try ControlServer(socketPath: path, rejectionReply: Self.rejected) { request, _ in "first:" + request }
        #expect(await onThread { try? ControlClient.request("x", socketPath: path) } == "first:x")

        #expect(throws: ControlSocketError.alreadyRunning(path: path)) {
            _ = try ControlServer(socketPath: path, rejectionReply: Self.rejected) { request, _ in "second:" + request }
        }
        // The refused second server left the first one's socket alone.
        #expect(await onThread { try? ControlClient.request("y", socketPath: path) } == "first:y")
        await first.stop()
    }

    /// A server that stops keeping its listener hands it to the next one (a daemon that
    /// executes itself again): the socket file stays, and a client that connected while no
    /// server accepted waits in the backlog and is answered by the next.
    @Test func aListenerKeptForTheNextServerLosesNoClient() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("ctl.sock")
        let first = try ControlServer(socketPath: path, rejectionReply: Self.rejected) { request, _ in "first:" + request }
        #expect(await onThread { try? ControlClient.request("x", socketPath: path) } == "first:x")
        let listener = try #require(await first.stopKeepingListener())
        #expect(FileManager.default.fileExists(atPath: path))
        // Connected while nobody accepts.
        let waiting = try ControlClient(socketPath: path, timeout: .seconds(20))
        defer { waiting.close() }
        let second = try ControlServer(socketPath: path, listener: listener, rejectionReply: Self.rejected) { request, _ in
            "second:" + request
        }
        #expect(await onThread { try? waiting.request("y") } == "second:y")
        #expect(await onThread { try? ControlClient.request("z", socketPath: path) } == "second:z")
        await second.stop()
        #expect(!FileManager.default.fileExists(atPath: path))
    }

    /// A descriptor that is not a listening socket bound to the path is closed, and the
    /// server makes its own socket.
    @Test func aListenerThatIsNotTheSocketsIsNotTaken() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("ctl.sock")
        let stranger = open("/dev/null", O_RDONLY)
        let server = try ControlServer(socketPath: path, listener: stranger, rejectionReply: Self.rejected) { request, _ in "own:" + request }
        // Closed (its number may hold the server's own socket now).
        let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(stranger)")
        #expect(target != "/dev/null", "the stranger descriptor was not closed")
        #expect(await onThread { try? ControlClient.request("x", socketPath: path) } == "own:x")
        await server.stop()
    }

    @Test func aFileThatIsNotASocketIsLeftAlone() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("ctl.sock")
        try writeFile(path, "precious")
        #expect(throws: ControlSocketError.notASocket(path: path)) {
            _ = try ControlServer(socketPath: path, rejectionReply: Self.rejected) { request, _ in request }
        }
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "precious")
    }

    @Test func stopClosesIdleConnectionsFinishesRequestsAndUnlinksTheSocket() async throws {
        let gate = Collector<Bool>()
        let entered = Collector<Bool>()
        let fixture = try Fixture { request, _ in
            if request == "wait" {
                entered.append(true)
                _ = await gate.waitFor { !$0.isEmpty }
            }
            return "done:" + request
        }
        let path = fixture.path
        let idle = try RawConnection(path)
        let busy = try ControlClient(socketPath: path, timeout: .seconds(30))
        let pending = Task.detached { await onThread { try? busy.request("wait") } }
        #expect(await entered.waitFor { !$0.isEmpty })

        let stopped = Task { await fixture.server.stop() }
        #expect(await onThread { idle.waitForEOF() })
        #expect(await eventually { access(path, F_OK) != 0 })  // unlinked while draining
        gate.append(true)
        #expect(await pending.value == "done:wait")  // the in-flight request was answered
        await stopped.value
        #expect(fixture.server.connectionCount == 0)
        #expect(throws: ControlSocketError.self) { try busy.request("again") }
        await fixture.server.stop()  // idempotent
        fixture.directory.remove()
    }

    @Test func stopLeavesAReplacementSocketAlone() async throws {
        let fixture = try Fixture()
        let path = fixture.path
        // Someone replaced the socket file (e.g. a new daemon after a forced takeover).
        #expect(unlink(path) == 0)
        try writeFile(path, "not ours")
        await fixture.server.stop()
        #expect(access(path, F_OK) == 0)
        fixture.directory.remove()
    }

    @Test func connectionsDoNotLeakDescriptors() async throws {
        let fixture = try Fixture()
        let path = fixture.path
        let before = openDescriptorCount()
        let failures = await onThread { () -> Int in
            var failures = 0
            for index in 0..<200 {
                if (try? ControlClient.request("n\(index)", socketPath: path)) != "echo:n\(index)" { failures += 1 }
            }
            return failures
        }
        #expect(failures == 0)
        #expect(await eventually { fixture.server.connectionCount == 0 })
        await fixture.finish()
        // Other suites run in parallel and open descriptors too; a leak of one per
        // connection would show as +200 or more.
        #expect(openDescriptorCount() < before + 100)
    }

    @Test func theClientTimesOutOnASilentServerAndReportsMissingSockets() async throws {
        let release = Collector<Bool>()
        let fixture = try Fixture { request, _ in
            _ = await release.waitFor(timeout: .seconds(60)) { !$0.isEmpty }
            return request
        }
        let path = fixture.path
        let outcome = await onThread { () -> ControlSocketError? in
            do {
                _ = try ControlClient.request("hang", socketPath: path, timeout: .milliseconds(300))
                return nil
            } catch { return error as? ControlSocketError }
        }
        guard case .timedOut = outcome else {
            Issue.record("expected a timeout, got \(String(describing: outcome))")
            return
        }
        release.append(true)
        await fixture.finish()

        do {
            _ = try ControlClient(socketPath: fixture.directory.file("missing.sock"))
            Issue.record("connecting to a missing socket should fail")
        } catch {
            #expect(error == .system(SystemError("connect", code: ENOENT, subject: fixture.directory.file("missing.sock"))))
        }
    }

    /// A server of `limit` connections whose handler holds a request `hold` until released.
    static func holdingFixture(limit: Int, release: Collector<Bool>, grace: Duration = .milliseconds(250)) throws -> Fixture {
        var configuration = ControlServer.Configuration()
        configuration.maximumConnections = limit
        configuration.evictionGrace = grace
        return try Fixture(configuration: configuration) { request, _ in
            if request == "hold" { _ = await release.waitFor(timeout: .seconds(60)) { !$0.isEmpty } }
            return "echo:\(request)"
        }
    }

    @Test func tooManyConnectionsAreRefusedWithAnError() async throws {
        let release = Collector<Bool>()
        let fixture = try Self.holdingFixture(limit: 2, release: release, grace: .zero)
        let first = try RawConnection(fixture.path)
        let second = try RawConnection(fixture.path)
        // Both have a request in the handler: neither can make room.
        first.send("hold\n")
        second.send("hold\n")
        #expect(await eventually { fixture.peers.all.count == 2 })
        let third = try RawConnection(fixture.path)
        let (lines, _) = await onThread { third.readLines(1) }
        #expect(lines.first?.contains("\"too_many_connections\"") == true)
        release.append(true)
        #expect(await onThread { first.readLines(1).lines } == ["echo:hold"])
        #expect(await onThread { second.readLines(1).lines } == ["echo:hold"])
        await fixture.finish()
    }

    /// A client that leaks connections, idle or with requests it never finishes, cannot
    /// lock the others out: when every slot is taken, the connection that has waited
    /// longest for a request (for at least the grace) is closed to make room. One with a
    /// request in the handler never is, nor one that has only just connected.
    @Test func theConnectionWaitingLongestMakesRoomForANewOne() async throws {
        let release = Collector<Bool>()
        let fixture = try Self.holdingFixture(limit: 3, release: release, grace: .seconds(1))
        let busy = try RawConnection(fixture.path)
        busy.send("hold\n")  // in the handler
        #expect(await eventually { fixture.peers.all.count == 1 })
        let connected = ContinuousClock.now
        let slow = try RawConnection(fixture.path)
        slow.send("{\"cmd\":")  // part of a request, never finished
        let idle = try RawConnection(fixture.path)
        #expect(await eventually { fixture.server.connectionCount == 3 })
        // Within the grace, nobody makes room: the newcomer is refused. (Asserted only when
        // this machine got here within the grace.)
        let early = try RawConnection(fixture.path)
        let refusal = await onThread { early.readLines(1).lines }
        if ContinuousClock.now - connected < .milliseconds(900) {
            #expect(refusal.first?.contains("\"too_many_connections\"") == true, "\(refusal)")
        }
        // Past the grace for both, with a second to spare for their threads to start waiting.
        try await Task.sleep(until: connected + .seconds(2))
        var newcomers: [RawConnection] = []  // kept open: each holds its place
        for round in 0..<2 {
            let newcomer = try RawConnection(fixture.path)
            newcomers.append(newcomer)
            newcomer.send("hello \(round)\n")
            #expect(await onThread { newcomer.readLines(1).lines } == ["echo:hello \(round)"])
        }
        // Each newcomer took the place of one that had waited past the grace (the slow one
        // and the idle one, in the order their threads began to wait), not of the busy one
        // nor of the first newcomer, which had waited less.
        #expect(await onThread { slow.waitForEOF(timeout: .seconds(10)) })
        #expect(await onThread { idle.waitForEOF(timeout: .seconds(10)) })
        release.append(true)
        #expect(await onThread { busy.readLines(1).lines } == ["echo:hold"])
        #expect(newcomers.count == 2)
        await fixture.finish()
    }

    /// Outside attack: connections whose client sent requests and never read the replies
    /// kept their places until the write timeout, and a client reconnecting as each was
    /// dropped kept every place taken: no one else was served. A connection blocked writing
    /// a reply its client does not read, for the grace, makes room as an idle one does.
    @Test func aConnectionWhoseClientDoesNotReadMakesRoom() async throws {
        var configuration = ControlServer.Configuration()
        configuration.maximumConnections = 2
        configuration.evictionGrace = .milliseconds(250)
        configuration.writeTimeout = .seconds(120)  // only eviction can end them within the test
        let fixture = try Fixture(configuration: configuration)
        let deaf = try (0..<2).map { _ in try RawConnection(fixture.path) }
        // Replies of 60 KB, never read: the server's writes block once the socket is full.
        let line = String(repeating: "x", count: 60_000) + "\n"
        for connection in deaf {
            Thread { for _ in 0..<20 { connection.send(line) } }.start()
        }
        #expect(await eventually { fixture.server.connectionCount == 2 })
        let served = await eventually(timeout: .seconds(30)) {
            guard let probe = try? RawConnection(fixture.path) else { return false }
            probe.send("hello\n")
            return probe.readLines(1).lines == ["echo:hello"]
        }
        #expect(served, "\(fixture.rejections.all.map(\.description))")
        #expect(await onThread { deaf.contains { $0.waitForEOF(timeout: .seconds(10)) } })
        // A deaf one left in place would hold the server's stop for its write timeout.
        for connection in deaf { shutdown(connection.fd, Int32(SHUT_RDWR)) }
        await fixture.finish()
    }

    @Test func aPeerOfAnotherUserIsRefused() async throws {
        // `nobody` must be able to reach the socket for SO_PEERCRED to be what refuses it.
        var configuration = ControlServer.Configuration()
        configuration.socketMode = 0o666
        let fixture = try Fixture(directoryMode: 0o755, configuration: configuration)
        let path = fixture.path
        #expect(getuid() == 0, "this test needs root to switch to uid 65534")

        // A child process drops to nobody and talks to the server: exit 0 means it got the
        // refusal line, 2 that it was served, 3 that it could not even connect.
        await #expect(processExitsWith: .exitCode(0)) { [path = path as String] in
            guard setgroups(0, nil) == 0, setgid(65534) == 0, setuid(65534) == 0, getuid() == 65534 else { exit(4) }
            do {
                let reply = try ControlClient.request("hello", socketPath: path, timeout: .seconds(20))
                guard reply.contains("\"peer_not_permitted\"") else { exit(2) }
                // The message says which uids are allowed (the server runs as root here).
                exit(reply.contains("peer uid 65534 is not permitted: only uid 0 (root) may use this socket") ? 0 : 5)
            } catch {
                exit(3)
            }
        }
        #expect(!fixture.peers.all.contains { $0.uid == 65534 }, "the handler saw the refused peer")
        // Root, same path, same socket: served.
        #expect(await onThread { try? ControlClient.request("root", socketPath: path) } == "echo:root")
        await fixture.finish()
    }

    @Test func aClientRefusesAListenerItDoesNotTrustBeforeSendingAnything() async throws {
        let fixture = try Fixture()
        let path = fixture.path
        let refused = await onThread { () -> ControlSocketError? in
            do throws(ControlSocketError) {
                _ = try ControlClient(socketPath: path, trust: { $0.uid == 4_000_000_000 })
                return nil
            } catch {
                return error
            }
        }
        guard case .untrustedPeer(let socket, let peer)? = refused else {
            Issue.record("expected untrustedPeer, got \(String(describing: refused))")
            return
        }
        #expect(socket == path)
        #expect(peer.uid == geteuid())
        #expect(peer.pid == getpid())
        #expect(fixture.peers.all.isEmpty, "the client sent a request to an untrusted listener")
        // The default trusts our own uid (and root).
        #expect(await onThread { try? ControlClient.request("ok", socketPath: path) } == "echo:ok")
        await fixture.finish()
    }

    /// The client's default trust: root, our uid, and the `modhostd` service account that
    /// the systemd unit runs the daemon as (so root's modhostctl reaches it); nobody else.
    @Test func theDefaultTrustIsRootOurUidAndTheServiceAccount() {
        let service: uid_t = 4_000_000_001
        func peer(_ uid: uid_t) -> PeerCredentials { PeerCredentials(pid: 1, uid: uid, gid: uid) }
        #expect(ControlServer.trustedDaemon(peer(0), serviceUID: service))
        #expect(ControlServer.trustedDaemon(peer(geteuid()), serviceUID: service))
        #expect(ControlServer.trustedDaemon(peer(service), serviceUID: service))
        #expect(!ControlServer.trustedDaemon(peer(65534), serviceUID: service))
        #expect(!ControlServer.trustedDaemon(peer(service), serviceUID: nil))
        #expect(ControlServer.serviceUserID() == getpwnam("modhostd")?.pointee.pw_uid)
    }
}
