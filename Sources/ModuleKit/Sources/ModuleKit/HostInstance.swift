import Synchronization

/// One host instance: its modules, their lifecycle events, their notifications and its
/// Bus, all confined to this actor; instances in one process share nothing.
///
/// Threading: every module callback of an instance runs on the instance's serial context
/// (this actor); module objects never leave it. Module code receives the instance as
/// `host: isolated HostInstance` and may use `host.moduleManager`, `host.send`,
/// `host.post` and `host.bus` directly, without `await`. Everything marked `nonisolated`
/// may be used from any thread.
///
/// Isolation: several instances may live in one process; each creates its own module
/// objects from the same factories, and nothing sent, posted or installed on one reaches
/// another.
///
/// Lifecycle of one module (see docs/modules.md):
///
///     created ─▶ .initialize ─▶ .start ─▶ events, notifications ─▶ [.willUnload | .willTerminate] ─▶ .deinitialize
///
/// A module receives nothing but its own `.initialize` before its own `.start`: a custom
/// event or notification meant for it before then (posted by a module started before it,
/// or sent before `start()`) is held and delivered right after its `.start`, in the order
/// it was made (at most `heldEventLimit` of them; a module removed first never gets them).
/// An awaited custom event cannot be held: sent before `start()`, it is delivered at once.
///
/// Updates (add, remove, replace, settings changes, shutdown) are serialized: one runs at
/// a time, in call order. While one is in progress the observables of `moduleManager`
/// emit nothing; each emits at most once when it completes.
public actor HostInstance {
    /// A label for logs and for the info payload.
    public nonisolated let name: String
    /// The host's logger; module lines use `logger(for:)`.
    public nonisolated let logger: Logger
    /// The longest the host waits for one module's async handler.
    public nonisolated let eventDeadline: Duration
    /// This instance's Bus (see `Bus` for its thread-safety).
    public nonisolated let bus: Bus
    /// The ordered modules and the observation API, usable on this instance's context.
    public let moduleManager: ModuleManager
    /// Counters per module and per event name, readable from any thread (`Metrics.swift`).
    public nonisolated let metrics = HostMetrics()
    /// The counter of the event name delivered last: a repeated event skips the lookup.
    var lastEventCounter: EventNameCounter?

    enum Phase { case idle, started, terminated }

    var phase = Phase.idle
    /// Known factories by name, running or not (disabled modules stay known).
    var factories: [String: ModuleFactory] = [:]
    var settings: [String: ModuleSettings]
    /// The `moduleManager.generation` whose names `runningNames` holds.
    var publishedGeneration: UInt64 = 0
    var updateGateBusy = false
    /// Synchronous events for modules that have not had their `.start` yet, by slot serial:
    /// a module gets nothing but its own `.initialize` before its own `.start`. A serial is
    /// here from the module's creation until its start (or removal).
    var heldUntilStart: [UInt64: Held] = [:]
    /// States handed over by modules of an earlier process, for the modules of those names
    /// created from now on (`restoreOnCreation`).
    var statesToRestore: [String: JSONValue] = [:]
    /// The most events held for one module; later ones are dropped (logged).
    static let heldEventLimit = 1024
    /// What a module that has not started holds: its events, and how many more were dropped
    /// once it held `heldEventLimit` (said when the first is, and counted at its start).
    struct Held {
        var events: [ModuleEvent] = []
        var dropped = 0
    }
    var updateGateWaiters: [CheckedContinuation<Void, Never>] = []

    nonisolated let runningNames = Mutex<[String]>([])
    nonisolated let registeredSnapshot = Mutex<[ModuleStatus]>([])
    nonisolated let diagnosticsHub = DiagnosticsHub()
    /// The deadlines of the async handlers running now.
    nonisolated let deadlines = DeadlineWatch()
    /// The synchronous handler running now, watched from outside against the deadline.
    nonisolated let handlers: HandlerWatch
    /// The event name `handlers` has now (set only when a handler's differs).
    var watchedEvent = ""
    nonisolated let mailbox: AsyncStream<MailboxMessage>.Continuation
    /// The most messages from `postFromAnywhere` and `sendFromAnywhere` that wait for
    /// delivery; more are dropped, so a poster faster than this instance cannot take all
    /// the process's memory (docs/modules.md, "Notifications and custom events").
    static let mailboxLimit = 65_536
    /// Messages dropped and not said yet, and when dropped messages were last said: at
    /// most once a second, however long a flood lasts.
    nonisolated let mailboxDrops = Mutex<(unsaid: Int, lastSaid: ContinuousClock.Instant?)>((0, nil))
    /// How many messages the mailbox's task delivers before it lets other tasks run: a
    /// flood of them must not hold a thread of Swift concurrency for good.
    static let mailboxBurst = 64
    /// Where this instance's modules' notifications go instead of its own modules, when
    /// another host delivers them (see `init(name:settings:eventDeadline:logger:forwardingNotifications:)`).
    nonisolated let notificationForwarder: (@Sendable (_ name: String, _ payload: JSONValue, _ to: String?) -> Void)?

    enum MailboxMessage: Sendable {
        case notification(name: String, payload: JSONValue)
        case event(ModuleEvent, to: String?)
    }

    /// Creates an instance with no module.
    ///
    /// - Parameters:
    ///   - name: a label for logs and the info payload.
    ///   - settings: per-module settings by module name; a module without settings is
    ///     enabled, with its factory's default order and an empty configuration object.
    ///   - eventDeadline: how long the host waits for one module's async handler.
    ///   - logger: the host's logger.
    public init(
        name: String = "default", settings: [String: ModuleSettings] = [:], eventDeadline: Duration = .seconds(5),
        logger: Logger = Logger(label: "modulehost")
    ) {
        self.init(name: name, settings: settings, eventDeadline: eventDeadline, logger: logger, forwardingNotifications: nil,
                  locatingModules: nil)
    }

    /// Creates an instance whose notifications are delivered by another host: for a host
    /// that runs modules on another's behalf (an isolated plugin's worker, whose modules
    /// stand in the daemon's host). Every notification made on it (`post`,
    /// `postFromAnywhere`, `send(.notification)`) is handed to `forward` with its name,
    /// payload and target module (nil: every module that listens), on this instance's
    /// context, in the order it was made, and not delivered here: the other host delivers
    /// it to every module that listens, these included. `locate` says where a module that
    /// does not run here runs (nil: nowhere), for `ModuleManager.module(named:as:)`; it is
    /// called on this instance's context and must answer within a deadline of its own.
    @_spi(ModuleHost)
    public init(
        name: String, settings: [String: ModuleSettings] = [:], eventDeadline: Duration, logger: Logger,
        forwardingNotifications forward: (@Sendable (_ name: String, _ payload: JSONValue, _ to: String?) -> Void)?,
        locatingModules locate: (@Sendable (_ module: String) -> String?)? = nil
    ) {
        notificationForwarder = forward
        moduleManager = ModuleManager(locateElsewhere: locate)
        self.name = name
        self.settings = settings
        self.eventDeadline = eventDeadline
        self.logger = logger.with("instance", name)
        self.bus = Bus(label: "host:\(name)")
        handlers = HandlerWatch(deadline: eventDeadline, metrics: metrics) {
            [logger = self.logger, hub = diagnosticsHub, deadline = eventDeadline] report in
            Self.say(report, logger: logger, hub: hub, deadline: deadline)
        }
        let (stream, continuation) = AsyncStream.makeStream(of: MailboxMessage.self, bufferingPolicy: .bufferingOldest(Self.mailboxLimit))
        self.mailbox = continuation
        // The mailbox consumer keeps no strong reference while waiting, so the instance
        // can be released; deinit finishes the stream, which ends the task.
        Task { [weak self] in
            var delivered = 0
            for await message in stream {
                guard let self else { return }
                await self.receive(message)
                delivered += 1
                if delivered == Self.mailboxBurst {
                    delivered = 0
                    self.sayDroppedMessages()
                    await Task.yield()
                }
            }
        }
    }

    deinit {
        mailbox.finish()
        diagnosticsHub.finish()
    }

    func receive(_ message: MailboxMessage) {
        switch message {
        case .notification(let name, let payload): post(notification: name, payload: payload)
        case .event(let event, let target): send(event, to: target)
        }
    }

    // MARK: Registering and creating modules

    /// Registers `factories` and creates the enabled ones.
    ///
    /// Every factory becomes known by name, even when its settings disable it (enabling it
    /// later creates it). The enabled ones are created in order (the settings' order, else
    /// the factory's default order, then name) with their configuration object; all of them
    /// are created and inserted first, then each gets `.initialize` in order, then, when the
    /// host has already started, each gets `.start` in order. A factory whose `make`
    /// returns nil is logged with its name and skipped; one named like a running module is
    /// logged and skipped. Observers are notified once, afterwards.
    ///
    /// `add` is synchronous: called while an awaiting update (`remove`, `replace`,
    /// `updateSettings`) is suspended, it runs at once and its modules become part of that
    /// update, whose completion notifies observers. After `shutdown()` it does nothing
    /// (logged).
    public func add(_ factories: [ModuleFactory]) {
        guard phase != .terminated else {
            logger.warning("modules added after shutdown were ignored", [("modules", factories.map(\.name).joined(separator: ","))])
            return
        }
        beginUpdate()
        var toCreate: [ModuleFactory] = []
        var registered: [ModuleFactory] = []
        // Names registered before (disabled, or refused): their rows are replaced.
        var replacedRows: Set<String> = []
        var names: Set<String> = []
        for factory in factories {
            if moduleManager.slot(named: factory.name) != nil || names.contains(factory.name) {
                logger.error("a module with this name is already running", [("module", factory.name), ("plugin", factory.plugin)])
                diagnosticsHub.emit(.duplicateModule(module: factory.name, plugin: factory.plugin))
                continue
            }
            names.insert(factory.name)
            if self.factories.updateValue(factory, forKey: factory.name) != nil { replacedRows.insert(factory.name) }
            registered.append(factory)
            if isEnabled(factory.name) { toCreate.append(factory) }
        }
        let created = createModules(toCreate)
        var states: [String: JSONValue] = [:]
        for slot in created { states[slot.name] = statesToRestore.removeValue(forKey: slot.name) }
        initializeAndStart(created, states: states)
        // Only these factories' rows change: the snapshot is amended, not rebuilt, so adding
        // plugins one by one costs each add its own modules, not every module registered.
        endUpdate(amendingRegistered: (registered, replacedRows))
    }

    /// Sends `.start` to every running module, in order. Call it once every module of the
    /// initial configuration has been added (and so initialized); modules added later are
    /// started as they are added. Marks the modules ready if no update did yet. Calling it
    /// again, or after shutdown, does nothing.
    ///
    /// `around`, when given, is called once per module with the module's plugin name and
    /// a closure that delivers `.start` to it, which it must call exactly once, at once
    /// (a daemon uses it to record which plugin's code is running).
    public func start(around: (@Sendable (_ plugin: String, _ deliver: () -> Void) -> Void)? = nil) {
        guard phase == .idle else { return }
        phase = .started
        if !moduleManager.hasBeenReady {
            beginUpdate()
            endUpdate()
        }
        for slot in moduleManager.slots {
            guard moduleManager.index(ofSerial: slot.serial) != nil else { continue }
            if let around {
                around(slot.factory.plugin) { startModule(slot) }
            } else {
                startModule(slot)
            }
        }
    }

    /// Sends `.start` to the running module named `name`, then the events held for it until
    /// then, as `start()` does for every module; nothing when it is not running or has had
    /// its `.start`. For a host that runs modules on another host's behalf and never calls
    /// `start()` (an isolated plugin's worker: the daemon's host decides when each module
    /// starts).
    @_spi(ModuleHost)
    public func start(moduleNamed name: String) {
        guard let slot = moduleManager.slot(named: name), heldUntilStart[slot.serial] != nil else { return }
        startModule(slot)
    }

    /// Removes the running modules named `names` and forgets their factories.
    ///
    /// In reverse order, each module gets `.willUnload` (awaited, with the deadline), then
    /// `.deinitialize`, then is removed. Names that are not running are only forgotten.
    /// Observers are notified once, afterwards.
    public func remove(moduleNamed names: [String]) async {
        await remove(names, sendWillUnload: true)
    }

    /// Removes the running modules named `names`, which were told `.willUnload` already,
    /// and forgets their factories: in reverse order, each gets `.deinitialize` and is
    /// removed. For a host that runs modules on another host's behalf (an isolated plugin's
    /// worker: the daemon's host delivers `.willUnload`, then `.deinitialize`), so that the
    /// module can be added again later as a new instance.
    @_spi(ModuleHost)
    public func removeUnloaded(moduleNamed names: [String]) async {
        await remove(names, sendWillUnload: false)
    }

    func remove(_ names: [String], sendWillUnload: Bool) async {
        await acquireUpdateGate()
        defer { releaseUpdateGate() }
        beginUpdate()
        defer { endUpdate(establishesReadiness: false) }
        let wanted = Set(names)
        for slot in moduleManager.slots.reversed() where wanted.contains(slot.name) {
            await unload(slot, sendWillUnload: sendWillUnload)
        }
        for name in names { factories[name] = nil }
    }

    /// Replaces the running modules named `names` by the modules of `factories` (a new
    /// version of their plugin), handing state across.
    ///
    /// In order: each old module gets `.willUnload` (awaited, with the deadline) then
    /// `stateForReplacement`, in reverse order; the old modules leave the list and their
    /// factories are forgotten; the new factories are registered and the enabled ones
    /// created in order; each new module gets `.initialize`, then `restore(state:)` with the
    /// state of the old module of the same name (when it returned one), then `.start` if the
    /// host has started; finally each old module gets `.deinitialize`, in reverse order.
    /// Observers see the new instances in one update.
    public func replace(with factories: [ModuleFactory], replacing names: [String]) async {
        _ = await replacing(names, with: factories)
    }

    /// Removes every running module, handing its state over as `replace` does, and returns
    /// the states by module name: for the same modules in a process that takes this one's
    /// place (`restoreOnCreation`).
    ///
    /// In order: each module gets `.willUnload` (awaited, with the deadline) then
    /// `stateForReplacement`, in reverse order; then the modules leave the list and each gets
    /// `.deinitialize`, in reverse order. Their factories are forgotten. Observers see the
    /// empty list in one update.
    public func unloadAll() async -> [String: JSONValue] {
        await replacing(moduleManager.slots.map(\.name), with: [])
    }

    /// Keeps `states` (module name to the state a module handed over, e.g. in the process
    /// this one took the place of: `unloadAll`) for the modules of those names that `add`
    /// creates from now on: each such module gets `restore(state:)` once, after
    /// `.initialize` and before `.start`. A name given again takes the new state.
    public func restoreOnCreation(_ states: [String: JSONValue]) {
        statesToRestore.merge(states) { _, new in new }
    }

    /// `replace`'s work; the states the replaced modules handed over.
    private func replacing(_ names: [String], with factories: [ModuleFactory]) async -> [String: JSONValue] {
        await acquireUpdateGate()
        defer { releaseUpdateGate() }
        beginUpdate()
        defer { endUpdate() }
        let wanted = Set(names)
        var states: [String: JSONValue] = [:]
        var leaving: [UInt64] = []
        for slot in moduleManager.slots.reversed() where wanted.contains(slot.name) {
            await deliver(.willUnload, to: slot)
            guard let index = moduleManager.index(ofSerial: slot.serial) else { continue }
            let current = moduleManager.slots[index]
            if let state = watched(current.metrics, "stateForReplacement", { current.module.stateForReplacement(host: self) }) {
                states[current.name] = state
            }
            leaving.append(slot.serial)
        }
        var removed: [ModuleSlot] = []
        for serial in leaving {
            if let index = moduleManager.index(ofSerial: serial) { removed.append(moduleManager.slots.remove(at: index)) }
            heldUntilStart[serial] = nil
        }
        for name in names { self.factories[name] = nil }
        publishRunningNames()
        if phase == .terminated {
            for slot in removed { handOver(.deinitialize, to: slot.module, slot.metrics) }
            return states
        }
        var toCreate: [ModuleFactory] = []
        for factory in factories {
            if moduleManager.slot(named: factory.name) != nil || toCreate.contains(where: { $0.name == factory.name }) {
                logger.error("a module with this name is already running", [("module", factory.name), ("plugin", factory.plugin)])
                diagnosticsHub.emit(.duplicateModule(module: factory.name, plugin: factory.plugin))
                continue
            }
            self.factories[factory.name] = factory
            if isEnabled(factory.name) { toCreate.append(factory) }
        }
        let created = createModules(toCreate)
        initializeAndStart(created, states: states)
        // `removed` is in reverse order already.
        for slot in removed { handOver(.deinitialize, to: slot.module, slot.metrics) }
        return states
    }

    /// Applies new settings, acting only on differences with the current ones.
    ///
    /// In order: running modules that become disabled are removed (`.willUnload` awaited,
    /// then `.deinitialize`), in reverse order; running modules whose configuration changed
    /// get `updateConfiguration`, in order: the same instance back gets
    /// `.configurationChanged` and observers are not re-notified for it; a new instance
    /// takes the old one's place (the old gets `.deinitialize`, the new `.initialize`, then
    /// `.start` if the host has started) and observers are re-notified; nil removes the
    /// module (it gets `.deinitialize`; a later configuration change tries to create it
    /// again). Then order changes re-sort the modules, and known
    /// modules that become enabled (or whose configuration changed while they were not
    /// running) are created, initialized and started like `add`. Settings of unknown names
    /// are kept for factories added later. Observers are notified once, afterwards.
    public func updateSettings(_ newSettings: [String: ModuleSettings]) async {
        await acquireUpdateGate()
        defer { releaseUpdateGate() }
        let oldSettings = settings
        settings = newSettings
        guard phase != .terminated else { return }
        beginUpdate()
        defer { endUpdate(establishesReadiness: false) }

        func configuration(_ settings: [String: ModuleSettings], _ name: String) -> JSONValue {
            settings[name]?.configuration ?? [:]
        }

        // Disabled: removed in reverse order.
        for slot in moduleManager.slots.reversed() where !isEnabled(slot.name) {
            await unload(slot, sendWillUnload: true)
        }

        // Configuration changes, in order.
        var removedByConfiguration: Set<String> = []
        for slot in moduleManager.slots {
            let newConfiguration = configuration(newSettings, slot.name)
            guard newConfiguration != configuration(oldSettings, slot.name),
                let index = moduleManager.index(ofSerial: slot.serial)
            else { continue }
            let old = moduleManager.slots[index].module
            let result = watched(moduleManager.slots[index].metrics, "updateConfiguration") {
                old.updateConfiguration(newConfiguration, host: self)
            }
            guard let index = moduleManager.index(ofSerial: slot.serial) else { continue }
            if let result, result === old {
                deliver(.configurationChanged(newConfiguration), to: moduleManager.slots[index])
            } else if let result, !acceptsNames(of: result, from: moduleManager.slots[index].factory) {
                continue
            } else if let result {
                let serial = moduleManager.makeSerial()
                moduleManager.slots[index].module = result
                moduleManager.slots[index].serial = serial
                moduleManager.slots[index].notifications = result.notifications
                heldUntilStart[slot.serial] = nil
                heldUntilStart[serial] = Held()
                handOver(.deinitialize, to: old, slot.metrics)
                handOver(.initialize, to: result, slot.metrics)
                if phase == .started, let index = moduleManager.index(ofSerial: serial) { startModule(moduleManager.slots[index]) }
            } else {
                moduleManager.slots.remove(at: index)
                heldUntilStart[slot.serial] = nil
                publishRunningNames()
                removedByConfiguration.insert(slot.name)
                handOver(.deinitialize, to: old, slot.metrics)
                logger.info("module removed itself on a configuration change", [("module", slot.name)])
                diagnosticsHub.emit(.moduleRemovedByConfiguration(module: slot.name))
            }
        }

        // Order changes.
        for index in moduleManager.slots.indices {
            let order = effectiveOrder(moduleManager.slots[index].factory)
            if moduleManager.slots[index].order != order { moduleManager.slots[index].order = order }
        }
        moduleManager.sortSlots()

        // Newly enabled (or reconfigured while not running).
        let toCreate = factories.values.filter { factory in
            let name = factory.name
            guard isEnabled(name), moduleManager.slot(named: name) == nil, !removedByConfiguration.contains(name) else {
                return false
            }
            let wasEnabled = oldSettings[name]?.enabled ?? true
            return !wasEnabled || configuration(oldSettings, name) != configuration(newSettings, name)
        }
        initializeAndStart(createModules(toCreate), states: [:])
    }

    /// Stops the instance: every module gets `.willTerminate` (awaited, each with the
    /// deadline), in reverse order; then every module gets `.deinitialize`, in reverse
    /// order; the instance then holds no module. Observers get their final value (no
    /// modules), streams finish, pending `getModule` completions get nil, and everything on
    /// the Bus is uninstalled in reverse order with its hooks. Later calls do nothing.
    public func shutdown() async {
        await acquireUpdateGate()
        defer { releaseUpdateGate() }
        guard phase != .terminated else { return }
        beginUpdate()
        for slot in moduleManager.slots.reversed() {
            guard moduleManager.index(ofSerial: slot.serial) != nil else { continue }
            await deliver(.willTerminate, to: slot)
        }
        phase = .terminated
        heldUntilStart.removeAll()
        while let slot = moduleManager.slots.popLast() {
            publishRunningNames()
            handOver(.deinitialize, to: slot.module, slot.metrics)
        }
        endUpdate()
        moduleManager.finishAll()
        bus.uninstallAll()
        mailbox.finish()
        diagnosticsHub.finish()
    }

    // MARK: Events and notifications

    /// Delivers a synchronous event to every running module in order, or only to the one
    /// named `name`, on this context, before returning; a module that has not had its
    /// `.start` yet gets it right after its `.start`.
    ///
    /// `.notification` events go only to modules listening to that name (as `post`).
    /// The lifecycle events `.initialize`, `.start` and `.deinitialize` are the host's to
    /// send: passing one here is logged and ignored.
    public func send(_ event: ModuleEvent, to name: String? = nil) {
        switch event {
        case .initialize, .start, .deinitialize:
            logger.warning("lifecycle events are sent by the host itself; ignored", [("event", event.name)])
            return
        case .notification(let notification, let payload):
            if let notificationForwarder {
                notificationForwarder(notification, payload, name)
                return
            }
            var delivered = 0
            let generation = moduleManager.generation
            for slot in moduleManager.slots where slot.notifications.contains(notification) && (name == nil || slot.name == name) {
                guard isRunning(slot, unchangedSince: generation) else { continue }
                deliver(event, to: slot)
                delivered += 1
            }
            countEvent(notification, deliveries: delivered)
            return
        case .configurationChanged, .custom:
            break
        #if MODULEKIT_ABI_TEST_ADDITIONS
        case .abiTestAddition:
            break
        #endif
        }
        if let name {
            guard let slot = moduleManager.slot(named: name) else { return }
            deliver(event, to: slot)
            countEvent(event.name, deliveries: 1)
            return
        }
        var delivered = 0
        let generation = moduleManager.generation
        if heldUntilStart.isEmpty {
            // Every running module has started (none holds events): hand the event to each
            // from the cached list, a run of modules with one relay to the relay at once. A
            // module a handler removes meanwhile is skipped; one it adds is not in the list.
            let running = moduleManager.dispatchList
            for run in moduleManager.relayRuns {
                if let relay = run.relay, moduleManager.generation == generation,
                   relayed(event, by: relay, to: running.modules[run.range], running.metrics[run.range]) {
                    delivered += run.range.count
                    continue
                }
                for index in run.range
                where moduleManager.generation == generation || moduleManager.index(ofSerial: running.serials[index]) != nil {
                    handOver(event, to: running.modules[index], running.metrics[index])
                    delivered += 1
                }
            }
        } else {
            for slot in moduleManager.slots where isRunning(slot, unchangedSince: generation) {
                deliver(event, to: slot)
                delivered += 1
            }
        }
        countEvent(event.name, deliveries: delivered)
    }

    /// Delivers an awaited event to every running module, or only to the one named `name`,
    /// one module at a time, and returns when all have finished or overrun. It is not held
    /// for modules that have not had their `.start` (the caller awaits it): sent before
    /// `start()`, it reaches the initialized modules at once.
    ///
    /// `.willTerminate` and `.willUnload` go in reverse order (teardown), custom events in
    /// order. Each module has `eventDeadline`: a handler still running then is logged (with
    /// the module's name and the time taken), reported to `diagnostics()`, cancelled
    /// (cooperatively) and left behind; the host goes on with the next module. While a
    /// handler is suspended this context keeps serving other calls (actor reentrancy).
    public func send(_ event: AsyncModuleEvent, to name: String? = nil) async {
        var targets = moduleManager.slots
        if let name { targets = targets.filter { $0.name == name } }
        switch event {
        case .willTerminate, .willUnload: targets.reverse()
        case .custom: break
        }
        var delivered = 0
        let generation = moduleManager.generation
        for slot in targets where isRunning(slot, unchangedSince: generation) {
            await deliver(event, to: slot)
            delivered += 1
        }
        countEvent(event.name, deliveries: delivered)
    }

    /// Posts a notification: delivered as `.notification(name:payload:)`, on this context
    /// and before returning, to every running module whose `notifications` contain `name`,
    /// in order; a module that has not had its `.start` yet gets it right after its
    /// `.start`. Other modules never see it.
    ///
    /// A module of a plugin that runs isolated, in a worker process of its own (the
    /// daemon's docs/isolation.md), posts to the daemon: it delivers the notification to
    /// every module that listens, in every process, in module order, after this returns
    /// (as `postFromAnywhere`).
    public func post(notification name: String, payload: JSONValue = .null) {
        if let notificationForwarder {
            notificationForwarder(name, payload, nil)
            return
        }
        let event = ModuleEvent.notification(name: name, payload: payload)
        let slots = moduleManager.slots
        let generation = moduleManager.generation
        var delivered = 0
        guard heldUntilStart.isEmpty else {
            for slot in slots where slot.notifications.contains(name) {
                guard isRunning(slot, unchangedSince: generation) else { continue }
                deliver(event, to: slot)
                delivered += 1
            }
            countEvent(name, deliveries: delivered)
            return
        }
        // Every running module has started: the listeners of a run of modules with one
        // relay are handed to the relay at once.
        let running = moduleManager.dispatchList
        for run in moduleManager.relayRuns {
            let listeners = run.range.filter { slots[$0].notifications.contains(name) }
            if let relay = run.relay, !listeners.isEmpty, moduleManager.generation == generation,
               relayed(event, by: relay, to: ArraySlice(listeners.map { running.modules[$0] }),
                       ArraySlice(listeners.map { running.metrics[$0] })) {
                delivered += listeners.count
                continue
            }
            for index in listeners where isRunning(slots[index], unchangedSince: generation) {
                deliver(event, to: slots[index])
                delivered += 1
            }
        }
        countEvent(name, deliveries: delivered)
    }

    /// Posts a notification from any thread (C host callbacks use it). Delivery happens
    /// later, on this instance's context, as `post(notification:payload:)`; messages from
    /// `postFromAnywhere` and `sendFromAnywhere` are delivered in the order they were made.
    /// At most 65,536 messages of both wait; while that many do, more are dropped, said with
    /// how many at most once a second.
    public nonisolated func postFromAnywhere(notification name: String, payload: JSONValue = .null) {
        enqueue(.notification(name: name, payload: payload))
    }

    /// Sends a synchronous event from any thread: delivered later, on this instance's
    /// context, as `send(_:to:)`, in the same order as `postFromAnywhere` messages, and
    /// within the same limit.
    public nonisolated func sendFromAnywhere(_ event: ModuleEvent, to name: String? = nil) {
        enqueue(.event(event, to: name))
    }

    nonisolated func enqueue(_ message: MailboxMessage) {
        guard case .dropped = mailbox.yield(message) else { return }
        mailboxDrops.withLock { $0.unsaid += 1 }
        sayDroppedMessages()
    }

    /// Logs the messages dropped and not said yet, unless some were said less than a second
    /// ago (then the next drop, or the mailbox's task 64 deliveries later, says them).
    nonisolated func sayDroppedMessages() {
        let count: Int? = mailboxDrops.withLock { drops in
            guard drops.unsaid > 0 else { return nil }
            let now = ContinuousClock.now
            guard drops.lastSaid.map({ now - $0 >= .seconds(1) }) ?? true else { return nil }
            defer { drops = (0, now) }
            return drops.unsaid
        }
        guard let count else { return }
        logger.warning("\(count) \(count == 1 ? "message" : "messages") from other threads (postFromAnywhere, sendFromAnywhere, C modules' post_notification) dropped: \(Self.mailboxLimit) waited for delivery already (a module posts faster than the host delivers; said at most once a second)",
                       [("dropped", "\(count)")])
    }

    // MARK: Reading

    /// The names of the running modules, in order.
    public var moduleNames: [String] { moduleManager.moduleNames }

    /// The running module named `name`, or nil.
    public func module(named name: String) -> (any Module)? { moduleManager.module(named: name) }

    /// The running module named `name` as a `T`, or why there is none (see
    /// `ModuleManager.module(named:as:)`).
    public func module<T>(named name: String, as type: T.Type) throws(ModuleLookupError) -> T {
        try moduleManager.module(named: name, as: type)
    }

    /// The info (name, version, metadata) of every running module, in order. A module's
    /// `info` is its own code: each is watched against the event deadline as its handlers
    /// are (`overdueHandler`, as `info`), but a stand-in for a module in another process,
    /// which keeps a deadline of its own.
    public func infos() -> [ModuleInfo] {
        moduleManager.slots.map { slot in
            slot.module is any ModuleInAnotherProcess ? slot.module.info : watched(slot.metrics, "info") { slot.module.info }
        }
    }

    /// The info payload (what `modhostctl info` prints): every running module's info, in
    /// order, as `{"instance": name, "modules": [{"name", "version", "metadata"}, ...]}`.
    public func infoPayload() -> JSONValue {
        .object(["instance": .string(name), "modules": .array(infos().map(\.payload))])
    }

    /// The running modules, in order, with their plugin and effective settings.
    public func runningModules() -> [ModuleStatus] {
        moduleManager.slots.map { status(of: $0.factory, running: true) }
    }

    /// Every registered module, running or not (e.g. disabled), sorted by order then name.
    public func registeredModules() -> [ModuleStatus] {
        let running = Set(moduleManager.moduleNames)
        return factories.values
            .map { status(of: $0, running: running.contains($0.name)) }
            .sorted { ($0.order, $0.name) < ($1.order, $1.name) }
    }

    /// `registeredModules()` as of the end of the last update, readable from any thread
    /// without waiting for this instance's context: what a control plane shows while a
    /// module callback or an update is still running.
    public nonisolated var registeredModulesSnapshot: [ModuleStatus] { registeredSnapshot.withLock { $0 } }

    /// The current settings.
    public var currentSettings: [String: ModuleSettings] { settings }

    /// True once `start()` was called and until `shutdown()`.
    public var isStarted: Bool { phase == .started }

    /// A snapshot of the running modules' names, in order, readable from any thread (C
    /// `has_module` callbacks use it). Updated as soon as modules are created or removed,
    /// also in the middle of an update (before the new modules get `.initialize`, before a
    /// removed module gets `.deinitialize`).
    public nonisolated var runningModuleNames: [String] { runningNames.withLock { $0 } }

    /// True when a module named `name` is running, from any thread (see
    /// `runningModuleNames`).
    public nonisolated func isRunning(moduleNamed name: String) -> Bool {
        runningNames.withLock { $0.contains(name) }
    }

    /// A logger for lines attributed to `moduleName`: they carry `instance` and `module`.
    public nonisolated func logger(for moduleName: String) -> Logger {
        logger.with("module", moduleName)
    }

    /// The synchronous callback of this instance's modules (an event handler, or `create`,
    /// `updateConfiguration`, `stateForReplacement`, `restore`, `info`) that has run past the event
    /// deadline and not returned yet, if any: while it runs, every other event of this
    /// instance waits for it. A synchronous callback cannot be interrupted; the host logs it
    /// when found (a warning, with the module and its plugin), counts it as a deadline
    /// overrun (`HostMetrics`), emits `HostDiagnostic.deadlineExceeded`, and logs it again
    /// when it returns (`HostDiagnostic.finishedLate`), at once. Found at most an eighth of
    /// the deadline (and at most a second) after it has run the deadline, so an overrun
    /// shorter than that may go unreported. Of nested callbacks, the one running. Safe from
    /// any thread; never waits for the instance.
    public nonisolated var overdueHandler: OverdueHandler? { handlers.overdue }

    /// Says that the synchronous callback running now (an event handler, or the factory's
    /// `make`, `updateConfiguration`, `stateForReplacement`, `restore`) keeps a deadline of
    /// its own (it hands the work to code elsewhere and waits for it at most the event
    /// deadline): it is never reported overdue. For the host's stand-ins of C and isolated
    /// modules.
    @_spi(ModuleHost)
    public func handlerKeepsItsOwnDeadline() { handlers.exemptCurrent() }

    /// Says what the handler watch found: an overdue handler, or its return.
    static func say(_ report: HandlerWatch.Report, logger: Logger, hub: DiagnosticsHub, deadline: Duration) {
        switch report {
        case .overdue(let handler, let metrics):
            metrics.recordDeadlineOverrun()
            logger.warning(
                "module did not return from \(handler.event) within the event deadline; a synchronous callback cannot be interrupted, and every event of this host waits for it",
                [("module", handler.module)] + (handler.plugin.isEmpty ? [] : [("plugin", handler.plugin)])
                    + [("event", handler.event), ("elapsed", handler.elapsed.millisecondsText), ("deadline", deadline.millisecondsText)])
            hub.emit(.deadlineExceeded(module: handler.module, event: handler.event, elapsed: handler.elapsed))
        case .returned(let handler):
            logger.info(
                "module returned from \(handler.event) after at least \(handler.elapsed.millisecondsText), past the event deadline",
                [("module", handler.module)] + (handler.plugin.isEmpty ? [] : [("plugin", handler.plugin)])
                    + [("event", handler.event), ("elapsed", handler.elapsed.millisecondsText)])
            hub.emit(.finishedLate(module: handler.module, event: handler.event, elapsed: handler.elapsed))
        }
    }

    /// A stream of this instance's diagnostics (deadline overruns, refused modules...),
    /// from the moment it is created until shutdown. Any number of streams may exist.
    public nonisolated func diagnostics() -> AsyncStream<HostDiagnostic> { diagnosticsHub.stream() }

    /// Runs `body` on this instance's context and returns its result: how code outside the
    /// host (a test, a benchmark, the daemon) reaches `moduleManager` and the modules.
    @discardableResult
    public func perform<T: Sendable>(_ body: @Sendable (isolated HostInstance) throws -> T) rethrows -> T {
        try body(self)
    }

    // MARK: Observables from anywhere

    /// `moduleManager.observeModules(_:)`, callable from any thread. The observable is
    /// subscribed on, and emits on, this instance's context.
    public nonisolated func observeModules<T>(_ transform: @escaping @Sendable (any Module) -> T?) -> Observable<[T]> {
        ModuleManager.modulesObservable(host: self, transform)
    }

    /// `moduleManager.observeModule(_:)` (transform form), callable from any thread.
    public nonisolated func observeModule<T>(_ transform: @escaping @Sendable (any Module) -> T?) -> Observable<T?> {
        ModuleManager.moduleObservable(host: self, transform)
    }

    /// `moduleManager.observeModule(_:)` (type form), callable from any thread.
    public nonisolated func observeModule<T: Module & SendableMetatype>(_ type: T.Type = T.self) -> Observable<T?> {
        ModuleManager.moduleObservable(host: self) { $0 as? T }
    }
}
