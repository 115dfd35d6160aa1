/// The one vocabulary of states for what a host runs and what it refused: a module's state
/// and the state of a plugin file that provides no loaded plugin. `modhostctl list`, the
/// log, `reload` and docs/daemon.md ("States") use these names, the raw values, and
/// nothing else spells them.
public enum PluginState: String, Sendable, CaseIterable, Codable {
    /// A module that started and gets events.
    case running
    /// A running C module that has not returned from a callback within the event deadline;
    /// it gets no events until it does.
    case stuck
    /// A module the configuration or `disable` turned off.
    case disabled
    /// A module of an isolated plugin whose worker crashed, exited or stopped answering; it
    /// is being restarted (docs/isolation.md).
    case crashed
    /// A module of an isolated plugin whose worker is starting again after a crash.
    case restarting
    /// An enabled module that is not running (it has not started, or failed to).
    case stopped
    /// A file a check refused; tried again when it changes (contents, mode or owner) and at
    /// every `reconcile(retryingRefused: true)`; at every `reconcile` when another file held
    /// its plugin's or a module's name (check `duplicate name`).
    case refused
    /// A file whose plugin needs a plugin that is not loaded (missing, refused, removed, or
    /// a file still arriving); tried again at every scan, loaded once that plugin is.
    case waitingForDependency = "waiting-for-dependency"
    /// A file that crashed this process (the crash guard's record), or crashed or hung a
    /// trial load; tried again when it changes. For a module of an isolated plugin: its
    /// worker crashed too often and is not restarted until its file changes or `enable`.
    case quarantined
    /// A file being loaded by the scan in progress; a module of a plugin being added, whose
    /// create (or init) has not returned yet, within the event deadline.
    case loading

    /// The state of a running module of an isolated plugin whose worker is in `phase`; nil
    /// while the worker runs (the module's own state stands).
    public init?(worker phase: WorkerStatus.Phase) {
        switch phase {
        case .running: return nil
        case .starting: self = .restarting
        case .quarantined: self = .quarantined
        case .crashed, .stopped: self = .crashed
        }
    }
}
