import Glibc
import ModuleHost

ExitGuard.exit(await DaemonCommand().runProcessArguments().rawValue)
