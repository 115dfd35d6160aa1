import CDynamicLoader
@_spi(ModuleHost) import ModuleKit
import PluginFormat
import Synchronization

/// A module written in C, seen by the host as a `Module`: each event becomes a call of the
/// descriptor's `handle_event` with the event's name and JSON payload, or, when the plugin
/// set it (ABI 1.1), of `receive` with the event's kind (`modhost_event_kind`) too.
///
/// Every C function of one module instance (`create`, `handle_event` or `receive`, `destroy`) runs on
/// the module's own `PluginWorker`, one at a time and in order, never on the host
/// instance's actor nor on a Swift concurrency thread: a custom event sent to every module,
/// or a notification posted, is made on a lane of the `CModuleRelay`, in the worker's
/// place, together with the C modules beside it. The host waits for each call up to
/// its `eventDeadline`: a call still running then leaves the module *stuck* (logged,
/// shown by `modhostctl list`), and the host goes on. A stuck module is given no more
/// custom events or notifications until the call returns; the host's own lifecycle events
/// (`init`, `start`, `configurationChanged`, `deinit`) and `destroy` are queued behind it,
/// in order, so a module stuck in `create` gets `init` and `start` when it returns, and its
/// state is freed if it ever returns, and never used after.
///
/// Lifecycle names (`ModuleEvent.lifecycleNames`) arriving as custom events or
/// notifications are never delivered: a C module sees them only from the host itself. Nor
/// is an event or notification whose name breaks the name grammar (`PluginName`): a NUL
/// would cut it short in C (`"deinit\0x"` read as `"deinit"`). A module that lists such a
/// name in its `notifications` does not listen to it (`unlistenable`): the host never counts
/// a post of it as delivered to the module.
final class CModule: RelayedModule {
    let descriptor: ModuleDescriptor
    /// The C instance and its services, touched only by jobs on `worker`.
    private let instance: CModuleInstance
    private let worker: PluginWorker
    private let workers: PluginWorkers
    private let deadline: Duration
    private let log: Logger
    /// Its counters in the host: callbacks past the deadline, events not given to it.
    private let metrics: ModuleMetrics
    private var destroyQueued = false

    let moduleName: String
    /// The names of the descriptor's `notifications` it can be given (`unlistenable`).
    let notifications: Set<String>
    var info: ModuleInfo { ModuleInfo(name: moduleName, version: descriptor.version, metadata: ["language": "c"]) }
    /// Delivers custom events sent to every module, and notifications posted, to this
    /// module and the C modules beside it in one hand-over.
    var relay: any ModuleRelay { workers.relay }
    /// Delivers this module's custom events and notifications from a thread that may block.
    let delivery: Delivery

    /// Creates the C instance on the module's worker; nil when `create` returns NULL within
    /// the deadline. A `create` still running then leaves the module stuck in "create" (it
    /// gets events only if `create` returns an instance, and `init` and `start` first).
    init?(descriptor: ModuleDescriptor, configuration: JSONValue, services: CHostServices, host: HostInstance,
          workers: PluginWorkers) {
        self.descriptor = descriptor
        moduleName = descriptor.name
        notifications = Set(descriptor.notifications.filter { Self.unlistenable($0) == nil })
        let deadline = host.eventDeadline
        self.deadline = deadline
        let log = host.logger(for: descriptor.name)
        self.log = log
        for name in descriptor.notifications {
            if let problem = Self.unlistenable(name) {
                log.warning("notification \(problem); never delivered to a C module, so the module does not listen to it")
            }
        }
        let metrics = host.metrics.module(named: descriptor.name)
        self.metrics = metrics
        self.workers = workers
        let instance = CModuleInstance(descriptor: descriptor, services: services)
        self.instance = instance
        let worker = PluginWorker(label: "module." + descriptor.name)
        self.worker = worker
        delivery = Delivery(moduleName: descriptor.name, instance: instance, worker: worker, deadline: deadline, log: log, metrics: metrics)
        let text = configuration.jsonText
        let created = worker.run("create", deadline: deadline) { instance.create(configuration: text) }
        if created == false { return nil }
        workers.register(module: moduleName, worker)
        if created == nil {
            metrics.recordDeadlineOverrun()
            log.error("C module did not return from create within \(deadline.secondsText); it is stuck and gets no events until it returns",
                      [("deadline", deadline.secondsText)])
        }
    }

    deinit {
        // A module dropped without deinitialize (e.g. refused by the host) still frees its instance.
        if !destroyQueued { queueDestroy() }
    }

    func handle(_ event: ModuleEvent, host: isolated HostInstance) {
        // The worker's deadline bounds it; a C module stuck past it shows in `PluginWorkers`.
        host.handlerKeepsItsOwnDeadline()
        if case .deinitialize = event {
            guard !destroyQueued else { return }
            destroyQueued = true
            if let stuck = worker.stuck {
                log.warning("C module is stuck in \(stuck.what) for \(stuck.elapsed.secondsText); deinit and destroy run when it returns")
                queueDeliver(event.name, event.payload)
                queueDestroy()
                return
            }
            let instance = instance
            let name = event.name
            let finished: Void? = worker.run(name, deadline: deadline) { instance.deliver(.lifecycle, name, nil) }
            queueDestroy()
            if finished == nil { overran(name) }
            return
        }
        let kind = Self.kind(of: event)
        if kind == .lifecycle, let stuck = worker.stuck {
            // The host's own init, start or configurationChanged waits for the call the module
            // is stuck in, as deinit does: it never runs without them, nor on an old configuration.
            log.warning("C module is stuck in \(stuck.what) for \(stuck.elapsed.secondsText); \(event.name) runs when it returns",
                        [("event", event.name), ("stuck_in", stuck.what)])
            queueDeliver(event.name, event.payload)
            return
        }
        guard admits(event.name, isHostsOwn: kind == .lifecycle) else { return }
        let instance = instance
        let name = event.name
        let payload = event.payload
        if worker.run(name, deadline: deadline, { instance.deliver(kind, name, payload) }) == nil { overran(name) }
    }

    func handle(_ event: AsyncModuleEvent, host: isolated HostInstance) async {
        let kind: CEventKind = Self.isCustom(event) ? .custom : .lifecycle
        guard admits(event.name, isHostsOwn: kind == .lifecycle) else { return }
        let instance = instance
        let name = event.name
        let payload = event.payload
        // Awaited without holding a thread, up to the deadline the host keeps too: one still
        // running then leaves the module stuck until it returns.
        _ = await worker.attempt(name, deadline: deadline) { instance.deliver(kind, name, payload) }
    }

    func updateConfiguration(_ configuration: JSONValue, host: isolated HostInstance) -> (any Module)? {
        // A C module keeps its instance; it sees the change as a configurationChanged event.
        self
    }

    private func admits(_ name: String, isHostsOwn: Bool) -> Bool { delivery.admits(name, isHostsOwn: isHostsOwn) }

    /// Why a C module can never be given notification `name` (`Delivery.admits` refuses it
    /// every time), nil when it can: a name that breaks the grammar, or a lifecycle name.
    private static func unlistenable(_ name: String) -> String? {
        if let problem = PluginName.problem(name) { return problem }
        if ModuleEvent.lifecycleNames.contains(name) { return "\(PluginName.shown(name)) is a lifecycle name only the host sends" }
        return nil
    }

    private static func kind(of event: ModuleEvent) -> CEventKind {
        switch event {
        case .custom: .custom
        case .notification: .notification
        case .initialize, .start, .deinitialize, .configurationChanged: .lifecycle
        // A lifecycle event a later ModuleKit adds is the host's too.
        @unknown default: .lifecycle
        }
    }

    private static func isCustom(_ event: AsyncModuleEvent) -> Bool {
        if case .custom = event { return true }
        return false
    }

    private func overran(_ name: String) { delivery.overran(name) }

    /// Custom events and notifications for one C module, given from a thread that may block
    /// for as long as the module's code runs: an isolated plugin's ordered thread in its
    /// worker process (`WorkerService.serveOrdered`), whose daemon waits only up to its
    /// deadline and then kills the process. The call runs on that thread, in the module's
    /// order (`PluginWorker.runHere`): no other thread is woken for it.
    /// A class: the ordered thread takes it out of its table for every event, and a copy of
    /// a struct of six references would retain and release each of them.
    final class Delivery: Sendable {
        let moduleName: String
        fileprivate let instance: CModuleInstance
        let worker: PluginWorker
        let deadline: Duration
        let log: Logger
        let metrics: ModuleMetrics
        /// The last name `admission` found within the grammar and not a lifecycle name: the
        /// same name again (a module is usually given a few names, over and over) skips
        /// both checks, which depend on the name alone.
        private let lastAdmitted = AdmittedName()

        fileprivate init(moduleName: String, instance: CModuleInstance, worker: PluginWorker, deadline: Duration,
                         log: Logger, metrics: ModuleMetrics) {
            self.moduleName = moduleName
            self.instance = instance
            self.worker = worker
            self.deadline = deadline
            self.log = log
            self.metrics = metrics
        }

        /// Delivers `event` (a custom event or a notification; any other is not delivered)
        /// as `CModule.handle` does; what the module is stuck in when it was stuck already
        /// and got nothing.
        func deliverHere(_ event: ModuleEvent) -> PluginWorker.Stuck? {
            let kind: CEventKind
            switch event {
            case .custom: kind = .custom
            case .notification: kind = .notification
            default: return nil
            }
            let name = event.name
            guard admits(name, isHostsOwn: false) else { return worker.stuck }
            let payload = event.payload
            worker.runHere(name, deadline: deadline) { instance.deliver(kind, name, payload) }
            return nil
        }

        /// Whether an event may be given to the module now: not while it is stuck, and never a
        /// lifecycle name that does not come from the host itself (counted as not delivered).
        func admits(_ name: String, isHostsOwn: Bool) -> Bool {
            let admitted = admission(name, isHostsOwn: isHostsOwn)
            if !admitted { metrics.recordError(.notDelivered) }
            return admitted
        }

        private func admission(_ name: String, isHostsOwn: Bool) -> Bool {
            if !lastAdmitted.matches(name) {
                // C reads the name up to its first NUL: only names of the one grammar reach it whole.
                if let problem = PluginName.problem(name) {
                    log.warning("event \(problem); not delivered to a C module")
                    return false
                }
                let lifecycle = ModuleEvent.lifecycleNames.contains(name)
                if !isHostsOwn && lifecycle {
                    log.warning("event \(name) is a lifecycle name only the host sends; not delivered", [("event", name)])
                    return false
                }
                if !lifecycle { lastAdmitted.set(name) }
            }
            if let stuck = worker.stuck {
                refused(name, stuckIn: stuck)
                return false
            }
            return true
        }

        /// Says that event `name` was not delivered because the module is stuck in `stuck`
        /// (nil: busy with another lane's call, or no thread could be had for its turn).
        func refused(_ name: String, stuckIn stuck: PluginWorker.Stuck?) {
            metrics.recordError(.notDelivered)
            guard let stuck else {
                log.warning("C module is busy; \(name) not delivered", [("event", name)])
                return
            }
            log.warning("C module is stuck in \(stuck.what) for \(stuck.elapsed.secondsText); \(name) not delivered",
                        [("event", name), ("stuck_in", stuck.what)])
        }

        /// Says that event `name` was not delivered because its turn did not come within the
        /// event deadline (the calls ahead of it took it, or no thread ran it in time).
        func notReached(_ name: String) {
            metrics.recordError(.notDelivered)
            log.warning("C module did not get \(name): its turn did not come within the event deadline of \(deadline.secondsText)",
                        [("event", name), ("deadline", deadline.secondsText)])
        }

        /// Says that the module's call of `name` was still running at the deadline.
        func overran(_ name: String) {
            metrics.recordDeadlineOverrun()
            log.error("C module did not return from \(name) within \(deadline.secondsText); it is stuck and gets no more events until it returns",
                      [("event", name), ("deadline", deadline.secondsText)])
        }

        /// Calls the module with the event's name and payload as C strings, on the calling
        /// thread: only for the thread that holds the module's worker (`PluginWorker.claim`).
        func call(_ kind: CEventKind, _ name: UnsafePointer<CChar>, _ payload: UnsafePointer<CChar>?) {
            instance.deliver(kind, name, payload)
        }
    }

    private func queueDeliver(_ name: String, _ payload: JSONValue) {
        let instance = instance
        worker.submit(name, deadline: deadline) { instance.deliver(.lifecycle, name, payload) }
    }

    /// `destroy` after everything queued, then the worker leaves the registry.
    private func queueDestroy() {
        destroyQueued = true
        let instance = instance
        let worker = worker
        let workers = workers
        let name = moduleName
        worker.submit("destroy", deadline: deadline) {
            instance.destroy()
            workers.unregister(module: name, worker)
        }
    }
}

/// A name `CModule.Delivery` admitted last (within the grammar, not a lifecycle name).
private final class AdmittedName: Sendable {
    private let name = Mutex<String?>(nil)

    func matches(_ candidate: String) -> Bool { name.withLock { $0 == candidate } }

    func set(_ admitted: String) { name.withLock { $0 = admitted } }
}

/// One C module instance: the pointer `create` returned and the host services it was
/// given, which must outlive `destroy`.
///
/// Its calls into the module run as jobs of the module's one serial queue (`PluginWorker`):
/// that queue orders them, and so keeps every call after `destroy` from using the instance
/// (once it has run, or `create` returned NULL, nothing more reaches the module). The
/// address is atomic so that the Swift field itself is free of data races.
private final class CModuleInstance: Sendable {
    let descriptor: ModuleDescriptor
    let services: CHostServices
    /// The address `create` returned (a pointer is not `Sendable`; its address is); 0
    /// before it, when it returned NULL and once destroyed.
    private let address = Atomic<UInt>(0)
    /// The crash recorder's token of the plugin image whose code this module is (its
    /// address; 0 when the recorder does not know the image): every call marks its thread
    /// with it, so that a crash there that nothing else pins on a plugin is pinned on this
    /// one (`modhost_crash_recorder_enter`).
    private let image: UInt

    init(descriptor: ModuleDescriptor, services: CHostServices) {
        self.descriptor = descriptor
        self.services = services
        let code = descriptor.create.map { unsafeBitCast($0, to: UnsafeRawPointer.self) }
        image = UInt(bitPattern: code.flatMap { modhost_crash_recorder_image_of($0) })
    }

    /// Runs `call` (a call of this module's code) with the calling thread marked as running
    /// it, and puts back what the thread was marked with before.
    private func marked<T>(_ call: () -> T) -> T {
        let before = modhost_crash_recorder_enter(UnsafeRawPointer(bitPattern: image))
        defer { modhost_crash_recorder_enter(before) }
        return call()
    }

    /// Calls `create`; false when it returned NULL (the module is refused).
    func create(configuration: String) -> Bool {
        guard let create = descriptor.create else { return false }
        let created = marked { configuration.withCString { create(services.table, $0) } }
        address.store(UInt(bitPattern: created), ordering: .releasing)
        return created != nil
    }

    /// Calls `receive` with `kind` when the plugin set it (ABI 1.1), else `handle_event`.
    func deliver(_ kind: CEventKind, _ name: String, _ payload: JSONValue?) {
        Self.withCStrings(name, payload) { deliver(kind, $0, $1) }
    }

    /// `deliver` with the name and the payload's JSON text (NULL for none) as C strings.
    func deliver(_ kind: CEventKind, _ name: UnsafePointer<CChar>, _ payload: UnsafePointer<CChar>?) {
        guard let pointer = UnsafeMutableRawPointer(bitPattern: address.load(ordering: .acquiring)) else { return }
        marked {
            if let receive = descriptor.receive {
                receive(pointer, kind.value, name, payload)
            } else if let handle = descriptor.handleEvent {
                handle(pointer, name, payload)
            }
        }
    }

    /// `name` and `payload` as C strings for the length of `body`; a null payload is NULL.
    private static func withCStrings(_ name: String, _ payload: JSONValue?,
                                     _ body: (UnsafePointer<CChar>, UnsafePointer<CChar>?) -> Void) {
        name.withCString { name in
            if let payload, payload != .null {
                payload.jsonText.withCString { body(name, $0) }
            } else {
                body(name, nil)
            }
        }
    }

    /// Calls `destroy` once, if `create` gave an instance.
    func destroy() {
        if let pointer = UnsafeMutableRawPointer(bitPattern: address.exchange(0, ordering: .acquiringAndReleasing)) {
            marked { descriptor.destroy?(pointer) }
        }
    }
}

/// A module descriptor (`modhost_module`) in the plugin's static storage, read field by
/// field within its `struct_size` (`ABIStruct`): `name` and `version` are required, and a
/// field after them that the plugin's struct does not hold is absent. Which of the
/// remaining fields a kind needs (a C module's three functions, a Swift module's type) is
/// checked by the loader.
///
/// `@unchecked Sendable`: it holds pointers into memory the plugin declares immutable for
/// the life of the process (docs/abi.md), and the image is never unloaded; nothing writes
/// to it.
struct ModuleDescriptor: @unchecked Sendable {
    typealias Layout = modhost_module
    let kind: UInt32
    let name: String
    let version: String
    let notifications: [String]
    let create: Layout.Create?
    let handleEvent: Layout.HandleEvent?
    let destroy: Layout.Destroy?
    let swiftType: UnsafeRawPointer?
    /// ABI 1.1: nil for a plugin built against 1.0 (its struct ends before it) or when unset.
    let receive: Layout.Receive?
    /// The plugin's `struct_size`, for messages.
    let structSize: Int

    /// The fields read, in the host's layout.
    private enum Field {
        static let kind = ABIField(\Layout.kind)
        static let name = ABIField(pointer: \Layout.name)
        static let version = ABIField(pointer: \Layout.version)
        static let notifications = ABIField(pointer: \Layout.notifications)
        static let create = ABIField(pointer: \Layout.create)
        static let handleEvent = ABIField(pointer: \Layout.handle_event)
        static let destroy = ABIField(pointer: \Layout.destroy)
        static let swiftType = ABIField(pointer: \Layout.swift_type)
        static let receive = ABIField(pointer: \Layout.receive)
    }

    /// The smallest module descriptor: through `version`.
    static let minimumSize = Field.version.end

    init(_ pointer: UnsafeRawPointer) throws(DescriptorProblem) {
        let raw = ABIStruct<Layout>(pointer)
        guard let kind = raw.uint32(Field.kind), let name = raw.pointer(Field.name), let version = raw.pointer(Field.version) else {
            throw DescriptorProblem(check: .descriptor, problem: "a module descriptor says struct_size \(raw.size), or its name or version is NULL",
                                    fix: "initialise struct_size with sizeof(modhost_module) and set name and version")
        }
        self.kind = kind
        self.name = String(cString: name.assumingMemoryBound(to: CChar.self))
        self.version = String(cString: version.assumingMemoryBound(to: CChar.self))
        if let problem = VersionText.problem(self.version) {
            throw DescriptorProblem(check: .descriptor, problem: "module \(PluginName.shown(self.name))'s version is \(problem)",
                                    fix: "give the module a version of at most \(VersionText.maximumLength) bytes, such as \"1.0.0\"")
        }
        var names: [String] = []
        if var cursor = raw.pointer(Field.notifications)?.assumingMemoryBound(to: UnsafePointer<CChar>?.self) {
            while let name = cursor.pointee {
                names.append(String(cString: name))
                cursor += 1
            }
        }
        notifications = names
        create = raw.pointer(Field.create).map { unsafeBitCast($0, to: Layout.Create.self) }
        handleEvent = raw.pointer(Field.handleEvent).map { unsafeBitCast($0, to: Layout.HandleEvent.self) }
        destroy = raw.pointer(Field.destroy).map { unsafeBitCast($0, to: Layout.Destroy.self) }
        swiftType = raw.pointer(Field.swiftType)
        receive = raw.pointer(Field.receive).map { unsafeBitCast($0, to: Layout.Receive.self) }
        structSize = raw.size
    }
}

extension modhost_module {
    typealias Create = @convention(c) (UnsafePointer<modhost_host_api>, UnsafePointer<CChar>) -> UnsafeMutableRawPointer?
    typealias HandleEvent = @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>, UnsafePointer<CChar>?) -> Void
    typealias Destroy = @convention(c) (UnsafeMutableRawPointer?) -> Void
    typealias Receive = @convention(c) (UnsafeMutableRawPointer?, UInt32, UnsafePointer<CChar>, UnsafePointer<CChar>?) -> Void
}

/// `modhost_event_kind` (ABI 1.1): what `receive` tells a C module about an event.
enum CEventKind {
    case lifecycle, custom, notification

    /// The header's value.
    var value: UInt32 {
        switch self {
        case .lifecycle: UInt32(MODHOST_EVENT_LIFECYCLE.rawValue)
        case .custom: UInt32(MODHOST_EVENT_CUSTOM.rawValue)
        case .notification: UInt32(MODHOST_EVENT_NOTIFICATION.rawValue)
        }
    }
}

extension Duration {
    /// Seconds with up to one decimal, for messages: "0.5 s", "30 s".
    package var secondsText: String {
        let tenths = (seconds * 10).rounded() / 10
        return tenths == tenths.rounded() ? "\(Int(tenths)) s" : "\(tenths) s"
    }
}
