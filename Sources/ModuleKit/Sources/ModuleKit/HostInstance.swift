/// One host instance: its modules, their events and its Bus, all confined to this actor.
///
/// Several instances may live in one process; each gets its own module objects, created
/// from the same factories, and nothing posted to one reaches another.
public actor HostInstance {
    /// A label for logs.
    public nonisolated let name: String
    public nonisolated let logger: Logger

    struct Entry {
        let factory: ModuleFactory
        var module: any Module
    }
    var entries: [Entry] = []
    var started = false

    public init(name: String = "default", logger: Logger = Logger(label: "modulehost")) {
        self.name = name
        self.logger = logger
    }

    /// Registers modules: creates each in order, sends `.initialize`, and `.start` when the
    /// host has already started.
    public func add(_ factories: [ModuleFactory]) {
        var added: [Entry] = []
        for factory in factories {
            guard let module = factory.make(self, [:]) else {
                logger.error("module refused to initialize", [("module", factory.name), ("plugin", factory.plugin)])
                continue
            }
            let entry = Entry(factory: factory, module: module)
            entries.append(entry)
            added.append(entry)
            module.handle(.initialize, host: self)
        }
        if started {
            for entry in added { entry.module.handle(.start, host: self) }
        }
    }

    /// Sends `.start` to every module in order.
    public func start() {
        started = true
        for entry in entries { entry.module.handle(.start, host: self) }
    }

    /// Sends `.willTerminate` then `.deinitialize` in reverse order, and drops the modules.
    public func shutdown() async {
        for entry in entries.reversed() { await entry.module.handle(.willTerminate, host: self) }
        for entry in entries.reversed() { entry.module.handle(.deinitialize, host: self) }
        entries.removeAll()
    }

    /// The names of the registered modules, in order.
    public var moduleNames: [String] { entries.map(\.factory.name) }
}
