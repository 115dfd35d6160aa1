import Glibc
import ModuleHost

exit(await ControlCommand().run(Array(CommandLine.arguments.dropFirst())).rawValue)
