import Glibc
import ModuleHost

ExitGuard.exit(await DaemonCommand().run(Array(CommandLine.arguments.dropFirst())).rawValue)
