import Synchronization

/// How a host instance keeps its modules: creating, starting and unloading them, handing
/// them events, and publishing what observers read. Every function here runs on the
/// instance (an actor); the public API in HostInstance.swift is the way in.
extension HostInstance {
    func isEnabled(_ name: String) -> Bool { settings[name]?.enabled ?? true }

    func effectiveOrder(_ factory: ModuleFactory) -> Int { settings[factory.name]?.order ?? factory.defaultOrder }

    func status(of factory: ModuleFactory, running: Bool) -> ModuleStatus {
        ModuleStatus(
            name: factory.name, version: factory.version, plugin: factory.plugin, order: effectiveOrder(factory),
            enabled: isEnabled(factory.name), running: running)
    }

    func beginUpdate() { moduleManager.updateDepth += 1 }

    /// Ends an update; at depth zero, observers are evaluated. Only the operations that
    /// create modules (or end the instance) make the modules ready the first time: a
    /// removal or a settings change before any `add` must not emit a premature `[]`.
    ///
    /// `amendingRegistered`: the factories the update registered, and which of their names
    /// were registered before, when it changed nothing else the registered snapshot shows
    /// (an `add`); nil rebuilds the whole snapshot.
    func endUpdate(establishesReadiness: Bool = true,
                           amendingRegistered: (factories: [ModuleFactory], replacing: Set<String>)? = nil) {
        moduleManager.updateDepth -= 1
        publishRunningNames()
        // The snapshot is for control planes: made after the observers ran, off their path.
        defer {
            if let amendingRegistered {
                amendRegisteredModules(amendingRegistered.factories, replacing: amendingRegistered.replacing)
            } else {
                publishRegisteredModules()
            }
        }
        guard moduleManager.updateDepth == 0 else { return }
        if establishesReadiness { moduleManager.hasBeenReady = true }
        moduleManager.notifyObservers()
    }

    func publishRegisteredModules() {
        let registered = registeredModules()
        registeredSnapshot.withLock { $0 = registered }
    }
    /// Puts the rows of `factories` into the registered snapshot, each at its place by
    /// (order, name), after removing the rows of the names in `replacing`: the snapshot then
    /// equals `registeredModules()` when nothing else changed since it was last published.
    func amendRegisteredModules(_ factories: [ModuleFactory], replacing: Set<String>) {
        guard !factories.isEmpty else { return }
        let rows = factories.map { status(of: $0, running: moduleManager.slot(named: $0.name) != nil) }
        registeredSnapshot.withLock { snapshot in
            if !replacing.isEmpty { snapshot.removeAll { replacing.contains($0.name) } }
            for row in rows {
                snapshot.insert(row, at: snapshot.partitionPoint { ($0.order, $0.name) < (row.order, row.name) })
            }
        }
    }
    /// Copies the running names to the thread-safe snapshot when they changed. Called
    /// whenever modules were created or removed, so that `isRunning(moduleNamed:)` is
    /// current even in the middle of an update (a C module asking during `.initialize`).
    func publishRunningNames() {
        guard publishedGeneration != moduleManager.generation else { return }
        publishedGeneration = moduleManager.generation
        let names = moduleManager.moduleNames
        runningNames.withLock { $0 = names }
    }
    /// Creates the modules of `factories` in order and inserts them; returns the new slots
    /// in order.
    func createModules(_ factories: [ModuleFactory]) -> [ModuleSlot] {
        let sorted = factories.sorted { (effectiveOrder($0), $0.name) < (effectiveOrder($1), $1.name) }
        var created: [ModuleSlot] = []
        for factory in sorted {
            let metrics = self.metrics.module(named: factory.name, plugin: factory.plugin)
            let configuration = settings[factory.name]?.configuration ?? [:]
            guard let module = watched(metrics, "create", { factory.make(self, configuration) }) else {
                metrics.recordError(.refused)
                logger.error("module refused to initialize", [("module", factory.name), ("plugin", factory.plugin)])
                diagnosticsHub.emit(.moduleRefused(module: factory.name, plugin: factory.plugin))
                continue
            }
            guard acceptsNames(of: module, from: factory) else {
                metrics.recordError(.refused)
                continue
            }
            let slot = ModuleSlot(
                factory: factory, module: module, serial: moduleManager.makeSerial(), order: effectiveOrder(factory),
                notifications: module.notifications, metrics: metrics)
            heldUntilStart[slot.serial] = Held()
            created.append(slot)
            moduleManager.insert(slot)
        }
        publishRunningNames()
        return created
    }

    /// True when `module`'s `moduleName` and `info.name` are its factory's name: a module has
    /// one name. Otherwise logs the three names and the fix, reports `.moduleRefused`, and
    /// the module is not used.
    func acceptsNames(of module: any Module, from factory: ModuleFactory) -> Bool {
        let moduleName = module.moduleName
        let infoName = module.info.name
        guard moduleName != factory.name || infoName != factory.name else { return true }
        logger.error(
            "module refused: a module has one name, but this one is \"\(factory.name)\" for its factory, \"\(moduleName)\" in moduleName and \"\(infoName)\" in info.name; make moduleName and info.name return the factory's name",
            [("module", factory.name), ("plugin", factory.plugin), ("moduleName", moduleName), ("info.name", infoName)])
        diagnosticsHub.emit(.moduleRefused(module: factory.name, plugin: factory.plugin))
        return false
    }

    /// `.initialize` to each, then `restore(state:)` where a state exists, then `.start` to
    /// each if the host has started. Skips modules removed meanwhile by a handler.
    func initializeAndStart(_ created: [ModuleSlot], states: [String: JSONValue]) {
        for slot in created where moduleManager.index(ofSerial: slot.serial) != nil {
            handOver(.initialize, to: slot.module, slot.metrics)
        }
        for slot in created where moduleManager.index(ofSerial: slot.serial) != nil {
            if let state = states[slot.name] { watched(slot.metrics, "restore") { slot.module.restore(state: state, host: self) } }
        }
        guard phase == .started else { return }
        for slot in created where moduleManager.index(ofSerial: slot.serial) != nil {
            startModule(slot)
        }
    }
    /// `.start` to a module, then the events held for it until then, in order (stopping
    /// if a handler removes it). Events made for it while it starts are held too, so its
    /// start handler is never re-entered by them.
    func startModule(_ slot: ModuleSlot) {
        if let dropped = heldUntilStart[slot.serial]?.dropped, dropped > 0 {
            logger.warning("\(dropped) events made before its start were dropped (a module holds at most \(Self.heldEventLimit))",
                           [("module", slot.name)])
        }
        handOver(.start, to: slot.module, slot.metrics)
        while let held = heldUntilStart.removeValue(forKey: slot.serial), !held.events.isEmpty {
            // Events made while these are delivered are held again, and delivered next.
            heldUntilStart[slot.serial] = Held()
            for event in held.events {
                guard moduleManager.index(ofSerial: slot.serial) != nil else {
                    heldUntilStart[slot.serial] = nil
                    return
                }
                handOver(event, to: slot.module, slot.metrics)
            }
        }
    }
    /// A synchronous event to one running module: at once when it has started, else held
    /// until its `.start`.
    func deliver(_ event: ModuleEvent, to slot: ModuleSlot) {
        guard !heldUntilStart.isEmpty, var held = heldUntilStart[slot.serial] else {
            handOver(event, to: slot.module, slot.metrics)
            return
        }
        heldUntilStart[slot.serial] = nil  // `held` stays unique while it changes
        if held.events.count < Self.heldEventLimit {
            held.events.append(event)
        } else {
            // Said once, not once per event: a flood would otherwise flood the log.
            held.dropped += 1
            if held.dropped == 1 {
                logger.warning("module has not started and holds \(Self.heldEventLimit) events already; this event and the next until its start are dropped",
                               [("module", slot.name), ("event", event.name)])
            }
        }
        heldUntilStart[slot.serial] = held
    }

    /// Whether `slot`, taken from `moduleManager.slots` when it was at `generation`, is still
    /// among the running modules: a handler may add or remove modules during a fan-out.
    /// Constant time while the modules have not changed since.
    func isRunning(_ slot: ModuleSlot, unchangedSince generation: UInt64) -> Bool {
        moduleManager.generation == generation || moduleManager.index(ofSerial: slot.serial) != nil
    }
    /// `.willUnload` (optional, awaited), `.deinitialize`, removal, for the slot if still present.
    func unload(_ slot: ModuleSlot, sendWillUnload: Bool) async {
        guard moduleManager.index(ofSerial: slot.serial) != nil else { return }
        if sendWillUnload { await deliver(.willUnload, to: slot) }
        guard let index = moduleManager.index(ofSerial: slot.serial) else { return }
        let removed = moduleManager.slots.remove(at: index)
        heldUntilStart[removed.serial] = nil
        publishRunningNames()
        handOver(.deinitialize, to: removed.module, removed.metrics)
    }

    /// Hands a synchronous event to one module's handler and counts it; one delivery in
    /// `ModuleMetrics.synchronousSampling` is timed (two clock reads cost more than most
    /// handlers).
    ///
    /// Watched (`handlers`) from when it begins to when it returns, as `watched` does, with
    /// no string copied when the event's name is the one the watch has (most deliveries).
    @inline(__always)
    func handOver(_ event: ModuleEvent, to module: any Module, _ metrics: ModuleMetrics) {
        let outer = handlers.current
        let restore = event.isNamed(watchedEvent) ? nil : watch(event.name, nestedIn: outer)
        handlers.mark(metrics, outer: outer)
        defer {
            if let restore { watch(restore, nestedIn: 0) }
            handlers.leave(restoring: outer)
        }
        guard metrics.countDelivery() % ModuleMetrics.synchronousSampling == 0 else {
            module.handle(event, host: self)
            return
        }
        let clock = ContinuousClock()
        let started = clock.now
        module.handle(event, host: self)
        metrics.handlerTime.record(clock.now - started)
    }
    /// Has `relay` deliver a synchronous event to a run of its modules; false when it left
    /// the event to each module's own handler. The relay keeps the deadline of each of its
    /// calls: the watch does not report the run.
    func relayed(_ event: ModuleEvent, by relay: any ModuleRelay, to modules: ArraySlice<any Module>,
                         _ metrics: ArraySlice<ModuleMetrics>) -> Bool {
        let outer = handlers.current
        handlers.mark(metrics[metrics.startIndex], outer: outer)
        handlers.exemptCurrent()
        defer { handlers.leave(restoring: outer) }
        return relay.deliver(event, to: modules, host: self)
    }
    /// Gives the watch `name` for the callbacks marked next; returns the name to give back
    /// when the callback returns if it is nested in another (`outer` is not 0): its caller's.
    @discardableResult
    func watch(_ name: String, nestedIn outer: UInt64) -> String? {
        let previous = watchedEvent
        watchedEvent = name
        handlers.setEvent(name)
        return outer != 0 ? previous : nil
    }
    /// Runs `body`, a synchronous callback of the module counted by `metrics` (`what`: the
    /// event's name, or `create`, `updateConfiguration`, `stateForReplacement`, `restore`),
    /// watched against the event deadline (`handlers`) from when it begins to when it returns.
    func watched<T>(_ metrics: ModuleMetrics, _ what: String, _ body: () -> T) -> T {
        let outer = handlers.current
        let restore = what == watchedEvent ? nil : watch(what, nestedIn: outer)
        handlers.mark(metrics, outer: outer)
        defer {
            // A nested callback (its caller's handler sent an event) gives back its caller's
            // name before its mark: the watch never sees a mark with another's name.
            if let restore { watch(restore, nestedIn: 0) }
            handlers.leave(restoring: outer)
        }
        return body()
    }
    /// Counts `deliveries` of event `name` (bounded: `HostMetrics`). A name that reached
    /// no module takes no place among the names counted apart.
    func countEvent(_ name: String, deliveries: Int) {
        guard deliveries > 0 else { return }
        if let last = lastEventCounter, last.name == name {
            last.add(deliveries)
            return
        }
        let counter = metrics.eventCounter(for: name)
        // Names past the bound share the "other" counter: never cached under their own name.
        if counter.name == name { lastEventCounter = counter }
        counter.add(deliveries)
    }
    /// Runs one module's async handler against the deadline.
    func deliver(_ event: AsyncModuleEvent, to slot: ModuleSlot) async {
        let module = slot.module
        let moduleName = slot.name
        let metrics = slot.metrics
        _ = metrics.countDelivery()
        let deadline = eventDeadline
        let race = DeadlineRace()
        let clock = ContinuousClock()
        let started = clock.now
        let handler = Task {
            await module.handle(event, host: self)
            metrics.handlerTime.record(clock.now - started)
            if !race.finish(.completed) {
                let elapsed = clock.now - started
                self.logger.info(
                    "module finished an event after its deadline",
                    [("module", moduleName), ("event", event.name), ("elapsed", elapsed.millisecondsText)])
                self.diagnosticsHub.emit(.finishedLate(module: moduleName, event: event.name, elapsed: elapsed))
            }
        }
        // One timer for every delivery of this instance, not one per module and event.
        let ticket = deadlines.start(race, due: started + deadline)
        // A cancelled caller (e.g. a shutdown being cancelled) cancels the handler too; the
        // host still waits for it or for the deadline.
        let outcome = await withTaskCancellationHandler {
            await race.wait()
        } onCancel: {
            handler.cancel()
        }
        deadlines.end(ticket)
        guard outcome == .deadlineExceeded else { return }
        metrics.recordDeadlineOverrun()
        handler.cancel()
        let elapsed = clock.now - started
        logger.warning(
            "module did not finish an event within the deadline; going on without it",
            [("module", moduleName), ("event", event.name), ("elapsed", elapsed.millisecondsText),
             ("deadline", deadline.millisecondsText)])
        diagnosticsHub.emit(.deadlineExceeded(module: moduleName, event: event.name, elapsed: elapsed))
    }
    /// Serializes updates that await (`remove`, `replace`): one at a time, first come first
    /// served, each whole. The host is an actor, but an actor runs another call at each of
    /// an update's suspensions (awaited `willUnload` handlers): without the gate a second
    /// update could start while the first waits, and observers would see half of each.
    func acquireUpdateGate() async {
        guard updateGateBusy else {
            updateGateBusy = true
            return
        }
        await withCheckedContinuation { updateGateWaiters.append($0) }
    }
    func releaseUpdateGate() {
        if updateGateWaiters.isEmpty {
            updateGateBusy = false
        } else {
            updateGateWaiters.removeFirst().resume()
        }
    }
}
