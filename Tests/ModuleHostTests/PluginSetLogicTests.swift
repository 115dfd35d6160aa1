@testable import ModuleHost
import ModuleKit
import PluginFormat
import Testing
import TestSupport

/// A plugin set's own logic, run in this process on made-up plugin files
/// (`FakePluginSource`): load order, dependencies, replacement, refusals and removal,
/// asserted on what a user sees (the changes of a reconcile, the refusals with their
/// check, the snapshot, the modules in the host and the events they got). The file path
/// (validation, private images, dlopen) is PluginSetTests'.
@Suite(.timeLimit(.minutes(5)))
struct PluginSetLogicTests {
    let source = FakePluginSource()
    let state = TemporaryDirectory("plugin-set-logic")
    let set: PluginSet

    init() throws {
        set = PluginSet(host: HostInstance(name: "logic", eventDeadline: .seconds(5)), settings: [:],
                        directories: [FakePluginSource.directory], imagesDirectory: state.directory("images"),
                        crashGuard: try CrashGuard(directory: state.file("state")), validator: Validator(),
                        registry: ModuleRegistry(), workers: PluginWorkers(), trialLoader: nil,
                        logger: Logger(label: "plugin-set-logic"), stateLock: nil, pluginSource: source)
    }

    var host: HostInstance { self.set.host }
    func path(_ plugin: String) -> String { FakePluginSource.path("lib\(plugin).so") }

    /// The refusal the snapshot shows for the file at `path`.
    func refusal(_ path: String) async -> LoadFailure? {
        await set.snapshot().files.first { $0.path == path }?.failure
    }

    // MARK: - Order

    @Test func newPluginsLoadAfterWhatTheyNeedThenByOrderThenName() async {
        source.write("Base", order: 50)
        source.write("Middle", dependencies: ["Base"], order: 1)
        source.write("Top", dependencies: ["Middle"])
        source.write("First", order: 10)
        source.write("Alpha", order: 10)
        let changes = await set.reconcile()
        // Base has the highest order, but Middle and Top need it first.
        #expect(changes == PluginChanges(added: ["Alpha", "First", "Base", "Middle", "Top"]))
        #expect(source.log.ending(with: " init 1.0") == ["alpha init 1.0", "first init 1.0", "base init 1.0", "middle init 1.0", "top init 1.0"])
        await set.start()
        #expect(source.log.ending(with: " start 1.0").count == 5)
        await set.shutdown()
    }

    // MARK: - Dependencies

    @Test func aPluginWhoseDependencyIsMissingWaitsAndLoadsWhenItArrives() async {
        source.write("Needy", dependencies: ["Ghost"])
        source.write("OnNeedy", dependencies: ["Needy"])
        source.write("Alone")
        #expect(await set.reconcile() == PluginChanges(added: ["Alone"], refused: [path("Needy"), path("OnNeedy")]))
        #expect(await refusal(path("Needy"))?.check == .dependency)
        #expect(await refusal(path("Needy"))?.problem == "plugin Needy needs Ghost: dependency Ghost is not available")
        #expect(await refusal(path("OnNeedy"))?.problem == "plugin OnNeedy needs Needy, which was refused (dependency)")
        #expect(await set.filesNotLoaded() == [.waitingForDependency: [path("Needy"), path("OnNeedy")]])
        #expect(await host.moduleNames == ["alone"])

        source.write("Ghost")
        #expect(await set.reconcile() == PluginChanges(added: ["Ghost", "Needy", "OnNeedy"]))
        #expect(await set.filesNotLoaded().isEmpty)
        await set.shutdown()
    }

    @Test func aPluginWhoseDependencyIsRefusedWhenOpenedIsRefusedWithoutBeingOpened() async {
        source.write("Broken", refusedWhenOpened: .descriptor)
        source.write("OnBroken", dependencies: ["Broken"])
        #expect(await set.reconcile() == PluginChanges(refused: [path("Broken"), path("OnBroken")]))
        // The refusal of the image is the file's.
        #expect(await refusal(path("Broken")) == LoadFailure(file: path("Broken"), check: .descriptor,
                                                             problem: "made up to fail when opened", fix: "write it again"))
        let dependent = await refusal(path("OnBroken"))
        #expect(dependent?.check == .dependency)
        #expect(dependent?.problem == "plugin OnBroken needs Broken, which was refused (descriptor)")
        #expect(source.opened == ["Broken"])
        #expect(await host.moduleNames.isEmpty)
        await set.shutdown()
    }

    // MARK: - Replace

    @Test func aNewVersionReplacesThePluginWithItsStateAndReloadsItsDependents() async {
        source.write("Provider")
        source.write("Client", dependencies: ["Provider"])
        await set.reconcile()
        await set.start()
        source.write("Provider", version: "2.0")
        #expect(await set.reconcile() == PluginChanges(replaced: ["Provider"]))
        let plugins = await set.snapshot().plugins
        #expect(plugins.map(\.name) == ["Client", "Provider"])
        #expect(plugins.map(\.version) == ["1.0", "2.0"])
        #expect(plugins.map(\.generation) == [2, 2], "the dependent was loaded again against the new version")
        #expect(source.opened == ["Provider", "Client", "Provider", "Client"])
        // In one update: the old modules unload, the new ones init, restore the old state, start.
        let lines = source.log.all
        #expect(lines.filter { $0.hasPrefix("provider ") }.suffix(5) == [
            "provider willUnload 1.0", "provider init 2.0", "provider restore state of 1.0 2.0", "provider start 2.0",
            "provider deinit 1.0",
        ])
        #expect(await host.infos().map(\.version) == ["1.0", "2.0"], "client, then provider")
        await set.shutdown()
    }

    @Test func aReplacementRefusedWhenOpenedLeavesTheOldVersionRunning() async {
        source.write("Steady")
        await set.reconcile()
        await set.start()
        source.write("Steady", version: "2.0", refusedWhenOpened: .entrySymbol)
        #expect(await set.reconcile() == PluginChanges(refused: [path("Steady")]))
        let plugin = await set.snapshot().plugins.first
        #expect(plugin?.version == "1.0")
        #expect(plugin?.lastError?.check == .entrySymbol)
        #expect(await host.infos().map(\.version) == ["1.0"])
        #expect(!source.log.all.contains("steady willUnload 1.0"))
        // Not tried again until it changes; then it replaces the old version.
        #expect(await set.reconcile() == PluginChanges())
        source.write("Steady", version: "3.0")
        #expect(await set.reconcile() == PluginChanges(replaced: ["Steady"]))
        #expect(await host.infos().map(\.version) == ["3.0"])
        await set.shutdown()
    }

    // MARK: - Refusals

    @Test func aPluginNameInTwoFilesLoadsFromTheFirstAndTheOtherOnceItGoes() async {
        let first = source.write("Twin", file: "lib1-Twin.so")
        let second = source.write("Twin", version: "2.0", file: "lib2-Twin.so")
        #expect(await set.reconcile() == PluginChanges(added: ["Twin"], refused: [second]))
        #expect(await refusal(second) == LoadFailure(file: second, conflict: NameConflict(.pluginName(plugin: "Twin", heldBy: first))))
        #expect(source.opened == ["Twin"], "the second file is refused before it is opened")
        // Tried again at every scan: once the first file is gone, the second loads.
        source.remove(first)
        #expect(await set.reconcile() == PluginChanges(added: ["Twin"], removed: ["Twin"]))
        #expect(await set.snapshot().plugins.map(\.file) == [second])
        #expect(await host.infos().map(\.version) == ["2.0"])
        await set.shutdown()
    }

    @Test func aModuleNameClaimedTwiceRefusesTheLaterFileBeforeItIsOpened() async {
        source.write("Owner", modules: ["shared", "own"])
        source.write("Claimant", modules: ["shared"], file: "libZ-Claimant.so")
        let claimant = FakePluginSource.path("libZ-Claimant.so")
        #expect(await set.reconcile() == PluginChanges(added: ["Owner"], refused: [claimant]))
        let refused = await refusal(claimant)
        #expect(refused?.check == .duplicate)
        #expect(refused?.problem == "module shared is already provided by plugin Owner (\(path("Owner")))")
        #expect(source.opened == ["Owner"])
        #expect(await host.moduleNames.sorted() == ["own", "shared"])
        #expect(await set.filesNotLoaded() == [.refused: [claimant]])
        // Tried again at every scan: once the owner is gone, the claimant loads.
        source.remove(path("Owner"))
        #expect(await set.reconcile() == PluginChanges(added: ["Claimant"], removed: ["Owner"]))
        #expect(await host.moduleNames == ["shared"])
        await set.shutdown()
    }

    @Test func aRefusedFileIsNotReadAgainUntilItChanges() async {
        source.write("Faulty", refusedWhenRead: .manifest)
        #expect(await set.reconcile() == PluginChanges(refused: [path("Faulty")]))
        #expect(await set.reconcile() == PluginChanges())
        #expect(source.reads == [path("Faulty")])
        #expect(await set.snapshot().files.map(\.plugin) == ["Faulty"], "the row names the plugin its manifest gives")
        source.write("Faulty")
        #expect(await set.reconcile() == PluginChanges(added: ["Faulty"]))
        await set.shutdown()
    }

    // MARK: - Remove

    @Test func aRemovedPluginStopsItsDependentsFirstAndTheyReturnWithIt() async {
        source.write("Root")
        source.write("Branch", dependencies: ["Root"])
        source.write("Leaf", dependencies: ["Branch"])
        source.write("Apart")
        await set.reconcile()
        await set.start()
        source.remove(path("Root"))
        // The dependents go first, and wait for Root.
        #expect(await set.reconcile() == PluginChanges(removed: ["Leaf", "Branch", "Root"], refused: [path("Branch"), path("Leaf")]))
        #expect(source.log.ending(with: " deinit 1.0") == ["leaf deinit 1.0", "branch deinit 1.0", "root deinit 1.0"])
        #expect(await host.moduleNames == ["apart"])
        #expect(await set.filesNotLoaded() == [.waitingForDependency: [path("Branch"), path("Leaf")]])
        #expect(await set.snapshot().retiredGenerations == 3)

        source.write("Root")
        #expect(await set.reconcile() == PluginChanges(added: ["Root", "Branch", "Leaf"]))
        #expect(await host.moduleNames.sorted() == ["apart", "branch", "leaf", "root"])
        await set.shutdown()
    }
}
