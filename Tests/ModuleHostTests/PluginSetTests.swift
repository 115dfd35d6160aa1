import Foundation
import Glibc
import ModuleHost
import ModuleKit
import PluginFormat
import Synchronization
import Testing
import TestSupport

// A PluginSet driven in this test process, without a daemon: every reconcile path on real
// C plugin files. C only: a C image holds no Swift runtime state, so loading many of them
// into one process is safe (this process's ModuleKit is not the built SDK, and Swift
// images are never unloaded). Every test uses plugin names of its own: the process binds
// a dependency by SONAME, so two tests' plugins must never share one.
@Suite(.timeLimit(.minutes(5)), .serialized)
struct PluginSetTests {
    /// A plugin directory, a state directory and a PluginSet over them; the C modules built
    /// here append one line per call (`MODULE EVENT tag=TAG provider=TAG`) to `events`.
    final class Fixture: Sendable {
        let root = TemporaryDirectory("plugin-set")
        let plugins: String
        let images: String
        let events: String
        let host: HostInstance
        let set: PluginSet
        private let builds = Atomic<Int>(0)

        /// `stateOf`: a fixture whose state directory (and images) this one uses too, and
        /// whose events file.
        init(trialLoader: (any TrialLoader)? = nil, stateOf other: Fixture? = nil) throws {
            plugins = root.directory("plugins")
            let state = other.map { $0.root.file("state") } ?? root.directory("state")
            images = other?.images ?? root.directory("state/images")
            chmod(state, 0o700)
            chmod(images, 0o700)
            events = other?.events ?? root.file("events.log")
            host = HostInstance(name: "test", eventDeadline: .seconds(5))
            set = PluginSet(host: host, directories: [plugins], imagesDirectory: images,
                            crashGuard: try CrashGuard(directory: state), trialLoader: trialLoader,
                            logger: Logger(label: "plugin-set-test"))
        }

        static func module(_ plugin: String) -> String { plugin.lowercased() }

        /// Builds C plugin `plugin` (one module, named after it in lower case) whose code
        /// says `tag`; with `provider`, it links against that plugin's last build and
        /// reports what the provider's code says. Returns the built file.
        @discardableResult
        func build(_ plugin: String, version: String = "1.0", tag: String, provider: String? = nil,
                   entryBody: String? = nil) throws -> String {
            let directory = root.directory("build-\(builds.add(1, ordering: .relaxed).newValue)")
            let module = Self.module(plugin)
            if let provider { try FileManager.default.copyItem(atPath: built(provider), toPath: directory + "/lib\(provider).so") }
            let source = """
                #define _GNU_SOURCE
                #include <modulehost.h>
                #include <fcntl.h>
                #include <stdio.h>
                #include <stdlib.h>
                #include <unistd.h>
                \(provider.map { "extern const char *\($0)_tag(void);\n#define PROVIDER \($0)_tag()" } ?? "#define PROVIDER \"-\"")
                __attribute__((visibility("default"))) const char *\(plugin)_tag(void) { return "\(tag)"; }
                static void note(const char *what) {
                    char line[256];
                    int n = snprintf(line, sizeof line, "\(module) %s tag=\(tag) provider=%s\\n", what, PROVIDER);
                    int fd = open("\(events)", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
                    if (fd >= 0) { if (write(fd, line, (size_t)n) < 0) {} close(fd); }
                }
                static void *create(const modhost_host_api *host, const char *config) { note("create"); return (void *)host; }
                static void handle(void *instance, const char *event, const char *payload) { note(event); }
                static void destroy(void *instance) { note("destroy"); }
                static const modhost_module modules[] = {{
                    .struct_size = sizeof(modhost_module), .kind = MODHOST_MODULE_C, .name = "\(module)",
                    .version = "\(version)", .create = create, .handle_event = handle, .destroy = destroy,
                }};
                static const modhost_plugin plugin = MODHOST_PLUGIN_INIT("\(plugin)", modules);
                MODHOST_PLUGIN_ENTRY { \(entryBody ?? "return &plugin;") }
                """
            let manifest = PluginFactory.manifest(plugin: plugin, modules: [module], dependencies: provider.map { [$0] } ?? [])
                .replacingOccurrences(of: "\"version\":\"1.0\"", with: "\"version\":\"\(version)\"")
            let file = try PluginFactory(directory: directory).buildC(
                plugin, source: source, manifest: manifest, flags: provider.map { "-l\($0)" } ?? "")
            lastBuild.withLock { $0[plugin] = file }
            return file
        }

        private let lastBuild = Mutex<[String: String]>([:])
        func built(_ plugin: String) -> String { lastBuild.withLock { $0[plugin]! } }

        /// Deploys `file` as a plugin file: copied under a temporary name, then renamed.
        func install(_ file: String, as plugin: String) throws {
            let temporary = plugins + "/.lib\(plugin).so.tmp"
            try? FileManager.default.removeItem(atPath: temporary)
            try FileManager.default.copyItem(atPath: file, toPath: temporary)
            chmod(temporary, 0o644)
            #expect(rename(temporary, path(of: plugin)) == 0)
        }

        func path(of plugin: String) -> String { plugins + "/lib\(plugin).so" }

        /// The lines the modules wrote so far.
        func lines() -> [String] {
            ((try? String(contentsOfFile: events, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        }

        /// Sends `event` to `module` and waits until the module has written it down; returns
        /// that line.
        func knock(_ module: String, _ event: String) async -> String? {
            await host.send(ModuleEvent.custom(name: event, payload: .null), to: module)
            for _ in 0..<200 {
                if let line = lines().last(where: { $0.hasPrefix("\(module) \(event) ") }) { return line }
                try? await Task.sleep(for: .milliseconds(25))
            }
            return nil
        }

        /// Waits until a module has written `line` (a C module's destroy runs after its
        /// deinit, on its worker).
        func waitFor(_ line: String) async -> Bool {
            for _ in 0..<200 {
                if lines().contains(line) { return true }
                try? await Task.sleep(for: .milliseconds(25))
            }
            return false
        }

        /// The files in the images directory, as paths, sorted.
        func imageFiles() -> [String] {
            ((try? FileManager.default.contentsOfDirectory(atPath: images)) ?? []).map { images + "/" + $0 }.sorted()
        }

        /// Whether the set keeps no private copy but those its plugins run from or ran from:
        /// the in-process plugins' images are memory files (none on disk), each opened here
        /// (a refused one is closed; a retired one stays mapped, as its code does), and
        /// the images directory holds the isolated plugins' current copies only.
        func keepsOnlyTheImagesItRuns() async -> Bool {
            let current = await currentImages()
            let memory = await set.memoryImagesHeld
            let onDisk = Set(imageFiles())
            return memory.held == memory.opened && current.allSatisfy { memory.held.contains($0) || onDisk.contains($0) }
                && onDisk.isSubset(of: current)
        }

        /// The private copies the loaded plugins run from, sorted.
        func currentImages() async -> [String] {
            var paths: [String] = []
            for plugin in await set.snapshot().plugins {
                if let loaded = await set.plugin(named: plugin.name) { paths.append(loaded.file.resolvedPath) }
            }
            return paths.sorted()
        }

        func plugin(_ name: String) async -> PluginSetSnapshot.Plugin? {
            await set.snapshot().plugins.first { $0.name == name }
        }
    }

    @Test func aNewFileIsLoadedAndItsModulesStartWithTheSet() async throws {
        let f = try Fixture()
        #expect(await f.set.reconcile(trial: false) == PluginChanges())
        try f.install(try f.build("PsAddA", tag: "a1"), as: "PsAddA")
        #expect(await f.set.reconcile(trial: false) == PluginChanges(added: ["PsAddA"]))
        #expect(f.lines() == ["psadda create tag=a1 provider=-", "psadda init tag=a1 provider=-"])
        await f.set.start()
        #expect(f.lines().last == "psadda start tag=a1 provider=-")

        // Added after start: initialized and started at once.
        try f.install(try f.build("PsAddB", tag: "b1"), as: "PsAddB")
        #expect(await f.set.reconcile() == PluginChanges(added: ["PsAddB"]))
        #expect(f.lines().suffix(3) == ["psaddb create tag=b1 provider=-", "psaddb init tag=b1 provider=-", "psaddb start tag=b1 provider=-"])
        #expect(f.host.runningModuleNames.sorted() == ["psadda", "psaddb"])
        let snapshot = await f.set.snapshot()
        #expect(snapshot.plugins.map(\.name) == ["PsAddA", "PsAddB"])
        #expect(snapshot.plugins.map(\.file) == [f.path(of: "PsAddA"), f.path(of: "PsAddB")])
        #expect(snapshot.plugins.allSatisfy { $0.generation == 1 && $0.version == "1.0" && $0.lastError == nil })
        #expect(await f.set.plugin(named: "PsAddA")?.modules.map(\.factory.name) == ["psadda"])
        #expect(await f.set.plugin(named: "PsAddC") == nil)
        // Nothing changed on disk: nothing happens.
        #expect(await f.set.reconcile() == PluginChanges())
        await f.set.shutdown()
        #expect(f.lines().contains("psadda deinit tag=a1 provider=-"))
        #expect(await f.waitFor("psadda destroy tag=a1 provider=-"))
    }

    /// Outside attack (embedder): a second set in the process, after the first was shut
    /// down, bound its dependent to the first set's image of the provider (the same name,
    /// which glibc had already loaded): the old code ran, with nothing refused or logged.
    @Test(arguments: [false, true])
    func aSecondSetInTheProcessBindsItsDependentsToItsOwnImages(sameStateDirectory: Bool) async throws {
        let first = try Fixture()
        try first.install(try first.build("PsTwiceP", tag: "first"), as: "PsTwiceP")
        try first.install(try first.build("PsTwiceD", tag: "d", provider: "PsTwiceP"), as: "PsTwiceD")
        #expect(await first.set.reconcile(trial: false) == PluginChanges(added: ["PsTwiceP", "PsTwiceD"]))
        await first.set.start()
        #expect(await first.knock("pstwiced", "knock") == "pstwiced knock tag=d provider=first")
        await first.set.shutdown()

        // On the same state directory, the copy of the unchanged dependent was written at
        // the path of the first set's (review): glibc returned that image, bound to the old provider.
        // (There the same dependent file is deployed again: its copy's name was the same.)
        let second = try Fixture(stateOf: sameStateDirectory ? first : nil)
        try second.install(try second.build("PsTwiceP", tag: "second"), as: "PsTwiceP")
        try second.install(sameStateDirectory ? first.built("PsTwiceD") : try second.build("PsTwiceD", tag: "d", provider: "PsTwiceP"),
                           as: "PsTwiceD")
        #expect(await second.set.reconcile(trial: false) == PluginChanges(added: ["PsTwiceP", "PsTwiceD"]))
        await second.set.start()
        #expect(await second.knock("pstwicep", "again") == "pstwicep again tag=second provider=-")
        #expect(await second.knock("pstwiced", "again") == "pstwiced again tag=d provider=second")
        await second.set.shutdown()
    }

    /// Outside attack (both helpers): a file refused because another file held its plugin's
    /// name stayed refused once that other file was removed, as its message's fix says to
    /// do, until it changed or a `reload`: the plugin ran nowhere.
    @Test func aFileRefusedForADuplicateNameLoadsOnceTheOtherFileIsRemoved() async throws {
        let f = try Fixture()
        try f.install(try f.build("PsDup", tag: "one"), as: "PsDup")
        try f.install(try f.build("PsDup", tag: "two"), as: "PsDupZ")
        #expect(await f.set.reconcile(trial: false) == PluginChanges(added: ["PsDup"], refused: [f.path(of: "PsDupZ")]))
        await f.set.start()
        #expect(await f.knock("psdup", "knock1") == "psdup knock1 tag=one provider=-")
        #expect(unlink(f.path(of: "PsDup")) == 0)
        let changes = await f.set.reconcile()
        #expect(changes.removed == ["PsDup"] && changes.added == ["PsDup"] && changes.refused.isEmpty, "\(changes)")
        #expect(await f.knock("psdup", "knock2") == "psdup knock2 tag=two provider=-")
        #expect(await f.plugin("PsDup")?.file == f.path(of: "PsDupZ"))
        await f.set.shutdown()
    }

    /// Outside attack (embedder): the same directory given as `d` and `d/.` loaded each
    /// plugin once and refused its own file as a duplicate of itself.
    @Test func aDirectoryGivenUnderTwoSpellingsIsReadOnce() async throws {
        let f = try Fixture()
        try f.install(try f.build("PsSpelt", tag: "one"), as: "PsSpelt")
        let link = f.root.file("link")
        #expect(symlink(f.plugins, link) == 0)
        await f.set.setDirectories([f.plugins, f.plugins + "/.", f.plugins + "/", link])
        #expect(await f.set.reconcile(trial: false) == PluginChanges(added: ["PsSpelt"]))
        #expect(await f.set.snapshot().files.isEmpty)
        #expect(await f.plugin("PsSpelt")?.file == f.path(of: "PsSpelt"))
        await f.set.shutdown()
    }

    @Test func aReplacedPluginRunsTheNewCodeAndItsDependentBindsToIt() async throws {
        let f = try Fixture()
        try f.install(try f.build("PsRepP", tag: "p1"), as: "PsRepP")
        try f.install(try f.build("PsRepD", tag: "d1", provider: "PsRepP"), as: "PsRepD")
        #expect(await f.set.reconcile(trial: false) == PluginChanges(added: ["PsRepP", "PsRepD"]))
        await f.set.start()
        #expect(await f.knock("psrepd", "knock1") == "psrepd knock1 tag=d1 provider=p1")

        for generation in 2...4 {
            try f.install(try f.build("PsRepP", version: "\(generation).0", tag: "p\(generation)"), as: "PsRepP")
            #expect(await f.set.reconcile() == PluginChanges(replaced: ["PsRepP"]))
            let provider = await f.plugin("PsRepP")
            #expect(provider?.version == "\(generation).0")
            #expect(provider?.generation == generation)
            #expect(f.host.registeredModulesSnapshot.first { $0.name == "psrepp" }?.version == "\(generation).0")
            // The dependent was loaded again (same code, same version) against the new image.
            let dependent = await f.plugin("PsRepD")
            #expect(dependent?.generation == generation)
            #expect(dependent?.version == "1.0")
            #expect(await f.knock("psrepp", "knock-p\(generation)") == "psrepp knock-p\(generation) tag=p\(generation) provider=-")
            #expect(await f.knock("psrepd", "knock-d\(generation)") == "psrepd knock-d\(generation) tag=d1 provider=p\(generation)")
            // Each runs from an image of its own, in memory: nothing on disk.
            #expect(Set(await f.currentImages()).count == 2)
            #expect(f.imageFiles().isEmpty)
            #expect(await f.keepsOnlyTheImagesItRuns())
        }
        #expect(await f.set.snapshot().retiredGenerations == 6)
        await f.set.shutdown()
    }

    @Test func aRemovedPluginStopsItsDependentsFirstAndTheyReturnWithIt() async throws {
        let f = try Fixture()
        try f.install(try f.build("PsRemP", tag: "p1"), as: "PsRemP")
        try f.install(try f.build("PsRemD", tag: "d1", provider: "PsRemP"), as: "PsRemD")
        #expect(await f.set.reconcile(trial: false) == PluginChanges(added: ["PsRemP", "PsRemD"]))
        await f.set.start()

        unlink(f.path(of: "PsRemP"))
        // Its dependent is stopped first, and waits for the provider while it is missing.
        #expect(await f.set.reconcile() == PluginChanges(removed: ["PsRemD", "PsRemP"], refused: [f.path(of: "PsRemD")]))
        let lines = f.lines()
        let dependentGone = try #require(lines.firstIndex(of: "psremd deinit tag=d1 provider=p1"))
        let providerUnloading = try #require(lines.firstIndex(of: "psremp willUnload tag=p1 provider=-"))
        #expect(dependentGone < providerUnloading)
        #expect(f.host.runningModuleNames.isEmpty)
        #expect(f.imageFiles().isEmpty)
        let snapshot = await f.set.snapshot()
        #expect(snapshot.plugins.isEmpty)
        #expect(snapshot.retiredGenerations == 2)
        let waiting = try #require(snapshot.files.first)
        #expect(snapshot.files.count == 1)
        #expect(waiting.path == f.path(of: "PsRemD"))
        #expect(waiting.state == .waitingForDependency)
        #expect(waiting.failure.check == .dependency)
        #expect(waiting.failure.problem.contains("PsRemP"))

        // The provider comes back (a new build): both load again, the dependent against it.
        try f.install(try f.build("PsRemP", tag: "p2"), as: "PsRemP")
        #expect(await f.set.reconcile() == PluginChanges(added: ["PsRemP", "PsRemD"]))
        #expect(await f.knock("psremd", "knock") == "psremd knock tag=d1 provider=p2")
        #expect(await f.set.snapshot().files.isEmpty)
        #expect(await f.keepsOnlyTheImagesItRuns())
        #expect(Set(await f.currentImages()).count == 2)
        await f.set.shutdown()
    }

    @Test func aDependentRefusedForItsMissingProviderLoadsWhenTheProviderArrives() async throws {
        let f = try Fixture()
        let provider = try f.build("PsDepP", tag: "p1")
        try f.install(try f.build("PsDepD", tag: "d1", provider: "PsDepP"), as: "PsDepD")
        #expect(await f.set.reconcile(trial: false) == PluginChanges(refused: [f.path(of: "PsDepD")]))
        let refused = try #require(await f.set.snapshot().files.first)
        #expect(refused.state == .waitingForDependency)
        #expect(refused.plugin == "PsDepD")
        #expect(refused.failure.check == .dependency)
        #expect(refused.failure.problem.contains("PsDepP"))
        #expect(f.lines().isEmpty)  // none of its code ran
        await f.set.start()

        // Asked again at every scan while it waits.
        #expect(await f.set.reconcile() == PluginChanges(refused: [f.path(of: "PsDepD")]))
        try f.install(provider, as: "PsDepP")
        #expect(await f.set.reconcile() == PluginChanges(added: ["PsDepP", "PsDepD"]))
        #expect(await f.knock("psdepd", "knock") == "psdepd knock tag=d1 provider=p1")
        #expect(await f.set.snapshot().files.isEmpty)
        await f.set.shutdown()
    }

    @Test func aReplacementThatFailsToLoadLeavesTheOldVersionRunning() async throws {
        let f = try Fixture()
        try f.install(try f.build("PsBad", tag: "v1"), as: "PsBad")
        await f.set.reconcile(trial: false)
        await f.set.start()

        // Version 2's entry point refuses to describe the plugin.
        try f.install(try f.build("PsBad", version: "2.0", tag: "v2", entryBody: "return NULL;"), as: "PsBad")
        #expect(await f.set.reconcile() == PluginChanges(refused: [f.path(of: "PsBad")]))
        let running = await f.plugin("PsBad")
        #expect(running?.version == "1.0")
        #expect(running?.generation == 1)
        #expect(running?.lastError?.check == .descriptor)
        #expect(running?.lastError?.file == f.path(of: "PsBad"))
        #expect(await f.knock("psbad", "knock") == "psbad knock tag=v1 provider=-")
        // Not tried again until it changes; the refused version's copy is gone.
        #expect(await f.set.reconcile() == PluginChanges())
        #expect(await f.currentImages().count == 1)
        #expect(await f.keepsOnlyTheImagesItRuns())

        try f.install(try f.build("PsBad", version: "3.0", tag: "v3"), as: "PsBad")
        #expect(await f.set.reconcile() == PluginChanges(replaced: ["PsBad"]))
        #expect(await f.plugin("PsBad")?.version == "3.0")
        #expect(await f.plugin("PsBad")?.lastError == nil)
        #expect(await f.knock("psbad", "knock3") == "psbad knock3 tag=v3 provider=-")
        #expect(await f.currentImages().count == 1)
        #expect(await f.keepsOnlyTheImagesItRuns())
        await f.set.shutdown()
    }

    @Test func aFileThatNowHoldsAnotherPluginKeepsTheOldOneRunningUntilTheNewOneLoads() async throws {
        let f = try Fixture()
        let path = f.path(of: "PsRen")
        try f.install(try f.build("PsRenA", tag: "a1"), as: "PsRen")
        await f.set.reconcile(trial: false)
        await f.set.start()
        #expect(await f.plugin("PsRenA")?.file == path)

        // The manifest names another plugin now, whose entry point fails: the old plugin
        // keeps running, the file is refused with the new plugin's reason.
        try f.install(try f.build("PsRenB", tag: "b1", entryBody: "return NULL;"), as: "PsRen")
        #expect(await f.set.reconcile() == PluginChanges(refused: [path]))
        #expect(await f.plugin("PsRenA")?.version == "1.0")
        #expect(await f.plugin("PsRenA")?.lastError?.check == .descriptor)
        #expect(await f.plugin("PsRenB") == nil)
        #expect(await f.knock("psrena", "knock") == "psrena knock tag=a1 provider=-")
        #expect(await f.keepsOnlyTheImagesItRuns())

        // A working build of the other plugin takes the file over: the old one goes.
        try f.install(try f.build("PsRenB", tag: "b2"), as: "PsRen")
        #expect(await f.set.reconcile() == PluginChanges(added: ["PsRenB"], removed: ["PsRenA"]))
        #expect(await f.plugin("PsRenA") == nil)
        #expect(await f.plugin("PsRenB")?.file == path)
        #expect(await f.waitFor("psrena destroy tag=a1 provider=-"))
        #expect(await f.knock("psrenb", "knock") == "psrenb knock tag=b2 provider=-")
        #expect(await f.keepsOnlyTheImagesItRuns())
        await f.set.shutdown()
    }

    /// The name of the memory file at `path` (`/proc/PID/fd/N`), as `memfd_create` was given it.
    static func memoryImageName(_ path: String) -> String? {
        guard path.hasPrefix("/proc/\(getpid())/fd/"), let target = try? FileManager.default.destinationOfSymbolicLink(atPath: path),
              target.hasPrefix("/memfd:") else { return nil }
        return String(target.dropFirst("/memfd:".count))
    }

    /// A trial loader that refuses version 2.0 and records what it was asked.
    final class RecordingTrialLoader: TrialLoader {
        struct Trial: Sendable {
            var file: String
            var image: String
            var preloading: [String]
        }
        let trials = Mutex<[Trial]>([])

        func trialLoad(_ file: PluginFile, preloading: [String]) async throws(LoadFailure) {
            trials.withLock { $0.append(Trial(file: file.path, image: file.resolvedPath, preloading: preloading)) }
            if file.manifest.version == "2.0" {
                throw LoadFailure(file: file.path, check: .dlopen, problem: "the test's trial loader refuses 2.0", fix: "deploy 3.0")
            }
        }
    }

    @Test func theInjectedTrialLoaderSeesEveryNewImageAndItsRefusalKeepsTheOldVersion() async throws {
        let trial = RecordingTrialLoader()
        let f = try Fixture(trialLoader: trial)
        try f.install(try f.build("PsTryP", tag: "p1"), as: "PsTryP")
        await f.set.reconcile(trial: false)
        #expect(trial.trials.withLock { $0.isEmpty })  // the first scan loads without trials
        await f.set.start()

        try f.install(try f.build("PsTryD", tag: "d1", provider: "PsTryP"), as: "PsTryD")
        #expect(await f.set.reconcile() == PluginChanges(added: ["PsTryD"]))
        let dependentTrial = try #require(trial.trials.withLock { $0.last })
        #expect(dependentTrial.file == f.path(of: "PsTryD"))
        // The private copy is what is tried, with the provider's: memory files this process holds.
        #expect(Self.memoryImageName(dependentTrial.image)?.hasPrefix("PsTryD-1.") == true, "\(dependentTrial.image)")
        #expect(dependentTrial.preloading.count == 1)
        #expect(dependentTrial.preloading.first.flatMap(Self.memoryImageName)?.hasPrefix("PsTryP-1.") == true)

        try f.install(try f.build("PsTryP", version: "2.0", tag: "p2"), as: "PsTryP")
        #expect(await f.set.reconcile() == PluginChanges(refused: [f.path(of: "PsTryP")]))
        #expect(await f.plugin("PsTryP")?.version == "1.0")
        #expect(await f.plugin("PsTryP")?.lastError?.problem == "the test's trial loader refuses 2.0")
        #expect(await f.keepsOnlyTheImagesItRuns())  // the refused copy is gone
        #expect(await f.knock("pstryd", "knock") == "pstryd knock tag=d1 provider=p1")

        // A replacement tries the new provider, then its dependent with the new provider first.
        let before = trial.trials.withLock { $0.count }
        try f.install(try f.build("PsTryP", version: "3.0", tag: "p3"), as: "PsTryP")
        #expect(await f.set.reconcile() == PluginChanges(replaced: ["PsTryP"]))
        let trials = trial.trials.withLock { Array($0.dropFirst(before)) }
        #expect(trials.map(\.file) == [f.path(of: "PsTryP"), f.path(of: "PsTryD")])
        #expect(trials.last?.preloading.contains(trials[0].image) == true)
        #expect(await f.knock("pstryd", "knock3") == "pstryd knock3 tag=d1 provider=p3")
        await f.set.shutdown()
    }

    @Test func theDefaultTrialLoaderKeepsAPluginThatCrashesOnLoadOutOfThisProcess() async throws {
        let f = try Fixture(trialLoader: ProcessTrialLoader(executable: BuildProducts.directory + "/bin/modhost-trial"))
        await f.set.reconcile(trial: false)
        await f.set.start()
        try f.install(try f.build("PsCrash", tag: "c1", entryBody: "abort();"), as: "PsCrash")
        #expect(await f.set.reconcile() == PluginChanges(refused: [f.path(of: "PsCrash")]))
        let refused = try #require(await f.set.snapshot().files.first)
        #expect(refused.failure.check == .crashGuard)
        #expect(refused.failure.problem.contains("crashed a trial load in a child process"))
        #expect(f.imageFiles().isEmpty)
        #expect(await f.keepsOnlyTheImagesItRuns())
        await f.set.shutdown()
    }

    @Test func withoutItsTrialLoaderANewPluginIsRefusedWithTheWayToGiveItOne() async throws {
        let missing = "/nonexistent/modhost-trial"
        let f = try Fixture(trialLoader: ProcessTrialLoader(executable: missing))
        await f.set.reconcile(trial: false)
        await f.set.start()
        try f.install(try f.build("PsNoTrial", tag: "n1"), as: "PsNoTrial")
        #expect(await f.set.reconcile() == PluginChanges(refused: [f.path(of: "PsNoTrial")]))
        let refused = try #require(await f.set.snapshot().files.first)
        #expect(refused.failure.problem.hasPrefix("cannot start the trial loader \(missing)"))
        #expect(refused.failure.fix.contains("ProcessTrialLoader(executable:)"))
        #expect(f.lines().isEmpty)
        await f.set.shutdown()
    }

    // MARK: - A set on a state directory (init(stateDirectory:)), as an embedder makes one

    @Test func aSetOnAStateDirectoryMakesItPrivateAndHoldsItAgainstOthers() async throws {
        let root = TemporaryDirectory("plugin-set-state")
        let state = root.file("state/of/my-service")
        let host = HostInstance(name: "state-test")
        let set = try PluginSet(host: host, directories: [root.directory("plugins")], stateDirectory: state, trialLoader: nil)
        for directory in [state, state + "/images"] {
            var info = stat()
            #expect(lstat(directory, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR && info.st_mode & 0o7777 == 0o700, "\(directory)")
        }
        // A second set (or a modhostd) on the same state directory is refused while this one lives.
        #expect {
            _ = try PluginSet(host: HostInstance(name: "second"), directories: [], stateDirectory: state, trialLoader: nil)
        } throws: { error in
            let error = error as? PluginSetError
            // This process holds it: said so, not "another process (pid ...)".
            return error?.code == .alreadyRunning && error?.message.hasPrefix("another plugin set in this process") == true
                && error?.message.contains(state) == true && error?.message.contains("another process") == false
        }
        // Once it is shut down, the fix that message gives works (outside attack: the lock
        // lasted until the set was released).
        await set.shutdown()
        let next = try PluginSet(host: HostInstance(name: "next"), directories: [], stateDirectory: state, trialLoader: nil)
        await next.shutdown()

        // A directory others may write is refused, naming it and the fix; it is not changed.
        let open = root.directory("open")
        chmod(open, 0o777)
        #expect {
            _ = try PluginSet(host: HostInstance(name: "open"), directories: [], stateDirectory: open, trialLoader: nil)
        } throws: { error in
            let error = error as? PluginSetError
            return error?.code == .stateDirectory && error?.message.contains("the state directory \(open) is unsafe") == true
                && error?.message.contains("Fix:") == true && error?.message.hasSuffix("or use another state directory") == true
        }
        var info = stat()
        lstat(open, &info)
        #expect(info.st_mode & 0o7777 == 0o777)
        #expect(!FileManager.default.fileExists(atPath: open + "/images"))
    }

    @Test func aSetOnAStateDirectoryRefusesTheFileThatCrashedThePreviousRun() async throws {
        let f = try Fixture()
        try f.install(try f.build("PsCrashed", tag: "c1"), as: "PsCrashed")
        try f.install(try f.build("PsHealthy", tag: "h1"), as: "PsHealthy")
        let state = f.root.file("service-state")
        // The previous run died while it read PsCrashed's file: the crash guard's record of
        // what it was working on stays behind (a file is known by path and identity until it
        // is hashed: device, inode, size, modification time in nanoseconds).
        do {
            var info = stat()
            #expect(stat(f.path(of: "PsCrashed"), &info) == 0)
            let identity = "\(info.st_dev):\(info.st_ino):\(info.st_size):\(Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec))"
            let previous = try CrashGuard(directory: state)
            previous.begin(file: f.path(of: "PsCrashed"), plugin: "", hash: "", phase: "validation", identity: identity)
        }
        let set = try PluginSet(host: f.host, directories: [f.plugins], stateDirectory: state, trialLoader: nil)
        #expect(await set.reconcile(trial: false) == PluginChanges(added: ["PsHealthy"], refused: [f.path(of: "PsCrashed")]))
        let refused = try #require(await set.snapshot().files.first)
        #expect(refused.state == .quarantined)
        #expect(refused.failure.check == .crashGuard)
        #expect(refused.failure.problem.contains("crashed the host process during validation"))
        #expect(!f.lines().contains { $0.hasPrefix("pscrashed") })
        // A new build of it is tried again.
        try f.install(try f.build("PsCrashed", version: "2.0", tag: "c2"), as: "PsCrashed")
        #expect(await set.reconcile() == PluginChanges(added: ["PsCrashed"]))
        await set.shutdown()
    }

    @Test func modulesAreDisabledAndEnabledByName() async throws {
        let f = try Fixture()
        try f.install(try f.build("PsOnOff", tag: "o1"), as: "PsOnOff")
        await f.set.reconcile(trial: false)
        await f.set.start()
        #expect(f.host.isRunning(moduleNamed: "psonoff"))

        try await f.set.setEnabled(false, module: "psonoff")
        #expect(!f.host.isRunning(moduleNamed: "psonoff"))
        #expect(f.lines().contains("psonoff deinit tag=o1 provider=-"))
        #expect(await f.waitFor("psonoff destroy tag=o1 provider=-"))
        // A settings change keeps the override.
        await f.set.updateSettings(["psonoff": ModuleSettings(order: 3)])
        #expect(!f.host.isRunning(moduleNamed: "psonoff"))

        try await f.set.setEnabled(true, module: "psonoff")
        #expect(f.host.isRunning(moduleNamed: "psonoff"))
        #expect(f.lines().filter { $0.hasPrefix("psonoff create") }.count == 2)
        #expect(f.lines().suffix(2) == ["psonoff init tag=o1 provider=-", "psonoff start tag=o1 provider=-"])

        await #expect(throws: UnknownModule.self) { try await f.set.setEnabled(false, module: "no-such-module") }
        // A name from an embedder's caller is shown escaped: one line, no escape sequence.
        do {
            try await f.set.setEnabled(false, module: "evil\n\u{1B}[2Jname")
            Issue.record("an unknown name was accepted")
        } catch {
            #expect(error.description == #"no module named "evil\n\u001b[2Jname" is registered; known modules: psonoff"#, "\(error)")
        }
        #expect(f.host.isRunning(moduleNamed: "psonoff"))
        await f.set.shutdown()
    }

    /// Events sent to every module from many tasks at once, synchronous ones (handed to the
    /// C modules in one hand-over per run) among awaited ones (each on its module's worker),
    /// each reach every module once, and every module sees the synchronous ones in one order.
    @Test func eventsToEveryModuleFromManyTasksReachEachModuleOnceInOneOrder() async throws {
        let f = try Fixture()
        let plugins = ["PsFanA", "PsFanB", "PsFanC"]
        for plugin in plugins { try f.install(try f.build(plugin, tag: "t"), as: plugin) }
        #expect(await f.set.reconcile(trial: false) == PluginChanges(added: plugins))
        await f.set.start()
        await withTaskGroup(of: Void.self) { group in
            for task in 0..<4 {
                group.addTask {
                    for round in 0..<25 {
                        await f.host.send(ModuleEvent.custom(name: "s\(task)x\(round)", payload: .null))
                        if round % 5 == 0 { await f.host.send(AsyncModuleEvent.custom(name: "a\(task)x\(round)", payload: .null)) }
                    }
                }
            }
        }
        let lines = f.lines()
        var seen: [String: [String]] = [:]
        for line in lines {
            let words = line.split(separator: " ").map(String.init)
            // The events of this test only: "s" (sent) or "a" (awaited), task "x" round.
            guard words.count >= 2, words[1].hasPrefix("s") || words[1].hasPrefix("a"), words[1].contains("x") else { continue }
            seen[words[0], default: []].append(words[1])
        }
        let modules = plugins.map(Fixture.module)
        for module in modules {
            #expect(seen[module]?.filter { $0.hasPrefix("s") }.count == 100, "\(module)")
            #expect(Set(seen[module] ?? []).count == 120, "\(module)")
        }
        let orders = modules.map { seen[$0]?.filter { $0.hasPrefix("s") } ?? [] }
        #expect(orders.allSatisfy { $0 == orders[0] })
        await f.set.shutdown()
    }

    @Test func theFirstScanDeletesTheCopiesAnEarlierRunLeft() async throws {
        let f = try Fixture()
        let leftovers = ["PsOld-3-0123456789abcdef.so", "PsOld-4-0123456789abcdef.so.tmp", "PsOld-5.7-0123456789abcdef.so"]
        for name in leftovers { #expect(FileManager.default.createFile(atPath: f.images + "/" + name, contents: Data("old".utf8))) }
        // Not a name the set writes: left alone.
        #expect(FileManager.default.createFile(atPath: f.images + "/notes.txt", contents: Data()))
        try f.install(try f.build("PsOld", tag: "o1"), as: "PsOld")
        #expect(await f.set.reconcile(trial: false) == PluginChanges(added: ["PsOld"]))
        #expect(await f.currentImages().count == 1)
        #expect(f.imageFiles() == [f.images + "/notes.txt"])
        await f.set.shutdown()
    }

    @Test func afterStopChangesNothingIsLoaded() async throws {
        let f = try Fixture()
        try f.install(try f.build("PsStop", tag: "s1"), as: "PsStop")
        f.set.stopChanges()
        #expect(f.set.isStopping)
        #expect(await f.set.reconcile(trial: false) == PluginChanges())
        #expect(await f.set.snapshot().plugins.isEmpty)
        #expect(f.lines().isEmpty)
        await f.set.shutdown()
    }
}
