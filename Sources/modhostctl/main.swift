import Glibc
import ModuleHost

exit(await ControlCommand().runProcessArguments().rawValue)
