import ControlProtocol
import DaemonKit
import Glibc
import ModuleHost
import ModuleKit
import Synchronization

/// systemd's watchdog (`WatchdogSec=`): once started, the daemon sends `WATCHDOG=1` every
/// half of `WATCHDOG_USEC`, but only after its own control socket answered a `status`
/// request (which the daemon's actor answers) within that time. A daemon whose control
/// plane is stuck stops sending, and the service manager restarts it.
final class DaemonWatchdog: Sendable {
    private let stopped = Atomic<Bool>(false)

    /// Starts the watchdog's thread when the service manager asks for keep-alives
    /// (`SystemdNotifier.watchdogInterval`); nil when it does not, or the thread cannot
    /// start (logged).
    static func start(socketPath: String, notifier: SystemdNotifier, logger: Logger) -> DaemonWatchdog? {
        guard let interval = SystemdNotifier.watchdogInterval() else { return nil }
        let watchdog = DaemonWatchdog()
        do {
            try startThread(name: "watchdog") { watchdog.run(every: interval, socketPath: socketPath, notifier: notifier, logger: logger) }
        } catch {
            logger.error("cannot start the watchdog's thread (\(error)); WATCHDOG=1 is not sent, so WatchdogSec= will restart the daemon")
            return nil
        }
        logger.info("watchdog: WATCHDOG=1 every \(interval.secondsText) while the control socket answers", [("interval", interval.secondsText)])
        return watchdog
    }

    /// Ends the keep-alives (the daemon stops).
    func stop() { stopped.store(true, ordering: .relaxed) }

    private func run(every interval: Duration, socketPath: String, notifier: SystemdNotifier, logger: Logger) {
        var missed = false
        while !stopped.load(ordering: .relaxed) {
            let started = ContinuousClock.now
            let reply = try? ControlClient.request(#"{"v":1,"id":0,"cmd":"status"}"#, socketPath: socketPath, timeout: interval)
            let answered = reply?.contains(#""ok":true"#) ?? false
            if stopped.load(ordering: .relaxed) { return }
            if answered {
                try? notifier.watchdog()
                if missed { logger.info("watchdog: the control socket answers again; WATCHDOG=1 sent") }
            } else if !missed {
                logger.error("watchdog: the control socket did not answer status within \(interval.secondsText); WATCHDOG=1 is not sent")
            }
            missed = !answered
            let rest = interval - (ContinuousClock.now - started)
            if rest > .zero { sleepFor(rest) }
        }
    }
}

/// Blocks the calling thread for `duration` (nanosleep, resumed after signals).
private func sleepFor(_ duration: Duration) {
    let (seconds, attoseconds) = duration.components
    var request = timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
    var remaining = timespec()
    while nanosleep(&request, &remaining) != 0 && errno == EINTR { request = remaining }
}
