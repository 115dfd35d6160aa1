// modhost-worker: runs one isolated plugin for modhostd, which starts it (docs/isolation.md).
import ModuleHost

WorkerProcess.main()
