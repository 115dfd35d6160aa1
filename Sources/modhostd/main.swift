import Glibc
import CommandLineTools
import ModuleHost

ExitGuard.exit(await DaemonCommand().runProcessArguments().rawValue)
