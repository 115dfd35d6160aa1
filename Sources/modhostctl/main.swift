import Glibc
import CommandLineTools

exit(await ControlCommand().runProcessArguments().rawValue)
