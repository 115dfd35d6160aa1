import DaemonKit
import Testing

struct RuntimePathsTests {
    @Test func rootUsesSystemLocationsEvenWithXDGVariables() {
        let paths = RuntimePaths(environment: ["XDG_RUNTIME_DIR": "/run/user/0", "HOME": "/root"], uid: 0)
        #expect(paths.socketPath == "/run/modhostd.sock")
        #expect(paths.stateDirectory == "/var/lib/modhostd")
        #expect(paths.configPath == "/etc/modhostd/modhostd.json")
    }

    @Test func aUserWithXDGVariablesUsesThem() {
        let paths = RuntimePaths(
            environment: [
                "XDG_RUNTIME_DIR": "/run/user/1000/", "XDG_STATE_HOME": "/data/state",
                "XDG_CONFIG_HOME": "/data/config", "HOME": "/home/ann",
            ], uid: 1000)
        #expect(paths.socketPath == "/run/user/1000/modhostd.sock")
        #expect(paths.stateDirectory == "/data/state/modhostd")
        #expect(paths.configPath == "/data/config/modhostd/modhostd.json")
    }

    @Test func aUserWithoutXDGVariablesFallsBackToHomeAndTmp() {
        let paths = RuntimePaths(environment: ["HOME": "/home/ann"], uid: 1000)
        #expect(paths.socketPath == "/tmp/modhostd-1000.sock")
        #expect(paths.stateDirectory == "/home/ann/.local/state/modhostd")
        #expect(paths.configPath == "/home/ann/.config/modhostd/modhostd.json")
    }

    @Test func relativeOrEmptyXDGVariablesAreIgnored() {
        let paths = RuntimePaths(
            environment: ["XDG_RUNTIME_DIR": "run", "XDG_STATE_HOME": "", "XDG_CONFIG_HOME": "cfg", "HOME": "/home/ann"],
            uid: 1000)
        #expect(paths.socketPath == "/tmp/modhostd-1000.sock")
        #expect(paths.stateDirectory == "/home/ann/.local/state/modhostd")
        #expect(paths.configPath == "/home/ann/.config/modhostd/modhostd.json")
    }

    @Test func withoutHomeThePasswordDatabaseIsUsed() {
        // uid 65534 (nobody) exists in /etc/passwd with home /nonexistent on Debian.
        let paths = RuntimePaths(environment: [:], uid: 65534)
        #expect(paths.stateDirectory.hasSuffix("/.local/state/modhostd"))
        #expect(paths.stateDirectory.hasPrefix("/"))
        #expect(!paths.stateDirectory.hasPrefix("/home/ann"))
    }
}
