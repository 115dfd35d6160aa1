// Fuzz target: the control protocol's server side (ControlService.handle), from the
// request line to the reply line, against a daemon double that answers at once. Calls by
// name go through the same argument conversion the daemon uses, against a fixed table of
// signatures covering every argument type.
// Promises under test (docs/control-protocol.md): any line gets exactly one reply line, a
// JSON object with "ok" and "v": 1, never a trap.
import ControlProtocol
import DaemonKit
import FuzzSupport
import ModuleKit
import PluginCall
import PluginFormat

struct AnsweringDaemon: DaemonControl {
    static let signatures = [
        "integers": "i64(i8,i16,i32,i64)", "unsigned": "u64(u8,u16,u32,u64)", "reals": "f64(f32,f64)",
        "flag": "bool(bool)", "text": "str(str)", "bytes": "buf(buf)", "nothing": "void()",
    ]

    func moduleRows() async -> [ModuleRow] {
        [ModuleRow(module: "greeting", plugin: "Greeting", file: "/srv/plugins/libGreeting.so", version: "1.0.0",
                   state: "running", order: 1, generation: 1)]
    }

    func status() async -> DaemonStatus {
        DaemonStatus(pid: 1, uptimeSeconds: 1, ready: true, socketPath: "/run/modhostd.sock", stateDirectory: "/var/lib/modhostd",
                     configPath: nil, pluginDirectories: ["/srv/plugins"], pluginsLoaded: 1, modulesRunning: 1, filesRefused: 0,
                     retiredGenerations: 0, retiredBytes: 0, crashGuarded: 0, reloads: 0)
    }

    func metrics() async -> MetricsReport {
        MetricsReport(
            daemon: .init(pluginsLoaded: 1, modulesRunning: 1, filesRefused: 0, pluginsAdded: 1, pluginsReplaced: 0,
                          pluginsRemoved: 0, refusals: 0, reloads: 0, imagesMapped: 1, imagesMappedBytes: 4096,
                          imagesRetired: 0, imagesRetiredBytes: 0, imagesPrivate: 1, imagesPrivateBytes: 4096,
                          residentBytes: 4096, mappings: 1, uptimeSeconds: 1),
            modules: [], events: [], calls: [], workers: [])
    }

    func setEnabled(_ enabled: Bool, module: String) async throws(DaemonError) {
        guard module == "greeting" else { throw DaemonError(.unknownModule, "no module named \(module)") }
    }

    func reload() async throws(DaemonError) -> ReloadSummary { ReloadSummary() }

    func send(event: String, payload: JSONValue, to module: String?, awaited: Bool) async throws(DaemonError) {
        _ = payload.jsonText
        if let module, module != "greeting" { throw DaemonError(.unknownModule, "no module named \(module)") }
    }

    func post(notification: String, payload: JSONValue) async throws(DaemonError) -> [String] {
        _ = payload.jsonText
        return notification == "greeting.tick" ? ["greeting"] : []
    }

    func call(plugin: String, function: String, arguments: CallArguments) async throws(DaemonError) -> CallValue {
        guard let text = Self.signatures[function], let signature = try? Signature(parsing: text) else {
            throw DaemonError(.unknownFunction, "no function \(function)")
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
        // The first argument back, as a plugin returning its input would.
        return values.first ?? .void
    }

    func infoPayload() async -> JSONValue { ["greeting": ["version": "1.0.0"]] }
}

let service = ControlService(daemon: AnsweringDaemon())
let peer = PeerCredentials(pid: 1, uid: 0, gid: 0)

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzControlRequest(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    // The server hands over lines of valid UTF-8 without their newline.
    guard let line = String(validating: fuzzBytes(data, size), as: UTF8.self), !line.utf8.contains(10) else { return 0 }
    let reply = waitFor { await service.handle(line, peer: peer) }
    fuzzCheck(!reply.utf8.contains(10), "reply holds a newline: \(reply)")
    guard case .object(let fields)? = try? JSONValue.parse(Array(reply.utf8)) else {
        fuzzCheck(false, "reply is not a JSON object: \(reply)")
        return 0
    }
    guard case .bool? = fields["ok"], fields["v"] == .number(1) else {
        fuzzCheck(false, "reply lacks \"ok\" or \"v\": 1: \(reply)")
        return 0
    }
    return 0
}
