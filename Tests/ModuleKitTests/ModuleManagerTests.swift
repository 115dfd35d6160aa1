import Dispatch
@_spi(ModuleHost) import ModuleKit
import Testing

/// The emission rules of ModuleManager (docs/modules.md, "Observing other modules"), one
/// test per guarantee.
@Suite("ModuleManager emission rules", .timeLimit(.minutes(5)))
struct ModuleManagerTests {
    /// Subscribes `observeModules { $0 as? Probe }` on `host` and records "emit:<tags>".
    func watchProbes(_ host: HostInstance, into recorder: Recorder) async {
        await host.perform { host in
            host.moduleManager.observeModules { $0 as? Probe }.subscribe { probes in
                recorder.record("emit:" + tags(probes))
            }
        }
    }

    func currentTags(_ host: HostInstance) async -> String {
        await host.perform { host in tags(host.moduleManager.modules) }
    }

    // "While the modules are still being created, or updated, a subscriber receives no value
    // at all rather than a premature empty array []."
    @Test func observeModulesEmitsNothingBeforeTheModulesAreCreated() async {
        let recorder = Recorder()
        let host = makeHost()
        await watchProbes(host, into: recorder)
        #expect(recorder.all.isEmpty, "no premature [] before the first update")
        await host.add([probe("a", recorder: Recorder())])
        #expect(recorder.all == ["emit:" + (await currentTags(host))])
    }

    // Same sentence: removals or settings changes before any module was added do not make the
    // modules "ready" (no premature [] either).
    @Test func updatesBeforeTheFirstAddDoNotEmit() async {
        let recorder = Recorder()
        let host = makeHost()
        await watchProbes(host, into: recorder)
        await host.updateSettings(["a": ModuleSettings(order: 1)])
        await host.remove(moduleNamed: ["nothing"])
        #expect(recorder.all.isEmpty)
        await host.add([probe("a", recorder: Recorder())])
        #expect(recorder.all.count == 1)
    }

    // Same sentence, seen from a module that subscribes while it is being initialized.
    @Test func aSubscriberDuringModuleCreationGetsOneValueWithEveryModule() async {
        let recorder = Recorder()
        let host = makeHost()
        let watcher = ModuleFactory(name: "watcher", version: "1", defaultOrder: 0) { host, _ in
            let module = Probe(name: "watcher", recorder: Recorder())
            host.moduleManager.observeModules { $0 as? Probe }.subscribe { probes in
                recorder.record("emit:" + probes.map(\.moduleName).joined(separator: ","))
            }
            recorder.record("made")
            return module
        }
        await host.add([watcher, probe("b", order: 1, recorder: Recorder()), probe("c", order: 2, recorder: Recorder())])
        #expect(recorder.all == ["made", "emit:watcher,b,c"])
    }

    // "... or updated": an awaited update (willUnload) is still an update in progress.
    @Test(.timeLimit(.minutes(1)))
    func aSubscriberDuringAnAsyncUpdateGetsNoValueUntilItCompletes() async {
        let events = Recorder()
        let emissions = Recorder()
        let gate = Gate()
        let host = makeHost(deadline: .seconds(60))
        await host.add([
            probe("a", order: 1, recorder: events, behavior: ProbeBehavior(blockOn: ["willUnload"], gate: gate)),
            probe("b", order: 2, recorder: events),
        ])
        let removal = Task { await host.remove(moduleNamed: ["a"]) }
        await events.wait { $0.contains("a.willUnload") }
        await watchProbes(host, into: emissions)
        #expect(emissions.all.isEmpty, "no value while the removal awaits willUnload")
        gate.open()
        await removal.value
        #expect(emissions.all.count == 1)
        #expect(emissions.all.first?.hasPrefix("emit:b#") == true)
    }

    // "The returned Observable, per modules array change, emits a compact map of all the
    // transformations succeeded" ... "in order, or an empty array when none of them did."
    @Test func observeModulesEmitsTheSuccessfulTransformationsInOrderOrEmpty() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.perform { host in
            host.moduleManager.observeModules { $0 as? Greeter }.subscribe { greeters in
                recorder.record("greeters:" + greeters.map(\.greeting).joined(separator: ","))
            }
            host.moduleManager.observeModules { $0 as? Special }.subscribe { specials in
                recorder.record("specials:\(specials.count)")
            }
        }
        await host.add([
            greeter("g2", order: 2, greeting: "two"), probe("p", order: 1, recorder: Recorder()),
            greeter("g0", order: 0, greeting: "zero"),
        ])
        #expect(recorder.all == ["greeters:zero,two", "specials:0"])
    }

    // "A value that varies over time for the same module is not re-emitted" / "updateConfiguration
    // may mutate a module in place and return the same instance - which must not be re-emitted".
    @Test func observeModulesDoesNotReEmitWhenAModuleIsMutatedInPlace() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([greeter("g", greeting: "hello")])
        await host.perform { host in
            host.moduleManager.observeModules { $0 as? GreeterProbe }.subscribe { greeters in
                recorder.record("emit:" + greeters.map(\.greeting).joined(separator: ","))
            }
        }
        await host.updateSettings(["g": ModuleSettings(configuration: ["greeting": "bonjour"])])
        let greeting = await host.perform { host in (host.moduleManager.modules.first as? GreeterProbe)?.greeting }
        #expect(greeting == "bonjour", "the module was updated in place")
        #expect(recorder.all == ["emit:hello"], "and not re-emitted")
    }

    // "... while a module replaced by a new instance with the same id must be."
    @Test func observeModulesReEmitsForANewInstanceWithTheSameName() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([probe("a", recorder: Recorder())])
        await watchProbes(host, into: recorder)
        let before = await currentTags(host)
        await host.updateSettings(["a": ModuleSettings(configuration: ["reply": "new"])])
        let after = await currentTags(host)
        #expect(before != after && after.hasPrefix("a#"))
        #expect(recorder.all == ["emit:" + before, "emit:" + after])
    }

    // "The array is only emitted again when the set of modules whose transformation
    // succeeded changes": a module whose transformation fails changes nothing.
    @Test func observeModulesIgnoresChangesOfModulesWhoseTransformationFails() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([probe("a", recorder: Recorder())])
        await watchProbes(host, into: recorder)
        await host.add([special("s1")])
        await host.remove(moduleNamed: ["s1"])
        await host.updateSettings(["s2": ModuleSettings(enabled: false)])
        #expect(recorder.all.count == 1)
    }

    // "It is order-sensitive because module order is significant."
    @Test func observeModulesReEmitsWhenOnlyTheOrderChanges() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([probe("a", order: 1, recorder: Recorder()), probe("b", order: 2, recorder: Recorder())])
        await host.perform { host in
            host.moduleManager.observeModules { $0 as? Probe }.subscribe { probes in
                recorder.record(probes.map(\.moduleName).joined(separator: ","))
            }
        }
        await host.updateSettings(["a": ModuleSettings(order: 3)])
        #expect(await host.moduleNames == ["b", "a"])
        await host.updateSettings(["a": ModuleSettings(order: 3), "b": ModuleSettings(order: 2)])
        #expect(recorder.all == ["a,b", "b,a"], "an order setting that changes nothing does not re-emit")
    }

    // observeModule(transform): "emits nil when none of the transformations succeeded, or the
    // first object successfully returned by a transformation block."
    @Test func observeModuleEmitsTheFirstSuccessfulTransformationInOrder() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.perform { host in
            host.moduleManager.observeModule { $0 as? Greeter }.subscribe { greeter in
                recorder.record("greeter:" + (greeter?.greeting ?? "nil"))
            }
        }
        await host.add([special("s", order: 0), greeter("g2", order: 2, greeting: "two"), greeter("g1", order: 1, greeting: "one")])
        #expect(recorder.all == ["greeter:one"])
    }

    // "The object is only emitted again when the module whose transformation succeeded
    // changes, by identity."
    @Test func observeModuleReEmitsOnlyWhenTheResolvedModuleChangesByIdentity() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([greeter("g1", order: 1, greeting: "one")])
        await host.perform { host in
            host.moduleManager.observeModule { $0 as? GreeterProbe }.subscribe { greeter in
                recorder.record(greeter.map(tag) ?? "nil")
            }
        }
        let first = await currentTags(host)
        await host.add([greeter("g2", order: 2)])  // a later match: same first module
        await host.updateSettings(["g1": ModuleSettings(configuration: ["greeting": "uno"])])  // in place
        #expect(recorder.all == [first])
        await host.add([greeter("g0", order: 0)])  // an earlier match
        await host.updateSettings(["g0": ModuleSettings(configuration: ["reply": "new"])])  // new instance
        await host.remove(moduleNamed: ["g0"])
        let names = recorder.all.map { $0.split(separator: "#").first.map(String.init) ?? $0 }
        #expect(names == ["g1", "g0", "g0", "g1"])
        #expect(Set(recorder.all).count == 3, "g0 twice, as two different instances; g1 twice, the same instance")
        #expect(recorder.all[0] == recorder.all[3] && recorder.all[1] != recorder.all[2])
    }

    // observeModule(transform) "... receives no value at all rather than a premature nil", then
    // nil when nothing matches, and nil is not re-emitted while nothing matches.
    @Test func observeModuleEmitsNilOnceWhenNothingMatches() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.perform { host in
            host.moduleManager.observeModule { $0 as? Greeter }.subscribe { greeter in
                recorder.record(greeter == nil ? "nil" : "greeter")
            }
        }
        #expect(recorder.all.isEmpty)
        await host.add([probe("p", recorder: Recorder())])
        await host.add([special("s")])
        #expect(recorder.all == ["nil"])
        await host.add([greeter("g")])
        #expect(recorder.all == ["nil", "greeter"])
    }

    // observeModule(type): "Once this starts emitting, nil means the module is not enabled -
    // it never means that the modules are still being created."
    @Test func observeModuleOfATypeEmitsNilOnlyWhenTheModuleIsNotEnabled() async {
        let recorder = Recorder()
        let host = makeHost(settings: ["s": ModuleSettings(enabled: false)])
        await host.perform { host in
            host.moduleManager.observeModule(Special.self).subscribe { special in
                recorder.record(special?.moduleName ?? "nil")
            }
        }
        #expect(recorder.all.isEmpty, "nothing while the modules are being created")
        await host.add([special("s"), probe("p", recorder: Recorder())])
        #expect(recorder.all == ["nil"], "known but disabled")
        await host.updateSettings(["s": ModuleSettings(enabled: true)])
        #expect(recorder.all == ["nil", "s"])
        await host.updateSettings(["s": ModuleSettings(enabled: false)])
        #expect(recorder.all == ["nil", "s", "nil"])
    }

    // "In case multiple modules of this type are enabled at the same time, the first one,
    // ordered by ModuleSettings.order, will be returned."
    @Test func observeModuleOfATypeReturnsTheFirstByOrder() async {
        let recorder = Recorder()
        let host = makeHost(settings: ["s1": ModuleSettings(order: 5), "s2": ModuleSettings(order: 1)])
        await host.perform { host in
            host.moduleManager.observeModule(Special.self).subscribe { recorder.record($0?.moduleName ?? "nil") }
        }
        await host.add([special("s1", order: 0), special("s2", order: 9)])
        #expect(recorder.all == ["s2"])
        await host.updateSettings(["s1": ModuleSettings(order: 0), "s2": ModuleSettings(order: 1)])
        #expect(recorder.all == ["s2", "s1"])
    }

    // "Upon changes of the modules list this Observable won't emit again unless the actual
    // Module instance is different from the last returned one."
    @Test func observeModuleOfATypeIgnoresOtherChanges() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([special("s", order: 1)])
        await host.perform { host in
            host.moduleManager.observeModule(Special.self).subscribe { recorder.record($0.map(tag) ?? "nil") }
        }
        await host.add([probe("p", order: 0, recorder: Recorder()), special("t", order: 2)])
        await host.updateSettings(["p": ModuleSettings(order: 3)])
        #expect(recorder.all.count == 1)
    }

    // getModule: "The completion is called once, after the modules are ready."
    @Test func getModuleWaitsUntilTheModulesAreReadyAndCallsOnce() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.perform { host in
            host.moduleManager.getModule(transform: { $0 as? Greeter }) { greeter in
                recorder.record("got:" + (greeter?.greeting ?? "nil"))
            }
        }
        #expect(recorder.all.isEmpty)
        await host.add([probe("p", order: 0, recorder: Recorder()), greeter("g", order: 1, greeting: "hi")])
        #expect(recorder.all == ["got:hi"])
        await host.add([greeter("g0", order: -1, greeting: "earlier")])
        await host.remove(moduleNamed: ["g"])
        #expect(recorder.all == ["got:hi"], "once only")
    }

    // A module asking during its own creation is answered when the whole update is done,
    // with modules created after it in the same update.
    @Test func getModuleFromAModuleBeingCreatedSeesModulesCreatedLater() async {
        let recorder = Recorder()
        let host = makeHost()
        let asker = ModuleFactory(name: "asker", version: "1", defaultOrder: 0) { host, _ in
            host.moduleManager.getModule(transform: { $0 as? Greeter }) { recorder.record("got:" + ($0?.greeting ?? "nil")) }
            recorder.record("asked")
            return Special(name: "asker")
        }
        await host.add([asker, greeter("g", order: 1, greeting: "later")])
        #expect(recorder.all == ["asked", "got:later"])
    }

    // "upon first successful transformation, the completion is called immediately and no
    // other transformation is applied."
    @Test func getModuleWhenReadyAnswersAtOnceAndStopsAtTheFirstSuccess() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([probe("p", order: 0, recorder: Recorder()), greeter("g1", order: 1, greeting: "one"), greeter("g2", order: 2)])
        await host.perform { host in
            host.moduleManager.getModule(
                transform: { module -> Greeter? in
                    recorder.record("try:" + module.moduleName)
                    return module as? Greeter
                },
                completion: { recorder.record("got:" + ($0?.greeting ?? "nil")) })
            recorder.record("returned")
        }
        #expect(recorder.all == ["try:p", "try:g1", "got:one", "returned"])
    }

    // "Called, once the modules are ready, with the transformed module instance or nil if no
    // transformation succeeds." The default transform casts.
    @Test func getModuleGivesNilWhenNothingMatchesAndCastsByDefault() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([probe("p", recorder: Recorder()), special("s", order: 1)])
        await host.perform { host in
            host.moduleManager.getModule(transform: { $0 as? Greeter }) { recorder.record($0 == nil ? "nil" : "greeter") }
            host.moduleManager.getModule { (special: Special?) in recorder.record(special?.moduleName ?? "none") }
        }
        #expect(recorder.all == ["nil", "s"])
    }

    // `isDisposed` says that dispose() was called, nothing else: a getModule completion that
    // ran leaves it false, and disposing afterwards turns it true.
    @Test func isDisposedMeansDisposeWasCalledNotThatAOneShotCompletionRan() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([probe("p", recorder: Recorder())])
        await host.perform { host in
            let delivered = host.moduleManager.getModule(transform: { $0 as? Probe }) { _ in recorder.record("called") }
            #expect(recorder.all == ["called"])
            #expect(!delivered.isDisposed)
            delivered.dispose()
            #expect(delivered.isDisposed)
        }
        await host.add([probe("q", recorder: Recorder())])
        #expect(recorder.all == ["called"], "a one-shot completion runs once")
    }

    // A module has one name: the factory's, which `moduleName` and `info.name` must repeat.
    // A module whose names disagree is refused where it is created, not found under one
    // name and reported under another.
    @Test func aModuleWhoseNamesDisagreeIsRefusedWhereItIsCreated() async {
        let host = makeHost()
        let diagnostics = host.diagnostics()
        await host.add([
            ModuleFactory(name: "factory", version: "1", plugin: "test") { _, _ in Named(moduleName: "other", infoName: "factory") },
            ModuleFactory(name: "info", version: "1", plugin: "test") { _, _ in Named(moduleName: "info", infoName: "shown") },
            ModuleFactory(name: "good", version: "1", plugin: "test") { _, _ in Named(moduleName: "good", infoName: "good") },
        ])
        #expect(await host.moduleNames == ["good"])
        #expect(await host.infos().map(\.name) == ["good"])
        #expect(await host.perform { host in host.module(named: "other") == nil && host.module(named: "factory") == nil })
        // A new instance from updateConfiguration is held to the same rule; the old one stays.
        await host.updateSettings(["good": ModuleSettings(configuration: ["rename": "renamed"])])
        #expect(await host.moduleNames == ["good"])
        #expect(await host.perform { host in (host.module(named: "good") as? Named)?.infoName } == "good")
        await host.shutdown()
        var refused: [String] = []
        for await diagnostic in diagnostics {
            if case .moduleRefused(let module, "test") = diagnostic { refused.append(module) }
        }
        #expect(refused == ["factory", "info", "good"])
    }

    // "A Disposable that can be disposed to avoid the completion being called."
    @Test func disposingGetModulePreventsTheCompletion() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.perform { host in
            let pending = host.moduleManager.getModule(transform: { $0 as? Probe }) { _ in recorder.record("called") }
            host.moduleManager.getModule(transform: { $0 as? Probe }) { _ in recorder.record("kept") }
            #expect(!pending.isDisposed)
            pending.dispose()
            #expect(pending.isDisposed)
        }
        await host.add([probe("p", recorder: Recorder())])
        #expect(recorder.all == ["kept"])
    }

    // A disposed subscription receives nothing more.
    @Test func disposingASubscriptionStopsEmissions() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.add([probe("a", recorder: Recorder())])
        await host.perform { host in
            let subscription = host.moduleManager.observeModules { $0 as? Probe }.subscribe { recorder.record("emit:\($0.count)") }
            host.moduleManager.observeModules { $0 as? Probe }.subscribe { recorder.record("other:\($0.count)") }
            subscription.dispose()
        }
        await host.add([probe("b", recorder: Recorder())])
        #expect(recorder.all == ["emit:1", "other:1", "other:2"])
    }

    // Methods that only return an Observable, like observeModule, can be called from any
    // thread; the Observable is subscribed on the host's context and emits there.
    @Test func observablesCanBeCreatedAnywhereAndEmitOnTheHost() async {
        let recorder = Recorder()
        let host = makeHost()
        let observable = await Task.detached { host.observeModules { $0.moduleName } }.value
        await host.add([probe("a", recorder: Recorder())])
        await host.perform { host in
            observable.subscribe { names in
                // Runs on the host's context: the compiler lets it read the manager directly.
                recorder.record(names.joined(separator: ",") + "|ready=\(host.moduleManager.isReady)")
            }
        }
        #expect(recorder.all == ["a|ready=true"])
    }

    // To consume values elsewhere, observeOn { queue.async(execute: $0) } subscribes from any thread and delivers
    // on the queue.
    @Test(.timeLimit(.minutes(1)))
    func observeOnDeliversEveryValueInOrderOnTheGivenQueue() async {
        let recorder = Recorder()
        let host = makeHost()
        let queue = DispatchQueue(label: "observer")
        let key = DispatchSpecificKey<String>()
        queue.setSpecific(key: key, value: "observer")
        let subscription = host.observeModules { $0.moduleName }.observeOn { queue.async(execute: $0) }.subscribe { names in
            recorder.record((DispatchQueue.getSpecific(key: key) ?? "elsewhere") + ":" + names.joined(separator: ","))
        }
        await host.add([probe("a", recorder: Recorder())])
        await recorder.wait { !$0.isEmpty }
        await host.add([probe("b", order: 1, recorder: Recorder())])
        await recorder.wait { $0.count == 2 }
        #expect(recorder.all == ["observer:a", "observer:a,b"])
        subscription.dispose()
        await host.remove(moduleNamed: ["a"])
        await host.perform { _ in }
        queue.sync {}
        #expect(recorder.count == 2, "nothing after dispose")
    }

    // "Each observable also offers an AsyncSequence of its values" (Sendable values, anywhere).
    @Test(.timeLimit(.minutes(1)))
    func valuesStreamsEveryEmissionAndFinishesAtShutdown() async {
        let host = makeHost()
        var iterator = host.observeModules { $0.moduleName }.values.makeAsyncIterator()
        await host.add([probe("a", recorder: Recorder()), probe("b", order: 1, recorder: Recorder())])
        #expect(await iterator.next() == ["a", "b"])
        await host.remove(moduleNamed: ["a"])
        #expect(await iterator.next() == ["b"])
        await host.shutdown()
        #expect(await iterator.next() == [])
        #expect(await iterator.next() == nil)
    }

    // The AsyncSequence for values that must stay on the host (module objects).
    @Test(.timeLimit(.minutes(1)))
    func valuesOnHostIteratesModuleObjectsOnTheHost() async {
        let host = makeHost()
        await host.add([probe("a", order: 0, recorder: Recorder()), probe("b", order: 1, recorder: Recorder())])
        let seen = await host.collectProbeEmissions(count: 3) { host in
            await host.remove(moduleNamed: ["a"])
            host.add([probe("c", order: 2, recorder: Recorder())])
        }
        #expect(seen == ["a,b", "b", "b,c"])
    }

    // The host-side sequence ends when its task is cancelled, even while waiting for a value.
    @Test(.timeLimit(.minutes(1)))
    func valuesOnHostEndsWhenTheTaskIsCancelled() async {
        let host = makeHost()
        await host.add([probe("a", recorder: Recorder())])
        let count = await host.countProbeEmissionsUntilCancelled()
        #expect(count == 1)
    }

    // Emission happens once per update even when an observer starts another update.
    @Test func anUpdateStartedByAnObserverLeadsToOneMorePassNotANestedOne() async {
        let recorder = Recorder()
        let host = makeHost()
        await host.perform { host in
            var added = false
            host.moduleManager.observeModules { $0 as? Probe }.subscribe { probes in
                recorder.record("first:" + probes.map(\.moduleName).joined(separator: ","))
                if !added {
                    added = true
                    host.add([probe("late", order: 9, recorder: Recorder())])
                }
            }
            host.moduleManager.observeModules { $0 as? Probe }.subscribe { probes in
                recorder.record("second:" + probes.map(\.moduleName).joined(separator: ","))
            }
        }
        await host.add([probe("a", recorder: Recorder())])
        #expect(recorder.all == ["first:a", "second:a,late", "first:a,late"])
    }

    // Subscribing on another host's context is a programming error caught at run time (the
    // compiler already rejects any context that is not a HostInstance).
    @Test func subscribingOnAnotherHostStopsTheProcess() async {
        await #expect(processExitsWith: .failure) {
            let first = HostInstance(name: "first")
            let second = HostInstance(name: "second")
            let observable = first.observeModules { $0.moduleName }
            await second.perform { second in
                observable.subscribe(isolation: second) { _ in }
            }
        }
    }
}

extension HostInstance {
    /// Iterates `valuesOnHost()` of the probes until `count` values arrived, while `changes`
    /// runs in a task on this context.
    func collectProbeEmissions(
        count: Int, changes: @escaping @Sendable (isolated HostInstance) async -> Void
    ) async -> [String] {
        var seen: [String] = []
        let values = moduleManager.observeModules { $0 as? Probe }.valuesOnHost()
        Task { await changes(self) }
        for await probes in values {
            seen.append(probes.map(\.moduleName).joined(separator: ","))
            if seen.count == count { break }
        }
        return seen
    }

    /// Starts a task on this context iterating `valuesOnHost()`, cancels it once it has
    /// received the current value and is waiting for the next, and returns how many values
    /// it saw before the loop ended.
    func countProbeEmissionsUntilCancelled() async -> Int {
        let received = Recorder()
        let iteration = Task {
            var count = 0
            for await _ in self.moduleManager.observeModules({ $0 as? Probe }).valuesOnHost() {
                count += 1
                received.record("value")
            }
            return count
        }
        await received.wait { !$0.isEmpty }
        iteration.cancel()
        return await iteration.value
    }
}

/// A module whose `moduleName` and `info.name` are given; a configuration with "rename"
/// returns a new instance whose names are that.
private final class Named: Module {
    let moduleName: String
    let infoName: String
    init(moduleName: String, infoName: String) {
        self.moduleName = moduleName
        self.infoName = infoName
    }
    var info: ModuleInfo { ModuleInfo(name: infoName, version: "1") }
    func updateConfiguration(_ configuration: JSONValue, host: isolated HostInstance) -> (any Module)? {
        guard let name = configuration["rename"]?.stringValue else { return self }
        return Named(moduleName: name, infoName: name)
    }
}

extension ModuleManagerTests {
    /// A typed lookup says why it gives no module, where a cast gives nil: not running, not
    /// of the type asked for, or in another process (a stand-in for a module of an isolated
    /// plugin, or a module a forwarding host locates elsewhere).
    @Test func aTypedLookupSaysWhyThereIsNoModule() async {
        let host = HostInstance(name: "worker", eventDeadline: .seconds(1), logger: Logger(label: "test"),
                                forwardingNotifications: nil, locatingModules: { $0 == "remote" ? "the daemon" : nil })
        await host.add([
            ModuleFactory(name: "greeter", version: "1") { _, _ in GreeterProbe(name: "greeter", greeting: "hi") },
            ModuleFactory(name: "special", version: "1") { _, _ in Special(name: "special") },
            ModuleFactory(name: "stand-in", version: "1") { _, _ in StandIn() },
        ])
        let outcomes = await host.perform { host in
            ["greeter", "special", "stand-in", "remote", "nowhere"].map { name -> String in
                do throws(ModuleLookupError) {
                    return try host.moduleManager.module(named: name, as: (any Greeter).self).greeting
                } catch {
                    return "\(error.reason.rawValue): \(error)"
                }
            }
        }
        #expect(outcomes == [
            "hi",
            "not of the type asked for: module \"special\" is not of type Greeter",
            "isolated in another process: module \"stand-in\" is isolated in another process (a worker): a Swift cast to Greeter cannot reach it; use events, notifications or calls by name",
            "isolated in another process: module \"remote\" is isolated in another process (the daemon): a Swift cast to Greeter cannot reach it; use events, notifications or calls by name",
            "not running: module \"nowhere\" is not running",
        ])
        let found = await host.perform { host in (try? host.module(named: "special", as: Special.self))?.moduleName }
        #expect(found == "special")
    }
}

/// Stands for a module of another process.
private final class StandIn: ModuleInAnotherProcess {
    var moduleName: String { "stand-in" }
    var info: ModuleInfo { ModuleInfo(name: moduleName, version: "1") }
    var location: String { "a worker" }
}
