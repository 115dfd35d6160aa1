import Glibc
@testable import ModuleHost
import ModuleKit
import PluginFormat
import Synchronization

/// Lines the test modules write, in the order they wrote them; readable from any thread.
final class EventLog: Sendable {
    private let lines = Mutex<[String]>([])

    func append(_ line: String) { lines.withLock { $0.append(line) } }
    var all: [String] { lines.withLock { $0 } }
    /// The lines that end with `suffix` (e.g. " init"), in order.
    func ending(with suffix: String) -> [String] { all.filter { $0.hasSuffix(suffix) } }
}

/// A module of a made-up plugin: writes `NAME EVENT VERSION` to its log for every event,
/// hands `state of VERSION` to the version that replaces it and writes
/// `NAME restore STATE VERSION` when given one.
final class RecordingModule: Module {
    let moduleName: String
    let version: String
    let log: EventLog

    init(name: String, version: String, log: EventLog) {
        moduleName = name
        self.version = version
        self.log = log
    }

    var info: ModuleInfo { ModuleInfo(name: moduleName, version: version) }
    func handle(_ event: ModuleEvent, host: isolated HostInstance) { log.append("\(moduleName) \(event.name) \(version)") }
    func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async { log.append("\(moduleName) \(event.name) \(version)") }
    func stateForReplacement(host: isolated HostInstance) -> JSONValue? { .string("state of \(version)") }
    func restore(state: JSONValue, host: isolated HostInstance) {
        log.append("\(moduleName) restore \(state.stringValue ?? "-") \(version)")
    }
}

/// A plugin set's source whose plugin files are made up in this process: each file is a
/// manifest (and whether it is refused when read or opened), its modules `RecordingModule`s
/// writing to `log`. No file exists, none is compiled, copied or mapped. `write` adds or
/// changes a file (a new identity), `remove` takes it away; `reads` and `opened` say what
/// the set asked for.
final class FakePluginSource: PluginSource {
    /// The one plugin directory: give it to the set.
    static let directory = "/fake/plugins"
    let log = EventLog()

    private struct File {
        var manifest: Manifest
        var identity: FileIdentity
        var refusedWhenRead: LoadFailure.Check?
        var refusedWhenOpened: LoadFailure.Check?
    }
    private struct State {
        var files: [String: File] = [:]
        var writes: UInt64 = 0
        var reads: [String] = []
        var opened: [String] = []
    }
    private let state = Mutex(State())

    /// The paths `read` was asked for, in order.
    var reads: [String] { state.withLock { $0.reads } }
    /// The plugins `open` was asked for, by name, in order.
    var opened: [String] { state.withLock { $0.opened } }

    static func path(_ file: String) -> String { directory + "/" + file }

    /// Writes plugin `name` (its modules: `modules`, by default its name in lower case) as
    /// `file` (by default `libNAME.so`), replacing what was there; returns its path.
    /// `refusedWhenRead` and `refusedWhenOpened` make the set's read or open of it fail with
    /// that check.
    @discardableResult
    func write(_ name: String, version: String = "1.0", modules: [String]? = nil, dependencies: [String] = [], order: Int = 0,
               file: String? = nil, refusedWhenRead: LoadFailure.Check? = nil, refusedWhenOpened: LoadFailure.Check? = nil) -> String {
        let path = Self.path(file ?? "lib\(name).so")
        let manifest = Manifest(name: name, version: version, abi: "1.0", language: .c, dependencies: dependencies, order: order,
                                modules: modules ?? [name.lowercased()])
        state.withLock { state in
            state.writes += 1
            // A new inode at every write, as a deployment by rename gives.
            var status = stat()
            status.st_ino = UInt(state.writes)
            status.st_size = Int(state.writes)
            state.files[path] = File(manifest: manifest, identity: FileIdentity(status: status),
                                     refusedWhenRead: refusedWhenRead, refusedWhenOpened: refusedWhenOpened)
        }
        return path
    }

    func remove(_ path: String) { _ = state.withLock { $0.files.removeValue(forKey: path) } }

    private func file(_ path: String) -> File? { state.withLock { $0.files[path] } }

    private static func failure(_ path: String, _ check: LoadFailure.Check, when: String) -> LoadFailure {
        LoadFailure(file: path, check: check, problem: "made up to fail when \(when)", fix: "write it again")
    }

    // MARK: PluginSource

    func candidates(in directories: [String]) -> (present: [String: String], directoryStatus: [String: stat], unreadable: [LoadFailure]) {
        let paths = state.withLock { Array($0.files.keys) }
        var present: [String: String] = [:]
        for directory in directories {
            for path in paths where path.hasPrefix(directory + "/") { present[path] = directory }
        }
        return (present, [:], [])
    }

    func identity(of path: String, in directory: String, directoryStatus: stat?, validator: Validator) throws(LoadFailure) -> FileIdentity? {
        file(path)?.identity
    }

    func read(_ path: String, in directory: String, directoryStatus: stat?,
              validator: Validator) throws(LoadFailure) -> (file: PluginFile, version: FileIdentity, hash: String) {
        state.withLock { $0.reads.append(path) }
        guard let file = file(path) else { throw Self.failure(path, .fileType, when: "gone") }
        if let check = file.refusedWhenRead { throw Self.failure(path, check, when: "read") }
        let checked = PluginFile(path: path, resolvedPath: path, manifest: file.manifest, dynamic: DynamicInfo(), warnings: [])
        return (checked, file.identity, "\(path)#\(file.identity.key)")
    }

    func manifest(of path: String) -> Manifest? { file(path)?.manifest }

    /// The file itself: nothing is copied.
    func image(of file: PluginFile, version: FileIdentity?, generation: Int, nameGeneration: Int, hash: String,
               renames: [String: String], inMemory: Bool, for set: isolated PluginSet) throws(LoadFailure) -> PluginSet.PrivateImage {
        PluginSet.PrivateImage(file: file, generation: generation, nameGeneration: nameGeneration,
                               soname: "lib\(file.name).so", originalSoname: "lib\(file.name).so", size: 0)
    }

    func open(_ image: PluginSet.PrivateImage, for set: isolated PluginSet) throws(LoadFailure) -> LoadedPlugin {
        let manifest = image.file.manifest
        state.withLock { $0.opened.append(manifest.name) }
        if let check = file(image.file.path)?.refusedWhenOpened { throw Self.failure(image.file.resolvedPath, check, when: "opened") }
        let log = log
        let modules = manifest.modules.map { name in
            LoadedPlugin.Module(
                factory: ModuleFactory(name: name, version: manifest.version, plugin: manifest.name, defaultOrder: manifest.order) { _, _ in
                    RecordingModule(name: name, version: manifest.version, log: log)
                },
                swiftType: nil)
        }
        return LoadedPlugin(file: image.file, library: nil, modules: modules, functions: nil)
    }
}
