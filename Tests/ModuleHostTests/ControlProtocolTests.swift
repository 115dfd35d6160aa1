import ControlProtocol
import DaemonKit
import Foundation
import Glibc
import ModuleHost
import ModuleKit
import PluginCall
import Synchronization
import Testing
import TestSupport

/// The control protocol end to end: `ControlService` behind a real `ControlServer` socket,
/// `ControlClient` and the `modhostctl` executable as clients.
@Suite(.timeLimit(.minutes(5))) struct ControlProtocolTests {
    /// A service for a fresh `RecordingDaemon`, served on a socket in a temporary directory.
    final class Fixture: Sendable {
        let directory = TemporaryDirectory("ctl")
        let daemon: RecordingDaemon
        let service: ControlService
        let server: ControlServer
        var socketPath: String { server.socketPath }

        init(configuration: ControlServer.Configuration = .init(), reloadDelay: Duration = .zero) throws {
            daemon = RecordingDaemon(reloadDelay: reloadDelay)
            service = ControlService(daemon: daemon)
            server = try service.makeServer(socketPath: directory.file("ctl.sock"), configuration: configuration)
        }

        /// Sends `lines` in order on one connection and returns the replies (or the error
        /// that ended the exchange).
        func exchange(_ lines: [String]) async throws -> [Reply] {
            let path = socketPath
            let texts = await ControlProtocolTests.onThread { () -> Result<[String], ControlSocketError> in
                do throws(ControlSocketError) {
                    let client = try ControlClient(socketPath: path, timeout: .seconds(30))
                    defer { client.close() }
                    var replies: [String] = []
                    for line in lines { replies.append(try client.request(line)) }
                    return .success(replies)
                } catch {
                    return .failure(error)
                }
            }
            return try texts.get().map(Reply.init)
        }

        func ask(_ line: String) async throws -> Reply { try await exchange([line])[0] }

        /// Runs modhostctl against this server.
        func modhostctl(_ arguments: [String]) async throws -> ProcessResult {
            let path = socketPath
            return try await ControlProtocolTests.onThread { Result { try run(BuildProducts.modhostctl, ["--socket", path] + arguments) } }.get()
        }

        func stop() async { await server.stop() }
    }

    // MARK: Every command

    @Test func listStatusAndInfoReturnWhatTheDaemonSays() async throws {
        let fixture = try Fixture()
        let replies = try await fixture.exchange([
            #"{"v":1,"id":1,"cmd":"list"}"#, #"{"v":1,"id":"two","cmd":"status"}"#, #"{"v":1,"id":3,"cmd":"info"}"#,
        ])
        #expect(replies.map(\.ok) == [true, true, true])
        #expect(replies.map(\.id) == [1, "two", 3])
        #expect(replies.map(\.version) == [1, 1, 1])
        #expect(try replies[0].decode([ModuleRow].self, "modules") == RecordingDaemon.rows)
        #expect(try replies[1].decode(DaemonStatus.self) == RecordingDaemon.status)
        #expect(replies[2].result == RecordingDaemon.info)
        #expect(await fixture.daemon.calls == ["moduleRows", "status", "infoPayload"])
        await fixture.stop()
    }

    @Test func enableAndDisableReachTheDaemonAndItsErrorsComeBack() async throws {
        let fixture = try Fixture()
        let replies = try await fixture.exchange([
            #"{"v":1,"id":1,"cmd":"enable","module":"greeting"}"#,
            #"{"v":1,"id":2,"cmd":"disable","module":"counter"}"#,
            #"{"v":1,"id":3,"cmd":"disable","module":"nope"}"#,
        ])
        #expect(replies[0].text == #"{"id":1,"ok":true,"result":{"enabled":true,"module":"greeting"},"v":1}"#)
        #expect(replies[1].text == #"{"id":2,"ok":true,"result":{"enabled":false,"module":"counter"},"v":1}"#)
        #expect(replies[2].text == #"{"error":{"code":"unknown_module","message":"no module named nope"},"id":3,"ok":false,"v":1}"#)
        #expect(await fixture.daemon.calls == ["setEnabled true greeting", "setEnabled false counter", "setEnabled false nope"])
        await fixture.stop()
    }

    @Test func reloadReturnsTheSummary() async throws {
        let fixture = try Fixture()
        let reply = try await fixture.ask(#"{"v":1,"id":9,"cmd":"reload"}"#)
        #expect(reply.ok == true)
        #expect(try reply.decode(ReloadSummary.self) == RecordingDaemon.summary)
        #expect(await fixture.daemon.calls == ["reload"])
        await fixture.stop()
    }

    @Test func sendPassesEventPayloadTargetAndAwait() async throws {
        let fixture = try Fixture()
        let replies = try await fixture.exchange([
            #"{"v":1,"id":1,"cmd":"send","event":"flush"}"#,
            #"{"v":1,"id":2,"cmd":"send","event":"configure","payload":{"level":3,"tags":["a","b"],"x":null},"to":"greeting","await":true}"#,
            #"{"v":1,"id":3,"cmd":"send","event":"flush","to":"nope"}"#,
        ])
        #expect(replies[0].text == #"{"id":1,"ok":true,"result":{"awaited":false,"event":"flush","to":null},"v":1}"#)
        #expect(replies[1].text == #"{"id":2,"ok":true,"result":{"awaited":true,"event":"configure","to":"greeting"},"v":1}"#)
        #expect(replies[2].code == "unknown_module")
        #expect(await fixture.daemon.calls == [
            "send flush null * false",
            #"send configure {"level":3,"tags":["a","b"],"x":null} greeting true"#,
            "send flush null nope false",
        ])
        await fixture.stop()
    }

    @Test func postPassesTheNotificationAndPayloadAndNamesTheListeners() async throws {
        let fixture = try Fixture()
        let replies = try await fixture.exchange([
            #"{"v":1,"id":1,"cmd":"post","notification":"tick","payload":{"n":1}}"#,
            #"{"v":1,"id":2,"cmd":"post","notification":"quiet"}"#,
            #"{"v":1,"id":3,"cmd":"post"}"#,
            #"{"v":1,"id":4,"cmd":"post","notification":"bad\u0000name"}"#,
        ])
        #expect(replies[0].text == #"{"id":1,"ok":true,"result":{"listeners":["counter"],"notification":"tick"},"v":1}"#)
        #expect(replies[1].text == #"{"id":2,"ok":true,"result":{"listeners":[],"notification":"quiet"},"v":1}"#)
        #expect(replies[2].code == "invalid_request")
        #expect(replies[3].code == "invalid_request")
        #expect(await fixture.daemon.calls == [#"post tick {"n":1}"#, "post quiet null"])
        await fixture.stop()
    }

    @Test func callTakesTextOrJSONArgumentsAndReturnsValueTextAndType() async throws {
        let fixture = try Fixture()
        let replies = try await fixture.exchange([
            #"{"v":1,"id":1,"cmd":"call","plugin":"Calculator","function":"calc_add","args":["2","40"]}"#,
            #"{"v":1,"id":2,"cmd":"call","plugin":"Calculator","function":"calc_add","args":[-2,"0x10"]}"#,
            #"{"v":1,"id":3,"cmd":"call","plugin":"Calculator","function":"calc_half","args":["3"],"argsForm":"json"}"#,
            #"{"v":1,"id":4,"cmd":"call","plugin":"Calculator","function":"calc_big"}"#,
            #"{"v":1,"id":5,"cmd":"call","plugin":"Calculator","function":"calc_void","args":[]}"#,
            #"{"v":1,"id":6,"cmd":"call","plugin":"Calculator","function":"calc_bytes","args":["hex:0102ff"]}"#,
            #"{"v":1,"id":7,"cmd":"call","plugin":"Calculator","function":"calc_add","args":["2","x"]}"#,
            #"{"v":1,"id":8,"cmd":"call","plugin":"Nope","function":"f"}"#,
        ])
        #expect(replies[0].text
            == #"{"id":1,"ok":true,"result":{"function":"calc_add","plugin":"Calculator","text":"42","type":"i32","value":42},"v":1}"#)
        #expect(replies[1].result?["value"] == 14)
        #expect(replies[2].result?["value"] == 1.5)
        #expect(replies[2].result?["type"] == "f64")
        // Beyond 2^53 an integer is a decimal string, so no digit is lost.
        #expect(replies[3].result?["value"] == "18446744073709551615")
        #expect(replies[3].result?["text"] == "18446744073709551615")
        #expect(replies[4].result?["value"] == .null)
        #expect(replies[4].result?["type"] == "void")
        #expect(replies[5].result?["text"] == "hex:ff0201")
        #expect(replies[5].result?["value"] == .string(Data([0xff, 0x02, 0x01]).base64EncodedString()))
        #expect(replies[6].code == "invalid_arguments")
        #expect(replies[6].message?.contains("argument 2") == true)
        #expect(replies[7].code == "unknown_plugin")
        #expect(await fixture.daemon.calls == [
            #"call Calculator.calc_add text ["2", "40"]"#,
            #"call Calculator.calc_add json ["-2", "\"0x10\""]"#,
            #"call Calculator.calc_half json ["\"3\""]"#,
            "call Calculator.calc_big text []",
            "call Calculator.calc_void text []",
            #"call Calculator.calc_bytes text ["hex:0102ff"]"#,
            #"call Calculator.calc_add text ["2", "x"]"#,
            "call Nope.f text []",
        ])
        await fixture.stop()
    }

    /// Outside attack: a call whose result made an 80 MB reply line reached the client cut
    /// short, without its newline, and nothing said why; and modhostctl took a reply longer
    /// than it reads for a daemon it could not reach (exit 69). A reply longer than the
    /// 16 MiB a client reads is a `reply_too_large` error with the request's id, and
    /// modhostctl says it got a reply it cannot read (exit 1).
    @Test func aReplyLongerThanAClientReadsIsAnErrorNotACutLine() async throws {
        let fixture = try Fixture()
        let replies = try await fixture.exchange([
            #"{"v":1,"id":1,"cmd":"call","plugin":"Calculator","function":"calc_repeat","args":["17000000"]}"#,
            #"{"v":1,"id":2,"cmd":"call","plugin":"Calculator","function":"calc_repeat","args":["100000"]}"#,
        ])
        #expect(replies[0].code == "reply_too_large", "\(replies[0].text.prefix(300))")
        #expect(replies[0].text.hasPrefix(#"{"error":{"code":"reply_too_large","message":"the reply to call would be 3400"#)
                && replies[0].text.contains("the call ran, but its result is not sent") && replies[0].text.contains(#""id":1,"#),
                "\(replies[0].text.prefix(300))")
        #expect(replies[1].result?["value"] == .string(String(repeating: "a", count: 100_000)))
        // An error message a plugin made (an isolated plugin's call error) is cut, however
        // long, even escaped (each control character six bytes).
        let loud = try await fixture.ask(#"{"v":1,"id":3,"cmd":"call","plugin":"Calculator","function":"calc_shout","args":["5000000"]}"#)
        #expect(loud.code == "call_failed" && loud.text.utf8.count < 1 << 20, "\(loud.text.utf8.count) bytes")
        #expect(loud.text.contains("(cut: the message had 5000000 bytes)"), "\(loud.text.suffix(200))")
        await fixture.stop()

        // A listener that answers with a longer line than modhostctl reads.
        let directory = TemporaryDirectory("ctl")
        let path = directory.file("long.sock")
        let listener = boundUnixSocket(path)
        #expect(listener >= 0 && listen(listener, 1) == 0)
        Thread {
            let connection = accept(listener, nil, nil)
            var line = [UInt8](repeating: UInt8(ascii: "x"), count: (16 << 20) + 100) + [10]
            var sent = 0
            while sent < line.count {
                let n = line.withUnsafeMutableBytes { send(connection, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
                if n <= 0 { break }
                sent += n
            }
            close(connection)
        }.start()
        let result = try await Self.onThread { Result { try run(BuildProducts.modhostctl, ["--socket", path, "status"]) } }.get()
        close(listener)
        #expect(result.status == 1, "\(result.standardError)")
        #expect(result.standardError.contains("sent a reply this modhostctl cannot read: a reply line longer than 16777216 bytes"), "\(result.standardError)")
        #expect(!result.standardError.contains("cannot reach"), "\(result.standardError)")
    }

    /// Outside attack: one client process that opened connections until none was left
    /// (140 threads, each sending and never reading) kept every other client out, ping
    /// too. One process may hold at most half the connections; a client of another process
    /// is still served.
    @Test func oneProcessCannotTakeEveryConnection() async throws {
        var configuration = ControlServer.Configuration()
        configuration.maximumConnections = 8
        configuration.maximumConnectionsPerProcess = 4
        let fixture = try Fixture(configuration: configuration)
        var held: [RawConnection] = []
        for _ in 0..<4 {
            let connection = try RawConnection(fixture.socketPath)
            connection.send(#"{"cmd":"ping"}"# + "\n")
            #expect(await Self.onThread { connection.readLines(1).lines.first?.contains("pong") == true })
            held.append(connection)
        }
        let fifth = try RawConnection(fixture.socketPath)
        let refusal = await Self.onThread { fifth.readLines(1).lines }
        #expect(refusal.first?.contains("\"too_many_connections\"") == true && refusal.first?.contains("this process has 4 connections open") == true,
                "\(refusal)")
        let other = try await fixture.modhostctl(["status"])
        #expect(other.status == 0, "\(other.standardError)")
        #expect(held.count == 4)
        await fixture.stop()
    }

    /// An optional field given as `null` counts as absent, `v` too (outside attack: `"v":null`
    /// was refused while `"argsForm":null` was taken as absent), as docs/control-protocol.md
    /// says.
    @Test func anOptionalFieldGivenAsNullCountsAsAbsent() async throws {
        let fixture = try Fixture()
        let replies = try await fixture.exchange([
            #"{"v":null,"id":1,"cmd":"status"}"#,
            #"{"v":1,"id":null,"cmd":"call","plugin":"Calculator","function":"calc_add","args":["1","2"],"argsForm":null}"#,
        ])
        #expect(replies[0].code == nil, "\(replies[0].text)")
        #expect(replies[1].result?["value"] == 3, "\(replies[1].text)")
        await fixture.stop()
    }

    @Test func versionAndPingAnswerWithoutTheDaemon() async throws {
        let fixture = try Fixture()
        let replies = try await fixture.exchange([#"{"v":1,"id":1,"cmd":"version"}"#, #"{"cmd":"ping"}"#])
        #expect(replies[0].result?["protocol"] == 1)
        #expect(replies[0].result?["commands"] == .array(ControlService.commands.map(JSONValue.string)))
        #expect(replies[0].result?["abi"] == .string("\(HostSDK.abiMajor).\(HostSDK.abiMinor)"))
        // What a Swift plugin must match: the ModuleKit and the compiler the daemon runs.
        #expect(replies[0].result?["moduleKit"] == "1.0")
        #expect(replies[0].result?["swift"] == .string(HostSDK.current.compilerVersion))
        // No "v" and no "id": version 1 is assumed and the id is null.
        #expect(replies[1].text == "{\"id\":null,\"ok\":true,\"result\":{\"pid\":\(getpid()),\"pong\":true},\"v\":1}")
        #expect(await fixture.daemon.calls.isEmpty)
        await fixture.stop()
    }

    @Test func unknownFieldsAreIgnored() async throws {
        let fixture = try Fixture()
        let reply = try await fixture.ask(#"{"v":1,"id":1,"cmd":"enable","module":"greeting","future":{"x":[1]},"force":true}"#)
        #expect(reply.ok == true)
        #expect(await fixture.daemon.calls == ["setEnabled true greeting"])
        await fixture.stop()
    }

    // MARK: Bad input

    static let badRequests: [BadRequest] = [
        BadRequest(#"{"v":1,"id":1,"cmd":"list""#, "malformed_request", "request is not valid JSON at byte 26", .null),
        BadRequest("hello", "malformed_request", "not valid JSON at byte 0", .null),
        BadRequest("[1,2]", "malformed_request", "request must be a JSON object, not an array", .null),
        BadRequest(#""list""#, "malformed_request", "request must be a JSON object, not a string", .null),
        BadRequest(#"{"id":3,"cmd":"frobnicate"}"#, "unknown_command", #"unknown command "frobnicate"; commands: call, disable"#, 3),
        BadRequest(#"{"id":4}"#, "invalid_request", #"missing "cmd""#, 4),
        BadRequest(#"{"id":"x","cmd":5}"#, "invalid_request", #""cmd" must be a string, not a number"#, "x"),
        BadRequest(#"{"v":2,"id":5,"cmd":"list"}"#, "unsupported_version",
            "protocol version 2 is not supported; this daemon speaks version 1", 5),
        BadRequest(#"{"v":"1","cmd":"list"}"#, "invalid_request", #""v" must be an integer (the protocol version, 1), not a string"#, .null),
        BadRequest(#"{"v":1.5,"cmd":"list"}"#, "invalid_request", "not 1.5", .null),
        BadRequest(#"{"id":{"n":1},"cmd":"list"}"#, "invalid_request", #""id" must be a string or an integer, not an object"#, .null),
        BadRequest(#"{"id":6,"cmd":"enable"}"#, "invalid_request", #"enable needs "module" (a string)"#, 6),
        BadRequest(#"{"cmd":"enable","module":5}"#, "invalid_request", #""module" must be a string, not a number"#, .null),
        BadRequest(#"{"cmd":"disable","module":""}"#, "invalid_request", #""module" must not be empty"#, .null),
        BadRequest(#"{"cmd":"send"}"#, "invalid_request", #"send needs "event" (a string)"#, .null),
        BadRequest(#"{"cmd":"send","event":"x","await":"yes"}"#, "invalid_request", #""await" must be true or false, not a string"#, .null),
        BadRequest(#"{"cmd":"send","event":"x","to":["a"]}"#, "invalid_request", #""to" must be a string, not an array"#, .null),
        BadRequest(#"{"cmd":"call","plugin":"Calculator"}"#, "invalid_request", #"call needs "function" (a string)"#, .null),
        BadRequest(#"{"cmd":"call","plugin":"Calculator","function":"calc_add","args":"2 40"}"#, "invalid_request",
            #""args" must be an array, not a string"#, .null),
        BadRequest(#"{"cmd":"call","plugin":"Calculator","function":"calc_add","args":[1,{"a":1}]}"#, "invalid_request",
            #""args"[1]: an object is not a valid call argument"#, .null),
        BadRequest(#"{"cmd":"call","plugin":"Calculator","function":"calc_add","args":["1",2],"argsForm":"text"}"#, "invalid_request",
            #""args"[1] must be a string when "argsForm" is "text", not a number"#, .null),
        BadRequest(#"{"cmd":"call","plugin":"Calculator","function":"calc_add","argsForm":"binary"}"#, "invalid_request",
         #""argsForm" must be "auto", "text" or "json", not "binary""#, .null),
        BadRequest(#"{"cmd":"send","event":"x","payload":"# + String(repeating: "[", count: 100) + String(repeating: "]", count: 100) + "}",
            "malformed_request", "nested deeper than 64 levels", .null),
    ]

    @Test(arguments: badRequests)
    func aBadRequestGetsAnErrorNamingTheProblemAndNeverReachesTheDaemon(request: BadRequest) async throws {
        let daemon = RecordingDaemon()
        let service = ControlService(daemon: daemon)
        let reply = try Reply(await service.handle(request.line, peer: PeerCredentials(pid: 1, uid: getuid(), gid: getgid())))
        #expect(reply.ok == false)
        #expect(reply.code == request.code)
        #expect(reply.message?.contains(request.message) == true, "\(reply.message ?? "no message")")
        #expect(reply.id == request.id)
        #expect(reply.version == 1)
        #expect(await daemon.calls.isEmpty)
        if request.code == "unsupported_version" { #expect(reply.object["error"]?["supported"] == [1]) }
    }

    @Test func aConnectionStaysUsableAfterBadRequests() async throws {
        let fixture = try Fixture()
        let lines = Self.badRequests.map(\.line) + [#"{"v":1,"id":99,"cmd":"list"}"#]
        let replies = try await fixture.exchange(lines)
        #expect(replies.dropLast().map(\.code) == Self.badRequests.map(\.code))
        #expect(replies.last?.ok == true)
        #expect(replies.last?.id == 99)
        #expect(await fixture.daemon.calls == ["moduleRows"])
        await fixture.stop()
    }

    @Test func anOversizedLineGetsAProtocolErrorAndTheServerServesOthers() async throws {
        var configuration = ControlServer.Configuration()
        configuration.maximumLineLength = 4096
        let fixture = try Fixture(configuration: configuration)
        let path = fixture.socketPath
        let huge = #"{"v":1,"id":1,"cmd":"send","event":"x","payload":""# + String(repeating: "a", count: 10_000) + "\"}"
        let outcome = await Self.onThread { () -> (String?, String) in
            guard let client = try? ControlClient(socketPath: path, timeout: .seconds(30)) else { return (nil, "connect") }
            let first = try? client.request(huge)
            // The server closed the connection after its error line.
            let second: String
            do throws(ControlSocketError) {
                second = try client.request(#"{"cmd":"ping"}"#)
            } catch {
                second = "\(error)"
            }
            return (first, second)
        }
        let reply = try Reply(try #require(outcome.0))
        #expect(reply.text == #"{"error":{"code":"request_too_long","message":"request line longer than 4096 bytes"},"id":null,"ok":false,"v":1}"#)
        #expect(outcome.1 == ControlSocketError.connectionClosed.description)
        #expect(try await fixture.ask(#"{"cmd":"ping","id":2}"#).ok == true)
        #expect(await fixture.daemon.calls.isEmpty)
        await fixture.stop()
    }

    @Test func invalidUTF8AndSlowRequestsGetProtocolErrors() async throws {
        var configuration = ControlServer.Configuration()
        configuration.requestTimeout = .milliseconds(300)
        let fixture = try Fixture(configuration: configuration)
        let path = fixture.socketPath
        let lines = await Self.onThread { () -> [String] in
            guard let connection = try? RawConnection(path) else { return ["connect failed"] }
            // Invalid UTF-8 keeps the connection open; then a valid request; then half a line.
            connection.send([0x7b, 0xff, 0xfe, 0x7d, 0x0a] + Array(#"{"cmd":"ping","id":1}"#.utf8) + [0x0a])
            connection.send(Array(#"{"cmd":"li"#.utf8))
            return connection.readLines(3, timeout: .seconds(20)).lines
        }
        #expect(lines.count == 3)
        guard lines.count == 3 else { return }
        let malformed = try Reply(lines[0]), ping = try Reply(lines[1]), slow = try Reply(lines[2])
        #expect(malformed.code == "malformed_request")
        #expect(malformed.message == "request line is not valid UTF-8 at byte 1")
        #expect(ping.ok == true && ping.id == 1)
        #expect(slow.code == "request_timeout")
        #expect(slow.version == 1)
        #expect(await fixture.daemon.calls.isEmpty)
        await fixture.stop()
    }

    // MARK: Many clients

    @Test func sixteenClientsWithTwentyRequestsEachGetTheirOwnReplies() async throws {
        let fixture = try Fixture()
        let path = fixture.socketPath
        let failures = Failures()
        await withTaskGroup(of: Void.self) { group in
            for client in 0..<16 {
                group.addTask {
                    await Self.onThread {
                        do {
                            let connection = try ControlClient(socketPath: path, timeout: .seconds(60))
                            defer { connection.close() }
                            for index in 0..<20 {
                                let id = client * 1000 + index
                                let line: String
                                switch index % 4 {
                                case 0: line = #"{"v":1,"id":\#(id),"cmd":"ping"}"#
                                case 1: line = #"{"v":1,"id":\#(id),"cmd":"list"}"#
                                case 2: line = #"{"v":1,"id":\#(id),"cmd":"call","plugin":"Calculator","function":"calc_add","args":["\#(client)","\#(index)"]}"#
                                default: line = #"{"v":1,"id":\#(id),"cmd":"status"}"#
                                }
                                let reply = try Reply(try connection.request(line))
                                var good = reply.ok == true && reply.id == .number(Double(id))
                                switch index % 4 {
                                case 1: good = good && (try? reply.decode([ModuleRow].self, "modules")) == RecordingDaemon.rows
                                case 2: good = good && reply.result?["value"] == .number(Double(client + index))
                                case 3: good = good && reply.result?["pid"] == 4242
                                default: good = good && reply.result?["pong"] == true
                                }
                                if !good { failures.append("\(line) -> \(reply.text)") }
                            }
                        } catch {
                            failures.append("client \(client): \(error)")
                        }
                    }
                }
            }
        }
        #expect(failures.all == [])
        let calls = await fixture.daemon.calls
        #expect(calls.count == 16 * 15)
        #expect(calls.filter { $0.hasPrefix("call Calculator.calc_add") }.count == 16 * 5)
        await fixture.stop()
    }

    @Test func aSlowRequestDoesNotHoldUpOtherClients() async throws {
        let fixture = try Fixture(reloadDelay: .seconds(3))
        let path = fixture.socketPath
        async let slow = fixture.ask(#"{"id":1,"cmd":"reload"}"#)
        // Wait until the reload is in the daemon, then time a ping on another connection.
        while !(await fixture.daemon.calls.contains("reload")) { try await Task.sleep(for: .milliseconds(10)) }
        let elapsed = await Self.onThread { () -> Duration in
            let start = ContinuousClock.now
            _ = try? ControlClient.request(#"{"cmd":"ping"}"#, socketPath: path, timeout: .seconds(30))
            return ContinuousClock.now - start
        }
        #expect(elapsed < .seconds(2))
        #expect(try await slow.ok == true)
        await fixture.stop()
    }

    // MARK: modhostctl as a process

    @Test func modhostctlListPrintsAnAlignedTableAndJSON() async throws {
        let fixture = try Fixture()
        let table = try await fixture.modhostctl(["list"])
        #expect(table.status == 0)
        let lines = table.standardOutput.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        #expect(lines.count == 6)  // header, two rows, blank, summary, final newline
        guard lines.count >= 5 else { return }
        let header = lines[0]
        #expect(header.split(separator: " ") == ["MODULE", "PLUGIN", "FILE", "VERSION", "STATE", "ORDER", "GEN", "ISOLATION", "PID", "RESTARTS", "LAST-ERROR"])
        #expect(lines[1].split(separator: " ", omittingEmptySubsequences: true)
            == ["greeting", "Greeting", "/srv/plugins/libGreeting.so", "1.2.0", "running", "10", "2", "-", "-", "-", "-"])
        #expect(lines[2].hasSuffix(" -         ELF format check failed: not an ELF file"))
        // Columns line up: every cell starts where its header does.
        for (name, cell) in [("STATE", "running"), ("GEN", "2"), ("FILE", "/srv"), ("LAST-ERROR", "-")] {
            let column = try #require(header.range(of: name)).lowerBound.utf16Offset(in: header)
            let row = lines[1]
            let start = row.index(row.startIndex, offsetBy: column)
            #expect(row[start...].hasPrefix(cell), "\(name) column")
        }
        let refusedState = lines[2].index(lines[2].startIndex, offsetBy: header.range(of: "STATE")!.lowerBound.utf16Offset(in: header))
        #expect(lines[2][refusedState...].hasPrefix("refused"))
        #expect(lines[4] == "2 entries (1 running, 1 refused)")

        let json = try await fixture.modhostctl(["list", "--json"])
        #expect(json.status == 0)
        let decoded = try JSONDecoder().decode([String: [ModuleRow]].self, from: Data(json.standardOutput.utf8))
        #expect(decoded["modules"] == RecordingDaemon.rows)
        #expect(await fixture.daemon.calls == ["moduleRows", "moduleRows"])
        await fixture.stop()
    }

    @Test func modhostctlStatusInfoAndReload() async throws {
        let fixture = try Fixture()
        let status = try await fixture.modhostctl(["status"])
        #expect(status.status == 0)
        #expect(status.standardOutput.contains("pid:                 4242\n"))
        #expect(status.standardOutput.contains("plugin directories:  /srv/plugins, /opt/plugins\n"))
        #expect(status.standardOutput.contains("retired generations: 1 (81920 bytes mapped)\n"))
        #expect(status.standardOutput.contains("configuration:       none\n"))
        let statusJSON = try await fixture.modhostctl(["--json", "status"])
        #expect(try JSONDecoder().decode(DaemonStatus.self, from: Data(statusJSON.standardOutput.utf8)) == RecordingDaemon.status)

        let info = try await fixture.modhostctl(["info", "--json"])
        #expect(info.status == 0)
        #expect(try JSONValue.parse(Array(info.standardOutput.utf8)) == RecordingDaemon.info)

        let reload = try await fixture.modhostctl(["reload"])
        #expect(reload.status == 0)
        #expect(reload.standardOutput == """
            configuration: changed
            added:         libNew.so
            replaced:      none
            removed:       libOld.so
            refused:       libBroken.so
            waiting-for-dependency: none
            quarantined:   none

            """)
        #expect(await fixture.daemon.calls == ["status", "status", "infoPayload", "reload"])
        await fixture.stop()
    }

    @Test func modhostctlCallPrintsTheResultAndTakesNegativeNumbers() async throws {
        let fixture = try Fixture()
        let add = try await fixture.modhostctl(["call", "Calculator", "calc_add", "2", "40"])
        #expect(add.status == 0)
        #expect(add.standardOutput == "42\n")
        let negative = try await fixture.modhostctl(["call", "Calculator", "calc_add", "-5", "3"])
        #expect(negative.standardOutput == "-2\n")
        #expect(negative.status == 0)
        let void = try await fixture.modhostctl(["call", "Calculator", "calc_void"])
        #expect(void.status == 0)
        #expect(void.standardOutput == "")
        let json = try await fixture.modhostctl(["call", "--json", "Calculator", "calc_half", "-3"])
        let result = try JSONValue.parse(Array(json.standardOutput.utf8))
        #expect(result["value"] == -1.5)
        #expect(result["type"] == "f64")
        let bad = try await fixture.modhostctl(["call", "Calculator", "calc_add", "2", "forty"])
        #expect(bad.status == 1)
        #expect(bad.standardError.contains("Error: calc_add: argument 2: "))
        #expect(bad.standardError.hasSuffix("(invalid_arguments)\n"))
        #expect(await fixture.daemon.calls == [
            #"call Calculator.calc_add text ["2", "40"]"#, #"call Calculator.calc_add text ["-5", "3"]"#,
            "call Calculator.calc_void text []", #"call Calculator.calc_half text ["-3"]"#,
            #"call Calculator.calc_add text ["2", "forty"]"#,
        ])
        await fixture.stop()
    }

    @Test func modhostctlEnableDisableAndSend() async throws {
        let fixture = try Fixture()
        let enable = try await fixture.modhostctl(["enable", "greeting"])
        #expect(enable.status == 0)
        #expect(enable.standardOutput == "enabled greeting\n")
        let disable = try await fixture.modhostctl(["disable", "nope"])
        #expect(disable.status == 1)
        #expect(disable.standardError == "Error: no module named nope (unknown_module)\n")
        let send = try await fixture.modhostctl(["send", "configure", "--payload", #"{"a":[1,2.5]}"#, "--to", "greeting", "--await"])
        #expect(send.status == 0)
        #expect(send.standardOutput == "sent configure to module greeting and awaited it\n")
        let plain = try await fixture.modhostctl(["send", "flush"])
        #expect(plain.standardOutput == "sent flush to every module\n")
        let post = try await fixture.modhostctl(["post", "tick", "--payload", "[1]"])
        #expect(post.standardOutput == "posted tick to counter\n")
        let unheard = try await fixture.modhostctl(["post", "quiet"])
        #expect(unheard.standardOutput == "posted quiet; no running module listens to it\n")
        #expect(await fixture.daemon.calls == [
            "setEnabled true greeting", "setEnabled false nope", #"send configure {"a":[1,2.5]} greeting true"#,
            "send flush null * false", "post tick [1]", "post quiet null",
        ])
        await fixture.stop()
    }

    @Test func modhostctlUsageErrorsExit64AndHelpExits0() async throws {
        let fixture = try Fixture()
        for arguments in [["enable"], ["list", "extra"], ["list", "--payload", "1"], ["send"], ["call", "Calculator"],
                          ["send", "x", "--payload", "{"], ["status", "--timeout", "soon"], ["post"], ["post", "a", "b"],
                          ["post", "x", "--to", "greeting"], ["post", "x", "--await"]]
        {
            let result = try await fixture.modhostctl(arguments)
            #expect(result.status == 64, "\(arguments)")
            #expect(result.standardError.hasPrefix("Error: "), "\(arguments)")
            #expect(result.standardError.contains("See 'modhostctl --help'."), "\(arguments)")
        }
        #expect(try await fixture.modhostctl(["send", "x", "--payload", "{"]).standardError
            .contains("--payload is not valid JSON at byte 1"))
        #expect(try await fixture.modhostctl(["list", "--payload", "1"]).standardError
            .contains("option '--payload' is not valid for list"))
        for command in ["list", "status", "info", "enable", "disable", "reload", "send", "post", "call"] {
            let help = try await fixture.modhostctl([command, "--help"])
            #expect(help.status == 0)
            #expect(help.standardOutput.hasPrefix("USAGE: modhostctl \(command)"), "\(command)")
        }
        let overall = try await fixture.modhostctl(["--help"])
        for command in ["list", "status", "info", "enable NAME", "disable NAME", "reload", "send EVENT", "post NAME", "call PLUGIN FUNCTION"] {
            #expect(overall.standardOutput.contains("  \(command)"), "\(command)")
        }
        #expect(await fixture.daemon.calls.isEmpty)
        await fixture.stop()
    }

    @Test func modhostctlExits69WhenNoDaemonListens() async throws {
        let directory = TemporaryDirectory("ctl")
        let missing = directory.file("none.sock")
        let result = try await Self.onThread { Result { try run(BuildProducts.modhostctl, ["--socket", missing, "list"]) } }.get()
        #expect(result.status == 69)
        #expect(result.standardError.hasPrefix("Error: cannot reach modhostd at \(missing): no socket at this path. modhostd is "))
        #expect(result.standardOutput == "")

        // A socket file nobody accepts on (a daemon that died).
        let stale = directory.file("stale.sock")
        let fd = boundUnixSocket(stale)
        #expect(fd >= 0)
        close(fd)
        let refused = try await Self.onThread { Result { try run(BuildProducts.modhostctl, ["--socket", stale, "status"]) } }.get()
        #expect(refused.status == 69)
        #expect(refused.standardError.contains("cannot reach modhostd at \(stale): nothing accepts connections"))
    }
}

/// Test doubles and helpers of the control protocol tests.
extension ControlProtocolTests {
    /// A `DaemonControl` that records every call it gets and answers like a small daemon:
    /// two known modules, a Calculator plugin whose functions really compute.
    actor RecordingDaemon: DaemonControl {
        private(set) var calls: [String] = []

        static let rows = [
            ModuleRow(module: "greeting", plugin: "Greeting", file: "/srv/plugins/libGreeting.so", version: "1.2.0",
                      state: "running", order: 10, generation: 2),
            ModuleRow(module: "-", plugin: "Broken", file: "/srv/plugins/libBroken.so", version: "", state: "refused",
                      lastError: "ELF format check failed: not an ELF file"),
        ]
        static let status = DaemonStatus(
            pid: 4242, uptimeSeconds: 12.5, ready: true, socketPath: "/run/user/1000/modhostd.sock",
            stateDirectory: "/var/lib/modhostd", configPath: nil, pluginDirectories: ["/srv/plugins", "/opt/plugins"],
            pluginsLoaded: 3, modulesRunning: 2, filesRefused: 1, retiredGenerations: 1, retiredBytes: 81920,
            crashGuarded: 0, reloads: 4)
        static let summary = ReloadSummary(configurationChanged: true, added: ["libNew.so"], replaced: [],
                                           removed: ["libOld.so"], refused: ["libBroken.so"])
        static let info: JSONValue = ["greeting": ["version": "1.2.0", "metadata": ["language": "swift", "tags": [1, 2]]]]
        static let modules: Set<String> = ["greeting", "counter"]
        static let signatures = ["calc_add": "i32(i32,i32)", "calc_half": "f64(f64)", "calc_big": "u64()",
                                 "calc_void": "void()", "calc_bytes": "buf(buf)", "calc_repeat": "str(u64)", "calc_shout": "void(u64)"]

        /// Wait this long inside `reload`, to hold a request in flight.
        private let reloadDelay: Duration

        init(reloadDelay: Duration = .zero) { self.reloadDelay = reloadDelay }

        func moduleRows() -> [ModuleRow] {
            calls.append("moduleRows")
            return Self.rows
        }

        func status() -> DaemonStatus {
            calls.append("status")
            return Self.status
        }

        func metrics() -> MetricsReport {
            calls.append("metrics")
            return Self.metricsReport
        }

        static let metricsReport = MetricsReport(
            daemon: .init(pluginsLoaded: 3, modulesRunning: 2, filesRefused: 1, pluginsAdded: 3, pluginsReplaced: 1,
                          pluginsRemoved: 0, refusals: 1, reloads: 4, imagesMapped: 4, imagesMappedBytes: 90000,
                          imagesRetired: 1, imagesRetiredBytes: 20000, imagesPrivate: 3, imagesPrivateBytes: 70000,
                          residentBytes: 1 << 24, mappings: 420, uptimeSeconds: 12.5),
            modules: [.init(ModuleMetricsSnapshot(module: "greeting", plugin: "Greeting", eventsDelivered: 7,
                                                  handlerTime: .empty, deadlineOverruns: 1, errors: [.refused: 0, .notDelivered: 2]))],
            events: [.init(event: "tick", deliveries: 5)], calls: [], workers: [])

        func setEnabled(_ enabled: Bool, module: String) throws(DaemonError) {
            calls.append("setEnabled \(enabled) \(module)")
            guard Self.modules.contains(module) else {
                throw DaemonError(.unknownModule, "no module named \(module)")
            }
        }

        func reload() async throws(DaemonError) -> ReloadSummary {
            calls.append("reload")
            if reloadDelay > .zero { try? await Task.sleep(for: reloadDelay) }
            return Self.summary
        }

        func send(event: String, payload: JSONValue, to module: String?, awaited: Bool) throws(DaemonError) {
            calls.append("send \(event) \(payload.jsonText) \(module ?? "*") \(awaited)")
            if let module, !Self.modules.contains(module) {
                throw DaemonError(.unknownModule, "no module named \(module)")
            }
        }

        func post(notification: String, payload: JSONValue) throws(DaemonError) -> [String] {
            calls.append("post \(notification) \(payload.jsonText)")
            return notification == "tick" ? ["counter"] : []
        }

        func call(plugin: String, function: String, arguments: CallArguments) throws(DaemonError) -> CallValue {
            switch arguments {
            case .texts(let texts): calls.append("call \(plugin).\(function) text \(texts)")
            case .json(let values): calls.append("call \(plugin).\(function) json \(values.map(\.jsonText))")
            }
            guard plugin == "Calculator" else { throw DaemonError(.unknownPlugin, "no plugin named \(plugin)") }
            guard let text = Self.signatures[function], let signature = try? Signature(parsing: text) else {
                throw DaemonError(.unknownFunction, "Calculator exports no function \(function)")
            }
            let values: [CallValue]
            do {
                switch arguments {
                case .texts(let texts): values = try signature.parseArguments(texts, function: function)
                case .json(let json): values = try signature.arguments(fromJSON: json, function: function)
                }
            } catch {
                throw DaemonError(.invalidArguments, "\(error)")
            }
            switch (function, values) {
            case ("calc_add", let values):
                guard case .int32(let a) = values[0], case .int32(let b) = values[1] else { break }
                return .int32(a &+ b)
            case ("calc_half", let values):
                guard case .double(let x) = values[0] else { break }
                return .double(x / 2)
            case ("calc_big", _):
                return .uint64(UInt64.max)
            case ("calc_void", _):
                return .void
            case ("calc_bytes", let values):
                guard case .bytes(let bytes) = values[0] else { break }
                return .bytes(bytes.reversed())
            case ("calc_shout", let values):
                // An error whose message is what a plugin said: as long as it likes.
                guard case .uint64(let count) = values[0] else { break }
                throw DaemonError(.callFailed, String(repeating: "\u{1}", count: Int(count)))
            case ("calc_repeat", let values):
                guard case .uint64(let count) = values[0] else { break }
                return .string(String(repeating: "a", count: Int(count)))
            default:
                break
            }
            throw DaemonError(.callFailed, "unexpected values \(values)")
        }

        func infoPayload() -> JSONValue {
            calls.append("infoPayload")
            return Self.info
        }
    }

    /// Runs blocking `body` on a fresh OS thread, so blocking clients and child processes never
    /// occupy the cooperative pool that the server's handler tasks need.
    static func onThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            Thread { continuation.resume(returning: body()) }.start()
        }
    }

    /// A reply line, parsed.
    struct Reply {
        let text: String
        let object: [String: JSONValue]

        init(_ text: String) throws {
            self.text = text
            guard case .object(let object) = try JSONValue.parse(Array(text.utf8)) else {
                throw UnexpectedReply(text: text)
            }
            self.object = object
        }

        var ok: Bool? { object["ok"]?.boolValue }
        var id: JSONValue? { object["id"] }
        var version: JSONValue? { object["v"] }
        var result: JSONValue? { object["result"] }
        var code: String? { object["error"]?["code"]?.stringValue }
        var message: String? { object["error"]?["message"]?.stringValue }

        func decode<T: Decodable>(_ type: T.Type, _ member: String? = nil) throws -> T {
            guard let value = member.map({ result?[$0] }) ?? result else { throw UnexpectedReply(text: text) }
            return try JSONDecoder().decode(T.self, from: Data(value.jsonText.utf8))
        }
    }

    /// Messages collected from many threads.
    final class Failures: Sendable {
        private let list = Mutex<[String]>([])
        func append(_ text: String) { list.withLock { $0.append(text) } }
        var all: [String] { list.withLock { $0 } }
    }

    struct UnexpectedReply: Error {
        var text: String
    }

    /// A request the service must refuse, the error code and message it must give, and the id
    /// the reply must carry.
    struct BadRequest: Sendable, CustomTestStringConvertible {
        var line: String
        var code: String
        var message: String
        var id: JSONValue
        var testDescription: String { String(line.prefix(60)) }

        init(_ line: String, _ code: String, _ message: String, _ id: JSONValue) {
            self.line = line
            self.code = code
            self.message = message
            self.id = id
        }
    }
}
