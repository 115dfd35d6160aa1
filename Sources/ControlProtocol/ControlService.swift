import DaemonKit
import ModuleHost
import ModuleKit
import PluginCall
import PluginFormat

#if canImport(Glibc)
import Glibc
#endif

/// The server side of the control protocol, version 1 (docs/control-protocol.md): turns
/// one request line into one reply line by calling a `DaemonControl`.
///
/// Guarantees:
/// - `handle` never throws, traps or hangs on its own: any input, however malformed, gets
///   exactly one reply line (no newline inside). Only the `DaemonControl` call it makes
///   can take time.
/// - Replies are compact JSON objects with sorted keys, so the same result always gives
///   the same text: `{"id":…,"ok":true,"result":…,"v":1}` or
///   `{"error":{"code":…,"message":…},"id":…,"ok":false,"v":1}`. `id` echoes the
///   request's `id` (a number, string or null), or is null when the request had none or
///   could not be read.
/// - A request that is not valid JSON, not an object, of another protocol version, of an
///   unknown command, or with a missing or wrongly typed field is answered with an error
///   naming the problem and never reaches the daemon. Unknown fields are ignored.
/// - The value is immutable and `Sendable`: one service serves every connection at once;
///   concurrent requests reach `daemon` concurrently (it serializes what it must).
public struct ControlService: Sendable {
    /// The protocol version this service speaks (the `v` field).
    public static let protocolVersion = 1

    /// Every command of protocol version 1, sorted.
    public static let commands = ["call", "disable", "enable", "info", "list", "metrics", "ping", "post", "reload", "send", "status", "version"]

    /// The daemon the requests are carried out on.
    public let daemon: any DaemonControl
    private let logger: Logger?

    /// A service for `daemon`. With a `logger`, every request that changes something
    /// (enable, disable, reload, send, post, call) is logged at info level with the peer's pid and
    /// uid, and rejected requests at debug level; without one, nothing is logged.
    public init(daemon: any DaemonControl, logger: Logger? = nil) {
        self.daemon = daemon
        self.logger = logger
    }

    /// The reply to a request that needs nothing of the daemon's tasks (`ping`, `version`,
    /// and every request refused for its form), made on the caller's thread; nil for the
    /// others, which `handle` answers. So `ping` answers even while plugin code holds every
    /// thread of Swift concurrency.
    public func immediateReply(_ line: String, peer: PeerCredentials) -> String? {
        var id = "null"
        do throws(DaemonError) {
            let request = try Request(line: line, idText: &id)
            guard let result = Self.immediateResult(request) else { return nil }
            return "{\"id\":\(id),\"ok\":true,\"result\":\(result),\"v\":\(Self.protocolVersion)}"
        } catch {
            logger?.debug("control request refused: \(error.message)",
                          [("code", error.code.rawValue), ("peer_pid", "\(peer.pid)"), ("peer_uid", "\(peer.uid)")])
            return Self.errorReply(error, idText: id)
        }
    }

    /// Answers one request line (without its newline) from `peer`. See the type's guarantees.
    public func handle(_ line: String, peer: PeerCredentials) async -> String {
        var id = "null"
        do throws(DaemonError) {
            let request = try Request(line: line, idText: &id)
            let result = try await perform(request, peer: peer)
            let reply = "{\"id\":\(id),\"ok\":true,\"result\":\(result),\"v\":\(Self.protocolVersion)}"
            // What a client reads at most: a longer line would be cut or refused by it.
            guard reply.utf8.count <= ControlClient.maximumReplyLength else {
                throw DaemonError(.replyTooLarge,
                                  "the reply to \(request.command) would be \(reply.utf8.count) bytes, more than the \(ControlClient.maximumReplyLength) a reply line may take: "
                                    + (request.command == "call" ? "the call ran, but its result is not sent; return less, or call the function from a host that embeds the plugin set"
                                                                 : "it is not sent"))
            }
            return reply
        } catch {
            logger?.debug("control request refused: \(error.message)",
                          [("code", error.code.rawValue), ("peer_pid", "\(peer.pid)"), ("peer_uid", "\(peer.uid)")])
            return Self.errorReply(error, idText: id)
        }
    }

    /// The reply line for a request the `ControlServer` refused on its own (oversized, slow,
    /// peer not permitted, too many connections, invalid UTF-8: with the offset of the first
    /// bad byte, as the JSON parser reports it), in this protocol's error form with a null
    /// `id`. `makeServer` installs it; a daemon that starts its own `ControlServer` passes it
    /// as `rejectionReply`.
    public static func rejectionReply(_ rejection: ControlRejection) -> String {
        var message = rejection.description
        if case .invalidUTF8(let line) = rejection {
            message += " at byte \(JSONSyntaxError(invalidUTF8In: line[...])?.offset ?? 0)"
        }
        return errorReply(DaemonError(rejection, message: message), idText: "null")
    }

    /// Starts a `ControlServer` at `socketPath` that answers with this service and reports
    /// its own rejections with `rejectionReply`; on `listener`, when given and valid (see
    /// `ControlServer.init`). Throws as `ControlServer.init` does.
    public func makeServer(socketPath: String, listener: Int32? = nil, configuration: ControlServer.Configuration = .init())
        throws(ControlSocketError) -> ControlServer
    {
        let service = self
        return try ControlServer(socketPath: socketPath, listener: listener, configuration: configuration,
                                 rejectionReply: Self.rejectionReply,
                                 immediate: { line, peer in service.immediateReply(line, peer: peer) }) { line, peer in
            await service.handle(line, peer: peer)
        }
    }

    // MARK: Commands

    /// Carries out a valid request; returns the result as JSON text.
    private func perform(_ request: Request, peer: PeerCredentials) async throws(DaemonError) -> String {
        switch request.command {
        case "list":
            return try Self.encode(["modules": await daemon.moduleRows()])
        case "status":
            return try Self.encode(await daemon.status())
        case "metrics":
            return try Self.encode(await daemon.metrics())
        case "info":
            return try await daemon.infoPayload().jsonText
        case "enable", "disable":
            let module = try request.moduleName("module")
            let enabled = request.command == "enable"
            audit("\(request.command) \(module)", peer)
            try await daemon.setEnabled(enabled, module: module)
            return JSONValue.object(["enabled": .bool(enabled), "module": .string(module)]).jsonText
        case "reload":
            audit("reload", peer)
            return try Self.encode(try await daemon.reload())
        case "send":
            let event = try request.moduleName("event")
            let payload = request.fields["payload"] ?? .null
            let target = try request.optionalModuleName("to")
            let awaited = try request.optionalBool("await") ?? false
            audit("send \(event)\(target.map { " to \($0)" } ?? "")\(awaited ? " (awaited)" : "")", peer)
            try await daemon.send(event: event, payload: payload, to: target, awaited: awaited)
            return JSONValue.object([
                "awaited": .bool(awaited), "event": .string(event), "to": target.map(JSONValue.string) ?? .null,
            ]).jsonText
        case "post":
            let notification = try request.moduleName("notification")
            let payload = request.fields["payload"] ?? .null
            audit("post \(notification)", peer)
            let listeners = try await daemon.post(notification: notification, payload: payload)
            return JSONValue.object([
                "listeners": .array(listeners.map(JSONValue.string)), "notification": .string(notification),
            ]).jsonText
        case "call":
            let plugin = try request.moduleName("plugin")
            let function = try request.name("function")
            let arguments = try request.callArguments()
            audit("call \(plugin).\(function)", peer)
            let value = try await daemon.call(plugin: plugin, function: function, arguments: arguments)
            return JSONValue.object([
                "function": .string(function), "plugin": .string(plugin), "text": .string(value.text),
                "type": .string(value.type.rawValue), "value": value.json,
            ]).jsonText
        default:
            if let result = Self.immediateResult(request) { return result }
            // Request(line:) lets only known commands through.
            throw DaemonError(.unknownCommand, "unknown command \"\(request.command)\"")
        }
    }

    /// The result of a request answered without the daemon (`ping`, `version`); nil for others.
    private static func immediateResult(_ request: Request) -> String? {
        switch request.command {
        case "version":
            JSONValue.object([
                "abi": .string("\(HostSDK.abiMajor).\(HostSDK.abiMinor)"),
                "commands": .array(Self.commands.map(JSONValue.string)),
                "moduleKit": .string(HostSDK.current.moduleKit),
                "protocol": .number(Double(Self.protocolVersion)),
                "release": .string(HostSDK.release),
                "swift": .string(HostSDK.current.compilerVersion),
            ]).jsonText
        case "ping":
            JSONValue.object(["pid": .number(Double(getpid())), "pong": true]).jsonText
        default:
            nil
        }
    }

    private func audit(_ what: String, _ peer: PeerCredentials) {
        logger?.info("control: \(what)", [("peer_pid", "\(peer.pid)"), ("peer_uid", "\(peer.uid)")])
    }

    // MARK: Encoding

    /// Compact JSON with sorted keys (`JSONValue.jsonText`, as every reply), for Codable
    /// results.
    private static func encode(_ value: some Encodable) throws(DaemonError) -> String {
        do {
            return try JSONValue(encoding: value).jsonText
        } catch {
            // Only a non-finite Double or an integer beyond 2^53 can get here.
            throw DaemonError(.internalError, "the result cannot be written as JSON: \(error)")
        }
    }

    /// The longest error message a reply carries, in bytes: a message made of what a
    /// plugin said (an isolated plugin's call error) is cut there, so that an error reply
    /// stays far below the longest reply line.
    static let maximumMessageLength = 64 << 10

    private static func errorReply(_ error: DaemonError, idText: String) -> String {
        var message = error.message
        if message.utf8.count > maximumMessageLength {
            let kept = String(decoding: message.utf8.prefix(maximumMessageLength), as: UTF8.self)
            message = kept + "… (cut: the message had \(message.utf8.count) bytes)"
        }
        var members: [String: JSONValue] = ["code": .string(error.code.rawValue), "message": .string(message)]
        if error.code == .unsupportedVersion { members["supported"] = [.number(Double(protocolVersion))] }
        return "{\"error\":\(JSONValue.object(members).jsonText),\"id\":\(idText),\"ok\":false,\"v\":\(protocolVersion)}"
    }
}

// MARK: Reading a request

/// A request that passed every check that does not need the daemon.
private struct Request {
    var command: String
    var fields: [String: JSONValue]

    /// Reads and checks the envelope: JSON object, `id`, `v`, `cmd`. Sets `idText` to the
    /// `id` to echo (JSON text) as soon as it is known, so later errors carry it.
    init(line: String, idText: inout String) throws(DaemonError) {
        let request: JSONValue
        do {
            request = try JSONValue.parse(Array(line.utf8))
        } catch {
            throw DaemonError(.malformedRequest, "request is \(error)")
        }
        guard case .object(let fields) = request else {
            throw DaemonError(.malformedRequest, "request must be a JSON object, not \(request.kind)")
        }
        self.fields = fields
        command = ""
        switch fields["id"] {
        case nil, .null?: break
        case .string(let text)?: idText = JSONValue.string(text).jsonText
        case .number(let number)?:
            // Only integers a double holds exactly come back exactly as sent.
            guard let integer = CheckedNumber.integer(number, in: Self.idRange) else {
                throw Self.invalid("\"id\" must be a string or an integer between -2^53 and 2^53, not \(JSONValue.number(number).jsonText)")
            }
            idText = String(integer)
        case let other?: throw Self.invalid("\"id\" must be a string or an integer, not \(other.kind)")
        }
        switch fields["v"] {
        case nil, .null?: break  // version 1 is assumed
        case .number(let version)? where version == version.rounded():
            guard version == Double(ControlService.protocolVersion) else {
                throw DaemonError(.unsupportedVersion,
                                  "protocol version \(JSONValue.number(version).jsonText) is not supported; this daemon speaks version \(ControlService.protocolVersion)")
            }
        case let other?:
            let shown = if case .number = other { other.jsonText } else { other.kind }
            throw Self.invalid("\"v\" must be an integer (the protocol version, 1), not \(shown)")
        }
        switch fields["cmd"] {
        case nil:
            throw Self.invalid("missing \"cmd\"; commands: \(ControlService.commands.joined(separator: ", "))")
        case .string(let name)?:
            guard ControlService.commands.contains(name) else {
                throw DaemonError(.unknownCommand,
                                  "unknown command \(JSONValue.string(name).jsonText); commands: \(ControlService.commands.joined(separator: ", "))")
            }
            command = name
        case let other?:
            throw Self.invalid("\"cmd\" must be a string, not \(other.kind)")
        }
    }

    static func invalid(_ message: String) -> DaemonError { DaemonError(.invalidRequest, message) }

    /// The numeric ids served: integers of magnitude at most 2^53.
    static let idRange = -(1 << 53)...(1 << 53)

    /// A required field naming a module or plugin: a string following the name grammar.
    func moduleName(_ field: String) throws(DaemonError) -> String {
        guard let value = try optionalModuleName(field) else { throw Self.invalid("\(command) needs \"\(field)\" (a string)") }
        return value
    }

    /// An optional field naming a module, a plugin or an event (absent or null: nil): it
    /// follows the one name grammar (`PluginName`), so no NUL or control character gets in.
    func optionalModuleName(_ field: String) throws(DaemonError) -> String? {
        guard let value = try optionalName(field) else { return nil }
        if let problem = PluginName.problem(value) { throw Self.invalid("\"\(field)\" is \(problem)") }
        return value
    }

    /// A required, non-empty string field.
    func name(_ field: String) throws(DaemonError) -> String {
        guard let value = try optionalName(field) else {
            throw Self.invalid("\(command) needs \"\(field)\" (a string)")
        }
        return value
    }

    /// An optional string field (absent or null: nil); empty strings are refused.
    func optionalName(_ field: String) throws(DaemonError) -> String? {
        switch fields[field] {
        case nil, .null?: return nil
        case .string(let value)?:
            guard !value.isEmpty else { throw Self.invalid("\"\(field)\" must not be empty") }
            return value
        case let other?: throw Self.invalid("\"\(field)\" must be a string, not \(other.kind)")
        }
    }

    /// An optional boolean field (absent or null: nil).
    func optionalBool(_ field: String) throws(DaemonError) -> Bool? {
        switch fields[field] {
        case nil, .null?: return nil
        case .bool(let value)?: return value
        case let other?: throw Self.invalid("\"\(field)\" must be true or false, not \(other.kind)")
        }
    }

    /// Whether `value` is or holds an object, which no call argument can be.
    static func containsObject(_ value: JSONValue) -> Bool {
        switch value {
        case .object: true
        case .array(let elements): elements.contains(where: containsObject)
        default: false
        }
    }

    /// `args` with `argsForm`: strings as typed on a command line ("text"), JSON values
    /// ("json"), or, by default ("auto"), text when every element is a string.
    func callArguments() throws(DaemonError) -> CallArguments {
        let elements: [JSONValue]
        switch fields["args"] {
        case nil, .null?: elements = []
        case .array(let list)?: elements = list
        case let other?: throw Self.invalid("\"args\" must be an array, not \(other.kind)")
        }
        let form: String
        switch fields["argsForm"] {
        case nil, .null?: form = "auto"
        case .string(let name)? where ["auto", "text", "json"].contains(name): form = name
        case let other?:
            throw Self.invalid("\"argsForm\" must be \"auto\", \"text\" or \"json\", not \(other.jsonText)")
        }
        let texts = elements.compactMap { element -> String? in
            if case .string(let text) = element { return text }
            return nil
        }
        if form == "text" || (form == "auto" && texts.count == elements.count) {
            if let index = elements.firstIndex(where: { if case .string = $0 { false } else { true } }) {
                throw Self.invalid("\"args\"[\(index)] must be a string when \"argsForm\" is \"text\", not \(elements[index].kind)")
            }
            return .texts(texts)
        }
        if let index = elements.firstIndex(where: Self.containsObject) {
            throw Self.invalid("\"args\"[\(index)]: an object is not a valid call argument")
        }
        return .json(elements)
    }
}
