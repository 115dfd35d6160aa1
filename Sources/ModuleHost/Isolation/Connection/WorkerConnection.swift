import CDynamicLoader
import DaemonKit
import Dispatch
import Glibc
@_spi(ModuleHost) import ModuleKit
import PluginCall
import PluginFormat
import Synchronization

/// One worker process and its three sockets (docs/isolation.md): requests and their
/// replies; the worker poller reads its control socket and reaps it.
///
/// Ordered requests (`request`, synchronous) go over socket 4 one at a time, and the
/// thread that sent one reads its reply itself, up to the deadline: a round trip wakes no
/// thread in this process but the caller. Calls by name go over socket 5 and are answered
/// there, read by a caller while it can (`call`), else by the worker poller. The replies to
/// awaited events, log lines and notifications come on the control socket, read by the
/// worker poller (one thread for every worker). Every frame sent has a deadline; on 3 and
/// 5 no sender waits for room in the socket (`FrameOutbox`: the poller writes the rest).
final class WorkerConnection: Sendable {
    /// The worker process (its pid as the daemon sees it), which logs and `list` name.
    let pid: pid_t
    /// The process the daemon signals, waits for and reaps: its PID namespace's init, whose
    /// end ends every process in the namespace (the worker itself when it has none).
    private let supervised: pid_t
    /// Where the init writes how the worker ended (`modhost_worker_ending_status`); -1
    /// without an init.
    private let statusFD: Int32
    /// Socket 3: the load frame, awaited events and the answers to the worker's questions
    /// go out here; the worker poller reads what comes back.
    let control: FrameOutbox
    /// Socket 4: ordered requests; replies read by the thread that holds `orderedGate`.
    private let ordered: WorkerChannel
    /// Socket 5: calls by name and their replies (`call`).
    private let calls: FrameOutbox
    /// The calls waiting for their replies on socket 5, by request id, and the socket's
    /// reader: nil while a thread holds it to read (a caller for a moment, or the worker
    /// poller while calls wait and no caller reads; only the holder reads, and it hands
    /// every reply it reads to its caller); `closed` once the socket ended.
    private let callReplies = Mutex<CallReplies>(CallReplies())
    private struct CallReplies {
        var waiters: [Int: Waiter] = [:]
        /// Calls that did not return by their deadline and whose replies have not come:
        /// the worker runs calls one at a time, so no new call is made until they have
        /// (`plugin_busy`, as in process), and the socket is read on for their replies.
        var overrun: [Int: (function: String, since: ContinuousClock.Instant)] = [:]
        var reader: FrameReader?
        var closed = false
        /// The call the worker has now (sent and not answered: it runs calls one at a time,
        /// so the next is sent only once this one is answered), and the calls waiting for
        /// their turn, in order (`takeTurn`).
        var turn: (id: Int, function: String, since: ContinuousClock.Instant)?
        var queue: [(id: Int, function: String, continuation: CheckedContinuation<Turn, Never>)] = []
    }

    /// What a call waiting for its turn to be sent got.
    enum Turn {
        case granted
        /// Its deadline passed first: it is not sent, and never runs. `ahead` is the call
        /// the worker had then, and for how long.
        case notStarted(ahead: (function: String, running: Duration)?)
        /// The socket ended.
        case gone
    }
    /// How long a caller reads the calls socket itself, on its own thread, waiting for its
    /// reply, before it hands the reading to the worker poller and suspends: a quick call's
    /// round trip is a fraction of this, and no thread of Swift concurrency is held longer.
    static let callWatch = Duration.milliseconds(2)
    /// One ordered request at a time (a semaphore of 1, so that it can be waited for with
    /// a deadline).
    private let orderedGate = DispatchSemaphore(value: 1)
    /// Used only by the holder of `orderedGate`; nil once the socket is out of step (a
    /// request timed out or failed): every later request is `gone`.
    private let orderedReader: Mutex<FrameReader?>
    private let plugin: IsolatedPlugin
    /// Waiters for replies on the control socket, by request id; `closed` once its reader
    /// has stopped (a request made then is `gone` at once).
    private let pending = Mutex((waiters: [Int: Waiter](), closed: false))
    private let nextID = Atomic<Int>(1)
    private let life = Mutex(Life.running(doomed: nil))

    /// Where the worker process is in its life, as the daemon knows it. Only `reap` makes it
    /// `ended`, and nothing signals the pid from then on: it may be another process's.
    private enum Life {
        /// It runs; `doomed`: why the poller kills it if it has not ended by the time
        /// `killLater` gave (a socket of it no longer works, but it still runs).
        case running(doomed: String?)
        /// `stop` closed its sockets on purpose: it kills its own group, or the poller does
        /// a second later (saying `doomed`, if it was already).
        case stopping(doomed: String?)
        /// Sent SIGKILL because it misbehaved, for `reason`; `hung`: because it did not
        /// answer (or read) within its deadline.
        case killed(reason: String, hung: Bool)
        /// Reaped, after a kill for `reason` if there was one.
        case ended(reason: String?, hung: Bool)

        var hung: Bool {
            switch self {
            case .killed(_, let hung), .ended(_, let hung): hung
            case .running, .stopping: false
            }
        }
    }
    private let readiness = Waiter()
    /// Completed by `reap` with `{"ending": TEXT}` once the worker has been reaped.
    private let finished = Waiter()
    private let described = Mutex<[(name: String, version: String)]>([])

    /// The modules the worker's plugin provides, from its ready frame.
    var modules: [(name: String, version: String)] { described.withLock { $0 } }

    enum Outcome {
        /// The reply, as the strict parser read it (its members looked up by name, not
        /// hashed into a dictionary).
        case reply(WorkerMessage)
        case timedOut
        case gone
        /// The request is larger than a frame may be (`WorkerFrame.maximumSize`): it was not
        /// sent, and the worker is not to blame.
        case tooLarge
    }

    /// A request waiting for its reply, from an awaiting task: the first of the reply, the
    /// worker's end and the deadline completes it, once; the task is resumed exactly once.
    /// The reply arrives on the poller thread, which serves every worker and must never
    /// wait: it completes the waiter under a `Mutex` without suspending, which an actor
    /// would not let it do. A dispatch timer, not a task, keeps the deadline, so that a
    /// request costs no task and the timer goes with the reply.
    final class Waiter: Sendable {
        private struct State {
            var outcome: Outcome?
            var continuation: CheckedContinuation<Outcome, Never>?
            var extended = false
        }
        private let state = Mutex(State())

        /// The first outcome wins.
        func complete(_ outcome: Outcome) {
            let continuation: CheckedContinuation<Outcome, Never>?? = state.withLock { state in
                guard state.outcome == nil else { return .none }
                state.outcome = outcome
                defer { state.continuation = nil }
                return .some(state.continuation)
            }
            guard let continuation else { return }
            continuation?.resume(returning: outcome)
        }

        /// The outcome, if there is one yet.
        func peek() -> Outcome? { state.withLock { $0.outcome } }

        /// The outcome, or `.timedOut` once `deadline` (nil: none) has passed. The timer is
        /// a dispatch source, cancelled (and freed) as soon as the outcome is known: a
        /// `DispatchQueue.asyncAfter` would stay queued, with what it holds, until its time.
        ///
        /// `unread`, if given, is asked when `deadline` passes: true (the reply may be in the
        /// socket, not read yet by the thread that reads every worker's frames, which was
        /// busy, e.g. with another worker's large frame) gives the reply `grace` more, once.
        func wait(upTo deadline: Duration?, unread: (@Sendable () -> Bool)? = nil, grace: Duration = .zero) async -> Outcome {
            guard let deadline else { return await wait() }
            let timer = DispatchSource.makeTimerSource(queue: .global())
            timer.setEventHandler { [self] in  // holds the timer until it is cancelled (which frees this handler)
                if let unread, state.withLock({ state in defer { state.extended = true }; return !state.extended }), unread() {
                    timer.schedule(deadline: .now() + grace.dispatchInterval)
                    return
                }
                complete(.timedOut)
            }
            timer.schedule(deadline: .now() + deadline.dispatchInterval)
            timer.resume()
            let outcome = await wait()
            timer.cancel()
            return outcome
        }

        func wait() async -> Outcome {
            await withCheckedContinuation { continuation in
                let done: Outcome? = state.withLock { state in
                    if let outcome = state.outcome { return outcome }
                    state.continuation = continuation
                    return nil
                }
                if let done { continuation.resume(returning: done) }
            }
        }
    }

    private init(_ spawned: modhost_worker_spawned, fds: [Int32], plugin: IsolatedPlugin) {
        pid = spawned.worker
        supervised = spawned.supervised
        statusFD = spawned.status_fd
        control = FrameOutbox(WorkerChannel(fd: fds[0]))
        ordered = WorkerChannel(fd: fds[1])
        orderedReader = Mutex(FrameReader(fd: fds[1]))
        calls = FrameOutbox(WorkerChannel(fd: fds[2]))
        callReplies.withLock { $0.reader = FrameReader(fd: fds[2]) }
        self.plugin = plugin
    }

    /// The sockets the worker poller writes what had no room in (control, calls).
    var outboxes: [FrameOutbox] { [control, calls] }

    /// Socket 5, which the worker poller polls while it reads the replies there.
    var callsDescriptor: Int32 { calls.channel.fd }

    /// Whether the calls socket holds bytes not read yet.
    var callsHaveUnreadInput: Bool { calls.channel.hasUnreadInput }

    /// How long a frame the worker began may wait for its next byte before the worker is
    /// killed (`WorkerPoller`): the event deadline.
    var frameDeadline: Duration { plugin.deadline }

    /// Starts `executable` with one end of each of three new socketpairs as its descriptors
    /// 3, 4 and 5, in a PID namespace and a process group of its own, with a clean
    /// environment, and has the worker poller watch it.
    static func spawn(_ executable: String, plugin: IsolatedPlugin) throws(TrialProcess.SpawnError) -> WorkerConnection {
        var ours: [Int32] = []
        var theirs: [Int32] = []
        func closeAll() { for fd in ours + theirs { close(fd) } }
        for _ in 0..<3 {
            var ends: [Int32] = [-1, -1]
            guard modhost_worker_socketpair(&ends) == 0 else {
                let problem = SystemError.describe(errno)
                closeAll()
                throw TrialProcess.SpawnError(description: "socketpair: \(problem)")
            }
            ours.append(ends[0])
            theirs.append(ends[1])
        }
        let workerEnds = theirs
        let token = WorkerRecords.newToken()
        let result: (error: Int32, spawned: modhost_worker_spawned)
        do throws(SystemError) {
            result = try SpawnThread.run { spawnProcess(executable, sockets: workerEnds, token: token) }
        } catch {
            closeAll()
            throw TrialProcess.SpawnError(description: "\(error)")
        }
        for fd in theirs { close(fd) }
        let spawned = result.spawned
        guard result.error == 0 else {
            for fd in ours { close(fd) }
            throw TrialProcess.SpawnError(description: SystemError.describe(result.error))
        }
        if spawned.refusal != 0 { noteUncontained(plugin, refusal: spawned.refusal) }
        // Nothing else reaps it, so the pid is still its own.
        let pidfd = modhost_worker_pidfd_open(spawned.supervised)
        guard pidfd >= 0 else {
            let problem = SystemError.describe(errno)
            Glibc.kill(spawned.supervised, SIGKILL)
            Glibc.kill(-spawned.supervised, SIGKILL)
            var status: Int32 = 0
            while waitpid(spawned.supervised, &status, 0) < 0 && errno == EINTR {}
            for fd in ours + [spawned.status_fd] where fd >= 0 { close(fd) }
            throw TrialProcess.SpawnError(description: "pidfd_open: \(problem) (isolated plugins need Linux 5.3 or later)")
        }
        plugin.workerRecords.started(spawned.supervised, plugin: plugin.name, token: token)
        let connection = WorkerConnection(spawned, fds: ours, plugin: plugin)
        WorkerPoller.shared.watch(connection, pidfd: pidfd)
        return connection
    }

    /// Starts `executable` (`modhost_worker_spawn`) with `sockets` as its descriptors 3, 4
    /// and 5 (they are all above 9, so no dup2 overwrites another's source), standard input
    /// /dev/null, in a PID namespace (as its init, which forks the worker) and a process
    /// group of its own, with a clean environment: nothing of the daemon's reaches plugin
    /// code, and no Swift backtrace on a crash (it delays the end by a quarter of a second
    /// or more), but `token` (`WorkerRecords`). (errno or 0, what was started).
    private static func spawnProcess(_ executable: String, sockets: [Int32], token: String) -> (Int32, modhost_worker_spawned) {
        let environment = ["PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "SWIFT_BACKTRACE": "enable=no",
                           WorkerRecords.tokenVariable: token]
        let argv = [strdup(executable), nil]
        let initArgv = [strdup(executable), strdup(WorkerProcess.namespaceInitArgument), nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv + initArgv + envp { free(pointer) }
        }
        var spawned = modhost_worker_spawned()
        let error = modhost_worker_spawn(executable, argv, initArgv, envp, sockets, &spawned)
        return (error, spawned)
    }

    /// Whether a worker has been started without a PID namespace in this process's life.
    private static let saidUncontained = Atomic<Bool>(false)

    /// Warns, the first time, that `plugin`'s worker runs without a PID namespace because
    /// the kernel refused one with `refusal`.
    private static func noteUncontained(_ plugin: IsolatedPlugin, refusal: Int32) {
        guard !saidUncontained.exchange(true, ordering: .relaxed) else { return }
        let how = geteuid() == 0 ? "a PID namespace" : "a user and a PID namespace (the daemon does not run as root)"
        plugin.logger.warning("the kernel refused plugin \(plugin.name)'s worker \(how): \(SystemError.describe(refusal)); workers run without one, so a process an isolated plugin starts that leaves its worker's process group can outlive the worker; allow unprivileged user namespaces (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone, or the AppArmor restriction on them) or run modhostd as root")
    }

    /// The checks a worker makes itself, which its failed frame may name: those of
    /// `PluginLoader.open`, of loading the plugins it depends on, and its own setup.
    static let checksOfAWorker: Set<LoadFailure.Check> = [.dlopen, .entrySymbol, .descriptor, .abi, .sdkLinkage, .exports, .manifest,
                                                           .dependency, .isolation]

    /// The worker's ready frame (its modules), its failed frame, or its end.
    func ready(within deadline: Duration) async -> Result<Void, LoadFailure> {
        let outcome = await readiness.wait(upTo: deadline)
        func failure(_ problem: String, _ fix: String) -> LoadFailure {
            LoadFailure(file: plugin.file.path, check: .isolation, problem: problem, fix: fix)
        }
        switch outcome {
        case .reply(let message) where message.op == .ready:
            var modules: [(name: String, version: String)] = []
            if case .array(let list) = message["modules"] ?? .null {
                for entry in list { if let name = entry.text("name") { modules.append((name, entry.text("version") ?? "")) } }
            }
            // The worker's loader checked its descriptor against plugin.json; a frame that
            // says otherwise was written by the plugin's own code (e.g. a constructor, which
            // runs before the worker's ready), to claim another plugin's module names.
            let listed = plugin.file.manifest.modules
            guard modules.map(\.name) == listed else {
                kill(reason: "its ready frame did not list the modules plugin.json lists")
                return .failure(failure("its worker's ready frame did not list the modules plugin.json lists (\(listed.joined(separator: ", "))): the plugin's code wrote it on the worker's socket",
                                        "remove the plugin's code that writes to descriptors it did not open (3, 4 and 5 are the worker's)"))
            }
            described.withLock { $0 = modules }
            return .success(())
        case .reply(let message):
            // The plugin's code may have written this frame too: it may name only a check
            // the worker makes, never one of the daemon's (a crash guard's quarantine...).
            var check = message.text("check").flatMap(LoadFailure.Check.init(rawValue:)) ?? .isolation
            if !Self.checksOfAWorker.contains(check) { check = .isolation }
            // Its texts are bounded as the worker's log lines are.
            return .failure(LoadFailure(file: plugin.file.path, check: check,
                                        problem: "in its worker: \(LogLineRate.bounded(message.text("problem") ?? "it failed"))",
                                        fix: LogLineRate.bounded(message.text("fix") ?? "see the log")))
        case .timedOut:
            kill(reason: "it was not ready within \(deadline.secondsText)\(plugin.limitsHint)", afterItsDeadline: true)
            return .failure(failure("its worker was not ready within \(deadline.secondsText)\(plugin.limitsHint)",
                                    plugin.settings.limits.summary == nil ? "fix the plugin's load-time code"
                                        : "raise plugins.\(plugin.name).limits in modhostd's configuration, or fix the plugin's load-time code"))
        case .gone, .tooLarge:
            // The poller says how it ended, once it has reaped it.
            let ending = await finished.wait()
            var text = "ended"
            if case .reply(let message) = ending { text = message.text("ending") ?? text }
            return .failure(failure("its worker \(text) while loading it", "fix the plugin's load-time code; the daemon was not affected"))
        }
    }

    /// Sends an ordered request (socket 4) and blocks the calling thread up to `deadline`,
    /// all told, for its reply, which this thread reads itself. After a request that timed
    /// out or failed, the socket is out of step: every later one is `gone` (the caller kills
    /// the worker on `timedOut`; `reap` ends the socket when it ends).
    /// A request whose frame is too large is not sent (`tooLarge`).
    func request(_ request: DaemonRequest, deadline: Duration) -> Outcome {
        let until = ContinuousClock.now + deadline
        let id = nextID.add(1, ordering: .relaxed).oldValue
        guard let frame = request.frame(id: id) else { return .tooLarge }
        // A timeout already past tries the gate without reading the clock (it is nearly always
        // free: one thread at a time sends the plugin its events).
        guard orderedGate.wait(timeout: DispatchTime(uptimeNanoseconds: 1)) == .success
            || orderedGate.wait(timeout: .now() + deadline.dispatchInterval) == .success else { return .timedOut }
        defer { orderedGate.signal() }
        return orderedReader.withLock { reader -> Outcome in
            guard reader != nil else { return .gone }
            var outcome = Outcome.gone
            switch ordered.send(frame: frame, until: until) {
            case .sent:
                do throws(FrameReader.End) {
                    let reply = try reader!.next(until: until)
                    if reply.integer("id") == id { return .reply(reply) }
                    kill(reason: "it answered request \(id) with the reply to another")
                } catch .timedOut {
                    outcome = .timedOut
                } catch .invalid(let problem) {
                    kill(reason: "it wrote what is no frame on its socket of ordered requests (4): \(problem)")
                } catch {
                    // Its end is closed: a worker that is ending, or one that closed it and
                    // would never answer again.
                    killLater(reason: "its socket of ordered requests (4) was closed (\(error)) and it did not end")
                }
            case .timedOut: outcome = .timedOut
            case .gone: killLater(reason: "its socket of ordered requests (4) was closed and it did not end")
            }
            reader = nil
            return outcome
        }
    }

    /// Sends `message` as one frame on `outbox` (3 or 5), written whole no later than
    /// `deadline`, without waiting for room in the socket: what it has no room for now the
    /// worker poller writes, and a worker that has not read the frame by its deadline is
    /// killed for `overdue`. Suspends, holding no thread, until then.
    private func send(_ frame: [UInt8]?, on outbox: FrameOutbox, until deadline: ContinuousClock.Instant,
                      overdue: FrameOutbox.Overdue) async -> WorkerChannel.Sent {
        switch post(frame, on: outbox, until: deadline, overdue: overdue) {
        case .finished(let sent): return sent
        case .waiting(let done): return await done.wait()
        }
    }

    /// As `send`, without waiting for the outcome (from any thread, the poller's too).
    @discardableResult
    private func post(_ frame: [UInt8]?, on outbox: FrameOutbox, until deadline: ContinuousClock.Instant,
                      overdue: FrameOutbox.Overdue) -> FrameOutbox.Enqueued {
        let enqueued = outbox.enqueue(frame, until: deadline, overdue: overdue)
        if case .waiting = enqueued { WorkerPoller.shared.flush(self) }
        return enqueued
    }

    /// Sends the load frame on the control socket, written whole within `deadline` (else
    /// the worker is killed, as not reading it).
    func sendLoad(_ message: JSONValue, within deadline: Duration) async -> WorkerChannel.Sent {
        await send(WorkerFrame.encode(message), on: control, until: .now + deadline, overdue: .init("read its load frame", within: deadline))
    }

    /// Sends an awaited event `what` (the control socket) and awaits its reply, up to
    /// `deadline` all told: a worker that has not read it by then is killed (`timedOut`).
    func requestAsync(_ request: DaemonRequest, what: String, deadline: Duration) async -> Outcome {
        let until = ContinuousClock.now + deadline
        let id = nextID.add(1, ordering: .relaxed).oldValue
        guard let numbered = request.frame(id: id) else { return .tooLarge }
        let waiter = Waiter()
        guard pending.withLock({ pending -> Bool in
            guard !pending.closed else { return false }
            pending.waiters[id] = waiter
            return true
        }) else { return .gone }
        let sent = await send(numbered, on: control, until: until, overdue: .init("answer", what, within: deadline))
        guard sent == .sent else {
            _ = pending.withLock { $0.waiters.removeValue(forKey: id) }
            return sent == .timedOut ? .timedOut : .gone
        }
        // The worker poller reads the reply: a worker whose reply is in its socket when the
        // deadline passes is not blamed for the poller's lateness.
        let control = control.channel
        return await waiter.wait(upTo: max(until - .now, .zero), unread: { control.hasUnreadInput }, grace: deadline)
    }

    /// Sends call `function` with `arguments` (socket 5; a frame too large is `gone`), and waits for its reply, up to `deadline` if given:
    /// `timedOut` then (the function goes on in the worker; its late reply is dropped). Its
    /// frame must be written whole by `deadline`, or else by the event deadline: a worker
    /// that has not read it by then is killed (it no longer reads, or the stream is out of
    /// step), and the call is `timedOut`.
    ///
    /// The caller's thread reads the reply itself while no other thread reads the socket,
    /// for up to `callWatch`: a quick call then wakes no thread in this process but the
    /// caller's, as a bare socket round trip does. Replies it reads for other calls go to
    /// their callers; once it stops reading with calls still waiting, the worker poller
    /// reads on for them.
    ///
    /// A call is sent only once the call before it has been answered (the worker runs them
    /// one at a time): one whose turn has not come by its deadline is `notStarted`, never
    /// sent, and never runs; one that overran keeps the turn until its reply comes.
    func call(function: String, arguments: DaemonRequest.CallArguments, deadline: Duration?) async -> CallOutcome {
        let start = ContinuousClock.now
        let id = nextID.add(1, ordering: .relaxed).oldValue
        let until = deadline.map { start + $0 }
        switch await takeTurn(id, function, until: until) {
        case .granted: break
        case .notStarted(let ahead): return .notStarted(ahead: ahead)
        case .gone: return .outcome(.gone)
        }
        guard let numbered = DaemonRequest.call(function: function, arguments: arguments).frame(id: id) else {
            passTurn(id)
            return .outcome(.tooLarge)
        }
        let waiter = Waiter()
        guard callReplies.withLock({ replies -> Bool in
            guard !replies.closed else { return false }
            replies.waiters[id] = waiter
            return true
        }) else { return .outcome(.gone) }
        // Counted from its turn: the worker had another call to answer before.
        let sendLimit = deadline ?? plugin.deadline
        switch await send(numbered, on: calls, until: .now + sendLimit, overdue: .init("read call", function, within: sendLimit)) {
        case .sent:
            break
        case .timedOut:
            forgetCall(id)
            passTurn(id)
            return .outcome(.timedOut)
        case .gone:
            forgetCall(id)
            passTurn(id)
            return .outcome(.gone)
        }
        let watchUntil = ContinuousClock.now + Self.callWatch
        if let own = readOwnReply(id, waiter, until: until.map { min($0, watchUntil) } ?? watchUntil) {
            if case .reply = own { passTurn(id) }
            return .outcome(own)
        }
        let outcome = await waiter.wait(upTo: until.map { max($0 - .now, .zero) })
        if case .timedOut = outcome { forgetCall(id, overran: (function, start)) }
        return .outcome(outcome)
    }

    /// What became of a call: its outcome, or not started (its turn did not come by its
    /// deadline, with the call the worker had then).
    enum CallOutcome {
        case outcome(Outcome)
        case notStarted(ahead: (function: String, running: Duration)?)
    }

    /// Waits, holding no thread, until call `id` may be sent (the worker has no other call
    /// to answer), or until `until` passes (nil: as long as it takes).
    private func takeTurn(_ id: Int, _ function: String, until: ContinuousClock.Instant?) async -> Turn {
        /// `.granted` if no call has the turn (taking it), `.gone` once the socket ended.
        func takeIfFree(_ replies: inout CallReplies) -> Turn? {
            if replies.closed { return .gone }
            guard replies.turn == nil else { return nil }
            replies.turn = (id, function, .now)
            return .granted
        }
        // Nearly always free: taken without suspending (a continuation would cost a hop to
        // another thread on every call).
        if let free = callReplies.withLock({ takeIfFree(&$0) }) { return free }
        return await withCheckedContinuation { continuation in
            let now = callReplies.withLock { replies -> Turn? in
                if let free = takeIfFree(&replies) { return free }
                replies.queue.append((id, function, continuation))
                return nil
            }
            if let now {
                continuation.resume(returning: now)
                return
            }
            guard let until else { return }
            DispatchQueue.global().asyncAfter(deadline: .now() + max(until - .now, .zero).dispatchInterval) { [weak self] in
                guard let self else { return }
                let dropped = callReplies.withLock { replies -> (CheckedContinuation<Turn, Never>, Turn)? in
                    guard let index = replies.queue.firstIndex(where: { $0.id == id }) else { return nil }
                    let ahead = replies.turn.map { (function: $0.function, running: ContinuousClock.now - $0.since) }
                    return (replies.queue.remove(at: index).continuation, .notStarted(ahead: ahead))
                }
                if let (continuation, turn) = dropped { continuation.resume(returning: turn) }
            }
        }
    }

    /// Call `id` is answered (or was not sent): the next waiting call, if any, is sent.
    private func passTurn(_ id: Int) {
        let next = callReplies.withLock { replies -> CheckedContinuation<Turn, Never>? in
            guard replies.turn?.id == id else { return nil }
            guard !replies.queue.isEmpty else {
                replies.turn = nil
                return nil
            }
            let next = replies.queue.removeFirst()
            replies.turn = (next.id, next.function, .now)
            return next.continuation
        }
        next?.resume(returning: .granted)
    }

    /// The oldest call that overran its deadline and is still running in the worker.
    var overrunCall: (function: String, since: ContinuousClock.Instant)? {
        callReplies.withLock { $0.overrun.values.min { $0.since < $1.since } }
    }

    /// Call `id` waits no more (`overran`: it did not return by its deadline, and its reply
    /// is still to come); once no call waits or overruns, the poller gives the socket back.
    private func forgetCall(_ id: Int, overran: (function: String, since: ContinuousClock.Instant)? = nil) {
        let (released, idle) = callReplies.withLock { replies -> (Bool, FrameReader?) in
            // A reply read since the caller's deadline passed has removed the waiter: the
            // call is over, and no overrun is left to wait for.
            let unanswered = replies.waiters.removeValue(forKey: id) != nil
            if let overran, unanswered, !replies.closed {
                replies.overrun[id] = overran
                // Its reply must still be read: by the poller, if no thread reads now.
                defer { replies.reader = nil }
                return (false, replies.reader)
            }
            return (replies.waiters.isEmpty && replies.overrun.isEmpty && replies.reader == nil && !replies.closed, nil)
        }
        if let idle { WorkerPoller.shared.readCalls(self, idle) }
        if released { WorkerPoller.shared.releaseCalls(self) }
    }

    /// Reads socket 5 on this thread until the reply to call `id` arrives or `until`
    /// passes, if no other thread reads it now; the reply, or nil to wait for it. Hands the
    /// socket to the worker poller when it stops with other calls (or its own) waiting.
    private func readOwnReply(_ id: Int, _ waiter: Waiter, until: ContinuousClock.Instant) -> Outcome? {
        guard var reader = callReplies.withLock({ replies -> FrameReader? in
            defer { replies.reader = nil }
            return replies.reader
        }) else { return nil }
        var own: Outcome?
        // The thread that read before may have handed this reply over already.
        while own == nil && waiter.peek() == nil {
            do throws(FrameReader.End) {
                let reply = try reader.next(until: until)
                if reply.integer("id") == id { own = .reply(reply) } else { callReplied(reply) }
            } catch .timedOut {
                break
            } catch {
                endCalls(error)
                return waiter.peek() ?? .gone
            }
        }
        let othersWait = callReplies.withLock { replies -> Bool in
            if own != nil { replies.waiters[id] = nil }
            let idle = replies.waiters.isEmpty && replies.overrun.isEmpty
            if idle { replies.reader = reader }
            return !idle
        }
        if othersWait { WorkerPoller.shared.readCalls(self, reader) }
        return own ?? waiter.peek()
    }

    /// A reply read on socket 5 (by a caller, or the worker poller): to its caller (none
    /// when that call timed out: dropped). One that answers no request ever sent gets the
    /// worker killed.
    func callReplied(_ reply: WorkerMessage) {
        guard let id = answeredRequest(reply, on: "socket of calls (5)") else { return }
        let (waiter, overran) = callReplies.withLock { replies in
            (replies.waiters.removeValue(forKey: id), replies.overrun.removeValue(forKey: id))
        }
        waiter?.complete(.reply(reply))
        if let overran {
            plugin.logger.info("call \(plugin.name).\(overran.function) returned after \((ContinuousClock.now - overran.since).secondsText), past its deadline; the plugin takes calls again",
                               [("function", overran.function), ("pid", "\(pid)")])
        }
        passTurn(id)
    }

    /// The worker poller gives the calls socket's reader back once no call waits: true
    /// when it took it (or the socket has ended), false while calls wait.
    func returnCallsReader(_ reader: FrameReader) -> Bool {
        callReplies.withLock { replies in
            guard !replies.closed else { return true }
            guard replies.waiters.isEmpty, replies.overrun.isEmpty else { return false }
            replies.reader = reader
            return true
        }
    }

    /// Socket 5 ended (the worker ended) or went out of step: every waiting call is `gone`,
    /// and so is every later one. A frame that is not a reply gets the worker killed, and so
    /// does a socket the worker closed while it runs on (a worker never does; its plugin
    /// may), a second later unless it ends.
    func endCalls(_ end: FrameReader.End) {
        if case .invalid(let reason) = end {
            kill(reason: "it sent an invalid reply to a call (\(reason))")
        } else {
            killLater(reason: "its socket of calls (5) was closed (\(end)) and it did not end")
        }
        let (waiters, queued) = callReplies.withLock { replies in
            defer {
                replies.waiters = [:]
                replies.overrun = [:]
                replies.reader = nil
                replies.closed = true
                replies.turn = nil
                replies.queue = []
            }
            return (Array(replies.waiters.values), replies.queue.map(\.continuation))
        }
        for waiter in waiters { waiter.complete(.gone) }
        for turn in queued { turn.resume(returning: .gone) }
    }

    /// A frame of the control socket (from the worker poller): a reply to its waiter, a
    /// log line or a notification to the plugin, a question (`locate`) answered; any other
    /// frame gets the worker killed, as one that is not JSON does.
    func received(_ message: WorkerMessage) {
        if message["id"] != nil {
            guard let id = answeredRequest(message, on: "control socket (3)") else { return }
            pending.withLock { $0.waiters.removeValue(forKey: id) }?.complete(.reply(message))
            return
        }
        switch message.op {
        case .log?: plugin.log(message.json, pid: pid)
        case .post?: plugin.post(message.json)
        case .locate?:
            // Answered without waiting for room in the socket (this thread reads every
            // worker's): what it has no room for now is written once it has.
            let deadline = plugin.deadline
            post(WorkerFrame.encode(plugin.locate(message.json)), on: control, until: .now + deadline,
                 overdue: .init("read the answer to its locate", within: deadline))
        case .ready?, .failed?: readiness.complete(.reply(message))
        default:
            let op = message.text("op")
            kill(reason: "it wrote a frame with \(op.map { "op \(PluginName.shown($0))" } ?? "no op and no id"), which the protocol does not have, on its control socket (3)")
        }
    }

    /// The id of the request `reply` answers; nil, with the worker killed, when it carries
    /// none or that of a request the daemon never sent (only the plugin's code writes such
    /// a frame). A reply to a request given up on (its deadline passed) is not this.
    private func answeredRequest(_ reply: WorkerMessage, on socket: String) -> Int? {
        guard let id = reply.integer("id"), id >= 1, id < nextID.load(ordering: .sequentiallyConsistent) else {
            let given = reply["id"].map { JSONValue.escapingControlCharacters(String($0.jsonText.prefix(40))) }
            kill(reason: given.map { "it wrote a reply to request \($0), which the daemon never sent, on its \(socket)" }
                ?? "it wrote a reply without an id on its \(socket)")
            return nil
        }
        return id
    }

    /// The control socket's stream ended (from the worker poller): every waiter learns the
    /// worker is gone.
    func streamEnded() {
        killLater(reason: "its control socket (3) was closed and it did not end")
        readiness.complete(.gone)
        let waiters = pending.withLock { pending in
            defer { pending = ([:], true) }
            return Array(pending.waiters.values)
        }
        for waiter in waiters { waiter.complete(.gone) }
    }

    /// The worker has ended (from the worker poller, once its pidfd is readable; it is not
    /// reaped yet, so its pid and process group are still its own): kills what is left of
    /// its process group, reaps it and reports how it ended.
    func reap() {
        let reason = life.withLock { life -> String? in
            // Whatever the plugin forked dies with it (without a namespace, what stayed in
            // its group).
            Glibc.kill(-supervised, SIGKILL)
            let reason: String? = if case .killed(let reason, _) = life { reason } else { nil }
            life = .ended(reason: reason, hung: life.hung)
            return reason
        }
        // Forgotten while the zombie still holds its pid (no new worker can have it yet).
        plugin.workerRecords.ended(supervised)
        var status: Int32 = 0
        while waitpid(supervised, &status, 0) < 0 && errno == EINTR {}
        // The init said how the worker ended, unless it was killed first (by the daemon).
        if statusFD >= 0 {
            var workerStatus: Int32 = 0
            if modhost_worker_ending_status(statusFD, &workerStatus) == 0 { status = workerStatus }
            close(statusFD)
        }
        var ending: String
        if status & 0x7f == 0 {
            ending = "exited with status \((status >> 8) & 0xff)"
        } else {
            let signal = status & 0x7f
            ending = "was killed by signal \(signal) (\(String(cString: strsignal(signal))))"
        }
        let stoppedQuietly = status & 0x7f == SIGKILL && reason == nil
        if let reason { ending += ": \(reason)" }
        // Said (and counted) before whoever waits for the end is told: a daemon that exits
        // once its workers have ended must not exit before it has said how one ended.
        plugin.ended(self, ending, stoppedQuietly: stoppedQuietly)
        finished.complete(.reply(WorkerMessage(keys: ["ending"], values: [.string(ending)])))
        // The reader, and a caller reading an ordered reply, stop (a process the plugin
        // forked may still hold the other ends).
        shutDown()
    }

    private func shutDown() {
        control.channel.shutDown()
        ordered.shutDown()
        calls.channel.shutDown()
    }

    /// Whether it was killed because it did not answer (or read) within its deadline.
    var killedAfterItsDeadline: Bool { life.withLock { $0.hung } }

    /// How the worker ended, once it has been reaped; nil while it runs.
    var ending: String? {
        guard case .reply(let message) = finished.peek() else { return nil }
        return message.text("ending")
    }

    /// How the worker ended, waiting up to `deadline` for it to be reaped (its sockets may
    /// close first); nil if it was not by then.
    func ending(within deadline: Duration) async -> String? {
        guard case .reply(let message) = await finished.wait(upTo: deadline) else { return nil }
        return message.text("ending")
    }

    /// Kills the worker (its process group) because it misbehaved; `reap` reports it.
    /// `afterItsDeadline`: because it did not answer (or read) within its deadline, which
    /// counts toward quarantine for longer (`IsolatedPlugin.quarantineWindow`).
    func kill(reason: String, afterItsDeadline: Bool = false) {
        life.withLock { life in
            switch life {
            case .ended: return
            case .killed: break  // the first reason stands
            case .running, .stopping: life = .killed(reason: "killed because \(reason)", hung: afterItsDeadline)
            }
            Glibc.kill(-supervised, SIGKILL)
            Glibc.kill(supervised, SIGKILL)
        }
    }

    /// Kills the worker for `reason` unless it ends within a second: a socket of it was
    /// closed, as when it is ending (crashed, exited), when it is then reported as it
    /// ended, or when its plugin closed it, when it would never answer again.
    func killLater(reason: String) {
        let first = life.withLock { life -> Bool in
            guard case .running(doomed: nil) = life else { return false }
            life = .running(doomed: reason)
            return true
        }
        if first { WorkerPoller.shared.kill(self, after: .seconds(1)) }
    }

    /// Ends the worker on purpose: closing the socket makes it kill its process group; one
    /// that has not ended after a second is killed.
    func stop() {
        life.withLock { life in
            if case .running(let doomed) = life { life = .stopping(doomed: doomed) }
        }
        shutDown()
        WorkerPoller.shared.kill(self, after: .seconds(1))
    }

    /// Kills the worker's process group unless the worker has ended (the poller, a second
    /// after `stop`).
    func killUnlessEnded() {
        life.withLock { life in
            switch life {
            case .ended: return
            case .running(let doomed?), .stopping(let doomed?): life = .killed(reason: "killed because \(doomed)", hung: false)
            case .running(nil), .stopping(nil), .killed: break
            }
            // Its init (or the worker itself, without one), not only its group: the plugin
            // may have moved the worker into another. Not reaped yet, the pid is still its own.
            Glibc.kill(-supervised, SIGKILL)
            Glibc.kill(supervised, SIGKILL)
        }
    }
}
