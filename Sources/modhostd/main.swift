import Glibc
import ModuleHost

exit(await DaemonCommand().run(Array(CommandLine.arguments.dropFirst())).rawValue)
