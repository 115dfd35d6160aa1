@_spi(ModuleHost) import ModuleKit

/// What the daemon asks of an isolated plugin's worker once it is ready
/// (docs/isolation.md, "The worker protocol"): one case per request, written (`frame`)
/// and read (`init`) here only, so that both ends agree on every member's name. Each
/// request carries an id, and its reply carries the same id.
enum DaemonRequest: Sendable, Equatable {
    /// Create (and so initialize) module `module` with `configuration`; `running` names
    /// the modules that run in the daemon now (what `has_module` answers in the worker).
    case create(module: String, configuration: JSONValue, running: [String])
    /// A synchronous event to `module`, answered once its handler has returned.
    case event(module: String, kind: EventKind, name: String, payload: JSONValue)
    /// An awaited event to `module` (willUnload, willTerminate, or a custom one), answered
    /// once its handler has returned; the worker reads on meanwhile.
    case awaited(module: String, event: String, payload: JSONValue)
    case configure(module: String, configuration: JSONValue)
    case info(module: String)
    /// The state `module` hands over to the version that replaces it.
    case state(module: String)
    case restore(module: String, state: JSONValue)
    /// A call by name of an exported function.
    case call(function: String, arguments: CallArguments)

    /// The kinds of synchronous event.
    enum EventKind: String, Sendable {
        case start
        case deinitialize = "deinit"
        case notification
        case custom
    }

    /// How a call's arguments are given: none, as text (converted by the signature, as on
    /// the command line) or as JSON values.
    enum CallArguments: Sendable, Equatable {
        case none
        case texts([String])
        case json([JSONValue])
    }

    /// The frame of this request with id `id`; nil when it is larger than a frame may be.
    func frame(id: Int) -> [UInt8]? {
        WorkerFrame.encode(members: members, id: .number(Double(id)))
    }

    private var members: KeyValuePairs<String, JSONValue> {
        switch self {
        case .create(let module, let configuration, let running):
            ["op": WorkerOp.create.json, "module": .string(module), "configuration": configuration,
             "running": .array(running.map { .string($0) })]
        case .event(let module, let kind, let name, let payload):
            ["op": WorkerOp.event.json, "module": .string(module), "kind": .string(kind.rawValue), "event": .string(name), "payload": payload]
        case .awaited(let module, let event, let payload):
            ["op": WorkerOp.awaited.json, "module": .string(module), "event": .string(event), "payload": payload]
        case .configure(let module, let configuration):
            ["op": WorkerOp.configure.json, "module": .string(module), "configuration": configuration]
        case .info(let module):
            ["op": WorkerOp.info.json, "module": .string(module)]
        case .state(let module):
            ["op": WorkerOp.state.json, "module": .string(module)]
        case .restore(let module, let state):
            ["op": WorkerOp.restore.json, "module": .string(module), "state": state]
        case .call(let function, .none):
            ["op": WorkerOp.call.json, "function": .string(function)]
        case .call(let function, .texts(let texts)):
            ["op": WorkerOp.call.json, "function": .string(function), "texts": .array(texts.map { .string($0) })]
        case .call(let function, .json(let values)):
            ["op": WorkerOp.call.json, "function": .string(function), "json": .array(values)]
        }
    }

    /// The request `message` makes; nil when it is none of these (an unknown op, or a
    /// member missing or of the wrong kind).
    init?(_ message: WorkerMessage) {
        let module = message.text("module")
        switch (message.op, module) {
        case (.create?, let module?):
            guard case .array(let running) = message["running"] ?? .array([]) else { return nil }
            self = .create(module: module, configuration: message["configuration"] ?? [:], running: running.compactMap(\.stringValue))
        case (.event?, let module?):
            guard let kind = message.text("kind").flatMap(EventKind.init(rawValue:)), let name = message.text("event") else { return nil }
            self = .event(module: module, kind: kind, name: name, payload: message["payload"] ?? .null)
        case (.awaited?, let module?):
            guard let event = message.text("event") else { return nil }
            self = .awaited(module: module, event: event, payload: message["payload"] ?? .null)
        case (.configure?, let module?):
            self = .configure(module: module, configuration: message["configuration"] ?? [:])
        case (.info?, let module?):
            self = .info(module: module)
        case (.state?, let module?):
            self = .state(module: module)
        case (.restore?, let module?):
            self = .restore(module: module, state: message["state"] ?? .null)
        case (.call?, _):
            guard let function = message.text("function") else { return nil }
            switch (message["texts"], message["json"]) {
            case (nil, nil): self = .call(function: function, arguments: .none)
            case (.array(let texts)?, nil):
                let strings = texts.compactMap(\.stringValue)
                guard strings.count == texts.count else { return nil }
                self = .call(function: function, arguments: .texts(strings))
            case (nil, .array(let values)?): self = .call(function: function, arguments: .json(values))
            default: return nil
            }
        default:
            return nil
        }
    }
}
