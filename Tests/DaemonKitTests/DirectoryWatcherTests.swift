import DaemonKit
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Real inotify on real temporary directories.
@Suite(.timeLimit(.minutes(5)))
struct DirectoryWatcherTests {
    /// A watcher on fresh directories whose batches are collected in the background.
    final class Fixture: Sendable {
        let directories: [TemporaryDirectory]
        let watcher: DirectoryWatcher
        let batches = Collector<[DirectoryChange]>()
        let consumer: Task<Void, Never>

        init(count: Int = 1, configuration: DirectoryWatcher.Configuration = .init()) throws {
            directories = try (0..<count).map { _ in try TemporaryDirectory() }
            watcher = try DirectoryWatcher(directories: directories.map(\.path), configuration: configuration)
            let batches = self.batches
            let changes = watcher.changes
            consumer = Task {
                for await batch in changes { batches.append(batch) }
            }
        }

        var dir: TemporaryDirectory { directories[0] }
        var changes: [DirectoryChange] { batches.all.flatMap { $0 } }

        func waitFor(_ condition: @escaping @Sendable ([DirectoryChange]) -> Bool) async -> Bool {
            await batches.waitFor { condition($0.flatMap { $0 }) }
        }

        func finish() async {
            watcher.stop()
            await consumer.value
            for directory in directories { directory.remove() }
        }
    }

    @Test func aModeChangeOfAFileOrOfTheDirectoryIsReported() async throws {
        let fixture = try Fixture()
        let path = fixture.dir.file("plugin.so")
        try writeFile(path, "x")
        #expect(await fixture.waitFor { $0.contains(DirectoryChange(kind: .ready, path: path, directory: fixture.dir.path)) })
        #expect(chmod(path, 0o600) == 0)
        #expect(await fixture.waitFor { $0.contains(DirectoryChange(kind: .attributesChanged, path: path, directory: fixture.dir.path)) })
        #expect(chmod(fixture.dir.path, 0o700) == 0)
        #expect(await fixture.waitFor {
            $0.contains(DirectoryChange(kind: .attributesChanged, path: fixture.dir.path, directory: fixture.dir.path))
        })
        await fixture.finish()
    }

    @Test func copiedFileIsReadyOnlyAfterItIsClosed() async throws {
        let fixture = try Fixture()
        let path = fixture.dir.file("plugin.so")
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        #expect(fd >= 0)
        let half = [UInt8](repeating: 0x41, count: 4096)
        #expect(half.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } == 4096)
        // Several settle windows pass while the file is open and half written: no event
        // may be reported for it (IN_CREATE / IN_MODIFY are not trusted).
        try await Task.sleep(for: .milliseconds(400))
        #expect(fixture.changes.isEmpty)
        #expect(half.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } == 4096)
        close(fd)
        #expect(await fixture.waitFor { $0.contains(DirectoryChange(kind: .ready, path: path, directory: fixture.dir.path)) })
        #expect(fixture.changes.count == 1)
        await fixture.finish()
    }

    @Test func fileRenamedIntoTheDirectoryIsReadyAndItsTemporaryNameNeverShows() async throws {
        let fixture = try Fixture()
        let outside = try TemporaryDirectory()
        defer { outside.remove() }
        // Writer pattern 1: a hidden temporary in the same directory, then rename.
        try writeFile(fixture.dir.file(".plugin.so.tmp-123"), "new version")
        #expect(rename(fixture.dir.file(".plugin.so.tmp-123"), fixture.dir.file("a.so")) == 0)
        // Writer pattern 2: written elsewhere on the same filesystem, then moved in.
        try writeFile(outside.file("b.so"), "other")
        #expect(rename(outside.file("b.so"), fixture.dir.file("b.so")) == 0)

        #expect(await fixture.waitFor { changes in
            changes.contains { $0.path == fixture.dir.file("a.so") && $0.kind == .ready }
                && changes.contains { $0.path == fixture.dir.file("b.so") && $0.kind == .ready }
        })
        #expect(!fixture.changes.contains { $0.name.hasPrefix(".") })
        await fixture.finish()
    }

    @Test func temporaryAndHiddenNamesAreIgnored() async throws {
        let fixture = try Fixture()
        for name in [".hidden", "a.so.tmp", "b.so~", "c.so.part", ".d.swp"] {
            try writeFile(fixture.dir.file(name), "x")
        }
        #expect(unlink(fixture.dir.file("a.so.tmp")) == 0)
        #expect(mkdir(fixture.dir.file("subdir"), 0o755) == 0)
        // Events are processed in order, so once the sentinel is reported everything
        // before it has been seen (and must have been dropped).
        try writeFile(fixture.dir.file("sentinel.so"), "x")
        #expect(await fixture.waitFor { $0.contains { $0.name == "sentinel.so" } })
        #expect(fixture.changes.map(\.name) == ["sentinel.so"])

        #expect(DirectoryWatcher.isIgnoredName(".x"))
        #expect(DirectoryWatcher.isIgnoredName("x.tmp"))
        #expect(DirectoryWatcher.isIgnoredName("x~"))
        #expect(DirectoryWatcher.isIgnoredName("x.part"))
        #expect(!DirectoryWatcher.isIgnoredName("x.so"))
        #expect(!DirectoryWatcher.isIgnoredName("tmp.so"))
        await fixture.finish()
    }

    @Test func burstsAreCoalescedAndEachPathAppearsOncePerBatch() async throws {
        // A long settle window so the burst below lands in one batch even on a loaded machine.
        let fixture = try Fixture(configuration: .init(settle: .milliseconds(300), maximumDelay: .seconds(10)))
        let repeated = fixture.dir.file("same.so")
        for round in 0..<20 { try writeFile(repeated, "round \(round)") }
        for index in 0..<10 { try writeFile(fixture.dir.file("file\(index).so"), "x") }

        #expect(await fixture.waitFor { changes in
            Set(changes.map(\.path)).count == 11
        })
        for batch in fixture.batches.all {
            #expect(Set(batch.map(\.path)).count == batch.count, "a path appears twice in one batch")
        }
        // 30 close-after-write events arrived; coalescing must have merged the repeats.
        let reportsOfRepeated = fixture.changes.filter { $0.path == repeated }.count
        #expect(reportsOfRepeated >= 1 && reportsOfRepeated < 20)
        #expect(fixture.batches.all.count < 30)
        await fixture.finish()
    }

    /// A file renamed into a quiet directory is reported without waiting for the settle
    /// window (here longer than the test waits); a change right after it is a burst's, and
    /// waits for the window.
    @Test func theFirstChangeAfterAQuietTimeIsReportedAtOnce() async throws {
        let fixture = try Fixture(configuration: .init(settle: .seconds(60), maximumDelay: .seconds(120)))
        let staged = fixture.dir.file(".plugin.so.tmp")
        try writeFile(staged, "x")
        let path = fixture.dir.file("plugin.so")
        let started = ContinuousClock.now
        #expect(rename(staged, path) == 0)
        #expect(await fixture.waitFor { $0.contains(DirectoryChange(kind: .ready, path: path, directory: fixture.dir.path)) })
        #expect(ContinuousClock.now - started < .seconds(30))
        try writeFile(fixture.dir.file("second.so"), "x")
        try await Task.sleep(for: .milliseconds(200))
        #expect(!fixture.changes.contains { $0.name == "second.so" })
        await fixture.finish()
        #expect(fixture.changes.contains { $0.name == "second.so" }, "the burst's batch is emitted when the watcher stops")
    }

    @Test func theLastEventForAPathWins() async throws {
        let fixture = try Fixture(configuration: .init(settle: .milliseconds(300), maximumDelay: .seconds(10)))
        let path = fixture.dir.file("short-lived.so")
        try writeFile(path, "x")
        #expect(unlink(path) == 0)
        try writeFile(fixture.dir.file("sentinel.so"), "x")
        #expect(await fixture.waitFor { $0.contains { $0.name == "sentinel.so" } })
        // Within a batch the ready was replaced by the removal; across batches (only on a
        // very slow machine) the last report must still be the removal.
        #expect(fixture.changes.last { $0.path == path }?.kind == .removed)
        for batch in fixture.batches.all {
            #expect(batch.filter { $0.path == path }.count <= 1)
        }
        await fixture.finish()
    }

    @Test func deletionsAndRenamesAwayAreRemovals() async throws {
        let fixture = try Fixture()
        let outside = try TemporaryDirectory()
        defer { outside.remove() }
        try writeFile(fixture.dir.file("gone.so"), "x")
        try writeFile(fixture.dir.file("moved.so"), "x")
        try writeFile(fixture.dir.file("hidden.so"), "x")
        #expect(await fixture.waitFor { Set($0.map(\.name)) == ["gone.so", "moved.so", "hidden.so"] })

        #expect(unlink(fixture.dir.file("gone.so")) == 0)
        #expect(rename(fixture.dir.file("moved.so"), outside.file("moved.so")) == 0)
        // Renamed to an ignored name: the plugin is gone under its old name.
        #expect(rename(fixture.dir.file("hidden.so"), fixture.dir.file(".hidden.so")) == 0)
        #expect(await fixture.waitFor { changes in
            ["gone.so", "moved.so", "hidden.so"].allSatisfy { name in
                changes.contains { $0.name == name && $0.kind == .removed }
            }
        })
        #expect(!fixture.changes.contains { $0.name == ".hidden.so" })
        await fixture.finish()
    }

    @Test func severalDirectoriesReportTheirOwnPaths() async throws {
        let fixture = try Fixture(count: 2)
        let (first, second) = (fixture.directories[0], fixture.directories[1])
        #expect(fixture.watcher.directories == [first.path, second.path].sorted())
        try writeFile(first.file("one.so"), "1")
        try writeFile(second.file("two.so"), "2")
        #expect(await fixture.waitFor { changes in
            changes.contains(DirectoryChange(kind: .ready, path: first.file("one.so"), directory: first.path))
                && changes.contains(DirectoryChange(kind: .ready, path: second.file("two.so"), directory: second.path))
        })
        await fixture.finish()
    }

    @Test func aRemovedWatchedDirectoryIsReported() async throws {
        let fixture = try Fixture(count: 2)
        let (doomed, kept) = (fixture.directories[0], fixture.directories[1])
        try writeFile(doomed.file("a.so"), "x")
        #expect(await fixture.waitFor { $0.contains { $0.name == "a.so" } })
        doomed.remove()
        #expect(await fixture.waitFor { changes in
            changes.contains(DirectoryChange(kind: .directoryRemoved, path: doomed.path, directory: doomed.path))
        })
        #expect(fixture.changes.contains { $0.path == doomed.file("a.so") && $0.kind == .removed })
        #expect(fixture.watcher.directories == [kept.path])
        // Exactly one report although inotify sends IN_DELETE_SELF and IN_IGNORED.
        try writeFile(kept.file("sentinel.so"), "x")
        #expect(await fixture.waitFor { $0.contains { $0.name == "sentinel.so" } })
        #expect(fixture.changes.filter { $0.kind == .directoryRemoved }.count == 1)
        await fixture.finish()
    }

    @Test func aWatchedDirectoryMovedAwayIsReportedAndNoLongerWatched() async throws {
        let fixture = try Fixture()
        let parent = try TemporaryDirectory()
        defer { parent.remove() }
        let original = fixture.dir.path
        #expect(rename(original, parent.file("moved")) == 0)
        #expect(await fixture.waitFor { $0.contains { $0.kind == .directoryRemoved && $0.path == original } })
        #expect(fixture.watcher.directories.isEmpty)
        try writeFile(parent.file("moved/late.so"), "x")
        try await Task.sleep(for: .milliseconds(300))
        #expect(!fixture.changes.contains { $0.name == "late.so" })
        await fixture.finish()
    }

    @Test func unwatchedDirectoriesAreSilentAndWatchingAddsThem() async throws {
        let fixture = try Fixture(count: 2)
        let (first, second) = (fixture.directories[0], fixture.directories[1])
        fixture.watcher.unwatch(first.path + "/")
        #expect(fixture.watcher.directories == [second.path])
        try writeFile(first.file("ignored.so"), "x")
        try writeFile(second.file("sentinel.so"), "x")
        #expect(await fixture.waitFor { $0.contains { $0.name == "sentinel.so" } })
        #expect(!fixture.changes.contains { $0.name == "ignored.so" })
        #expect(!fixture.changes.contains { $0.kind == .directoryRemoved })

        try fixture.watcher.watch(first.path)
        try writeFile(first.file("back.so"), "x")
        #expect(await fixture.waitFor { $0.contains { $0.path == first.file("back.so") } })
        await fixture.finish()
    }

    @Test func watchingAMissingDirectoryThrows() throws {
        let watcher = try DirectoryWatcher()
        defer { watcher.stop() }
        do {
            try watcher.watch("/nonexistent-dktest")
            Issue.record("watch should fail")
        } catch {
            #expect(error.syscall == "inotify_add_watch")
            #expect(error.code == ENOENT)
            #expect(error.subject == "/nonexistent-dktest")
        }
        #expect(throws: SystemError.self) {
            _ = try DirectoryWatcher(directories: ["/tmp", "/nonexistent-dktest"])
        }
    }

    @Test func aFollowedDirectoryIsWatchedOnceCreatedAndAgainWhenRecreated() async throws {
        let parent = try TemporaryDirectory()
        defer { parent.remove() }
        let watcher = try DirectoryWatcher()
        let batches = Collector<[DirectoryChange]>()
        let changes = watcher.changes
        let consumer = Task { for await batch in changes { batches.append(batch) } }
        func seen(_ change: DirectoryChange) async -> Bool { await batches.waitFor { $0.flatMap { $0 }.contains(change) } }

        // Missing, two levels deep: followed without an error, watched once created.
        let directory = parent.file("a/b")
        try watcher.follow(directory)
        #expect(watcher.directories.isEmpty)
        #expect(mkdir(parent.file("a"), 0o755) == 0)
        #expect(mkdir(directory, 0o755) == 0)
        #expect(await seen(DirectoryChange(kind: .directoryAppeared, path: directory, directory: directory)))
        #expect(watcher.directories == [directory])
        try writeFile(directory + "/one.so", "x")
        #expect(await seen(DirectoryChange(kind: .ready, path: directory + "/one.so", directory: directory)))

        // rm -rf; mkdir at once: reported gone, then back (a second appearance: files put
        // there before it are not reported), and followed again.
        try FileManager.default.removeItem(atPath: directory)
        #expect(mkdir(directory, 0o755) == 0)
        #expect(await seen(DirectoryChange(kind: .directoryRemoved, path: directory, directory: directory)))
        let appeared = DirectoryChange(kind: .directoryAppeared, path: directory, directory: directory)
        #expect(await batches.waitFor { $0.flatMap { $0 }.count { $0 == appeared } == 2 })
        try writeFile(directory + "/two.so", "x")
        #expect(await seen(DirectoryChange(kind: .ready, path: directory + "/two.so", directory: directory)))

        // A symlink is complete when created: reported at once.
        #expect(symlink("/nowhere/x.so", directory + "/link.so") == 0)
        #expect(await seen(DirectoryChange(kind: .ready, path: directory + "/link.so", directory: directory)))

        // Unwatched: no longer followed.
        watcher.unwatch(directory)
        try FileManager.default.removeItem(atPath: directory)
        #expect(mkdir(directory, 0o755) == 0)
        try writeFile(directory + "/three.so", "x")
        try await Task.sleep(for: .milliseconds(300))
        #expect(!batches.all.flatMap { $0 }.contains { $0.name == "three.so" })
        watcher.stop()
        await consumer.value
    }

    /// Outside attack: a followed directory that appeared as a symlink (to a directory made
    /// before) was not noticed until something else changed in its parent. A symlink that
    /// appears where a followed directory waits arms it, as a directory made there does.
    @Test func aFollowedDirectoryThatAppearsAsASymlinkIsWatched() async throws {
        let f = try Fixture()
        // Made outside the watched directory: the only event there is the link's.
        let outside = try TemporaryDirectory()
        defer { outside.remove() }
        let real = outside.file("real")
        #expect(mkdir(real, 0o755) == 0)
        let directory = f.dir.file("plugins")
        try f.watcher.follow(directory)
        #expect(symlink(real, directory) == 0)
        #expect(await f.waitFor { $0.contains(DirectoryChange(kind: .directoryAppeared, path: directory, directory: directory)) })
        try writeFile(real + "/one.so", "x")
        #expect(await f.waitFor { $0.contains(DirectoryChange(kind: .ready, path: directory + "/one.so", directory: directory)) })
        await f.finish()
    }

    /// Outside run: a followed directory that is a symlink stayed watched after the link
    /// was removed (the watch is on the link's target, which did not change), so its files
    /// were never reported gone. The link's removal reports the directory removed, and a
    /// link made again (here to another directory) reports it back, watched there.
    @Test func aFollowedSymlinkThatIsRemovedOrRetargetedIsReported() async throws {
        let f = try Fixture()
        let outside = try TemporaryDirectory()
        defer { outside.remove() }
        let first = outside.file("first")
        let second = outside.file("second")
        #expect(mkdir(first, 0o755) == 0)
        #expect(mkdir(second, 0o755) == 0)
        let directory = f.dir.file("plugins")
        #expect(symlink(first, directory) == 0)
        try f.watcher.follow(directory)
        #expect(f.watcher.directories.contains(directory))
        #expect(unlink(directory) == 0)
        #expect(await f.waitFor { $0.contains(DirectoryChange(kind: .directoryRemoved, path: directory, directory: directory)) })
        #expect(!f.watcher.directories.contains(directory))
        // Retargeted as `ln -sfn` does: a new link renamed over the old one.
        #expect(symlink(first, directory) == 0)
        #expect(await f.waitFor { $0.contains(DirectoryChange(kind: .directoryAppeared, path: directory, directory: directory)) })
        #expect(symlink(second, f.dir.file(".plugins.new")) == 0)
        #expect(rename(f.dir.file(".plugins.new"), directory) == 0)
        let appeared = DirectoryChange(kind: .directoryAppeared, path: directory, directory: directory)
        #expect(await f.batches.waitFor { $0.flatMap { $0 }.count { $0 == appeared } == 2 })
        try writeFile(second + "/two.so", "x")
        #expect(await f.waitFor { $0.contains(DirectoryChange(kind: .ready, path: directory + "/two.so", directory: directory)) })
        // The old target is no longer watched under the followed name.
        try writeFile(first + "/one.so", "x")
        try writeFile(second + "/three.so", "x")
        #expect(await f.waitFor { $0.contains { $0.name == "three.so" } })
        #expect(!f.changes.contains { $0.name == "one.so" })
        await f.finish()
    }

    @Test func stopFinishesTheStream() async throws {
        let fixture = try Fixture()
        fixture.watcher.stop()
        fixture.watcher.stop()
        await fixture.consumer.value  // returns only if the stream finished
        #expect(throws: SystemError.self) { try fixture.watcher.watch(fixture.dir.path) }
        fixture.dir.remove()
    }
}
