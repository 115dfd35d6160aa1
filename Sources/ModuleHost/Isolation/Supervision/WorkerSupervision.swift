@_spi(ModuleHost) import ModuleKit

/// Supervision of an isolated plugin's worker: what happens when it ends (restart at once,
/// then with a doubling delay, or quarantine after `IsolationPolicy.burst` ends within
/// the window), and how the daemon stops it for good.
extension IsolatedPlugin {
    /// One end of a worker, as counted toward quarantine.
    struct WorkerEnd {
        var at: ContinuousClock.Instant
        /// Killed because it did not answer within its deadline.
        var hung: Bool
    }

    /// How long an end of a worker counts toward quarantine: `policy.window`, and for a
    /// worker killed because it did not answer within its deadline, five deadlines more
    /// (`burst` of them): each such end took the daemon a deadline to find out, so a handler
    /// that hangs on every event would otherwise never end `burst` workers within the window,
    /// and would hold up every event sent to it for a deadline, for ever.
    func quarantineWindow(hung: Bool) -> Duration {
        hung ? policy.window + deadline * policy.burst : policy.window
    }

    /// Called by the connection (on the worker poller) once its worker has ended and been reaped.
    /// `stoppedQuietly`: it died by SIGKILL, which the daemon sent for no reason of its
    /// own (the end of a worker it stopped: one whose sockets close kills its own group).
    func ended(_ connection: WorkerConnection, _ ending: String, stoppedQuietly: Bool) {
        if state.withLock({ $0.phase == .stopped && $0.connection !== connection }) {
            // Stopped by the daemon (no restart follows): an end other than the quiet one
            // came from the plugin's code (an exit in destroy, say) or from a kill for a
            // reason (not answering deinit in time), and is said.
            if !stoppedQuietly {
                logger.warning("plugin \(name)'s worker (pid \(connection.pid)) \(ending) while the daemon stopped it",
                               [("pid", "\(connection.pid)"), ("cause", ending)])
            }
            return
        }
        let now = ContinuousClock.now
        let hung = connection.killedAfterItsDeadline
        let decision: (quarantined: Bool, delay: Duration, crashes: Int, hangsCounted: Bool)? = state.withLock { state in
            guard state.connection === connection, state.phase != .stopped else { return nil }
            state.connection = nil
            state.crashes += 1
            state.lastCrash = ending
            state.crashTimes = state.crashTimes.filter { now - $0.at < quarantineWindow(hung: $0.hung) } + [WorkerEnd(at: now, hung: hung)]
            let recent = state.crashTimes.count
            if recent >= policy.burst {
                state.phase = .quarantined
                return (true, .zero, recent, state.crashTimes.contains(where: \.hung))
            }
            state.phase = .crashed
            let delay: Duration = recent <= 1 ? .zero : .milliseconds(100) * (1 << min(recent - 2, 8))
            return (false, delay, recent, false)
        }
        guard let decision else { return }
        let (modules, restartsEnded) = state.withLock { ($0.modules.map(\.name), $0.restartsEnded) }
        logger.error("plugin \(name)'s worker (pid \(connection.pid)) \(ending)"
                     + (modules.isEmpty ? "" : "; its modules are crashed: \(modules.joined(separator: ", "))")
                     + (restartsEnded ? "; it is not restarted: the daemon is shutting down" : ""),
                     [("pid", "\(connection.pid)"), ("cause", ending)])
        if restartsEnded { return }
        if decision.quarantined {
            let crashWindow = quarantineWindow(hung: false).secondsText, hangWindow = quarantineWindow(hung: true).secondsText
            let within = !decision.hangsCounted ? crashWindow
                : "\(hangWindow) (an end for not answering within the deadline counts for \(hangWindow), any other for \(crashWindow))"
            logger.error("plugin \(name) is quarantined: its worker ended \(decision.crashes) times within \(within); it is not restarted until its file changes or a module of it is enabled (modhostctl enable MODULE)",
                         [("crashes", "\(decision.crashes)")])
            return
        }
        scheduleRestart(after: decision.delay)
    }

    private func scheduleRestart(after delay: Duration) {
        Task.detached { [self] in
            if delay > .zero { try? await Task.sleep(for: delay) }
            await self.restart()
        }
    }

    /// Starts a new worker and runs the daemon's modules of this plugin in it again.
    private func restart() async {
        guard state.withLock({ state -> Bool in
            guard state.phase == .crashed || state.phase == .quarantined, !state.restartsEnded else { return false }
            state.phase = .starting
            return true
        }) else { return }
        let connection: WorkerConnection
        do {
            connection = try await launch()
        } catch {
            // A plugin stopped meanwhile (replaced, removed: its private copy is deleted, and
            // the launch may have failed for that) is not restarted, and that is no error.
            let quarantine = state.withLock { state -> Bool in
                guard state.phase == .starting else { return false }
                state.phase = .quarantined
                state.lastCrash = error.problem
                return true
            }
            if quarantine {
                logger.error("cannot restart plugin \(name)'s worker: \(error.problem)")
                logger.error("plugin \(name) is quarantined until its file changes or a module of it is enabled")
            }
            return
        }
        let (modules, stopped, restarts) = state.withLock { state -> ([(name: String, record: ModuleRecord)], Bool, Int) in
            guard state.phase == .starting, !state.restartsEnded else { return ([], true, 0) }
            // Still `starting`: the modules get nothing until they run again in order.
            state.connection = connection
            state.restarts += 1
            return (state.modules, false, state.restarts)
        }
        if stopped {
            connection.stop()
            return
        }
        if let ending = connection.ending {
            ended(connection, ending, stoppedQuietly: false)
            return
        }
        logger.info("restarted plugin \(name)'s worker (pid \(connection.pid), restart \(restarts))", [("pid", "\(connection.pid)")])
        let running = host.runningModuleNames
        for (module, record) in modules {
            let reply = connection.request(.create(module: module, configuration: record.configuration, running: running), deadline: deadline)
            check(reply, connection, what: "create of \(module)")
            guard case .reply(let created) = reply, created["created"]?.boolValue == true else { continue }
            if record.started {
                check(connection.request(.event(module: module, kind: .start, name: "start", payload: .null), deadline: deadline),
                      connection, what: "start")
            }
        }
        state.withLock { state in
            if state.connection === connection && state.phase == .starting { state.phase = .running }
        }
    }

    /// Lets a quarantined plugin run again (`modhostctl enable` of one of its modules):
    /// the crash count starts over and a worker is started now.
    func release() {
        let quarantined = state.withLock { state -> Bool in
            guard state.phase == .quarantined else { return false }
            state.crashTimes = []
            return true
        }
        guard quarantined else { return }
        logger.info("plugin \(name) leaves quarantine (enabled); starting its worker")
        Task.detached { [self] in await self.restart() }
    }

    /// Ends the worker for good (removal, replacement, shutdown): no restart follows.
    /// From now on a worker that ends is not restarted (the host is shutting down: its
    /// modules get willTerminate and deinit, and a worker killed for not answering them
    /// must not be followed by a new one).
    func endRestarts() {
        state.withLock { $0.restartsEnded = true }
    }

    /// Stops its worker, if one runs, and returns its connection (whose `ending` says when
    /// it has been reaped).
    @discardableResult
    func stop() -> WorkerConnection? {
        let connection = state.withLock { state -> WorkerConnection? in
            state.phase = .stopped
            defer { state.connection = nil }
            return state.connection
        }
        connection?.stop()
        return connection
    }
}
